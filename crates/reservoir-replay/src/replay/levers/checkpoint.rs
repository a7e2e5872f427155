//! The activation-checkpointing lever (see [`levers`](super)): the saved
//! activations of the sites holding the most of them are freed in forward
//! and made again in backward.

use rustc_hash::{FxHashMap, FxHashSet};

use super::{activation_sites, alloc_streams, reused_ids, Lever, LeverInput};
use crate::oracle_trace::{AllocId, Op, Trace};
use crate::replay::roles::{Phase, Role, Roles};
use crate::replay::sites::Sites;
use crate::replay::ReplayError;
use reservoir::format::format_size;

/// Sites named in a lever's sentence, at most.
const NAMED: usize = 4;

/// For each op, the index of the next allocation op after it matching
/// `pick` (scanning from the end).
fn next_matching(trace: &Trace, pick: impl Fn(usize, AllocId) -> bool) -> Vec<Option<usize>> {
    let mut next = vec![None; trace.ops.len()];
    let mut seen = None;
    for (i, op) in trace.ops.iter().enumerate().rev() {
        next[i] = seen;
        if let Op::Alloc { id, .. } = op {
            if pick(i, *id) {
                seen = Some(i);
            }
        }
    }
    next
}

/// For each allocation op, the next allocation op of the same site.
fn next_same_site(trace: &Trace, sites: &Sites) -> Vec<Option<usize>> {
    let mut next = vec![None; trace.ops.len()];
    let mut seen: FxHashMap<&str, usize> = FxHashMap::default();
    for (i, op) in trace.ops.iter().enumerate().rev() {
        if let Op::Alloc { id, .. } = op {
            let s = sites.site(*id);
            next[i] = seen.get(s).copied();
            seen.insert(s, i);
        }
    }
    next
}

/// The op freeing each allocation op's allocation (none when never freed).
fn free_ops(trace: &Trace) -> Vec<Option<usize>> {
    let mut out = vec![None; trace.ops.len()];
    let mut open: FxHashMap<AllocId, usize> = FxHashMap::default();
    for (j, op) in trace.ops.iter().enumerate() {
        match op {
            Op::Alloc { id, .. } => {
                open.insert(*id, j);
            }
            Op::Free { id } => {
                if let Some(i) = open.remove(id) {
                    out[i] = Some(j);
                }
            }
            _ => {}
        }
    }
    out
}

/// `trace` with the saved activations of `chosen` sites checkpointed: each
/// freed before the next allocation of its site or the first allocation of
/// another phase after it (whichever comes first), and made again before
/// the allocation preceding its free. Allocations whose id is reused, that
/// are never freed, or whose free follows too closely are kept. How many
/// were checkpointed, and their bytes.
pub(super) fn checkpointed(
    trace: &Trace,
    roles: &Roles,
    sites: &Sites,
    chosen: &FxHashSet<&str>,
) -> (Trace, u64, u64) {
    let reused = reused_ids(trace);
    let streams = alloc_streams(trace);
    let frees = free_ops(trace);
    let same_site = next_same_site(trace, sites);
    let other_phase = next_matching(trace, |_, id| {
        !matches!(sites.hint(id).phase, Phase::Forward | Phase::Unknown)
    });
    // The last allocation op before each op.
    let mut prev_alloc = vec![None; trace.ops.len()];
    let mut last = None;
    for (j, op) in trace.ops.iter().enumerate() {
        prev_alloc[j] = last;
        if matches!(op, Op::Alloc { .. }) {
            last = Some(j);
        }
    }
    let mut before: FxHashMap<usize, Vec<Op>> = FxHashMap::default();
    let mut window: FxHashMap<AllocId, (usize, usize)> = FxHashMap::default();
    let (mut count, mut total) = (0u64, 0u64);
    for (i, op) in trace.ops.iter().enumerate() {
        let Op::Alloc { id, bytes, .. } = op else {
            continue;
        };
        if roles.role(*id).0 != Role::Activations
            || reused.contains(id)
            || !chosen.contains(sites.site(*id))
        {
            continue;
        }
        let Some(j) = frees[i] else { continue };
        let drop_at = match (same_site[i], other_phase[i]) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(x) => x,
                None => continue,
            },
        };
        let Some(remake_at) = prev_alloc[j] else {
            continue;
        };
        if drop_at >= remake_at || drop_at <= i {
            continue;
        }
        before
            .entry(drop_at)
            .or_default()
            .push(Op::Free { id: *id });
        before.entry(remake_at).or_default().push(Op::Alloc {
            id: *id,
            bytes: *bytes,
            stream: streams[i].clone(),
        });
        window.insert(*id, (drop_at, remake_at));
        count += 1;
        total += *bytes;
    }
    (splice(trace, before, &window), count, total)
}

/// `trace` with the ops of `before` inserted before each op (frees first),
/// without the `record_stream`s of an id within its window (it is not live
/// then).
fn splice(
    trace: &Trace,
    mut before: FxHashMap<usize, Vec<Op>>,
    window: &FxHashMap<AllocId, (usize, usize)>,
) -> Trace {
    let mut ops = Vec::with_capacity(trace.ops.len() + 2 * window.len());
    let mut lines = Vec::with_capacity(ops.capacity());
    for (k, (op, &line)) in trace.ops.iter().zip(&trace.lines).enumerate() {
        if let Some(mut ins) = before.remove(&k) {
            ins.sort_by_key(|o| matches!(o, Op::Alloc { .. }));
            for o in ins {
                ops.push(o);
                lines.push(line);
            }
        }
        if let Op::RecordStream { id, .. } = op {
            if window.get(id).is_some_and(|&(a, b)| (a..b).contains(&k)) {
                continue;
            }
        }
        ops.push(op.clone());
        lines.push(line);
    }
    Trace {
        ops,
        lines,
        header: trace.header.clone(),
    }
}

/// The lever of checkpointing the sites holding the most saved activations
/// when they peak (at or before the op explained): 1, 2, 4 sites, then
/// all, until one fits.
pub(super) fn activation_checkpointing(
    input: &LeverInput<'_>,
    roles: &Roles,
) -> Result<Option<Lever>, ReplayError> {
    let (groups, at) = activation_sites(input.trace, roles, input.sites, input.moment);
    if groups.is_empty() {
        return Ok(None);
    }
    let n = groups.len();
    let mut ks: Vec<usize> = [1, 2, 4, n].into_iter().filter(|&k| k <= n).collect();
    ks.dedup();
    for (x, &k) in ks.iter().enumerate() {
        let chosen: FxHashSet<&str> = groups[..k].iter().map(|g| g.0).collect();
        let (t, count, bytes) = checkpointed(input.trace, roles, input.sites, &chosen);
        let last = x + 1 == ks.len();
        if count == 0 && !last {
            continue;
        }
        if count == 0 {
            return Ok(None);
        }
        let fit = input.try_fit(&t)?;
        if fit.is_none() && !last {
            continue;
        }
        let o = input.outcome_after(fit, &t)?;
        let named: Vec<String> = groups[..k]
            .iter()
            .take(NAMED)
            .map(|(s, b)| format!("{s} ({} live)", format_size(*b)))
            .collect();
        let more = if k > NAMED {
            format!(" and {} more", k - NAMED)
        } else {
            String::new()
        };
        let what = format!(
            "checkpointed the {k} of {n} site{} holding the most saved activations when they peak (op {at}): {}{more}: their {count} activation allocations ({} in all) each freed in forward when the next allocation of its site is made or its forward ends, and made again in backward just before the allocation that precedes its free",
            if n == 1 { "" } else { "s" },
            named.join(", "),
            format_size(bytes)
        );
        return Ok(Some(input.lever("activation_checkpointing", what, o)));
    }
    Ok(None)
}
