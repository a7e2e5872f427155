//! The CUDA-style caching allocator, exact to PyTorch's native allocator.
//!
//! [`CachingAllocator`] owns a [`Backend`] and one device's state behind one
//! lock (as PyTorch's `DeviceCachingAllocator` does). Requests are rounded,
//! served best-fit from per-stream pools of free blocks, split and merged; the
//! driver is called only when the cache cannot serve a request, and the whole
//! retry chain (free-memory callbacks, garbage collection, releasing one
//! oversize block, flushing the cache) runs before an out-of-memory error
//! carrying PyTorch's message.

mod block;
mod check;
mod cross_stream;
mod device;
mod pools;
pub mod rules;

use std::collections::BTreeMap;

use parking_lot::Mutex;

use crate::backend::{Backend, DevicePtr, MemInfo, StreamId};
use crate::config::AllocatorConfig;
use crate::device_allocator::MempoolId;
use crate::error::AllocError;
use crate::stats::DeviceStats;
use crate::trace::{RingBuffer, TraceEntry};

pub use check::InvariantViolation;
use device::{DeviceState, MallocError};
pub use device::{FreeMemoryCallback, OomObserver};
pub use pools::{BlockCheckpoint, PoolCheckpoint, PoolFilter, RestoreResult, SegmentCheckpoint};

/// State of a block in a snapshot (spec 2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting for other streams' work.
    ActivePendingFree,
    /// Free and cached.
    Inactive,
}

impl BlockState {
    /// PyTorch's string for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a [`SegmentInfo`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BlockInfo {
    /// First address.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// Bytes last requested for it (stale on free blocks, as in PyTorch).
    pub requested_size: u64,
    /// Allocated, pending or free.
    pub state: BlockState,
}

/// One segment of the allocator's state, blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SegmentInfo {
    /// First address.
    pub address: u64,
    /// Bytes reserved from the device.
    pub total_size: u64,
    /// Stream the segment serves.
    pub stream: StreamId,
    /// Small pool (2 MiB segments of blocks up to 1 MiB)?
    pub is_small: bool,
    /// One mapped run of an expandable segment?
    pub is_expandable: bool,
    /// The pool that owns it ([`MempoolId::DEFAULT`] for the global pools).
    pub pool_id: MempoolId,
    /// The blocks, tiling the segment.
    pub blocks: Vec<BlockInfo>,
}

/// PyTorch's CUDA caching allocator over any [`Backend`], for one device.
///
/// `Send + Sync`: share it between threads behind an `Arc`. Every call takes
/// the device lock once.
pub struct CachingAllocator<B: Backend> {
    backend: B,
    state: Mutex<DeviceState>,
}

impl<B: Backend> CachingAllocator<B> {
    /// An allocator for device 0 with the given settings.
    pub fn new(backend: B, config: AllocatorConfig) -> Self {
        Self::with_device(backend, config, 0)
    }

    /// An allocator for device `device`.
    pub fn with_device(backend: B, config: AllocatorConfig, device: i8) -> Self {
        let config = supported(config, &backend);
        let fraction = config.per_process_memory_fraction;
        let mut state = DeviceState::new(device, config);
        if fraction < 1.0 {
            if let Ok(info) = backend.mem_info() {
                state.set_memory_fraction(fraction, info.total);
            }
        }
        CachingAllocator {
            backend,
            state: Mutex::new(state),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The device index.
    pub fn device(&self) -> i8 {
        self.state.lock().device
    }

    /// Allocate `size` bytes for use on `stream` (PyTorch's
    /// `raw_alloc_with_stream`). A zero-byte request returns
    /// [`DevicePtr::NULL`] and allocates nothing.
    pub fn raw_alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if size == 0 {
            return Ok(DevicePtr::NULL);
        }
        let mut state = self.state.lock();
        match state.malloc(&self.backend, size, stream) {
            Ok(id) => Ok(DevicePtr(state.blocks[id].addr)),
            Err(MallocError::Other(e)) => Err(e),
            Err(MallocError::Oom(report)) => {
                drop(state);
                let e = report.error;
                let limit = e.allowed.unwrap_or(e.device_total);
                for obs in &report.observers {
                    obs(e.device, e.alloc_size, limit, e.device_free);
                }
                Err(AllocError::OutOfMemory(Box::new(e)))
            }
        }
    }

    /// Free a pointer returned by [`raw_alloc`](Self::raw_alloc). Freeing
    /// null is a no-op; a pointer this allocator did not hand out (or already
    /// freed) is an [`AllocError::InvalidPointer`] and changes nothing.
    pub fn raw_free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut state = self.state.lock();
        let Some(id) = state.allocated.remove(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        state.free(&self.backend, id)
    }

    /// Allocate and return an owning handle that frees on drop.
    pub fn alloc(&self, size: u64, stream: StreamId) -> Result<Allocation<'_, B>, AllocError> {
        let ptr = self.raw_alloc(size, stream)?;
        Ok(Allocation {
            allocator: self,
            ptr,
            size,
        })
    }

    /// Mark the block at `ptr` as used by `stream` (PyTorch's
    /// `recordStream`): when freed, it is not reused until the work enqueued
    /// on `stream` so far has completed. Ignored for the allocation stream.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        state.record_stream(id, stream);
        Ok(())
    }

    /// Release every cached segment that is entirely free, after waiting for
    /// outstanding cross-stream events (`torch.cuda.empty_cache`).
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.empty_cache_pool(MempoolId::DEFAULT)
    }

    /// [`empty_cache`](Self::empty_cache) scoped to one pool: the default id
    /// releases the global pools and every freeable private pool; a private
    /// pool's id releases only that pool, once it has been released by all
    /// its users (torch 2.9+ `emptyCache(mempool_id)`).
    pub fn empty_cache_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        let mut state = self.state.lock();
        state.release_cached_blocks(&self.backend, pool)?;
        Ok(())
    }

    /// Route allocations accepted by `filter` to the private pool `pool`,
    /// creating it (use count 1) or adding a use (PyTorch's
    /// `beginAllocateToPool`). Blocks of a private pool never serve other
    /// allocations.
    pub fn begin_allocate_to_pool(
        &self,
        pool: MempoolId,
        filter: PoolFilter,
    ) -> Result<(), AllocError> {
        self.state
            .lock()
            .begin_allocate_to_pool(pool, filter.into_fn())
    }

    /// Stop routing allocations to `pool` (`endAllocateToPool`).
    pub fn end_allocate_to_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        self.state.lock().end_allocate_to_pool(pool)
    }

    /// Drop one use of `pool` (`releasePool`). At zero uses its cached
    /// memory is returned by the next [`empty_cache`](Self::empty_cache) or
    /// out-of-memory flush, and the pool disappears once nothing of it is left.
    pub fn release_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        self.state.lock().release_pool(pool)
    }

    /// Current use count of a private pool (0 if unknown or released).
    pub fn pool_use_count(&self, pool: MempoolId) -> u32 {
        self.state.lock().pool_use_count(pool)
    }

    /// The segments of one pool, in address order.
    pub fn pool_segments(&self, pool: MempoolId) -> Vec<SegmentInfo> {
        self.state.lock().segment_infos(Some(pool))
    }

    /// The state of a private pool, to restore later (`getCheckpointState`).
    pub fn checkpoint_pool(&self, pool: MempoolId) -> Result<PoolCheckpoint, AllocError> {
        self.state.lock().checkpoint(&self.backend, pool)
    }

    /// Set a private pool back to a checkpoint (`setCheckpointPoolState`):
    /// every allocation of the pool is freed, the checkpoint's allocations
    /// are created anew. A checkpoint that does not match the pool's segments
    /// is refused before anything changes.
    pub fn restore_pool_checkpoint(
        &self,
        checkpoint: &PoolCheckpoint,
    ) -> Result<RestoreResult, AllocError> {
        self.state
            .lock()
            .restore_checkpoint(&self.backend, checkpoint)
    }

    /// The statistics.
    pub fn stats(&self) -> DeviceStats {
        self.state.lock().stats
    }

    /// The statistics as `torch.cuda.memory_stats()` keys.
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        self.stats().to_flat()
    }

    /// Blocks handed out to a stream from another stream's cache by the
    /// Reservoir-only cross-stream reuse policy
    /// ([`AllocatorConfig::cross_stream_reuse`]); always 0 in PyTorch mode.
    pub fn cross_stream_reuses(&self) -> u64 {
        self.state.lock().cross_stream_reuses
    }

    /// Zero lifetime totals and event counters.
    pub fn reset_accumulated_stats(&self) {
        self.state.lock().stats.reset_accumulated();
    }

    /// Set every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.state.lock().stats.reset_peak();
    }

    /// Free and total device memory, from the backend.
    pub fn mem_info(&self) -> Result<MemInfo, AllocError> {
        Ok(self.backend.mem_info()?)
    }

    /// Limit the memory this allocator may reserve to `fraction` of the
    /// device (`torch.cuda.set_per_process_memory_fraction`). 1.0 removes
    /// the limit.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidArgument(format!(
                "invalid fraction: {fraction}. Please set within [0, 1]."
            )));
        }
        let total = self.backend.mem_info()?.total;
        self.state.lock().set_memory_fraction(fraction, total);
        Ok(())
    }

    /// The fraction of the device this allocator may reserve (1.0 when unlimited).
    pub fn memory_fraction(&self) -> Result<f64, AllocError> {
        let allowed = self.state.lock().allowed_memory_maximum;
        Ok(match allowed {
            Some(a) => a as f64 / self.backend.mem_info()?.total as f64,
            None => 1.0,
        })
    }

    /// The largest block that could be handed out without a new driver
    /// allocation, or the device's free memory if that is larger
    /// (PyTorch's `cacheInfo`, used for workspace sizing).
    pub fn cache_info(&self) -> Result<u64, AllocError> {
        Ok(self.state.lock().cache_info(&self.backend)?)
    }

    /// The segment an allocated pointer lives in: its base address and total
    /// size (PyTorch's `getBaseAllocation`).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, u64), AllocError> {
        let state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        let (base, size) = state.base_allocation(id)?;
        Ok((DevicePtr(base), size))
    }

    /// Replace the settings at run time (PyTorch's `_set_allocator_settings`).
    /// `stats.max_split_size` keeps the value from construction, as in PyTorch.
    pub fn set_config(&self, config: AllocatorConfig) {
        let config = supported(config, &self.backend);
        let mut state = self.state.lock();
        if state.config.max_split_size != config.max_split_size {
            state.max_split_changed = true;
        }
        state.config = config;
    }

    /// The settings in force.
    pub fn config(&self) -> AllocatorConfig {
        self.state.lock().config.clone()
    }

    /// Start (or stop, with `false`) keeping an unbounded allocation history.
    pub fn record_history(&self, enabled: bool) {
        self.record_history_with_limit(enabled, usize::MAX);
    }

    /// Keep the newest `max_entries` history entries (or stop recording).
    pub fn record_history_with_limit(&self, enabled: bool, max_entries: usize) {
        let mut state = self.state.lock();
        state.history = enabled.then(|| RingBuffer::new(max_entries));
    }

    /// The recorded history, oldest first (empty when not recording).
    pub fn history(&self) -> Vec<TraceEntry> {
        let state = self.state.lock();
        state
            .history
            .as_ref()
            .map(|h| h.entries().cloned().collect())
            .unwrap_or_default()
    }

    /// Register a callback run when the cache has no block for a request,
    /// before the driver is asked. See [`FreeMemoryCallback`].
    pub fn add_free_memory_callback(&self, callback: FreeMemoryCallback) {
        self.state.lock().free_memory_callbacks.push(callback);
    }

    /// Register an observer called (outside the lock) on every out-of-memory error.
    pub fn attach_oom_observer(&self, observer: OomObserver) {
        self.state.lock().oom_observers.push(observer);
    }

    /// The segments and their blocks, in address order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        self.state.lock().segment_infos(None)
    }

    /// Check every internal invariant: blocks tile their segments, free lists
    /// hold exactly the free blocks, the pointer map holds exactly the
    /// allocated blocks, and every statistic equals a recount.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.state.lock().check_invariants()
    }
}

/// The settings a backend can honour: without virtual memory, expandable
/// segments are off, as PyTorch does on platforms without them (spec 1.11).
fn supported<B: Backend>(mut config: AllocatorConfig, backend: &B) -> AllocatorConfig {
    if config.expandable_segments && backend.as_virtual_memory().is_none() {
        tracing::warn!(
            backend = backend.name(),
            "expandable_segments not supported on this platform: the {} backend has no virtual \
             memory capability; continuing without expandable segments",
            backend.name()
        );
        config.expandable_segments = false;
    }
    config
}

/// An allocation that frees itself on drop.
pub struct Allocation<'a, B: Backend> {
    allocator: &'a CachingAllocator<B>,
    ptr: DevicePtr,
    size: u64,
}

impl<B: Backend> Allocation<'_, B> {
    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The bytes requested.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Mark the allocation as used by `stream` (see [`CachingAllocator::record_stream`]).
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        self.allocator.record_stream(self.ptr, stream)
    }
}

impl<B: Backend> Drop for Allocation<'_, B> {
    fn drop(&mut self) {
        // The pointer came from this allocator and is freed once: this cannot fail
        // except on a lost device, which a destructor cannot report.
        let _ = self.allocator.raw_free(self.ptr);
    }
}

impl<B: Backend> std::fmt::Debug for Allocation<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .finish()
    }
}
