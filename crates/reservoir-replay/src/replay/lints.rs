//! Lints that name waste before it becomes an out-of-memory error
//! ([`lints`]): a second pass over the replay of a setting that watches
//! every allocator event (the trace entries of spec 2.4, through a trace
//! tracker) and reports, each with bytes, the sites involved and the change
//! that removes it:
//!
//! * [`LintKind::StrandedStream`]: free bytes cached on a stream after its
//!   last allocation in the trace, measured before each later allocation on
//!   another stream that had to reserve more memory (or failed): the
//!   moments when they cost memory. Cached blocks serve their own stream
//!   only, so these bytes are lost to the rest of the program until
//!   `empty_cache()`.
//! * [`LintKind::DelayedFree`]: blocks whose free waited for the events of
//!   the streams recorded with `record_stream` (`free_requested` then
//!   `free_completed` after an allocation ran while they waited): bytes,
//!   how long in ops, the peak of bytes still waiting after an allocation. (Traces carry no clock, so durations are in
//!   ops only.)
//! * [`LintKind::IdlePool`]: private pools (CUDA graph pools, `MemPool`s:
//!   a pool id other than `(0, 0)`) whose reserved bytes are not allocated:
//!   the peak of such bytes. The oracle trace format cannot route
//!   allocations to a private pool, so a replayed trace never has one; the
//!   lint fires when the allocator driven uses private pools.
//! * [`LintKind::Rounding`]: bytes lost to rounding (spec 1.3: the rounded
//!   size minus the request, 512-byte steps or `roundup_power2_divisions`)
//!   by the allocations live at the reserved peak, by site, with the
//!   site's typical request and the rounding boundary just below it.
//!
//! A lint is reported when its bytes reach [`threshold`] (1 MiB or 1 % of
//! the setting's peak reserved bytes, whichever is more), at most
//! [`TOP_PER_KIND`] per kind, largest first.

use std::sync::Arc;

use rustc_hash::FxHashMap;

#[cfg(test)]
use accumulator::drain;
use accumulator::{tracker, Accumulator, EventBuffer, NewBlock};

use super::sites::Sites;
use super::target::ReplayTarget as _;
use super::{
    AllocatorKind, Replay, ReplayError, ReplayOptions, ReplayReport, ReplaySetting, StartState,
};
use crate::oracle_trace::{Op, Trace};
use reservoir::backend::StreamId;
use reservoir::caching::rules;
use reservoir::config::AllocatorConfig;
use reservoir::format::format_size;
use reservoir::observe::snapshot::BlockState;

mod accumulator;

/// Lints reported per kind, at most.
pub const TOP_PER_KIND: usize = 3;
/// Sites listed per lint, at most.
pub const TOP_SITES: usize = 5;
/// The smallest waste reported, in bytes (see [`threshold`]).
pub const MIN_BYTES: u64 = 1 << 20;

/// The smallest waste reported for a setting that peaked at
/// `peak_reserved` bytes: [`MIN_BYTES`] or 1 % of the peak, whichever is
/// more.
pub fn threshold(peak_reserved: u64) -> u64 {
    MIN_BYTES.max(peak_reserved / 100)
}

/// What a lint is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LintKind {
    /// Free bytes cached on a stream that allocates no more.
    StrandedStream,
    /// Frees delayed by `record_stream`.
    DelayedFree,
    /// A private pool holding reserved bytes that are not allocated.
    IdlePool,
    /// Bytes lost to rounding requests up (spec 1.3).
    Rounding,
}

impl LintKind {
    /// A short name for tables.
    pub fn label(self) -> &'static str {
        match self {
            LintKind::StrandedStream => "stranded on a stream",
            LintKind::DelayedFree => "frees delayed by record_stream",
            LintKind::IdlePool => "idle private pool",
            LintKind::Rounding => "lost to rounding",
        }
    }
}

/// A site involved in a lint.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LintSite {
    /// The site (see [`sites`](super::sites)).
    pub site: String,
    /// Its bytes in the lint (what it means depends on the kind: bytes it
    /// allocated on the stream, bytes whose free was delayed, bytes lost
    /// to rounding at the peak).
    pub bytes: u64,
    /// Its allocations counted.
    pub count: u64,
    /// Its typical request (rounding: the request losing it most bytes).
    pub request: Option<u64>,
}

/// One lint of a setting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Lint {
    /// What it is about.
    pub kind: LintKind,
    /// The bytes wasted: the peak of stranded, delayed or idle bytes, or the
    /// bytes lost to rounding at the reserved peak.
    pub bytes: u64,
    /// The op at which `bytes` was reached (after it for delayed frees and
    /// idle pools, before it for stranded bytes: the allocation that could
    /// have used them).
    pub op: Option<u64>,
    /// The stream's name (stranded bytes).
    pub stream: Option<String>,
    /// The private pool's id (idle pools).
    pub pool: Option<(i64, i64)>,
    /// Delayed frees: the longest delay, in ops.
    pub ops: Option<u64>,
    /// What happened, in words.
    pub detail: String,
    /// The sites involved, largest first (at most [`TOP_SITES`]).
    pub sites: Vec<LintSite>,
    /// The setting or code change that removes it.
    pub fix: String,
}

/// The lints of one setting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SettingLints {
    /// The setting.
    pub setting: String,
    /// Whether lints were computed (not for the MPS heap allocator, which
    /// has no streams' caches, pools or CUDA rounding).
    pub computed: bool,
    /// The threshold applied, in bytes.
    pub threshold: u64,
    /// The lints above it, by kind, largest first within a kind.
    pub lints: Vec<Lint>,
}

/// The boundary `request` is just above (within an eighth of the rounding
/// step above it), if it is.
pub fn just_above(request: u64, config: &AllocatorConfig) -> Option<u64> {
    let rounded = rules::round_size(request, config);
    let below = boundary_below(request, config);
    (below > 0 && (request - below) * 8 <= rounded - below).then_some(below)
}

/// The largest rounded size below the rounding of `request`: the boundary
/// the request is just above (0 when none).
pub fn boundary_below(request: u64, config: &AllocatorConfig) -> u64 {
    let rounded = rules::round_size(request, config);
    if request <= rules::MIN_BLOCK_SIZE {
        return 0;
    }
    // The largest v < request with round_size(v) < rounded (monotone).
    let (mut lo, mut hi) = (0u64, request);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if rules::round_size(mid, config) < rounded {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if lo == 0 {
        0
    } else {
        rules::round_size(lo, config)
    }
}

/// The last allocation op of each stream name of `trace` (canonical names:
/// `0` for the default stream).
fn last_allocs(trace: &Trace) -> FxHashMap<String, u64> {
    let mut current = "0".to_string();
    let mut last = FxHashMap::default();
    for (i, op) in trace.ops.iter().enumerate() {
        match op {
            Op::SetStream { stream } => current = stream.canonical().to_string(),
            Op::Alloc { stream, .. } => {
                let name = stream
                    .as_ref()
                    .map_or(current.clone(), |s| s.canonical().to_string());
                last.insert(name, i as u64);
            }
            _ => {}
        }
    }
    last
}

/// Note the start state's segments and live blocks of replay `r` in `acc`.
fn seed(acc: &mut Accumulator, r: &Replay<'_>, sites: &Sites) {
    let id_at: FxHashMap<u64, u64> = r.live.live().map(|(id, p)| (p.0, id)).collect();
    for seg in r.alloc.segments() {
        let pool = seg.pool_id();
        acc.seed_segment(seg.stream, pool, seg.total_size);
        for (addr, b) in seg.blocks_with_addresses() {
            if b.state != BlockState::Inactive {
                let site = id_at
                    .get(&addr)
                    .map_or(super::sites::BEFORE_TRACE, |&id| sites.site(id));
                acc.seed_block(
                    addr,
                    NewBlock {
                        size: b.size,
                        stream: seg.stream,
                        pool,
                        site,
                        request: b.requested_size,
                    },
                );
            }
        }
    }
}

/// The trace's name of stream `s` (`0` for the default stream, else the
/// name `streams` gives it, else its number).
fn stream_name(streams: &super::StreamTable, s: StreamId) -> String {
    if s == StreamId::DEFAULT {
        return "0".to_string();
    }
    streams
        .streams()
        .iter()
        .find(|(_, id)| *id == s)
        .map_or_else(|| s.0.to_string(), |(n, _)| n.clone())
}

/// The lints of `setting` on `trace` (from `start` when given), whose replay
/// gave `report`: a second replay that watches every allocator event.
pub fn lints(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    report: &ReplayReport,
    sites: &Sites,
) -> Result<SettingLints, ReplayError> {
    let threshold = threshold(report.peak_reserved);
    if setting.allocator != AllocatorKind::Caching {
        return Ok(SettingLints {
            setting: setting.name.clone(),
            computed: false,
            threshold,
            lints: Vec::new(),
        });
    }
    let quiet = start.map(StartState::quiet);
    let mut r: Replay<'_> = Replay::build(trace, quiet.as_ref(), setting, options)?;
    r.track_peak = false;
    let mut acc = Accumulator::new(setting.allocator_config()?);
    seed(&mut acc, &r, sites);
    let buf: EventBuffer = Arc::default();
    r.alloc.attach_trace_tracker(tracker(&buf));
    let last_by_name = last_allocs(trace);
    let peak_op = report.peak.as_ref().map(|p| p.op);
    // The last allocation op of each stream id, filled as streams appear.
    let mut last_of: FxHashMap<StreamId, Option<u64>> = FxHashMap::default();
    let mut events = Vec::new();
    while !r.is_done() {
        let i = r.position();
        let op = &trace.ops[i];
        let (allocated_before, _) = r.alloc.allocated_and_reserved();
        if let Op::Alloc { stream, .. } = op {
            let s = match stream {
                Some(n) => r.streams.get(n),
                None => Some(r.current),
            };
            for sid in acc.stream_ids() {
                last_of
                    .entry(sid)
                    .or_insert_with(|| last_by_name.get(&stream_name(&r.streams, sid)).copied());
            }
            let streams = &r.streams;
            let by = || match (stream, s) {
                (Some(n), _) => n.canonical().to_string(),
                (None, Some(s)) => stream_name(streams, s),
                (None, None) => String::new(),
            };
            acc.before_alloc(i as u64, s, by, |x| last_of.get(&x).copied().flatten());
        }
        r.step()?;
        #[cfg(test)]
        r.alloc
            .check_invariants()
            .unwrap_or_else(|e| panic!("invariant broken after op {i}: {e}"));
        if let Ok(mut b) = buf.lock() {
            std::mem::swap(&mut *b, &mut events);
        }
        let alloc = match op {
            Op::Alloc { id, bytes, .. } => {
                let (allocated, _) = r.alloc.allocated_and_reserved();
                Some((
                    sites.site(*id),
                    *bytes,
                    allocated.saturating_sub(allocated_before),
                ))
            }
            _ => None,
        };
        acc.op_events(i as u64, &events, matches!(op, Op::Alloc { .. }), alloc);
        events.clear();
        if peak_op == Some(i as u64) {
            acc.at_peak(i as u64);
        }
    }
    acc.finish(trace.ops.len() as u64);
    let streams = &r.streams;
    let lints = acc.lints(
        threshold,
        |s| stream_name(streams, s),
        |s| last_by_name.get(&stream_name(streams, s)).copied(),
        &setting.config,
    );
    let mut lints = lints;
    for l in lints.iter_mut().filter(|l| l.kind == LintKind::Rounding) {
        verify_rounding(l, trace, quiet.as_ref(), setting, options, report, sites)?;
    }
    Ok(SettingLints {
        setting: setting.name.clone(),
        computed: true,
        threshold,
        lints,
    })
}

/// Prove the rounding lint's fixes by replaying the trace with each: the
/// top site's requests trimmed to the boundary they are just above, and
/// `roundup_power2_divisions:1` (none) where the setting has divisions; the
/// peak reserved bytes each gives are added to the fix.
fn verify_rounding(
    l: &mut Lint,
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    report: &ReplayReport,
    sites: &Sites,
) -> Result<(), ReplayError> {
    let config = setting.allocator_config()?;
    let before = report.peak_reserved;
    let says = |after: u64, what: &str| {
        if after < before {
            format!(
                " (replayed: {what} lowers peak reserved from {} to {})",
                format_size(before),
                format_size(after)
            )
        } else {
            format!(
                " (replayed: {what} does not lower peak reserved here: {} against {})",
                format_size(after),
                format_size(before)
            )
        }
    };
    // The fix's parts (see `rounding_lint`): the trim first when there is
    // one, the divisions last.
    let mut parts: Vec<String> = l.fix.split("; or ").map(str::to_string).collect();
    if let Some((site, request)) = l
        .sites
        .first()
        .and_then(|s| Some((s.site.clone(), s.request?)))
    {
        if let Some(below) = just_above(request, &config) {
            let mut trimmed = trace.clone();
            for op in trimmed.ops.iter_mut() {
                if let Op::Alloc { id, bytes, .. } = op {
                    if *bytes == request && sites.site(*id) == site {
                        *bytes = below;
                    }
                }
            }
            let r = super::run_setting(&trimmed, start, setting, options, &mut |_| {})?;
            parts[0].push_str(&says(r.peak_reserved, "the trim"));
        }
    }
    if setting.config.contains("roundup_power2_divisions") {
        let none = ReplaySetting::new(
            setting.name.clone(),
            super::recorded::overlay_config(&setting.config, "roundup_power2_divisions:1"),
        );
        if none.allocator_config().is_ok() {
            let r = super::run_setting(trace, start, &none, options, &mut |_| {})?;
            if let Some(last) = parts.last_mut() {
                last.push_str(&says(r.peak_reserved, "roundup_power2_divisions:1"));
            }
        }
    }
    l.fix = parts.join("; or ");
    Ok(())
}

#[cfg(test)]
mod tests;
