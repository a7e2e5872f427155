//! The fused-attention lever: the allocations of attention scores dropped,
//! as a fused kernel (FlashAttention, `scaled_dot_product_attention`'s
//! fused backends) never materialises them.

use rustc_hash::FxHashSet;

use super::{by_site, reused_ids, Lever, LeverInput};
use crate::oracle_trace::{AllocId, Op, Trace};
use crate::replay::ReplayError;
use reservoir::format::format_size;

/// Words that name attention in a site or its call path (lowercased).
const ATTENTION_WORDS: [&str; 5] = ["attention", "attn", "softmax", "scaled_dot_product", "sdpa"];

/// Sites named in the text, at most.
const SITES_NAMED: usize = 3;

/// Does `site` (or its call path `path`) name attention?
pub(super) fn is_attention_site(site: &str, path: &str) -> bool {
    let (s, p) = (site.to_ascii_lowercase(), path.to_ascii_lowercase());
    ATTENTION_WORDS
        .iter()
        .any(|w| s.contains(w) || p.contains(w))
}

/// Fewest allocations a run must free to be taken for a materialised
/// attention (scores, their masked copy, the softmax).
const MIN_SCORES: usize = 3;

/// The allocations the size of attention scores: in each run of
/// consecutive allocations (frees and other ops between them ignored) at
/// one attention site, those freed before the run ends (the attention's own
/// temporaries: scores, their masked copy, the softmax and its cast, not
/// its output) at least half the largest of them, when there are at least
/// [`MIN_SCORES`]. Conservative: scores kept past the run (saved for
/// backward) are not taken.
pub(super) fn score_allocations(input: &LeverInput<'_>) -> Vec<(AllocId, u64)> {
    let reused = reused_ids(input.trace);
    let mut out = Vec::new();
    // The run's allocations: id, bytes, freed within the run.
    let mut run: Vec<(AllocId, u64, bool)> = Vec::new();
    let mut run_site: Option<&str> = None;
    let close = |run: &mut Vec<(AllocId, u64, bool)>, out: &mut Vec<(AllocId, u64)>| {
        let max = run.iter().filter(|a| a.2).map(|a| a.1).max().unwrap_or(0);
        let picked: Vec<(AllocId, u64)> = run
            .iter()
            .filter(|a| a.2 && a.1.saturating_mul(2) >= max)
            .map(|a| (a.0, a.1))
            .collect();
        if picked.len() >= MIN_SCORES {
            out.extend(picked);
        }
        run.clear();
    };
    for op in &input.trace.ops {
        let (id, bytes) = match op {
            Op::Alloc { id, bytes, .. } => (*id, *bytes),
            Op::Free { id } => {
                if let Some(a) = run.iter_mut().find(|a| a.0 == *id) {
                    a.2 = true;
                }
                continue;
            }
            _ => continue,
        };
        let site = input.sites.site(id);
        let attention = is_attention_site(site, input.sites.call_path(site));
        if run_site != Some(site) || !attention {
            close(&mut run, &mut out);
            run_site = attention.then_some(site);
        }
        if attention && !reused.contains(&id) {
            run.push((id, bytes, false));
        }
    }
    close(&mut run, &mut out);
    out
}

/// `trace` without the allocations `drop` and every op naming them.
pub(super) fn without(trace: &Trace, drop: &FxHashSet<AllocId>) -> Trace {
    let mut t = trace.clone();
    let keep = |op: &Op| match op {
        Op::Alloc { id, .. } | Op::Free { id } | Op::RecordStream { id, .. } => !drop.contains(id),
        _ => true,
    };
    let (ops, lines) = trace
        .ops
        .iter()
        .zip(&trace.lines)
        .filter(|(op, _)| keep(op))
        .map(|(op, &line)| (op.clone(), line))
        .unzip();
    t.ops = ops;
    t.lines = lines;
    t
}

/// The lever of fused attention: the score-sized allocations at attention
/// sites dropped; none without them.
pub(super) fn fused_attention(input: &LeverInput<'_>) -> Result<Option<Lever>, ReplayError> {
    let scores = score_allocations(input);
    if scores.is_empty() {
        return Ok(None);
    }
    let bytes: u64 = scores.iter().map(|a| a.1).sum();
    let by_site = by_site(input.sites, scores.iter().copied());
    let mut named: Vec<String> = by_site
        .iter()
        .take(SITES_NAMED)
        .map(|(s, b, _)| format!("{s} ({})", format_size(*b)))
        .collect();
    if by_site.len() > SITES_NAMED {
        named.push(format!("{} more", by_site.len() - SITES_NAMED));
    }
    let largest = scores.iter().map(|a| a.1).max().unwrap_or(0);
    let drop: FxHashSet<AllocId> = scores.iter().map(|a| a.0).collect();
    let o = input.outcome(&without(input.trace, &drop))?;
    let what = format!(
        "fused attention: the {} allocations the size of attention scores ({} in all, the largest {}; in each run of allocations at an attention site, those it frees before it ends, at least half the largest of them, when there are at least 3) dropped with their frees, as a fused kernel never materialises them, every other allocation kept; at {}",
        scores.len(),
        format_size(bytes),
        format_size(largest),
        named.join(", ")
    );
    Ok(Some(input.lever("fused_attention", what, o)))
}
