//! The `reservoir` policy ([`Policy::Reservoir`](super::Policy), off in
//! PyTorch mode; [`ReservoirPolicy::reservoir`](crate::config::ReservoirPolicy::reservoir)).
//!
//! Measured on the cold-start replay of `../shared/traces` (BENCHMARKS.md
//! "The `reservoir` policy"), the bytes PyTorch's expandable segments
//! reserve beyond the live bytes come from (a) the 20 MiB pages of the large
//! pool and (b) free pages in the middle of a segment that no later request
//! fits, so the segment grows at its end while they stay mapped: nothing is
//! unmapped until an out-of-memory. This policy
//!
//! 1. maps expandable segments of both pools in 2 MiB pages
//!    ([`DeviceState::expandable_page_size`]);
//! 2. on a cache miss, before the driver is asked for `size` more bytes,
//!    compares the reserved bytes plus `size` with a target: the larger of
//!    the peak of allocated bytes so far and the bytes allocated once this
//!    request is served, plus 1/64 and 2 MiB. Over the target, every free
//!    page of the default pools' expandable segments is unmapped
//!    (`unmap_block`, spec 1.11), so the request is served by remapping
//!    pages that held nothing. Under it, nothing happens: a program whose
//!    cache fits under the target makes no unmap calls (hysteresis).
//!
//! Online only: the target uses the allocation history, never the future.
#![forbid(unsafe_code)]

use crate::backend::{Backend, BackendError};
use crate::caching::pools::{POOL_LARGE, POOL_SMALL};
use crate::caching::rules::SMALL_BUFFER;
use crate::caching::state::DeviceState;

impl DeviceState {
    /// The reserved bytes the `reservoir` policy lets the cache reach
    /// without unmapping free pages, for a request of `size` bytes.
    pub(crate) fn reservoir_target(&self, size: u64) -> u64 {
        let allocated = self.stats.allocated_bytes.all();
        let peak = (allocated.peak.max(0) as u64).max(allocated.current.max(0) as u64 + size);
        peak + peak / 64 + SMALL_BUFFER
    }

    /// Before the cache grows by `size` bytes: unmap the free pages of the
    /// default pools' expandable segments if growing would pass
    /// [`reservoir_target`](Self::reservoir_target). Returns whether any
    /// page was unmapped.
    pub(crate) fn trim_before_growth<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        size: u64,
    ) -> Result<bool, BackendError> {
        if self.total_allocated_memory + size <= self.reservoir_target(size) {
            return Ok(false);
        }
        let before = self.total_allocated_memory;
        for pool in [POOL_LARGE, POOL_SMALL] {
            let free: Vec<_> = self.pools[pool as usize]
                .blocks
                .iter()
                .filter(|k| self.store.blocks[k.id].expandable)
                .map(|k| k.id)
                .collect();
            for id in free {
                self.unmap_block(backend, id)?;
            }
        }
        Ok(self.total_allocated_memory < before)
    }
}
