//! Allocation: PyTorch's `malloc` with its retry chain (spec 1.5),
//! `get_free_block` (spec 1.6), `alloc_block` (spec 1.9) and
//! `alloc_found_block` (spec 1.7).

use super::pools::free_key_of;
use super::request::{AllocParams, MallocError};
use super::rules::{self, ONE_EXABYTE};
use super::state::pools::FreeKey;
use super::state::DeviceState;
use crate::backend::{Backend, DevicePtr, StreamId};
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::trace::TraceAction;
use crate::stats::StatType;
use crate::store::BlockId;

impl DeviceState {
    /// spec 1.5: malloc. Returns the allocated block.
    #[inline]
    pub fn malloc<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        orig_size: u64,
        stream: StreamId,
    ) -> Result<BlockId, MallocError> {
        self.malloc_reporting(backend, orig_size, stream, true)
    }

    /// [`malloc`](Self::malloc) whose out-of-memory failure is
    /// [`MallocError::WouldOom`]: no `num_ooms`, no `oom` trace entry, no
    /// observers. The stream shards try this first, then empty the other
    /// shards' caches and call [`malloc`](Self::malloc) (which reports).
    pub fn malloc_or_would_oom<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        orig_size: u64,
        stream: StreamId,
    ) -> Result<BlockId, MallocError> {
        self.malloc_reporting(backend, orig_size, stream, false)
    }

    #[inline]
    fn malloc_reporting<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        orig_size: u64,
        stream: StreamId,
        report_oom: bool,
    ) -> Result<BlockId, MallocError> {
        // Reservoir: an unknown stream is refused before anything changes
        // (PyTorch is only handed streams c10 made).
        self.check_stream(backend, stream)
            .map_err(MallocError::Other)?;
        if orig_size >= ONE_EXABYTE {
            return Err(self.too_large(backend.device_kind(), orig_size, stream));
        }
        if !self.private.any_capture_underway() {
            self.process_events(backend)?;
        }

        let size = rules::round_size(orig_size, &self.config);
        let pool = self.get_pool(size, stream);
        // The pool serves sizes of its kind (spec 1.4): its stat type
        // follows from the size without reading the pool.
        let small = rules::is_small(size);
        debug_assert_eq!(small, self.pools[pool.index()].is_small());
        let mut p = AllocParams {
            size,
            stream,
            pool,
            stat_type: StatType::for_pool(small),
            block: None,
            own_segment: false,
        };

        if !self.choose_fit(&mut p) {
            self.malloc_after_cache_miss(backend, &mut p, orig_size, report_oom)?;
        }

        // spec 1.7: never split in a `MemPool(no_split=True)` pool.
        // Expandable segments are inactive for a pool with its own allocator
        // and for a block borrowed from a `use_on_oom` pool (torch 2.15).
        let found = p
            .block
            .expect("a fit or a cache miss finds a block or fails");
        let block_size = self.store.block(found).size();
        let split = !self.pools[p.pool.index()].no_split()
            && if self.config.expandable_segments
                && (p.pool != pool || self.pool_allocator(p.pool).is_some())
            {
                rules::should_split_plain(block_size, p.size, small, &self.config)
            } else {
                rules::should_split(block_size, p.size, small, &self.config)
            };
        let id = self.alloc_found_block(&p, found, orig_size, split);
        if p.stream != stream {
            self.record_stream(id, stream);
        }
        let b = self.store.block(id);
        backend.on_block_handed_out(DevicePtr(b.addr()), b.size(), stream);
        Ok(id)
    }

    /// spec 1.5 after the first free-block search failed: the free-memory
    /// callbacks, the policy seam, garbage collection, a new segment, and
    /// the releases and retries before out of memory. Sets `p.block`, or
    /// returns the out-of-memory error. Kept out of line: a warm cache
    /// rarely gets here, and the hot path stays small.
    #[inline(never)]
    fn malloc_after_cache_miss<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &mut AllocParams,
        orig_size: u64,
        report_oom: bool,
    ) -> Result<(), MallocError> {
        let mut found = self.trigger_free_memory_callbacks(backend)? && self.choose_fit(p);
        if !found {
            // The seam of Reservoir-only policies (policy.rs); none in PyTorch mode.
            found = self.policy_on_cache_miss(backend, p)?;
        }

        if !found {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks(backend)?;
            }
            found = self.alloc_block(backend, p, false)?;
            // torch 2.8+: the free blocks of `use_on_oom` pools before
            // any cached memory is released (none in most programs).
            let borrowed = !found && self.try_mempool_fallback(p);
            found = found
                || borrowed
                || (self.release_available_cached_blocks(backend, p)?
                    && self.alloc_block(backend, p, false)?)
                || (!self.private.any_capture_underway()
                    && self.release_cached_blocks(backend, MempoolId::DEFAULT)?
                    && self.alloc_block(backend, p, true)?);
            // The block comes from the device (for callbacks and debug output).
            self.obs.set_fresh(found && !borrowed);
        }

        if !found {
            if !report_oom {
                return Err(MallocError::WouldOom);
            }
            return Err(MallocError::Oom(Box::new(
                self.out_of_memory(backend, p, orig_size)?,
            )));
        }
        Ok(())
    }

    /// spec 1.6: PyTorch's `get_free_block`: best fit keyed by (stream,
    /// size, address), an expandable block counted at the size it can grow
    /// to, and the oversize rules. Reached through the
    /// [`choose_fit`](Self::choose_fit) hook.
    #[inline]
    pub(super) fn get_free_block(&mut self, p: &mut AllocParams) -> bool {
        let gc = self.gc_enabled();
        let pool = &mut self.pools[p.pool.index()];
        let Some((mut it, slot)) = pool.lower_bound(p.stream, p.size, gc) else {
            return false;
        };
        if self.store.block(it.id).expandable() {
            match self.expandable_best_fit(it, p, false) {
                Some(k) => it = k,
                None => return false,
            }
        }
        // Do not return an oversized block for a large request, and round
        // an oversize request up only within a limit.
        if rules::oversize_misfit(p.size, it.size, &self.config) {
            return false;
        }
        let removed = self.pools[p.pool.index()].erase(slot, &it);
        debug_assert!(removed, "the block is in its pool");
        p.block = Some(it.id);
        true
    }

    /// spec 1.6, the expandable part of `get_free_block`: from `it`, the
    /// first fit on `p`'s stream and a block of an expandable segment, the
    /// best fit by the size a block can grow to (a block followed by
    /// unmapped space counts as that much larger); with expandable segments
    /// turned off, the first block after them. `None`: nothing on the stream
    /// fits. With `keeps_whole` (the `reservoir` policy's fit, never PyTorch
    /// mode's) the scan stops at a block of a whole segment.
    #[inline]
    pub(super) fn expandable_best_fit(
        &self,
        mut it: FreeKey,
        p: &AllocParams,
        keeps_whole: bool,
    ) -> Option<FreeKey> {
        // The blocks after `it` (the first one is `it`).
        let mut next = self.pools[p.pool.index()].from(&it);
        next.next();
        if !self.config.expandable_segments {
            // Expandable segments were turned off: skip their blocks.
            return next
                .find(|k| !self.store.block(k.id).expandable() || k.stream != p.stream)
                .filter(|k| k.stream == p.stream);
        }
        let store = &self.store;
        let expandable_size = |k: &FreeKey| {
            let b = store.block(k.id);
            b.size()
                + match b.next() {
                    Some(next) if !store.block(next).mapped() => store.block(next).size(),
                    _ => 0,
                }
        };
        for next in next {
            if !store.block(it.id).expandable()
                || next.stream != p.stream
                || (keeps_whole && !store.block(next.id).expandable())
                || expandable_size(&next) >= expandable_size(&it)
            {
                break;
            }
            it = next;
        }
        Some(it)
    }

    /// spec 1.5 step 4: run the free-memory callbacks; true if any freed memory.
    pub(super) fn trigger_free_memory_callbacks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<bool, MallocError> {
        if !self.obs.has_free_memory_callbacks() {
            return Ok(false);
        }
        let to_free = self.obs.run_free_memory_callbacks();
        let mut freed = false;
        for ptr in to_free {
            match self.free_ptr(backend, ptr) {
                Ok(()) => freed = true,
                Err(AllocError::InvalidPointer { .. }) => {}
                Err(e) => return Err(MallocError::Other(e)),
            }
        }
        Ok(freed)
    }

    /// spec 1.9: ask the driver for a new segment of
    /// [`allocation_size`](rules::allocation_size) bytes.
    pub(super) fn alloc_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &mut AllocParams,
        is_retry: bool,
    ) -> Result<bool, MallocError> {
        if is_retry {
            self.acct.alloc_retry();
        }
        let size = p.alloc_size(&self.config);
        if self.acct.passes_limit(size) {
            return Ok(false);
        }
        // `MemPool(allocator=...)`: the pool's segments come from its own
        // allocator, never expandable (torch: "expandable segments are only
        // active on the default pool", i.e. off in a pool with an allocator).
        let own = self.pool_allocator(p.pool);
        if self.config.expandable_segments && !p.own_segment && own.is_none() {
            return match self.try_allocate_expandable_block(backend, p.stream, p.pool, p.size)? {
                Some(id) => {
                    p.block = Some(id);
                    self.count_private_malloc(p.pool, true);
                    Ok(true)
                }
                None => Ok(false),
            };
        }
        let ptr = match own {
            // A null from the pool's allocator is out of memory (torch 2.15).
            Some(a) => match a.malloc(size, self.device, p.stream) {
                Ok(ptr) => ptr,
                Err(AllocError::Backend(e)) if e.is_retryable() => return Ok(false),
                Err(e) => return Err(MallocError::Other(e)),
            },
            None => match backend.allocate(size, p.stream) {
                Ok(ptr) => ptr,
                Err(e) if e.is_retryable() => return Ok(false),
                Err(e) => return Err(e.into()),
            },
        };
        self.count_private_malloc(p.pool, true);
        let (_, id) = (self.store).new_segment(ptr.0, size, p.stream, p.pool, None, true);
        p.block = Some(id);
        self.note_segment_allocated(size, p.pool);
        self.record_trace(
            TraceAction::SegmentAlloc,
            ptr.0,
            size,
            p.stream,
            p.pool,
            Some(id),
        );
        Ok(true)
    }

    /// spec 1.15: hand out a free block (already out of its pool) as
    /// `setSegmentStateToCheckpoint` does: requested size = block size.
    pub(crate) fn alloc_found_block_for_restore(
        &mut self,
        block: BlockId,
        size: u64,
        stream: StreamId,
        split: bool,
    ) -> BlockId {
        let pool = self.store.block(block).pool();
        let p = AllocParams {
            size,
            stream,
            pool,
            stat_type: self.stat_type(pool),
            block: Some(block),
            own_segment: false,
        };
        self.alloc_found_block(&p, block, size, split)
    }

    /// spec 1.7: hand out the found block `id` (`p.block`), splitting off
    /// the remainder. Inlined into malloc: one call layer less on every
    /// hand-out.
    #[inline(always)]
    pub(super) fn alloc_found_block(
        &mut self,
        p: &AllocParams,
        mut id: BlockId,
        orig_size: u64,
        split: bool,
    ) -> BlockId {
        let st = p.stat_type;
        let (already_split, expandable) = {
            let b = self.store.block(id);
            (b.is_split(), b.expandable())
        };
        if split {
            let remaining = id;
            id = self.store.split_front(remaining, p.size, p.stream);
            // One read of the remainder: its size, pool and key.
            let (remaining_size, pool, key) = {
                let r = self.store.block(remaining);
                (r.size(), r.pool(), free_key_of(r, remaining))
            };
            self.insert_key_into_pool(pool, key);
            if expandable {
                // Expandable blocks are not counted in inactive_split (spec 1.11).
            } else if already_split {
                // An already-split inactive block shrinks by `size` bytes.
                self.acct.inactive_split_changed(st, 0, -(p.size as i64));
            } else {
                // A previously unsplit block leaves a new inactive split remainder.
                self.acct
                    .inactive_split_changed(st, 1, remaining_size as i64);
            }
        } else if already_split && !expandable {
            // An already-split block becomes active whole.
            let size = self.store.block(id).size();
            self.acct.inactive_split_changed(st, -1, -(size as i64));
        }

        let b = self.store.hand_out(id, orig_size);
        let (addr, size, stream) = (b.addr(), b.size(), b.stream());
        self.record_trace(
            TraceAction::Alloc,
            addr,
            orig_size,
            stream,
            p.pool,
            Some(id),
        );
        self.note_allocated(id, addr, size, orig_size, st);
        id
    }
}
