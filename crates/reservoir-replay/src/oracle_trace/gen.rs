//! A seeded, deterministic trace generator.
//!
//! Everything here is integer arithmetic or exactly rounded `f64` basic
//! operations on values drawn from [`SplitMix64`]; no `ln`/`exp`/`powf`
//! (whose last bits may differ between C libraries), no hash maps, no
//! dependency. The same `(kind, seed, ops, limit)` gives the same trace on
//! every platform and with every crate version.
//!
//! Each [`GenKind`] is a workload shape; [`generate`] runs it until the trace
//! has at least the requested number of ops. The generator never reuses an
//! allocation id and frees each id at most once, so a trace is valid for the
//! oracle whatever allocations hit OOM (the oracle ignores frees and
//! `record_stream` of ids whose allocation failed).

use std::fmt;

use reservoir::rng::SplitMix64;

use super::{AllocId, Op, StreamName};

mod layers;
mod streams;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The workload shapes of the generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GenKind {
    /// Log-uniform sizes (lower and upper bounds vary per trace), a bounded
    /// live set, random frees, sometimes a few streams and `empty_cache`.
    Uniform,
    /// Training-step-like: persistent parameters (and optimizer state),
    /// forward activations kept for backward, temporaries, LIFO backward
    /// frees, gradients; layer shapes from realistic dimensions.
    Layers,
    /// A growing live set: buffers reallocated larger (allocate new, free
    /// old), slowly accumulating persistent allocations, evictions when over
    /// a budget that may exceed the device (OOMs).
    Growing,
    /// Phases of allocations followed by bursts of frees in various orders,
    /// often followed by `empty_cache`.
    Bursts,
    /// Mostly small-pool sizes (1 B to 1 MiB) and the boundary to the large pool.
    Small,
    /// Sizes at and around every rounding and pool threshold.
    Boundaries,
    /// Allocations of 64 MiB to several GiB, with some beyond the device.
    Huge,
    /// A small device: requests scaled to its capacity, free-and-retry,
    /// out-of-memory errors (the trace goes on after them).
    Oom,
    /// Several streams: allocations per stream, `record_stream` on held
    /// streams with pending work, so frees really wait; releases later.
    Streams,
    /// [`GenKind::Streams`] plus stream and device synchronization and
    /// `wait_stream`.
    StreamsSync,
    /// Large-pool churn with shifting sizes under a memory fraction, for
    /// `garbage_collection_threshold`.
    Gc,
    /// Sizes around `max_split_size_mb` thresholds, oversize blocks, some
    /// memory pressure.
    MaxSplit,
    /// Sizes across all `roundup_power2_divisions` intervals (1 B to 8 GiB).
    Rounding,
}

impl GenKind {
    /// Every kind.
    pub const ALL: [GenKind; 13] = [
        GenKind::Uniform,
        GenKind::Layers,
        GenKind::Growing,
        GenKind::Bursts,
        GenKind::Small,
        GenKind::Boundaries,
        GenKind::Huge,
        GenKind::Oom,
        GenKind::Streams,
        GenKind::StreamsSync,
        GenKind::Gc,
        GenKind::MaxSplit,
        GenKind::Rounding,
    ];

    /// The kind's name (snake case), as in manifests and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            GenKind::Uniform => "uniform",
            GenKind::Layers => "layers",
            GenKind::Growing => "growing",
            GenKind::Bursts => "bursts",
            GenKind::Small => "small",
            GenKind::Boundaries => "boundaries",
            GenKind::Huge => "huge",
            GenKind::Oom => "oom",
            GenKind::Streams => "streams",
            GenKind::StreamsSync => "streams_sync",
            GenKind::Gc => "gc",
            GenKind::MaxSplit => "max_split",
            GenKind::Rounding => "rounding",
        }
    }

    /// Parse a kind's name.
    pub fn parse(s: &str) -> Option<GenKind> {
        GenKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for GenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Generate the ops of one trace.
///
/// `ops` is the target length (the trace may be a few ops longer); `limit` is
/// the memory the allocator may use (device capacity, or capacity times the
/// memory fraction): kinds that want to stay clear of OOMs keep their live
/// bytes below a share of it, kinds that want OOMs scale their sizes to it.
pub fn generate(kind: GenKind, seed: u64, ops: usize, limit: u64) -> Vec<Op> {
    let mut g = Gen::new(seed, ops, limit.max(64 * MIB));
    match kind {
        GenKind::Uniform => g.uniform(),
        GenKind::Layers => g.layers(),
        GenKind::Growing => g.growing(),
        GenKind::Bursts => g.bursts(),
        GenKind::Small => g.small(),
        GenKind::Boundaries => g.boundaries(),
        GenKind::Huge => g.huge(),
        GenKind::Oom => g.oom(),
        GenKind::Streams => g.streams(false),
        GenKind::StreamsSync => g.streams(true),
        GenKind::Gc => g.gc(),
        GenKind::MaxSplit => g.max_split(),
        GenKind::Rounding => g.rounding(),
    }
    g.ops
}

#[derive(Clone, Copy, Debug)]
struct Live {
    id: AllocId,
    bytes: u64,
    stream: usize,
}

struct Gen {
    r: SplitMix64,
    ops: Vec<Op>,
    target: usize,
    limit: u64,
    next_id: AllocId,
    live: Vec<Live>,
    live_bytes: u64,
    /// Stream names; index 0 is the default stream.
    streams: Vec<StreamName>,
    current: usize,
    held: Vec<bool>,
}

impl Gen {
    fn new(seed: u64, target: usize, limit: u64) -> Gen {
        Gen {
            r: SplitMix64::new(seed),
            ops: Vec::with_capacity(target + 64),
            target,
            limit,
            next_id: 1,
            live: Vec::new(),
            live_bytes: 0,
            streams: vec![StreamName::default_stream()],
            current: 0,
            held: vec![false],
        }
    }

    fn done(&self) -> bool {
        self.ops.len() >= self.target
    }

    // ---- primitive ops -------------------------------------------------

    fn add_streams(&mut self, n: usize) {
        for i in 1..=n {
            self.streams.push(StreamName::new(format!("s{i}")));
            self.held.push(false);
        }
    }

    fn name(&self, s: usize) -> StreamName {
        self.streams[s].clone()
    }

    /// Allocate on the current stream (`a id bytes`).
    fn alloc(&mut self, bytes: u64) -> AllocId {
        let id = self.next_id;
        self.next_id += 1;
        self.ops.push(Op::Alloc {
            id,
            bytes,
            stream: None,
        });
        self.live.push(Live {
            id,
            bytes,
            stream: self.current,
        });
        self.live_bytes += bytes;
        id
    }

    /// Allocate on an explicit stream (`a id bytes s`).
    fn alloc_on(&mut self, bytes: u64, s: usize) -> AllocId {
        let id = self.next_id;
        self.next_id += 1;
        let stream = if s == 0 && self.r.chance(0.3) {
            StreamName::new("default")
        } else {
            self.name(s)
        };
        self.ops.push(Op::Alloc {
            id,
            bytes,
            stream: Some(stream),
        });
        self.live.push(Live {
            id,
            bytes,
            stream: s,
        });
        self.live_bytes += bytes;
        id
    }

    fn free_at(&mut self, i: usize) -> Live {
        let l = self.live.swap_remove(i);
        self.live_bytes -= l.bytes;
        self.ops.push(Op::Free { id: l.id });
        l
    }

    fn free_id(&mut self, id: AllocId) {
        if let Some(i) = self.live.iter().position(|l| l.id == id) {
            // Keep the order of the others: some kinds free LIFO/FIFO.
            let l = self.live.remove(i);
            self.live_bytes -= l.bytes;
            self.ops.push(Op::Free { id: l.id });
        }
    }

    fn free_random(&mut self) {
        if !self.live.is_empty() {
            let i = self.r.below(self.live.len() as u64) as usize;
            self.free_at(i);
        }
    }

    /// Free random allocations until live bytes are at most `bytes`.
    fn free_down_to(&mut self, bytes: u64) {
        while self.live_bytes > bytes && !self.live.is_empty() {
            self.free_random();
        }
    }

    fn empty_cache(&mut self) {
        self.ops.push(Op::EmptyCache);
    }

    fn set_stream(&mut self, s: usize) {
        self.current = s;
        let stream = if s == 0 && self.r.chance(0.2) {
            StreamName::new("default")
        } else {
            self.name(s)
        };
        self.ops.push(Op::SetStream { stream });
    }

    fn random_stream(&mut self) -> usize {
        self.r.below(self.streams.len() as u64) as usize
    }

    fn random_live_ids(&mut self, max: u64) -> Vec<AllocId> {
        let n = self.r.range(0, max).min(self.live.len() as u64);
        (0..n)
            .map(|_| {
                let i = self.r.below(self.live.len() as u64) as usize;
                self.live[i].id
            })
            .collect()
    }

    // ---- size helpers --------------------------------------------------

    /// A size from a mixture: mostly `log_uniform(lo, hi)`, sometimes a
    /// "round" size (a multiple of a power of two, as tensor shapes are).
    fn size_mix(&mut self, lo: u64, hi: u64) -> u64 {
        let v = self.r.log_uniform(lo, hi);
        if self.r.chance(0.3) && v >= 4096 {
            // round down to a multiple of 512 .. 1 MiB, keeping >= lo
            let g = 1u64 << self.r.range(9, 20).min(63 - v.leading_zeros() as u64);
            let w = v / g * g;
            if w >= lo {
                return w;
            }
        }
        v
    }

    // ---- kinds ---------------------------------------------------------

    fn uniform(&mut self) {
        let lo = *self.r.pick(&[1, 1, 512, 4 * KIB, 64 * KIB]);
        let hi = *self
            .r
            .pick(&[64 * KIB, MIB, 16 * MIB, 64 * MIB, 256 * MIB, GIB]);
        let live_target = *self.r.pick(&[4usize, 16, 64, 256, 1024]);
        let free_p = *self.r.pick(&[0.3, 0.45, 0.5, 0.55]);
        let e_p = *self.r.pick(&[0.0, 0.0, 0.002, 0.01]);
        let nstreams = *self.r.pick(&[0usize, 0, 0, 1, 2]);
        self.add_streams(nstreams);
        let budget = self.limit / 10 * 8;
        while !self.done() {
            if self.r.chance(e_p) {
                self.empty_cache();
            } else if nstreams > 0 && self.r.chance(0.02) {
                let s = self.random_stream();
                self.set_stream(s);
            } else if !self.live.is_empty()
                && (self.live.len() >= live_target || self.r.chance(free_p))
            {
                self.free_random();
            } else {
                let b = self.size_mix(lo, hi);
                if self.live_bytes + b > budget {
                    self.free_down_to(budget / 2);
                }
                self.alloc(b);
            }
        }
    }

    fn growing(&mut self) {
        let nseq_max = self.r.range(1, 16) as usize;
        let grow_unit = *self
            .r
            .pick(&[512u64, 4 * KIB, 64 * KIB, MIB, 2 * MIB, 8 * MIB]);
        let budget_pct = *self.r.pick(&[30u64, 60, 80, 95, 110]);
        let budget = self.limit / 100 * budget_pct;
        let e_p = *self.r.pick(&[0.0, 0.005, 0.02]);
        let nstreams = *self.r.pick(&[0usize, 0, 1, 2]);
        self.add_streams(nstreams);
        let mut seqs: Vec<(AllocId, u64)> = Vec::new();
        while !self.done() {
            if self.live_bytes > budget {
                // Evict sequences (or, without any, other buffers) down to
                // 70% of the budget.
                while self.live_bytes > budget / 10 * 7 && !self.live.is_empty() {
                    if seqs.is_empty() {
                        self.free_random();
                    } else {
                        let i = self.r.below(seqs.len() as u64) as usize;
                        let (id, _) = seqs.swap_remove(i);
                        self.free_id(id);
                    }
                }
                continue;
            }
            match self.r.weighted(&[60, 14, 10, 10, 3, 3]) {
                0 if !seqs.is_empty() => {
                    let i = self.r.below(seqs.len() as u64) as usize;
                    let (old, b) = seqs[i];
                    let nb = b + grow_unit * self.r.range(1, 4);
                    let new = self.alloc(nb);
                    self.free_id(old);
                    seqs[i] = (new, nb);
                }
                1 if seqs.len() < nseq_max => {
                    let b = grow_unit * self.r.range(1, 8) + self.r.below(grow_unit);
                    let id = self.alloc(b);
                    seqs.push((id, b));
                }
                2 if !seqs.is_empty() => {
                    let i = self.r.below(seqs.len() as u64) as usize;
                    let (id, _) = seqs.swap_remove(i);
                    self.free_id(id);
                }
                3 => {
                    let b = self.size_mix(1, 4 * MIB);
                    self.alloc(b);
                }
                4 => self.empty_cache(),
                5 if nstreams > 0 => {
                    let s = self.random_stream();
                    self.set_stream(s);
                }
                _ => {
                    if self.r.chance(e_p) {
                        self.empty_cache();
                    } else {
                        let b = self.size_mix(512, 16 * MIB);
                        let id = self.alloc(b);
                        if self.r.chance(0.5) {
                            self.free_id(id);
                        }
                    }
                }
            }
        }
    }

    fn bursts(&mut self) {
        let e_p = *self.r.pick(&[0.0, 0.3, 0.7]);
        let budget = self.limit / 10 * 7;
        while !self.done() {
            let n = self.r.range(5, 200);
            let style = self.r.below(4);
            let lo = *self.r.pick(&[1u64, 512, 64 * KIB, MIB]);
            let hi = (*self.r.pick(&[MIB, 16 * MIB, 128 * MIB, GIB])).max(lo);
            let same = self.size_mix(lo, hi);
            let other = self.size_mix(lo, hi);
            for _ in 0..n {
                let b = match style {
                    0 => self.size_mix(lo, hi),
                    1 => same,
                    2 => {
                        if self.r.chance(0.5) {
                            same
                        } else {
                            other
                        }
                    }
                    _ => same + self.r.below(same / 4 + 1),
                };
                if b > budget / 4 {
                    continue;
                }
                if self.live_bytes + b > budget {
                    break;
                }
                self.alloc(b);
                if self.done() {
                    return;
                }
            }
            let frac = *self.r.pick(&[25u64, 50, 75, 100, 100]);
            let count = (self.live.len() as u64 * frac).div_ceil(100) as usize;
            match self.r.below(5) {
                0 => {
                    for _ in 0..count {
                        self.free_random();
                    }
                }
                1 => {
                    for _ in 0..count {
                        let l = self.live.len() - 1;
                        let id = self.live[l].id;
                        self.free_id(id);
                    }
                }
                2 => {
                    for _ in 0..count {
                        let id = self.live[0].id;
                        self.free_id(id);
                    }
                }
                k => {
                    let mut order: Vec<(u64, AllocId)> =
                        self.live.iter().map(|l| (l.bytes, l.id)).collect();
                    order.sort_unstable();
                    if k == 3 {
                        order.reverse();
                    }
                    for &(_, id) in order.iter().take(count) {
                        self.free_id(id);
                    }
                }
            }
            if self.r.chance(e_p) {
                self.empty_cache();
            }
        }
    }

    fn small(&mut self) {
        let live_target = *self.r.pick(&[16usize, 128, 1024, 4096]);
        let free_p = *self.r.pick(&[0.35, 0.45, 0.5]);
        let e_p = *self.r.pick(&[0.0, 0.002, 0.01]);
        let typical = [
            1,
            4,
            8,
            16,
            100,
            511,
            512,
            513,
            1000,
            1024,
            4096,
            8192,
            65536,
            MIB - 512,
            MIB - 1,
            MIB,
            MIB + 1,
        ];
        while !self.done() {
            if self.r.chance(e_p) {
                self.empty_cache();
            } else if !self.live.is_empty()
                && (self.live.len() >= live_target || self.r.chance(free_p))
            {
                self.free_random();
            } else {
                let b = match self.r.weighted(&[60, 20, 10, 10]) {
                    0 => self.r.log_uniform(1, MIB),
                    1 => *self.r.pick(&typical),
                    2 => MIB - self.r.below(4096),
                    _ => self.r.log_uniform(MIB, 3 * MIB),
                };
                self.alloc(b);
            }
        }
    }

    fn boundaries(&mut self) {
        let mut sizes = vec![1u64, 2, 511, 512, 513, 1023, 1024, 1025, 4095, 4096, 65536];
        for base in [
            MIB,
            2 * MIB,
            3 * MIB,
            4 * MIB,
            10 * MIB,
            12 * MIB,
            20 * MIB,
            21 * MIB,
            22 * MIB,
            32 * MIB,
            40 * MIB,
            64 * MIB,
            100 * MIB,
            128 * MIB,
            256 * MIB,
            512 * MIB,
            GIB,
        ] {
            sizes.extend_from_slice(&[base - 512, base - 1, base, base + 1, base + 512]);
        }
        let live_target = *self.r.pick(&[8usize, 32, 128]);
        let lifo = self.r.chance(0.3);
        let budget = self.limit / 10 * 7;
        while !self.done() {
            if !self.live.is_empty() && (self.live.len() >= live_target || self.r.chance(0.45)) {
                if lifo {
                    let id = self.live[self.live.len() - 1].id;
                    self.free_id(id);
                } else {
                    self.free_random();
                }
            } else {
                let b = if self.r.chance(0.7) {
                    *self.r.pick(&sizes)
                } else {
                    self.r.log_uniform(1, 64 * MIB)
                };
                if self.live_bytes + b > budget {
                    self.free_down_to(budget / 2);
                }
                self.alloc(b);
                if self.r.chance(0.01) {
                    self.empty_cache();
                }
            }
        }
    }

    fn huge(&mut self) {
        let live_target = *self.r.pick(&[2usize, 4, 8, 12]);
        let limit = self.limit;
        while !self.done() {
            if !self.live.is_empty() && (self.live.len() >= live_target || self.r.chance(0.4)) {
                self.free_random();
            } else if self.r.chance(0.03) {
                let b = self.r.log_uniform(limit / 4, limit / 5 * 6);
                self.alloc(b);
            } else if self.r.chance(0.02) {
                self.empty_cache();
            } else {
                let b = if self.r.chance(0.8) {
                    self.size_mix(64 * MIB, 8 * GIB)
                } else {
                    self.size_mix(1, 64 * MIB)
                };
                self.alloc(b);
            }
        }
    }

    fn oom(&mut self) {
        let cap = self.limit;
        let budget_pct = *self.r.pick(&[60u64, 80, 100, 130]);
        let budget = cap / 100 * budget_pct;
        let free_p = *self.r.pick(&[0.35, 0.45, 0.5]);
        let e_p = *self.r.pick(&[0.0, 0.005, 0.02]);
        let nstreams = *self.r.pick(&[0usize, 0, 0, 1, 2]);
        self.add_streams(nstreams);
        while !self.done() {
            if self.live_bytes > budget {
                let keep = budget / 100 * *self.r.pick(&[30u64, 50, 80]);
                self.free_down_to(keep);
            } else if self.r.chance(e_p) {
                self.empty_cache();
            } else if nstreams > 0 && self.r.chance(0.03) {
                let s = self.random_stream();
                self.set_stream(s);
            } else if !self.live.is_empty() && self.r.chance(free_p) {
                self.free_random();
            } else {
                let b = match self.r.weighted(&[80, 14, 5, 1]) {
                    0 => self.size_mix((cap / 2000).max(1), cap / 5),
                    1 => self.r.log_uniform(1, 2 * MIB),
                    2 => self.size_mix(cap / 4, cap),
                    _ => self.r.log_uniform(cap, 2 * cap),
                };
                self.alloc(b);
            }
        }
    }

    fn gc(&mut self) {
        let limit = self.limit;
        let live_target = *self.r.pick(&[4usize, 8, 16, 32]);
        let budget = limit / 10 * *self.r.pick(&[4u64, 6, 8]);
        let phase_len = self.r.range(20, 200) as usize;
        let mut center = self.r.log_uniform(4 * MIB, (limit / 8).max(8 * MIB));
        let mut since = 0usize;
        while !self.done() {
            since += 1;
            if since >= phase_len {
                since = 0;
                center = self.r.log_uniform(4 * MIB, (limit / 8).max(8 * MIB));
            }
            if !self.live.is_empty()
                && (self.live.len() >= live_target
                    || self.live_bytes > budget
                    || self.r.chance(0.45))
            {
                self.free_random();
            } else if self.r.chance(0.01) {
                self.empty_cache();
            } else {
                let b = if self.r.chance(0.8) {
                    center / 2 + self.r.below(center * 3 / 2)
                } else {
                    self.r.log_uniform(1, 2 * MIB)
                };
                self.alloc(b);
            }
        }
    }

    fn max_split(&mut self) {
        let budget = self.limit / 100 * *self.r.pick(&[70u64, 100, 130]);
        let around = [
            20 * MIB,
            32 * MIB,
            64 * MIB,
            100 * MIB,
            128 * MIB,
            200 * MIB,
            256 * MIB,
            512 * MIB,
            GIB,
        ];
        let free_p = *self.r.pick(&[0.4, 0.45, 0.5]);
        while !self.done() {
            if self.live_bytes > budget {
                let keep = budget / 2;
                self.free_down_to(keep);
            } else if !self.live.is_empty() && self.r.chance(free_p) {
                self.free_random();
            } else if self.r.chance(0.01) {
                self.empty_cache();
            } else {
                let b = match self.r.weighted(&[40, 30, 20, 10]) {
                    0 => self.size_mix(MIB, GIB),
                    1 => {
                        let c = *self.r.pick(&around);
                        c / 2 + self.r.below(c * 3 / 2)
                    }
                    2 => self.r.log_uniform(1, 2 * MIB),
                    _ => {
                        let hi = (4 * GIB).min(self.limit);
                        self.size_mix(GIB.min(hi / 4), hi)
                    }
                };
                self.alloc(b);
            }
        }
    }

    fn rounding(&mut self) {
        let live_target = *self.r.pick(&[4usize, 16, 64]);
        let budget = self.limit / 10 * 6;
        while !self.done() {
            if !self.live.is_empty() && (self.live.len() >= live_target || self.r.chance(0.45)) {
                self.free_random();
            } else {
                let b = match self.r.weighted(&[20, 50, 25, 5]) {
                    0 => self.r.log_uniform(1, MIB),
                    1 => self.r.log_uniform(MIB, 256 * MIB),
                    2 => self.r.log_uniform(256 * MIB, 4 * GIB),
                    _ => self.r.log_uniform(4 * GIB, 8 * GIB),
                };
                if self.live_bytes + b > budget {
                    self.free_down_to(budget / 2);
                }
                self.alloc(b);
                if self.r.chance(0.01) {
                    self.empty_cache();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_is_deterministic_and_valid() {
        for kind in GenKind::ALL {
            let a = generate(kind, 42, 500, 8 << 30);
            let b = generate(kind, 42, 500, 8 << 30);
            assert_eq!(a, b, "{kind}");
            assert!(a.len() >= 500, "{kind}");
            // never reuses a live id, frees each id at most once
            let mut live = std::collections::BTreeSet::new();
            let mut seen = std::collections::BTreeSet::new();
            for op in &a {
                match op {
                    Op::Alloc { id, bytes, .. } => {
                        assert!(*bytes > 0);
                        assert!(seen.insert(*id), "{kind}: id {id} reused");
                        live.insert(*id);
                    }
                    Op::Free { id } => assert!(live.remove(id), "{kind}: bad free {id}"),
                    Op::RecordStream { id, .. } => assert!(live.contains(id), "{kind}"),
                    _ => {}
                }
            }
            assert_eq!(GenKind::parse(kind.as_str()), Some(kind));
        }
    }
}
