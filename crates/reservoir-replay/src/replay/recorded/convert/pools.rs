//! Private pools in a conversion: the recorded pool ids (a trace entry's
//! `pool_id`, torch 2.15+; a segment's `segment_pool_id`) turned into the
//! pool ops of the trace (`p`, `x`, `e <pool>`), so that the allocations of
//! a `torch.cuda.MemPool` or a CUDA graph's pool replay in a private pool
//! of their own, as they ran.
//!
//! * An allocation's pool is its entry's `pool_id`; without one (older
//!   formats), the pool of the recorded segment it lies in (its
//!   `segment_alloc` entry's `pool_id`, or the dump-time segment's
//!   `segment_pool_id`), else the default pool. A `p <pool>` op comes
//!   before each allocation whose pool differs from the one before it.
//! * A private pool's segments are freed only once the pool is released
//!   (PyTorch frees only freeable private pools): before the first
//!   `segment_free` / `segment_unmap` of a private pool in use, an `x <pool>`.
//! * A run of segment frees that is the program's `empty_cache()` (see
//!   `Forward::segment_release`) is `e <pool>` (`emptyCache(pool)`, which
//!   `~MemPool` calls) when every segment of the run is of one private
//!   pool, else `e`.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::input::DeviceEvents;
use crate::oracle_trace::{Op, PoolPair};
use reservoir::observe::trace::{TraceAction, TraceEntry};

/// The default pool.
pub(super) const DEFAULT_POOL: PoolPair = (0, 0);

/// A recorded pool id as the trace's ops name it (`MempoolId_t` holds
/// unsigned values; the pickle's ints are read as `i64`).
pub(super) fn pair(p: Option<(i64, i64)>) -> PoolPair {
    p.map_or(DEFAULT_POOL, |(a, b)| (a as u64, b as u64))
}

/// The pools of a conversion's forward phase.
pub(super) struct PoolTracker {
    /// Plain segments by base: (size, pool).
    segs: BTreeMap<u64, (u64, PoolPair)>,
    /// The pool of each dump-time segment, by address.
    dump: FxHashMap<u64, PoolPair>,
    /// The pool allocations go to after the ops so far.
    routed: PoolPair,
    /// The private pools in use (not released) after the ops so far.
    live: BTreeSet<PoolPair>,
}

impl PoolTracker {
    /// The tracker at the first entry: the start state's plain segments
    /// (base, size, pool) and the dump-time segments of `dev`.
    pub(super) fn new(
        start: impl Iterator<Item = (u64, u64, PoolPair)>,
        dev: &DeviceEvents,
    ) -> PoolTracker {
        let mut segs = BTreeMap::new();
        let mut live = BTreeSet::new();
        for (base, size, pool) in start {
            segs.insert(base, (size, pool));
            if pool != DEFAULT_POOL {
                live.insert(pool);
            }
        }
        let dump = dev
            .final_segments
            .iter()
            .flatten()
            .map(|s| (s.address, pair(s.segment_pool_id)))
            .collect();
        PoolTracker {
            segs,
            dump,
            routed: DEFAULT_POOL,
            live,
        }
    }

    /// The pool of the plain segment containing `addr`, if any.
    fn segment_pool(&self, addr: u64) -> Option<PoolPair> {
        let (&base, &(size, pool)) = self.segs.range(..=addr).next_back()?;
        (addr < base.saturating_add(size)).then_some(pool)
    }

    /// The pool of an `alloc` or `segment_free` entry.
    fn pool_of(&self, e: &TraceEntry) -> PoolPair {
        match e.pool_id {
            Some(_) => pair(e.pool_id),
            None => self.segment_pool(e.addr).unwrap_or(DEFAULT_POOL),
        }
    }

    /// The `p` op to put before allocation entry `e`, if its pool is not the
    /// one allocations go to. An `oom` entry without a `pool_id` (its
    /// address is the device's free memory) stays in the current pool.
    pub(super) fn route(&mut self, e: &TraceEntry) -> Option<Op> {
        let pool = match e.action {
            TraceAction::Oom if e.pool_id.is_none() => return None,
            _ => self.pool_of(e),
        };
        if pool == self.routed {
            return None;
        }
        self.routed = pool;
        if pool != DEFAULT_POOL {
            self.live.insert(pool);
        }
        Some(Op::UsePool { pool })
    }

    /// A `segment_alloc` entry: a plain segment in its pool.
    pub(super) fn segment_alloc(&mut self, e: &TraceEntry) {
        let pool = match e.pool_id {
            Some(_) => pair(e.pool_id),
            None => self.dump.get(&e.addr).copied().unwrap_or(DEFAULT_POOL),
        };
        self.segs.insert(e.addr, (e.size, pool));
    }

    /// The ops before a run of segment frees and unmaps (`run`): `x` for
    /// each private pool in use that the run frees, then, when the run is
    /// the program's `empty_cache()` (`user`), `e <pool>` or `e`.
    pub(super) fn release_run(&mut self, run: &[TraceEntry], user: bool) -> Vec<Op> {
        let pools: BTreeSet<PoolPair> = run.iter().map(|e| self.pool_of(e)).collect();
        let mut ops = Vec::new();
        for &pool in &pools {
            if pool != DEFAULT_POOL && self.live.remove(&pool) {
                if self.routed == pool {
                    // The engine ends the routing with the release.
                    self.routed = DEFAULT_POOL;
                }
                ops.push(Op::ReleasePool { pool });
            }
        }
        if user {
            ops.push(match pools.iter().next() {
                Some(&pool) if pools.len() == 1 && pool != DEFAULT_POOL => Op::EmptyPool { pool },
                _ => Op::EmptyCache,
            });
        }
        ops
    }

    /// A `segment_free` entry: its segment is gone.
    pub(super) fn segment_free(&mut self, e: &TraceEntry) {
        self.segs.remove(&e.addr);
    }
}
