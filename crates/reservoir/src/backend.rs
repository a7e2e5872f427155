//! The backend contract: the only place that touches a device.
//!
//! A [`Backend`] is a slow, synchronising source of device memory (a driver's
//! `cudaMalloc`, `clSVMAlloc`, `mmap`, or the [simulated device](crate::sim)).
//! The caching allocator sits on top of it and calls it as rarely as it can.
//!
//! The contract is deliberately small: allocate and free whole segments, report
//! free and total memory, create streams, record, query and synchronise events.
//! Everything else is an optional capability, a trait of its own that a
//! backend offers through an `as_*` accessor returning `None` by default:
//! virtual-memory mapping ([`VirtualMemory`], [`Backend::as_virtual_memory`]),
//! copies ([`Memcpy`], [`Backend::as_memcpy`]), the work a program does
//! between allocator calls ([`DeviceWork`], [`Backend::as_device_work`]) and
//! host addresses of device memory ([`HostMapping`], [`Backend::as_host_mapping`]).
//!
//! Backends report only what the caller cannot anticipate. Their errors say
//! whether releasing cached memory and retrying can help
//! ([`BackendError::is_retryable`]).

pub use crate::ids::{DevicePtr, EventId, StreamId};

/// The default limit on the streams one simulated or host device holds (the
/// default stream, created and registered ones): 65,536, far more than a
/// program uses (PyTorch pools 32 streams per priority and device), and
/// about 7 MiB of stream state. `create_stream` past it is a
/// [`BackendError::Driver`] naming the limit; raise it with
/// `SimConfig::max_streams` or `HostConfig::max_streams`. Backends have no
/// way to destroy a stream, so the limit bounds a device's stream state.
pub const DEFAULT_STREAM_LIMIT: usize = 65_536;

/// Free and total device memory, as `cudaMemGetInfo` reports it.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct MemInfo {
    /// Bytes the device could still hand out.
    pub free: u64,
    /// The device's capacity in bytes.
    pub total: u64,
}

/// The counters every device of the workspace keeps, in a snapshot: the
/// simulated device's [`SimCounters`](crate::sim::SimCounters) and the host
/// device's `HostCounters` (crate `reservoir-host`) hold one each, next to
/// their own, and dereference to it, so `counters.allocs` reads the same on
/// both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceCounters {
    /// Successful allocations ([`Backend::allocate`]).
    pub allocs: u64,
    /// Successful frees ([`Backend::free`]).
    pub frees: u64,
    /// Allocations refused for lack of capacity (or by an injected fault).
    pub failed_allocs: u64,
    /// Live plain allocations.
    pub live_allocs: u64,
    /// Bytes counted against the capacity now: plain allocations (rounded
    /// up to the device's accounting unit) plus mapped virtual memory.
    pub bytes_in_use: u64,
    /// Highest `bytes_in_use` since creation or the device's `reset_peak`.
    pub peak_bytes: u64,
    /// Successful address-space reservations ([`VirtualMemory::reserve`]).
    pub reserves: u64,
    /// Released reservations ([`VirtualMemory::release`]).
    pub releases: u64,
    /// Successful map calls ([`VirtualMemory::map`]).
    pub maps: u64,
    /// Successful unmap calls ([`VirtualMemory::unmap`]).
    pub unmaps: u64,
    /// Map calls refused for lack of capacity (or by an injected fault).
    pub failed_maps: u64,
    /// Streams created ([`Backend::create_stream`]; the simulated device
    /// also counts registered streams).
    pub streams_created: u64,
    /// Events recorded on a stream ([`Backend::record_event`]).
    pub events_recorded: u64,
    /// Events handed out and not destroyed yet.
    pub live_events: u64,
}

/// What went wrong inside a backend.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The device has no room for `requested` bytes. Releasing cached
    /// memory and retrying can help.
    #[error("device out of memory: {requested} bytes requested, {free} bytes free")]
    OutOfMemory {
        /// Bytes that were asked for.
        requested: u64,
        /// Bytes the device reported free at the time.
        free: u64,
    },
    /// The device is gone (reset, removed, context lost). Nothing helps.
    #[error("device lost: {0}")]
    DeviceLost(String),
    /// The backend was handed something it does not know (an address it
    /// did not allocate, an unknown stream or event).
    #[error("invalid value: {0}")]
    InvalidValue(String),
    /// The backend lacks this capability.
    #[error("not supported by the {backend} backend: {what}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// The operation it cannot do.
        what: &'static str,
    },
    /// Any other driver failure, with the driver's own words.
    #[error("driver error: {0}")]
    Driver(String),
}

impl BackendError {
    /// True when releasing cached memory and retrying the allocation can
    /// succeed (the device is out of memory); false when retrying is futile.
    pub fn is_retryable(&self) -> bool {
        matches!(self, BackendError::OutOfMemory { .. })
    }
}

/// A device memory source: the whole contract a device must fulfil.
///
/// All methods take `&self`: a backend is shared between the allocator (which
/// calls it under its device lock) and the program (which enqueues work on
/// streams). Implementations use interior mutability where they need state.
pub trait Backend: Send + Sync {
    /// A short name for messages ("sim", "host", "opencl", "cuda").
    fn name(&self) -> &'static str;

    /// The kind of device, for the words of the allocator's messages (see
    /// [`DeviceKind`](crate::ids::DeviceKind)). The default, CUDA, gives
    /// PyTorch's messages word for word.
    fn device_kind(&self) -> crate::ids::DeviceKind {
        crate::ids::DeviceKind::Cuda
    }

    /// Allocate one segment of exactly `size` bytes (the `cudaMalloc` of
    /// PyTorch). `stream` is the stream the segment will serve; most drivers
    /// ignore it. On failure nothing is allocated.
    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError>;

    /// Free a segment returned by [`allocate`](Backend::allocate), with the
    /// size it was allocated with.
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError>;

    /// Free and total device memory.
    fn mem_info(&self) -> Result<MemInfo, BackendError>;

    /// Create a new stream.
    fn create_stream(&self) -> Result<StreamId, BackendError>;

    /// Is `stream` a stream of this device: the default stream
    /// ([`StreamId::DEFAULT`], always), one [`create_stream`](Backend::create_stream)
    /// made, or one the backend was told of (a replay's registered stream, an
    /// adopted CUDA stream)? An unknown stream is
    /// [`BackendError::InvalidValue`] naming it. The allocators call it
    /// before they act on a stream a caller names, and remember the streams
    /// that passed until [`stream_epoch`](Backend::stream_epoch) changes.
    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError>;

    /// A number that changes whenever a stream that passed
    /// [`check_stream`](Backend::check_stream) stops being valid (a CUDA
    /// device forgetting an adopted stream), so that callers drop the streams
    /// they remember. The default, a constant, says a stream stays valid for
    /// the device's life. Called on every allocation on a non-default
    /// stream: keep it to an atomic load.
    fn stream_epoch(&self) -> u64 {
        0
    }

    /// Record an event on `stream`: it completes when the work enqueued on
    /// `stream` so far has completed.
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError>;

    /// Non-blocking: has the event completed?
    fn query_event(&self, event: EventId) -> Result<bool, BackendError>;

    /// Block until the event has completed.
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError>;

    /// Give an event back to the backend (it may pool it).
    fn destroy_event(&self, event: EventId) -> Result<(), BackendError>;

    /// Block until all work enqueued on `stream` so far has completed
    /// (`cudaStreamSynchronize`). The allocator calls it before unmapping
    /// pages of an expandable segment, which the driver does not order.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError>;

    /// Block until all work on every stream has completed (`cudaDeviceSynchronize`).
    fn synchronize_device(&self) -> Result<(), BackendError>;

    /// Make work enqueued on `stream` after this call wait until `event` has
    /// completed (`cudaStreamWaitEvent`, `clEnqueueBarrierWithWaitList`),
    /// without blocking the host. Optional: the default answers
    /// [`BackendError::Unsupported`]. The caching allocator needs it only for
    /// the Reservoir-only cross-stream reuse policy.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        let _ = (stream, event);
        Err(BackendError::Unsupported {
            backend: self.name(),
            what: "stream_wait_event",
        })
    }

    /// Told by the caching allocator each time it hands the `size` bytes at
    /// `ptr` (the whole block, rounded size) to a caller for use on `stream`.
    /// A notification only: it cannot fail and must not call back into the
    /// allocator. The default does nothing; checking devices (the simulated
    /// device's race sanitizer) use it to find blocks handed out while work
    /// of another stream still touches them.
    fn on_block_handed_out(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        let _ = (ptr, size, stream);
    }

    /// Told by the caching allocator each time a caller frees the block at
    /// `ptr` (`size` bytes, allocated for `stream`), once the free is sure
    /// to complete: after the events of the streams that used it are
    /// recorded (a free that fails frees nothing and is not told). A
    /// notification only, like
    /// [`on_block_handed_out`](Backend::on_block_handed_out); the default
    /// does nothing.
    fn on_block_freed(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        let _ = (ptr, size, stream);
    }

    /// The alignment of buffers placed inside one allocation by the heap
    /// allocator (Metal's `heapBufferSizeAndAlignWithLength`): sizes are
    /// rounded up to it and buffers start at multiples of it from the heap's
    /// base. A power of two, at most 2 MiB. The default, 16 KiB, is the page
    /// size of Apple silicon (`vm_page_size`).
    fn heap_buffer_alignment(&self) -> u64 {
        16 << 10
    }

    /// The virtual-memory capability, if the backend has it.
    fn as_virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        None
    }

    /// The copy capability, if the backend has it.
    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        None
    }

    /// The device-work capability, if the backend has it.
    fn as_device_work(&self) -> Option<&dyn DeviceWork> {
        None
    }

    /// The host-write capability, if the host can write device memory
    /// directly.
    fn as_host_write(&self) -> Option<&dyn HostWrite> {
        None
    }

    /// The inter-process sharing capability, if the backend has it.
    fn as_ipc(&self) -> Option<&dyn Ipc> {
        None
    }

    /// The host-mapping capability, if the host can address device memory
    /// (unified memory, host memory, OpenCL SVM).
    fn as_host_mapping(&self) -> Option<&dyn HostMapping> {
        None
    }
}

/// A shared backend is a backend: the program keeps an `Arc` to the device
/// (to enqueue work, or to read its counters after the allocator is
/// dropped) while the allocator owns another. Every method forwards.
impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn device_kind(&self) -> crate::ids::DeviceKind {
        (**self).device_kind()
    }
    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        (**self).allocate(size, stream)
    }
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        (**self).free(ptr, size)
    }
    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        (**self).mem_info()
    }
    fn create_stream(&self) -> Result<StreamId, BackendError> {
        (**self).create_stream()
    }
    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        (**self).check_stream(stream)
    }
    fn stream_epoch(&self) -> u64 {
        (**self).stream_epoch()
    }
    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        (**self).record_event(stream)
    }
    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        (**self).query_event(event)
    }
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        (**self).synchronize_event(event)
    }
    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        (**self).destroy_event(event)
    }
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        (**self).synchronize_stream(stream)
    }
    fn synchronize_device(&self) -> Result<(), BackendError> {
        (**self).synchronize_device()
    }
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        (**self).stream_wait_event(stream, event)
    }
    fn on_block_handed_out(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        (**self).on_block_handed_out(ptr, size, stream)
    }
    fn on_block_freed(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        (**self).on_block_freed(ptr, size, stream)
    }
    fn heap_buffer_alignment(&self) -> u64 {
        (**self).heap_buffer_alignment()
    }
    fn as_virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        (**self).as_virtual_memory()
    }
    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        (**self).as_memcpy()
    }
    fn as_device_work(&self) -> Option<&dyn DeviceWork> {
        (**self).as_device_work()
    }
    fn as_host_write(&self) -> Option<&dyn HostWrite> {
        (**self).as_host_write()
    }
    fn as_ipc(&self) -> Option<&dyn Ipc> {
        (**self).as_ipc()
    }
    fn as_host_mapping(&self) -> Option<&dyn HostMapping> {
        (**self).as_host_mapping()
    }
}

/// Inter-process sharing capability (spec 1.16): a whole segment is
/// exported as a handle (opaque bytes, `cudaIpcMemHandle` in CUDA, a memfd
/// reference on the host), which another process opens to map the same
/// memory. The caching allocator exports the segment of a block and adds
/// the block's offset ([`CachingAllocator::share_ipc_handle`](crate::CachingAllocator::share_ipc_handle)).
pub trait Ipc: Send + Sync {
    /// A handle to the segment whose base address is `segment` (an address
    /// [`Backend::allocate`] returned). The segment must stay allocated
    /// while other processes use it.
    fn export_segment(&self, segment: DevicePtr) -> Result<Vec<u8>, BackendError>;

    /// Map a segment exported by another process; returns its base address
    /// and size in this process. A malformed or stale handle is a
    /// [`BackendError::InvalidValue`] naming what is wrong, and maps nothing.
    fn open_segment(&self, handle: &[u8]) -> Result<(DevicePtr, u64), BackendError>;

    /// Unmap a segment opened with [`open_segment`](Ipc::open_segment).
    fn close_segment(&self, base: DevicePtr) -> Result<(), BackendError>;
}

/// Host-mapping capability: device memory the host addresses directly, as
/// Metal's shared storage (`[MTLBuffer contents]`). The heap allocator's
/// `getSharedBufferPtr` needs it ([`crate::heap::HeapAllocator::shared_buffer_ptr`]).
pub trait HostMapping: Send + Sync {
    /// The host address of the `len` bytes of device memory at `ptr`, which
    /// lie inside one live allocation of this backend. Where the memory is
    /// only simulated (the simulated device) the address is the model's and
    /// holds no bytes; see each backend's documentation.
    fn host_address(&self, ptr: DevicePtr, len: u64) -> Result<u64, BackendError>;
}

/// Host-write capability: the host writes device memory directly (unified
/// or host-visible memory). The heap allocator's scalar buffers with a value
/// need it (`allocScalarBufferWithValue`).
pub trait HostWrite: Send + Sync {
    /// Write `data` at `ptr` from the host.
    fn write_host(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), BackendError>;
}

/// A reserved virtual address range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// First address of the range.
    pub base: DevicePtr,
    /// Length of the range in bytes (a multiple of the granularity).
    pub size: u64,
}

/// Virtual-memory capability: reserve an address range, map and unmap pages
/// of physical memory into it (`cuMemAddressReserve` / `cuMemCreate` +
/// `cuMemMap` / `cuMemUnmap` in CUDA). Expandable segments are built on it.
pub trait VirtualMemory: Send + Sync {
    /// The page size mapping works in; every offset and length is a multiple.
    fn granularity(&self) -> u64;

    /// Reserve `size` bytes of address space without backing memory.
    fn reserve(&self, size: u64) -> Result<Reservation, BackendError>;

    /// Back `[offset, offset + len)` of the reservation with physical memory.
    /// Fails with [`BackendError::OutOfMemory`] without mapping anything if the
    /// device cannot back the whole range.
    fn map(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError>;

    /// Give the physical memory behind `[offset, offset + len)` back.
    fn unmap(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError>;

    /// Release the reservation (all of it must be unmapped).
    fn release(&self, reservation: Reservation) -> Result<(), BackendError>;
}

/// Copy capability: device-to-device copies ordered on a stream.
pub trait Memcpy: Send + Sync {
    /// Copy `len` bytes from `src` to `dst`, ordered after prior work on `stream`.
    fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError>;
}

/// Device-work capability: the work a program enqueues on its streams
/// between allocator calls (writing, reading back, keeping a stream busy).
/// The allocator never calls it; the conformance scenarios of
/// `reservoir-testkit` drive an allocator over any backend that has it (with
/// [`Memcpy`] for their cross-stream copies).
pub trait DeviceWork: Send + Sync {
    /// Set `len` bytes at `ptr` to `byte`, ordered after prior work on `stream`.
    fn fill(
        &self,
        ptr: DevicePtr,
        len: u64,
        byte: u8,
        stream: StreamId,
    ) -> Result<(), BackendError>;

    /// Read `len` bytes at `ptr` after the work enqueued on `stream` so far,
    /// and return their [`checksum`](crate::checksum::checksum). `None` when
    /// the device holds no data (a simulated device); the read still counts
    /// as work on `stream`.
    fn read_checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError>;

    /// Keep `stream` busy: work enqueued on it from now on does not start
    /// before [`release`](DeviceWork::release).
    fn hold(&self, stream: StreamId) -> Result<(), BackendError>;

    /// End a [`hold`](DeviceWork::hold) and wait until the stream's work has
    /// finished.
    fn release(&self, stream: StreamId) -> Result<(), BackendError>;

    /// Let `ns` nanoseconds of device time pass (a simulated clock moves; a
    /// real device does nothing).
    fn let_time_pass(&self, ns: u64) {
        let _ = ns;
    }
}
