//! [`CachingAllocator`]'s statistics.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::super::device_reserved::DeviceReserved;
use super::super::CachingAllocator;
use crate::backend::{Backend, MemInfo};
use crate::error::AllocError;
use crate::stats::DeviceStats;

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
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let state = self.state.lock();
        state.acct.snapshot().to_flat_of(state.config.torch_release)
    }

    /// Blocks handed out to a stream from another stream's cache by the
    /// Reservoir-only cross-stream reuse policy
    /// ([`ReservoirPolicy::CrossStreamReuse`](crate::config::ReservoirPolicy::CrossStreamReuse)); always 0 in PyTorch mode.
    pub fn cross_stream_reuses(&self) -> u64 {
        self.state.lock().cross_stream_reuses
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
