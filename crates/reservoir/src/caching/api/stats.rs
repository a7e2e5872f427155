//! [`CachingAllocator`]'s statistics.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::device_reserved::DeviceReserved;
use super::super::CachingAllocator;
use crate::backend::{Backend, MemInfo};
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::stats::{DeviceStats, StatArray};

/// Statistics: `torch.cuda.memory_stats()` and its resets, the
/// device's free and total memory.
impl<B: Backend> CachingAllocator<B> {
    /// The statistics.
    pub fn stats(&self) -> DeviceStats {
        self.state.lock().acct.snapshot()
    }

    /// The statistics as `torch.cuda.memory_stats()` keys: the keys of the
    /// PyTorch release of the configuration
    /// ([`ReleaseRules::missing_stat_keys`](crate::config::ReleaseRules::missing_stat_keys)).
    ///
    /// From torch 2.13 on this includes `reserved_bytes_by_private_pools`
    /// ([`private_pool_reserved`](Self::private_pool_reserved)).
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let state = self.state.lock();
        let release = state.config.torch_release;
        let mut flat = state.acct.snapshot().to_flat_of(release);
        if release.rules().stat_reserved_bytes_by_private_pools {
            crate::stats::put_private_pool_reserved(&mut flat, state.acct.private_pool_reserved());
        }
        flat
    }

    /// The reserved bytes of each private pool that ever held driver
    /// memory, by pool id: PyTorch's `DeviceStats::reserved_bytes_by_private_pools`
    /// (spec 1.12). A pool's entry stays after its memory is released
    /// (current 0, peak and totals kept until reset).
    pub fn private_pool_reserved(&self) -> BTreeMap<MempoolId, StatArray> {
        self.state.lock().acct.private_pool_reserved().clone()
    }

    /// Blocks handed out to a stream from another stream's cache by the
    /// Reservoir-only cross-stream reuse policy
    /// ([`ReservoirPolicy::CrossStreamReuse`](crate::config::ReservoirPolicy::CrossStreamReuse)); always 0 in PyTorch mode.
    pub fn cross_stream_reuses(&self) -> u64 {
        self.state.lock().streams.cross_stream_reuses()
    }

    /// Zero lifetime totals and event counters.
    pub fn reset_accumulated_stats(&self) {
        self.state.lock().acct.reset_accumulated();
    }

    /// Set every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.state.lock().acct.reset_peak();
    }

    /// Free and total device memory, from the backend.
    pub fn mem_info(&self) -> Result<MemInfo, AllocError> {
        Ok(self.backend.mem_info()?)
    }

    /// Report reserved-memory changes to `gauge` too (stream shards share
    /// one; set before the shard's first driver call).
    pub(crate) fn share_device_reserved(&self, gauge: Arc<DeviceReserved>) {
        self.state.lock().acct.share_device_reserved(gauge);
    }
}
