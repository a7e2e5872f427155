//! Accounting: the statistics hand-outs, frees and segments move (spec
//! 1.12; `oversize_*` count sizes at or above `max_split_size`), and the
//! per-process memory limit (spec 1.13).

use super::state::DeviceState;
use crate::stats::StatType;
use crate::store::{BlockId, PoolId};

impl DeviceState {
    #[inline]
    pub(crate) fn stat_type(&self, pool: PoolId) -> StatType {
        StatType::for_pool(self.pools[pool as usize].is_small)
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
        let s = &mut self.stats;
        s.allocation.increase(st, 1);
        s.allocated_bytes.increase(st, size);
        s.active.increase(st, 1);
        s.active_bytes.increase(st, size);
        s.requested_bytes.increase(st, requested);
        if size >= self.config.max_split_size {
            s.oversize_allocations.increase(1);
        }
    }

    /// The allocation stats of a block the caller freed (spec 1.12); its
    /// active bytes stay until the block is back in its pool (`free_block`).
    #[inline]
    pub(super) fn note_freed(&mut self, size: u64, st: StatType) {
        let s = &mut self.stats;
        s.allocation.decrease(st, 1);
        s.allocated_bytes.decrease(st, size);
        if size >= self.config.max_split_size {
            s.oversize_allocations.decrease(1);
        }
    }

    /// A new segment of `size` bytes from the driver (or seeded): reserved
    /// memory and the segment counts (spec 1.12).
    pub(crate) fn note_segment_allocated(&mut self, size: u64, st: StatType) {
        self.total_allocated_memory += size;
        let s = &mut self.stats;
        s.segment.increase(st, 1);
        s.reserved_bytes.increase(st, size);
        if size >= self.config.max_split_size {
            s.oversize_segments.increase(1);
        }
        s.num_device_alloc += 1;
        self.note_device_reserved(st, size as i64);
    }

    /// Tell the device-wide reserved gauge that stream shards share (none
    /// for a lone `CachingAllocator`) that reserved memory changed by `delta`.
    #[inline]
    pub(crate) fn note_device_reserved(&self, st: StatType, delta: i64) {
        if let Some(r) = &self.device_reserved {
            r.add(st, delta);
        }
    }

    /// A segment of `size` bytes given back to the driver (the caller counts
    /// `num_device_free` before tracing it).
    pub(super) fn note_segment_released(&mut self, size: u64, st: StatType) {
        self.total_allocated_memory -= size;
        let s = &mut self.stats;
        s.segment.decrease(st, 1);
        s.reserved_bytes.decrease(st, size);
        if size >= self.config.max_split_size {
            s.oversize_segments.decrease(1);
        }
        self.note_device_reserved(st, -(size as i64));
    }

    /// spec 1.13: limit reserved memory to `fraction` of the device.
    pub fn set_memory_fraction(&mut self, fraction: f64, total: u64) {
        self.allowed_memory_maximum = if fraction < 1.0 {
            Some((fraction * total as f64) as u64)
        } else {
            None
        };
    }
}

/// Apply a net change as one increase or decrease, as PyTorch does (so the
/// lifetime totals see the net, not each step).
#[inline]
pub(super) fn apply_net(array: &mut super::live_stats::PoolStats, st: StatType, net: i64) {
    if net > 0 {
        array.increase(st, net as u64);
    } else if net < 0 {
        array.decrease(st, (-net) as u64);
    }
}
