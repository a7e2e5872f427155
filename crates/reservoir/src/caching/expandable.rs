//! Expandable segments (spec 1.11): PyTorch's `ExpandableSegment` and
//! `find_expandable_block`, `map_block`, `try_allocate_expandable_block`,
//! `unmap_block` and releasing a fully unmapped segment.

use super::request::MallocError;
use super::state::DeviceState;
use crate::backend::{Backend, BackendError, StreamId, VirtualMemory};
use crate::observe::trace::TraceAction;
use crate::store::{BlockId, Expandable, PoolId, SegmentId};

/// The virtual-memory capability of a backend that holds an expandable
/// segment (`find_expandable_block` checked it when creating the segment).
fn vm_of<B: Backend + ?Sized>(backend: &B) -> &dyn VirtualMemory {
    backend
        .as_virtual_memory()
        .expect("checked when the segment was created")
}

/// A run of free and unmapped blocks of an expandable segment, up to the
/// block that completes a request ([`DeviceState::run_bytes`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct RunBytes {
    /// Its bytes.
    pub bytes: u64,
    /// The unmapped bytes serving the request from it maps.
    pub unmapped: u64,
    /// Whether its last block is mapped (what the request leaves of it
    /// stays free and mapped).
    pub ends_mapped: bool,
}

impl DeviceState {
    /// The mapping state of the expandable segment `seg`.
    fn mapping(&self, seg: SegmentId) -> &Expandable {
        (self.store.segment(seg).expandable()).expect("an expandable segment")
    }

    /// The mapping state of the expandable segment `seg`, to update.
    fn mapping_mut(&mut self, seg: SegmentId) -> &mut Expandable {
        (self.store.mapping_mut(seg)).expect("an expandable segment")
    }

    /// Free for reuse: not allocated and not waiting for other streams.
    #[inline]
    pub(super) fn allocatable(&self, id: BlockId) -> bool {
        let b = self.store.block(id);
        !b.allocated() && b.event_count() == 0 && b.stream_uses().is_empty()
    }

    /// Where a run of free and unmapped blocks through the unmapped block
    /// `unmapped` starts: the free block before it, if any, else itself.
    pub(super) fn run_start(&self, unmapped: BlockId) -> BlockId {
        match self.store.block(unmapped).prev() {
            Some(prev) if self.allocatable(prev) => prev,
            _ => unmapped,
        }
    }

    /// The run of free and unmapped blocks from `start`, up to the first
    /// block that reaches `size` ([`RunBytes`]).
    pub(super) fn run_bytes(&self, start: BlockId, size: u64) -> RunBytes {
        let mut run = RunBytes {
            bytes: 0,
            unmapped: 0,
            ends_mapped: false,
        };
        let mut b = Some(start);
        while let Some(id) = b {
            if run.bytes >= size || !self.allocatable(id) {
                break;
            }
            let block = self.store.block(id);
            if !block.mapped() {
                run.unmapped += block.size().min(size - run.bytes);
            }
            run.bytes += block.size();
            run.ends_mapped = block.mapped();
            b = block.next();
        }
        run
    }

    /// spec 1.11 `find_expandable_block`: the lowest address of an expandable
    /// segment of this stream where free and unmapped blocks add up to
    /// `size`, or a new expandable segment.
    pub(super) fn find_expandable_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: PoolId,
        size: u64,
    ) -> Result<BlockId, MallocError> {
        if self.maps_fewest_pages() {
            if let Some(run) = self.fewest_pages_run(stream, pool, size) {
                return Ok(run.start);
            }
        }
        for k in self.pools[pool.index()].unmapped_of(stream) {
            let c = self.run_start(k.id);
            if self.run_bytes(c, size).bytes >= size {
                return Ok(c);
            }
        }
        let vm = backend
            .as_virtual_memory()
            .ok_or(BackendError::Unsupported {
                backend: backend.name(),
                what: "virtual memory (needed by expandable segments)",
            })?;
        let page_size = self.expandable_page_size(self.pools[pool.index()].is_small());
        // Address space beyond the device's size, so unmapped holes early in
        // the segment can be refilled at its end.
        let total = backend.mem_info()?.total;
        let space = self.expandable_address_space(total, page_size);
        let reservation = vm.reserve(space)?;
        let (_, id) = self.store.new_segment(
            reservation.base.0,
            reservation.size,
            stream,
            pool,
            Some(Box::new(Expandable::new(reservation, page_size))),
            false,
        );
        self.insert_into_unmapped(id);
        Ok(id)
    }

    /// spec 1.11 `map_block`: map the pages under the first `size` bytes of
    /// an unmapped block; the rest stays unmapped. False if the device is full.
    pub(super) fn map_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
        size: u64,
    ) -> Result<bool, MallocError> {
        let (addr, block_size, seg, stream, pool) = {
            let b = self.store.block(id);
            debug_assert!(!b.mapped() && size <= b.size());
            (b.addr(), b.size(), b.segment(), b.stream(), b.pool())
        };
        let mapped = match self.mapping_mut(seg).map(vm_of(backend), addr, size) {
            // Nothing to map.
            Ok(range) if range.size == 0 => return Ok(false),
            Ok(range) => range.size,
            // The device is full.
            Err(e) if e.is_retryable() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        self.remove_from_unmapped(id);
        self.store.map(id);
        if mapped < block_size {
            let rest = self.store.split_back(id, mapped, false);
            self.insert_into_unmapped(rest);
        }
        let (prev, next) = (self.store.block(id).prev(), self.store.block(id).next());
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_pool(id);
        let st = self.stat_type(pool);
        let owner = self.owner(pool);
        self.acct.pages_mapped(st, owner, mapped, 1);
        self.record_trace(
            TraceAction::SegmentMap,
            addr,
            mapped,
            stream,
            pool,
            Some(id),
        );
        Ok(true)
    }

    /// spec 1.11 `try_allocate_expandable_block`: grow (or refill) an
    /// expandable segment until one free block holds `size` bytes.
    pub(super) fn try_allocate_expandable_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: PoolId,
        size: u64,
    ) -> Result<Option<BlockId>, MallocError> {
        let segments_before = self.store.segments_made();
        let mut candidate = self.find_expandable_block(backend, stream, pool, size)?;
        let created = self.store.segments_made() != segments_before;
        // A new segment whose whole address space is smaller than the request.
        let oversize = created && self.store.block(candidate).size() < size;
        let rules = self.config.torch_release.rules();
        if oversize && rules.expandable_oversize_released_unmapped {
            // The request is larger than a whole segment's address space:
            // no map is tried (torch 2.15 logs reserve + addr_free only).
            self.release_expandable_segment(backend, candidate)?;
            return Ok(None);
        }
        if !self.store.block(candidate).mapped() {
            let len = self.store.block(candidate).size().min(size);
            if !self.map_block(backend, candidate, len)? {
                // A segment created for this request that could not be mapped
                // stays (fully unmapped, in `unmapped`) for later requests:
                // torch 2.15 keeps it through the OOM flush, which only
                // releases segments it unmaps (FINDINGS.md 11).
                return Ok(None);
            }
        }
        if oversize && self.store.block(candidate).size() < size {
            // Before torch 2.15 the whole segment is mapped first
            // (ReleaseRules::expandable_oversize_released_unmapped); it is
            // smaller than the request all the same.
            return Ok(None);
        }
        while self.store.block(candidate).size() < size {
            let remaining = size - self.store.block(candidate).size();
            let next = (self.store.block(candidate).next())
                .expect("the blocks found reach the size asked for");
            let len = remaining.min(self.store.block(next).size());
            if !self.map_block(backend, next, len)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.remove_from_pool(candidate);
        Ok(Some(candidate))
    }

    /// spec 1.11 `unmap_block`: give back the pages entirely inside a free
    /// expandable block, splitting off the free bytes before and after.
    pub(super) fn unmap_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let b = self.store.block(id);
        self.unmap_block_range(backend, id, b.addr(), b.addr() + b.size())
    }

    /// [`unmap_block`](Self::unmap_block) limited to the pages entirely
    /// inside `[from, to)`, a range of the free block `id`: the free bytes
    /// of the block before and after them stay mapped.
    pub(super) fn unmap_block_range<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
        from: u64,
        to: u64,
    ) -> Result<(), BackendError> {
        let (addr, size, seg, stream, pool) = {
            let b = self.store.block(id);
            (b.addr(), b.size(), b.segment(), b.stream(), b.pool())
        };
        debug_assert!(addr <= from && from <= to && to <= addr + size);
        if !self.mapping(seg).holds_a_page(from, to) {
            return Ok(());
        }
        // Unmapping is not ordered with the stream's work: wait for it first.
        backend.synchronize_stream(stream)?;
        let unmapped = self.mapping_mut(seg).unmap(vm_of(backend), from, to)?;
        let (unmapped_addr, unmapped_size) = (unmapped.ptr, unmapped.size);
        self.remove_from_pool(id);
        let before = unmapped_addr - addr;
        if before > 0 {
            let b = self.store.split_front(id, before, stream);
            self.insert_into_pool(b);
        }
        let after = size - before - unmapped_size;
        if after > 0 {
            let a = self.store.split_back(id, unmapped_size, true);
            self.insert_into_pool(a);
        }
        self.store.unmap(id);
        let (prev, next) = (self.store.block(id).prev(), self.store.block(id).next());
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_unmapped(id);
        self.count_private_malloc(pool, false);
        let st = self.stat_type(pool);
        let owner = self.owner(pool);
        self.acct.pages_unmapped(st, owner, unmapped_size);
        self.record_trace(
            TraceAction::SegmentUnmap,
            unmapped_addr,
            unmapped_size,
            stream,
            pool,
            Some(id),
        );
        Ok(())
    }

    /// spec 1.11: a fully unmapped expandable segment gives its address range back.
    pub(super) fn release_expandable_segment<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let seg = self.store.block(id).segment();
        debug_assert!(
            !self.store.block(id).mapped()
                && self.store.block(id).size() == self.mapping(seg).reservation().size
        );
        // Nothing is mapped: only the reservation goes back.
        self.mapping(seg).release(vm_of(backend))?;
        self.remove_from_unmapped(id);
        self.release_block_slot(id);
        self.store.remove_segment(seg);
        Ok(())
    }
}
