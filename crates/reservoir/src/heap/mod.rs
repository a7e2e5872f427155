//! The MPS heap allocator: PyTorch's `MPSHeapAllocatorImpl` and its
//! `IMPSAllocator` surface (`aten/src/ATen/mps/MPSAllocator.{h,mm}`,
//! `MPSAllocatorInterface.h`; spec section 4), over any [`Backend`].
//!
//! **Which PyTorch.** The default behaviour is the `MPSAllocator.mm` that
//! goes with the seed's `MPSAllocator.h` (pytorch/pytorch
//! `57ba412974d87ca62f0c7010e5953581587c40c6`, the 2.7-era code). Other
//! versions are named settings of [`HeapSettings`]:
//! [`SizeFormat::Mps26`] (2.0-2.6 messages) and
//! [`HeapSettings::free_waits_for_events`] (the later pending-free
//! redesign). `docs/heap.md` has the rule-by-rule table.
//!
//! A *heap* is one [`Backend::allocate`] (Metal's `MTLHeap`); a *buffer* is
//! a sub-range placed inside a heap (`newBufferWithLength`). Buffers are
//! never split or merged: a cached buffer is reused whole.
//!
//! * Spec 4.1 (`types.rs`): the size constants
//!   ([`MAX_SMALL_ALLOC`] ... [`MAX_SCALAR_ALLOC`]), [`UsageFlags`] with
//!   their [`ResourceOptions`], the five [`PoolKind`]s.
//! * Spec 4.2 (`state/mod.rs`): [`HeapAllocator::malloc`] runs
//!   `alloc_buffer_block` step by step: "Invalid buffer size" unless
//!   `size < max_buffer_length`; the size rounded up to the backend's
//!   [`heap_buffer_alignment`](Backend::heap_buffer_alignment); the pool;
//!   memory pressure; `get_free_buffer` (high watermark, gc aging, best fit
//!   by (size, address), whole reuse up to 32 MiB larger, the four
//!   oversize branches); on a miss garbage collection under pressure, then
//!   `alloc_buffer` → `ALLOCATION_FAILED` callbacks + `get_free_buffer` →
//!   `release_available_cached_buffers` + `alloc_buffer` →
//!   `release_cached_buffers` + `alloc_buffer`, in that order; heaps of
//!   8 MiB / 32 MiB / extra-large (1 GiB unified, 128 MiB discrete) or a
//!   single-buffer heap rounded to 2 MiB; the out-of-memory text word for
//!   word (with c10's `format_size`, "KiB"/"MiB"/"GiB": [`format_size`]; or
//!   2.0-2.6's "KB"/"MB"/"GB", [`format_size_2_6`]).
//! * Spec 4.3 (`state/release.rs`): free, `release_buffer` (heaps released when
//!   empty), `release_available_cached_buffers`, `release_cached_buffers`
//!   ([`HeapAllocator::empty_cache`], which synchronises the default stream
//!   with the lock released), garbage collection that stops at its target.
//! * Spec 4.4: watermarks and limits ([`crate::config::heap`]).
//! * Spec 4.5: [`CallbackRegistry`] events and [`DebugVerbosity`] messages
//!   through `tracing` (target [`crate::observe::debug::TARGET`]).
//!
//! **Retain counts and pending work.** Metal's `retainCount > 1` means a
//! command buffer still holds the buffer. Here it is work recorded for the
//! buffer with [`HeapAllocator::record_use`] (any buffer in use) or
//! [`HeapAllocator::record_events`] (shared buffers, PyTorch's
//! `recordEvents`): the retain count is one plus the buffer's recorded
//! work not yet complete. A buffer freed while busy goes back to its pool
//! at once, still busy (the seed's 2.x `free`); with
//! [`HeapSettings::free_waits_for_events`] (the later redesign) it goes to
//! the pending set (`buffers_pending_free`) and comes back when its work
//! completes. Completion handlers are polled from the backend's events at
//! the start of every operation and by
//! [`HeapAllocator::free_inactive_buffers`]. A freed scalar buffer waits
//! for its completion handler on the default stream's current command
//! buffer: it comes back once that command buffer is committed
//! ([`HeapAllocator::commit`], or `empty_cache`'s `COMMIT_AND_WAIT`) and its
//! work completes. A buffer released while busy keeps its range
//! occupied until its work completes (the heap is then in
//! `heaps_pending_update`); a heap released while such a range remains
//! leaves the pool and the totals at once and goes back to the device when
//! the work completes (ARC's deferred free). Dropping the allocator empties
//! its cache (`~MPSHeapAllocatorImpl`) and releases the heaps that hold no
//! buffer, which `emptyCache` keeps (see the `Drop` implementation).
//!
//! **Callbacks.** PyTorch 2.x fires only `ALLOCATION_FAILED`, and so does
//! Reservoir by default; with [`HeapSettings::all_callback_events`] (a
//! Reservoir extension) it fires all five [`EventType`]s:
//!
//! | event | moment | `ptr` / `size` |
//! |---|---|---|
//! | `Allocated` | a new buffer was placed in a heap (`alloc_buffer`) | buffer / its size |
//! | `Recycled` | an available buffer was reused (`get_free_buffer`) | buffer / its size |
//! | `Freed` | a buffer went back to its pool's available buffers | buffer / its size |
//! | `Released` | a buffer was released from its heap (`release_buffer`, as MPS 1.13 did) | buffer / its size |
//! | `AllocationFailed` | the first `alloc_buffer` of the failure chain failed; fired with the lock released, so a callback may free memory before the next search (2.x's place) | null / the aligned size |
//!
//! All but `AllocationFailed` fire under the allocator's lock: those
//! callbacks must not call the allocator.
//!
//! **Observability.** [`HeapAllocator::stats`] counts heaps as segments
//! (`segment`, `reserved_bytes`), buffers in use as allocations, in-use and
//! pending buffers as active; cached buffers appear in no counter but
//! `reserved_bytes` (there is no splitting, so `inactive_split` stays 0).
//! [`HeapAllocator::snapshot`] builds the caching allocator's
//! [`Snapshot`] model: heaps as segments, buffers
//! and free space as blocks. [`HeapAllocator::check_invariants`] checks
//! every heap's tiling, every free list and every counter: the invariants
//! written at the top of `state/mod.rs`, whose fields are private to it
//! (this face reads and changes them through named methods, `state/face.rs`).
//!
//! ```
//! use reservoir::config::heap::HeapSettings;
//! use reservoir::heap::{HeapAllocator, UsageFlags};
//! use reservoir::sim::SimDevice;
//!
//! let a = HeapAllocator::new(SimDevice::default(), HeapSettings::new(true)).unwrap();
//! let p = a.malloc(3 << 20, UsageFlags::PRIVATE).unwrap();
//! // A 3 MiB buffer lives in a new 32 MiB heap.
//! assert_eq!(a.total_allocated_memory(), 32 << 20);
//! a.free(p).unwrap();
//! a.empty_cache().unwrap();
//! assert_eq!(a.total_allocated_memory(), 0);
//! ```

mod state;
mod types;

use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

pub use types::{
    format_size, format_size_2_6, PoolKind, ResourceOptions, SizeFormat, StorageMode, UsageFlags,
    LARGE_HEAP, MAX_SCALAR_ALLOC, MAX_SMALL_ALLOC, MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_HEAP,
    XLARGE_HEAP_DISCRETE, XLARGE_HEAP_UNIFIED,
};

use crate::backend::{Backend, BackendError, DevicePtr, StreamId};
use crate::config::heap::{check_high_watermark, check_low_watermark, HeapSettings};
use crate::error::{AllocError, OutOfMemoryError};
use crate::observe::callbacks::{AllocatorEvent, CallbackRegistry, EventType};
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::snapshot::Snapshot;
use crate::stats::DeviceStats;
use crate::store::BlockId;
use state::{BufState, Params, State};

/// PyTorch's MPS heap allocator over a [`Backend`]. See the
/// [module documentation](self).
pub struct HeapAllocator<B: Backend> {
    backend: B,
    state: Mutex<State>,
    callbacks: Arc<CallbackRegistry>,
}

impl<B: Backend> HeapAllocator<B> {
    /// An allocator on `backend`. The recommended max memory and the max
    /// buffer length default to the backend's `mem_info().total`. Fails when
    /// a watermark ratio is out of range or the backend cannot say its
    /// memory size.
    pub fn new(backend: B, settings: HeapSettings) -> Result<HeapAllocator<B>, AllocError> {
        settings
            .validate()
            .map_err(|e| AllocError::InvalidArgument(e.to_string()))?;
        let alignment = backend.heap_buffer_alignment();
        if !alignment.is_power_of_two() || alignment > ROUND_LARGE {
            return Err(AllocError::InvalidArgument(format!(
                "heap buffer alignment {alignment} is not a power of two of at most 2 MiB"
            )));
        }
        let total = backend.mem_info()?.total;
        let callbacks = Arc::new(CallbackRegistry::new());
        let state = State::new(&settings, total, alignment, callbacks.clone());
        Ok(HeapAllocator {
            backend,
            state: Mutex::new(state),
            callbacks,
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The callback registry (spec 4.5; see the [module documentation](self)).
    pub fn callbacks(&self) -> &Arc<CallbackRegistry> {
        &self.callbacks
    }

    /// The private front-end allocator (`getIMPSAllocator(false)`).
    pub fn private_allocator(&self) -> MpsAllocator<'_, B> {
        self.front_end(UsageFlags::PRIVATE)
    }

    /// The shared front-end allocator (`getIMPSAllocator(true)`): `None` on
    /// a discrete device, where shared storage is not supported.
    pub fn shared_allocator(&self) -> Option<MpsAllocator<'_, B>> {
        self.is_shared_storage_supported()
            .then(|| self.front_end(UsageFlags::SHARED))
    }

    fn front_end(&self, usage: UsageFlags) -> MpsAllocator<'_, B> {
        let g = self.state.lock();
        if !g.debug().is_zero() {
            let shared = usage.contains(UsageFlags::SHARED);
            tracing::info!(
                target: TARGET,
                "Initializing {} heap allocator on {} device memory of size {}",
                if shared { "shared" } else { "private" },
                if g.unified() { "unified" } else { "discrete" },
                g.fs(g.max_device_size())
            );
        }
        MpsAllocator { heap: self, usage }
    }

    /// `isSharedStorageSupported`: true on unified memory.
    pub fn is_shared_storage_supported(&self) -> bool {
        self.state.lock().unified()
    }

    /// `malloc(size, usage)`: a buffer of at least `size` bytes (spec 4.2).
    /// Size 0 and sizes of at least the max buffer length ("Invalid buffer
    /// size") are [`AllocError::InvalidArgument`] and change nothing; a
    /// request the device cannot hold is [`AllocError::OutOfMemory`] with
    /// PyTorch's text.
    pub fn malloc(&self, size: u64, usage: UsageFlags) -> Result<DevicePtr, AllocError> {
        let mut g = self.state.lock();
        let b = self.alloc_buffer_block(&mut g, size, usage)?;
        let ptr = DevicePtr(g.addr(b));
        // A buffer has no stream: it is handed out for the default one (a
        // checking device reports work of any other stream still on it).
        self.backend
            .on_block_handed_out(ptr, g.size(b), StreamId::DEFAULT);
        Ok(ptr)
    }

    /// `alloc_buffer_block` (spec 4.2).
    fn alloc_buffer_block(
        &self,
        g: &mut MutexGuard<'_, State>,
        size: u64,
        usage: UsageFlags,
    ) -> Result<BlockId, AllocError> {
        let dev: &dyn Backend = &self.backend;
        if size == 0 {
            return Err(AllocError::InvalidArgument(
                "a buffer of 0 bytes (the front-end allocators return null for it)".into(),
            ));
        }
        if size >= g.max_buffer_size() {
            return Err(AllocError::InvalidArgument(format!(
                "Invalid buffer size: {}",
                g.fs(size)
            )));
        }
        g.poll(dev)?;
        let alloc_size = g.allocation_size(size);
        let pool = g.pool_for(size, alloc_size, usage);
        let mut p = Params {
            size: alloc_size,
            requested: size,
            pool,
            pressure: !pool.is_small() && g.low_watermark_value(dev) <= 0,
            found: None,
        };
        let mut found = g.get_free_buffer(dev, &mut p)?;
        if !found {
            if p.pressure && alloc_size < g.pool_available_size(pool) {
                g.garbage_collect(dev, pool)?;
            }
            found = g.alloc_buffer(dev, &mut p)?;
            // `trigger_memory_callbacks` runs the registered callbacks (with
            // the lock released here, so that they may free memory) and
            // always returns true: the second `get_free_buffer` always runs.
            if !found {
                if self.callbacks.is_active() {
                    let event = AllocatorEvent {
                        event: EventType::AllocationFailed,
                        device: 0,
                        ptr: DevicePtr::NULL,
                        size: alloc_size,
                        stream: StreamId::DEFAULT,
                    };
                    MutexGuard::unlocked(g, || self.callbacks.fire(&event));
                    g.poll(dev)?;
                }
                found = g.get_free_buffer(dev, &mut p)?;
            }
            if !found && g.release_available_cached_buffers(dev, alloc_size, pool)? {
                found = g.alloc_buffer(dev, &mut p)?;
            }
            if !found {
                g.count_alloc_retry();
                self.release_cached_buffers(g)?;
                found = g.alloc_buffer(dev, &mut p)?;
            }
        }
        match p.found.filter(|_| found) {
            Some(b) => {
                g.hand_out(b, size);
                Ok(b)
            }
            None => {
                g.count_oom();
                let info = dev.mem_info().unwrap_or_default();
                g.trace(
                    crate::observe::trace::TraceAction::Oom,
                    info.free,
                    alloc_size,
                );
                let allowed = (g.ratios().0 > 0.0).then_some(g.max_total_allowed());
                Err(AllocError::OutOfMemory(Box::new(OutOfMemoryError {
                    message: g.oom_message(dev, alloc_size, pool),
                    device: 0,
                    requested: size,
                    alloc_size,
                    stream: StreamId::DEFAULT,
                    device_free: info.free,
                    device_total: info.total,
                    allowed,
                })))
            }
        }
    }

    /// `release_cached_buffers` (spec 4.3): with the lock released, wait for
    /// the default stream; then run the completion handlers and release
    /// every available buffer of every pool (heaps freed as they empty).
    fn release_cached_buffers(&self, g: &mut MutexGuard<'_, State>) -> Result<(), AllocError> {
        let dev: &dyn Backend = &self.backend;
        if !g.debug().is_zero() {
            let mps = g.total_allocated();
            let other = g.device_allocated(dev).saturating_sub(mps);
            tracing::info!(
                target: TARGET,
                "Attempting to release cached buffers (MPS allocated: {}, other allocations: {})",
                g.fs(mps),
                g.fs(other)
            );
        }
        // COMMIT_AND_WAIT: the current command buffer (the completion
        // handlers of freed scalars) is committed, then waited for.
        g.commit(dev)?;
        MutexGuard::unlocked(g, || dev.synchronize_stream(StreamId::DEFAULT))?;
        g.count_sync_all_streams();
        g.poll(dev)?;
        // Every pool is released even after a device error; the first
        // error is returned and what failed stays cached for the next call.
        let mut first = Ok(());
        for pool in PoolKind::ALL {
            if let Err(e) = g.release_buffers(dev, pool) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// The caller's `free(ptr)` (spec 4.3). A pointer that is not a buffer
    /// in use (foreign, or freed twice) is [`AllocError::InvalidPointer`]
    /// and changes nothing. A device error while freeing is
    /// [`AllocError::FreeFailed`]: nothing was freed. Once the buffer is
    /// freed the call succeeds: the completion handlers it then runs
    /// (`freeInactiveBuffers`) report a device error at the next call.
    pub fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        let mut g = self.state.lock();
        let b = in_use(&g, ptr)?;
        g.free(&self.backend, b)
            .map_err(|source| AllocError::FreeFailed { ptr, source })?;
        // The free is done; a failed poll leaves the pending buffers for the
        // next one (every operation polls first).
        let _ = g.poll(&self.backend);
        Ok(())
    }

    /// `emptyCache` (spec 4.3): `release_cached_buffers`.
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        let mut g = self.state.lock();
        self.release_cached_buffers(&mut g)
    }

    /// `freeInactiveBuffers`: run the completion handlers now (pending
    /// frees whose work is done go back to their pools, released ranges
    /// whose work is done become free).
    pub fn free_inactive_buffers(&self) -> Result<(), AllocError> {
        self.state.lock().poll(&self.backend)
    }

    /// `recordEvents`: for each pointer that is one of the allocator's
    /// buffers (in use or cached) in a *shared* pool, record the buffer's
    /// event (one per buffer, recorded again each time) on `stream`.
    /// Private buffers and unknown pointers are skipped. True when at least
    /// one event was recorded (PyTorch: "returns true if records any
    /// event"). Reservoir's model also counts the work enqueued on `stream`
    /// so far as using the buffer (PyTorch records the event after
    /// encoding the copy that uses it): the retain count stays above 1
    /// until that work completes. For private buffers, and for work that
    /// records no event, see [`record_use`](Self::record_use). A device
    /// error recording an event gives back the events already recorded:
    /// a failed call changes no buffer.
    pub fn record_events(&self, ptrs: &[DevicePtr], stream: StreamId) -> Result<bool, AllocError> {
        // An unknown stream is refused before any event is recorded.
        self.backend
            .check_stream(stream)
            .map_err(|e| AllocError::from_stream_check(stream, e))?;
        let mut g = self.state.lock();
        let shared: Vec<BlockId> = ptrs
            .iter()
            .filter_map(|&ptr| g.buffer_at(ptr))
            .filter(|&b| g.pool_of(b).is_shared())
            .collect();
        // Every event first: a device error gives back those recorded, so
        // a failed call changes no buffer.
        let mut events = Vec::with_capacity(2 * shared.len());
        for _ in 0..2 * shared.len() {
            match self.backend.record_event(stream) {
                Ok(e) => events.push(e),
                Err(e) => {
                    for done in events {
                        let _ = self.backend.destroy_event(done);
                    }
                    return Err(e.into());
                }
            }
        }
        // Per buffer, the use first, then the buffer's event: waiting for
        // the event waits for the use.
        for (&b, pair) in shared.iter().zip(events.chunks_exact(2)) {
            if let Some(old) = g.record_buffer_event(b, pair[0], pair[1]) {
                let _ = self.backend.destroy_event(old);
            }
        }
        Ok(!shared.is_empty())
    }

    /// Reservoir extension (no PyTorch call): the buffers are used by the
    /// work enqueued on `stream` so far, as a Metal command buffer retains
    /// the buffers it uses: each one's retain count stays above 1 until
    /// that work completes (which `get_free_buffer`'s oversize branches,
    /// garbage collection, `release_buffer` and, with
    /// [`HeapSettings::free_waits_for_events`], `free` look at). Private
    /// and shared buffers alike. Every pointer must be a buffer in use;
    /// otherwise [`AllocError::InvalidPointer`] for the first that is not,
    /// and nothing is recorded. An unknown stream is
    /// [`AllocError::UnknownStream`]; a device error recording an event
    /// gives back the events already recorded, so a failed call records
    /// nothing.
    pub fn record_use(&self, ptrs: &[DevicePtr], stream: StreamId) -> Result<(), AllocError> {
        self.backend
            .check_stream(stream)
            .map_err(|e| AllocError::from_stream_check(stream, e))?;
        let mut g = self.state.lock();
        let bufs: Vec<BlockId> = ptrs
            .iter()
            .map(|&ptr| in_use(&g, ptr))
            .collect::<Result<_, _>>()?;
        let mut events = Vec::with_capacity(bufs.len());
        for _ in &bufs {
            match self.backend.record_event(stream) {
                Ok(e) => events.push(e),
                Err(e) => {
                    for done in events {
                        let _ = self.backend.destroy_event(done);
                    }
                    return Err(e.into());
                }
            }
        }
        for (b, e) in bufs.into_iter().zip(events) {
            g.record_use(b, e);
        }
        Ok(())
    }

    /// `waitForEvents`: for the shared buffers among `ptrs` (in use or
    /// cached) whose retain count is above 1 and that have a recorded
    /// event, wait on the host for that event, then run the completion
    /// handlers (`freeInactiveBuffers`). True when it waited and a buffer's
    /// retain count fell to 1 (PyTorch: "returns true if actually waited on
    /// any event"); false when there was nothing to wait for.
    pub fn wait_for_events(&self, ptrs: &[DevicePtr]) -> Result<bool, AllocError> {
        let mut todo = Vec::new();
        {
            let mut g = self.state.lock();
            for ptr in ptrs {
                let Some(b) = g.buffer_at(*ptr) else {
                    continue;
                };
                if !g.pool_of(b).is_shared() {
                    continue;
                }
                let Some(event) = g.buffer_event(b) else {
                    continue;
                };
                if g.retain_count(&self.backend, b)? > 1 {
                    todo.push((*ptr, b, event));
                }
            }
        }
        let mut waited = false;
        for (ptr, b, event) in todo {
            // The retain count again: an earlier wait may have freed it.
            let busy = {
                let mut g = self.state.lock();
                g.buffer_at(ptr) == Some(b)
                    && g.buffer_event(b) == Some(event)
                    && g.retain_count(&self.backend, b)? > 1
            };
            if !busy {
                continue;
            }
            self.backend.synchronize_event(event)?;
            self.free_inactive_buffers()?;
            let mut g = self.state.lock();
            waited |= g.buffer_at(ptr) != Some(b) || g.retain_count(&self.backend, b)? <= 1;
        }
        Ok(waited)
    }

    /// Reservoir's stand-in for the MPS stream committing its current
    /// command buffer (every MPS operation does): the scalar buffers freed
    /// since the last commit (whose completion handlers sit on that command
    /// buffer) come back once the work enqueued on the default stream so
    /// far completes. `empty_cache` commits too (`COMMIT_AND_WAIT`).
    pub fn commit(&self) -> Result<(), AllocError> {
        let mut g = self.state.lock();
        g.commit(&self.backend)?;
        g.poll(&self.backend)
    }

    /// `allocScalarBufferWithValue`: a buffer of the scalar pool holding
    /// `value` (any length, as PyTorch: the scalar pool takes any size).
    /// Needs a backend the host can write ([`Backend::as_host_write`]);
    /// otherwise [`BackendError::Unsupported`], with nothing changed.
    pub fn alloc_scalar_buffer_with_value(&self, value: &[u8]) -> Result<DevicePtr, AllocError> {
        let Some(host) = self.backend.as_host_write() else {
            return Err(BackendError::Unsupported {
                backend: self.backend.name(),
                what: "scalar buffers with a value (no host-visible memory)",
            }
            .into());
        };
        let ptr = self.malloc(value.len() as u64, UsageFlags::SCALAR)?;
        if let Err(e) = host.write_host(ptr, value) {
            self.free(ptr)?;
            return Err(e.into());
        }
        Ok(ptr)
    }

    /// `isSharedBuffer`: the pointer is a live buffer of a shared pool.
    pub fn is_shared_buffer(&self, ptr: DevicePtr) -> bool {
        let g = self.state.lock();
        g.buffer_at(ptr).is_some_and(|b| g.pool_of(b).is_shared())
    }

    /// `is_pinned_mps`: the shared allocator's `isSharedBuffer`.
    pub fn is_pinned_ptr(&self, ptr: DevicePtr) -> bool {
        self.is_shared_buffer(ptr)
    }

    /// `getSharedBufferPtr`: the host address of a shared buffer (in use or
    /// cached, as PyTorch's `get_allocated_buffer_block`) and its retain count (`MPSAllocator.mm` returns `{cpu_ptr,
    /// retainCount()}`; the second value is not an offset). The host
    /// address comes from the backend's [`HostMapping`](crate::backend::HostMapping).
    /// Where PyTorch answers `{nullptr, 0}`, Reservoir answers a typed error
    /// and changes nothing: [`AllocError::InvalidPointer`] for a pointer that
    /// is not one of its buffers, [`AllocError::InvalidArgument`] for a private
    /// buffer, [`BackendError::Unsupported`] on a backend the host cannot
    /// address.
    pub fn shared_buffer_ptr(&self, ptr: DevicePtr) -> Result<(u64, u32), AllocError> {
        let mut g = self.state.lock();
        let b = g.buffer_at(ptr).ok_or(AllocError::InvalidPointer { ptr })?;
        let pool = g.pool_of(b);
        if !pool.is_shared() {
            return Err(AllocError::InvalidArgument(format!(
                "the buffer at {ptr} is in the {pool} pool: only shared buffers have a host pointer"
            )));
        }
        let Some(map) = self.backend.as_host_mapping() else {
            return Err(BackendError::Unsupported {
                backend: self.backend.name(),
                what: "shared buffer pointers (no host-visible memory)",
            }
            .into());
        };
        let host = map.host_address(ptr, g.size(b))?;
        let retain = g.retain_count(&self.backend, b)?;
        Ok((host, retain))
    }

    /// `getUnalignedBufferSize`: the requested size of a live buffer
    /// (PyTorch's -1 for an unknown pointer is `None`).
    pub fn unaligned_buffer_size(&self, ptr: DevicePtr) -> Option<u64> {
        let g = self.state.lock();
        g.buffer_at(ptr).map(|b| g.requested(b))
    }

    /// `getBufferId`: the buffer's number, 0 for an unknown pointer.
    pub fn buffer_id(&self, ptr: DevicePtr) -> u64 {
        let g = self.state.lock();
        g.buffer_at(ptr).map_or(0, |b| g.buffer_id(b))
    }

    /// `getBufferShape`: the shape set on a live buffer (empty if none).
    pub fn buffer_shape(&self, ptr: DevicePtr) -> Vec<i64> {
        let g = self.state.lock();
        g.buffer_at(ptr)
            .map(|b| g.shape(b).to_vec())
            .unwrap_or_default()
    }

    /// `setBufferShape`: remember a shape on a live buffer (cleared when it
    /// is freed). An unknown pointer is [`AllocError::InvalidPointer`].
    pub fn set_buffer_shape(&self, ptr: DevicePtr, shape: &[i64]) -> Result<(), AllocError> {
        let mut g = self.state.lock();
        let b = g.buffer_at(ptr).ok_or(AllocError::InvalidPointer { ptr })?;
        g.set_shape(b, shape.to_vec());
        Ok(())
    }

    /// `getTotalAllocatedMemory`: bytes of the heaps.
    pub fn total_allocated_memory(&self) -> u64 {
        self.state.lock().total_allocated()
    }

    /// `getCurrentAllocatedMemory`: bytes of the buffers in use (and freed
    /// buffers still pending).
    pub fn current_allocated_memory(&self) -> u64 {
        self.state.lock().current_allocated()
    }

    /// `getDriverAllocatedMemory`: what the device has handed out to anyone
    /// (`device.currentAllocatedSize`).
    pub fn driver_allocated_memory(&self) -> u64 {
        self.state.lock().device_allocated(&self.backend)
    }

    /// `recommendedMaxWorkingSetSize`.
    pub fn recommended_max_memory(&self) -> u64 {
        self.state.lock().max_device_size()
    }

    /// `getLowWatermarkValue` (spec 4.4).
    pub fn low_watermark_value(&self) -> i64 {
        self.state.lock().low_watermark_value(&self.backend)
    }

    /// `getLowWatermarkLimit` (`u64::MAX` when disabled).
    pub fn low_watermark_limit(&self) -> u64 {
        self.state.lock().low_limit()
    }

    /// `getHighWatermarkLimit` (`u64::MAX` when unlimited).
    pub fn high_watermark_limit(&self) -> u64 {
        self.state.lock().max_total_allowed()
    }

    /// The high and low watermark ratios.
    pub fn watermark_ratios(&self) -> (f64, f64) {
        self.state.lock().ratios()
    }

    /// `setHighWatermarkRatio` (`torch.mps.set_per_process_memory_fraction`):
    /// valid `[0, 2.0]`, else an error and nothing changes.
    pub fn set_high_watermark_ratio(&self, ratio: f64) -> Result<(), AllocError> {
        check_high_watermark(ratio).map_err(|e| AllocError::InvalidArgument(e.to_string()))?;
        self.state.lock().set_high_ratio(ratio);
        Ok(())
    }

    /// `setLowWatermarkRatio`: valid `[0, high]` (`[0, 2.0]` when high is
    /// 0), else an error and nothing changes.
    pub fn set_low_watermark_ratio(&self, ratio: f64) -> Result<(), AllocError> {
        let mut g = self.state.lock();
        check_low_watermark(ratio, g.ratios().0)
            .map_err(|e| AllocError::InvalidArgument(e.to_string()))?;
        g.set_low_ratio(ratio);
        Ok(())
    }

    /// `formatSize`: a size as this allocator writes it in messages (the
    /// [`SizeFormat`] of its settings: [`format_size`] by default).
    pub fn format_size(&self, size: u64) -> String {
        self.state.lock().fs(size)
    }

    /// Turn the Reservoir extension [`HeapSettings::all_callback_events`] on
    /// or off.
    pub fn set_all_callback_events(&self, on: bool) {
        self.state.lock().set_all_callback_events(on);
    }

    /// The debug bitmask in force.
    pub fn debug_verbosity(&self) -> DebugVerbosity {
        self.state.lock().debug()
    }

    /// Change the debug bitmask.
    pub fn set_debug_verbosity(&self, v: DebugVerbosity) {
        self.state.lock().set_debug(v);
    }

    /// The statistics (see the [module documentation](self)).
    pub fn stats(&self) -> DeviceStats {
        *self.state.lock().stats()
    }

    /// Bytes of the buffers in use and of the heaps, from the statistics
    /// (`allocated_bytes` and `reserved_bytes`, current); cheap.
    pub fn allocated_and_reserved(&self) -> (u64, u64) {
        let g = self.state.lock();
        let all = |s: &crate::stats::StatArray| s.all().current.max(0) as u64;
        (
            all(&g.stats().allocated_bytes),
            all(&g.stats().reserved_bytes),
        )
    }

    /// `resetAccumulatedStats`: zero the counts of events (allocations,
    /// frees, device calls, retries, OOMs); current values and peaks stay.
    pub fn reset_accumulated_stats(&self) {
        self.state.lock().reset_accumulated_stats();
    }

    /// `resetPeakStats`: every peak becomes the current value.
    pub fn reset_peak_stats(&self) {
        self.state.lock().reset_peak_stats();
    }

    /// Record the allocation history, keeping the newest `max_entries`
    /// entries (`Some`), or stop and forget it (`None`), as
    /// `torch.cuda.memory._record_memory_history` does: `alloc`,
    /// `free_requested` and `free_completed` of buffers (their requested
    /// sizes), `segment_alloc` / `segment_free` of heaps and `oom` (the
    /// device's free bytes, the aligned size), on the default stream.
    pub fn record_history(&self, max_entries: Option<usize>) {
        self.state.lock().set_history(max_entries);
    }

    /// The heaps and buffers as a [`Snapshot`] (heaps as segments), with
    /// the history when it is recorded ([`record_history`](Self::record_history)).
    pub fn snapshot(&self) -> Snapshot {
        let g = self.state.lock();
        let mut snap = g.snapshot();
        if let Some(entries) = g.history_entries() {
            snap.device_traces = vec![entries];
        }
        snap
    }

    /// Check every invariant; the message says which broke.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.state.lock().check()
    }
}

/// `~MPSHeapAllocatorImpl()`: `emptyCache()`. Cached buffers and the heaps
/// they empty go back to the backend; buffers still in use keep theirs.
/// Then (Reservoir; PyTorch leaves them to the process's exit) every heap
/// that holds no buffer goes back too: `emptyCache` keeps such heaps
/// (garbage collection empties split heaps without releasing them), and
/// nothing could release them once the allocator is gone. A failure (or a
/// panicking callback) is logged as a `tracing` warning, never raised.
impl<B: Backend> Drop for HeapAllocator<B> {
    fn drop(&mut self) {
        let run = std::panic::AssertUnwindSafe(|| {
            let mut g = self.state.lock();
            let cached = self.release_cached_buffers(&mut g);
            let empty = g.release_empty_heaps(&self.backend);
            cached.and(empty)
        });
        match std::panic::catch_unwind(run) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(
                target: TARGET,
                "the heap allocator could not empty its cache when dropped: {e}"
            ),
            Err(_) => tracing::warn!(
                target: TARGET,
                "the heap allocator panicked while emptying its cache when dropped"
            ),
        }
    }
}

/// The buffer in use at `ptr`.
fn in_use(g: &State, ptr: DevicePtr) -> Result<BlockId, AllocError> {
    g.buffer_at(ptr)
        .filter(|&b| g.buffer_state(b) == BufState::InUse)
        .ok_or(AllocError::InvalidPointer { ptr })
}

/// A front-end allocator (PyTorch's `MPSAllocator`): the heap allocator
/// with fixed usage flags, private or shared.
#[derive(Clone, Copy)]
pub struct MpsAllocator<'a, B: Backend> {
    heap: &'a HeapAllocator<B>,
    usage: UsageFlags,
}

impl<B: Backend> MpsAllocator<'_, B> {
    /// `allocate(nbytes)`: null for 0 bytes (as PyTorch), else
    /// [`HeapAllocator::malloc`] with this allocator's usage.
    pub fn allocate(&self, nbytes: u64) -> Result<DevicePtr, AllocError> {
        if nbytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.heap.malloc(nbytes, self.usage)
    }

    /// The deleter: frees a non-null pointer.
    pub fn delete(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.heap.free(ptr)
    }

    /// The usage flags of this allocator.
    pub fn usage(&self) -> UsageFlags {
        self.usage
    }

    /// The heap allocator behind it.
    pub fn heap(&self) -> &HeapAllocator<B> {
        self.heap
    }
}
