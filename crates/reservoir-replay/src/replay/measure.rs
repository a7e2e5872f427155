//! The replay's own measurements: the downsampled time series
//! ([`Sampler`]) and the wall time of allocator calls ([`CallTimer`]).

use std::time::{Duration, Instant};

use super::Sample;

/// Block visits the peak scans may spend before any op has run.
pub(super) const SCAN_BUDGET_START: u64 = 1 << 20;

/// Block visits the peak scans earn per op that changed the allocator.
pub(super) const SCAN_CREDIT_PER_OP: u64 = 64;

/// Downsamples (op, allocated, reserved) points: per bucket of ops, the
/// points of lowest and highest allocated bytes, in op order (the earliest
/// of equal points).
#[derive(Debug)]
pub(super) struct Sampler {
    bucket: usize,
    /// The first op past the open bucket (0 before the first point, so the
    /// first point opens a bucket).
    end: usize,
    /// The open bucket's lowest and highest points (meaningful when `open`).
    lo: Sample,
    hi: Sample,
    open: bool,
    out: Vec<Sample>,
}

impl Sampler {
    pub(super) fn new(ops: usize, max_samples: usize) -> Self {
        let buckets = (max_samples / 2).max(1);
        let bucket = ops.div_ceil(buckets).max(1);
        let none = Sample {
            op: 0,
            allocated: 0,
            reserved: 0,
        };
        Sampler {
            bucket,
            end: 0,
            lo: none,
            hi: none,
            open: false,
            out: Vec::with_capacity(max_samples.min(2 * ops + 2)),
        }
    }

    /// Called after every op that may change the bytes: two comparisons
    /// unless `s` opens a new bucket.
    #[inline]
    pub(super) fn push(&mut self, s: Sample) {
        if s.op as usize >= self.end {
            self.open_bucket(s);
            return;
        }
        if s.allocated < self.lo.allocated {
            self.lo = s;
        }
        if s.allocated > self.hi.allocated {
            self.hi = s;
        }
    }

    /// Close the open bucket and open the one of `s`, with `s` as its only
    /// point.
    #[cold]
    #[inline(never)]
    fn open_bucket(&mut self, s: Sample) {
        self.flush();
        self.end = (s.op as usize / self.bucket + 1) * self.bucket;
        self.lo = s;
        self.hi = s;
        self.open = true;
    }

    /// The two extremes of the open bucket, in op order.
    fn pending(&self) -> impl Iterator<Item = Sample> {
        let (a, b) = match (self.open, self.lo, self.hi) {
            (false, _, _) => (None, None),
            (true, a, b) if a.op == b.op => (Some(a), None),
            (true, a, b) if b.op < a.op => (Some(b), Some(a)),
            (true, a, b) => (Some(a), Some(b)),
        };
        a.into_iter().chain(b)
    }

    fn flush(&mut self) {
        let (a, b) = {
            let mut p = self.pending();
            (p.next(), p.next())
        };
        self.out.extend(a.into_iter().chain(b));
        self.open = false;
    }

    /// Every point so far, the open bucket included.
    pub(super) fn snapshot(&self) -> Vec<Sample> {
        let mut v = Vec::with_capacity(self.out.len() + 2);
        v.extend_from_slice(&self.out);
        v.extend(self.pending());
        v
    }
}

/// Wall time of allocator calls: a random subset of the calls is timed into
/// a log-linear histogram (8 sub-buckets per power of two, so quantiles are
/// within 12.5 %). The gap to the next timed call is drawn at random (1 to
/// `2 * one_in - 1` calls, so one call in `one_in` on average, from a fixed
/// seed), so an untimed call costs a decrement.
#[derive(Debug)]
pub(super) struct CallTimer {
    one_in: u64,
    rng: u64,
    /// Calls left up to and including the next timed one.
    until_timed: u64,
    pub(super) calls: u64,
    pub(super) timed: u64,
    total: Duration,
    histogram: Vec<u64>,
}

impl CallTimer {
    const BUCKETS: usize = 16 + 60 * 8;

    pub(super) fn new(one_in: u32) -> Self {
        let mut t = CallTimer {
            one_in: u64::from(one_in.max(1)),
            rng: 0x9e37_79b9_7f4a_7c15,
            until_timed: 0,
            calls: 0,
            timed: 0,
            total: Duration::ZERO,
            histogram: vec![0; Self::BUCKETS],
        };
        t.until_timed = t.next_gap();
        t
    }

    /// Calls from one timed call to the next: uniform in
    /// `1..=2 * one_in - 1` (always 1 when every call is timed).
    fn next_gap(&mut self) -> u64 {
        if self.one_in == 1 {
            return 1;
        }
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        1 + self.rng % (2 * self.one_in - 1)
    }

    /// Start a call: the clock reading if this call is timed.
    #[inline]
    pub(super) fn start(&mut self) -> Option<Instant> {
        self.calls += 1;
        self.until_timed -= 1;
        if self.until_timed != 0 {
            return None;
        }
        self.until_timed = self.next_gap();
        Some(Instant::now())
    }

    #[inline]
    pub(super) fn stop(&mut self, start: Option<Instant>) {
        if let Some(t0) = start {
            let d = t0.elapsed();
            self.timed += 1;
            self.total += d;
            let ns = d.as_nanos().min(u64::MAX as u128) as u64;
            self.histogram[Self::bucket(ns)] += 1;
        }
    }

    fn bucket(ns: u64) -> usize {
        if ns < 16 {
            return ns as usize;
        }
        let e = 63 - ns.leading_zeros() as usize; // >= 4
        let sub = ((ns >> (e - 3)) & 7) as usize;
        (16 + (e - 4) * 8 + sub).min(Self::BUCKETS - 1)
    }

    /// The middle of bucket `i`.
    fn bucket_value(i: usize) -> f64 {
        if i < 16 {
            return i as f64;
        }
        let e = (i - 16) / 8 + 4;
        let sub = ((i - 16) % 8) as u64;
        let lo = (8 + sub) << (e - 3);
        let width = 1u64 << (e - 3);
        lo as f64 + width as f64 / 2.0
    }

    pub(super) fn quantile(&self, q: f64) -> f64 {
        if self.timed == 0 {
            return 0.0;
        }
        let rank = ((self.timed as f64 * q).ceil() as u64).clamp(1, self.timed);
        let mut seen = 0;
        for (i, &c) in self.histogram.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bucket_value(i);
            }
        }
        0.0
    }

    pub(super) fn mean_ns(&self) -> f64 {
        if self.timed == 0 {
            0.0
        } else {
            self.total.as_nanos() as f64 / self.timed as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_keeps_extremes_and_bounds() {
        let mut s = Sampler::new(100_000, 100);
        for i in 0..100_000u64 {
            let allocated = if i == 31_337 { 1_000_000 } else { i % 97 };
            s.push(Sample {
                op: i,
                allocated,
                reserved: 0,
            });
        }
        let out = s.snapshot();
        assert!(out.len() <= 100, "{}", out.len());
        assert!(out.iter().any(|p| p.allocated == 1_000_000));
        assert!(out.windows(2).all(|w| w[0].op < w[1].op));
    }

    #[test]
    fn call_timer_histogram() {
        for ns in [0u64, 5, 15, 16, 17, 100, 1000, 123_456, u64::MAX / 2] {
            let b = CallTimer::bucket(ns);
            let mid = CallTimer::bucket_value(b);
            assert!(
                (mid - ns as f64).abs() <= ns as f64 / 8.0 + 1.0,
                "{ns} -> {b} -> {mid}"
            );
        }
        let mut t = CallTimer::new(1);
        for ns in 1..=100u64 {
            t.histogram[CallTimer::bucket(ns * 10)] += 1;
            t.timed += 1;
        }
        let p50 = t.quantile(0.5);
        assert!((450.0..=560.0).contains(&p50), "{p50}");
        let p99 = t.quantile(0.99);
        assert!((900.0..=1050.0).contains(&p99), "{p99}");
        // one in 8, at random
        let mut s = CallTimer::new(8);
        let timed = (0..80_000).filter(|_| s.start().is_some()).count();
        assert!((9_000..11_000).contains(&timed), "{timed}");
    }
}
