//! Allocator statistics, exactly as `c10/core/CachingDeviceAllocator.h`
//! defines them (spec section 1.12), and their flat `torch.cuda.memory_stats()`
//! view.

use std::collections::BTreeMap;

/// One counter with its high-water mark and lifetime totals.
///
/// `increase(n)` adds to `current` and `allocated` and raises `peak`;
/// `decrease(n)` subtracts from `current` and adds to `freed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The highest `current` since the last peak reset.
    pub peak: i64,
    /// Sum of all increases since the last accumulated reset.
    pub allocated: i64,
    /// Sum of all decreases since the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// Add `amount` (PyTorch's `Stat::increase`).
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    /// Subtract `amount` (PyTorch's `Stat::decrease`).
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        let amount = amount as i64;
        self.current -= amount;
        self.freed += amount;
    }

    /// Zero the lifetime totals (`allocated`, `freed`).
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    /// Set the peak back to the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Add `other` field by field (the peaks add up to an upper bound of
    /// the peak of the sum).
    pub fn add(&mut self, other: &Stat) {
        self.current += other.current;
        self.peak += other.peak;
        self.allocated += other.allocated;
        self.freed += other.freed;
    }
}

/// Which slice of a [`StatArray`] a change applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatType {
    /// Every pool ("all").
    Aggregate = 0,
    /// Blocks of at most 1 MiB ("small_pool").
    SmallPool = 1,
    /// Blocks above 1 MiB ("large_pool").
    LargePool = 2,
}

impl StatType {
    /// All three, in PyTorch's order.
    pub const ALL: [StatType; 3] = [
        StatType::Aggregate,
        StatType::SmallPool,
        StatType::LargePool,
    ];

    /// The name PyTorch uses in `memory_stats()` keys.
    pub fn name(self) -> &'static str {
        match self {
            StatType::Aggregate => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }

    /// The pool-specific type for a pool kind.
    #[inline]
    pub fn for_pool(is_small: bool) -> StatType {
        if is_small {
            StatType::SmallPool
        } else {
            StatType::LargePool
        }
    }
}

/// One [`Stat`] per [`StatType`]: aggregate, small pool, large pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The stat of one type.
    pub fn get(&self, t: StatType) -> &Stat {
        &self.0[t as usize]
    }

    /// The aggregate ("all") stat.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }

    /// Increase the aggregate and the pool's stat (PyTorch's
    /// `for_each_selected_stat_type` over `{AGGREGATE, pool}`).
    #[inline]
    pub fn increase(&mut self, pool: StatType, amount: u64) {
        self.0[0].increase(amount);
        self.0[pool as usize].increase(amount);
    }

    /// Decrease the aggregate and the pool's stat.
    #[inline]
    pub fn decrease(&mut self, pool: StatType, amount: u64) {
        self.0[0].decrease(amount);
        self.0[pool as usize].decrease(amount);
    }

    /// Zero the lifetime totals of the three stats.
    pub fn reset_accumulated(&mut self) {
        self.0.iter_mut().for_each(Stat::reset_accumulated);
    }

    /// Set the three peaks to their current values.
    pub fn reset_peak(&mut self) {
        self.0.iter_mut().for_each(Stat::reset_peak);
    }
}

/// Statistics of one device's caching allocator: `c10::CachingDeviceAllocator::DeviceStats`.
///
/// `A` is how each of the nine arrays is kept: a [`StatArray`] as PyTorch
/// reports it (the default, and the only one outside this crate), or the
/// caching allocator's own per-pool counters while the device runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStats<A = StatArray> {
    /// Number of allocated blocks (key `allocation`).
    pub allocation: A,
    /// Number of segments obtained from the driver.
    pub segment: A,
    /// Number of active blocks (allocated, or freed and waiting for other streams).
    pub active: A,
    /// Number of free blocks that are part of a split segment (cannot be
    /// released to the driver).
    pub inactive_split: A,
    /// Bytes of allocated blocks (rounded sizes, whole blocks).
    pub allocated_bytes: A,
    /// Bytes obtained from the driver.
    pub reserved_bytes: A,
    /// Bytes of active blocks.
    pub active_bytes: A,
    /// Bytes of inactive split blocks.
    pub inactive_split_bytes: A,
    /// Bytes callers asked for (before rounding), over active blocks.
    pub requested_bytes: A,
    /// Allocations that needed the full cache flush and a retry.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised.
    pub num_ooms: i64,
    /// Allocations refused by an out-of-memory rejection policy before any
    /// attempt (PyTorch 2.9+ key `num_oom_rejections`; 0 unless such a policy
    /// is installed).
    pub num_oom_rejections: i64,
    /// Allocations of at least `max_split_size` bytes.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: Stat,
    /// Calls to synchronise every outstanding event (empty_cache, OOM flush).
    pub num_sync_all_streams: i64,
    /// Driver allocations (segment mallocs and expandable-segment maps).
    pub num_device_alloc: i64,
    /// Driver frees (segment frees and expandable-segment unmaps).
    pub num_device_free: i64,
    /// `max_split_size` in force when the allocator was created
    /// (-1 when unlimited, as PyTorch prints `SIZE_MAX`).
    pub max_split_size: i64,
}

impl Default for DeviceStats {
    fn default() -> Self {
        DeviceStats {
            allocation: StatArray::default(),
            segment: StatArray::default(),
            active: StatArray::default(),
            inactive_split: StatArray::default(),
            allocated_bytes: StatArray::default(),
            reserved_bytes: StatArray::default(),
            active_bytes: StatArray::default(),
            inactive_split_bytes: StatArray::default(),
            requested_bytes: StatArray::default(),
            num_alloc_retries: 0,
            num_ooms: 0,
            num_oom_rejections: 0,
            oversize_allocations: Stat::default(),
            oversize_segments: Stat::default(),
            num_sync_all_streams: 0,
            num_device_alloc: 0,
            num_device_free: 0,
            max_split_size: -1,
        }
    }
}

impl<A> DeviceStats<A> {
    /// The nine arrays, in the order of [`arrays`](DeviceStats::arrays).
    fn arrays_mut(&mut self) -> [&mut A; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    /// These statistics with each array mapped by `f`; every other field
    /// is copied.
    pub(crate) fn map_arrays<B>(&self, f: impl Fn(&A) -> B) -> DeviceStats<B> {
        DeviceStats {
            allocation: f(&self.allocation),
            segment: f(&self.segment),
            active: f(&self.active),
            inactive_split: f(&self.inactive_split),
            allocated_bytes: f(&self.allocated_bytes),
            reserved_bytes: f(&self.reserved_bytes),
            active_bytes: f(&self.active_bytes),
            inactive_split_bytes: f(&self.inactive_split_bytes),
            requested_bytes: f(&self.requested_bytes),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_oom_rejections: self.num_oom_rejections,
            oversize_allocations: self.oversize_allocations,
            oversize_segments: self.oversize_segments,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            max_split_size: self.max_split_size,
        }
    }

    /// [`reset_accumulated`](DeviceStats::reset_accumulated), with `array`
    /// resetting each array.
    pub(crate) fn reset_accumulated_with(&mut self, array: fn(&mut A)) {
        self.arrays_mut().into_iter().for_each(array);
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_oom_rejections = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
    }

    /// [`reset_peak`](DeviceStats::reset_peak), with `array` resetting
    /// each array.
    pub(crate) fn reset_peak_with(&mut self, array: fn(&mut A)) {
        self.arrays_mut().into_iter().for_each(array);
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }
}

impl DeviceStats {
    /// Zeroed statistics of an allocator created with `max_split_size`
    /// bytes (`u64::MAX`, unlimited, is kept as -1).
    pub fn with_max_split_size(max_split_size: u64) -> DeviceStats {
        DeviceStats {
            max_split_size: if max_split_size == u64::MAX {
                -1
            } else {
                max_split_size as i64
            },
            ..DeviceStats::default()
        }
    }

    /// Add `other`'s gauges, totals, peaks and event counters to these
    /// (`max_split_size` stays). Peaks add up to an upper bound of the peak
    /// of the sum.
    pub fn add(&mut self, other: &DeviceStats) {
        for (total, (_, s)) in self.arrays_mut().into_iter().zip(other.arrays()) {
            for (t, s) in total.0.iter_mut().zip(&s.0) {
                t.add(s);
            }
        }
        self.num_alloc_retries += other.num_alloc_retries;
        self.num_ooms += other.num_ooms;
        self.num_oom_rejections += other.num_oom_rejections;
        self.oversize_allocations.add(&other.oversize_allocations);
        self.oversize_segments.add(&other.oversize_segments);
        self.num_sync_all_streams += other.num_sync_all_streams;
        self.num_device_alloc += other.num_device_alloc;
        self.num_device_free += other.num_device_free;
    }

    /// The stat arrays with their `memory_stats()` names.
    pub fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ]
    }

    /// Zero every lifetime total and event counter
    /// (`torch.cuda.reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        self.reset_accumulated_with(StatArray::reset_accumulated);
    }

    /// Set every peak to its current value (`torch.cuda.reset_peak_memory_stats`).
    pub fn reset_peak(&mut self) {
        self.reset_peak_with(StatArray::reset_peak);
    }

    /// [`to_flat`](Self::to_flat) with the keys of PyTorch release `release`
    /// ([`ReleaseRules::missing_stat_keys`](crate::config::ReleaseRules::missing_stat_keys)).
    pub fn to_flat_of(&self, release: crate::config::TorchRelease) -> BTreeMap<String, i64> {
        let mut flat = self.to_flat();
        for key in release.rules().missing_stat_keys() {
            flat.remove(*key);
        }
        flat
    }

    /// The flat, sorted view `torch.cuda.memory_stats()` returns, with the
    /// same keys: `allocated_bytes.all.current`, `num_alloc_retries`, ...
    pub fn to_flat(&self) -> BTreeMap<String, i64> {
        // Keys are joined without `format!` and the map is built in one
        // pass from the sorted list (it is read once per report).
        let mut out: Vec<(String, i64)> = Vec::with_capacity(9 * 3 * 4 + 2 * 4 + 7);
        for (name, array) in self.arrays() {
            for t in StatType::ALL {
                put_stat(&mut out, &[name, ".", t.name()], array.get(t));
            }
        }
        put_stat(
            &mut out,
            &["oversize_allocations"],
            &self.oversize_allocations,
        );
        put_stat(&mut out, &["oversize_segments"], &self.oversize_segments);
        for (key, value) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_oom_rejections", self.num_oom_rejections),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("max_split_size", self.max_split_size),
        ] {
            out.push((key.to_string(), value));
        }
        out.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        out.into_iter().collect()
    }
}

/// Add the `memory_stats()` keys of PyTorch's
/// `reserved_bytes_by_private_pools` (torch 2.13+, spec 1.12) to `flat`:
/// `reserved_bytes_by_private_pools.<a>_<b>.{all,small_pool,large_pool}.{current,peak,allocated,freed}`
/// for each pool id `(a, b)` (torch flattens the tuple key with `_`).
pub fn put_private_pool_reserved<'a>(
    flat: &mut BTreeMap<String, i64>,
    pools: impl IntoIterator<Item = (&'a crate::ids::MempoolId, &'a StatArray)>,
) {
    let mut out = Vec::new();
    for (id, array) in pools {
        let pool = format!("{}_{}", id.0, id.1);
        for t in StatType::ALL {
            put_stat(
                &mut out,
                &["reserved_bytes_by_private_pools.", &pool, ".", t.name()],
                array.get(t),
            );
        }
    }
    flat.extend(out);
}

/// Push the four fields of `s` under the key made of `prefix`'s parts.
fn put_stat(out: &mut Vec<(String, i64)>, prefix: &[&str], s: &Stat) {
    for (field, value) in [
        ("current", s.current),
        ("peak", s.peak),
        ("allocated", s.allocated),
        ("freed", s.freed),
    ] {
        let mut key = String::with_capacity(48);
        for part in prefix {
            key.push_str(part);
        }
        key.push('.');
        key.push_str(field);
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_semantics_match_c10() {
        // spec 1.12: increase raises current/peak/allocated, decrease adds to freed.
        let mut s = Stat::default();
        s.increase(10);
        s.increase(5);
        s.decrease(12);
        assert_eq!(
            s,
            Stat {
                current: 3,
                peak: 15,
                allocated: 15,
                freed: 12
            }
        );
        s.reset_peak();
        assert_eq!(s.peak, 3);
        s.reset_accumulated();
        assert_eq!(
            s,
            Stat {
                current: 3,
                peak: 3,
                allocated: 0,
                freed: 0
            }
        );
    }

    #[test]
    fn adding_sums_every_key_and_keeps_max_split_size() {
        let mut a = DeviceStats::with_max_split_size(u64::MAX);
        assert_eq!(a.max_split_size, -1);
        a.allocated_bytes.increase(StatType::LargePool, 300);
        a.num_ooms = 1;
        let mut b = DeviceStats::with_max_split_size(20 << 20);
        assert_eq!(b.max_split_size, 20 << 20);
        b.allocated_bytes.increase(StatType::LargePool, 500);
        b.allocated_bytes.decrease(StatType::LargePool, 100);
        b.oversize_segments.increase(1);
        b.num_device_alloc = 2;
        let (fa, fb) = (a.to_flat(), b.to_flat());
        a.add(&b);
        assert_eq!(a.max_split_size, -1);
        for (key, v) in a.to_flat() {
            if key != "max_split_size" {
                assert_eq!(v, fa[&key] + fb[&key], "{key}");
            }
        }
        assert_eq!(a.allocated_bytes.all().peak, 800, "peaks add up");
    }

    #[test]
    fn flat_keys_use_torch_names() {
        let mut st = DeviceStats::default();
        st.allocated_bytes.increase(StatType::LargePool, 4096);
        let flat = st.to_flat();
        assert_eq!(flat["allocated_bytes.all.current"], 4096);
        assert_eq!(flat["allocated_bytes.large_pool.peak"], 4096);
        assert_eq!(flat["allocated_bytes.small_pool.current"], 0);
        assert_eq!(flat["max_split_size"], -1);
        assert!(flat.contains_key("num_alloc_retries"));
        assert!(flat.contains_key("oversize_segments.freed"));
        // 9 arrays x 3 pools x 4 fields + 2 single stats x 4 + 7 scalars:
        // the 123 keys torch 2.15's memory_stats() returns.
        assert_eq!(flat.len(), 9 * 3 * 4 + 8 + 7);
    }
}
