//! Giving memory back: PyTorch's `garbage_collect_cached_blocks` (spec 1.8),
//! `release_available_cached_blocks`, `release_cached_blocks`,
//! `release_blocks` and `release_block` (spec 1.9).

use super::request::{AllocParams, MallocError};
use super::state::pools::{FreeKey, POOL_LARGE, POOL_SMALL};
use super::state::DeviceState;
use crate::backend::{Backend, BackendError, DevicePtr};
use crate::ids::MempoolId;
use crate::observe::trace::TraceAction;
use crate::store::{Block, BlockId, PoolId};

impl DeviceState {
    #[inline]
    pub(super) fn gc_enabled(&self) -> bool {
        self.acct.allowed_memory_maximum().is_some()
            && self.config.garbage_collection_threshold > 0.0
    }

    /// spec 1.8: free old unsplit large-pool blocks until reserved memory is
    /// back under the threshold.
    ///
    /// Unlike `release_cached_blocks`, this and
    /// `release_available_cached_blocks` stop at the first driver error, as
    /// PyTorch does: they make room for one request, which then fails with
    /// that error; what they did not release stays cached, consistent, and
    /// `empty_cache` releases it.
    pub(super) fn garbage_collect_cached_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), MallocError> {
        let Some(allowed) = self.acct.allowed_memory_maximum() else {
            return Ok(());
        };
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.acct.total_allocated_memory() <= gc_threshold {
            return Ok(());
        }
        let target = self.acct.total_allocated_memory() - gc_threshold;
        let mut reclaimed = 0u64;
        let clock = self.pools[POOL_LARGE.index()].gc_clock();
        let age = |b: &Block| (clock - b.gc_count_base()) as i32 as i64 as u64;
        let mut total_age: u64 = 0;
        let mut freeable: u64 = 0;
        for k in self.pools[POOL_LARGE.index()].iter() {
            let b = self.store.block(k.id);
            if !b.is_split() {
                total_age += age(b);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let threshold = total_age as f64 / freeable as f64;
            block_freed = false;
            let candidates: Vec<BlockId> = self.pools[POOL_LARGE.index()]
                .iter()
                .map(|k| k.id)
                .filter(|&id| {
                    let b = self.store.block(id);
                    !b.is_split() && !b.expandable() && age(b) as f64 >= threshold
                })
                .collect();
            for id in candidates {
                block_freed = true;
                let b = self.store.block(id);
                reclaimed += b.size();
                total_age -= age(b);
                freeable -= 1;
                self.release_block(backend, id)?;
            }
        }
        Ok(())
    }

    /// spec 1.9: with max_split_size set, free one cached oversize block big
    /// enough for the request, or several starting from the largest.
    pub(super) fn release_available_cached_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &AllocParams,
    ) -> Result<bool, MallocError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = p.size.max(max_split);
        let pool = &self.pools[p.pool.index()];
        let search = FreeKey::search(p.stream, key_size);
        // Blocks at or above max_split_size are never split while the setting
        // is unchanged; one split by an earlier setting stays (PyTorch would
        // hand its interior address to cudaFree).
        if let Some(hit) = pool.from(&search).next() {
            let b = self.store.block(hit.id);
            if hit.stream == p.stream && !b.is_split() && !b.expandable() {
                self.release_block(backend, hit.id)?;
                return Ok(true);
            }
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let mut released = 0u64;
        let mut victims = Vec::new();
        for k in pool.before(&search) {
            if released >= key_size || k.size < max_split || k.stream != p.stream {
                break;
            }
            if self.store.block(k.id).is_split() || self.store.block(k.id).expandable() {
                continue;
            }
            victims.push(k.id);
            released += k.size;
        }
        for id in victims {
            self.release_block(backend, id)?;
        }
        Ok(released >= key_size)
    }

    /// spec 1.9: `release_cached_blocks` (empty_cache and the last-resort
    /// flush). The default pool id releases the global pools and every
    /// freeable private pool; a private pool's id releases only that pool
    /// once it is freeable (torch 2.9+).
    ///
    /// A driver error does not stop it: every segment that can be released
    /// is, and the first error is returned (PyTorch's `C10_CUDA_CHECK`
    /// throws at the first failed `cudaFree` and leaves every later segment
    /// cached; without an error both release the same segments in the same
    /// order). What failed stays cached, whole and consistent, for the next
    /// call.
    pub fn release_cached_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        pool: MempoolId,
    ) -> Result<bool, MallocError> {
        if pool.is_default() {
            let mut first = self.release_cached_large_blocks(backend);
            keep_first(
                &mut first,
                self.release_cached_small_and_private_blocks(backend),
            );
            first?;
        } else {
            self.release_private_pools(backend, pool)?;
        }
        Ok(true)
    }

    /// Release freeable private pools: all of them for the default id, or
    /// the one named (after waiting for its events).
    fn release_private_pools<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        pool: MempoolId,
    ) -> Result<(), MallocError> {
        // In `graph_pools_freeable`'s hash-map order; erasing the visited entry
        // (below) does not change the order of the rest.
        let freeable: Vec<MempoolId> = self.private.freeable();
        let mut first = Ok(());
        for id in freeable {
            if !pool.is_default() {
                if id != pool {
                    continue;
                }
                keep_first(
                    &mut first,
                    self.synchronize_and_free_events(backend, Some(id)),
                );
            }
            let (small, large) = {
                let p = self.private.get(id).expect("a freeable pool exists");
                (p.small(), p.large())
            };
            keep_first(&mut first, self.release_blocks(backend, small));
            keep_first(&mut first, self.release_blocks(backend, large));
            // PyTorch erases the pool when its driver allocation count is 0.
            // With expandable segments that count (one up per allocation that
            // mapped pages, one down per unmap) can reach 0 while segments
            // remain, and PyTorch would leave blocks pointing at a deleted
            // pool: keep the pool until it owns nothing.
            if self
                .private
                .get(id)
                .expect("not erased yet")
                .cuda_malloc_count()
                == 0
                && !self.owns_segments(small, large)
            {
                self.erase_private_pool(id);
            }
        }
        Ok(first?)
    }

    /// The first half of `release_cached_blocks(DEFAULT)`: wait for every
    /// outstanding event, then free the large pool's whole free segments.
    /// [`StreamShards`](super::StreamShards) runs it on every shard before
    /// the second half, as PyTorch's one large pool keyed by stream comes
    /// before its small pool.
    pub fn release_cached_large_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), MallocError> {
        if !self.private.any_capture_underway() {
            let mut first = self.synchronize_and_free_events(backend, None);
            keep_first(&mut first, self.release_blocks(backend, POOL_LARGE));
            first?;
        }
        Ok(())
    }

    /// The second half of `release_cached_blocks(DEFAULT)`: the small
    /// pool's whole free segments, then every freeable private pool's.
    pub fn release_cached_small_and_private_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), MallocError> {
        let mut first = Ok(());
        if !self.private.any_capture_underway() {
            keep_first(
                &mut first,
                self.release_blocks(backend, POOL_SMALL).map_err(Into::into),
            );
        }
        keep_first(
            &mut first,
            self.release_private_pools(backend, MempoolId::DEFAULT),
        );
        first
    }

    /// Free every whole (unsplit) free segment of a pool, in pool order.
    /// Expandable blocks give back their fully free pages instead, after the
    /// whole segments (spec 1.11). Goes on after a driver error (each
    /// segment's release or unmap changes nothing when it fails) and returns
    /// the first.
    pub(super) fn release_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        pool: PoolId,
    ) -> Result<(), BackendError> {
        let mut victims = Vec::new();
        let mut to_unmap = Vec::new();
        for k in self.pools[pool.index()].iter() {
            let b = self.store.block(k.id);
            if b.expandable() {
                to_unmap.push(k.id);
            } else if !b.is_split() {
                victims.push(k.id);
            }
        }
        let mut first = Ok(());
        for id in victims {
            keep_first(&mut first, self.release_block(backend, id));
        }
        for id in to_unmap {
            match self.unmap_block(backend, id) {
                Ok(()) if !self.store.block(id).is_split() => {
                    keep_first(&mut first, self.release_expandable_segment(backend, id));
                }
                Ok(()) => {}
                Err(e) => keep_first(&mut first, Err(e)),
            }
        }
        first
    }

    /// spec 1.9: give a whole free segment back to the driver.
    pub(super) fn release_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let (addr, size, stream, pool, seg) = {
            let b = self.store.block(id);
            debug_assert!(!b.is_split() && !b.allocated());
            (b.addr(), b.size(), b.stream(), b.pool(), b.segment())
        };
        match self.pool_allocator(pool) {
            // `MemPool(allocator=...)`: the segment goes back to the pool's allocator.
            Some(a) => a
                .raw_delete(DevicePtr(addr))
                .map_err(|e| BackendError::InvalidValue(format!("{}: {e}", DevicePtr(addr))))?,
            None => backend.free(DevicePtr(addr), size)?,
        }
        self.acct.device_free();
        self.record_trace(TraceAction::SegmentFree, addr, size, stream, pool, Some(id));
        self.count_private_malloc(pool, false);
        self.note_segment_released(size, pool);
        self.remove_from_pool(id);
        self.release_block_slot(id);
        self.store.remove_segment(seg);
        Ok(())
    }
}

/// In a loop that goes on after an error: keep the first error.
#[inline]
pub(super) fn keep_first<E>(first: &mut Result<(), E>, r: Result<(), E>) {
    if let (Ok(()), Err(e)) = (&*first, r) {
        *first = Err(e);
    }
}
