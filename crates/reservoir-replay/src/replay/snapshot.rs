//! Replaying recorded traces exactly: a snapshot's device trace (any input
//! [`crate::snapshot::load`] reads) turned into a [`Trace`] of oracle ops plus
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
//! ([`reservoir::caching::CachingAllocator::seed_expandable`]); the others are
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

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::{Replay, ReplaySetting, StartState};
use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use crate::snapshot::DeviceEvents;
use reservoir::backend::StreamId;
use reservoir::caching::rules;
use reservoir::caching::{SeededBlock, SeededExpandable, SeededSegment};
use reservoir::config::AllocatorConfig;
use reservoir::sim::{CallKind, CallResult};
use reservoir::snapshot::{AllocatorSettings, SegmentType};
use reservoir::trace::TraceAction;

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

#[derive(Clone, Debug)]
struct RSeg {
    size: u64,
    stream: StreamId,
    small: bool,
    /// Allocated (or pending) blocks: addr -> (size, requested).
    blocks: BTreeMap<u64, (u64, u64)>,
}

fn seg_containing(segs: &BTreeMap<u64, RSeg>, addr: u64) -> Option<u64> {
    let (&base, s) = segs.range(..=addr).next_back()?;
    (addr < base + s.size).then_some(base)
}

/// An expandable segment being rebuilt: its reservation (base = the
/// lowest address known to be in it), which pages are mapped, and its
/// allocated blocks.
#[derive(Clone, Debug)]
struct XSeg {
    /// One past the highest address known to be in it.
    end: u64,
    stream: StreamId,
    small: bool,
    page: u64,
    /// Addresses of the mapped pages.
    mapped: std::collections::BTreeSet<u64>,
    /// Allocated (or pending) blocks: addr -> (size, requested).
    blocks: BTreeMap<u64, (u64, u64)>,
}

fn xseg_containing(xsegs: &BTreeMap<u64, XSeg>, addr: u64) -> Option<u64> {
    let (&base, s) = xsegs.range(..=addr).next_back()?;
    (addr < s.end).then_some(base)
}

/// (address, size, mapped at dump time) of an expandable range.
type Point = (u64, u64, bool);

/// The expandable segments behind the dump-time expandable segments (each
/// a run of mapped pages) and the trace's `segment_map` / `segment_unmap`
/// entries: per (stream, pool), addresses sorted and cut where they are
/// more than `span` apart. The pool is small when a dump-time segment says
/// so or a size is not a multiple of the large page (small-pool maps are
/// one 2 MiB page). Pages are mapped as at dump time.
fn expandable_groups(
    dev: &DeviceEvents,
    config: &AllocatorConfig,
    span: u64,
) -> Result<BTreeMap<u64, XSeg>, ConvertError> {
    let large_page = config.large_segment_size.max(SMALL_BUFFER);
    // Sizes and ends must stay far from overflow, and page loops short.
    let bad = |addr: u64, size: u64| size > MAX_EXPANDABLE_RANGE || addr > u64::MAX / 2;
    for (i, e) in dev.events.iter().enumerate() {
        let x = matches!(
            e.action,
            TraceAction::SegmentMap | TraceAction::SegmentUnmap
        );
        if x && bad(e.addr, e.size) {
            return err(
                i,
                format!(
                    "{} of {:#x} ({} bytes): out of range",
                    e.action, e.addr, e.size
                ),
            );
        }
    }
    for s in dev
        .final_segments
        .iter()
        .flatten()
        .filter(|s| s.expandable())
    {
        if bad(s.address, s.total_size) {
            return err(
                dev.events.len(),
                format!(
                    "expandable segment {:#x} ({} bytes): out of range",
                    s.address, s.total_size
                ),
            );
        }
    }
    // (stream, small) -> [(addr, size, mapped at dump time)]
    let mut points: BTreeMap<(u64, bool), Vec<Point>> = BTreeMap::new();
    for s in dev
        .final_segments
        .iter()
        .flatten()
        .filter(|s| s.expandable())
    {
        let small = s.segment_type == SegmentType::Small || s.total_size % large_page != 0;
        points
            .entry((s.stream.0, small))
            .or_default()
            .push((s.address, s.total_size, true));
    }
    for e in &dev.events {
        if matches!(
            e.action,
            TraceAction::SegmentMap | TraceAction::SegmentUnmap
        ) {
            let small = e.size % large_page != 0;
            points
                .entry((e.stream.0, small))
                .or_default()
                .push((e.addr, e.size, false));
        }
    }
    // All points in address order: a reservation is a run of points of one
    // (stream, pool), cut where another's point comes between (reservations
    // do not overlap) or where they are more than `span` apart.
    let mut all: Vec<(u64, u64, bool, (u64, bool))> = points
        .into_iter()
        .flat_map(|(key, pts)| pts.into_iter().map(move |(a, s, m)| (a, s, m, key)))
        .collect();
    all.sort_unstable();
    let mut out = BTreeMap::new();
    let mut cur: Option<(u64, (u64, bool), XSeg)> = None;
    for (addr, size, mapped, key) in all {
        if let Some((base, k, x)) = &cur {
            if *k != key || addr.saturating_sub(x.end) > span || addr.saturating_sub(*base) > span {
                let (b, _, x) = cur.take().expect("checked");
                out.insert(b, x);
            }
        }
        let (stream, small) = key;
        let page = if small { SMALL_BUFFER } else { large_page };
        let (_, _, x) = cur.get_or_insert_with(|| {
            (
                addr,
                key,
                XSeg {
                    end: addr,
                    stream: StreamId(stream),
                    small,
                    page,
                    mapped: Default::default(),
                    blocks: BTreeMap::new(),
                },
            )
        });
        x.end = x.end.max(addr.saturating_add(size));
        if mapped {
            let mut p = addr;
            while p < addr.saturating_add(size) {
                x.mapped.insert(p);
                p += page;
            }
        }
    }
    if let Some((b, _, x)) = cur {
        out.insert(b, x);
    }
    Ok(out)
}

/// Largest expandable range (a map, an unmap, a run of mapped pages) a
/// trace may have: 1 TiB (half a million small pages).
const MAX_EXPANDABLE_RANGE: u64 = 1 << 40;

/// The seeded blocks of one start segment (offsets from `base`), each given
/// the next allocation id, recorded in `live` and counted in `allocated`.
fn seed_blocks(
    base: u64,
    recorded: &BTreeMap<u64, (u64, u64)>,
    next_id: &mut AllocId,
    live: &mut FxHashMap<u64, (AllocId, u64)>,
    allocated: &mut u64,
) -> (Vec<SeededBlock>, Vec<AllocId>) {
    let mut blocks = Vec::with_capacity(recorded.len());
    let mut ids = Vec::with_capacity(recorded.len());
    for (&addr, &(size, requested)) in recorded {
        *next_id += 1;
        blocks.push(SeededBlock {
            offset: addr - base,
            size,
            requested_size: requested.min(size),
        });
        ids.push(*next_id);
        live.insert(addr, (*next_id, size));
        *allocated += size;
    }
    (blocks, ids)
}

/// Largest device capacity (a multiple of 2 MiB) whose expandable-segment
/// reservations (9/8 of it, in pages of at most `large_page`) fit in `gap`.
fn capacity_for_gap(gap: u64, large_page: u64) -> u64 {
    let c = gap.saturating_sub(large_page) / 9 * 8;
    c / SMALL_BUFFER * SMALL_BUFFER
}

/// Large-pool blocks leave no remainder of 1 MiB or less (spec 1.7).
const SMALL_SIZE: u64 = 1 << 20;
/// Small-pool segment size.
const SMALL_BUFFER: u64 = 2 << 20;

/// Turn one device's recorded events into a [`RecordedTrace`], under the
/// recorded settings `config` (used to round blocks allocated before the
/// trace).
///
/// With `synthetic` addresses (the source recorded handles, not device
/// addresses), no address is scripted and placements are not compared.
pub fn convert(
    dev: &DeviceEvents,
    config: &AllocatorConfig,
    synthetic: bool,
) -> Result<RecordedTrace, ConvertError> {
    let events = &dev.events;
    let n = events.len();
    // --- the state at dump time
    let mut segs: BTreeMap<u64, RSeg> = BTreeMap::new();
    // (handle, base) of blocks live at the start of a source without
    // segments: each gets a segment of its own at a made-up base.
    let mut aliases: Vec<(u64, u64)> = Vec::new();
    if let Some(initial) = &dev.initially_allocated {
        for (k, b) in initial.iter().enumerate() {
            let size = rules::round_size(b.size.max(1), config);
            let small = size <= SMALL_SIZE;
            let seg_size = rules::allocation_size(size, config);
            let mut blocks = BTreeMap::new();
            let base = (k as u64 + 1) << 40;
            blocks.insert(base, (size, b.size));
            aliases.push((b.addr, base));
            segs.insert(
                base,
                RSeg {
                    size: seg_size,
                    stream: b.stream,
                    small,
                    blocks,
                },
            );
        }
    } else {
        for s in dev.final_segments.iter().flatten() {
            if s.expandable() {
                continue;
            }
            let mut blocks = BTreeMap::new();
            for (addr, b) in s.blocks_with_addresses() {
                if b.state.is_active() {
                    blocks.insert(addr, (b.size, b.requested_size.unwrap_or(b.size)));
                }
            }
            if seg_containing(&segs, s.address).is_some()
                || segs
                    .range(s.address..s.address + s.total_size)
                    .next()
                    .is_some()
            {
                return err(
                    n,
                    format!("segment {:#x} overlaps another at dump time", s.address),
                );
            }
            segs.insert(
                s.address,
                RSeg {
                    size: s.total_size,
                    stream: s.stream,
                    small: s.segment_type == SegmentType::Small,
                    blocks,
                },
            );
        }
    }
    let from_segments = dev.initially_allocated.is_none();
    let mut xsegs = if from_segments {
        expandable_groups(dev, config, reservoir::sim::DEFAULT_CAPACITY)?
    } else {
        BTreeMap::new()
    };
    if from_segments {
        for s in dev
            .final_segments
            .iter()
            .flatten()
            .filter(|s| s.expandable())
        {
            let Some(base) = xseg_containing(&xsegs, s.address) else {
                return err(
                    n,
                    format!("expandable segment {:#x}: no reservation", s.address),
                );
            };
            let x = xsegs.get_mut(&base).expect("found above");
            for (addr, b) in s.blocks_with_addresses() {
                if b.state.is_active() {
                    x.blocks
                        .insert(addr, (b.size, b.requested_size.unwrap_or(b.size)));
                }
            }
        }
    }

    // --- walk backwards to the first entry
    if from_segments {
        let mut starts: std::collections::BTreeSet<u64> = events
            .iter()
            .filter(|e| matches!(e.action, TraceAction::Alloc | TraceAction::FreeCompleted))
            .map(|e| e.addr)
            .collect();
        for s in segs.values() {
            starts.extend(s.blocks.keys().copied());
        }
        for (i, e) in events.iter().enumerate().rev() {
            let in_x = matches!(e.action, TraceAction::Alloc | TraceAction::FreeCompleted)
                && seg_containing(&segs, e.addr).is_none();
            if let Some(xb) = in_x.then(|| xseg_containing(&xsegs, e.addr)).flatten() {
                let x = xsegs.get_mut(&xb).expect("found above");
                if e.action == TraceAction::Alloc {
                    if x.blocks.remove(&e.addr).is_none() {
                        return err(
                            i,
                            format!("alloc of {:#x}, which is not allocated afterwards", e.addr),
                        );
                    }
                } else {
                    // Expandable blocks split off any remainder (spec 1.7):
                    // the block is the rounded size.
                    let size = rules::round_size(e.size.max(1), config);
                    if size > MAX_EXPANDABLE_RANGE || e.addr > u64::MAX / 2 {
                        return err(
                            i,
                            format!("free of {:#x} ({} bytes): out of range", e.addr, e.size),
                        );
                    }
                    let overlaps_prev = x
                        .blocks
                        .range(..e.addr)
                        .next_back()
                        .is_some_and(|(&pa, &(ps, _))| pa + ps > e.addr);
                    let overlaps_next = x
                        .blocks
                        .range(e.addr..)
                        .next()
                        .is_some_and(|(&a, _)| a < e.addr + size);
                    if overlaps_prev || overlaps_next {
                        return err(i, format!("free of {:#x} overlaps another block", e.addr));
                    }
                    let first = e.addr - (e.addr - xb) % x.page;
                    let mut p = first;
                    while p < e.addr + size {
                        if !x.mapped.contains(&p) {
                            return err(
                                i,
                                format!("free of {:#x}: page {p:#x} is not mapped", e.addr),
                            );
                        }
                        p += x.page;
                    }
                    x.blocks.insert(e.addr, (size, e.size));
                }
                continue;
            }
            match e.action {
                TraceAction::Alloc => {
                    let Some(base) = seg_containing(&segs, e.addr) else {
                        return err(i, format!("alloc of {:#x} in no segment", e.addr));
                    };
                    if segs.get_mut(&base).and_then(|s| s.blocks.remove(&e.addr)).is_none() {
                        return err(
                            i,
                            format!("alloc of {:#x}, which is not allocated afterwards", e.addr),
                        );
                    }
                }
                TraceAction::FreeCompleted => {
                    let Some(base) = seg_containing(&segs, e.addr) else {
                        return err(i, format!("free of {:#x} in no segment", e.addr));
                    };
                    let seg = segs.get_mut(&base).expect("found above");
                    let end = base + seg.size;
                    let mut size = rules::round_size(e.size.max(1), config);
                    let next = seg
                        .blocks
                        .range(e.addr..)
                        .next()
                        .map_or(end, |(&a, _)| a);
                    if let Some((&pa, &(ps, _))) = seg.blocks.range(..e.addr).next_back() {
                        if pa + ps > e.addr {
                            return err(i, format!("free of {:#x} overlaps the block at {pa:#x}", e.addr));
                        }
                    }
                    if next == e.addr || e.addr + size > next {
                        return err(
                            i,
                            format!("free of {:#x} ({} bytes) overlaps the next block or the segment end", e.addr, e.size),
                        );
                    }
                    // Any address some block starts at, at some time, is a
                    // boundary the block's end may reach.
                    let boundary = starts
                        .range(e.addr + 1..)
                        .next()
                        .map_or(next, |&a| a.min(next));
                    let rest = boundary.saturating_sub(e.addr + size);
                    if !seg.small && rest > 0 && rest <= SMALL_SIZE {
                        size += rest;
                    }
                    seg.blocks.insert(e.addr, (size, e.size));
                }
                TraceAction::SegmentAlloc => match segs.get(&e.addr) {
                    Some(s) if s.blocks.is_empty() && s.size == e.size => {
                        segs.remove(&e.addr);
                    }
                    Some(s) => {
                        return err(
                            i,
                            format!(
                                "segment_alloc of {:#x}: afterwards the segment has {} bytes and {} allocated blocks",
                                e.addr,
                                s.size,
                                s.blocks.len()
                            ),
                        )
                    }
                    None => {
                        return err(i, format!("segment_alloc of {:#x}, a segment that does not exist afterwards", e.addr))
                    }
                },
                TraceAction::SegmentFree => {
                    if seg_containing(&segs, e.addr).is_some()
                        || segs.range(e.addr..e.addr.saturating_add(e.size)).next().is_some()
                    {
                        return err(i, format!("segment_free of {:#x} overlaps a live segment", e.addr));
                    }
                    segs.insert(
                        e.addr,
                        RSeg {
                            size: e.size,
                            stream: e.stream,
                            small: e.size == SMALL_BUFFER,
                            blocks: BTreeMap::new(),
                        },
                    );
                }
                TraceAction::SegmentMap | TraceAction::SegmentUnmap => {
                    let Some(xb) = xseg_containing(&xsegs, e.addr) else {
                        return err(i, format!("{} of {:#x} in no expandable segment", e.action, e.addr));
                    };
                    let x = xsegs.get_mut(&xb).expect("found above");
                    if (e.addr - xb) % x.page != 0 || e.size % x.page != 0 || e.size == 0 {
                        return err(i, format!("{} of {:#x} ({} bytes) is not in whole pages", e.action, e.addr, e.size));
                    }
                    let map = e.action == TraceAction::SegmentMap;
                    if map
                        && x
                            .blocks
                            .range(..e.addr + e.size)
                            .next_back()
                            .is_some_and(|(&a, &(sz, _))| a + sz > e.addr)
                    {
                        return err(i, format!("segment_map of {:#x}: afterwards a block is allocated there", e.addr));
                    }
                    let mut p = e.addr;
                    while p < e.addr + e.size {
                        // Before a map the page was unmapped, before an unmap mapped.
                        let changed = if map { x.mapped.remove(&p) } else { x.mapped.insert(p) };
                        if !changed {
                            return err(i, format!("{} of {:#x}: page {p:#x} is {} afterwards", e.action, e.addr, if map { "unmapped" } else { "mapped" }));
                        }
                        p += x.page;
                    }
                }
                TraceAction::FreeRequested | TraceAction::Snapshot | TraceAction::Oom => {}
            }
        }
    }

    // --- the start state
    let mut next_id: AllocId = 0;
    let mut live: FxHashMap<u64, (AllocId, u64)> = FxHashMap::default();
    let mut start = StartState {
        literal_streams: true,
        record_placements: true,
        address_order: true,
        ..StartState::default()
    };
    let mut reserved: u64 = 0;
    let mut allocated: u64 = 0;
    for (&base, s) in &segs {
        let (blocks, ids) = seed_blocks(base, &s.blocks, &mut next_id, &mut live, &mut allocated);
        reserved += s.size;
        start.segments.push((
            base,
            SeededSegment {
                stream: s.stream,
                small: s.small,
                size: s.size,
                blocks,
            },
            ids,
        ));
    }

    // Mapped bytes of each reservation (0: not reserved at that time; the
    // replay reserves it at its first map, at the scripted base).
    let mut x_mapped: BTreeMap<u64, u64> = BTreeMap::new();
    for (&base, x) in &xsegs {
        x_mapped.insert(base, x.mapped.len() as u64 * x.page);
        if x.mapped.is_empty() && x.blocks.is_empty() {
            continue;
        }
        let (blocks, ids) = seed_blocks(base, &x.blocks, &mut next_id, &mut live, &mut allocated);
        let mut mapped: Vec<(u64, u64)> = Vec::new();
        for &p in &x.mapped {
            match mapped.last_mut() {
                Some((o, l)) if *o + *l == p - base => *l += x.page,
                _ => mapped.push((p - base, x.page)),
            }
        }
        reserved += mapped.iter().map(|r| r.1).sum::<u64>();
        start.expandable.push((
            base,
            SeededExpandable {
                stream: x.stream,
                small: x.small,
                mapped,
                blocks,
            },
            ids,
        ));
    }
    // Reservations must not overlap: with no OOM to tell the device's
    // capacity, take one whose reservations fit between the recorded ones.
    let mut capacity = None;
    let bases: Vec<u64> = xsegs.keys().copied().collect();
    if let Some(gap) = bases.windows(2).map(|w| w[1] - w[0]).min() {
        let c = capacity_for_gap(gap, config.large_segment_size);
        if c < reservoir::sim::DEFAULT_CAPACITY {
            capacity = Some(c);
        }
    }
    // Reserved bytes before each entry, and the capacity the first `oom`
    // entry tells (`device_free` + reserved).
    let mut reserved_before = Vec::with_capacity(n);
    {
        let mut r = reserved;
        let mut oom_capacity = None;
        for e in events {
            reserved_before.push(r);
            match e.action {
                TraceAction::SegmentAlloc | TraceAction::SegmentMap => r += e.size,
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    r = r.saturating_sub(e.size)
                }
                TraceAction::Oom if oom_capacity.is_none() => {
                    oom_capacity = Some(e.addr.saturating_add(r));
                }
                _ => {}
            }
        }
        if oom_capacity.is_some() {
            capacity = oom_capacity;
        }
    }
    let known_capacity = capacity;

    for &(handle, base) in &aliases {
        if let Some(v) = live.remove(&base) {
            if live.insert(handle, v).is_some() {
                return err(
                    0,
                    format!("initially allocated handle {handle} appears twice"),
                );
            }
        }
    }
    if synthetic || !aliases.is_empty() {
        for s in &mut start.segments {
            s.0 = 0;
        }
    }

    // --- forward
    let stream_name = |s: StreamId| StreamName::new(s.0.to_string());
    let mut ops = Vec::with_capacity(n);
    let mut lines = Vec::with_capacity(n);
    // Allocations name no stream: an `s` op switches the current stream
    // when it changes (the default stream is current at the start).
    let mut current = StreamId::DEFAULT;
    let mut switch = |ops: &mut Vec<Op>, lines: &mut Vec<usize>, i: usize, s: StreamId| {
        if s != current {
            current = s;
            ops.push(Op::SetStream {
                stream: stream_name(s),
            });
            lines.push(i);
        }
    };
    let mut segment_events = Vec::new();
    let mut placements = Vec::new();
    let mut ooms = 0;
    let mut empty_caches = 0;
    let mut peak_reserved = reserved;
    let mut peak_allocated = allocated;
    for (i, e) in events.iter().enumerate() {
        match e.action {
            TraceAction::Alloc => {
                if live.contains_key(&e.addr) {
                    return err(
                        i,
                        format!("alloc of {:#x}, which is already allocated", e.addr),
                    );
                }
                next_id += 1;
                let size = rules::round_size(e.size.max(1), config);
                live.insert(e.addr, (next_id, size));
                allocated += size;
                peak_allocated = peak_allocated.max(allocated);
                switch(&mut ops, &mut lines, i, e.stream);
                ops.push(Op::Alloc {
                    id: next_id,
                    bytes: e.size,
                    stream: None,
                });
                lines.push(i);
                placements.push(if synthetic { 0 } else { e.addr });
            }
            TraceAction::FreeCompleted => {
                let Some((id, size)) = live.remove(&e.addr) else {
                    return err(
                        i,
                        format!("free_completed of {:#x}, which is not allocated", e.addr),
                    );
                };
                allocated = allocated.saturating_sub(size);
                ops.push(Op::Free { id });
                lines.push(i);
            }
            TraceAction::Oom => {
                ooms += 1;
                next_id += 1;
                switch(&mut ops, &mut lines, i, e.stream);
                ops.push(Op::Alloc {
                    id: next_id,
                    bytes: e.size,
                    stream: None,
                });
                lines.push(i);
                placements.push(0);
            }
            TraceAction::SegmentAlloc => {
                segment_events.push(SegmentEvent {
                    action: e.action,
                    size: e.size,
                });
                if !synthetic {
                    start.scripted_addresses.push(e.addr);
                }
                reserved += e.size;
                peak_reserved = peak_reserved.max(reserved);
            }
            TraceAction::SegmentMap => {
                segment_events.push(SegmentEvent {
                    action: e.action,
                    size: e.size,
                });
                if let Some(m) = xseg_containing(&xsegs, e.addr).and_then(|b| x_mapped.get_mut(&b))
                {
                    if *m == 0 && !synthetic {
                        // A new reservation: its first map is at its base.
                        start.scripted_addresses.push(e.addr);
                    }
                    *m += e.size;
                }
                reserved += e.size;
                peak_reserved = peak_reserved.max(reserved);
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                segment_events.push(SegmentEvent {
                    action: e.action,
                    size: e.size,
                });
                if e.action == TraceAction::SegmentUnmap {
                    // Fully unmapped, a reservation is released.
                    if let Some(m) =
                        xseg_containing(&xsegs, e.addr).and_then(|b| x_mapped.get_mut(&b))
                    {
                        *m = m.saturating_sub(e.size);
                    }
                }
                reserved = reserved.saturating_sub(e.size);
                let release = |a: TraceAction| {
                    matches!(a, TraceAction::SegmentFree | TraceAction::SegmentUnmap)
                };
                let run_start = i == 0 || !release(events[i - 1].action);
                if run_start {
                    let after = events[i..].iter().find(|x| !release(x.action));
                    let followed_by_oom = after.is_some_and(|x| x.action == TraceAction::Oom);
                    // A flush followed by a new segment that would not have
                    // fit on the device without it is the allocator's own
                    // free-and-retry, not the user's `empty_cache()`.
                    let retry = after.is_some_and(|x| {
                        matches!(
                            x.action,
                            TraceAction::SegmentAlloc | TraceAction::SegmentMap
                        ) && known_capacity
                            .is_some_and(|c| reserved_before[i].saturating_add(x.size) > c)
                    });
                    if !followed_by_oom && !retry {
                        ops.push(Op::EmptyCache);
                        lines.push(i);
                        empty_caches += 1;
                    }
                }
            }
            TraceAction::FreeRequested | TraceAction::Snapshot => {}
        }
    }
    let header = vec![
        format!("recorded trace of device {}: {} entries", dev.device, n),
        "line numbers below are not entry indices; see RecordedTrace::trace.lines".to_string(),
    ];
    let mut trace = Trace::from_ops(ops, header);
    trace.lines = lines;
    Ok(RecordedTrace {
        device: dev.device,
        trace,
        start,
        segment_events,
        placements,
        ooms,
        capacity,
        peak_reserved,
        peak_allocated,
        empty_caches,
        segments_known: from_segments,
    })
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
pub fn replayed_segment_events(replay: &Replay<'_>) -> Vec<SegmentEvent> {
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
pub fn fidelity(rec: &RecordedTrace, replay: &Replay<'_>) -> Fidelity {
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
/// `device`, `events` (recorded entries) and `fidelity` ([`Fidelity`],
/// `null` except in PyTorch mode: the recorded settings).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RecordedReport {
    /// The input file.
    pub file: String,
    /// The device whose trace was replayed.
    pub device: u32,
    /// Trace entries of that device.
    pub events: u64,
    /// What the replay measured.
    #[serde(flatten)]
    pub report: super::ReplayReport,
    /// How closely it reproduced the recording (PyTorch mode only).
    pub fidelity: Option<Fidelity>,
}

/// Replay `rec` with `setting`; with `compare`, also measure the
/// [`Fidelity`] (meaningful when `setting` is the recorded one).
/// `progress` gets the number of ops done.
pub fn replay_recorded(
    rec: &RecordedTrace,
    setting: &ReplaySetting,
    options: &super::ReplayOptions,
    compare: bool,
    progress: &mut dyn FnMut(usize),
) -> Result<(super::ReplayReport, Option<Fidelity>), super::ReplayError> {
    // Clone the start state (all its segments) only to change the flag.
    let start = if rec.start.record_placements == compare {
        std::borrow::Cow::Borrowed(&rec.start)
    } else {
        let mut start = rec.start.clone();
        start.record_placements = compare;
        std::borrow::Cow::Owned(start)
    };
    let mut r = Replay::with_start(&rec.trace, &start, setting, options)?;
    r.run_with_progress(progress)?;
    let fid = (compare && rec.segments_known).then(|| fidelity(rec, &r));
    Ok((r.report(), fid))
}

/// Split a settings string at its top-level commas (not inside `[...]`).
fn split_conf(conf: &str) -> Vec<&str> {
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
}

/// The recorded trace in the oracle's text format, for PyTorch's real
/// allocator (`oracle_replay.py`), which cannot be seeded: a prelude of
/// ops rebuilds the start state first. Per seeded segment, in address
/// order: one allocation of the whole segment (which makes the driver
/// allocate exactly that size), its free, then one allocation per block
/// and per free gap in address order, so each lands at its offset (gaps of
/// small-pool segments are allocated in pieces of at most 1 MiB); when
/// every segment is laid out, the gap allocations are freed. The trace's
/// own ops follow, with the same ids.
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
    let prelude = Prelude {
        ops: ops.len(),
        segments: rec.start.segments.len(),
    };
    ops.extend(rec.trace.ops.iter().cloned());
    (Trace::from_ops(ops, Vec::new()), prelude)
}
