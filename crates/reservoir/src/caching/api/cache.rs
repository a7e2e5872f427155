//! [`CachingAllocator`]'s methods on the cache as a whole.

use super::super::CachingAllocator;
use crate::backend::Backend;
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::trace::RecordContext;

/// The cache: giving cached memory back to the device
/// (`torch.cuda.empty_cache`, per pool or whole) and asking what it could
/// still serve without the driver.
impl<B: Backend> CachingAllocator<B> {
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
        let ctx = self.gather(RecordContext::All);
        self.with_context(ctx, |state| {
            if state.obs.verbosity().contains(DebugVerbosity::PROFILING) {
                tracing::info!(
                    target: TARGET,
                    "Attempting to release cached blocks of pool {pool:?} (reserved {}, allocated {})",
                    crate::format::format_size(state.acct.reserved_bytes()),
                    crate::format::format_size(state.acct.allocated_bytes()),
                );
            }
            state.release_cached_blocks(&self.backend, pool)?;
            Ok(())
        })
    }

    /// One half of [`empty_cache`](Self::empty_cache): with `large`, wait
    /// for outstanding events and release the large pool's free segments;
    /// without, the small pool's and the freeable private pools'.
    /// [`StreamShards`] runs the first half on every shard, then the second,
    /// in PyTorch's order (spec 1.9: one large pool keyed by stream, then
    /// the small pool).
    pub(crate) fn empty_cache_half(&self, large: bool) -> Result<(), AllocError> {
        let ctx = self.gather(RecordContext::All);
        self.with_context(ctx, |state| {
            if large {
                state.release_cached_large_blocks(&self.backend)?;
            } else {
                state.release_cached_small_and_private_blocks(&self.backend)?;
            }
            Ok(())
        })
    }

    /// The largest block that could be handed out without a new driver
    /// allocation, or the device's free memory if that is larger
    /// (PyTorch's `cacheInfo`, used for workspace sizing).
    pub fn cache_info(&self) -> Result<u64, AllocError> {
        Ok(self.state.lock().cache_info(&self.backend)?)
    }
}
