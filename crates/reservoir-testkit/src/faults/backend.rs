//! [`FaultyBackend`]: a backend wrapper that forwards every call of the
//! [`Backend`] contract and of each optional capability the wrapped backend
//! offers, counts them per [`EntryPoint`], fails the chosen N-th call with a
//! non-retryable [`BackendError::Driver`], and keeps its own count of what
//! is live on the device ([`LiveCounts`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use reservoir::backend::{
    Backend, BackendError, DevicePtr, DeviceWork, EventId, HostMapping, HostWrite, Ipc, MemInfo,
    Memcpy, Reservation, StreamId, VirtualMemory,
};

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
