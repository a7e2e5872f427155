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

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use reservoir::backend::{
    Backend, BackendError, DevicePtr, DeviceWork, EventId, HostMapping, HostWrite, Ipc, MemInfo,
    Memcpy, Reservation, StreamId, VirtualMemory,
};
use reservoir::caching::{CachingAllocator, PoolFilter};
use reservoir::config::AllocatorConfig;
use reservoir::error::AllocError;
use reservoir::ids::MempoolId;
use reservoir::observe::snapshot::Segment;
use reservoir::rng::SplitMix64;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::stats::DeviceStats;

mod heap;

pub use heap::HeapSubject;

/// A fallible entry point of the backend contract or of one of its
/// optional capabilities. Notifications and queries that cannot fail
/// (`name`, `on_block_freed`, `granularity`, ...) are not entry points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryPoint {
    /// [`Backend::allocate`].
    Allocate,
    /// [`Backend::free`].
    Free,
    /// [`Backend::mem_info`].
    MemInfo,
    /// [`Backend::create_stream`].
    CreateStream,
    /// [`Backend::check_stream`].
    CheckStream,
    /// [`Backend::record_event`].
    RecordEvent,
    /// [`Backend::query_event`].
    QueryEvent,
    /// [`Backend::synchronize_event`].
    SynchronizeEvent,
    /// [`Backend::destroy_event`].
    DestroyEvent,
    /// [`Backend::synchronize_stream`].
    SynchronizeStream,
    /// [`Backend::synchronize_device`].
    SynchronizeDevice,
    /// [`Backend::stream_wait_event`].
    StreamWaitEvent,
    /// [`VirtualMemory::reserve`].
    Reserve,
    /// [`VirtualMemory::map`].
    Map,
    /// [`VirtualMemory::unmap`].
    Unmap,
    /// [`VirtualMemory::release`].
    Release,
    /// [`Memcpy::copy`].
    Copy,
    /// [`DeviceWork::fill`].
    Fill,
    /// [`DeviceWork::read_checksum`].
    ReadChecksum,
    /// [`DeviceWork::hold`].
    Hold,
    /// [`DeviceWork::release`].
    ReleaseHold,
    /// [`HostWrite::write_host`].
    WriteHost,
    /// [`Ipc::export_segment`].
    ExportSegment,
    /// [`Ipc::open_segment`].
    OpenSegment,
    /// [`Ipc::close_segment`].
    CloseSegment,
    /// [`HostMapping::host_address`].
    HostAddress,
}

impl EntryPoint {
    /// Every entry point, in declaration order.
    pub const ALL: [EntryPoint; 26] = [
        EntryPoint::Allocate,
        EntryPoint::Free,
        EntryPoint::MemInfo,
        EntryPoint::CreateStream,
        EntryPoint::CheckStream,
        EntryPoint::RecordEvent,
        EntryPoint::QueryEvent,
        EntryPoint::SynchronizeEvent,
        EntryPoint::DestroyEvent,
        EntryPoint::SynchronizeStream,
        EntryPoint::SynchronizeDevice,
        EntryPoint::StreamWaitEvent,
        EntryPoint::Reserve,
        EntryPoint::Map,
        EntryPoint::Unmap,
        EntryPoint::Release,
        EntryPoint::Copy,
        EntryPoint::Fill,
        EntryPoint::ReadChecksum,
        EntryPoint::Hold,
        EntryPoint::ReleaseHold,
        EntryPoint::WriteHost,
        EntryPoint::ExportSegment,
        EntryPoint::OpenSegment,
        EntryPoint::CloseSegment,
        EntryPoint::HostAddress,
    ];

    /// The method's name (`"record_event"`).
    pub fn name(self) -> &'static str {
        match self {
            EntryPoint::Allocate => "allocate",
            EntryPoint::Free => "free",
            EntryPoint::MemInfo => "mem_info",
            EntryPoint::CreateStream => "create_stream",
            EntryPoint::CheckStream => "check_stream",
            EntryPoint::RecordEvent => "record_event",
            EntryPoint::QueryEvent => "query_event",
            EntryPoint::SynchronizeEvent => "synchronize_event",
            EntryPoint::DestroyEvent => "destroy_event",
            EntryPoint::SynchronizeStream => "synchronize_stream",
            EntryPoint::SynchronizeDevice => "synchronize_device",
            EntryPoint::StreamWaitEvent => "stream_wait_event",
            EntryPoint::Reserve => "reserve",
            EntryPoint::Map => "map",
            EntryPoint::Unmap => "unmap",
            EntryPoint::Release => "release",
            EntryPoint::Copy => "copy",
            EntryPoint::Fill => "fill",
            EntryPoint::ReadChecksum => "read_checksum",
            EntryPoint::Hold => "hold",
            EntryPoint::ReleaseHold => "release_hold",
            EntryPoint::WriteHost => "write_host",
            EntryPoint::ExportSegment => "export_segment",
            EntryPoint::OpenSegment => "open_segment",
            EntryPoint::CloseSegment => "close_segment",
            EntryPoint::HostAddress => "host_address",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a [`FaultyBackend`] has seen live on its device: successful
/// allocations less frees, mapped bytes less unmapped ones, reservations
/// less releases, recorded events less destroyed ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveCounts {
    /// Segments allocated and not freed.
    pub allocations: i64,
    /// Bytes mapped into reservations and not unmapped.
    pub mapped_bytes: i64,
    /// Address-space reservations not released.
    pub reservations: i64,
    /// Events recorded and not destroyed.
    pub events: i64,
}

/// A backend that forwards to `B` and fails chosen calls (see the module
/// documentation). The faults are non-retryable driver errors: the device
/// does nothing for a failed call.
pub struct FaultyBackend<B> {
    inner: B,
    calls: [AtomicU64; EntryPoint::ALL.len()],
    /// Per entry point, the call number (1-based, counted since creation)
    /// to fail; 0 for none.
    armed: [AtomicU64; EntryPoint::ALL.len()],
    injected: AtomicU64,
    allocations: AtomicI64,
    mapped_bytes: AtomicI64,
    reservations: AtomicI64,
    events: AtomicI64,
}

impl<B: Backend> FaultyBackend<B> {
    /// Wrap `inner`, with no fault armed.
    pub fn new(inner: B) -> FaultyBackend<B> {
        FaultyBackend {
            inner,
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
            armed: std::array::from_fn(|_| AtomicU64::new(0)),
            injected: AtomicU64::new(0),
            allocations: AtomicI64::new(0),
            mapped_bytes: AtomicI64::new(0),
            reservations: AtomicI64::new(0),
            events: AtomicI64::new(0),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// Fail the `n`-th call of `entry` from now (`n = 1`: the next one; 0
    /// is treated as 1), replacing a fault armed on it before.
    pub fn fail_nth(&self, entry: EntryPoint, n: u64) {
        let at = self.calls[entry.index()].load(Ordering::SeqCst) + n.max(1);
        self.armed[entry.index()].store(at, Ordering::SeqCst);
    }

    /// Disarm every fault not injected yet.
    pub fn clear_faults(&self) {
        for a in &self.armed {
            a.store(0, Ordering::SeqCst);
        }
    }

    /// Calls of `entry` so far, failed ones included.
    pub fn calls(&self, entry: EntryPoint) -> u64 {
        self.calls[entry.index()].load(Ordering::SeqCst)
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// What is live on the device, as this wrapper counted it.
    pub fn live(&self) -> LiveCounts {
        LiveCounts {
            allocations: self.allocations.load(Ordering::SeqCst),
            mapped_bytes: self.mapped_bytes.load(Ordering::SeqCst),
            reservations: self.reservations.load(Ordering::SeqCst),
            events: self.events.load(Ordering::SeqCst),
        }
    }

    /// Count a call of `entry`; the injected error if it is the armed one.
    fn gate(&self, entry: EntryPoint) -> Result<(), BackendError> {
        let n = self.calls[entry.index()].fetch_add(1, Ordering::SeqCst) + 1;
        let armed = &self.armed[entry.index()];
        if armed.load(Ordering::SeqCst) == n
            && armed
                .compare_exchange(n, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.injected.fetch_add(1, Ordering::SeqCst);
            return Err(BackendError::Driver(format!(
                "injected fault: call {n} of {}",
                entry.name()
            )));
        }
        Ok(())
    }

    fn vm(&self) -> &dyn VirtualMemory {
        self.inner
            .as_virtual_memory()
            .expect("offered only when the wrapped backend has it")
    }
}

fn add(counter: &AtomicI64, by: i64) {
    counter.fetch_add(by, Ordering::SeqCst);
}

impl<B: Backend> Backend for FaultyBackend<B> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn device_kind(&self) -> reservoir::ids::DeviceKind {
        self.inner.device_kind()
    }
    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.gate(EntryPoint::Allocate)?;
        let p = self.inner.allocate(size, stream)?;
        add(&self.allocations, 1);
        Ok(p)
    }
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        self.gate(EntryPoint::Free)?;
        self.inner.free(ptr, size)?;
        add(&self.allocations, -1);
        Ok(())
    }
    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.gate(EntryPoint::MemInfo)?;
        self.inner.mem_info()
    }
    fn create_stream(&self) -> Result<StreamId, BackendError> {
        self.gate(EntryPoint::CreateStream)?;
        self.inner.create_stream()
    }
    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.gate(EntryPoint::CheckStream)?;
        self.inner.check_stream(stream)
    }
    fn stream_epoch(&self) -> u64 {
        self.inner.stream_epoch()
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.gate(EntryPoint::RecordEvent)?;
        let e = self.inner.record_event(stream)?;
        add(&self.events, 1);
        Ok(e)
    }
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.gate(EntryPoint::QueryEvent)?;
        self.inner.query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        self.gate(EntryPoint::SynchronizeEvent)?;
        self.inner.synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        self.gate(EntryPoint::DestroyEvent)?;
        self.inner.destroy_event(event)?;
        add(&self.events, -1);
        Ok(())
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.gate(EntryPoint::SynchronizeStream)?;
        self.inner.synchronize_stream(stream)
    }
    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.gate(EntryPoint::SynchronizeDevice)?;
        self.inner.synchronize_device()
    }
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.gate(EntryPoint::StreamWaitEvent)?;
        self.inner.stream_wait_event(stream, event)
    }
    fn on_block_handed_out(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        self.inner.on_block_handed_out(ptr, size, stream)
    }
    fn on_block_freed(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        self.inner.on_block_freed(ptr, size, stream)
    }
    fn heap_buffer_alignment(&self) -> u64 {
        self.inner.heap_buffer_alignment()
    }
    fn as_virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        self.inner.as_virtual_memory().map(|_| self as _)
    }
    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        self.inner.as_memcpy().map(|_| self as _)
    }
    fn as_device_work(&self) -> Option<&dyn DeviceWork> {
        self.inner.as_device_work().map(|_| self as _)
    }
    fn as_host_write(&self) -> Option<&dyn HostWrite> {
        self.inner.as_host_write().map(|_| self as _)
    }
    fn as_ipc(&self) -> Option<&dyn Ipc> {
        self.inner.as_ipc().map(|_| self as _)
    }
    fn as_host_mapping(&self) -> Option<&dyn HostMapping> {
        self.inner.as_host_mapping().map(|_| self as _)
    }
}

impl<B: Backend> VirtualMemory for FaultyBackend<B> {
    fn granularity(&self) -> u64 {
        self.vm().granularity()
    }
    fn reserve(&self, size: u64) -> Result<Reservation, BackendError> {
        self.gate(EntryPoint::Reserve)?;
        let r = self.vm().reserve(size)?;
        add(&self.reservations, 1);
        Ok(r)
    }
    fn map(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.gate(EntryPoint::Map)?;
        self.vm().map(reservation, offset, len)?;
        add(&self.mapped_bytes, len as i64);
        Ok(())
    }
    fn unmap(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.gate(EntryPoint::Unmap)?;
        self.vm().unmap(reservation, offset, len)?;
        add(&self.mapped_bytes, -(len as i64));
        Ok(())
    }
    fn release(&self, reservation: Reservation) -> Result<(), BackendError> {
        self.gate(EntryPoint::Release)?;
        self.vm().release(reservation)?;
        add(&self.reservations, -1);
        Ok(())
    }
}

impl<B: Backend> Memcpy for FaultyBackend<B> {
    fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.gate(EntryPoint::Copy)?;
        let m = self.inner.as_memcpy().expect("offered only when wrapped");
        m.copy(dst, src, len, stream)
    }
}

impl<B: Backend> DeviceWork for FaultyBackend<B> {
    fn fill(
        &self,
        ptr: DevicePtr,
        len: u64,
        byte: u8,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.gate(EntryPoint::Fill)?;
        let w = self
            .inner
            .as_device_work()
            .expect("offered only when wrapped");
        w.fill(ptr, len, byte, stream)
    }
    fn read_checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError> {
        self.gate(EntryPoint::ReadChecksum)?;
        let w = self
            .inner
            .as_device_work()
            .expect("offered only when wrapped");
        w.read_checksum(ptr, len, stream)
    }
    fn hold(&self, stream: StreamId) -> Result<(), BackendError> {
        self.gate(EntryPoint::Hold)?;
        let w = self
            .inner
            .as_device_work()
            .expect("offered only when wrapped");
        w.hold(stream)
    }
    fn release(&self, stream: StreamId) -> Result<(), BackendError> {
        self.gate(EntryPoint::ReleaseHold)?;
        let w = self
            .inner
            .as_device_work()
            .expect("offered only when wrapped");
        w.release(stream)
    }
    fn let_time_pass(&self, ns: u64) {
        if let Some(w) = self.inner.as_device_work() {
            w.let_time_pass(ns)
        }
    }
}

impl<B: Backend> HostWrite for FaultyBackend<B> {
    fn write_host(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), BackendError> {
        self.gate(EntryPoint::WriteHost)?;
        let h = self
            .inner
            .as_host_write()
            .expect("offered only when wrapped");
        h.write_host(ptr, data)
    }
}

impl<B: Backend> Ipc for FaultyBackend<B> {
    fn export_segment(&self, segment: DevicePtr) -> Result<Vec<u8>, BackendError> {
        self.gate(EntryPoint::ExportSegment)?;
        let i = self.inner.as_ipc().expect("offered only when wrapped");
        i.export_segment(segment)
    }
    fn open_segment(&self, handle: &[u8]) -> Result<(DevicePtr, u64), BackendError> {
        self.gate(EntryPoint::OpenSegment)?;
        let i = self.inner.as_ipc().expect("offered only when wrapped");
        i.open_segment(handle)
    }
    fn close_segment(&self, base: DevicePtr) -> Result<(), BackendError> {
        self.gate(EntryPoint::CloseSegment)?;
        let i = self.inner.as_ipc().expect("offered only when wrapped");
        i.close_segment(base)
    }
}

impl<B: Backend> HostMapping for FaultyBackend<B> {
    fn host_address(&self, ptr: DevicePtr, len: u64) -> Result<u64, BackendError> {
        self.gate(EntryPoint::HostAddress)?;
        let h = self
            .inner
            .as_host_mapping()
            .expect("offered only when wrapped");
        h.host_address(ptr, len)
    }
}

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
