//! The replay engine: run an oracle trace through a [`CachingAllocator`] on
//! a [`SimDevice`] and measure what the allocator did.
//!
//! The engine drives its allocator through [`ReplayTarget`] (the caching
//! allocator is the default target, [`Replay::new`]; any other allocator
//! implementing the trait runs through [`Replay::build`]), so everything
//! built on it, the recorded-snapshot replay, the fidelity report and the
//! reports of `reservoir replay`, works for every target.
//!
//! A [`Trace`] (from a file, or from a built-in [workload](crate::workload))
//! is replayed once per [`ReplaySetting`], a named
//! `PYTORCH_CUDA_ALLOC_CONF`-style string, on a simulated device of a given
//! capacity. Every op of the oracle's format is handled as
//! `../shared/oracle/oracle_replay.py` handles it on the real allocator:
//!
//! | op | engine |
//! |---|---|
//! | `a <id> <bytes> [stream]` | [`CachingAllocator::raw_alloc`] on the stream (or the current one); an out-of-memory error is counted and the replay goes on |
//! | `f <id>` | [`CachingAllocator::raw_free`]; ignored if the allocation of `id` failed |
//! | `e` | [`CachingAllocator::empty_cache`] |
//! | `s <stream>` | the current stream changes |
//! | `r <id> <stream>` | [`CachingAllocator::record_stream`]; ignored if the allocation failed |
//! | `k <stream> [<id>...]` | [`SimDevice::enqueue_work`], once per live id (once if none) |
//! | `h` / `u <stream>` | [`SimDevice::hold_stream`] / [`SimDevice::release_stream`] |
//! | `y [<stream>]` | [`SimDevice::synchronize_stream`] / [`SimDevice::synchronize_all`] |
//! | `w <s1> <s2>` | an event recorded on `s2`, waited for by `s1` (`wait_stream`) |
//! | `p <pool>` / `x <pool>` / `e <pool>` | [`CachingAllocator::begin_allocate_to_pool`] (every allocation) and [`CachingAllocator::end_allocate_to_pool`] around each run of allocations in a private pool / [`CachingAllocator::release_pool`] / [`CachingAllocator::empty_cache_pool`] (see `pools.rs`) |
//!
//! Streams are named in traces; [`StreamTable::resolve`] maps names to
//! [`StreamId`]s: `0`/`default` is [`StreamId::DEFAULT`], other names are
//! numbered 1, 2, ... in the order the replay first uses them (the order in
//! which the oracle creates its streams).
//!
//! Anything else the oracle refuses (freeing or recording an id that is not
//! live and did not fail, allocating an id that is live) stops the replay
//! with a [`ReplayError::Trace`] naming the op and its line.
//!
//! The simulated device follows the fake CUDA driver's completion model
//! ([`HoldSemantics::EnqueuedWork`]) and charges its driver cost model
//! ([`SimCounters::driver_time_ns`](reservoir::sim::SimCounters::driver_time_ns)).
//!
//! The result is a [`ReplayReport`]: peaks, fragmentation, the state at the
//! peak, driver calls, out-of-memory errors, simulated driver time, the
//! allocator's own wall time per call, the final `memory_stats()` and a
//! downsampled time series. Its JSON keys are documented on
//! [`ReplayReport`] and stable.
//!
//! ```
//! use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting};
//! use reservoir_replay::workload;
//!
//! let trace = workload::generate("gpt-train:layers=2,steps=2").unwrap();
//! let setting = ReplaySetting::parse("max-split-128=max_split_size_mb:128").unwrap();
//! let report = replay(&trace, &setting, &ReplayOptions::default()).unwrap();
//! assert_eq!(report.setting, "max-split-128");
//! assert!(report.peak_reserved >= report.peak_allocated);
//! assert_eq!(report.ooms, 0);
//! ```

pub mod capacity;
pub mod diagnose;
pub mod explain;
pub mod frames;
pub mod levers;
pub mod lints;
mod live;
mod measure;
mod pools;
pub mod recorded;
mod report;
pub mod roles;
mod run;
mod setting;
pub mod sites;
mod start;
mod target;
#[cfg(test)]
mod tests;

pub use report::{OomRecord, PeakState, ReplayReport, Sample};
pub use run::{replay, replay_all, run_setting, segments_at};
pub use setting::{AllocatorKind, ReplayError, ReplayOptions, ReplaySetting};
pub use start::{StartState, StreamTable};
pub use target::ReplayTarget;

use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use live::{IdState, LiveIds};
use measure::{CallTimer, Sampler, SCAN_BUDGET_START, SCAN_CREDIT_PER_OP};
use reservoir::backend::{Backend, BackendError, DevicePtr, StreamId};
use reservoir::caching::CachingAllocator;
use reservoir::error::AllocError;
use reservoir::sim::{AddressPolicy, HoldSemantics, SimConfig, SimDevice};

/// A replay in progress: the allocator, the device and the measurements.
///
/// [`replay`] runs one to the end; use this type to step through a trace or
/// to inspect the allocator afterwards.
pub struct Replay<'t, T: ReplayTarget = CachingAllocator<SimDevice>> {
    trace: &'t Trace,
    start: Option<&'t StartState>,
    /// Driver time spent seeding, not reported.
    seed_driver_time_ns: u64,
    /// Address returned by each allocation op (0 when it failed), when
    /// [`StartState::record_placements`] is set.
    placements: Option<Vec<u64>>,
    setting: ReplaySetting,
    capacity: u64,
    alloc: T,
    streams: StreamTable,
    current: StreamId,
    live: LiveIds,
    next: usize,
    alloc_ops: u64,
    free_ops: u64,
    timer: CallTimer,
    ooms: u64,
    first_oom: Option<OomRecord>,
    options: ReplayOptions,
    peak_reserved_seen: u64,
    /// The state at the latest peak, if it was scanned.
    peak: Option<PeakState>,
    /// The latest peak (op, allocated, reserved) when it was not scanned.
    peak_pending: Option<(usize, u64, u64)>,
    /// Whether to look at peaks at all (not in a re-run).
    track_peak: bool,
    /// Block visits the peak scans may still spend (see `observe`).
    scan_budget: u64,
    scan_credit_per_op: u64,
    last_scan_cost: u64,
    sampler: Sampler,
    /// The private pool allocations are routed to now.
    routing: pools::PoolRouting,
    /// The private pools created and not released.
    pools: std::collections::BTreeSet<reservoir::ids::MempoolId>,
}

impl<T: ReplayTarget> std::fmt::Debug for Replay<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("setting", &self.setting)
            .field("capacity", &self.capacity)
            .field("next_op", &self.next)
            .field("ops", &self.trace.ops.len())
            .finish_non_exhaustive()
    }
}

/// The id of a stream name in `streams`; a new name becomes a stream of the
/// simulated device.
fn device_stream(
    streams: &mut StreamTable,
    alloc: &impl ReplayTarget,
    name: &StreamName,
) -> StreamId {
    let (id, new) = streams.resolve(name);
    if new {
        alloc.device().register_stream(id);
    }
    id
}

impl<'t> Replay<'t> {
    /// Prepare to replay `trace` with `setting` on a fresh simulated device.
    pub fn new(
        trace: &'t Trace,
        setting: &ReplaySetting,
        options: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
        Self::build(trace, None, setting, options)
    }

    /// Prepare to replay `trace` from `start`: the device hands out the
    /// scripted addresses, the start state's segments are seeded (and not
    /// counted: stats, peaks and driver counters start from the seeded
    /// state), then the trace's ops run as usual.
    pub fn with_start(
        trace: &'t Trace,
        start: &'t StartState,
        setting: &ReplaySetting,
        options: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
        Self::build(trace, Some(start), setting, options)
    }
}

/// The simulated device a replay runs on: `capacity` bytes, and from a
/// recorded start, the recorded segment addresses handed out in order.
fn replay_device(start: Option<&StartState>, capacity: u64) -> SimDevice {
    let address_policy = match start {
        Some(st) => AddressPolicy::Scripted(
            st.segments
                .iter()
                .map(|s| s.0)
                .chain(st.expandable.iter().map(|s| s.0))
                .chain(st.scripted_addresses.iter().copied())
                .collect(),
        ),
        None => AddressPolicy::default(),
    };
    SimDevice::new(SimConfig {
        capacity,
        hold_semantics: HoldSemantics::EnqueuedWork,
        address_policy,
        ..SimConfig::default()
    })
}

impl<'t, T: ReplayTarget> Replay<'t, T> {
    /// Prepare to replay `trace` through the target `T` (a fresh one on a
    /// fresh simulated device), from `start` when given (see
    /// [`Replay::with_start`]).
    pub fn build(
        trace: &'t Trace,
        start: Option<&'t StartState>,
        setting: &ReplaySetting,
        options: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
        if options.capacity > capacity::MAX_CAPACITY {
            return Err(ReplayError::Capacity {
                capacity: options.capacity,
            });
        }
        let config = setting.allocator_config()?;
        let device = replay_device(start, options.capacity);
        // The recorded device's index (PyTorch's `DeviceIndex` is an i8).
        let index = start.map_or(0, |s| i8::try_from(s.device).unwrap_or(i8::MAX));
        let alloc = T::on_device_index(device, config, index);
        let seeded = start.map_or(0, |st| {
            let ids = |v: &[AllocId]| v.len() as u64;
            st.segments.iter().map(|s| ids(&s.2)).sum::<u64>()
                + st.expandable.iter().map(|s| ids(&s.2)).sum::<u64>()
        });
        let mut live = LiveIds::with_dense_limit(trace.ops.len() as u64 + seeded + 1);
        let mut streams = if start.is_some_and(|s| s.literal_streams) {
            StreamTable::literal()
        } else {
            StreamTable::new()
        };
        let mut seed_driver_time_ns = 0;
        let mut pools = std::collections::BTreeSet::new();
        if let Some(st) = start {
            alloc.rank_segments_by_address(st.address_order);
            // Name each segment's stream once per run of segments on it.
            let mut named = None;
            let mut name_stream = |streams: &mut StreamTable, stream: StreamId| {
                if named != Some(stream) {
                    device_stream(streams, &alloc, &StreamName::new(stream.0.to_string()));
                    named = Some(stream);
                }
            };
            for (k, (_, seg, ids)) in st.segments.iter().enumerate() {
                name_stream(&mut streams, seg.stream);
                let ptrs = match st.segment_pools.get(&k) {
                    Some(&(a, b)) => {
                        pools.insert(reservoir::ids::MempoolId(a, b));
                        alloc.seed_segment_blocks_in_pool(seg, reservoir::ids::MempoolId(a, b))
                    }
                    None => alloc.seed_segment_blocks(seg),
                }
                .map_err(|source| ReplayError::Seed { segment: k, source })?;
                for (&id, ptr) in ids.iter().zip(ptrs) {
                    live.set(id, IdState::Live(ptr));
                }
            }
            for (k, (_, seg, ids)) in st.expandable.iter().enumerate() {
                name_stream(&mut streams, seg.stream);
                let ptrs =
                    alloc
                        .seed_expandable_blocks(seg)
                        .map_err(|source| ReplayError::Seed {
                            segment: st.segments.len() + k,
                            source,
                        })?;
                for (&id, ptr) in ids.iter().zip(ptrs) {
                    live.set(id, IdState::Live(ptr));
                }
            }
            alloc.reset_accumulated_stats();
            alloc.reset_peak_stats();
            seed_driver_time_ns = alloc.device().counters().driver_time_ns;
            if st.record_placements {
                alloc.device().set_call_log(true);
            }
        }
        Ok(Replay {
            trace,
            start,
            seed_driver_time_ns,
            placements: start
                .filter(|s| s.record_placements)
                .map(|_| Vec::with_capacity(trace.ops.len())),
            setting: setting.clone(),
            capacity: options.capacity,
            alloc,
            streams,
            current: StreamId::DEFAULT,
            live,
            next: 0,
            alloc_ops: 0,
            free_ops: 0,
            timer: CallTimer::new(if trace.ops.len() < 100_000 && start.is_none() {
                1
            } else {
                options.time_one_in
            }),
            ooms: 0,
            first_oom: None,
            options: options.clone(),
            peak_reserved_seen: 0,
            peak: None,
            peak_pending: None,
            track_peak: true,
            scan_budget: SCAN_BUDGET_START,
            scan_credit_per_op: SCAN_CREDIT_PER_OP,
            last_scan_cost: 0,
            sampler: Sampler::new(trace.ops.len(), options.max_samples.max(2)),
            routing: pools::PoolRouting::default(),
            pools,
        })
    }

    /// The allocator being driven.
    pub fn allocator(&self) -> &T {
        &self.alloc
    }

    /// The simulated device.
    pub fn device(&self) -> &SimDevice {
        self.alloc.device()
    }

    /// The address each allocation op returned so far (0 for a failed one),
    /// when the start state asked for it.
    pub fn placements(&self) -> Option<&[u64]> {
        self.placements.as_deref()
    }

    /// The device calls made since seeding (allocations, frees, maps and
    /// unmaps), when the start state asked for them.
    pub fn segment_calls(&self) -> Vec<reservoir::sim::DeviceCall> {
        self.alloc.device().call_log()
    }

    /// The stream names seen so far and their ids.
    pub fn streams(&self) -> &StreamTable {
        &self.streams
    }

    /// Index of the next op to run (the trace's length when finished).
    pub fn position(&self) -> usize {
        self.next
    }

    /// True when every op has run.
    pub fn is_done(&self) -> bool {
        self.next >= self.trace.ops.len()
    }

    /// The device pointer of a live trace id (null for a zero-byte one).
    pub fn pointer(&self, id: AllocId) -> Option<DevicePtr> {
        self.live.pointer(id)
    }

    /// Run every remaining op.
    pub fn run(&mut self) -> Result<(), ReplayError> {
        self.run_with_progress(&mut |_| {})
    }

    /// Run every remaining op, calling `progress` with the number of ops done
    /// every 65 536 ops and at the end.
    pub fn run_with_progress(
        &mut self,
        progress: &mut dyn FnMut(usize),
    ) -> Result<(), ReplayError> {
        const CHUNK: usize = 1 << 16;
        while !self.is_done() {
            let end = (self.next + CHUNK).min(self.trace.ops.len());
            while self.next < end {
                self.step_inner()?;
            }
            progress(self.next);
        }
        Ok(())
    }

    /// Run the next op. Returns false when there was none.
    pub fn step(&mut self) -> Result<bool, ReplayError> {
        if self.is_done() {
            return Ok(false);
        }
        self.step_inner()?;
        Ok(true)
    }

    fn line(&self, op: usize) -> usize {
        self.trace.lines.get(op).copied().unwrap_or(op + 1)
    }

    fn trace_error(&self, op: usize, message: String) -> ReplayError {
        ReplayError::Trace {
            op,
            line: self.line(op),
            message,
        }
    }

    fn alloc_error(&self, op: usize, source: AllocError) -> ReplayError {
        ReplayError::Allocator {
            op,
            line: self.line(op),
            source,
        }
    }

    fn device_error(&self, op: usize, source: BackendError) -> ReplayError {
        ReplayError::Device {
            op,
            line: self.line(op),
            source,
        }
    }

    /// The id of a stream name; a new name becomes a stream of the device.
    fn stream(&mut self, name: &StreamName) -> StreamId {
        device_stream(&mut self.streams, &self.alloc, name)
    }

    #[inline(always)]
    fn step_inner(&mut self) -> Result<(), ReplayError> {
        let i = self.next;
        let trace = self.trace;
        let op = &trace.ops[i];
        self.next += 1;
        match op {
            Op::Alloc { id, bytes, stream } => self.op_alloc(i, *id, *bytes, stream.as_ref()),
            Op::Free { id } => self.op_free(i, *id),
            Op::EmptyCache => {
                let t0 = self.timer.start();
                let r = self.alloc.empty_cache();
                self.timer.stop(t0);
                r.map_err(|e| self.alloc_error(i, e))?;
                self.observe(i);
                Ok(())
            }
            Op::SetStream { stream } => {
                self.current = self.stream(stream);
                Ok(())
            }
            Op::RecordStream { id, stream } => self.op_record_stream(i, *id, stream),
            Op::Kernel { stream, ids } => self.op_kernel(i, stream, ids),
            Op::Hold { stream } => {
                let s = self.stream(stream);
                self.device()
                    .hold_stream(s)
                    .map_err(|e| self.device_error(i, e))
            }
            Op::Release { stream } => {
                let s = self.stream(stream);
                self.device()
                    .release_stream(s)
                    .map_err(|e| self.device_error(i, e))
            }
            Op::Sync { stream: None } => {
                self.device().synchronize_all();
                Ok(())
            }
            Op::Sync {
                stream: Some(stream),
            } => {
                let s = self.stream(stream);
                self.device()
                    .synchronize_stream(s)
                    .map_err(|e| self.device_error(i, e))
            }
            Op::Wait { waiter, waited } => self.op_wait(i, waiter, waited),
            Op::UsePool { pool } => self.op_use_pool(i, *pool),
            Op::ReleasePool { pool } => self.op_release_pool(i, *pool),
            Op::EmptyPool { pool } => self.op_empty_pool(i, *pool),
        }
    }

    /// `a <id> <bytes> [stream]` (op `i`): allocate; an out-of-memory
    /// error is counted and the replay goes on.
    #[inline(always)]
    fn op_alloc(
        &mut self,
        i: usize,
        id: AllocId,
        bytes: u64,
        stream: Option<&StreamName>,
    ) -> Result<(), ReplayError> {
        if let Some(IdState::Live(_)) = self.live.get(id) {
            return Err(self.trace_error(i, format!("id {id} is already live")));
        }
        let s = match stream {
            Some(name) => self.stream(name),
            None => self.current,
        };
        self.alloc_ops += 1;
        let t0 = self.timer.start();
        let r = self.alloc.alloc(bytes, s);
        self.timer.stop(t0);
        if let Some(p) = self.placements.as_mut() {
            p.push(r.as_ref().map_or(0, |ptr| ptr.0));
        }
        match r {
            Ok(ptr) => self.live.set(id, IdState::Live(ptr)),
            Err(AllocError::OutOfMemory(e)) => self.note_oom(i, id, bytes, s, e.message)?,
            // The device ran out of memory where PyTorch, and so the
            // allocator, does not turn that into its own
            // out-of-memory error: the address range of a new
            // expandable segment cannot be reserved (pages of
            // `large_segment_size_mb:1000000000` are larger than
            // the address space; PyTorch checks
            // `cuMemAddressReserve` with `C10_CUDA_DRIVER_CHECK`, a
            // "CUDA driver error: out of memory"). A page the device
            // cannot map is the allocator's own OOM above. The
            // program cannot run under this setting all the same,
            // which its report says (with the device's words),
            // rather than failing the replay of every setting.
            Err(AllocError::Backend(e)) if e.is_retryable() => {
                self.note_oom(i, id, bytes, s, format!("device error: {e}"))?
            }
            Err(e) => return Err(self.alloc_error(i, e)),
        }
        self.observe(i);
        Ok(())
    }

    /// `f <id>` (op `i`): free; ignored if the allocation of `id` failed.
    #[inline(always)]
    fn op_free(&mut self, i: usize, id: AllocId) -> Result<(), ReplayError> {
        match self.live.take(id) {
            Some(IdState::Live(ptr)) => {
                self.free_ops += 1;
                let t0 = self.timer.start();
                let r = self.alloc.free(ptr);
                self.timer.stop(t0);
                r.map_err(|e| self.alloc_error(i, e))?;
                self.observe(i);
                Ok(())
            }
            Some(IdState::Failed) => Ok(()),
            None => Err(self.trace_error(i, format!("free of id {id}, which is not live"))),
        }
    }

    /// `r <id> <stream>` (op `i`): record the stream's use of `id`; ignored
    /// if the allocation failed.
    #[inline(always)]
    fn op_record_stream(
        &mut self,
        i: usize,
        id: AllocId,
        stream: &StreamName,
    ) -> Result<(), ReplayError> {
        match self.live.get(id) {
            Some(IdState::Live(ptr)) => {
                let s = self.stream(stream);
                let t0 = self.timer.start();
                let r = self.alloc.record_stream(ptr, s);
                self.timer.stop(t0);
                r.map_err(|e| self.alloc_error(i, e))
            }
            Some(IdState::Failed) => Ok(()),
            None => {
                Err(self.trace_error(i, format!("record_stream of id {id}, which is not live")))
            }
        }
    }

    /// `k <stream> [<id>...]` (op `i`): work enqueued on the stream, once
    /// per live id (once if none).
    #[inline(always)]
    fn op_kernel(
        &mut self,
        i: usize,
        stream: &StreamName,
        ids: &[AllocId],
    ) -> Result<(), ReplayError> {
        let s = self.stream(stream);
        let n = ids
            .iter()
            .filter(|&&x| self.live.pointer(x).is_some())
            .count()
            .max(1);
        for _ in 0..n {
            self.device()
                .enqueue_work(s)
                .map_err(|e| self.device_error(i, e))?;
        }
        Ok(())
    }

    /// `w <s1> <s2>` (op `i`): an event recorded on `waited`, waited for by
    /// `waiter`.
    #[inline(always)]
    fn op_wait(
        &mut self,
        i: usize,
        waiter: &StreamName,
        waited: &StreamName,
    ) -> Result<(), ReplayError> {
        let a = self.stream(waiter);
        let b = self.stream(waited);
        let dev = self.alloc.device();
        let r = dev.record_event(b).and_then(|ev| {
            let w = dev.wait_event(a, ev);
            let d = dev.destroy_event(ev);
            w.and(d)
        });
        r.map_err(|e| self.device_error(i, e))
    }

    /// Allocation op `i` of `id` (`bytes` on `stream`) ran out of memory:
    /// count it, remember the first, and ignore later frees of `id`; stop
    /// when there are more than [`ReplayOptions::max_ooms`].
    #[cold]
    fn note_oom(
        &mut self,
        i: usize,
        id: AllocId,
        bytes: u64,
        stream: StreamId,
        message: String,
    ) -> Result<(), ReplayError> {
        self.ooms += 1;
        self.live.set(id, IdState::Failed);
        if self.first_oom.is_none() {
            self.first_oom = Some(OomRecord {
                op: i as u64,
                line: self.line(i) as u64,
                id,
                bytes,
                stream: stream.0,
                message,
            });
        }
        if let Some(limit) = self.options.max_ooms {
            if self.ooms > limit {
                return Err(ReplayError::TooManyOoms {
                    op: i,
                    line: self.line(i),
                    ooms: self.ooms,
                    limit,
                });
            }
        }
        Ok(())
    }

    /// Note the state after op `i`, which may have changed the allocator's
    /// bytes.
    ///
    /// Each new peak of reserved bytes is scanned (segments and blocks) for
    /// the state at the peak. Scans cost as much as the allocator has
    /// blocks, and a growing trace makes a new peak with every segment, so
    /// they draw on a budget that grows with the ops replayed: when it runs
    /// short, the peak is only noted, and [`report`](Self::report) replays
    /// the trace again up to the last unscanned peak to scan it there (the
    /// replay is deterministic). The numbers are exact either way; the cost
    /// stays linear in the trace.
    #[inline(always)]
    fn observe(&mut self, i: usize) {
        let (allocated, reserved) = self.alloc.allocated_and_reserved();
        self.scan_budget = self.scan_budget.saturating_add(self.scan_credit_per_op);
        if reserved > self.peak_reserved_seen && self.track_peak {
            self.peak_reserved_seen = reserved;
            if self.scan_budget >= self.last_scan_cost {
                let (state, cost) = self.peak_state(i, allocated, reserved);
                self.scan_budget -= cost.min(self.scan_budget);
                self.last_scan_cost = cost;
                self.peak = Some(state);
                self.peak_pending = None;
            } else {
                self.peak_pending = Some((i, allocated, reserved));
            }
        }
        self.sampler.push(Sample {
            op: i as u64,
            allocated,
            reserved,
        });
    }

    /// The state now (after op `op`), and what the scan cost (segments plus
    /// blocks visited).
    fn peak_state(&self, op: usize, allocated: u64, reserved: u64) -> (PeakState, u64) {
        let sum = self.alloc.layout_summary();
        let state = PeakState {
            op: op as u64,
            allocated,
            reserved,
            segments: sum.segments,
            free_blocks: sum.free_blocks,
            largest_free_block: sum.largest_free_block,
        };
        (state, sum.segments + sum.blocks)
    }

    /// The state at the last peak, replaying again up to it if it was not
    /// scanned.
    fn peak_report(&self) -> Option<PeakState> {
        let Some((op, allocated, reserved)) = self.peak_pending else {
            return self.peak.clone();
        };
        let rerun = || -> Result<PeakState, ReplayError> {
            let mut r = Self::build(self.trace, self.start, &self.setting, &self.options)?;
            r.track_peak = false;
            r.placements = None;
            r.alloc.device().set_call_log(false);
            while r.next <= op {
                r.step_inner()?;
            }
            Ok(r.peak_state(op, allocated, reserved).0)
        };
        match rerun() {
            Ok(state) => Some(state),
            Err(e) => {
                // Cannot happen: the same ops already ran without error.
                tracing::warn!("replaying again up to the peak failed: {e}");
                Some(PeakState {
                    op: op as u64,
                    allocated,
                    reserved,
                    segments: 0,
                    free_blocks: 0,
                    largest_free_block: 0,
                })
            }
        }
    }

    /// The report of what has run so far.
    pub fn report(&self) -> ReplayReport {
        let stats = self.alloc.stats();
        let peak_allocated = stats.allocated_bytes.all().peak.max(0) as u64;
        let peak_reserved = stats.reserved_bytes.all().peak.max(0) as u64;
        let fragmentation =
            (peak_allocated > 0).then(|| peak_reserved as f64 / peak_allocated as f64);
        let peak = self.peak_report();
        let counters = self.alloc.device().counters();
        let mean = self.timer.mean_ns();
        ReplayReport {
            setting: self.setting.name.clone(),
            config: self.setting.config.clone(),
            allocator: self.setting.allocator.name().into(),
            capacity: self.capacity,
            ops: self.next as u64,
            alloc_ops: self.alloc_ops,
            free_ops: self.free_ops,
            peak_allocated,
            peak_reserved,
            peak_live: stats.requested_bytes.all().peak.max(0) as u64,
            fragmentation,
            reserved_unallocated_at_peak: peak.as_ref().map_or(0, |p| p.reserved - p.allocated),
            largest_free_block_at_peak: peak.as_ref().map_or(0, |p| p.largest_free_block),
            peak,
            driver_allocs: stats.num_device_alloc.max(0) as u64,
            driver_frees: stats.num_device_free.max(0) as u64,
            ooms: self.ooms,
            first_oom: self.first_oom.clone(),
            driver_time_ns: counters
                .driver_time_ns
                .saturating_sub(self.seed_driver_time_ns),
            allocator_calls: self.timer.calls,
            allocator_timed_calls: self.timer.timed,
            allocator_time_ns: (mean * self.timer.calls as f64) as u64,
            allocator_ns_per_op: mean,
            allocator_ns_p50: self.timer.quantile(0.5),
            allocator_ns_p99: self.timer.quantile(0.99),
            streams: self
                .streams
                .streams()
                .iter()
                .map(|(n, id)| (n.clone(), id.0))
                .collect(),
            memory_stats: stats.to_flat(),
            samples: self.sampler.snapshot(),
        }
    }
}
