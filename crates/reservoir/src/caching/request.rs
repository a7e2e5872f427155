//! The request types of the caching allocator: what a request carries on
//! its way through malloc ([`AllocParams`]) and how it fails
//! ([`MallocError`], [`OomReport`]), and the callbacks a device holds for
//! requests ([`FreeMemoryCallback`], [`OomObserver`]). They depend on no
//! other part of `caching/`, so every owner can name them.

use std::sync::Arc;

use crate::backend::{BackendError, DevicePtr, StreamId};
use crate::config::AllocatorConfig;
use crate::error::{AllocError, OutOfMemoryError};
use crate::stats::StatType;
use crate::store::{BlockId, PoolId};

/// A callback run when the cache has no fitting block, before the driver is
/// asked (PyTorch's `FreeCudaMemoryCallbacksRegistry`). It returns the
/// pointers it wants freed (for example allocations whose last outside
/// reference just went away); returning any counts as "freed something" and
/// the cache is searched again.
pub type FreeMemoryCallback = Box<dyn FnMut() -> Vec<DevicePtr> + Send>;

pub(crate) enum MallocError {
    Oom(Box<OomReport>),
    /// Every attempt failed and the caller asked not to report it yet
    /// ([`DeviceState::malloc_or_would_oom`]): nothing counted or recorded.
    WouldOom,
    Other(AllocError),
}

impl From<BackendError> for MallocError {
    fn from(e: BackendError) -> Self {
        MallocError::Other(AllocError::Backend(e))
    }
}

/// One allocation request on its way through malloc (PyTorch's `AllocParams`).
pub(super) struct AllocParams {
    pub size: u64,
    pub stream: StreamId,
    pub pool: PoolId,
    pub stat_type: StatType,
    /// The block found for the request, once found.
    pub block: Option<BlockId>,
    /// Whether a growth for this request is a segment of its own
    /// (`cudaMalloc` of the allocation size, spec 1.9) even though expandable
    /// segments are on: the `reservoir` policy's choice on this call's cache
    /// miss (`trim_before_growth`, `policy/reservoir.rs`). False in PyTorch
    /// mode.
    pub own_segment: bool,
}

impl AllocParams {
    /// spec 1.4: the bytes a cache miss for this request asks the driver for.
    #[inline]
    pub fn alloc_size(&self, config: &AllocatorConfig) -> u64 {
        super::rules::allocation_size(self.size, config)
    }
}

/// Arguments of an out-of-memory observer (PyTorch's `OutOfMemoryObserver`):
/// device, bytes it tried to allocate, bytes allowed (limit or total), free bytes.
pub type OomObserver = Arc<dyn Fn(i8, u64, u64, u64) + Send + Sync>;

/// What a failed malloc hands back to the lock holder, so observers run
/// after the lock is released.
pub(crate) struct OomReport {
    pub error: OutOfMemoryError,
    pub observers: Vec<OomObserver>,
}

impl From<MallocError> for AllocError {
    fn from(e: MallocError) -> AllocError {
        match e {
            MallocError::Other(e) => e,
            MallocError::Oom(r) => AllocError::OutOfMemory(Box::new(r.error)),
            // Only `malloc_or_would_oom` returns it, and its callers handle it.
            MallocError::WouldOom => AllocError::InvalidState("out of memory".into()),
        }
    }
}
