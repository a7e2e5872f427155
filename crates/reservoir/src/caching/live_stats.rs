//! The statistics as a device keeps them while it runs: each
//! [`StatArray`] as its two pool stats, updated once per change, with the
//! aggregate ("all") derived when they are read ([`LiveStats::snapshot`]).
//!
//! [`StatArray::increase`] updates the aggregate and the pool stat, each
//! with its current value, peak and lifetime total, and
//! [`StatArray::decrease`] both current values and both freed totals. The
//! aggregate's current value and lifetime totals are the sums of the pools',
//! and a stat's freed total is its allocated total minus its current value
//! (plus the current value at the last accumulated reset), so here an
//! increase updates one pool stat and the aggregate's peak, and a decrease
//! one current value. The values read are the same, peaks included: the
//! aggregate's peak is still raised after every increase (spec 1.12).

use crate::stats::{DeviceStats, Stat, StatArray, StatType};

/// One pool's stat without its freed total.
#[derive(Clone, Copy, Debug, Default)]
struct Counter {
    current: i64,
    peak: i64,
    allocated: i64,
    /// `current` at the last accumulated reset: freed is
    /// `allocated - current + base`.
    base: i64,
}

impl Counter {
    fn stat(&self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: self.allocated,
            freed: self.allocated - self.current + self.base,
        }
    }
}

/// A [`StatArray`] kept as its pool stats.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PoolStats {
    /// Indexed by [`StatType`]: the small and the large pool's counters; at
    /// `Aggregate` only `peak` is kept (the rest is the pools' sum).
    by_type: [Counter; 3],
}

impl PoolStats {
    /// [`StatArray::increase`] of `pool` (a pool type, not `Aggregate`).
    #[inline]
    pub fn increase(&mut self, pool: StatType, amount: u64) {
        debug_assert!(pool != StatType::Aggregate, "an increase names its pool");
        let amount = amount as i64;
        let c = &mut self.by_type[pool as usize];
        c.current += amount;
        c.peak = c.peak.max(c.current);
        c.allocated += amount;
        let all = self.current_all();
        let agg = &mut self.by_type[StatType::Aggregate as usize];
        agg.peak = agg.peak.max(all);
    }

    /// The aggregate's current value: the pools' sum.
    #[inline]
    fn current_all(&self) -> i64 {
        self.by_type[StatType::SmallPool as usize].current
            + self.by_type[StatType::LargePool as usize].current
    }

    /// [`StatArray::decrease`] of `pool` (a pool type, not `Aggregate`).
    #[inline]
    pub fn decrease(&mut self, pool: StatType, amount: u64) {
        debug_assert!(pool != StatType::Aggregate, "a decrease names its pool");
        self.by_type[pool as usize].current -= amount as i64;
    }

    /// The aggregate ("all") stat.
    pub fn all(&self) -> Stat {
        self.stat_array().0[StatType::Aggregate as usize]
    }

    /// The stats as PyTorch reports them.
    pub fn stat_array(&self) -> StatArray {
        let small = self.by_type[StatType::SmallPool as usize].stat();
        let large = self.by_type[StatType::LargePool as usize].stat();
        let all = Stat {
            current: self.current_all(),
            peak: self.by_type[StatType::Aggregate as usize].peak,
            allocated: small.allocated + large.allocated,
            freed: small.freed + large.freed,
        };
        StatArray([all, small, large])
    }

    fn reset_accumulated(&mut self) {
        for c in &mut self.by_type {
            c.allocated = 0;
            c.base = c.current;
        }
    }

    fn reset_peak(&mut self) {
        for c in &mut self.by_type {
            c.peak = c.current;
        }
        self.by_type[StatType::Aggregate as usize].peak = self.current_all();
    }
}

/// A device's statistics while it runs: [`DeviceStats`] with each
/// [`StatArray`] kept as [`PoolStats`].
pub(crate) type LiveStats = DeviceStats<PoolStats>;

impl LiveStats {
    /// Zeroed statistics of an allocator created with `max_split_size`
    /// bytes ([`DeviceStats::with_max_split_size`]).
    pub fn zeroed(max_split_size: u64) -> LiveStats {
        DeviceStats::with_max_split_size(max_split_size).map_arrays(|_| PoolStats::default())
    }

    /// The statistics as PyTorch reports them.
    pub fn snapshot(&self) -> DeviceStats {
        self.map_arrays(PoolStats::stat_array)
    }

    /// [`DeviceStats::reset_accumulated`].
    pub fn reset_accumulated(&mut self) {
        self.reset_accumulated_with(PoolStats::reset_accumulated);
    }

    /// [`DeviceStats::reset_peak`].
    pub fn reset_peak(&mut self) {
        self.reset_peak_with(PoolStats::reset_peak);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Increase(bool, u64),
        Decrease(bool, u64),
        ResetPeak,
        ResetAccumulated,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (any::<bool>(), 0u64..1000).prop_map(|(s, n)| Op::Increase(s, n)),
            4 => (any::<bool>(), 0u64..1000).prop_map(|(s, n)| Op::Decrease(s, n)),
            1 => Just(Op::ResetPeak),
            1 => Just(Op::ResetAccumulated),
        ]
    }

    proptest! {
        /// spec 1.12: every value read, peaks and lifetime totals included,
        /// is what a `StatArray` updated the same way holds.
        #[test]
        fn reads_what_a_stat_array_holds(ops in proptest::collection::vec(op(), 0..200)) {
            let mut live = LiveStats::zeroed(u64::MAX);
            let mut want = DeviceStats::with_max_split_size(u64::MAX);
            for op in ops {
                match op {
                    Op::Increase(small, n) => {
                        let t = StatType::for_pool(small);
                        live.active_bytes.increase(t, n);
                        want.active_bytes.increase(t, n);
                    }
                    Op::Decrease(small, n) => {
                        let t = StatType::for_pool(small);
                        live.active_bytes.decrease(t, n);
                        want.active_bytes.decrease(t, n);
                    }
                    Op::ResetPeak => {
                        live.reset_peak();
                        want.reset_peak();
                    }
                    Op::ResetAccumulated => {
                        live.reset_accumulated();
                        want.reset_accumulated();
                    }
                }
                prop_assert_eq!(live.snapshot(), want);
                prop_assert_eq!(live.active_bytes.all(), *want.active_bytes.all());
            }
        }
    }
}
