//! Policies side by side on many inputs (`reservoir compare`): each input
//! (a recorded trace from a cold start, or a built-in workload) replayed
//! under each setting, with its peak live and reserved bytes, their ratio,
//! the minimum capacity, the driver calls, the simulated driver time and
//! the allocator's time per call; and a summary per setting.
//!
//! The waste bound of issue 17: peak reserved at most
//! `1.05 x peak live + 4 MiB per stream` ([`waste_bound`]), counting the
//! streams that allocate.
//!
//! **Steady state** (issue 17: "no more simulated driver time than PyTorch
//! mode in steady state"): the ops from [`steady_state_start`] to the end:
//! the second half of the input's ops, and only after the op at which the
//! bytes the program holds reach their peak ([`live_peak_op`]). A program
//! that repeats an iteration (a training step, a decode step) has warmed
//! its cache by its second half; a program whose live bytes still rise
//! there (a forward pass over a growing context) is not in a steady state
//! until its last new peak, and every policy must then get new memory
//! from the driver. The steady-state driver time is the simulated driver
//! time of the calls made in those ops.

use std::collections::{BTreeSet, HashMap};

use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use crate::replay::capacity::min_capacity;
use crate::replay::{Replay, ReplayError, ReplayOptions, ReplaySetting, StartState};

pub use reservoir::config::{waste_bound, WASTE_SLACK_PER_STREAM as SLACK_PER_STREAM};

/// One input to compare policies on.
#[derive(Clone, Debug)]
pub struct CompareInput {
    /// A name for reports (a file's path relative to the traces folder, or
    /// `workload NAME`).
    pub name: String,
    /// The ops (for a recorded trace, its cold-start trace).
    pub trace: Trace,
    /// The start state (empty for a cold start: no segments), if any.
    pub start: Option<StartState>,
    /// Device capacity.
    pub capacity: u64,
    /// The settings to replay it with, in column order.
    pub settings: Vec<ReplaySetting>,
    /// Most out-of-memory errors each setting's replay may meet
    /// ([`ReplayOptions::max_ooms`]; the capacity search is not capped).
    pub max_ooms: Option<u64>,
}

/// One setting on one input.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PolicyResult {
    /// The setting's name.
    pub policy: String,
    /// `requested_bytes.all.peak`.
    pub peak_live: u64,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved: u64,
    /// `peak_reserved / peak_live` (1.0 when nothing was live).
    pub ratio: f64,
    /// `peak_reserved <= ` the input's bound ([`CompareRow::bound`]).
    pub within_bound: bool,
    /// Smallest capacity without OOM ([`min_capacity`]), `null` above 16 TiB.
    pub min_capacity: Option<u64>,
    /// Driver allocations plus frees.
    pub driver_calls: u64,
    /// Simulated driver time, ns.
    pub driver_time_ns: u64,
    /// Simulated driver time of the steady state (the ops from
    /// [`steady_state_start`] on), ns.
    pub steady_driver_time_ns: u64,
    /// The driver calls of the steady state, by kind.
    pub steady_calls: DriverCalls,
    /// Mean wall time of an allocator call, ns (host-dependent).
    pub allocator_ns_per_op: f64,
    /// Out-of-memory errors on the input's capacity.
    pub ooms: u64,
}

/// Driver calls by kind (the simulated device's counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DriverCalls {
    /// Allocations (`cudaMalloc`).
    pub mallocs: u64,
    /// Frees (`cudaFree`).
    pub frees: u64,
    /// Maps (`cuMemCreate` + `cuMemMap`).
    pub maps: u64,
    /// Unmaps (`cuMemUnmap` + `cuMemRelease`).
    pub unmaps: u64,
    /// Address-space reservations (`cuMemAddressReserve`).
    pub reserves: u64,
    /// Address-space releases (`cuMemAddressFree`).
    pub releases: u64,
}

impl std::fmt::Display for DriverCalls {
    /// The kinds made, e.g. `3 cudaMalloc, 1 map, 2 unmaps` (`no calls` if
    /// none).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds = [
            (self.mallocs, "cudaMalloc", ""),
            (self.frees, "cudaFree", ""),
            (self.maps, "map", "s"),
            (self.unmaps, "unmap", "s"),
            (self.reserves, "address reservation", "s"),
            (self.releases, "address release", "s"),
        ];
        let made: Vec<String> = kinds
            .iter()
            .filter(|(n, _, _)| *n > 0)
            .map(|(n, what, plural)| format!("{n} {what}{}", if *n == 1 { "" } else { plural }))
            .collect();
        if made.is_empty() {
            f.write_str("no calls")
        } else {
            f.write_str(&made.join(", "))
        }
    }
}

/// Every setting on one input.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompareRow {
    /// [`CompareInput::name`].
    pub input: String,
    /// The input's ops.
    pub ops: u64,
    /// The first op of its steady state ([`steady_state_start`]; `ops` if
    /// its live bytes reach their peak at its last op).
    pub steady_start: u64,
    /// Streams that allocate.
    pub streams: u64,
    /// The simulated device's capacity it ran on ([`CompareInput::capacity`]).
    pub capacity: u64,
    /// The bound on peak reserved bytes ([`trace_bound`]: [`waste_bound`]
    /// of the trace's peak of live bytes).
    pub bound: u64,
    /// One per setting, in order.
    pub policies: Vec<PolicyResult>,
}

/// The streams a trace allocates on (the default stream is current at the
/// start; `s` ops change the current stream).
pub fn allocating_streams(trace: &Trace) -> u64 {
    let default = StreamName::new("0");
    let mut current = &default;
    let mut seen = BTreeSet::new();
    for op in &trace.ops {
        match op {
            Op::SetStream { stream } => current = stream,
            Op::Alloc { stream, .. } => {
                let s = stream.as_ref().unwrap_or(current);
                let key = if s.is_default() { "0" } else { s.as_str() };
                seen.insert(key.to_string());
            }
            _ => {}
        }
    }
    seen.len() as u64
}

/// The peak of the bytes the program holds in `trace` (allocated and not
/// freed, counting the blocks `start` seeds) and the op at which it is
/// first reached, or `None` if no op allocates. A free of an unknown id
/// changes nothing.
pub fn live_peak(trace: &Trace, start: Option<&StartState>) -> Option<(u64, usize)> {
    let mut live: HashMap<AllocId, u64> = HashMap::new();
    if let Some(start) = start {
        for (_, _, block, id) in start.live_blocks() {
            live.insert(id, block.requested_size);
        }
    }
    let mut current: u64 = live.values().sum();
    let mut peak: Option<(u64, usize)> = None;
    for (i, op) in trace.ops.iter().enumerate() {
        match op {
            Op::Alloc { id, bytes, .. } => {
                current += bytes;
                if let Some(old) = live.insert(*id, *bytes) {
                    current -= old;
                }
                if peak.map_or(true, |(p, _)| current > p) {
                    peak = Some((current, i));
                }
            }
            Op::Free { id } => current -= live.remove(id).unwrap_or(0),
            _ => {}
        }
    }
    peak
}

/// The op at which the live bytes of `trace` first reach their peak
/// ([`live_peak`]).
pub fn live_peak_op(trace: &Trace, start: Option<&StartState>) -> Option<usize> {
    live_peak(trace, start).map(|(_, i)| i)
}

/// Issue 17's bound for `trace` (started from `start`), known before any
/// replay: [`waste_bound`] of its peak of live bytes ([`live_peak`]) and
/// its [`allocating_streams`]. `reservoir compare --capacity bound` gives
/// each input a device of this size.
pub fn trace_bound(trace: &Trace, start: Option<&StartState>) -> u64 {
    let peak = live_peak(trace, start).map_or(0, |(bytes, _)| bytes);
    waste_bound(peak, allocating_streams(trace))
}

/// The first op of the steady state of `trace` (started from `start`): the
/// second half of its ops (`ops / 2`, so a one-op trace's steady state is
/// that op), and not before the op after [`live_peak_op`]. A trace whose
/// live bytes reach their peak at its last op has no steady state
/// (`ops`).
pub fn steady_state_start(trace: &Trace, start: Option<&StartState>) -> usize {
    let half = trace.ops.len() / 2;
    half.max(live_peak_op(trace, start).map_or(0, |i| i + 1))
}

/// Replay `input` under each of its settings, and find each one's minimum
/// capacity. `progress` is called after each setting.
pub fn compare(
    input: &CompareInput,
    progress: &mut dyn FnMut(&str),
) -> Result<CompareRow, ReplayError> {
    let mut policies = Vec::with_capacity(input.settings.len());
    for k in 0..input.settings.len() {
        policies.push(compare_setting(input, k)?);
        progress(&input.settings[k].name);
    }
    Ok(compare_row(input, policies))
}

/// The ratio of a [`PolicyResult`]: `peak_reserved / peak_live`, 1.0 when
/// nothing was live.
pub fn peak_ratio(peak_reserved: u64, peak_live: u64) -> f64 {
    if peak_live == 0 {
        1.0
    } else {
        peak_reserved as f64 / peak_live as f64
    }
}

/// Replay `input` under its setting number `k` (`input.settings[k]`) and
/// find its minimum capacity: one cell of [`compare`], independent of the
/// others (so the cells of many inputs can be computed in any order, or at
/// once, and give the same row).
///
/// # Panics
///
/// If `k` is not the index of one of `input.settings`.
pub fn compare_setting(input: &CompareInput, k: usize) -> Result<PolicyResult, ReplayError> {
    let s = &input.settings[k];
    // The input's bound, from its trace: the same for every setting, even
    // one that runs out of memory and so holds fewer bytes.
    let bound = trace_bound(&input.trace, input.start.as_ref());
    let options = ReplayOptions {
        max_ooms: input.max_ooms,
        ..ReplayOptions::without_timeline(input.capacity)
    };
    let steady_start = steady_state_start(&input.trace, input.start.as_ref());
    let mut r: Replay<'_> = Replay::build(&input.trace, input.start.as_ref(), s, &options)?;
    while r.position() < steady_start {
        r.step()?;
    }
    let warm_up = r.device().counters();
    r.run()?;
    let end = r.device().counters();
    let steady_driver_time_ns = end.driver_time_ns - warm_up.driver_time_ns;
    let steady_calls = DriverCalls {
        mallocs: end.allocs - warm_up.allocs,
        frees: end.frees - warm_up.frees,
        maps: end.maps - warm_up.maps,
        unmaps: end.unmaps - warm_up.unmaps,
        reserves: end.reserves - warm_up.reserves,
        releases: end.releases - warm_up.releases,
    };
    let rep = r.report();
    let min = min_capacity(&input.trace, input.start.as_ref(), s, &mut |_, _| {})?;
    Ok(PolicyResult {
        policy: s.name.clone(),
        peak_live: rep.peak_live,
        peak_reserved: rep.peak_reserved,
        ratio: peak_ratio(rep.peak_reserved, rep.peak_live),
        within_bound: rep.peak_reserved <= bound,
        min_capacity: min.min_capacity,
        driver_calls: rep.driver_allocs + rep.driver_frees,
        driver_time_ns: rep.driver_time_ns,
        steady_driver_time_ns,
        steady_calls,
        allocator_ns_per_op: rep.allocator_ns_per_op,
        ooms: rep.ooms,
    })
}

/// The row of `input` from its cells ([`compare_setting`] of each setting,
/// in order).
pub fn compare_row(input: &CompareInput, policies: Vec<PolicyResult>) -> CompareRow {
    CompareRow {
        input: input.name.clone(),
        ops: input.trace.ops.len() as u64,
        steady_start: steady_state_start(&input.trace, input.start.as_ref()) as u64,
        streams: allocating_streams(&input.trace),
        capacity: input.capacity,
        bound: trace_bound(&input.trace, input.start.as_ref()),
        policies,
    }
}

/// One setting over every input.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PolicySummary {
    /// The setting's name.
    pub policy: String,
    /// Inputs it ran on.
    pub inputs: u64,
    /// Median of `peak_reserved / peak_live`.
    pub median_ratio: f64,
    /// 90th percentile (nearest rank).
    pub p90_ratio: f64,
    /// The largest ratio.
    pub worst_ratio: f64,
    /// The input with the largest ratio.
    pub worst_input: String,
    /// Inputs within [`waste_bound`].
    pub within_bound: u64,
    /// Inputs on which it ran out of memory at least once (on the input's
    /// capacity).
    pub inputs_with_ooms: u64,
    /// Sum of the minimum capacities over the inputs where every setting
    /// has one, bytes.
    pub total_min_capacity: u64,
    /// Simulated driver time over every input, ns.
    pub total_driver_time_ns: u64,
    /// Steady-state simulated driver time over every input, ns.
    pub total_steady_driver_time_ns: u64,
}

fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The summary per setting name, in the order names first appear.
pub fn summarize(rows: &[CompareRow]) -> Vec<PolicySummary> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows {
        for p in &r.policies {
            if !names.contains(&p.policy.as_str()) {
                names.push(&p.policy);
            }
        }
    }
    let all_fit = |r: &CompareRow| r.policies.iter().all(|p| p.min_capacity.is_some());
    names
        .into_iter()
        .map(|name| {
            let mine: Vec<(&CompareRow, &PolicyResult)> = rows
                .iter()
                .filter_map(|r| r.policies.iter().find(|p| p.policy == name).map(|p| (r, p)))
                .collect();
            let mut ratios: Vec<f64> = mine.iter().map(|(_, p)| p.ratio).collect();
            ratios.sort_by(f64::total_cmp);
            let worst = mine
                .iter()
                .max_by(|a, b| a.1.ratio.total_cmp(&b.1.ratio))
                .map(|(r, p)| (r.input.clone(), p.ratio));
            PolicySummary {
                policy: name.to_string(),
                inputs: mine.len() as u64,
                median_ratio: nearest_rank(&ratios, 0.5),
                p90_ratio: nearest_rank(&ratios, 0.9),
                worst_ratio: worst.as_ref().map_or(0.0, |w| w.1),
                worst_input: worst.map(|w| w.0).unwrap_or_default(),
                within_bound: mine.iter().filter(|(_, p)| p.within_bound).count() as u64,
                inputs_with_ooms: mine.iter().filter(|(_, p)| p.ooms > 0).count() as u64,
                total_min_capacity: mine
                    .iter()
                    .filter(|(r, _)| all_fit(r))
                    .filter_map(|(_, p)| p.min_capacity)
                    .sum(),
                total_driver_time_ns: mine.iter().map(|(_, p)| p.driver_time_ns).sum(),
                total_steady_driver_time_ns: mine
                    .iter()
                    .map(|(_, p)| p.steady_driver_time_ns)
                    .sum(),
            }
        })
        .collect()
}
