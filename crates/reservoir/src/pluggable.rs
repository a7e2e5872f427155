//! PyTorch's `CUDAPluggableAllocator` (spec section 3): an allocator made of
//! user functions.
//!
//! [`PluggableAllocator`] is what `torch.cuda.memory.CUDAPluggableAllocator`
//! builds around a library's `alloc(size, device, stream)` and
//! `free(ptr, size, device, stream)`: no caching, no rounding, no zero-size
//! short cut; [`malloc`](PluggableAllocator::malloc) stores
//! `ptr -> (size, device, stream)` and
//! [`raw_delete`](PluggableAllocator::raw_delete) hands the *original*
//! values back to `free` ("Trying to free a pointer not allocated here"
//! when the pointer is unknown). The optional C++ hooks (`init_fn`,
//! `reset_fn`, `memory_fraction_fn`, `base_alloc_fn`, `record_stream_fn`,
//! `begin/end_allocate_to_pool`, `release_pool`) are no-ops when unset.
//! Statistics are not supported, as in PyTorch.
//!
//! [`PluggableBackend`] is the other use (`MemPool(allocator=...)`, torch
//! 2.5+): the user functions replace `cudaMalloc` / `cudaFree` under
//! Reservoir's [`CachingAllocator`](crate::CachingAllocator), while streams,
//! events and memory information come from an inner [`Backend`].

use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::backend::{Backend, BackendError, EventId, MemInfo};
use crate::error::AllocError;
use crate::ids::{DevicePtr, MempoolId, StreamId};

/// The library's `alloc(size, device, stream)`: a pointer, or `None` (a null
/// return, which torch reports as out of memory).
pub type AllocFn = Arc<dyn Fn(u64, i8, StreamId) -> Option<DevicePtr> + Send + Sync>;
/// The library's `free(ptr, size, device, stream)`, called with the values
/// the pointer was allocated with.
pub type FreeFn = Arc<dyn Fn(DevicePtr, u64, i8, StreamId) + Send + Sync>;

/// The optional hooks of a pluggable allocator (`set_init_fn` and friends in
/// PyTorch's C++ API). Each unset hook is a no-op.
#[derive(Clone, Default)]
#[allow(clippy::type_complexity)] // each field is one documented C++ hook
pub struct PluggableHooks {
    /// `init_fn(device_count)`, called by [`PluggableAllocator::init`].
    pub init: Option<Arc<dyn Fn(usize) + Send + Sync>>,
    /// `reset_fn()`, PyTorch's `emptyCache`.
    pub reset: Option<Arc<dyn Fn() + Send + Sync>>,
    /// `memory_fraction_fn(fraction, device)`.
    pub memory_fraction: Option<Arc<dyn Fn(f64, i8) + Send + Sync>>,
    /// `base_alloc_fn(ptr, &size)`: the base of the allocation holding `ptr`
    /// (`getBaseAllocation`); unset, `ptr` itself.
    pub base_alloc: Option<Arc<dyn Fn(DevicePtr, &mut u64) -> DevicePtr + Send + Sync>>,
    /// `record_stream_fn(ptr, stream)`.
    pub record_stream: Option<Arc<dyn Fn(DevicePtr, StreamId) + Send + Sync>>,
    /// `begin_allocate_to_pool(device, pool)`.
    pub begin_allocate_to_pool: Option<Arc<dyn Fn(i8, MempoolId) + Send + Sync>>,
    /// `end_allocate_to_pool(device, pool)`.
    pub end_allocate_to_pool: Option<Arc<dyn Fn(i8, MempoolId) + Send + Sync>>,
    /// `release_pool(device, pool)`.
    pub release_pool: Option<Arc<dyn Fn(i8, MempoolId) + Send + Sync>>,
}

/// What the wrapper remembers of a live pointer (PyTorch's `_AllocationMetadata`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationRecord {
    /// The size asked for.
    pub size: u64,
    /// The device it was allocated on.
    pub device: i8,
    /// The stream it was allocated for.
    pub stream: StreamId,
}

/// PyTorch's `CUDAPluggableAllocator`: user functions plus pointer
/// bookkeeping (see the [module docs](self)).
pub struct PluggableAllocator {
    alloc_fn: AllocFn,
    free_fn: FreeFn,
    hooks: PluggableHooks,
    allocations: Mutex<FxHashMap<u64, AllocationRecord>>,
}

impl std::fmt::Debug for PluggableAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluggableAllocator")
            .field("live", &self.allocations.lock().len())
            .finish_non_exhaustive()
    }
}

impl PluggableAllocator {
    /// An allocator made of `alloc` and `free`, without hooks.
    pub fn new(alloc: AllocFn, free: FreeFn) -> Self {
        Self::with_hooks(alloc, free, PluggableHooks::default())
    }

    /// An allocator made of `alloc`, `free` and the optional `hooks`.
    pub fn with_hooks(alloc: AllocFn, free: FreeFn, hooks: PluggableHooks) -> Self {
        PluggableAllocator {
            alloc_fn: alloc,
            free_fn: free,
            hooks,
            allocations: Mutex::new(FxHashMap::default()),
        }
    }

    /// `"pluggable"`, PyTorch's `name()`.
    pub fn name(&self) -> &'static str {
        "pluggable"
    }

    /// `init(device_count)`: the `init_fn` hook.
    pub fn init(&self, device_count: usize) {
        if let Some(f) = &self.hooks.init {
            f(device_count);
        }
    }

    /// `malloc(size, device, stream)`: call `alloc` and remember the pointer.
    /// A null return is [`BackendError::OutOfMemory`] (torch raises
    /// `torch.OutOfMemoryError`) and is not remembered.
    pub fn malloc(&self, size: u64, device: i8, stream: StreamId) -> Result<DevicePtr, AllocError> {
        let ptr = (self.alloc_fn)(size, device, stream)
            .filter(|p| !p.is_null())
            .ok_or(BackendError::OutOfMemory {
                requested: size,
                free: 0,
            })?;
        let record = AllocationRecord {
            size,
            device,
            stream,
        };
        self.allocations.lock().insert(ptr.0, record);
        Ok(ptr)
    }

    /// `raw_delete(ptr)`: forget `ptr` and call `free` with its original
    /// size, device and stream. An unknown pointer is
    /// [`AllocError::InvalidState`] with PyTorch's text, and `free` is not
    /// called.
    pub fn raw_delete(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        let record = self.allocations.lock().remove(&ptr.0).ok_or_else(|| {
            AllocError::InvalidState("Trying to free a pointer not allocated here".into())
        })?;
        (self.free_fn)(ptr, record.size, record.device, record.stream);
        Ok(())
    }

    /// What is remembered of `ptr`, if it is live.
    pub fn allocation(&self, ptr: DevicePtr) -> Option<AllocationRecord> {
        self.allocations.lock().get(&ptr.0).copied()
    }

    /// The number of live pointers.
    pub fn live(&self) -> usize {
        self.allocations.lock().len()
    }

    /// `emptyCache()`: the `reset_fn` hook.
    pub fn empty_cache(&self) {
        if let Some(f) = &self.hooks.reset {
            f();
        }
    }

    /// `setMemoryFraction(fraction, device)`: the `memory_fraction_fn` hook.
    pub fn set_memory_fraction(&self, fraction: f64, device: i8) {
        if let Some(f) = &self.hooks.memory_fraction {
            f(fraction, device);
        }
    }

    /// `getBaseAllocation(ptr, &size)`: the `base_alloc_fn` hook, or `ptr`
    /// itself.
    pub fn base_allocation(&self, ptr: DevicePtr, size: &mut u64) -> DevicePtr {
        match &self.hooks.base_alloc {
            Some(f) => f(ptr, size),
            None => ptr,
        }
    }

    /// `recordStream(ptr, stream)`: the `record_stream_fn` hook.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) {
        if let Some(f) = &self.hooks.record_stream {
            f(ptr, stream);
        }
    }

    /// `beginAllocateToPool(device, pool)`: the hook of that name.
    pub fn begin_allocate_to_pool(&self, device: i8, pool: MempoolId) {
        if let Some(f) = &self.hooks.begin_allocate_to_pool {
            f(device, pool);
        }
    }

    /// `endAllocateToPool(device, pool)`: the hook of that name.
    pub fn end_allocate_to_pool(&self, device: i8, pool: MempoolId) {
        if let Some(f) = &self.hooks.end_allocate_to_pool {
            f(device, pool);
        }
    }

    /// `releasePool(device, pool)`: the `release_pool` hook.
    pub fn release_pool(&self, device: i8, pool: MempoolId) {
        if let Some(f) = &self.hooks.release_pool {
            f(device, pool);
        }
    }

    /// `getDeviceStats`: unsupported, as in PyTorch (so `memory_stats()`
    /// fails with a pluggable allocator).
    pub fn stats(&self) -> Result<crate::stats::DeviceStats, AllocError> {
        Err(AllocError::InvalidState(
            "CUDAPluggableAllocator does not yet support getDeviceStats. If you need it, please \
             file an issue describing your use case."
                .into(),
        ))
    }
}

/// A [`Backend`] whose segments come from a [`PluggableAllocator`]
/// (torch's `MemPool(allocator=pluggable.allocator())`): `allocate` and
/// `free` call the user functions for device `device`; streams, events and
/// memory information are the inner backend's.
#[derive(Debug)]
pub struct PluggableBackend<B: Backend> {
    allocator: PluggableAllocator,
    device: i8,
    inner: B,
}

impl<B: Backend> PluggableBackend<B> {
    /// Segments of device `device` from `allocator`; everything else from `inner`.
    pub fn new(allocator: PluggableAllocator, device: i8, inner: B) -> Self {
        PluggableBackend {
            allocator,
            device,
            inner,
        }
    }

    /// The pluggable allocator.
    pub fn allocator(&self) -> &PluggableAllocator {
        &self.allocator
    }

    /// The inner backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: Backend> Backend for PluggableBackend<B> {
    fn name(&self) -> &'static str {
        self.allocator.name()
    }

    fn device_kind(&self) -> crate::ids::DeviceKind {
        self.inner.device_kind()
    }

    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.allocator
            .malloc(size, self.device, stream)
            .map_err(|e| match e {
                AllocError::Backend(e) => e,
                e => BackendError::Driver(e.to_string()),
            })
    }

    fn free(&self, ptr: DevicePtr, _size: u64) -> Result<(), BackendError> {
        self.allocator
            .raw_delete(ptr)
            .map_err(|e| BackendError::InvalidValue(format!("{ptr}: {e}")))
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.inner.mem_info()
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        self.inner.create_stream()
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.inner.check_stream(stream)
    }

    fn stream_epoch(&self) -> u64 {
        self.inner.stream_epoch()
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.inner.record_event(stream)
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.inner.query_event(event)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        self.inner.synchronize_event(event)
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        self.inner.destroy_event(event)
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.inner.synchronize_stream(stream)
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.inner.synchronize_device()
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.inner.stream_wait_event(stream, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimDevice;
    use crate::{AllocatorConfig, CachingAllocator};

    type Calls = Arc<Mutex<Vec<(DevicePtr, u64, i8, StreamId)>>>;

    /// `alloc`/`free` over a simulated device, logging every `free` call.
    fn user_functions() -> (AllocFn, FreeFn, Calls) {
        let dev = Arc::new(SimDevice::default());
        let frees: Calls = Arc::default();
        let d = dev.clone();
        let alloc: AllocFn = Arc::new(move |size, _, stream| d.allocate(size, stream).ok());
        let log = frees.clone();
        let free: FreeFn = Arc::new(move |ptr, size, device, stream| {
            log.lock().push((ptr, size, device, stream));
            dev.free(ptr, size).unwrap();
        });
        (alloc, free, frees)
    }

    #[test]
    fn free_gets_the_original_size_device_and_stream() {
        let (alloc, free, frees) = user_functions();
        let a = PluggableAllocator::new(alloc, free);
        let p = a.malloc(1000, 3, StreamId(7)).unwrap();
        assert_eq!(a.live(), 1);
        assert_eq!(a.allocation(p).unwrap().size, 1000);
        a.raw_delete(p).unwrap();
        assert_eq!(*frees.lock(), [(p, 1000, 3, StreamId(7))]);
        let e = a.raw_delete(p).unwrap_err();
        assert_eq!(e.to_string(), "Trying to free a pointer not allocated here");
        assert_eq!(
            frees.lock().len(),
            1,
            "free is not called for an unknown pointer"
        );
        assert!(a
            .stats()
            .unwrap_err()
            .to_string()
            .contains("does not yet support getDeviceStats"));
    }

    #[test]
    fn a_null_alloc_is_out_of_memory_and_hooks_are_called() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let c = calls.clone();
        let hooks = PluggableHooks {
            reset: Some(Arc::new(move || c.lock().push("reset"))),
            ..PluggableHooks::default()
        };
        let a = PluggableAllocator::with_hooks(
            Arc::new(|_, _, _| None),
            Arc::new(|_, _, _, _| {}),
            hooks,
        );
        let e = a.malloc(64, 0, StreamId::DEFAULT).unwrap_err();
        assert!(matches!(
            e,
            AllocError::Backend(BackendError::OutOfMemory { requested: 64, .. })
        ));
        assert_eq!(a.live(), 0);
        a.empty_cache();
        a.record_stream(DevicePtr(1), StreamId(2)); // unset: a no-op
        let mut size = 5;
        assert_eq!(a.base_allocation(DevicePtr(9), &mut size), DevicePtr(9));
        assert_eq!(*calls.lock(), ["reset"]);
    }

    #[test]
    fn the_caching_allocator_runs_over_user_functions() {
        let (alloc, free, frees) = user_functions();
        let backend = PluggableBackend::new(
            PluggableAllocator::new(alloc, free),
            0,
            SimDevice::default(),
        );
        let c = CachingAllocator::new(backend, AllocatorConfig::default());
        let p = c.raw_alloc(1 << 20, StreamId::DEFAULT).unwrap();
        // One 2 MiB small segment from the user's alloc.
        assert_eq!(c.backend().allocator().live(), 1);
        c.raw_free(p).unwrap();
        assert!(frees.lock().is_empty(), "cached, not freed");
        c.empty_cache().unwrap();
        assert_eq!(*frees.lock(), [(p, 2 << 20, 0, StreamId::DEFAULT)]);
        assert_eq!(c.backend().allocator().live(), 0);
    }
}
