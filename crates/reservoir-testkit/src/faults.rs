//! Fault injection: a backend wrapper that fails the N-th call of any of its
//! entry points, and a deterministic multi-stream workload that drives an
//! allocator over it and checks what a failed call must leave.
//!
//! [`FaultyBackend`] forwards every call of the [`Backend`] contract and of
//! each optional capability the wrapped backend offers
//! ([`VirtualMemory`], [`Memcpy`], [`DeviceWork`], [`HostWrite`], [`Ipc`],
//! [`HostMapping`]) and counts them per [`EntryPoint`]. Armed with
//! [`fail_nth`](FaultyBackend::fail_nth), it answers one chosen call with a
//! non-retryable [`BackendError::Driver`] instead of forwarding it, so
//! nothing happens on the wrapped device. It also keeps its own count of
//! what is live on the device ([`LiveCounts`]: allocations, mapped bytes,
//! reservations, events), whatever the wrapped backend is.
//!
//! [`run`] drives one allocator (a [`Subject`]: the [`Caching`] allocator
//! or the MPS heap allocator, [`HeapSubject`]) through a [`workload`] over
//! a [`FaultyBackend<SimDevice>`](reservoir::sim::SimDevice) and checks,
//! after every operation, the allocator's invariant checker; for each
//! failed allocation that the in-use counters did not change; for each
//! failed free that it said so ([`AllocError::FreeFailed`]) and changed
//! nothing; at the end, with the fault cleared, that everything can be
//! freed, the cache emptied and nothing is left reserved, on the
//! allocator's counters and on the device's, and that closing (or
//! dropping) the allocator leaves nothing on the device. [`sweep`] runs it
//! for every entry point the allocator calls, failing at its N-th call,
//! in every mode given.

use std::sync::atomic::Ordering;

use reservoir::backend::{Backend, DevicePtr, StreamId};
#[cfg(doc)]
use reservoir::backend::{
    BackendError, DeviceWork, HostMapping, HostWrite, Ipc, Memcpy, VirtualMemory,
};
use reservoir::caching::{CachingAllocator, PoolFilter};
use reservoir::config::AllocatorConfig;
use reservoir::error::AllocError;
use reservoir::ids::MempoolId;
use reservoir::observe::snapshot::Segment;
use reservoir::rng::SplitMix64;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::stats::DeviceStats;

mod backend;
mod heap;

pub use backend::{EntryPoint, FaultyBackend, LiveCounts};
pub use heap::HeapSubject;

/// Streams of the [`workload`]: the default stream and three created ones.
pub const STREAMS: usize = 4;

/// One operation of the fault-injection [`workload`]. Blocks are picked
/// among the live ones by `pick % live`; streams by index into the run's
/// [`STREAMS`] streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes on stream `stream`.
    Alloc {
        /// Bytes requested.
        size: u64,
        /// Stream index.
        stream: usize,
    },
    /// Free a live block.
    Free {
        /// Which live block.
        pick: u64,
    },
    /// `record_stream` a live block on stream `stream` (a cross-stream use:
    /// its free records events).
    RecordStream {
        /// Which live block.
        pick: u64,
        /// Stream index.
        stream: usize,
    },
    /// Hold stream `stream` (its events stay pending until released).
    Hold {
        /// Stream index (never the default stream).
        stream: usize,
    },
    /// Release a held stream.
    Release {
        /// Stream index.
        stream: usize,
    },
    /// `empty_cache`.
    EmptyCache,
    /// Route stream `stream`'s allocations to a new private pool (a graph
    /// capture): frees of blocks with cross-stream uses defer their events.
    /// An allocator without private pools maps it onto a call of its own
    /// ([`Subject::begin`]).
    BeginPool {
        /// Stream index.
        stream: usize,
    },
    /// End the private-pool allocation underway and release the pool (or
    /// the allocator's own call, [`Subject::end`]).
    EndPool,
}

/// A deterministic multi-stream workload of `ops` operations from `seed`:
/// allocations from bytes to hundreds of MiB (some too large for a 1 GiB
/// device once others are live), frees, cross-stream uses and frees,
/// held streams, `empty_cache` calls and private-pool allocations.
pub fn workload(seed: u64, ops: usize) -> Vec<Op> {
    const MIB: u64 = 1 << 20;
    let mut rng = SplitMix64::new(seed);
    let mut range = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo);
    let mut out = Vec::with_capacity(ops);
    while out.len() < ops {
        let roll = range(0, 100);
        let stream = range(0, STREAMS as u64) as usize;
        let other = range(1, STREAMS as u64) as usize;
        let pick = range(0, u64::MAX);
        let op = match roll {
            0..=39 => {
                let size = match range(0, 100) {
                    0..=39 => range(1, MIB),
                    40..=69 => range(MIB, 20 * MIB),
                    70..=93 => range(20 * MIB, 120 * MIB),
                    _ => range(300 * MIB, 900 * MIB),
                };
                Op::Alloc { size, stream }
            }
            40..=71 => Op::Free { pick },
            72..=85 => Op::RecordStream {
                pick,
                stream: other,
            },
            86..=88 => Op::Hold { stream: other },
            89..=93 => Op::Release { stream: other },
            94..=95 => Op::EmptyCache,
            96..=97 => Op::BeginPool { stream },
            _ => Op::EndPool,
        };
        out.push(op);
    }
    out
}

/// The device a fault-injection run allocates from.
/// The device a fault-injection run allocates from.
pub type FaultySim = std::sync::Arc<FaultyBackend<SimDevice>>;

/// An allocator that [`run`] drives over a [`FaultySim`]: it maps each
/// [`Op`] onto its own calls and answers what the checks ask.
/// [`Caching`] is the caching allocator, [`HeapSubject`] the MPS heap
/// allocator.
pub trait Subject: Sized {
    /// The allocator's settings: one mode of a [`sweep`].
    type Mode: Clone + Send + Sync;
    /// What a failed free must leave unchanged.
    type Counters: PartialEq + std::fmt::Debug;
    /// The allocator on `dev`. An error must come from a failed backend
    /// call (the injected fault) and leave nothing behind: it is tried
    /// again.
    fn new(dev: FaultySim, mode: &Self::Mode) -> Result<Self, AllocError>;
    /// The mode in words, for messages.
    fn describe(mode: &Self::Mode) -> String;
    /// Allocate `size` bytes on `stream`, the run's stream number `k` (an
    /// allocator without streams may pick a kind of memory by it).
    fn alloc(&mut self, size: u64, stream: StreamId, k: usize) -> Result<DevicePtr, AllocError>;
    /// Free a live block: [`AllocError::FreeFailed`] when nothing was freed.
    fn free(&mut self, ptr: DevicePtr) -> Result<(), AllocError>;
    /// Is `ptr` still a block handed out?
    fn is_allocated(&self, ptr: DevicePtr) -> bool;
    /// Use the live block `ptr` on `stream` (its free then waits for that
    /// work); `pick` may choose among the allocator's ways of saying so.
    fn use_on(&mut self, ptr: DevicePtr, stream: StreamId, pick: u64) -> Result<(), AllocError>;
    /// `empty_cache`.
    fn empty_cache(&mut self) -> Result<(), AllocError>;
    /// [`Op::BeginPool`].
    fn begin(&mut self, stream: StreamId);
    /// [`Op::EndPool`]; `live` are the blocks handed out.
    fn end(&mut self, live: &[DevicePtr]);
    /// With the fault cleared, before everything is freed: end what
    /// [`begin`](Self::begin) started. What failed.
    fn settle(&mut self) -> Vec<String>;
    /// The statistics.
    fn stats(&self) -> DeviceStats;
    /// What a failed free must leave unchanged.
    fn counters(&self) -> Self::Counters;
    /// The allocator's invariant checker.
    fn check_invariants(&self) -> Result<(), String>;
    /// What the allocator keeps reserved by design once every block is
    /// freed and the cache emptied (bytes, device allocations): it must
    /// give it back when closed.
    fn kept_after_empty_cache(&self) -> (i64, i64) {
        (0, 0)
    }
    /// Close or drop the allocator, giving everything back. What failed.
    fn close(self) -> Vec<String>;
}

/// The counters a failed allocation must leave as they were: allocations
/// and allocated bytes (current values). Active ones may fall: a failed
/// allocation may wait for pending frees, which then complete.
fn in_use_counters(s: &DeviceStats) -> [i64; 2] {
    [s.allocation.all().current, s.allocated_bytes.all().current]
}

/// The caching allocator as a [`Subject`]: [`Op::BeginPool`] routes a
/// stream to a new private pool, [`Op::EndPool`] ends and releases it.
pub struct Caching {
    a: CachingAllocator<FaultySim>,
    pool: Option<MempoolId>,
    pools_made: u64,
}

impl Subject for Caching {
    type Mode = AllocatorConfig;
    type Counters = (DeviceStats, Vec<Segment>);

    fn new(dev: FaultySim, mode: &AllocatorConfig) -> Result<Caching, AllocError> {
        Ok(Caching {
            a: CachingAllocator::new(dev, mode.clone()),
            pool: None,
            pools_made: 0,
        })
    }
    fn describe(config: &AllocatorConfig) -> String {
        if config.policy == reservoir::config::ReservoirPolicy::Reservoir {
            "reservoir policy".into()
        } else if config.expandable_segments {
            "expandable segments".into()
        } else {
            "PyTorch mode".into()
        }
    }
    fn alloc(&mut self, size: u64, stream: StreamId, _: usize) -> Result<DevicePtr, AllocError> {
        self.a.raw_alloc(size, stream)
    }
    fn free(&mut self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.a.raw_free(ptr)
    }
    fn is_allocated(&self, ptr: DevicePtr) -> bool {
        !matches!(
            self.a.base_allocation(ptr),
            Err(AllocError::InvalidPointer { .. })
        )
    }
    fn use_on(&mut self, ptr: DevicePtr, stream: StreamId, _: u64) -> Result<(), AllocError> {
        self.a.record_stream(ptr, stream)
    }
    fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.a.empty_cache()
    }
    fn begin(&mut self, stream: StreamId) {
        if self.pool.is_none() {
            self.pools_made += 1;
            let id = MempoolId(1, self.pools_made);
            if self
                .a
                .begin_allocate_to_pool(id, PoolFilter::Stream(stream))
                .is_ok()
            {
                self.pool = Some(id);
            }
        }
    }
    fn end(&mut self, _: &[DevicePtr]) {
        if let Some(id) = self.pool.take() {
            let _ = self.a.end_allocate_to_pool(id);
            let _ = self.a.release_pool(id);
        }
    }
    fn settle(&mut self) -> Vec<String> {
        let a = &self.a;
        match self.pool.take() {
            Some(id) => match a.end_allocate_to_pool(id).and_then(|()| a.release_pool(id)) {
                Err(e) => vec![format!("ending the private pool: {e}")],
                Ok(()) => Vec::new(),
            },
            None => Vec::new(),
        }
    }
    fn stats(&self) -> DeviceStats {
        self.a.stats()
    }
    fn counters(&self) -> (DeviceStats, Vec<Segment>) {
        (self.a.stats(), self.a.segments())
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.a.check_invariants().map_err(|e| e.to_string())
    }
    fn close(self) -> Vec<String> {
        let teardown = self.a.close();
        if !teardown.errors.is_empty() || teardown.live_blocks != 0 {
            vec![format!("teardown: {teardown:?}")]
        } else {
            Vec::new()
        }
    }
}

/// What one [`run`] found.
#[derive(Clone, Debug, Default)]
pub struct RunReport {
    /// Broken invariants, failed calls that changed something or did not
    /// say what they did, and calls that failed once the fault was cleared.
    pub violations: Vec<String>,
    /// What was left reserved or live after freeing everything and
    /// emptying the cache with the fault cleared.
    pub leaks: Vec<String>,
    /// Faults injected.
    pub injected: u64,
    /// Calls of each entry point during the workload (before the final
    /// clean-up), indexed as [`EntryPoint::ALL`].
    pub calls: Vec<u64>,
}

/// [`run`] for the caching allocator with `config`.
pub fn run_workload(
    config: &AllocatorConfig,
    capacity: u64,
    ops: &[Op],
    fault: Option<(EntryPoint, u64)>,
    check_before_fault: bool,
    ops_after_fault: usize,
) -> RunReport {
    run::<Caching>(
        config,
        capacity,
        ops,
        fault,
        check_before_fault,
        ops_after_fault,
    )
}

/// Drive an allocator with `mode` over a [`FaultySim`] of `capacity`
/// bytes through `ops`, with `fault` (entry point, n-th call counted from
/// the device's creation) armed. The invariant checker runs after every
/// operation once the fault has fired (with `check_before_fault`, from the
/// first: a run is the fault-free run until its fault fires, so checking
/// that part once, in a run without a fault, is enough), for at most
/// `ops_after_fault` operations after it fired (`usize::MAX`: to the end of
/// `ops`). A failed allocation must leave the in-use counters as they
/// were; a failed free must say that it freed nothing
/// ([`AllocError::FreeFailed`]) and change nothing. At the end the
/// fault is cleared, held streams released, every live block freed, the
/// cache emptied (nothing may fail any more), the counters and the device
/// must show nothing reserved, and the allocator is closed (every
/// reservation and allocation given back).
pub fn run<S: Subject>(
    mode: &S::Mode,
    capacity: u64,
    ops: &[Op],
    fault: Option<(EntryPoint, u64)>,
    check_before_fault: bool,
    ops_after_fault: usize,
) -> RunReport {
    let mut w = Workload::<S>::new(mode, capacity, fault);
    let dev = w.dev.clone();
    let mut report = RunReport::default();
    let fault_name = fault.map_or("none".to_string(), |(e, n)| format!("{} #{n}", e.name()));
    let mut after_fault = 0usize;
    for (i, &op) in ops.iter().enumerate() {
        if dev.injected() > 0 {
            if after_fault == ops_after_fault {
                break;
            }
            after_fault += 1;
        }
        let mut violation = w.apply(op);
        // From the operation in which the fault fired on.
        if check_before_fault || dev.injected() > 0 {
            if let Err(e) = w.a.check_invariants() {
                violation.get_or_insert(format!("invariant: {e}"));
            }
        }
        if let Some(v) = violation {
            report.violations.push(format!(
                "{} (fault {fault_name}), op {i} {op:?}: {v}",
                S::describe(mode)
            ));
            report.injected = dev.injected();
            return report;
        }
    }
    report.calls = EntryPoint::ALL.iter().map(|&e| dev.calls(e)).collect();
    // The clean-up: nothing may fail any more.
    dev.clear_faults();
    let (failures, leaks) = w.finish(fault);
    let named = |what: String| format!("{} (fault {fault_name}): {what}", S::describe(mode));
    report.violations.extend(failures.into_iter().map(named));
    report.leaks = leaks.into_iter().map(named).collect();
    report.injected = dev.injected();
    report
}

/// The allocator, its device and the program's state (streams, live
/// blocks, held streams) in one [`run`].
struct Workload<S> {
    dev: FaultySim,
    a: S,
    streams: Vec<StreamId>,
    live: Vec<DevicePtr>,
    held: [bool; STREAMS],
}

impl<S: Subject> Workload<S> {
    /// An allocator with `mode` over a fresh [`FaultySim`] of `capacity`
    /// bytes with `fault` armed, and [`STREAMS`] streams.
    fn new(mode: &S::Mode, capacity: u64, fault: Option<(EntryPoint, u64)>) -> Workload<S> {
        let dev: FaultySim = std::sync::Arc::new(FaultyBackend::new(SimDevice::new(SimConfig {
            capacity,
            ..SimConfig::default()
        })));
        if let Some((entry, n)) = fault {
            dev.fail_nth(entry, n);
        }
        // A creation that failed on the injected fault is tried again.
        let a = loop {
            match S::new(dev.clone(), mode) {
                Ok(a) => break a,
                Err(_) if dev.injected() > 0 && dev.live() == LiveCounts::default() => {}
                Err(e) => panic!(
                    "{}: the allocator cannot be created: {e}",
                    S::describe(mode)
                ),
            }
        };
        let mut streams = vec![StreamId::DEFAULT];
        while streams.len() < STREAMS {
            // A failed creation (the injected fault) is tried again.
            if let Ok(s) = dev.create_stream() {
                streams.push(s);
            }
        }
        Workload {
            dev,
            a,
            streams,
            live: Vec::new(),
            held: [false; STREAMS],
        }
    }

    /// Do `op`; a call may fail (the fault), but a failure must leave
    /// things as they were: what went wrong otherwise.
    fn apply(&mut self, op: Op) -> Option<String> {
        match op {
            Op::Alloc { size, stream } => {
                let before = in_use_counters(&self.a.stats());
                match self.a.alloc(size, self.streams[stream], stream) {
                    Ok(p) => {
                        if !p.is_null() {
                            self.live.push(p);
                        }
                    }
                    Err(e) => {
                        let after = in_use_counters(&self.a.stats());
                        if after != before {
                            return Some(format!(
                                "a failed allocation of {size} bytes ({e}) changed the \
                                 allocations and allocated bytes from {before:?} to {after:?}"
                            ));
                        }
                    }
                }
            }
            Op::Free { pick } => return self.free(pick),
            Op::RecordStream { pick, stream } => {
                if !self.live.is_empty() {
                    let p = self.live[(pick % self.live.len() as u64) as usize];
                    let _ = self.a.use_on(p, self.streams[stream], pick);
                }
            }
            Op::Hold { stream } => {
                if self.dev.inner().hold_stream(self.streams[stream]).is_ok() {
                    self.held[stream] = true;
                }
            }
            Op::Release { stream } => {
                if self
                    .dev
                    .inner()
                    .release_stream(self.streams[stream])
                    .is_ok()
                {
                    self.held[stream] = false;
                }
            }
            Op::EmptyCache => {
                let _ = self.a.empty_cache();
            }
            Op::BeginPool { stream } => self.a.begin(self.streams[stream]),
            Op::EndPool => self.a.end(&self.live),
        }
        None
    }

    /// Free a live block (picked by `pick`): the fault may fire in this
    /// free. A failed free must say whether it freed, and `FreeFailed`
    /// must have changed nothing.
    fn free(&mut self, pick: u64) -> Option<String> {
        if self.live.is_empty() {
            return None;
        }
        let k = (pick % self.live.len() as u64) as usize;
        let p = self.live[k];
        let before = self.a.counters();
        match self.a.free(p) {
            Ok(()) => {
                self.live.swap_remove(k);
                None
            }
            Err(AllocError::FreeFailed { .. }) => {
                if self.a.counters() != before {
                    Some(format!(
                        "free of {p} failed saying nothing was freed, \
                         but the counters or segments changed"
                    ))
                } else if !self.a.is_allocated(p) {
                    Some(format!(
                        "free of {p} failed saying nothing was freed, \
                         but the pointer is no longer allocated"
                    ))
                } else {
                    None
                }
            }
            Err(e) => {
                self.live.swap_remove(k);
                Some(format!(
                    "free of {p} failed without saying whether it freed: {e}"
                ))
            }
        }
    }

    /// With the fault cleared: release held streams, settle, free every
    /// live block, empty the cache, check, and close. Returns the calls
    /// that failed and what was left (leaks).
    fn finish(mut self, fault: Option<(EntryPoint, u64)>) -> (Vec<String>, Vec<String>) {
        let mut failures = self.clean_up();
        let mut leaks = self.leaks(fault);
        let dev = self.dev.clone();
        failures.extend(self.a.close());
        let live = dev.live();
        if live.reservations != 0 {
            leaks.push(format!(
                "{} address-space reservations left after close",
                live.reservations
            ));
        }
        if live.allocations != 0 {
            leaks.push(format!(
                "{} device allocations left after close",
                live.allocations
            ));
        }
        (failures, leaks)
    }

    /// Release held streams, settle, free every live block, empty the
    /// cache and check the invariants: what failed.
    fn clean_up(&mut self) -> Vec<String> {
        for (k, h) in self.held.iter().enumerate() {
            if *h {
                let _ = self.dev.inner().release_stream(self.streams[k]);
            }
        }
        let mut failures = self.a.settle();
        for p in std::mem::take(&mut self.live) {
            if let Err(e) = self.a.free(p) {
                failures.push(format!("freeing {p} at the end: {e}"));
            }
        }
        if let Err(e) = self.a.empty_cache() {
            failures.push(format!("empty_cache at the end: {e}"));
        }
        if let Err(e) = self.a.check_invariants() {
            failures.push(format!("invariant at the end: {e}"));
        }
        failures
    }

    /// What is still reserved, allocated or live (allocator and device)
    /// after the clean-up.
    fn leaks(&self, fault: Option<(EntryPoint, u64)>) -> Vec<String> {
        let mut leaks = Vec::new();
        let stats = self.a.stats();
        let (kept_bytes, kept_allocations) = self.a.kept_after_empty_cache();
        let reserved = stats.reserved_bytes.all().current - kept_bytes;
        if reserved != 0 {
            leaks.push(format!(
                "{reserved} bytes still reserved after empty_cache (besides {kept_bytes} kept by \
                 design)"
            ));
        }
        let allocated = stats.allocated_bytes.all().current;
        let active = stats.active_bytes.all().current;
        if allocated != 0 || active != 0 {
            leaks.push(format!(
                "{allocated} bytes allocated, {active} active after freeing everything"
            ));
        }
        let live_dev = self.dev.live();
        let sim = self.dev.inner().counters();
        if live_dev.allocations != kept_allocations
            || live_dev.mapped_bytes != 0
            || sim.live_allocs as i64 != kept_allocations
            || sim.bytes_in_use as i64 != kept_bytes
        {
            leaks.push(format!(
                "device: {} allocations and {} mapped bytes live ({} and {} bytes in use on the \
                 sim; {kept_allocations} allocations of {kept_bytes} bytes kept by design)",
                live_dev.allocations, live_dev.mapped_bytes, sim.live_allocs, sim.bytes_in_use
            ));
        }
        // An event whose destroy failed is dropped by the allocator (it has
        // completed; only the backend's handle is lost).
        let lost_events = if fault.is_some_and(|(e, _)| e == EntryPoint::DestroyEvent) {
            self.dev.injected() as i64
        } else {
            0
        };
        if live_dev.events > lost_events {
            leaks.push(format!("{} events never destroyed", live_dev.events));
        }
        leaks
    }
}

/// The shape of a [`sweep`].
#[derive(Clone, Debug)]
pub struct Sweep {
    /// Shown in the summary line after "fault injection" (`"mps heap"`);
    /// empty for none.
    pub name: &'static str,
    /// The [`workload`]'s seed.
    pub seed: u64,
    /// The [`workload`]'s operations.
    pub ops: usize,
    /// N runs from 1 to this for every entry point (fewer if it is called
    /// less).
    pub k: u64,
    /// More values of N, spread evenly from `k` to the entry point's last
    /// call in the workload.
    pub spread: u64,
    /// Operations checked after the fault fired (then the clean-up runs).
    pub after_fault: usize,
    /// The device's bytes.
    pub capacity: u64,
}

/// What a [`sweep`] found.
#[derive(Clone, Debug, Default)]
pub struct SweepReport {
    /// Every entry point the allocator called in some mode's fault-free
    /// run: each one was failed.
    pub entry_points: std::collections::BTreeSet<EntryPoint>,
    /// Runs with a fault.
    pub runs: usize,
    /// Faults injected.
    pub injected: u64,
    /// What [`run`] found broken, in every run (the fault-free ones too).
    pub violations: Vec<String>,
    /// What [`run`] found left, in every run.
    pub leaks: Vec<String>,
    /// Runs whose fault never fired (mode, entry point, N).
    pub silent: Vec<String>,
    /// The summary line: `fault injection[ (name)]: E entry points (names)
    /// x N=1..K (+S spread) x M modes: R runs, F faults injected, V
    /// violations, L leaks`.
    pub summary: String,
}

impl SweepReport {
    /// Write the summary line to stderr past libtest's output capture (so
    /// CI's log shows it), then fail on any violation, leak or fault that
    /// never fired.
    pub fn print_and_check(&self) {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "\n{}", self.summary);
        assert!(
            self.violations.is_empty() && self.leaks.is_empty(),
            "violations:\n{}\nleaks:\n{}",
            self.violations.join("\n"),
            self.leaks.join("\n")
        );
        // The runs are deterministic up to their fault: each one fires.
        assert!(
            self.silent.is_empty(),
            "faults that never fired: {:?}",
            self.silent
        );
    }
}

/// The values of N for an entry point called `calls` times: 1..=k, then
/// `spread` more spread evenly to the last call.
fn values_of_n(calls: u64, k: u64, spread: u64) -> Vec<u64> {
    let mut ns: Vec<u64> = (1..=k.min(calls)).collect();
    if calls > k {
        let span = calls - k;
        ns.extend((1..=spread).map(|i| k + (span * i).div_ceil(spread)));
    }
    ns.dedup();
    ns
}

/// Every backend entry point the allocator calls, failing one call at a
/// time at its N-th call (N = 1..=k, and `spread` more to its last call in
/// the workload), in every mode: one fault-free [`run`] per mode (checked
/// from the first operation) counts the calls, then one [`run`] per
/// (mode, entry point, N), on up to 8 threads.
pub fn sweep<S: Subject>(shape: &Sweep, modes: &[(&str, S::Mode)]) -> SweepReport {
    let ops = workload(shape.seed, shape.ops);
    let mut jobs: Vec<(&str, &S::Mode, EntryPoint, u64)> = Vec::new();
    let mut report = SweepReport::default();
    for (name, mode) in modes {
        let baseline = run::<S>(mode, shape.capacity, &ops, None, true, usize::MAX);
        report.violations.extend(baseline.violations);
        report.leaks.extend(baseline.leaks);
        for (i, &entry) in EntryPoint::ALL.iter().enumerate() {
            let calls = baseline.calls.get(i).copied().unwrap_or(0);
            if calls > 0 {
                report.entry_points.insert(entry);
            }
            for n in values_of_n(calls, shape.k, shape.spread) {
                jobs.push((name, mode, entry, n));
            }
        }
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(usize, RunReport)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(_, mode, entry, n)) = jobs.get(j) else {
                            break;
                        };
                        let fault = Some((entry, n));
                        let r =
                            run::<S>(mode, shape.capacity, &ops, fault, false, shape.after_fault);
                        out.push((j, r));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a sweep thread"))
            .collect()
    });
    assert_eq!(results.len(), jobs.len());
    for (j, r) in results {
        report.injected += r.injected;
        if r.injected == 0 {
            let (mode, _, entry, n) = jobs[j];
            report.silent.push(format!("{mode} {} #{n}", entry.name()));
        }
        report.violations.extend(r.violations);
        report.leaks.extend(r.leaks);
    }
    report.runs = jobs.len();
    let names: Vec<&str> = report.entry_points.iter().map(|e| e.name()).collect();
    let label = if shape.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", shape.name)
    };
    report.summary = format!(
        "fault injection{label}: {} entry points ({}) x N=1..{} (+{} spread) x {} modes: \
         {} runs, {} faults injected, {} violations, {} leaks",
        report.entry_points.len(),
        names.join(", "),
        shape.k,
        shape.spread,
        modes.len(),
        report.runs,
        report.injected,
        report.violations.len(),
        report.leaks.len(),
    );
    report
}
