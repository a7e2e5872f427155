//! The converter: one device's recorded events (a snapshot's trace) into an
//! oracle [`Trace`] with the [`StartState`] to seed before it, see
//! [`convert`].

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::{err, ConvertError, RecordedTrace, SegmentEvent};
use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use crate::replay::StartState;
use crate::snapshot::DeviceEvents;
use reservoir::backend::StreamId;
use reservoir::caching::rules;
use reservoir::caching::{SeededBlock, SeededExpandable, SeededSegment};
use reservoir::config::AllocatorConfig;
use reservoir::observe::snapshot::SegmentType;
use reservoir::observe::trace::TraceAction;

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
pub(super) const SMALL_SIZE: u64 = 1 << 20;
/// Small-pool segment size.
const SMALL_BUFFER: u64 = 2 << 20;

/// Turn one device's recorded events into a [`RecordedTrace`], under the
/// recorded settings `config` (used to round blocks allocated before the
/// trace).
///
/// With `synthetic` addresses (the source recorded handles, not device
/// addresses), no address is scripted and placements are not compared.
///
/// The conversion runs in phases (a private `Converter`): the allocator
/// state at dump time, that state walked back to the first entry, the start
/// state to seed, and the ops of the trace forward from it.
pub fn convert(
    dev: &DeviceEvents,
    config: &AllocatorConfig,
    synthetic: bool,
) -> Result<RecordedTrace, ConvertError> {
    let mut c = Converter::at_dump_time(dev, config, synthetic)?;
    if c.from_segments {
        c.walk_back_to_first_entry()?;
    }
    let begin = c.start_state()?;
    c.forward(begin)
}

/// One device's conversion (see [`convert`]): the recorded allocator state,
/// first at dump time, then walked back to the first entry.
struct Converter<'a> {
    dev: &'a DeviceEvents,
    config: &'a AllocatorConfig,
    synthetic: bool,
    /// Plain segments by base.
    segs: BTreeMap<u64, RSeg>,
    /// Expandable reservations by base.
    xsegs: BTreeMap<u64, XSeg>,
    /// (handle, base) of blocks live at the start of a source without
    /// segments: each gets a segment of its own at a made-up base.
    aliases: Vec<(u64, u64)>,
    /// The source recorded segments (not only initially allocated blocks).
    from_segments: bool,
}

/// The start state at the first entry and the running totals the forward
/// phase continues from.
struct Begin {
    start: StartState,
    /// The last trace id handed out.
    next_id: AllocId,
    /// Live blocks: address -> (trace id, rounded size).
    live: FxHashMap<u64, (AllocId, u64)>,
    reserved: u64,
    allocated: u64,
    /// The device capacity the recording tells, if any.
    capacity: Option<u64>,
    /// Reserved bytes before each entry.
    reserved_before: Vec<u64>,
    /// Mapped bytes of each reservation (0: not reserved at that time; the
    /// replay reserves it at its first map, at the scripted base).
    x_mapped: BTreeMap<u64, u64>,
}

impl<'a> Converter<'a> {
    /// The state at dump time: the recorded segments with their allocated
    /// blocks (or, for a source without segments, a made-up segment per
    /// initially allocated block).
    fn at_dump_time(
        dev: &'a DeviceEvents,
        config: &'a AllocatorConfig,
        synthetic: bool,
    ) -> Result<Converter<'a>, ConvertError> {
        let events = &dev.events;
        let n = events.len();
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
        Ok(Converter {
            dev,
            config,
            synthetic,
            segs,
            xsegs,
            aliases,
            from_segments,
        })
    }

    /// Walk the events backwards from dump time to the first entry, undoing
    /// each: the state the allocator held before the trace began.
    fn walk_back_to_first_entry(&mut self) -> Result<(), ConvertError> {
        let config = self.config;
        let events = &self.dev.events;
        let segs = &mut self.segs;
        let xsegs = &mut self.xsegs;
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
                && seg_containing(segs, e.addr).is_none();
            if let Some(xb) = in_x.then(|| xseg_containing(xsegs, e.addr)).flatten() {
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
                    let Some(base) = seg_containing(segs, e.addr) else {
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
                    let Some(base) = seg_containing(segs, e.addr) else {
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
                    if seg_containing(segs, e.addr).is_some()
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
                    let Some(xb) = xseg_containing(xsegs, e.addr) else {
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
        Ok(())
    }

    /// The start state to seed (segments, expandable reservations, scripted
    /// bases), the totals at the first entry and the capacity the recording
    /// tells.
    fn start_state(&self) -> Result<Begin, ConvertError> {
        let Converter {
            dev,
            config,
            synthetic,
            ref segs,
            ref xsegs,
            ref aliases,
            ..
        } = *self;
        let events = &dev.events;
        let n = events.len();
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
        for (&base, s) in segs {
            let (blocks, ids) =
                seed_blocks(base, &s.blocks, &mut next_id, &mut live, &mut allocated);
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
        for (&base, x) in xsegs {
            x_mapped.insert(base, x.mapped.len() as u64 * x.page);
            if x.mapped.is_empty() && x.blocks.is_empty() {
                continue;
            }
            let (blocks, ids) =
                seed_blocks(base, &x.blocks, &mut next_id, &mut live, &mut allocated);
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

        for &(handle, base) in aliases {
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
        Ok(Begin {
            start,
            next_id,
            live,
            reserved,
            allocated,
            capacity,
            reserved_before,
            x_mapped,
        })
    }

    /// The trace forward from the start state: an op per allocation, free
    /// and inferred `empty_cache`, with the recorded segment events,
    /// placements and peaks to compare a replay with.
    fn forward(self, begin: Begin) -> Result<RecordedTrace, ConvertError> {
        let Converter {
            dev,
            config,
            synthetic,
            xsegs,
            from_segments,
            ..
        } = self;
        let Begin {
            mut start,
            mut next_id,
            mut live,
            mut reserved,
            mut allocated,
            capacity,
            reserved_before,
            mut x_mapped,
        } = begin;
        let known_capacity = capacity;
        let events = &dev.events;
        let n = events.len();
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
        let mut sites = crate::replay::sites::Sites::new();
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
                    sites.record(next_id, &e.frames);
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
                    sites.record(next_id, &e.frames);
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
                    if let Some(m) =
                        xseg_containing(&xsegs, e.addr).and_then(|b| x_mapped.get_mut(&b))
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
            sites,
            segments_known: from_segments,
        })
    }
}
