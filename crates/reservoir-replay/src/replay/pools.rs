//! The private-pool ops of the replay engine (`p`, `x`, `e <pool>`): a
//! recorded snapshot's `torch.cuda.MemPool` and CUDA-graph pools.
//!
//! A trace names the pool each allocation goes to (`p <pool>` before the
//! first allocation of a run in that pool, `p 0 0` back to the default
//! pool); the engine opens and closes the pool's routing around each run,
//! as `torch.cuda.use_mem_pool` does. The first run creates the pool with
//! one use, its owner's (`MemPool()`); each later run adds a use and drops
//! it when it ends (`use_mem_pool` holds one while open). `x <pool>`, the
//! owner gone, drops the owner's use: the pool's cached memory goes back
//! to the device at the next `e` (any `e`, or `e <pool>`: `emptyCache` of
//! that pool, which `~MemPool` calls).

use super::{Replay, ReplayError, ReplayTarget};
use crate::oracle_trace::PoolPair;
use reservoir::ids::MempoolId;

/// The pool an allocation is being routed to, and whether its routing
/// holds a use of its own (every run but the one that created the pool).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PoolRouting {
    current: Option<(MempoolId, bool)>,
}

fn id((a, b): PoolPair) -> MempoolId {
    MempoolId(a, b)
}

impl<T: ReplayTarget> Replay<'_, T> {
    /// Stop routing allocations to the current private pool, if any.
    fn end_routing(&mut self, i: usize) -> Result<(), ReplayError> {
        if let Some((pool, extra_use)) = self.routing.current.take() {
            self.alloc
                .end_allocate_to_pool(pool)
                .map_err(|e| self.alloc_error(i, e))?;
            if extra_use {
                self.alloc
                    .release_pool(pool)
                    .map_err(|e| self.alloc_error(i, e))?;
            }
        }
        Ok(())
    }

    /// `p <pool>` (op `i`): allocations from now on go to `pool`.
    pub(super) fn op_use_pool(&mut self, i: usize, pool: PoolPair) -> Result<(), ReplayError> {
        let pool = id(pool);
        if self.routing.current.is_some_and(|(p, _)| p == pool) {
            return Ok(());
        }
        self.end_routing(i)?;
        if pool.is_default() {
            return Ok(());
        }
        let extra_use = self.pools.contains(&pool);
        self.alloc
            .begin_allocate_to_pool(pool)
            .map_err(|e| self.alloc_error(i, e))?;
        self.pools.insert(pool);
        self.routing.current = Some((pool, extra_use));
        Ok(())
    }

    /// `x <pool>` (op `i`): the pool's owner is gone (its routing, if open,
    /// ends first).
    pub(super) fn op_release_pool(&mut self, i: usize, pool: PoolPair) -> Result<(), ReplayError> {
        let pool = id(pool);
        if pool.is_default() {
            return Err(self.trace_error(i, "the default pool (0, 0) cannot be released".into()));
        }
        if self.routing.current.is_some_and(|(p, _)| p == pool) {
            self.end_routing(i)?;
        }
        if !self.pools.remove(&pool) {
            return Err(self.trace_error(
                i,
                format!(
                    "release of private pool ({}, {}), which is not in use",
                    pool.0, pool.1
                ),
            ));
        }
        self.alloc
            .release_pool(pool)
            .map_err(|e| self.alloc_error(i, e))
    }

    /// `e <pool>` (op `i`): `emptyCache(pool)`.
    pub(super) fn op_empty_pool(&mut self, i: usize, pool: PoolPair) -> Result<(), ReplayError> {
        let t0 = self.timer.start();
        let r = self.alloc.empty_cache_pool(id(pool));
        self.timer.stop(t0);
        r.map_err(|e| self.alloc_error(i, e))?;
        self.observe(i);
        Ok(())
    }
}
