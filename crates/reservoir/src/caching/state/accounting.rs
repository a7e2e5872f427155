//! The accounting owner: PyTorch's statistics (spec 1.12; `oversize_*`
//! count sizes at or above `max_split_size`), the bytes taken from the
//! driver and the per-process limit (spec 1.13), and the device-wide
//! reserved gauge shared with stream shards.
//!
//! Every counter changes through one of the named methods below, each one
//! event of the allocator (a hand-out, a free, a block back in its pool, a
//! segment or pages from or back to the driver), so that the gauges that
//! move together always do; `check.rs` recounts them after every operation
//! in tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::caching::device_reserved::DeviceReserved;
use crate::caching::live_stats::{LiveStats, PoolStats};
use crate::config::FractionRounding;
use crate::ids::MempoolId;
use crate::stats::{DeviceStats, StatArray, StatType};

/// PyTorch's statistics and the driver-memory totals of one device.
pub(crate) struct Accounting {
    /// PyTorch's statistics. Invariant: every gauge equals a recount of the
    /// blocks and segments.
    stats: LiveStats,
    /// Bytes obtained from the driver (PyTorch's `total_allocated_memory`).
    /// Invariant: the sum of segment sizes (mapped pages for expandable
    /// ones).
    total_allocated_memory: u64,
    /// The per-process limit (`set_per_process_memory_fraction` below 1.0).
    allowed_memory_maximum: Option<u64>,
    /// The device-wide reserved gauge shared with the other stream shards
    /// (see `device_reserved.rs`); `None` for a lone `CachingAllocator`.
    /// Invariant: changed by exactly what `stats.reserved_bytes` changes.
    device_reserved: Option<Arc<DeviceReserved>>,
    /// `max_split_size` changed at run time: the oversize counters then mix
    /// two thresholds (as in PyTorch) and cannot be recounted.
    max_split_changed: bool,
    /// PyTorch's `DeviceStats::reserved_bytes_by_private_pools` (torch
    /// 2.13+, spec 1.12): the reserved bytes of each private pool, moved
    /// with `reserved_bytes` by every segment and page of that pool. An
    /// entry appears with the pool's first driver memory and is never
    /// removed (a released pool keeps its peak and totals, current 0).
    /// Invariant: each entry's current values equal a recount of the
    /// pool's segments.
    private_reserved: BTreeMap<MempoolId, StatArray>,
}

/// Apply a net change as one increase or decrease, as PyTorch does (so the
/// lifetime totals see the net, not each step).
#[inline]
fn apply_net(array: &mut PoolStats, st: StatType, net: i64) {
    if net > 0 {
        array.increase(st, net as u64);
    } else if net < 0 {
        array.decrease(st, (-net) as u64);
    }
}

impl Accounting {
    /// Zeroed statistics; `max_split_size` is the value the statistics
    /// report (PyTorch keeps the one from construction).
    pub fn new(max_split_size: u64) -> Accounting {
        Accounting {
            stats: LiveStats::zeroed(max_split_size),
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            device_reserved: None,
            max_split_changed: false,
            private_reserved: BTreeMap::new(),
        }
    }

    /// The reserved bytes of each private pool that ever held driver
    /// memory (PyTorch's `reserved_bytes_by_private_pools`), by pool id.
    pub fn private_pool_reserved(&self) -> &BTreeMap<MempoolId, StatArray> {
        &self.private_reserved
    }

    /// Reserved memory of private pool `owner` (none for a global pool)
    /// changed by `delta` bytes.
    #[inline]
    fn private_reserved_changed(&mut self, owner: Option<MempoolId>, st: StatType, delta: i64) {
        if let Some(id) = owner {
            let array = self.private_reserved.entry(id).or_default();
            if delta >= 0 {
                array.increase(st, delta as u64);
            } else {
                array.decrease(st, delta.unsigned_abs());
            }
        }
    }

    /// The statistics, read-only.
    #[inline]
    pub fn stats(&self) -> &LiveStats {
        &self.stats
    }

    /// The statistics as PyTorch reports them.
    pub fn snapshot(&self) -> DeviceStats {
        self.stats.snapshot()
    }

    /// The allocated bytes of both pools now.
    #[inline]
    pub fn allocated_bytes(&self) -> u64 {
        self.stats.allocated_bytes.all().current as u64
    }

    /// The reserved bytes of both pools now.
    #[inline]
    pub fn reserved_bytes(&self) -> u64 {
        self.stats.reserved_bytes.all().current as u64
    }

    /// Bytes obtained from the driver (PyTorch's `total_allocated_memory`).
    #[inline]
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }

    /// The per-process limit, if one is set.
    #[inline]
    pub fn allowed_memory_maximum(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// Whether `max_split_size` changed at run time.
    pub fn max_split_changed(&self) -> bool {
        self.max_split_changed
    }

    /// `max_split_size` changed at run time (see `set_config`).
    pub fn note_max_split_changed(&mut self) {
        self.max_split_changed = true;
    }

    /// Share the device-wide reserved gauge of the stream shards.
    pub fn share_device_reserved(&mut self, gauge: Arc<DeviceReserved>) {
        self.device_reserved = Some(gauge);
    }

    /// spec 1.13: limit reserved memory to `fraction` of the device, the
    /// bytes rounded as the release does (`rounding`).
    pub fn set_memory_fraction(&mut self, fraction: f64, total: u64, rounding: FractionRounding) {
        self.allowed_memory_maximum = if fraction < 1.0 {
            Some(rounding.allowed_bytes(fraction, total))
        } else {
            None
        };
    }

    /// spec 1.9: whether `size` more bytes from the driver would pass the
    /// per-process limit.
    #[inline]
    pub fn passes_limit(&self, size: u64) -> bool {
        self.allowed_memory_maximum
            .is_some_and(|allowed| self.total_allocated_memory + size > allowed)
    }

    /// A block of `size` bytes handed out, `requested` of them asked for
    /// (spec 1.12).
    #[inline]
    pub fn allocated(&mut self, st: StatType, size: u64, requested: u64, max_split_size: u64) {
        let s = &mut self.stats;
        s.allocation.increase(st, 1);
        s.allocated_bytes.increase(st, size);
        s.active.increase(st, 1);
        s.active_bytes.increase(st, size);
        s.requested_bytes.increase(st, requested);
        if size >= max_split_size {
            s.oversize_allocations.increase(1);
        }
    }

    /// A block of `size` bytes freed by the caller (spec 1.12); its active
    /// bytes stay until the block is back in its pool
    /// ([`block_returned`](Self::block_returned)).
    #[inline]
    pub fn freed(&mut self, st: StatType, size: u64, max_split_size: u64) {
        let s = &mut self.stats;
        s.allocation.decrease(st, 1);
        s.allocated_bytes.decrease(st, size);
        if size >= max_split_size {
            s.oversize_allocations.decrease(1);
        }
    }

    /// A freed block of `size` bytes (`requested` asked for) back in its
    /// pool: no longer active (spec 1.10 `free_block`).
    #[inline]
    pub fn block_returned(&mut self, st: StatType, size: u64, requested: u64) {
        let s = &mut self.stats;
        s.active.decrease(st, 1);
        s.active_bytes.decrease(st, size);
        s.requested_bytes.decrease(st, requested);
    }

    /// The inactive split blocks (of non-expandable segments) changed by
    /// `blocks` blocks and `bytes` bytes, each applied as one net change.
    #[inline]
    pub fn inactive_split_changed(&mut self, st: StatType, blocks: i64, bytes: i64) {
        apply_net(&mut self.stats.inactive_split, st, blocks);
        apply_net(&mut self.stats.inactive_split_bytes, st, bytes);
    }

    /// A new segment of `size` bytes from the driver (or seeded): reserved
    /// memory and the segment counts (spec 1.12).
    pub fn segment_allocated(
        &mut self,
        st: StatType,
        owner: Option<MempoolId>,
        size: u64,
        max_split_size: u64,
    ) {
        self.total_allocated_memory += size;
        let s = &mut self.stats;
        s.segment.increase(st, 1);
        s.reserved_bytes.increase(st, size);
        if size >= max_split_size {
            s.oversize_segments.increase(1);
        }
        s.num_device_alloc += 1;
        self.device_reserved_changed(st, size as i64);
        self.private_reserved_changed(owner, st, size as i64);
    }

    /// A segment of `size` bytes given back to the driver (counted in
    /// `num_device_free` by [`device_free`](Self::device_free)).
    pub fn segment_released(
        &mut self,
        st: StatType,
        owner: Option<MempoolId>,
        size: u64,
        max_split_size: u64,
    ) {
        self.total_allocated_memory -= size;
        let s = &mut self.stats;
        s.segment.decrease(st, 1);
        s.reserved_bytes.decrease(st, size);
        if size >= max_split_size {
            s.oversize_segments.decrease(1);
        }
        self.device_reserved_changed(st, -(size as i64));
        self.private_reserved_changed(owner, st, -(size as i64));
    }

    /// `bytes` of expandable-segment pages mapped by `calls` driver calls
    /// (spec 1.11).
    pub fn pages_mapped(&mut self, st: StatType, owner: Option<MempoolId>, bytes: u64, calls: i64) {
        self.total_allocated_memory += bytes;
        self.stats.reserved_bytes.increase(st, bytes);
        self.device_reserved_changed(st, bytes as i64);
        self.private_reserved_changed(owner, st, bytes as i64);
        self.stats.num_device_alloc += calls;
    }

    /// `bytes` of expandable-segment pages unmapped by one driver call
    /// (spec 1.11).
    pub fn pages_unmapped(&mut self, st: StatType, owner: Option<MempoolId>, bytes: u64) {
        self.total_allocated_memory -= bytes;
        self.stats.reserved_bytes.decrease(st, bytes);
        self.device_reserved_changed(st, -(bytes as i64));
        self.private_reserved_changed(owner, st, -(bytes as i64));
        self.stats.num_device_free += 1;
    }

    /// One segment given back to the driver (`num_device_free`).
    pub fn device_free(&mut self) {
        self.stats.num_device_free += 1;
    }

    /// A driver allocation retried after the cache was flushed.
    pub fn alloc_retry(&mut self) {
        self.stats.num_alloc_retries += 1;
    }

    /// Every stream synchronized to free the events (spec 1.10).
    pub fn sync_all_streams(&mut self) {
        self.stats.num_sync_all_streams += 1;
    }

    /// An out-of-memory error reported.
    pub fn oom(&mut self) {
        self.stats.num_ooms += 1;
    }

    /// PyTorch's `resetAccumulatedStats`.
    pub fn reset_accumulated(&mut self) {
        self.stats.reset_accumulated();
        self.private_reserved
            .values_mut()
            .for_each(StatArray::reset_accumulated);
    }

    /// PyTorch's `resetPeakStats`.
    pub fn reset_peak(&mut self) {
        self.stats.reset_peak();
        self.private_reserved
            .values_mut()
            .for_each(StatArray::reset_peak);
    }

    /// Tell the device-wide reserved gauge that stream shards share (none
    /// for a lone `CachingAllocator`) that reserved memory changed by `delta`.
    #[inline]
    fn device_reserved_changed(&self, st: StatType, delta: i64) {
        if let Some(r) = &self.device_reserved {
            r.add(st, delta);
        }
    }
}
