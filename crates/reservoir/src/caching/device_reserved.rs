//! The device-wide `reserved_bytes` gauge that stream shards share: reserved
//! memory changes only on driver calls (segment allocations and frees, page
//! maps and unmaps), so keeping it exact across shards costs one atomic
//! update per driver call and nothing on cached allocations. Its peak is
//! therefore the device's true peak, where the other gauges' peaks are sums
//! of the shards' peaks (see [`StreamShards`](super::StreamShards)).

use std::sync::atomic::{AtomicI64, Ordering};

use crate::stats::{StatArray, StatType};

/// Current and peak reserved bytes per [`StatType`], shared by every shard.
#[derive(Debug, Default)]
pub(crate) struct DeviceReserved {
    current: [AtomicI64; 3],
    peak: [AtomicI64; 3],
}

impl DeviceReserved {
    /// Reserved memory of pool type `st` changed by `delta` bytes (the
    /// aggregate too).
    pub(crate) fn add(&self, st: StatType, delta: i64) {
        self.add_to(StatType::Aggregate, delta);
        if st != StatType::Aggregate {
            self.add_to(st, delta);
        }
    }

    fn add_to(&self, t: StatType, delta: i64) {
        let now = self.current[t as usize].fetch_add(delta, Ordering::Relaxed) + delta;
        self.peak[t as usize].fetch_max(now, Ordering::Relaxed);
    }

    /// The current values, per [`StatType`].
    pub(crate) fn current(&self) -> [i64; 3] {
        self.current.each_ref().map(|c| c.load(Ordering::Relaxed))
    }

    /// Set each peak to the current value (`reset_peak_stats`).
    pub(crate) fn reset_peak(&self) {
        for (peak, current) in self.peak.iter().zip(&self.current) {
            peak.store(current.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Put the device-wide peaks into `reserved` (summed over the shards).
    pub(crate) fn set_peaks(&self, reserved: &mut StatArray) {
        for (stat, peak) in reserved.0.iter_mut().zip(&self.peak) {
            stat.peak = peak.load(Ordering::Relaxed);
        }
    }
}
