//! Free, release and garbage collection (spec 4.3): `free_buffer`,
//! `release_buffer`, `release_buffers`, `release_available_cached_buffers`,
//! `garbage_collect_cached_buffers`, `freeInactiveBuffers`, and the
//! completion handlers Metal runs when a command buffer finishes (here:
//! polled from the backend's events at the start of every operation).

use super::{BufState, State};
use crate::backend::{Backend, BackendError};
use crate::error::AllocError;
use crate::heap::types::*;
use crate::observe::callbacks::EventType;
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::trace::TraceAction;
use crate::stats::StatType;
use crate::store::{BlockId, SegmentId};

impl State {
    /// `free_buffer`: an in-use or pending buffer goes back to its pool's
    /// available buffers; its event (if any) is given back.
    pub fn free_buffer(&mut self, dev: &dyn Backend, b: BlockId) {
        let size = self.size(b);
        let pool = self.pool_of(b);
        let st = StatType::for_pool(pool.is_small());
        let buf = self.bufs.get_mut(&b).expect("a buffer");
        debug_assert!(matches!(buf.state, BufState::InUse | BufState::PendingFree));
        buf.state = BufState::Available;
        buf.shape.clear();
        if let Some(e) = buf.event.take() {
            let _ = dev.destroy_event(e);
        }
        let requested = buf.requested;
        self.insert_available(b);
        self.pools[pool.index()].available_size += size;
        self.current_allocated -= size;
        self.stats.active.decrease(st, 1);
        self.stats.active_bytes.decrease(st, size);
        self.stats.requested_bytes.decrease(st, requested);
        self.trace(TraceAction::FreeCompleted, self.addr(b), requested);
        self.fire(EventType::Freed, self.addr(b), size);
    }

    /// The caller's free (spec 4.3): a non-scalar buffer goes back at once
    /// (or, with `free_waits_for_events`, to the pending set while its
    /// recorded work runs); a scalar waits for its completion handler, on
    /// the default stream's current command buffer: it comes back when that
    /// command buffer is committed ([`commit`](Self::commit)) and its work
    /// completes.
    ///
    /// A device error frees nothing: it comes before any change.
    pub fn free(&mut self, dev: &dyn Backend, b: BlockId) -> Result<(), BackendError> {
        let size = self.size(b);
        let st = StatType::for_pool(self.pool_of(b).is_small());
        let scalar = self.pool_of(b) == PoolKind::Scalar;
        let busy = !scalar && self.free_waits_for_events && self.retain_count(dev, b)? > 1;
        let requested = self.bufs[&b].requested;
        self.trace(TraceAction::FreeRequested, self.addr(b), requested);
        self.stats.allocation.decrease(st, 1);
        self.stats.allocated_bytes.decrease(st, size);
        if scalar || busy {
            let buf = self.bufs.get_mut(&b).expect("a buffer");
            buf.state = BufState::PendingFree;
            buf.awaiting_commit = scalar;
            self.pending.insert(b);
        } else {
            self.free_buffer(dev, b);
        }
        Ok(())
    }

    /// The default stream commits its current command buffer: the freed
    /// scalars whose completion handlers sit on it now wait for the work
    /// enqueued on the default stream so far.
    pub fn commit(&mut self, dev: &dyn Backend) -> Result<(), AllocError> {
        let waiting: Vec<BlockId> = self
            .pending
            .iter()
            .copied()
            .filter(|b| self.bufs[b].awaiting_commit)
            .collect();
        // Every handler's event first: a device error gives back those
        // recorded, and every scalar still waits for the commit.
        let mut events = Vec::with_capacity(waiting.len());
        for _ in &waiting {
            match dev.record_event(crate::backend::StreamId::DEFAULT) {
                Ok(e) => events.push(e),
                Err(e) => {
                    for done in events {
                        let _ = dev.destroy_event(done);
                    }
                    return Err(e.into());
                }
            }
        }
        for (b, e) in waiting.into_iter().zip(events) {
            let buf = self.bufs.get_mut(&b).expect("a buffer");
            buf.handler = Some(e);
            buf.awaiting_commit = false;
        }
        Ok(())
    }

    /// `release_buffer` (spec 4.3): the buffer (available) leaves its heap;
    /// an empty heap is released when `remove_empty_heap`. A buffer still
    /// used by work (retain count > 1) becomes a zombie whose range frees
    /// up when the work completes. True when the heap was released.
    ///
    /// A device error (querying the buffer's work, or freeing its heap's
    /// memory) comes before any change: the buffer stays cached.
    pub fn release_buffer(
        &mut self,
        dev: &dyn Backend,
        b: BlockId,
        remove_empty_heap: bool,
    ) -> Result<bool, AllocError> {
        let retain = self.retain_count(dev, b)?;
        let (addr, size, h, pool) = (self.addr(b), self.size(b), self.heap_of(b), self.pool_of(b));
        // The heap's memory goes back to the device now (the last buffer,
        // idle, and no zombie in the heap): free it first, so a failure
        // leaves the heap and the buffer as they were.
        let frees_heap = remove_empty_heap
            && retain <= 1
            && self.heaps[&h].n_buffers == 1
            && !self
                .store
                .segment_blocks(h)
                .any(|x| x != b && self.store.block(x).allocated());
        if frees_heap {
            self.free_heap_device_memory(dev, h)?;
        }
        let pi = pool.index();
        self.remove_available(b);
        self.pools[pi].allocated_size -= size;
        self.pools[pi].available_size -= size;
        self.pools[pi].n_buffers -= 1;
        self.ptrs.remove(&addr);
        let heap_key = self.heap_key(h);
        self.pools[pi].heaps.remove(&heap_key);
        let buf = self.bufs.get(&b).expect("a buffer").clone();
        if let Some(e) = self.bufs.get_mut(&b).expect("a buffer").event.take() {
            let _ = dev.destroy_event(e);
        }
        if retain > 1 {
            self.bufs.get_mut(&b).expect("a buffer").state = BufState::Zombie;
            self.zombies.insert(b);
        } else {
            self.free_range(b);
        }
        let heap = self.heaps.get_mut(&h).expect("a heap");
        heap.n_buffers -= 1;
        let (heap_id, n_buffers) = (heap.id, heap.n_buffers);
        let available = self.free_range_max(h);
        self.heaps.get_mut(&h).expect("a heap").available = available;
        if self.logs(DebugVerbosity::RELEASES, pool) {
            tracing::info!(
                target: TARGET,
                "Released buffer #{} of size {} from heap #{heap_id} (heap size: {}, use#: {}, retain#: {retain}, gc#: {})",
                buf.id,
                self.fs(size),
                self.fs(available),
                buf.use_count,
                buf.gc_count
            );
        }
        self.fire(EventType::Released, addr, size);
        if remove_empty_heap && n_buffers == 0 {
            self.release_heap(dev, h);
            return Ok(true);
        }
        let key = self.heap_key(h);
        self.pools[pi].heaps.insert(key);
        if retain > 1 {
            self.pools[pi].heaps_pending_update.insert(h);
        }
        Ok(false)
    }

    /// A released buffer's range becomes free space, merged with free
    /// neighbours.
    fn free_range(&mut self, b: BlockId) {
        self.bufs.remove(&b);
        self.store.give_back(b);
        let mut at = b;
        if let Some(prev) = self.store.block(at).prev() {
            if !self.store.block(prev).allocated() {
                self.store.merge(prev, at);
                self.store.free_block_slot(at);
                at = prev;
            }
        }
        if let Some(next) = self.store.block(at).next() {
            if !self.store.block(next).allocated() {
                self.store.merge(at, next);
                self.store.free_block_slot(next);
            }
        }
    }

    /// Release an empty heap: it leaves its pool and the totals; its memory
    /// went back to the device already (`release_buffer` freed it), or goes
    /// back once its zombies complete.
    fn release_heap(&mut self, dev: &dyn Backend, h: SegmentId) {
        let pool = PoolKind::from_pool(self.store.segment(h).pool());
        let size = self.store.segment(h).size();
        self.pools[pool.index()].heaps_pending_update.remove(&h);
        let heap = self.heaps.get_mut(&h).expect("a heap");
        heap.attached = false;
        let heap_id = heap.id;
        self.total_allocated -= size;
        let st = StatType::for_pool(pool.is_small());
        self.stats.segment.decrease(st, 1);
        self.stats.reserved_bytes.decrease(st, size);
        let busy = self
            .store
            .segment_blocks(h)
            .any(|x| self.store.block(x).allocated());
        if !busy {
            self.forget_heap(h);
        }
        if self.debug.contains(DebugVerbosity::RELEASES) {
            tracing::info!(
                target: TARGET,
                "Released heap #{heap_id} of size {} (current allocated: {}, retain#: {})",
                self.fs(size),
                self.fs(self.device_allocated(dev)),
                if busy { 2 } else { 1 }
            );
        }
    }

    /// Give a heap's memory back to the device; nothing else changes (on
    /// success the caller then [forgets](Self::forget_heap) the heap).
    fn free_heap_device_memory(&self, dev: &dyn Backend, h: SegmentId) -> Result<(), AllocError> {
        let s = self.store.segment(h);
        dev.free(crate::backend::DevicePtr(s.addr()), s.size())?;
        Ok(())
    }

    /// Forget a detached, idle heap whose memory went back to the device.
    fn forget_heap(&mut self, h: SegmentId) {
        let (addr, size, head) = {
            let s = self.store.segment(h);
            (s.addr(), s.size(), s.head())
        };
        self.store.free_block_slot(head);
        self.store.remove_segment(h);
        self.heaps.remove(&h);
        self.stats.num_device_free += 1;
        self.trace(TraceAction::SegmentFree, addr, size);
    }

    /// `release_buffers`: every available buffer of one pool (heaps freed as
    /// they empty).
    pub fn release_buffers(&mut self, dev: &dyn Backend, pool: PoolKind) -> Result<(), AllocError> {
        let p = &self.pools[pool.index()];
        if p.buffers.len() == 0 {
            return Ok(());
        }
        if self.debug.contains(DebugVerbosity::RELEASES) {
            tracing::info!(
                target: TARGET,
                "Releasing {} buffers from {pool} pool (total size: {}, #buffers: {})",
                p.buffers.len(),
                self.fs(p.allocated_size),
                p.n_buffers
            );
        }
        let ids: Vec<BlockId> = p.buffers.iter().map(|k| k.2).collect();
        // Every buffer that can be released is, then the first device
        // error is returned (a failed buffer stays cached, unchanged).
        let mut first = Ok(());
        for b in ids {
            if let Err(e) = self.release_buffer(dev, b, true) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Release every heap of every pool that holds no buffer (Reservoir,
    /// when the allocator is dropped: PyTorch's `emptyCache` never visits
    /// such heaps, so without this their memory would never go back). A
    /// heap whose device free fails stays as it was; the first error is
    /// returned.
    pub fn release_empty_heaps(&mut self, dev: &dyn Backend) -> Result<(), AllocError> {
        let empty: Vec<SegmentId> = self
            .heaps
            .iter()
            .filter(|(&h, heap)| {
                heap.attached
                    && heap.n_buffers == 0
                    && !self
                        .store
                        .segment_blocks(h)
                        .any(|x| self.store.block(x).allocated())
            })
            .map(|(&h, _)| h)
            .collect();
        let mut first = Ok(());
        for h in empty {
            if let Err(e) = self.free_heap_device_memory(dev, h) {
                first = first.and(Err(e));
                continue;
            }
            let key = self.heap_key(h);
            let pool = self.store.segment(h).pool().index();
            self.pools[pool].heaps.remove(&key);
            self.release_heap(dev, h);
        }
        first
    }

    /// `release_available_cached_buffers` (spec 4.3): the smallest available
    /// buffer that fits, else the largest ones downward until enough bytes
    /// are released.
    pub fn release_available_cached_buffers(
        &mut self,
        dev: &dyn Backend,
        size: u64,
        pool: PoolKind,
    ) -> Result<bool, AllocError> {
        let p = &self.pools[pool.index()];
        if p.buffers.len() == 0 {
            return Ok(false);
        }
        if let Some(&(_, _, b)) = p.buffers.range((size, 0, BlockId::FIRST)..).next() {
            self.release_buffer(dev, b, true)?;
            return Ok(true);
        }
        let largest_first: Vec<BlockId> = p.buffers.iter().rev().map(|k| k.2).collect();
        let mut released = 0;
        for b in largest_first {
            if released >= size {
                break;
            }
            released += self.size(b);
            self.release_buffer(dev, b, true)?;
        }
        Ok(released >= size)
    }

    /// `garbage_collect_cached_buffers` (spec 4.3): release idle buffers of
    /// at least the mean age until the device is back under the low limit,
    /// stopping as soon as the target is reached.
    pub fn garbage_collect(&mut self, dev: &dyn Backend, pool: PoolKind) -> Result<(), AllocError> {
        let current = self.device_allocated(dev);
        if current < self.low_limit {
            return Ok(());
        }
        let target = current - self.low_limit;
        let ids: Vec<BlockId> = self.pools[pool.index()]
            .buffers
            .iter()
            .map(|k| k.2)
            .collect();
        let mut total_age = 0.0;
        let mut freeable = 0u32;
        for &b in &ids {
            if self.retain_count(dev, b)? <= 1 {
                total_age += self.bufs[&b].gc_count as f64;
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let (mut reclaimed, mut freed) = (0u64, 0u32);
        let mut block_freed = true;
        while reclaimed < target && block_freed && freeable > 0 {
            let threshold = total_age / freeable as f64;
            block_freed = false;
            let ids: Vec<BlockId> = self.pools[pool.index()]
                .buffers
                .iter()
                .map(|k| k.2)
                .collect();
            for b in ids {
                if reclaimed >= target {
                    break;
                }
                let age = self.bufs[&b].gc_count;
                if age as f64 >= threshold && self.retain_count(dev, b)? <= 1 {
                    block_freed = true;
                    reclaimed += self.size(b);
                    total_age -= age as f64;
                    freeable -= 1;
                    freed += 1;
                    let split = self.heaps[&self.heap_of(b)].is_split;
                    self.release_buffer(dev, b, !split)?;
                }
            }
        }
        if self.debug.contains(DebugVerbosity::RELEASES) {
            tracing::info!(
                target: TARGET,
                "Garbage collected {freed} buffers from large {} pool (total reclaimed: {}, #buffers: {})",
                pool.storage_word(),
                self.fs(reclaimed),
                self.pools[pool.index()].buffers.len()
            );
        }
        Ok(())
    }

    /// The completion handlers: pending frees whose work is done go back to
    /// their pools (`freeInactiveBuffers`), zombies whose work is done free
    /// their range (`heaps_pending_update`), detached heaps left idle go
    /// back to the device.
    pub fn poll(&mut self, dev: &dyn Backend) -> Result<(), AllocError> {
        let pending: Vec<BlockId> = self.pending.iter().copied().collect();
        for b in pending {
            let buf = &self.bufs[&b];
            let done = if buf.awaiting_commit {
                false
            } else if let Some(e) = buf.handler {
                // A scalar's completion handler: `free_buffer`, whatever
                // else still uses the buffer.
                let done = dev.query_event(e)?;
                if done {
                    let _ = dev.destroy_event(e);
                    self.bufs.get_mut(&b).expect("a buffer").handler = None;
                }
                done
            } else {
                self.retain_count(dev, b)? <= 1
            };
            if done {
                self.pending.remove(&b);
                self.free_buffer(dev, b);
            }
        }
        let zombies: Vec<BlockId> = self.zombies.iter().copied().collect();
        for b in zombies {
            if self.retain_count(dev, b)? > 1 {
                continue;
            }
            let h = self.heap_of(b);
            // The last range of a released heap: its memory goes back to
            // the device first; a failure leaves the zombie for the next
            // poll.
            let last = !self.heaps[&h].attached
                && !self
                    .store
                    .segment_blocks(h)
                    .any(|x| x != b && self.store.block(x).allocated());
            if last {
                self.free_heap_device_memory(dev, h)?;
            }
            self.zombies.remove(&b);
            self.free_range(b);
            if last {
                self.forget_heap(h);
                continue;
            }
            // A released heap with zombies left keeps its available size
            // exact too (issue 44: it went stale).
            self.update_heap(h);
            if self.heaps[&h].attached {
                let still_busy = self
                    .store
                    .segment_blocks(h)
                    .any(|x| self.zombies.contains(&x));
                if !still_busy {
                    let pool = self.store.segment(h).pool().index();
                    self.pools[pool].heaps_pending_update.remove(&h);
                }
            }
        }
        Ok(())
    }
}
