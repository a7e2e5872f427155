//! [`CachingAllocator`]'s private-pool methods.

use super::super::{CachingAllocator, PoolCheckpoint, PoolFilter, RestoreResult};
use crate::backend::Backend;
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::snapshot::Segment;
use crate::pluggable::PluggableAllocator;
use std::sync::Arc;

/// Private memory pools (CUDA graphs, `torch.cuda.MemPool`): routing
/// allocations to a pool, releasing it, its segments, and checkpoints of
/// its state.
impl<B: Backend> CachingAllocator<B> {
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

    /// Hand the blocks of private pool `pool` out whole, never split
    /// (PyTorch's `setNoSplit`, `MemPool(no_split=True)`; spec 1.7). An
    /// unknown pool is [`AllocError::InvalidState`] and changes nothing.
    pub fn set_no_split(&self, pool: MempoolId) -> Result<(), AllocError> {
        self.state.lock().set_no_split(pool)
    }

    /// Create private pool `pool` (one use) whose segments come from its
    /// own `allocator` and whose blocks Reservoir caches, or add a use to
    /// the existing pool with an allocator, which keeps its first one
    /// (PyTorch's `createOrIncrefPool(id, allocator)`,
    /// `MemPool(allocator=CUDAPluggableAllocator(...))`). A new segment of
    /// the pool is the allocator's `malloc` (a null is out of memory; never
    /// an expandable segment), a released one its `raw_delete`; the pool,
    /// and with it the allocator, lives until its last segment is released.
    /// An existing pool without an allocator is refused
    /// ([`AllocError::InvalidState`]) and nothing changes.
    pub fn create_or_incref_pool_with_allocator(
        &self,
        pool: MempoolId,
        allocator: Arc<PluggableAllocator>,
    ) -> Result<(), AllocError> {
        self.state
            .lock()
            .create_or_incref_pool_with_allocator(pool, allocator)
    }

    /// Let the free blocks of private pool `pool` serve allocations outside
    /// every private pool that would otherwise run out of memory (`on`), or
    /// stop (PyTorch's `setUseOnOOM`, `MemPool(use_on_oom=True)`; spec
    /// 1.5): such an allocation takes the best fit of the first marked pool
    /// that has one before any cached memory is released, and the block
    /// returns to that pool when freed. Marking an unknown pool is
    /// [`AllocError::InvalidState`] and changes nothing; unmarking is
    /// always accepted.
    pub fn set_use_on_oom(&self, pool: MempoolId, on: bool) -> Result<(), AllocError> {
        self.state.lock().set_use_on_oom(pool, on)
    }

    /// Current use count of a private pool (0 if unknown or released).
    pub fn pool_use_count(&self, pool: MempoolId) -> u32 {
        self.state.lock().pool_use_count(pool)
    }

    /// The segments of one pool, in address order, as a snapshot reports
    /// them (without recording a snapshot in the history).
    pub fn pool_segments(&self, pool: MempoolId) -> Vec<Segment> {
        self.state.lock().segment_models(Some(pool))
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
}
