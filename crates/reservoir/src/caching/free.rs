//! Freeing: PyTorch's `free`, `free_block` and `try_merge_blocks`
//! (spec 1.10), and `recordStream`.

use super::pools::free_key_of;
use super::state::DeviceState;
use crate::backend::{Backend, BackendError, DevicePtr, StreamId};
use crate::error::AllocError;
use crate::observe::trace::TraceAction;
use crate::store::BlockId;

impl DeviceState {
    /// spec 1.10: free the block allocated at `ptr`, taking it out of the
    /// pointer map. A pointer not in the map is
    /// [`AllocError::InvalidPointer`]; a free that fails
    /// ([`AllocError::FreeFailed`]) leaves the pointer in the map and every
    /// block and counter as it was.
    #[inline]
    pub fn free_ptr<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        ptr: DevicePtr,
    ) -> Result<(), AllocError> {
        let Some(id) = self.allocated.remove(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        if let Err(source) = self.free(backend, id) {
            return Err(self.free_failed(ptr, id, source));
        }
        Ok(())
    }

    /// [`free_ptr`](Self::free_ptr) once the device has been synchronised
    /// after the pointer's last use: the streams that used the block
    /// (`record_stream`) are done with it, so it is freed without recording
    /// their events, and cannot fail but as [`AllocError::InvalidPointer`].
    /// While a pool allocation (capture) is underway the events are
    /// deferred as in any free, which records none either.
    #[cold]
    #[inline(never)]
    pub fn free_ptr_after_sync<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        ptr: DevicePtr,
    ) -> Result<(), AllocError> {
        let Some(&id) = self.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        if !self.private.any_capture_underway() {
            self.store.forget_uses(id);
            self.events.forget_capture_uses(id);
        }
        self.free_ptr(backend, ptr)
    }

    /// A free that recorded no event: the pointer goes back into the map.
    #[cold]
    #[inline(never)]
    fn free_failed(&mut self, ptr: DevicePtr, id: BlockId, source: BackendError) -> AllocError {
        self.allocated.insert(ptr.0, id);
        AllocError::FreeFailed { ptr, source }
    }

    /// spec 1.10: free a block the caller no longer uses. The block has
    /// already been removed from the pointer map.
    ///
    /// Either the free completes, or it fails before changing anything: a
    /// block used by other streams (`record_stream`) records its events
    /// first, and if the device cannot record one, the events recorded are
    /// given back and the block stays allocated with its stream uses (PyTorch
    /// marks the block free before `insert_events` throws, and loses it).
    #[inline]
    pub fn free<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        if !self.store.block(id).stream_uses().is_empty() {
            return self.free_used_by_other_streams(backend, id);
        }
        self.mark_freed(backend, id);
        self.free_block(id);
        Ok(())
    }

    /// [`free`](Self::free) of a block that other streams used: record an
    /// event on each (nothing changes if one cannot be recorded), or defer
    /// them while allocating to a pool (spec 1.10).
    #[inline(never)]
    fn free_used_by_other_streams<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        if !self.private.any_capture_underway() {
            let events = self.record_block_events(backend, id)?;
            self.mark_freed(backend, id);
            self.queue_block_events(id, events);
        } else {
            // No events while allocating to a pool: record them once every
            // pool allocation has ended.
            self.mark_freed(backend, id);
            self.events.defer(id);
        }
        Ok(())
    }

    /// The part of every free that cannot fail: the block is no longer
    /// allocated (counters, the backend's notification, the trace).
    #[inline(always)]
    fn mark_freed<B: Backend + ?Sized>(&mut self, backend: &B, id: BlockId) {
        let b = self.store.give_back(id);
        let (addr, size, requested, stream, pool) =
            (b.addr(), b.size(), b.requested_size(), b.stream(), b.pool());
        let st = self.stat_type(pool);
        backend.on_block_freed(DevicePtr(addr), size, stream);
        self.note_freed(size, st);
        self.record_trace(
            TraceAction::FreeRequested,
            addr,
            requested,
            stream,
            pool,
            Some(id),
        );
    }

    /// spec 1.10: return a block to its pool, merging free neighbours.
    #[inline(always)]
    pub(super) fn free_block(&mut self, id: BlockId) {
        let (addr, requested, stream, original_size, prev, next, pool) = {
            let b = self.store.block(id);
            debug_assert!(!b.allocated() && b.event_count() == 0 && b.stream_uses().is_empty());
            (
                b.addr(),
                b.requested_size(),
                b.stream(),
                b.size(),
                b.prev(),
                b.next(),
                b.pool(),
            )
        };
        self.record_trace(
            TraceAction::FreeCompleted,
            addr,
            requested,
            stream,
            pool,
            Some(id),
        );
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [prev, next] {
            if candidate.is_none() {
                continue;
            }
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        // One read of the merged block: its key, split state and kind.
        let (key, split, size, expandable) = {
            let b = self.store.block(id);
            (free_key_of(b, id), b.is_split(), b.size(), b.expandable())
        };
        self.insert_key_into_pool(pool, key);
        if split {
            net_blocks += 1;
            net_bytes += size as i64;
        }
        let st = self.stat_type(pool);
        if !expandable {
            self.acct.inactive_split_changed(st, net_blocks, net_bytes);
        }
        self.acct.block_returned(st, original_size, requested);
    }

    /// PyTorch's `try_merge_blocks`: absorb `src` into `dst` if it is free.
    #[inline(always)]
    pub(super) fn try_merge_blocks(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else {
            return 0;
        };
        // One read of each block.
        let (mapped, src_before, key, pool) = {
            let s = self.store.block(src);
            if s.allocated() || s.event_count() > 0 || !s.stream_uses().is_empty() {
                return 0;
            }
            let d = self.store.block(dst);
            if s.mapped() != d.mapped() {
                return 0;
            }
            (
                s.mapped(),
                d.prev() == Some(src),
                free_key_of(s, src),
                s.pool(),
            )
        };
        if mapped {
            let removed = self.pools[pool.index()].remove(&key);
            debug_assert!(removed, "block missing from its pool");
        } else {
            self.remove_from_unmapped(src);
        }
        let size = self.store.merge(dst, src);
        if src_before && self.obs.is_active() {
            // PyTorch moves the segment's stack to the new head.
            self.move_segment_context(src, dst);
        }
        self.release_block_slot(src);
        size
    }

    #[inline]
    pub(super) fn release_block_slot(&mut self, id: BlockId) {
        self.events.forget_capture_uses(id);
        self.store.free_block_slot(id);
    }

    /// spec 1.10: `record_stream`.
    pub fn record_stream(&mut self, id: BlockId, stream: StreamId) {
        if stream == self.store.block(id).stream() {
            return;
        }
        self.store.record_use(id, stream);
        if self.private.any_capture_underway() {
            self.events.note_capture_use(id, stream);
        }
    }
}
