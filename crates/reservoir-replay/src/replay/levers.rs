//! Program levers (issue 41 item 2): the changes to the *program* that cut
//! its peak, each proven by replaying a transformed copy of the recorded
//! allocation sequence, for a capacity OOM (`explain.oom.levers`) and for a
//! run without one ("how do I cut my peak", `explain.peak.levers`).
//!
//! Every allocation has a role ([`roles`](super::roles)); a lever changes
//! the allocations of some roles and the whole trace is replayed again with
//! the same settings: the cheapest settings change proven to avoid the OOM
//! when the diagnosis found one, else the setting explained. Each lever is
//! printed with the peak reserved and allocated bytes of its replay and
//! whether it fits: its replay on the device the allocator is given meets
//! no out-of-memory error. When it does not fit, the peaks are those of a
//! replay of the same trace on an unbounded device (what it would need).
//!
//! | lever | what is replayed |
//! |---|---|
//! | `micro_batch` | every activation and temporary allocation made half its size (a micro-batch of half the size), every other allocation kept |
//! | `optimizer_sharding` | every optimizer-state allocation made 1/N its size (the state sharded over N ranks, ZeRO stage 1): N the smallest of 2, 4, 8 that fits, else 8; not listed without optimizer state |
//! | `activation_checkpointing` | the saved activations of the sites (innermost user frame: the line of a module's `forward`) holding the most of them when their live bytes peak (at or before the OOM), the largest first, 1, 2, 4 sites then all of them until one fits: each freed in forward when the next allocation of its site is made (the next layer's) or its forward ends, and made again in backward just before the allocation that precedes its free (the gradient it serves) |
//! | `lower_precision` | every activation allocation made half its size (fp32 activations kept in bf16) |
//! | `fused_attention` | the allocations the size of attention scores dropped with their frees: in each run of consecutive allocations at one attention site (its site or call path names `attention`, `attn`, `softmax`, `scaled_dot_product` or `sdpa`), those freed before the run ends (the attention's own temporaries, not its output), at least half the largest of them, when there are at least 3; not listed without them |
//! | `in_place` | each allocation whose predecessor (the allocation op just before it: same size, same stream, still live) is freed by the very next op, made in place: the allocation and that free dropped, and the predecessor's memory kept until the new allocation's free (`y = f(x); del x` becomes `x.f_()`); not listed without them |
//! | `imbalance` | for a file with several devices or a folder of ranks (`reservoir replay` of several rank files), on the heaviest device only, when its peak reserved is at least 1.25 times the mean of the others' ([`IMBALANCE_RATIO`]): its activation and temporary allocations scaled by the mean work of the devices over its own (work: the most bytes of activations and temporaries live at once), the heaviest carrying the mean share; not listed otherwise, nor when its work is not above the mean ([`imbalance`]) |
//!
//! Sizes are scaled and rounded to the allocation's granule (the largest
//! power of two up to 512 dividing its size, at least one granule), as
//! [`predict`](crate::predict) scales. Blocks allocated before the trace
//! keep their size (they are other by role). When the recording ends at the
//! OOM, a lever that fits says so ([`ends_at_failure_clause`]).

use rustc_hash::{FxHashMap, FxHashSet};

use super::diagnose::ends_at_failure_clause;
use super::roles::{Role, Roles};
use super::setting::MAX_CAPACITY;
use super::sites::Sites;
use super::{Replay, ReplayError, ReplayOptions, ReplaySetting, StartState};
use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use crate::predict::granule;
use reservoir::format::format_size;

/// A program change and the replay that proves what it gives.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Lever {
    /// Which lever: `micro_batch`, `optimizer_sharding`,
    /// `activation_checkpointing`, `lower_precision`, `fused_attention`,
    /// `in_place`, `imbalance`.
    pub lever: &'static str,
    /// The lever in words, as the text, the page and the notebook name it
    /// ([`lever_name`]).
    pub name: &'static str,
    /// What was transformed and replayed, and what it gave, in words.
    pub replayed: String,
    /// Peak reserved bytes of the replay (on an unbounded device when it
    /// does not fit).
    pub peak_reserved: u64,
    /// Peak allocated bytes of the same replay.
    pub peak_allocated: u64,
    /// Its replay on the device meets no out-of-memory error.
    pub fits: bool,
}

/// A lever's key in words (`micro_batch`: "smaller micro-batch").
pub fn lever_name(key: &'static str) -> &'static str {
    match key {
        "micro_batch" => "smaller micro-batch",
        "optimizer_sharding" => "optimizer state sharded",
        "activation_checkpointing" => "activation checkpointing",
        "lower_precision" => "bf16 activations",
        "fused_attention" => "fused attention",
        "in_place" => "in-place ops",
        "imbalance" => "balanced devices",
        k => k,
    }
}

/// What the levers are computed from.
pub struct LeverInput<'a> {
    /// The recorded trace.
    pub trace: &'a Trace,
    /// Its start state.
    pub start: Option<&'a StartState>,
    /// The setting every lever is replayed with.
    pub setting: &'a ReplaySetting,
    /// The replay options (the device's capacity).
    pub options: &'a ReplayOptions,
    /// The sites of the allocations.
    pub sites: &'a Sites,
    /// The op explained (the OOM), or the last op: the sites to
    /// checkpoint are those of the saved activations live when their bytes
    /// peak, at or before it.
    pub moment: u64,
    /// The recording ends at this failed op (its OOM).
    pub ends_at: Option<u64>,
    /// The devices (or ranks) of the input when the trace is the heaviest
    /// of several and imbalanced ([`Imbalance::of`]): the `imbalance`
    /// lever; `None` otherwise.
    pub imbalance: Option<&'a Imbalance>,
}

/// Peaks of one replay.
#[derive(Clone, Copy, Debug)]
struct Outcome {
    fits: bool,
    peak_reserved: u64,
    peak_allocated: u64,
}

/// Replay `trace` on `capacity`; `None` when it meets an OOM (it stops at
/// the first) and `stop_at_oom`.
fn replay_peaks(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    stop_at_oom: bool,
) -> Result<Option<Outcome>, ReplayError> {
    let mut r: Replay<'_> = Replay::build(trace, start, setting, options)?;
    r.track_peak = false;
    while r.step()? {
        if stop_at_oom && r.ooms > 0 {
            return Ok(None);
        }
    }
    let stats = r.alloc.stats();
    Ok(Some(Outcome {
        fits: r.ooms == 0,
        peak_reserved: stats.reserved_bytes.all().peak.max(0) as u64,
        peak_allocated: stats.allocated_bytes.all().peak.max(0) as u64,
    }))
}

impl LeverInput<'_> {
    /// Does `trace` fit the device? Its peaks if so.
    fn try_fit(&self, trace: &Trace) -> Result<Option<Outcome>, ReplayError> {
        replay_peaks(trace, self.start, self.setting, self.options, true)
    }

    /// The peaks of `trace`: on the device when it fits, else on an
    /// unbounded one.
    fn outcome(&self, trace: &Trace) -> Result<Outcome, ReplayError> {
        let fit = self.try_fit(trace)?;
        self.outcome_after(fit, trace)
    }

    /// [`outcome`](Self::outcome) of `trace` whose [`try_fit`](Self::try_fit)
    /// gave `fit`: a trace that did not fit is replayed once more, on an
    /// unbounded device, not tried on the device again.
    fn outcome_after(&self, fit: Option<Outcome>, trace: &Trace) -> Result<Outcome, ReplayError> {
        if let Some(o) = fit {
            return Ok(o);
        }
        let big = ReplayOptions {
            capacity: MAX_CAPACITY,
            ..self.options.clone()
        };
        let o = replay_peaks(trace, self.start, self.setting, &big, false)?;
        Ok(Outcome {
            fits: false,
            ..o.unwrap_or(Outcome {
                fits: false,
                peak_reserved: 0,
                peak_allocated: 0,
            })
        })
    }

    /// The lever `lever` whose transformation `what` gave `o`.
    fn lever(&self, lever: &'static str, what: String, o: Outcome) -> Lever {
        let with = if self.setting.config.is_empty() {
            "PyTorch's default settings".to_string()
        } else {
            format!("`{}`", self.setting.config)
        };
        let result = if o.fits {
            let ends = self.ends_at.map_or(String::new(), |op| {
                format!(" ({})", ends_at_failure_clause(op))
            });
            format!(
                "peak reserved {} (allocated {}), fits in {}{ends}",
                format_size(o.peak_reserved),
                format_size(o.peak_allocated),
                format_size(self.options.capacity)
            )
        } else {
            format!(
                "does not fit in {} (its replay there runs out of memory); on an unbounded device it peaks at {} reserved ({} allocated)",
                format_size(self.options.capacity),
                format_size(o.peak_reserved),
                format_size(o.peak_allocated)
            )
        };
        Lever {
            lever,
            name: lever_name(lever),
            replayed: format!("{what}; replayed with {with}: {result}"),
            peak_reserved: o.peak_reserved,
            peak_allocated: o.peak_allocated,
            fits: o.fits,
        }
    }
}

/// `bytes * num / den`, rounded to the granule of `bytes`, at least one.
fn scale(bytes: u64, num: u64, den: u64) -> u64 {
    let g = granule(std::iter::once(bytes));
    let scaled = (bytes as u128 * num as u128 / den.max(1) as u128) as u64;
    (scaled.saturating_add(g / 2) / g).max(1) * g
}

/// `trace` with every allocation whose role is in `roles` made `num/den`
/// its size; how many were, and their bytes before.
fn resized(trace: &Trace, roles: &Roles, pick: &[Role], num: u64, den: u64) -> (Trace, u64, u64) {
    let mut t = trace.clone();
    let (mut count, mut bytes_before) = (0u64, 0u64);
    for op in &mut t.ops {
        if let Op::Alloc { id, bytes, .. } = op {
            if pick.contains(&roles.role(*id).0) {
                count += 1;
                bytes_before += *bytes;
                *bytes = scale(*bytes, num, den);
            }
        }
    }
    (t, count, bytes_before)
}

/// The lever of halving the micro-batch.
fn micro_batch(input: &LeverInput<'_>, roles: &Roles) -> Result<Option<Lever>, ReplayError> {
    let (t, count, bytes) = resized(
        input.trace,
        roles,
        &[Role::Activations, Role::Temporaries],
        1,
        2,
    );
    if count == 0 {
        return Ok(None);
    }
    let o = input.outcome(&t)?;
    let what = format!(
        "halved the micro-batch (factor 1/2): the {count} activation and temporary allocations of the trace ({} in all) made half their size, every other allocation kept",
        format_size(bytes)
    );
    Ok(Some(input.lever("micro_batch", what, o)))
}

/// The lever of keeping activations in bf16 instead of fp32.
fn lower_precision(input: &LeverInput<'_>, roles: &Roles) -> Result<Option<Lever>, ReplayError> {
    let (t, count, bytes) = resized(input.trace, roles, &[Role::Activations], 1, 2);
    if count == 0 {
        return Ok(None);
    }
    let o = input.outcome(&t)?;
    let what = format!(
        "activations in bf16 instead of fp32: the {count} allocations of activations saved for backward ({} in all) made half their size, every other allocation kept",
        format_size(bytes)
    );
    Ok(Some(input.lever("lower_precision", what, o)))
}

/// The lever of sharding the optimizer state over N ranks.
fn optimizer_sharding(input: &LeverInput<'_>, roles: &Roles) -> Result<Option<Lever>, ReplayError> {
    let mut found = None;
    for n in [2u64, 4, 8] {
        let (t, count, bytes) = resized(input.trace, roles, &[Role::OptimizerState], 1, n);
        if count == 0 {
            return Ok(None);
        }
        let fit = input.try_fit(&t)?;
        let last = n == 8;
        if fit.is_some() || last {
            let why = if fit.is_some() {
                format!("the smallest of 2, 4, 8 ranks that fits is {n}")
            } else {
                "none of 2, 4, 8 ranks fits; 8 shown".to_string()
            };
            let what = format!(
                "sharded the optimizer state over {n} ranks (ZeRO stage 1; {why}): the {count} optimizer-state allocations ({} in all) made 1/{n} their size, every other allocation kept",
                format_size(bytes)
            );
            let o = input.outcome_after(fit, &t)?;
            found = Some(input.lever("optimizer_sharding", what, o));
            break;
        }
    }
    Ok(found)
}

/// The sites of the saved activations live when their bytes peak, at or
/// before op `until`, largest first, with their bytes; and that op.
fn activation_sites<'s>(
    trace: &Trace,
    roles: &Roles,
    sites: &'s Sites,
    until: u64,
) -> (Vec<(&'s str, u64)>, u64) {
    let mut live: FxHashMap<AllocId, u64> = FxHashMap::default();
    let mut by: FxHashMap<&str, u64> = FxHashMap::default();
    let (mut now, mut peak, mut at) = (0u64, 0u64, 0u64);
    let mut best: FxHashMap<&str, u64> = FxHashMap::default();
    for (i, op) in trace.ops.iter().enumerate().take(until as usize + 1) {
        match op {
            Op::Alloc { id, bytes, .. } if roles.role(*id).0 == Role::Activations => {
                live.insert(*id, *bytes);
                *by.entry(sites.site(*id)).or_default() += bytes;
                now += bytes;
                if now > peak {
                    (peak, at) = (now, i as u64);
                    best.clone_from(&by);
                }
            }
            Op::Free { id } => {
                if let Some(b) = live.remove(id) {
                    now -= b;
                    if let Some(x) = by.get_mut(sites.site(*id)) {
                        *x -= b;
                    }
                }
            }
            _ => {}
        }
    }
    let mut v: Vec<(&str, u64)> = best.into_iter().filter(|g| g.1 > 0).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    (v, at)
}

/// `items` (allocation, bytes) summed by site: (site, bytes, allocations),
/// the most bytes first (then by name).
fn by_site(
    sites: &Sites,
    items: impl IntoIterator<Item = (AllocId, u64)>,
) -> Vec<(&str, u64, u64)> {
    let mut groups: FxHashMap<&str, (u64, u64)> = FxHashMap::default();
    for (id, bytes) in items {
        let g = groups.entry(sites.site(id)).or_default();
        (g.0, g.1) = (g.0 + bytes, g.1 + 1);
    }
    let mut v: Vec<(&str, u64, u64)> = groups.into_iter().map(|(s, (b, n))| (s, b, n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    v
}

mod checkpoint;
mod fused;
pub mod imbalance;
mod inplace;

pub use imbalance::{work_bytes, Imbalance, Peer, IMBALANCE_RATIO};

/// Every lever that applies, in order: a smaller micro-batch, optimizer
/// state sharded, activation checkpointing, lower-precision activations,
/// fused attention, in-place ops, the imbalance between devices.
pub fn levers(input: &LeverInput<'_>) -> Result<Vec<Lever>, ReplayError> {
    let roles = Roles::classify(input.trace, input.sites);
    let mut out = Vec::new();
    out.extend(micro_batch(input, &roles)?);
    out.extend(optimizer_sharding(input, &roles)?);
    out.extend(checkpoint::activation_checkpointing(input, &roles)?);
    out.extend(lower_precision(input, &roles)?);
    out.extend(fused::fused_attention(input)?);
    out.extend(inplace::in_place(input)?);
    out.extend(imbalance::imbalance(input, &roles)?);
    Ok(out)
}

/// The stream of each allocation op of `trace`: its own, else the current
/// stream then (`None`: the default).
fn alloc_streams(trace: &Trace) -> Vec<Option<StreamName>> {
    let mut cur: Option<StreamName> = None;
    trace
        .ops
        .iter()
        .map(|op| match op {
            Op::SetStream { stream } => {
                cur = Some(stream.clone());
                None
            }
            Op::Alloc { stream, .. } => stream.clone().or_else(|| cur.clone()),
            _ => None,
        })
        .collect()
}

/// Ids named in `ops` that are allocated more than once (their roles are
/// the last allocation's; levers leave them alone where it matters).
fn reused_ids(trace: &Trace) -> FxHashSet<AllocId> {
    let mut seen = FxHashSet::default();
    let mut twice = FxHashSet::default();
    for op in &trace.ops {
        if let Op::Alloc { id, .. } = op {
            if !seen.insert(*id) {
                twice.insert(*id);
            }
        }
    }
    twice
}

#[cfg(test)]
mod tests;
