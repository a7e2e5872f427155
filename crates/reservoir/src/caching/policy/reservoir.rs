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
//!    request is served, plus 1/64 and 2 MiB. Over the target, the free
//!    pages of the default pools' expandable segments are unmapped
//!    (`unmap_block`, spec 1.11), largest free block first, until the
//!    request fits under the target (or nothing is left), so it is served
//!    by remapping pages that held nothing. Under the target nothing
//!    happens: a program whose cache fits makes no unmap calls
//!    (hysteresis).
//!
//! Online only: the target uses the allocation history, never the future.
#![forbid(unsafe_code)]

use crate::backend::{Backend, BackendError};
use crate::caching::pools::{POOL_LARGE, POOL_SMALL};
use crate::caching::rules::SMALL_BUFFER;
use crate::caching::state::DeviceState;
use crate::store::BlockId;

impl DeviceState {
    /// The reserved bytes the `reservoir` policy lets the cache reach
    /// without unmapping free pages, for a request of `size` bytes.
    pub(crate) fn reservoir_target(&self, size: u64) -> u64 {
        let allocated = self.stats.allocated_bytes.all();
        let peak = (allocated.peak.max(0) as u64).max(allocated.current.max(0) as u64 + size);
        peak + peak / 64 + SMALL_BUFFER
    }

    /// Before the cache grows for a request of `size` bytes: if reserved
    /// plus `size` would pass [`reservoir_target`](Self::reservoir_target),
    /// unmap the free pages of the default pools' expandable segments,
    /// largest free block first, until it would not.
    pub(crate) fn trim_before_growth<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        size: u64,
    ) -> Result<(), BackendError> {
        let target = self.reservoir_target(size);
        if self.total_allocated_memory + size <= target {
            return Ok(());
        }
        let mut free: Vec<(u64, BlockId)> = [POOL_LARGE, POOL_SMALL]
            .iter()
            .flat_map(|&pool| self.pools[pool as usize].blocks.iter())
            .filter(|k| self.store.blocks[k.id].expandable)
            .map(|k| (k.size, k.id))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        for (_, id) in free {
            if self.total_allocated_memory + size <= target {
                break;
            }
            self.unmap_block(backend, id)?;
        }
        Ok(())
    }
}
