//! [`CachingAllocator`]'s private-pool methods.

use super::super::{CachingAllocator, PoolCheckpoint, PoolFilter, RestoreResult};
use crate::backend::Backend;
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::snapshot::Segment;

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
