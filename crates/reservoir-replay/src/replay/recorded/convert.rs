//! The converter: one device's recorded events (a snapshot's trace) into an
//! oracle [`Trace`] with the [`StartState`] to seed before it, see
//! [`convert`].

mod pools;
mod undo;

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::{err, ConvertError, RecordedTrace, SegmentEvent};
use crate::input::DeviceEvents;
use crate::oracle_trace::{AllocId, Op, PoolPair, StreamName, Trace};
use crate::replay::StartState;
use pools::{PoolTracker, DEFAULT_POOL};
use reservoir::backend::StreamId;
use reservoir::caching::rules;
use reservoir::caching::{SeededBlock, SeededExpandable, SeededSegment};
use reservoir::config::AllocatorConfig;
use reservoir::observe::snapshot::SegmentType;
use reservoir::observe::trace::{TraceAction, TraceEntry};
use undo::{
    undo_alloc, undo_expandable_block, undo_free, undo_map, undo_segment_alloc, undo_segment_free,
};

#[derive(Clone, Debug)]
struct RSeg {
    size: u64,
    stream: StreamId,
    small: bool,
    /// The recorded pool (`segment_pool_id`; `(0, 0)`: the default pool).
    pool: PoolPair,
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
                        pool: DEFAULT_POOL,
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
                        pool: pools::pair(s.segment_pool_id),
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
                undo_expandable_block(x, xb, i, e, config)?;
                continue;
            }
            match e.action {
                TraceAction::Alloc => undo_alloc(segs, i, e)?,
                TraceAction::FreeCompleted => undo_free(segs, &starts, i, e, config)?,
                TraceAction::SegmentAlloc => undo_segment_alloc(segs, i, e)?,
                TraceAction::SegmentFree => undo_segment_free(segs, i, e)?,
                TraceAction::SegmentMap | TraceAction::SegmentUnmap => undo_map(xsegs, i, e)?,
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
        let mut next_id: AllocId = 0;
        let mut live: FxHashMap<u64, (AllocId, u64)> = FxHashMap::default();
        let mut start = StartState {
            device: dev.device,
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
            if s.pool != DEFAULT_POOL {
                start.segment_pools.insert(start.segments.len(), s.pool);
            }
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
        let (reserved_before, oom_capacity) = reserved_before(&dev.events, reserved);
        let capacity = oom_capacity.or_else(|| capacity_between_reservations(xsegs, config));

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
        let pools = PoolTracker::new(
            self.segs.iter().map(|(&b, s)| (b, s.size, s.pool)),
            self.dev,
        );
        let Converter {
            dev,
            config,
            synthetic,
            xsegs,
            from_segments,
            ..
        } = self;
        let events = &dev.events;
        let n = events.len();
        let mut f = Forward {
            config,
            synthetic,
            ops: Vec::with_capacity(n),
            lines: Vec::with_capacity(n),
            current: StreamId::DEFAULT,
            segment_events: Vec::new(),
            placements: Vec::new(),
            sites: crate::replay::sites::Sites::new(),
            ooms: 0,
            empty_caches: 0,
            peak_reserved: begin.reserved,
            peak_allocated: begin.allocated,
            begin,
            pools,
        };
        for (i, e) in events.iter().enumerate() {
            match e.action {
                TraceAction::Alloc => f.alloc(i, e)?,
                TraceAction::FreeCompleted => f.free(i, e)?,
                TraceAction::Oom => f.oom(i, e),
                TraceAction::SegmentAlloc => {
                    f.pools.segment_alloc(e);
                    f.segment_alloc(e)
                }
                TraceAction::SegmentMap => f.segment_map(&xsegs, e),
                TraceAction::SegmentFree | TraceAction::SegmentUnmap => {
                    f.segment_release(&xsegs, events, i)
                }
                TraceAction::FreeRequested | TraceAction::Snapshot => {}
            }
        }
        let header = vec![
            format!("recorded trace of device {}: {} entries", dev.device, n),
            "line numbers below are not entry indices; see RecordedTrace::trace.lines".to_string(),
        ];
        let mut trace = Trace::from_ops(f.ops, header);
        trace.lines = f.lines;
        Ok(RecordedTrace {
            device: dev.device,
            trace,
            start: f.begin.start,
            segment_events: f.segment_events,
            placements: f.placements,
            ooms: f.ooms,
            capacity: f.begin.capacity,
            peak_reserved: f.peak_reserved,
            peak_allocated: f.peak_allocated,
            empty_caches: f.empty_caches,
            sites: f.sites,
            segments_known: from_segments,
        })
    }
}

/// The forward phase of a conversion (see [`Converter::forward`]): the
/// running totals from the start state on, and the trace and recorded
/// measurements built so far.
struct Forward<'a> {
    config: &'a AllocatorConfig,
    synthetic: bool,
    /// The start state (whose scripted addresses grow), the live blocks and
    /// totals.
    begin: Begin,
    ops: Vec<Op>,
    lines: Vec<usize>,
    /// The current stream of the ops so far (allocations name no stream:
    /// an `s` op switches it; the default stream is current at the start).
    current: StreamId,
    segment_events: Vec<SegmentEvent>,
    placements: Vec<u64>,
    sites: crate::replay::sites::Sites,
    ooms: u64,
    empty_caches: u64,
    peak_reserved: u64,
    peak_allocated: u64,
    /// The recorded pools (`p`, `x`, `e <pool>` ops).
    pools: PoolTracker,
}

impl Forward<'_> {
    /// An op from entry `i`.
    fn push(&mut self, op: Op, i: usize) {
        self.ops.push(op);
        self.lines.push(i);
    }

    /// An allocation of `bytes` on `stream` from entry `i` (after an `s` op
    /// when the stream changes), with a new trace id.
    fn push_alloc(&mut self, i: usize, e: &TraceEntry) -> AllocId {
        self.begin.next_id += 1;
        let id = self.begin.next_id;
        self.sites.record(id, &e.frames);
        if let Some(op) = self.pools.route(e) {
            self.push(op, i);
        }
        if e.stream != self.current {
            self.current = e.stream;
            let stream = StreamName::new(e.stream.0.to_string());
            self.push(Op::SetStream { stream }, i);
        }
        let op = Op::Alloc {
            id,
            bytes: e.size,
            stream: None,
        };
        self.push(op, i);
        id
    }

    /// `alloc` entry `i`.
    fn alloc(&mut self, i: usize, e: &TraceEntry) -> Result<(), ConvertError> {
        if self.begin.live.contains_key(&e.addr) {
            return err(
                i,
                format!("alloc of {:#x}, which is already allocated", e.addr),
            );
        }
        let id = self.push_alloc(i, e);
        let size = rules::round_size(e.size.max(1), self.config);
        self.begin.live.insert(e.addr, (id, size));
        self.begin.allocated += size;
        self.peak_allocated = self.peak_allocated.max(self.begin.allocated);
        self.placements
            .push(if self.synthetic { 0 } else { e.addr });
        Ok(())
    }

    /// `free_completed` entry `i`.
    fn free(&mut self, i: usize, e: &TraceEntry) -> Result<(), ConvertError> {
        let Some((id, size)) = self.begin.live.remove(&e.addr) else {
            return err(
                i,
                format!("free_completed of {:#x}, which is not allocated", e.addr),
            );
        };
        self.begin.allocated = self.begin.allocated.saturating_sub(size);
        self.push(Op::Free { id }, i);
        Ok(())
    }

    /// `oom` entry `i`: an allocation expected to fail (never freed).
    fn oom(&mut self, i: usize, e: &TraceEntry) {
        self.ooms += 1;
        self.push_alloc(i, e);
        self.placements.push(0);
    }

    /// A recorded segment event; `grow` says whether it reserves bytes.
    fn segment_event(&mut self, e: &TraceEntry, grow: bool) {
        self.segment_events.push(SegmentEvent {
            action: e.action,
            size: e.size,
        });
        if grow {
            self.begin.reserved += e.size;
            self.peak_reserved = self.peak_reserved.max(self.begin.reserved);
        } else {
            self.begin.reserved = self.begin.reserved.saturating_sub(e.size);
        }
    }

    /// A `segment_alloc` entry: its address is scripted for the device.
    fn segment_alloc(&mut self, e: &TraceEntry) {
        if !self.synthetic {
            self.begin.start.scripted_addresses.push(e.addr);
        }
        self.segment_event(e, true);
    }

    /// A `segment_map` entry: the first map of a reservation not reserved
    /// at that time scripts its base.
    fn segment_map(&mut self, xsegs: &BTreeMap<u64, XSeg>, e: &TraceEntry) {
        let x_mapped = &mut self.begin.x_mapped;
        if let Some(m) = xseg_containing(xsegs, e.addr).and_then(|b| x_mapped.get_mut(&b)) {
            if *m == 0 && !self.synthetic {
                // A new reservation: its first map is at its base.
                self.begin.start.scripted_addresses.push(e.addr);
            }
            *m += e.size;
        }
        self.segment_event(e, true);
    }

    /// `segment_free` / `segment_unmap` entry `i` of `events`: the first of
    /// a run of them is the user's `empty_cache()` unless the allocator
    /// freed to retry (the run is followed by an `oom`, or by a new segment
    /// that would not have fit without it).
    fn segment_release(&mut self, xsegs: &BTreeMap<u64, XSeg>, events: &[TraceEntry], i: usize) {
        let e = &events[i];
        if e.action == TraceAction::SegmentUnmap {
            // Fully unmapped, a reservation is released.
            let x_mapped = &mut self.begin.x_mapped;
            if let Some(m) = xseg_containing(xsegs, e.addr).and_then(|b| x_mapped.get_mut(&b)) {
                *m = m.saturating_sub(e.size);
            }
        }
        self.segment_event(e, false);
        let release =
            |a: TraceAction| matches!(a, TraceAction::SegmentFree | TraceAction::SegmentUnmap);
        let run_start = i == 0 || !release(events[i - 1].action);
        if !run_start {
            self.pools.segment_free(e);
            return;
        }
        let run_len = events[i..].iter().take_while(|x| release(x.action)).count();
        let after = events.get(i + run_len);
        let followed_by_oom = after.is_some_and(|x| x.action == TraceAction::Oom);
        // A flush followed by a new segment that would not have
        // fit on the device without it is the allocator's own
        // free-and-retry, not the user's `empty_cache()`.
        let known_capacity = self.begin.capacity;
        let reserved_before = self.begin.reserved_before[i];
        let retry = after.is_some_and(|x| {
            matches!(
                x.action,
                TraceAction::SegmentAlloc | TraceAction::SegmentMap
            ) && known_capacity.is_some_and(|c| reserved_before.saturating_add(x.size) > c)
        });
        let user = !followed_by_oom && !retry;
        for op in self.pools.release_run(&events[i..i + run_len], user) {
            self.push(op, i);
        }
        self.pools.segment_free(e);
        if user {
            self.empty_caches += 1;
        }
    }
}

/// With no OOM to tell the device's capacity: one whose expandable
/// reservations fit between the recorded ones (reservations must not
/// overlap), when that is less than the default.
fn capacity_between_reservations(
    xsegs: &BTreeMap<u64, XSeg>,
    config: &AllocatorConfig,
) -> Option<u64> {
    let bases: Vec<u64> = xsegs.keys().copied().collect();
    let gap = bases.windows(2).map(|w| w[1] - w[0]).min()?;
    let c = capacity_for_gap(gap, config.large_segment_size);
    (c < reservoir::sim::DEFAULT_CAPACITY).then_some(c)
}

/// Reserved bytes before each entry (`reserved` before the first), and the
/// capacity the first `oom` entry tells (`device_free` + reserved).
fn reserved_before(events: &[TraceEntry], reserved: u64) -> (Vec<u64>, Option<u64>) {
    let mut reserved_before = Vec::with_capacity(events.len());
    let mut r = reserved;
    let mut oom_capacity = None;
    for e in events {
        reserved_before.push(r);
        match e.action {
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => r += e.size,
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => r = r.saturating_sub(e.size),
            TraceAction::Oom if oom_capacity.is_none() => {
                oom_capacity = Some(e.addr.saturating_add(r));
            }
            _ => {}
        }
    }
    (reserved_before, oom_capacity)
}
