//! Why an out-of-memory error happened, and the cheapest change that avoids
//! it, proven by replay (issue 30 item 1): the [`Diagnosis`] of each
//! [`OomExplanation`](super::explain::OomExplanation).
//!
//! # The shortfall
//!
//! After a failed allocation PyTorch has already released every cached
//! segment it could (spec 1.9: the last resort is `release_cached_blocks`),
//! then asked the driver once more for the request's segment and failed.
//! The **shortfall** is how many more bytes the device would have had to
//! offer the allocator for that last driver request to succeed in the state
//! at the failure: `reserved + segment - limit`, where `segment` is what the
//! allocator asks the driver for (spec 1.4 `get_allocation_size`; with
//! expandable segments the rounded request less the free tail of the
//! stream's mapped pages, rounded up to whole pages, spec 1.11) and `limit`
//! is what the allocator may use (the device, capped by
//! `per_process_memory_fraction`, spec 1.13).
//!
//! # The causes
//!
//! Each cause has the bytes it accounts for; causes are ordered by bytes,
//! largest first, and the first is "the" cause:
//!
//! | class | rule | bytes |
//! |---|---|---|
//! | `capacity` | | live bytes (as requested) plus the request, less the device the allocator is given: no allocator could serve it |
//! | `memory_fraction` | | the device less the limit `per_process_memory_fraction` sets (spec 1.13) |
//! | `outside_allocator` | | the device's total less what the allocator was given (other processes, the CUDA context, memory not from this allocator) |
//! | `pool_retention` | | free blocks of private pools (graph pools, `MemPool`s: pool id other than `(0, 0)`, spec 1.14) |
//! | `stream_stranding` | | free blocks cached for other streams, and blocks whose free waits for other streams' work (spec 1.10) |
//! | `fragmentation` | `pool_split` | free blocks of the other pool (small blocks serve requests of at most 1 MiB, spec 1.4) |
//! | `fragmentation` | `split_limit` | free blocks large enough but of `max_split_size` or more, which serve only oversize requests (spec 1.6), and the bytes live oversize blocks hold past their rounded request (never split, spec 1.7) |
//! | `fragmentation` | `oversize` | free blocks an oversize request may not take: `max_non_split_rounding_size` or more larger than it (spec 1.6) |
//! | `fragmentation` | `expandable_granularity` | free pieces of mapped expandable pages too small for the request (pages unmap whole, spec 1.11) |
//! | `fragmentation` | `scattered` | free blocks of the right stream and pool, each smaller than the request, kept because their segments hold live blocks |
//! | `fragmentation` | `rounding` | bytes live blocks and the request were rounded up by (spec 1.3, `roundup_power2_divisions`), and the unsplit remainders of live blocks that are not oversize (spec 1.7) |
//!
//! A free block is counted once, under the first row that applies to it.
//!
//! # The proven change
//!
//! Candidate changes are tried in order of their cost to the user, each by
//! replaying the whole trace with it: settings relevant to the causes (a
//! larger memory fraction; without `max_split_size_mb` for the split and
//! oversize rules; without `roundup_power2_divisions` for rounding; without
//! expandable segments for their granularity), then the general settings
//! the caller gives (the CLI: the setting's own with expandable segments, a
//! garbage-collection threshold, split limits, rounding divisions), then Reservoir's
//! `reservoir` policy, then, for stream stranding, a code change
//! (`torch.cuda.synchronize(); torch.cuda.empty_cache()` before the failed
//! allocation, a real trace transform), then, for memory outside the
//! allocator, the whole device. When no allocator could serve the request
//! (`capacity`), no setting is tried. The first change with which the whole
//! trace runs without an OOM is reported with the peak reserved bytes it
//! then needs.
//!
//! Last, "free X": the live allocations at the failure are grouped by site
//! (by site and requested size when the stacks name fewer than two sites);
//! the smallest set of the largest groups whose allocations, dropped from
//! the whole trace ([`drop_allocations`]), let it run without an OOM is
//! found by replay: all the top groups first (if even that fails, none
//! is found), then the fewest largest groups whose bytes cover the
//! shortfall, one more at a time, then shrunk while it still fits (each
//! member dropped, largest first), then lightened (each member swapped
//! for the smallest group left out that still covers the shortfall with
//! the others, kept if it still fits). At most
//! [`MAX_REPLAYS`] replays per OOM in all.

use rustc_hash::{FxHashMap, FxHashSet};

mod free;

use free::free_sites;

use super::sites::{SiteUsage, Sites};
use super::{AllocatorKind, Replay, ReplayOptions, ReplaySetting, StartState};
use crate::oracle_trace::{AllocId, Op, Trace};
use reservoir::caching::{rules, SeededBlock};
use reservoir::config::AllocatorConfig;
use reservoir::format::format_size;
use reservoir::observe::snapshot::{BlockState, Segment, SegmentType};

/// Replays spent proving a change, per OOM, at most.
pub const MAX_REPLAYS: usize = 10;

/// The class of a cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CauseClass {
    /// Live bytes plus the request exceed the device the allocator is given.
    Capacity,
    /// Enough cached free bytes, no block fits (see [`Rule`]).
    Fragmentation,
    /// Free blocks cached for other streams.
    StreamStranding,
    /// Free blocks held by private pools.
    PoolRetention,
    /// `per_process_memory_fraction` caps the allocator below the device.
    MemoryFraction,
    /// Device memory used outside the allocator.
    OutsideAllocator,
}

/// The rule at fault in a [`CauseClass::Fragmentation`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Rounding of live blocks and of the request (spec 1.3).
    Rounding,
    /// Blocks of `max_split_size` or more serve only oversize requests (spec 1.6).
    SplitLimit,
    /// An oversize request may not take a block much larger than itself (spec 1.6).
    Oversize,
    /// The free bytes are in the other pool (small / large, spec 1.4).
    PoolSplit,
    /// Pieces of mapped expandable pages (spec 1.11).
    ExpandableGranularity,
    /// Free blocks each smaller than the request, pinned by live neighbours.
    Scattered,
}

/// One cause of an OOM.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cause {
    /// The class.
    pub class: CauseClass,
    /// For fragmentation, the rule at fault.
    pub rule: Option<Rule>,
    /// The bytes it accounts for (see the module documentation).
    pub bytes: u64,
    /// One plain-English sentence.
    pub sentence: String,
}

/// What kind of change a [`ProvenFix`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FixKind {
    /// A `PYTORCH_CUDA_ALLOC_CONF` change.
    Setting,
    /// Reservoir's `reservoir` policy.
    Policy,
    /// A code change: synchronize and empty the cache before the failed allocation.
    SyncEmptyCache,
    /// The whole device, without the memory used outside the allocator.
    Device,
    /// Free the allocations of some sites.
    FreeSites,
}

/// A change with which the whole trace runs without an OOM, proven by
/// replaying it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProvenFix {
    /// The kind of change.
    pub kind: FixKind,
    /// The change: the settings added or removed (`-KEY` removes one), the
    /// policy, the code, the device size, or the sites.
    pub change: String,
    /// For [`FixKind::FreeSites`], the groups dropped with their live bytes
    /// at the failure.
    pub sites: Vec<SiteUsage>,
    /// For [`FixKind::FreeSites`], how many allocations the proving replay
    /// ran without: every allocation of the groups in the whole trace (and
    /// its start state), which may be more than the live ones at the
    /// failure; 0 for other kinds.
    pub dropped_allocations: u64,
    /// The peak reserved bytes of the replay with the change.
    pub peak_reserved: u64,
    /// One plain-English sentence.
    pub sentence: String,
    /// For [`FixKind::Setting`] and [`FixKind::Policy`], the whole
    /// settings string the proving replay ran with (the program levers
    /// are replayed with it, see [`levers`](super::levers)); not in JSON.
    #[serde(skip)]
    pub config: Option<String>,
}

/// Why an OOM happened and what avoids it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Diagnosis {
    /// How many more bytes the device would have had to offer the allocator
    /// for the request to succeed in the state at the failure (module
    /// documentation).
    pub shortfall: u64,
    /// The bytes the allocator may use: the device, capped by
    /// `per_process_memory_fraction`.
    pub limit: u64,
    /// Bytes the live allocations asked for.
    pub live_requested: u64,
    /// The causes, largest first; the first is "the" cause.
    pub causes: Vec<Cause>,
    /// The cheapest change found that avoids it, if any.
    pub fix: Option<ProvenFix>,
    /// The changes tried, in order.
    pub tried: Vec<String>,
    /// Replays spent (at most [`MAX_REPLAYS`]).
    pub replays: u64,
    /// The headline: the shortfall and the cause.
    pub summary: String,
    /// The fix's sentence, or why none was found.
    pub verdict: String,
    /// No allocation follows the failed op in the trace: the recording ends
    /// at the OOM (the program crashed, or the snapshot was taken there), so
    /// a replay without an OOM proves the run only up to the failure; what
    /// the program would have done after it was never recorded.
    pub recording_ends_at_failure: bool,
}

/// The clause a claim of "no OOM" carries when the recording ends at the
/// failed op `op` ([`Diagnosis::recording_ends_at_failure`]).
pub fn ends_at_failure_clause(op: u64) -> String {
    format!(
        "the recording ends at this OOM (op {op}): the replay proves the run only up to the failure; what the program does after it was never recorded"
    )
}

/// Does no allocation follow op `op` of `trace` (the recording ends at it)?
pub fn recording_ends_at(trace: &Trace, op: u64) -> bool {
    !trace
        .ops
        .iter()
        .skip(op as usize + 1)
        .any(|o| matches!(o, Op::Alloc { .. }))
}

/// The state at a failed allocation, as [`classify`] reads it.
#[derive(Clone, Copy, Debug)]
pub struct OomState<'a> {
    /// The allocator's segments after the failure.
    pub segments: &'a [Segment],
    /// Bytes requested.
    pub bytes: u64,
    /// The request rounded as the allocator rounds it.
    pub rounded: u64,
    /// The stream's id.
    pub stream: u64,
    /// The device the allocator is given (the replay's capacity).
    pub capacity: u64,
    /// The device's total memory, when known and larger.
    pub device_total: Option<u64>,
    /// The allocator's settings.
    pub config: &'a AllocatorConfig,
}

/// The bytes the allocator may use on a device of `capacity` (spec 1.13:
/// `fraction * total`, truncated, when the fraction is below 1).
pub fn limit(capacity: u64, config: &AllocatorConfig) -> u64 {
    let f = config.per_process_memory_fraction;
    if f < 1.0 {
        // Whole bytes as the release makes them (truncated until 2.12,
        // the nearest byte from 2.13: ReleaseRules::memory_fraction_rounding).
        config
            .torch_release
            .rules()
            .memory_fraction_rounding
            .allowed_bytes(f, capacity)
    } else {
        capacity
    }
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to.max(1)) * to.max(1)
}

/// The bytes the allocator last asked the driver for: the segment of
/// `rounded` bytes (spec 1.4), or with expandable segments the pages still
/// to map after the free tail of the stream's mapped pages (spec 1.11).
pub fn segment_request(s: &OomState<'_>) -> u64 {
    let small = rules::is_small(s.rounded);
    if !s.config.expandable_segments {
        return rules::allocation_size(s.rounded, s.config);
    }
    let page = if small {
        rules::SMALL_BUFFER
    } else {
        s.config.large_segment_size
    };
    let tail = s
        .segments
        .iter()
        .filter(|g| {
            g.stream.0 == s.stream
                && (g.segment_type == SegmentType::Small) == small
                && g.is_expandable == Some(true)
        })
        .filter_map(|g| g.blocks.last())
        .filter(|b| b.state == BlockState::Inactive)
        .map(|b| b.size)
        .max()
        .unwrap_or(0);
    round_up(s.rounded.saturating_sub(tail), page)
}

/// The shortfall (module documentation): `reserved + segment - limit`, 0
/// when that is not positive.
pub fn shortfall(s: &OomState<'_>) -> u64 {
    let reserved: u64 = s.segments.iter().map(|g| g.total_size).sum();
    (reserved + segment_request(s)).saturating_sub(limit(s.capacity, s.config))
}

fn gib(b: u64) -> String {
    format_size(b)
}

/// The sentence of a fragmentation rule.
fn rule_words(rule: Rule, s: &OomState<'_>) -> String {
    match rule {
        Rule::Rounding => format!(
            "live blocks and the request are rounded up past what was asked (spec 1.3{})",
            if s.config.roundup_power2_divisions.iter().any(|&d| d > 0) {
                ", roundup_power2_divisions"
            } else {
                ""
            }
        ),
        Rule::SplitLimit => format!(
            "blocks of max_split_size ({}) or more are never split: live ones hold their whole block, free ones serve only requests that large (spec 1.6, 1.7)",
            gib(s.config.max_split_size)
        ),
        Rule::Oversize => format!(
            "an oversize request may not take a free block {} or more larger than itself (max_non_split_rounding_mb, spec 1.6)",
            gib(s.config.max_non_split_rounding_size)
        ),
        Rule::PoolSplit => {
            if rules::is_small(s.rounded) {
                "they are in the large pool and this request needs the small pool (at most 1 MiB, spec 1.4)".into()
            } else {
                "they are in the small pool (blocks of at most 1 MiB) and this request needs the large pool (spec 1.4)".into()
            }
        }
        Rule::ExpandableGranularity => {
            "they are pieces of mapped expandable-segment pages, each too small, and pages unmap only whole (spec 1.11)".into()
        }
        Rule::Scattered => format!(
            "they are holes each smaller than the {} request, in segments that still hold live blocks",
            gib(s.rounded)
        ),
    }
}

/// The causes of the OOM in state `s`, largest first (module
/// documentation). Causes of 0 bytes are left out.
pub fn classify(s: &OomState<'_>) -> Vec<Cause> {
    let short = shortfall(s);
    let lim = limit(s.capacity, s.config);
    let small_request = rules::is_small(s.rounded);
    let mut live_requested = 0u64;
    let mut rounding = s.rounded - s.bytes.min(s.rounded);
    let mut unsplit = 0u64;
    let mut free: FxHashMap<(CauseClass, Option<Rule>), u64> = FxHashMap::default();
    for g in s.segments {
        let private = g.segment_pool_id.is_some_and(|p| p != (0, 0));
        let small_seg = g.segment_type == SegmentType::Small;
        for b in &g.blocks {
            if b.state == BlockState::ActiveAllocated {
                let asked = b.requested_size.unwrap_or(b.size).min(b.size);
                live_requested += asked;
                if b.size >= s.config.max_split_size && s.config.max_split_size < u64::MAX {
                    // An oversize block is never split (spec 1.7): what
                    // it holds past its rounded request is the split
                    // limit's.
                    let r = rules::round_size(asked.max(1), s.config).min(b.size);
                    rounding += r - asked;
                    unsplit += b.size - r;
                } else {
                    rounding += b.size - asked;
                }
                continue;
            }
            let key = if private {
                (CauseClass::PoolRetention, None)
            } else if b.state == BlockState::ActivePendingFree || g.stream.0 != s.stream {
                (CauseClass::StreamStranding, None)
            } else if small_seg != small_request {
                (CauseClass::Fragmentation, Some(Rule::PoolSplit))
            } else if b.size >= s.rounded && rules::oversize_misfit(s.rounded, b.size, s.config) {
                if s.rounded < s.config.max_split_size {
                    (CauseClass::Fragmentation, Some(Rule::SplitLimit))
                } else {
                    (CauseClass::Fragmentation, Some(Rule::Oversize))
                }
            } else if g.is_expandable == Some(true) {
                (CauseClass::Fragmentation, Some(Rule::ExpandableGranularity))
            } else {
                (CauseClass::Fragmentation, Some(Rule::Scattered))
            };
            *free.entry(key).or_default() += b.size;
        }
    }
    let mut causes = limit_causes(s, short, lim, live_requested);
    if rounding > 0 {
        free.insert((CauseClass::Fragmentation, Some(Rule::Rounding)), rounding);
    }
    if unsplit > 0 {
        *free
            .entry((CauseClass::Fragmentation, Some(Rule::SplitLimit)))
            .or_default() += unsplit;
    }
    for ((class, rule), bytes) in free {
        if bytes == 0 {
            continue;
        }
        let sentence = free_sentence(class, rule, bytes, s);
        causes.push(Cause {
            class,
            rule,
            bytes,
            sentence,
        });
    }
    causes.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(a.class.cmp(&b.class))
            .then(a.rule.cmp(&b.rule))
    });
    causes
}

/// What a cause of `bytes` cached free (or lost) says, in state `s`.
fn free_sentence(class: CauseClass, rule: Option<Rule>, bytes: u64, s: &OomState<'_>) -> String {
    match (class, rule) {
        (CauseClass::PoolRetention, _) => format!(
            "{} is cached free in private pools (CUDA graphs, MemPool), which serve only their own pool's allocations",
            gib(bytes)
        ),
        (CauseClass::StreamStranding, _) => format!(
            "{} is cached free for other streams (or waits for their work, record_stream), and cannot serve stream {}",
            gib(bytes),
            s.stream
        ),
        (_, Some(Rule::Rounding)) => {
            format!("{} is lost to rounding: {}", gib(bytes), rule_words(Rule::Rounding, s))
        }
        (_, Some(Rule::SplitLimit)) => format!(
            "{} is held unused by the split limit: {}",
            gib(bytes),
            rule_words(Rule::SplitLimit, s)
        ),
        (_, Some(r)) => format!(
            "{} is cached free but cannot serve this {} request: {}",
            gib(bytes),
            gib(s.rounded),
            rule_words(r, s)
        ),
        (_, None) => format!("{} is cached free", gib(bytes)),
    }
}

/// The causes outside the cache in state `s`: live bytes past the device
/// (`live_requested` held, `short` missing), the memory-fraction cap `lim`,
/// and memory used outside the allocator.
fn limit_causes(s: &OomState<'_>, short: u64, lim: u64, live_requested: u64) -> Vec<Cause> {
    let mut causes = Vec::new();
    let excess = (live_requested + s.bytes).saturating_sub(s.capacity);
    if excess > 0 {
        causes.push(Cause {
            class: CauseClass::Capacity,
            rule: None,
            bytes: excess,
            sentence: format!(
                "you are {} short: live tensors hold {} of the {} device the allocator is given, and this request needs {} more: no allocator could serve it",
                gib(short.max(excess)),
                gib(live_requested),
                gib(s.capacity),
                gib(s.bytes)
            ),
        });
    }
    if lim < s.capacity {
        causes.push(Cause {
            class: CauseClass::MemoryFraction,
            rule: None,
            bytes: s.capacity - lim,
            sentence: format!(
                "per_process_memory_fraction {} caps the allocator at {} of the {} device, withholding {}",
                s.config.per_process_memory_fraction,
                gib(lim),
                gib(s.capacity),
                gib(s.capacity - lim)
            ),
        });
    }
    if let Some(total) = s.device_total.filter(|&t| t > s.capacity) {
        causes.push(Cause {
            class: CauseClass::OutsideAllocator,
            rule: None,
            bytes: total - s.capacity,
            sentence: format!(
                "{} of the {} device is used outside this allocator (other processes, the CUDA context, memory not allocated through it)",
                gib(total - s.capacity),
                gib(total)
            ),
        });
    }
    causes
}

/// `trace` and `start` without the allocations `drop` selects, given each
/// allocation's id and requested bytes: their `a` ops, and the `f` and `r`
/// ops and kernel operands that refer to them until the id is allocated
/// again; a dropped block of the start state becomes free space of its
/// segment. The ops kept keep their line numbers.
pub fn drop_allocations(
    trace: &Trace,
    start: Option<&StartState>,
    drop: &dyn Fn(AllocId, u64) -> bool,
) -> (Trace, Option<StartState>) {
    let mut dropped: FxHashSet<AllocId> = FxHashSet::default();
    let start = start.map(|st| {
        let mut st = st.clone();
        let mut keep = |blocks: &mut Vec<SeededBlock>, ids: &mut Vec<AllocId>| {
            let (kept_blocks, kept): (Vec<_>, Vec<_>) = blocks
                .iter()
                .zip(ids.iter())
                .filter(|(b, &id)| {
                    let d = drop(id, b.requested_size);
                    if d {
                        dropped.insert(id);
                    }
                    !d
                })
                .map(|(b, &id)| (*b, id))
                .unzip();
            *blocks = kept_blocks;
            *ids = kept;
        };
        for (_, seg, ids) in &mut st.segments {
            keep(&mut seg.blocks, ids);
        }
        for (_, seg, ids) in &mut st.expandable {
            keep(&mut seg.blocks, ids);
        }
        st
    });
    let mut ops = Vec::with_capacity(trace.ops.len());
    let mut lines = Vec::with_capacity(trace.ops.len());
    for (op, &line) in trace.ops.iter().zip(&trace.lines) {
        let kept = match op {
            Op::Alloc { id, bytes, .. } => {
                if drop(*id, *bytes) {
                    dropped.insert(*id);
                    None
                } else {
                    dropped.remove(id);
                    Some(op.clone())
                }
            }
            Op::Free { id } | Op::RecordStream { id, .. } => {
                (!dropped.contains(id)).then(|| op.clone())
            }
            Op::Kernel { stream, ids } => Some(Op::Kernel {
                stream: stream.clone(),
                ids: ids
                    .iter()
                    .copied()
                    .filter(|id| !dropped.contains(id))
                    .collect(),
            }),
            _ => Some(op.clone()),
        };
        if let Some(op) = kept {
            ops.push(op);
            lines.push(line);
        }
    }
    (
        Trace {
            ops,
            lines,
            header: trace.header.clone(),
        },
        start,
    )
}

/// `trace` with `y` (synchronize the device) and `e` (`empty_cache()`)
/// inserted before op `op`.
pub fn sync_and_empty_before(trace: &Trace, op: usize) -> Trace {
    let at = op.min(trace.ops.len());
    let line = trace.lines.get(at).copied().unwrap_or(0);
    let mut t = trace.clone();
    t.ops
        .splice(at..at, [Op::Sync { stream: None }, Op::EmptyCache]);
    t.lines.splice(at..at, [line, line]);
    t
}

/// The peak reserved bytes of a replay of the whole trace with no OOM, or
/// `None` if it runs out of memory (it stops at the first) or fails.
pub fn peak_without_oom(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
) -> Option<u64> {
    let mut t: Replay<'_> = Replay::build(trace, start, setting, options).ok()?;
    t.track_peak = false;
    loop {
        match t.step() {
            Ok(true) if t.ooms == 0 => {}
            Ok(false) if t.ooms == 0 => return Some(t.report().peak_reserved),
            _ => return None,
        }
    }
}

/// The settings string `conf` without key `key`.
fn without_key(conf: &str, key: &str) -> String {
    super::recorded::split_conf(conf)
        .into_iter()
        .filter(|s| s.split(':').next().unwrap_or("").trim() != key)
        .collect::<Vec<_>>()
        .join(",")
}

/// One change to try.
enum Candidate {
    /// A settings string replacing the setting's, and the change's name.
    Setting(FixKind, String, String),
    /// Synchronize and empty the cache before the failed op.
    SyncEmptyCache,
    /// Replay on this capacity.
    Device(u64),
}

/// The candidates for `causes` in order of cost (module documentation).
fn candidates(
    setting: &ReplaySetting,
    config: &AllocatorConfig,
    causes: &[Cause],
    general: &[ReplaySetting],
    s: &OomState<'_>,
    short: u64,
) -> Vec<Candidate> {
    let has = |c: CauseClass| causes.iter().any(|x| x.class == c);
    let rule = |r: Rule| causes.iter().any(|x| x.rule == Some(r));
    let conf = &setting.config;
    let mut out = Vec::new();
    // No setting helps when no allocator could serve the request, and
    // settings strings do not apply to the MPS heap allocator.
    let capacity = has(CauseClass::Capacity);
    if !capacity && setting.allocator == AllocatorKind::Caching {
        if has(CauseClass::MemoryFraction) {
            let need = limit(s.capacity, config) + short;
            let f = (((need as f64 / s.capacity.max(1) as f64) * 20.0).ceil() / 20.0).min(1.0);
            let mut fractions = vec![f];
            if f < 1.0 {
                fractions.push(1.0);
            }
            for f in fractions {
                let change = format!("per_process_memory_fraction:{f}");
                out.push(Candidate::Setting(
                    FixKind::Setting,
                    super::recorded::overlay_config(conf, &change),
                    change,
                ));
            }
        }
        if (rule(Rule::SplitLimit) || rule(Rule::Oversize)) && config.max_split_size < u64::MAX {
            out.push(Candidate::Setting(
                FixKind::Setting,
                without_key(conf, "max_split_size_mb"),
                "-max_split_size_mb".into(),
            ));
        }
        if rule(Rule::Rounding) && config.roundup_power2_divisions.iter().any(|&d| d > 0) {
            out.push(Candidate::Setting(
                FixKind::Setting,
                without_key(conf, "roundup_power2_divisions"),
                "-roundup_power2_divisions".into(),
            ));
        }
        if rule(Rule::ExpandableGranularity) && config.expandable_segments {
            out.push(Candidate::Setting(
                FixKind::Setting,
                without_key(conf, "expandable_segments"),
                "-expandable_segments".into(),
            ));
        }
        for g in general.iter().filter(|g| g.config != *conf) {
            out.push(Candidate::Setting(
                FixKind::Setting,
                g.config.clone(),
                g.name.clone(),
            ));
        }
        if !conf.contains("policy:reservoir") {
            out.push(Candidate::Setting(
                FixKind::Policy,
                super::recorded::overlay_config(conf, "policy:reservoir"),
                "policy:reservoir".into(),
            ));
        }
        if has(CauseClass::StreamStranding) {
            out.push(Candidate::SyncEmptyCache);
        }
    }
    if let Some(total) = s.device_total.filter(|&t| t > s.capacity) {
        out.push(Candidate::Device(total));
    }
    out
}

/// Everything [`diagnose`] needs besides the state.
pub struct DiagnoseInput<'a, 'r> {
    /// The trace.
    pub trace: &'a Trace,
    /// Its start state.
    pub start: Option<&'a StartState>,
    /// The setting that ran out of memory.
    pub setting: &'a ReplaySetting,
    /// The replay options (capacity).
    pub options: &'a ReplayOptions,
    /// The sites of the allocations.
    pub sites: &'a Sites,
    /// General settings to try after the relevant changes: whole
    /// settings (their `config` replaces the setting's), each named by its
    /// change; one equal to the setting's own is skipped.
    pub general: &'a [ReplaySetting],
    /// The failed op's index.
    pub op: u64,
    /// The replay stopped right after the failed op.
    pub at_failure: &'a Replay<'r>,
}

/// Classify the OOM in state `s` and find the cheapest change that avoids
/// it, proven by replay (module documentation).
pub fn diagnose(input: &DiagnoseInput<'_, '_>, s: &OomState<'_>) -> Diagnosis {
    let short = shortfall(s);
    let lim = limit(s.capacity, s.config);
    let causes = classify(s);
    let live_requested = s
        .segments
        .iter()
        .flat_map(|g| &g.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| b.requested_size.unwrap_or(b.size).min(b.size))
        .sum();
    let mut tried = Vec::new();
    let mut replays = 0u64;
    let mut fix = None;
    for c in candidates(input.setting, s.config, &causes, input.general, s, short) {
        if replays as usize >= MAX_REPLAYS {
            break;
        }
        replays += 1;
        let mut config_used = None;
        let (kind, change, peak) = match c {
            Candidate::Setting(kind, config, change) => {
                let setting = ReplaySetting {
                    name: change.clone(),
                    config,
                    allocator: input.setting.allocator,
                };
                tried.push(change.clone());
                let peak = setting.allocator_config().ok().and_then(|_| {
                    peak_without_oom(input.trace, input.start, &setting, input.options)
                });
                config_used = Some(setting.config);
                (kind, change, peak)
            }
            Candidate::SyncEmptyCache => {
                let change = format!(
                    "torch.cuda.synchronize(); torch.cuda.empty_cache() before op {}",
                    input.op
                );
                tried.push(change.clone());
                let t = sync_and_empty_before(input.trace, input.op as usize);
                let peak = peak_without_oom(&t, input.start, input.setting, input.options);
                (FixKind::SyncEmptyCache, change, peak)
            }
            Candidate::Device(total) => {
                let change = format!("the whole {} device", format_size(total));
                tried.push(change.clone());
                let options = ReplayOptions {
                    capacity: total,
                    ..input.options.clone()
                };
                let peak = peak_without_oom(input.trace, input.start, input.setting, &options);
                (FixKind::Device, change, peak)
            }
        };
        if let Some(peak) = peak {
            let what = match kind {
                FixKind::Setting if change.starts_with('-') => {
                    format!("remove `{}` from the settings", &change[1..])
                }
                FixKind::Setting => format!("set `{change}` in the settings"),
                FixKind::Policy => "use Reservoir's `reservoir` policy (`policy:reservoir`)".into(),
                FixKind::SyncEmptyCache => format!("call {change}"),
                FixKind::Device => {
                    format!("free the memory used outside the allocator ({change})")
                }
                FixKind::FreeSites => change.clone(),
            };
            fix = Some(ProvenFix {
                kind,
                change,
                sites: Vec::new(),
                dropped_allocations: 0,
                peak_reserved: peak,
                sentence: format!(
                    "{what}: proven by replay: no OOM, peak reserved {}",
                    format_size(peak)
                ),
                config: config_used,
            });
            break;
        }
    }
    if fix.is_none() {
        fix = free_sites(input, short, &mut replays, &mut tried);
    }
    let summary = match causes.first() {
        Some(c) => format!(
            "{} short; the cause: {}{}: {}",
            format_size(short),
            serde_plain(c.class),
            c.rule
                .map_or(String::new(), |r| format!(" ({})", serde_plain(r))),
            c.sentence
        ),
        None => format!("{} short", format_size(short)),
    };
    let ends = recording_ends_at(input.trace, input.op);
    let verdict = verdict(fix.as_ref(), &tried, ends.then_some(input.op));
    Diagnosis {
        shortfall: short,
        limit: lim,
        live_requested,
        causes,
        fix,
        tried,
        replays,
        summary,
        verdict,
        recording_ends_at_failure: ends,
    }
}

/// The fix's sentence (with [`ends_at_failure_clause`] when the recording
/// ends at the failed op `ends_at`), or why none was found.
fn verdict(fix: Option<&ProvenFix>, tried: &[String], ends_at: Option<u64>) -> String {
    match (fix, ends_at) {
        (Some(f), Some(op)) => format!("{} ({})", f.sentence, ends_at_failure_clause(op)),
        (Some(f), None) => f.sentence.clone(),
        (None, _) => format!(
            "none found: no change tried ({}) runs the whole trace without an OOM within {} replays",
            if tried.is_empty() {
                "none".to_string()
            } else {
                tried.join("; ")
            },
            MAX_REPLAYS
        ),
    }
}

/// A unit enum's serde name.
fn serde_plain<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}
