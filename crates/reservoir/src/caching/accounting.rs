//! Accounting: the statistics hand-outs, frees and segments move (spec
//! 1.12), as events of the [`Accounting`](super::state::accounting::Accounting)
//! owner with the settings in force.

use super::state::DeviceState;
use crate::stats::StatType;
use crate::store::{BlockId, PoolId};

impl DeviceState {
    #[inline]
    pub(crate) fn stat_type(&self, pool: PoolId) -> StatType {
        StatType::for_pool(self.pools[pool.index()].is_small())
    }

    /// Enters the allocated block `id` (`size` bytes at `addr`, `requested`
    /// of them asked for) in the pointer map and the allocation stats
    /// (spec 1.12), as a hand-out and a seeded allocation both do.
    #[inline]
    pub(crate) fn note_allocated(
        &mut self,
        id: BlockId,
        addr: u64,
        size: u64,
        requested: u64,
        st: StatType,
    ) {
        self.allocated.insert(addr, id);
        self.acct
            .allocated(st, size, requested, self.config.max_split_size);
    }

    /// The allocation stats of a block the caller freed (spec 1.12); its
    /// active bytes stay until the block is back in its pool (`free_block`).
    #[inline]
    pub(super) fn note_freed(&mut self, size: u64, st: StatType) {
        self.acct.freed(st, size, self.config.max_split_size);
    }

    /// A new segment of `size` bytes from the driver (or seeded): reserved
    /// memory and the segment counts (spec 1.12).
    pub(crate) fn note_segment_allocated(&mut self, size: u64, pool: PoolId) {
        let (st, owner) = (self.stat_type(pool), self.owner(pool));
        self.acct
            .segment_allocated(st, owner, size, self.config.max_split_size);
    }

    /// A segment of `size` bytes given back to the driver (the caller counts
    /// `num_device_free` before tracing it).
    pub(super) fn note_segment_released(&mut self, size: u64, pool: PoolId) {
        let (st, owner) = (self.stat_type(pool), self.owner(pool));
        self.acct
            .segment_released(st, owner, size, self.config.max_split_size);
    }
}
