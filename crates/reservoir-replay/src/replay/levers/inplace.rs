//! The in-place lever: an allocation whose predecessor (the allocation made
//! just before it, of the same size, on the same stream) is freed right
//! after it is made is an out-of-place op whose input dies at once
//! (`y = f(x); del x`); the in-place op (`x.f_()`) writes into the input's
//! memory instead.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{alloc_streams, by_site, reused_ids, Lever, LeverInput};
use crate::oracle_trace::{AllocId, Op, Trace};
use crate::replay::ReplayError;
use reservoir::format::format_size;

/// Sites named in the text, at most.
const SITES_NAMED: usize = 3;

/// One op made in place: the op index of the new allocation (its
/// predecessor's free is the next op), the predecessor, the new one and
/// its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct InPlace {
    pub at: usize,
    pub old: AllocId,
    pub new: AllocId,
    pub bytes: u64,
}

/// Every allocation that could be made in place: the previous allocation
/// op made the same bytes on the same stream, is still live, and the very
/// next op frees it. Ids allocated more than once are left alone.
pub(super) fn in_place_ops(trace: &Trace) -> Vec<InPlace> {
    let reused = reused_ids(trace);
    let streams = alloc_streams(trace);
    let mut live: FxHashSet<AllocId> = FxHashSet::default();
    let mut prev: Option<(usize, AllocId, u64)> = None;
    let mut out = Vec::new();
    for (i, op) in trace.ops.iter().enumerate() {
        match op {
            Op::Alloc { id, bytes, .. } => {
                let next_frees = |old: AllocId| matches!(trace.ops.get(i + 1), Some(Op::Free { id: f }) if *f == old);
                if let Some((j, old, b)) = prev {
                    if b == *bytes
                        && streams[j] == streams[i]
                        && live.contains(&old)
                        && next_frees(old)
                        && !reused.contains(&old)
                        && !reused.contains(id)
                    {
                        out.push(InPlace {
                            at: i,
                            old,
                            new: *id,
                            bytes: *bytes,
                        });
                    }
                }
                live.insert(*id);
                prev = Some((i, *id, *bytes));
            }
            Op::Free { id } => {
                live.remove(id);
            }
            _ => {}
        }
    }
    out
}

/// `trace` with each of `ops` made in place: its allocation and its
/// predecessor's free dropped, and the ops naming the new allocation
/// naming its predecessor (whose memory it reuses) instead.
pub(super) fn in_placed(trace: &Trace, ops: &[InPlace]) -> Trace {
    let mut rename: FxHashMap<AllocId, AllocId> = FxHashMap::default();
    let mut skip = vec![false; trace.ops.len()];
    for p in ops {
        let root = rename.get(&p.old).copied().unwrap_or(p.old);
        rename.insert(p.new, root);
        skip[p.at] = true;
        skip[p.at + 1] = true;
    }
    let mut t = trace.clone();
    let (mut new_ops, mut lines) = (Vec::new(), Vec::new());
    for (k, (op, &line)) in trace.ops.iter().zip(&trace.lines).enumerate() {
        if skip[k] {
            continue;
        }
        let mut op = op.clone();
        if let Op::Free { id } | Op::RecordStream { id, .. } = &mut op {
            if let Some(&r) = rename.get(id) {
                *id = r;
            }
        }
        new_ops.push(op);
        lines.push(line);
    }
    t.ops = new_ops;
    t.lines = lines;
    t
}

/// The lever of making in place the ops whose input dies at once; none
/// without them.
pub(super) fn in_place(input: &LeverInput<'_>) -> Result<Option<Lever>, ReplayError> {
    let ops = in_place_ops(input.trace);
    if ops.is_empty() {
        return Ok(None);
    }
    let bytes: u64 = ops.iter().map(|p| p.bytes).sum();
    let by_site = by_site(input.sites, ops.iter().map(|p| (p.new, p.bytes)));
    let mut named: Vec<String> = by_site
        .iter()
        .take(SITES_NAMED)
        .map(|(s, b, n)| format!("{s} ({n}, {})", format_size(*b)))
        .collect();
    if by_site.len() > SITES_NAMED {
        named.push(format!("{} more sites", by_site.len() - SITES_NAMED));
    }
    let o = input.outcome(&in_placed(input.trace, &ops))?;
    let what = format!(
        "made in place the {} allocations whose predecessor (the allocation made just before, of the same size, on the same stream) is freed right after them: each dropped, its predecessor's memory reused until its own free ({} not allocated again), every other allocation kept; at {}",
        ops.len(),
        format_size(bytes),
        named.join(", ")
    );
    Ok(Some(input.lever("in_place", what, o)))
}
