//! Replaying recorded traces exactly: a snapshot's device trace (any input
//! [`crate::input::load`] reads) turned into a [`Trace`] of oracle ops plus
//! the [`StartState`] it starts from, and the fidelity report comparing a
//! PyTorch-mode replay with the recording.
//!
//! # Rebuilding the start state
//!
//! Traces usually start mid-run. As MemoryViz does (spec 2.7), the state at
//! the first entry is rebuilt from the segments at dump time by walking the
//! trace backwards: before an `alloc` its block was free, before a
//! `free_completed` it was allocated, before a `segment_alloc` the segment
//! did not exist, before a `segment_free` it existed, whole and free. A block
//! allocated before the trace and freed during it is known only by its
//! requested size: its block size is the rounded size under the recorded
//! settings, extended to the next block boundary (the segment's end, the
//! next allocated block, or any address a block starts at during the trace)
//! when the remainder is too small to have been split off (a large-pool
//! remainder of at most 1 MiB). Segments are seeded at their recorded addresses.
//!
//! Expandable segments appear in a snapshot as runs of mapped pages (one
//! dump-time segment per run) and in the trace as `segment_map` /
//! `segment_unmap` entries. All runs and entries are sorted by address and
//! grouped into reservations: one stream and pool (small when a size is not
//! a whole number of large pages), cut where another stream or pool's
//! address comes between or where addresses are more than 80 GiB apart; a
//! reservation's base is the lowest address known to be in it (its first
//! mapped page, when the trace saw it mapped). Walking backwards, before a
//! `segment_map` its pages were unmapped, before a `segment_unmap` mapped
//! and free; blocks in them are rounded without extension (expandable
//! blocks split off any remainder). Reservations with pages mapped at the
//! first entry are seeded with those pages and their blocks
//! ([`reservoir::caching::Seeder::seed_expandable`]); the others are
//! reserved by the replay itself, their recorded base scripted at their
//! first map (and again at a map after they were fully unmapped, which
//! releases a reservation).
//!
//! # Forward conversion
//!
//! | recorded entry | op |
//! |---|---|
//! | `alloc` | `a <id> <size>`, after `s <stream>` when the stream changes (stream = recorded `cudaStream_t` value) |
//! | `free_completed` | `f <id>` (frees happen at completion) |
//! | `free_requested`, `snapshot` | nothing |
//! | `oom` | `a <id> <size>` (with `s` as for `alloc`), expected to fail (never freed) |
//! | first `segment_free` / `segment_unmap` of a run not followed by an `oom`, nor (when the capacity is known) by a `segment_alloc` / `segment_map` that would not fit on the device without the run | `e` (a user's `empty_cache()`, trap 5; the other runs are the allocator's free-and-retry) |
//! | `segment_alloc` | its address is scripted for the device |
//! | `segment_map` / `segment_unmap` | nothing (the allocator maps and unmaps by itself); the first map of a reservation not reserved at that time scripts its base |
//! | an allocation (`alloc`, `oom`) in another pool than the one before it (`pool_id`, torch 2.15+; else the pool of its segment) | `p <pool>` before it: allocations go to that private pool (`torch.cuda.MemPool`, a CUDA graph's pool), or back to the default pool |
//! | the first `segment_free` / `segment_unmap` of a private pool in use | `x <pool>` before it (a private pool's memory is freed only once released); a run of them all of one private pool that is the user's `empty_cache()` is `e <pool>` (`emptyCache(pool)`, as `~MemPool` calls it) rather than `e` |
//!
//! Segments of private pools (`segment_pool_id`) in the start state are
//! seeded into their pools (each created with one use, its owner's).
//!
//! Every inconsistency (freeing an address that is not allocated, an
//! allocation inside no segment, overlapping blocks...) is a
//! [`ConvertError`] naming the entry index, never a panic.
//!
//! # Fidelity
//!
//! [`Fidelity`] compares the replay's device calls with the recorded segment
//! events (`segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`:
//! action and size, as a longest common subsequence, so one extra
//! event costs one mismatch, not the rest of the trace) and each
//! allocation's address with the recorded one. Segments are given their
//! recorded addresses, so a replayed block in the recorded segment at the
//! recorded offset has exactly the recorded address; a segment that got
//! another address makes its blocks count as misplaced.

mod cold;
mod convert;

pub use cold::{StartMode, UnknownStartMode};
pub use convert::convert;

use convert::SMALL_SIZE;

use super::run::{with_replay, ReplayJob};
use super::{Replay, ReplaySetting, ReplayTarget, StartState};
use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use reservoir::config::AllocatorConfig;
use reservoir::observe::snapshot::AllocatorSettings;
use reservoir::observe::trace::TraceAction;
use reservoir::sim::{CallKind, CallResult};

/// A recorded trace that cannot be replayed, with the entry at fault.
#[derive(Debug, thiserror::Error)]
#[error("trace entry {entry}: {message}")]
pub struct ConvertError {
    /// Index of the trace entry (in the device's `device_traces` list);
    /// for a problem with the dump-time segments, the number of entries.
    pub entry: usize,
    /// What is wrong.
    pub message: String,
}

fn err<T>(entry: usize, message: impl Into<String>) -> Result<T, ConvertError> {
    Err(ConvertError {
        entry,
        message: message.into(),
    })
}

/// One recorded segment event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SegmentEvent {
    /// `segment_alloc`, `segment_free`, `segment_map` or `segment_unmap`.
    pub action: TraceAction,
    /// Bytes.
    pub size: u64,
}

/// A device trace ready to replay: ops, start state and what was recorded.
#[derive(Clone, Debug)]
pub struct RecordedTrace {
    /// The device.
    pub device: u32,
    /// The ops. `lines[i]` is the index of the trace entry op `i` came
    /// from, so replay errors name the entry.
    pub trace: Trace,
    /// The state at the first entry, and the recorded segment addresses.
    pub start: StartState,
    /// The recorded segment events, in order.
    pub segment_events: Vec<SegmentEvent>,
    /// Recorded address of each allocation op, in op order (0 for the
    /// allocation an `oom` entry recorded).
    pub placements: Vec<u64>,
    /// `oom` entries.
    pub ooms: u64,
    /// Capacity that reproduces the recorded OOMs: `device_free` plus the
    /// reserved bytes at the first `oom` entry. Without OOMs, when the
    /// recording has expandable segments whose reservations (9/8 of the
    /// device each) would overlap on an 80 GiB device, the largest capacity
    /// whose reservations fit between the recorded ones; else `None`.
    pub capacity: Option<u64>,
    /// Peak reserved bytes of the recording (start state included).
    pub peak_reserved: u64,
    /// Peak allocated bytes of the recording (start state included).
    pub peak_allocated: u64,
    /// Recorded `empty_cache()` calls (runs of segment frees turned into
    /// `e` ops).
    pub empty_caches: u64,
    /// The innermost user frame of each allocation op's recorded stack.
    pub sites: super::sites::Sites,
    /// The source recorded segments (snapshots do; `alloc_data` pages and
    /// allocatorSim logs do not, so there is nothing to compare a replay
    /// with: no [`Fidelity`] for them).
    pub segments_known: bool,
}

/// The `PYTORCH_CUDA_ALLOC_CONF`-style string of recorded settings: the
/// recorded string when it parses, else one built from the typed keys
/// (`expandable_segments`, `max_split_size`, `garbage_collection_threshold`,
/// `roundup_power2_divisions`); "" for PyTorch's defaults.
pub fn settings_config(s: &AllocatorSettings) -> String {
    if let Some(conf) = &s.pytorch_cuda_alloc_conf {
        if !conf.trim().is_empty() && AllocatorConfig::parse(conf).is_ok() {
            return conf.trim().to_string();
        }
    }
    let mut parts = Vec::new();
    if s.expandable_segments == Some(true) {
        parts.push("expandable_segments:True".to_string());
    }
    if let Some(m) = s.max_split_size {
        // PyTorch reports "unlimited" as SIZE_MAX (-1 once pickled as i64).
        if m > 0 && (m as u64) < (1 << 50) {
            parts.push(format!("max_split_size_mb:{}", (m as u64) >> 20));
        }
    }
    if let Some(g) = s.garbage_collection_threshold {
        if g > 0.0 && g < 1.0 {
            parts.push(format!("garbage_collection_threshold:{g}"));
        }
    }
    if let Some(divs) = &s.roundup_power2_divisions {
        let nonzero: Vec<String> = divs
            .iter()
            .filter(|(_, d)| *d > 0)
            .map(|(size, d)| format!("{size}:{d}"))
            .collect();
        if !nonzero.is_empty() {
            parts.push(format!("roundup_power2_divisions:[{}]", nonzero.join(",")));
        }
    }
    let conf = parts.join(",");
    if AllocatorConfig::parse(&conf).is_ok() {
        conf
    } else {
        String::new()
    }
}

/// How closely a PyTorch-mode replay reproduced the recording.
///
/// JSON keys (stable): `segment_events_matched`, `segment_events_total`,
/// `segment_events_replayed`, `segment_events_exact`,
/// `segment_events_matched_unordered`, `placements_matched`,
/// `placements_total`, `recorded_peak_reserved`, `recorded_ooms`,
/// `first_segment_mismatch`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Fidelity {
    /// Recorded segment events (action and size) found in the replay's, in
    /// order: the length of the longest common subsequence.
    pub segment_events_matched: u64,
    /// Recorded segment events.
    pub segment_events_total: u64,
    /// Segment events of the replay.
    pub segment_events_replayed: u64,
    /// The two sequences are equal.
    pub segment_events_exact: bool,
    /// Matches when the order of events inside each run of consecutive
    /// frees is ignored (flush order depends on stream handles, trap 2).
    pub segment_events_matched_unordered: u64,
    /// Allocations placed at the recorded address (same segment, same
    /// offset).
    pub placements_matched: u64,
    /// Allocations recorded (those an `oom` entry recorded excluded).
    pub placements_total: u64,
    /// Peak reserved bytes of the recording.
    pub recorded_peak_reserved: u64,
    /// `oom` entries of the recording.
    pub recorded_ooms: u64,
    /// Index (in the recorded sequence) of the first segment event that
    /// differs, `null` when exact.
    pub first_segment_mismatch: Option<u64>,
}

impl Fidelity {
    /// Everything matched: segment events, placements, and the replay's
    /// peak reserved bytes and OOM count (from its report).
    pub fn is_exact(&self, report: &super::ReplayReport) -> bool {
        self.segment_events_exact
            && self.placements_matched == self.placements_total
            && report.peak_reserved == self.recorded_peak_reserved
            && report.ooms == self.recorded_ooms
    }
}

fn lcs(a: &[SegmentEvent], b: &[SegmentEvent]) -> u64 {
    // Strip the common prefix and suffix, then a row-by-row DP (bounded).
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[pre..], &b[pre..]);
    let suf = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (a, b) = (&a[..a.len() - suf], &b[..b.len() - suf]);
    let mid = if a.is_empty() || b.is_empty() {
        0
    } else if (a.len() as u64) * (b.len() as u64) > 200_000_000 {
        a.iter().zip(b).filter(|(x, y)| x == y).count() as u64
    } else {
        let mut prev = vec![0u32; b.len() + 1];
        let mut cur = vec![0u32; b.len() + 1];
        for x in a {
            for (j, y) in b.iter().enumerate() {
                cur[j + 1] = if x == y {
                    prev[j] + 1
                } else {
                    prev[j + 1].max(cur[j])
                };
            }
            std::mem::swap(&mut prev, &mut cur);
        }
        u64::from(prev[b.len()])
    };
    (pre + suf) as u64 + mid
}

/// Sort the events inside each run of consecutive frees / unmaps.
fn canonical_runs(v: &[SegmentEvent]) -> Vec<SegmentEvent> {
    let mut out = v.to_vec();
    let is_release = |e: &SegmentEvent| {
        matches!(
            e.action,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap
        )
    };
    let mut i = 0;
    while i < out.len() {
        let mut j = i;
        while j < out.len() && is_release(&out[j]) {
            j += 1;
        }
        if j > i {
            out[i..j].sort_by_key(|e| (e.action as u8, e.size));
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// The replay's segment events, from its device-call log.
pub fn replayed_segment_events<T: ReplayTarget>(replay: &Replay<'_, T>) -> Vec<SegmentEvent> {
    replay
        .segment_calls()
        .iter()
        .filter(|c| c.result == CallResult::Ok)
        .filter_map(|c| {
            let action = match c.kind {
                CallKind::Alloc => TraceAction::SegmentAlloc,
                CallKind::Free => TraceAction::SegmentFree,
                CallKind::Map => TraceAction::SegmentMap,
                CallKind::Unmap => TraceAction::SegmentUnmap,
                CallKind::Reserve | CallKind::Release => return None,
            };
            Some(SegmentEvent {
                action,
                size: c.size,
            })
        })
        .collect()
}

/// Compare a finished replay of `rec` with the recording.
pub fn fidelity<T: ReplayTarget>(rec: &RecordedTrace, replay: &Replay<'_, T>) -> Fidelity {
    let replayed = replayed_segment_events(replay);
    let recorded = &rec.segment_events;
    let first_segment_mismatch = recorded
        .iter()
        .zip(&replayed)
        .position(|(a, b)| a != b)
        .or_else(|| (recorded.len() != replayed.len()).then(|| recorded.len().min(replayed.len())))
        .map(|i| i as u64);
    let got = replay.placements().unwrap_or(&[]);
    let mut placements_total = 0;
    let mut placements_matched = 0;
    for (k, &want) in rec.placements.iter().enumerate() {
        if want == 0 {
            continue;
        }
        placements_total += 1;
        if got.get(k) == Some(&want) {
            placements_matched += 1;
        }
    }
    Fidelity {
        segment_events_matched: lcs(recorded, &replayed),
        segment_events_total: recorded.len() as u64,
        segment_events_replayed: replayed.len() as u64,
        segment_events_exact: *recorded == replayed,
        segment_events_matched_unordered: lcs(
            &canonical_runs(recorded),
            &canonical_runs(&replayed),
        ),
        placements_matched,
        placements_total,
        recorded_peak_reserved: rec.peak_reserved,
        recorded_ooms: rec.ooms,
        first_segment_mismatch,
    }
}

/// The setting a recording ran with: `pytorch` with the recorded settings.
pub fn recorded_setting(settings: Option<&AllocatorSettings>) -> ReplaySetting {
    ReplaySetting::new("pytorch", settings.map(settings_config).unwrap_or_default())
}

/// The report of one recorded trace replayed with one setting.
///
/// JSON: the keys of [`ReplayReport`](super::ReplayReport) (`setting`,
/// `peak_allocated`, `peak_reserved`, `fragmentation`, `driver_allocs`,
/// `driver_frees`, `ooms`, `first_oom`, ...) flattened, plus `file`,
/// `device`, `start` (`recorded` or `cold`), `events` (recorded entries) and `fidelity` ([`Fidelity`],
/// `null` except in PyTorch mode: the recorded settings).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RecordedReport {
    /// The input file.
    pub file: String,
    /// The device whose trace was replayed.
    pub device: u32,
    /// Where the replay started: `recorded` or `cold` ([`StartMode`]).
    pub start: StartMode,
    /// Trace entries of that device.
    pub events: u64,
    /// What the replay measured.
    #[serde(flatten)]
    pub report: super::ReplayReport,
    /// How closely it reproduced the recording (PyTorch mode only).
    pub fidelity: Option<Fidelity>,
    /// Trace entries of the file the reader skipped for an action it does
    /// not know, by action name (JSON: absent when none). With skipped
    /// entries the replay is not of the whole recording, whatever
    /// `fidelity` measured on the entries read.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub skipped_entries: std::collections::BTreeMap<String, u64>,
}

/// `3 entries of unknown action "annotate" skipped, 1 of unknown action
/// "x" skipped`: the trace entries a reader skipped, for messages.
pub fn describe_skipped(skipped: &std::collections::BTreeMap<String, u64>) -> String {
    skipped
        .iter()
        .map(|(action, n)| {
            let action = match action.char_indices().nth(100) {
                Some((cut, _)) => format!("{}...", &action[..cut]),
                None => action.clone(),
            };
            format!(
                "{n} {} of unknown action {action:?} skipped",
                if *n == 1 { "entry" } else { "entries" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Replay `rec` with `setting`; with `compare`, also measure the
/// [`Fidelity`] (meaningful when `setting` is the recorded one; measured
/// only for an allocator that [reproduces
/// recordings](super::AllocatorKind::reproduces_recordings) and when the
/// source recorded its segments).
/// `progress` gets the number of ops done.
pub fn replay_recorded(
    rec: &RecordedTrace,
    setting: &ReplaySetting,
    options: &super::ReplayOptions,
    compare: bool,
    progress: &mut dyn FnMut(usize),
) -> Result<(super::ReplayReport, Option<Fidelity>), super::ReplayError> {
    /// Run to the end, then hold the replay to the recording when asked.
    struct Job<'a, 'p> {
        rec: &'a RecordedTrace,
        fidelity: bool,
        progress: &'p mut dyn FnMut(usize),
    }
    impl ReplayJob for Job<'_, '_> {
        type Output = (super::ReplayReport, Option<Fidelity>);
        fn run<T: ReplayTarget>(
            self,
            mut r: Replay<'_, T>,
        ) -> Result<Self::Output, super::ReplayError> {
            r.run_with_progress(self.progress)?;
            let fid = self.fidelity.then(|| fidelity(self.rec, &r));
            Ok((r.report(), fid))
        }
    }
    // Clone the start state (all its segments) only to change the flag.
    let start = if rec.start.record_placements == compare {
        std::borrow::Cow::Borrowed(&rec.start)
    } else {
        let mut start = rec.start.clone();
        start.record_placements = compare;
        std::borrow::Cow::Owned(start)
    };
    let job = Job {
        rec,
        fidelity: compare && rec.segments_known && setting.allocator.reproduces_recordings(),
        progress,
    };
    with_replay(&rec.trace, Some(&start), setting, options, job)
}

/// Split a settings string at its top-level commas (not inside `[...]`).
pub(crate) fn split_conf(conf: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0i32, 0);
    for (i, c) in conf.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(conf[from..i].trim());
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(conf[from..].trim());
    out.retain(|s| !s.is_empty());
    out
}

/// `base` with the keys of `change` replaced (or added): a what-if setting
/// on top of the recorded one.
pub fn overlay_config(base: &str, change: &str) -> String {
    let key = |s: &str| s.split(':').next().unwrap_or("").trim().to_string();
    let changed: Vec<String> = split_conf(change).iter().map(|s| key(s)).collect();
    let mut parts: Vec<&str> = split_conf(base)
        .into_iter()
        .filter(|s| !changed.contains(&key(s)))
        .collect();
    parts.extend(split_conf(change));
    parts.join(",")
}

/// The size of the prelude [`oracle_trace`] puts before a recorded trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prelude {
    /// Ops of the prelude.
    pub ops: usize,
    /// Segments it allocates (their `segment_alloc` events come first in
    /// the oracle's output).
    pub segments: usize,
    /// Private-pool ops of the recorded trace left out (`p`, `x`; an
    /// `e <pool>` becomes `e`): `oracle_replay.py` has no private pools,
    /// so there those allocations run in the default pool.
    pub pool_ops_dropped: usize,
}

/// The recorded trace in the oracle's text format, for PyTorch's real
/// allocator (`oracle_replay.py`), which cannot be seeded: a prelude of
/// ops rebuilds the start state first. Per seeded segment, in address
/// order: one allocation of the whole segment (which makes the driver
/// allocate exactly that size), its free, then one allocation per block
/// and per free gap in address order, so each lands at its offset (gaps of
/// small-pool segments are allocated in pieces of at most 1 MiB); when
/// every segment is laid out, the gap allocations are freed. The trace's
/// own ops follow, with the same ids, less its private-pool ops
/// ([`Prelude::pool_ops_dropped`]).
pub fn oracle_trace(rec: &RecordedTrace) -> (Trace, Prelude) {
    let max_id = rec
        .trace
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc { id, .. } => Some(*id),
            _ => None,
        })
        .chain(rec.start.segments.iter().flat_map(|s| s.2.iter().copied()))
        .max()
        .unwrap_or(0);
    let mut next = max_id;
    let mut fresh = || {
        next += 1;
        next
    };
    let mut ops = Vec::new();
    let mut gaps = Vec::new();
    for (_, seg, ids) in &rec.start.segments {
        let stream = Some(StreamName::new(seg.stream.0.to_string()));
        if !seg.small {
            let whole = fresh();
            ops.push(Op::Alloc {
                id: whole,
                bytes: seg.size,
                stream: stream.clone(),
            });
            ops.push(Op::Free { id: whole });
        }
        let mut at = 0;
        let mut tiles: Vec<(u64, Option<AllocId>)> = Vec::new();
        for (b, id) in seg.blocks.iter().zip(ids) {
            if b.offset > at {
                tiles.push((b.offset - at, None));
            }
            tiles.push((b.size, Some(*id)));
            at = b.offset + b.size;
        }
        if at < seg.size {
            tiles.push((seg.size - at, None));
        }
        for (size, id) in tiles {
            match id {
                Some(id) => ops.push(Op::Alloc {
                    id,
                    bytes: size,
                    stream: stream.clone(),
                }),
                None => {
                    let piece = if seg.small { SMALL_SIZE } else { size };
                    let mut left = size;
                    while left > 0 {
                        let n = left.min(piece);
                        let id = fresh();
                        ops.push(Op::Alloc {
                            id,
                            bytes: n,
                            stream: stream.clone(),
                        });
                        gaps.push(id);
                        left -= n;
                    }
                }
            }
        }
    }
    ops.extend(gaps.into_iter().map(|id| Op::Free { id }));
    let mut prelude = Prelude {
        ops: ops.len(),
        segments: rec.start.segments.len(),
        pool_ops_dropped: 0,
    };
    for op in &rec.trace.ops {
        match op {
            Op::UsePool { .. } | Op::ReleasePool { .. } => prelude.pool_ops_dropped += 1,
            Op::EmptyPool { .. } => ops.push(Op::EmptyCache),
            op => ops.push(op.clone()),
        }
    }
    (Trace::from_ops(ops, Vec::new()), prelude)
}
