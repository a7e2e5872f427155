//! The per-device state machine: PyTorch's `DeviceCachingAllocator`.
//!
//! Everything here runs under the device lock held by
//! [`CachingAllocator`](super::CachingAllocator). Each function mirrors the
//! PyTorch function of the same name; the spec section is named on each.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::block::{
    Block, BlockId, BlockPool, Expandable, FreeKey, PoolId, Segment, SegmentId, Slab, UnmappedKey,
    NIL, POOL_LARGE, POOL_SMALL,
};
use super::rules::{self, ONE_EXABYTE};
use super::stream_order::{stream_set_order, C10Streams, MempoolSet, StreamTable};
use crate::backend::{Backend, BackendError, DevicePtr, EventId, StreamId};
use crate::config::AllocatorConfig;
use crate::error::{AllocError, OutOfMemoryError};
use crate::format::format_size;
use crate::ids::MempoolId;
use crate::stats::{DeviceStats, StatType};
use crate::trace::TraceAction;

use super::history::Observe;

/// A callback run when the cache has no fitting block, before the driver is
/// asked (PyTorch's `FreeCudaMemoryCallbacksRegistry`). It returns the
/// pointers it wants freed (for example allocations whose last outside
/// reference just went away); returning any counts as "freed something" and
/// the cache is searched again.
pub type FreeMemoryCallback = Box<dyn FnMut() -> Vec<DevicePtr> + Send>;

/// Arguments of an out-of-memory observer (PyTorch's `OutOfMemoryObserver`):
/// device, bytes it tried to allocate, bytes allowed (limit or total), free bytes.
pub type OomObserver = Arc<dyn Fn(i8, u64, u64, u64) + Send + Sync>;

/// What a failed malloc hands back to the lock holder, so observers run
/// after the lock is released.
pub(crate) struct OomReport {
    pub error: OutOfMemoryError,
    pub observers: Vec<OomObserver>,
}

pub(crate) enum MallocError {
    Oom(Box<OomReport>),
    Other(AllocError),
}

impl From<BackendError> for MallocError {
    fn from(e: BackendError) -> Self {
        MallocError::Other(AllocError::Backend(e))
    }
}

/// Decides whether an allocation on a stream goes to a private pool
/// (PyTorch's capture filter). See [`PoolFilter`](super::PoolFilter).
pub(crate) type FilterFn = Arc<dyn Fn(StreamId) -> bool + Send + Sync>;

/// A private memory pool (PyTorch's `PrivatePool`, CUDA-graph style).
pub(crate) struct PrivatePool {
    /// Users (captures, MemPools) still holding the pool; at 0 it is freeable.
    pub use_count: u32,
    /// Driver allocations (and expandable allocations) not given back yet.
    pub cuda_malloc_count: u32,
    /// The pool's large-block pool.
    pub large: PoolId,
    /// The pool's small-block pool.
    pub small: PoolId,
}

/// One allocation request on its way through malloc (PyTorch's `AllocParams`).
struct AllocParams {
    size: u64,
    stream: StreamId,
    pool: PoolId,
    alloc_size: u64,
    stat_type: StatType,
    block: BlockId,
}

/// The state of one device's caching allocator.
pub(crate) struct DeviceState {
    pub device: i8,
    pub config: AllocatorConfig,
    pub blocks: Slab<Block>,
    pub segments: Slab<Segment>,
    pub pools: Vec<BlockPool>,
    /// Allocated blocks by address (PyTorch's sharded `allocated_blocks`).
    pub allocated: FxHashMap<u64, BlockId>,
    pub stats: DeviceStats,
    /// Bytes obtained from the driver (PyTorch's `total_allocated_memory`).
    pub total_allocated_memory: u64,
    /// The per-process limit (`set_per_process_memory_fraction` below 1.0).
    pub allowed_memory_maximum: Option<u64>,
    /// Per-stream FIFOs of (event, block) recorded at cross-stream frees,
    /// in PyTorch's `cuda_events` hash-map layout (see `stream_order`).
    pub events: StreamTable<VecDeque<(EventId, BlockId)>>,
    /// c10 stream ids, which order `events` as PyTorch's hash map does.
    pub c10_streams: C10Streams,
    /// History, trace trackers, callbacks and debug output (see `history.rs`).
    pub obs: Observe,
    /// Private pools by id (PyTorch's `graph_pools`).
    pub graph_pools: BTreeMap<MempoolId, PrivatePool>,
    /// Private pools whose use count reached 0 (`graph_pools_freeable`).
    pub graph_pools_freeable: MempoolSet,
    /// Pools being allocated to, with their filters (`captures_underway`).
    pub captures_underway: Vec<(MempoolId, FilterFn)>,
    /// Cross-stream frees made while allocating to a pool, waiting for the
    /// end of all captures before their events are recorded.
    pub needs_events_deferred: Vec<BlockId>,
    /// Streams recorded on a block while a pool allocation was underway
    /// (PyTorch's `block_to_cudagraph_stream_uses`): a free deferred until the
    /// end of all captures does not wait for them.
    pub capture_stream_uses: FxHashMap<BlockId, Vec<StreamId>>,
    /// Pool slots of erased private pools, for reuse.
    pub free_pool_slots: Vec<PoolId>,
    /// Segments created so far (the next segment's `seq`).
    pub segment_seq: u64,
    /// Rank segments among equal free blocks by address (PyTorch's source
    /// order, what recorded traces show) instead of creation order; set by
    /// replays of recorded traces (see `caching::seed`).
    pub rank_by_address: bool,
    /// `max_split_size` changed at run time: the oversize counters then mix
    /// two thresholds (as in PyTorch) and cannot be recounted.
    pub max_split_changed: bool,
    pub free_memory_callbacks: Vec<FreeMemoryCallback>,
    pub oom_observers: Vec<OomObserver>,
    /// Blocks borrowed from another stream's pool (cross-stream reuse).
    pub cross_stream_reuses: u64,
}

impl DeviceState {
    pub fn new(device: i8, config: AllocatorConfig) -> DeviceState {
        let stats = DeviceStats {
            max_split_size: if config.max_split_size == u64::MAX {
                -1
            } else {
                config.max_split_size as i64
            },
            ..DeviceStats::default()
        };
        DeviceState {
            device,
            config,
            blocks: Slab::default(),
            segments: Slab::default(),
            pools: vec![BlockPool::new(false, None), BlockPool::new(true, None)],
            allocated: FxHashMap::default(),
            stats,
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            events: StreamTable::new(),
            c10_streams: C10Streams::new(device),
            obs: Observe::new(Default::default()),
            graph_pools: BTreeMap::new(),
            graph_pools_freeable: MempoolSet::default(),
            captures_underway: Vec::new(),
            needs_events_deferred: Vec::new(),
            capture_stream_uses: FxHashMap::default(),
            free_pool_slots: Vec::new(),
            segment_seq: 0,
            rank_by_address: false,
            max_split_changed: false,
            free_memory_callbacks: Vec::new(),
            oom_observers: Vec::new(),
            cross_stream_reuses: 0,
        }
    }

    #[inline]
    fn gc_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    #[inline]
    pub(crate) fn stat_type(&self, pool: PoolId) -> StatType {
        StatType::for_pool(self.pools[pool as usize].is_small)
    }

    #[inline]
    fn free_key(&self, id: BlockId) -> FreeKey {
        let b = &self.blocks[id];
        FreeKey::new(b.stream, b.size, self.segments[b.segment].seq, b.addr, id)
    }

    /// PyTorch's `BlockPool::insert_into_blocks`: insert and reset the GC age.
    #[inline]
    pub(crate) fn insert_into_pool(&mut self, id: BlockId) {
        let pool = self.blocks[id].pool as usize;
        let key = self.free_key(id);
        self.blocks[id].gc_count_base = self.pools[pool].get_free_blocks_call_count;
        let inserted = self.pools[pool].blocks.insert(key);
        debug_assert!(inserted, "block inserted twice into its pool");
    }

    #[inline]
    pub(crate) fn remove_from_pool(&mut self, id: BlockId) {
        let pool = self.blocks[id].pool as usize;
        let key = self.free_key(id);
        let removed = self.pools[pool].blocks.remove(&key);
        debug_assert!(removed, "block missing from its pool");
    }

    /// A new live block (not linked, not in any set).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_block(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        segment: SegmentId,
        mapped: bool,
        expandable: bool,
    ) -> BlockId {
        self.blocks.insert(Block {
            addr,
            size,
            requested_size: 0,
            stream,
            pool,
            segment,
            prev: NIL,
            next: NIL,
            allocated: false,
            mapped,
            expandable,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            live: true,
        })
    }

    /// Link the unlinked block `new` right before `at` in `at`'s segment.
    fn link_before(&mut self, new: BlockId, at: BlockId) {
        let prev = self.blocks[at].prev;
        self.blocks[new].prev = prev;
        self.blocks[new].next = at;
        self.blocks[at].prev = new;
        if prev != NIL {
            self.blocks[prev].next = new;
        } else {
            let seg = self.blocks[at].segment;
            self.segments[seg].head = new;
        }
    }

    /// Link the unlinked block `new` right after `at`.
    fn link_after(&mut self, new: BlockId, at: BlockId) {
        let next = self.blocks[at].next;
        self.blocks[new].prev = at;
        self.blocks[new].next = next;
        self.blocks[at].next = new;
        if next != NIL {
            self.blocks[next].prev = new;
        }
    }

    #[inline]
    fn unmapped_key(&self, id: BlockId) -> UnmappedKey {
        let b = &self.blocks[id];
        UnmappedKey {
            stream: b.stream,
            addr: b.addr,
            id,
        }
    }

    pub(crate) fn insert_into_unmapped(&mut self, id: BlockId) {
        let key = self.unmapped_key(id);
        let pool = self.blocks[id].pool as usize;
        let inserted = self.pools[pool].unmapped.insert(key);
        debug_assert!(inserted, "unmapped block inserted twice");
    }

    fn remove_from_unmapped(&mut self, id: BlockId) {
        let key = self.unmapped_key(id);
        let pool = self.blocks[id].pool as usize;
        let removed = self.pools[pool].unmapped.remove(&key);
        debug_assert!(removed, "unmapped block missing from its set");
    }

    /// Free for reuse: not allocated and not waiting for other streams.
    #[inline]
    fn allocatable(&self, id: BlockId) -> bool {
        id != NIL && {
            let b = &self.blocks[id];
            !b.allocated && b.event_count == 0 && b.stream_uses.is_empty()
        }
    }

    /// spec 1.11 `find_expandable_block`: the lowest address of an expandable
    /// segment of this stream where free and unmapped blocks add up to
    /// `size`, or a new expandable segment.
    fn find_expandable_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: PoolId,
        size: u64,
    ) -> Result<BlockId, MallocError> {
        let start = UnmappedKey {
            stream,
            addr: 0,
            id: 0,
        };
        for k in self.pools[pool as usize].unmapped.range(start..) {
            if k.stream != stream {
                break;
            }
            let mut c = k.id;
            if self.allocatable(self.blocks[c].prev) {
                c = self.blocks[c].prev;
            }
            let mut bytes = 0;
            let mut b = c;
            while bytes < size && self.allocatable(b) {
                bytes += self.blocks[b].size;
                b = self.blocks[b].next;
            }
            if bytes >= size {
                return Ok(c);
            }
        }
        let vm = backend
            .as_virtual_memory()
            .ok_or(BackendError::Unsupported {
                backend: backend.name(),
                what: "virtual memory (needed by expandable segments)",
            })?;
        let page_size = if self.pools[pool as usize].is_small {
            rules::SMALL_BUFFER
        } else {
            self.config.large_segment_size
        };
        // Address space for 1 1/8 of the device, so unmapped holes early in
        // the segment can be refilled at its end.
        let total = backend.mem_info()?.total;
        let space = (total + total / 8).div_ceil(page_size) * page_size;
        let reservation = vm.reserve(space)?;
        self.segment_seq += 1;
        let seg = self.segments.insert(Segment {
            seq: self.segment_rank(reservation.base.0),
            addr: reservation.base.0,
            size: reservation.size,
            expandable: Some(Box::new(Expandable {
                reservation,
                page_size,
                pages: Vec::new(),
            })),
            stream,
            pool,
            head: NIL,
            live: true,
        });
        let id = self.new_block(
            reservation.base.0,
            reservation.size,
            stream,
            pool,
            seg,
            false,
            true,
        );
        self.segments[seg].head = id;
        self.insert_into_unmapped(id);
        Ok(id)
    }

    /// spec 1.11 `map_block`: map the pages under the first `size` bytes of
    /// an unmapped block; the rest stays unmapped. False if the device is full.
    fn map_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
        size: u64,
    ) -> Result<bool, MallocError> {
        let (addr, block_size, seg, stream, pool) = {
            let b = &self.blocks[id];
            debug_assert!(!b.mapped && size <= b.size);
            (b.addr, b.size, b.segment, b.stream, b.pool)
        };
        let (reservation, page) = {
            let e = self.segments[seg]
                .expandable
                .as_ref()
                .expect("expandable segment");
            (e.reservation, e.page_size)
        };
        let begin = (addr - reservation.base.0) / page;
        let end = (addr + size - reservation.base.0).div_ceil(page);
        if begin == end {
            return Ok(false);
        }
        let vm = backend
            .as_virtual_memory()
            .expect("checked when the segment was created");
        let mapped = (end - begin) * page;
        match vm.map(reservation, begin * page, mapped) {
            Ok(()) => {}
            Err(e) if e.is_retryable() => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        {
            let pages = &mut self.segments[seg]
                .expandable
                .as_mut()
                .expect("expandable")
                .pages;
            if pages.len() < end as usize {
                pages.resize(end as usize, false);
            }
            pages[begin as usize..end as usize]
                .iter_mut()
                .for_each(|p| *p = true);
        }
        self.remove_from_unmapped(id);
        self.blocks[id].mapped = true;
        if mapped < block_size {
            let rest = self.new_block(
                addr + mapped,
                block_size - mapped,
                stream,
                pool,
                seg,
                false,
                true,
            );
            self.link_after(rest, id);
            self.insert_into_unmapped(rest);
            self.blocks[id].size = mapped;
        }
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_pool(id);
        self.total_allocated_memory += mapped;
        let st = self.stat_type(pool);
        self.stats.reserved_bytes.increase(st, mapped);
        self.stats.num_device_alloc += 1;
        self.record_trace(TraceAction::SegmentMap, addr, mapped, stream, pool, id);
        Ok(true)
    }

    /// spec 1.11 `try_allocate_expandable_block`: grow (or refill) an
    /// expandable segment until one free block holds `size` bytes.
    fn try_allocate_expandable_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: PoolId,
        size: u64,
    ) -> Result<Option<BlockId>, MallocError> {
        let segments_before = self.segment_seq;
        let mut candidate = self.find_expandable_block(backend, stream, pool, size)?;
        let created = self.segment_seq != segments_before;
        if created && self.blocks[candidate].size < size {
            // The request is larger than a whole segment's address space:
            // no map is tried (torch 2.15 logs reserve + addr_free only).
            self.release_expandable_segment(backend, candidate)?;
            return Ok(None);
        }
        if !self.blocks[candidate].mapped {
            let len = self.blocks[candidate].size.min(size);
            if !self.map_block(backend, candidate, len)? {
                // A segment created for this request that could not be mapped
                // stays (fully unmapped, in `unmapped`) for later requests:
                // torch 2.15 keeps it through the OOM flush, which only
                // releases segments it unmaps (FINDINGS.md 11).
                return Ok(None);
            }
        }
        while self.blocks[candidate].size < size {
            let remaining = size - self.blocks[candidate].size;
            let next = self.blocks[candidate].next;
            let len = remaining.min(self.blocks[next].size);
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
    fn unmap_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let (addr, size, seg, stream, pool) = {
            let b = &self.blocks[id];
            (b.addr, b.size, b.segment, b.stream, b.pool)
        };
        let (reservation, page) = {
            let e = self.segments[seg]
                .expandable
                .as_ref()
                .expect("expandable segment");
            (e.reservation, e.page_size)
        };
        let base = reservation.base.0;
        let begin = (addr - base).div_ceil(page);
        let end = (addr + size - base) / page;
        if begin >= end {
            return Ok(());
        }
        // Unmapping is not ordered with the stream's work: wait for it first.
        backend.synchronize_stream(stream)?;
        let vm = backend
            .as_virtual_memory()
            .expect("checked when the segment was created");
        vm.unmap(reservation, begin * page, (end - begin) * page)?;
        {
            let pages = &mut self.segments[seg]
                .expandable
                .as_mut()
                .expect("expandable")
                .pages;
            pages[begin as usize..end as usize]
                .iter_mut()
                .for_each(|p| *p = false);
            while pages.last() == Some(&false) {
                pages.pop();
            }
        }
        self.remove_from_pool(id);
        let unmapped_addr = base + begin * page;
        let unmapped_size = (end - begin) * page;
        let before = unmapped_addr - addr;
        if before > 0 {
            let b = self.new_block(addr, before, stream, pool, seg, true, true);
            self.link_before(b, id);
            self.insert_into_pool(b);
        }
        let after = size - before - unmapped_size;
        if after > 0 {
            let a = self.new_block(
                unmapped_addr + unmapped_size,
                after,
                stream,
                pool,
                seg,
                true,
                true,
            );
            self.link_after(a, id);
            self.insert_into_pool(a);
        }
        {
            let b = &mut self.blocks[id];
            b.addr = unmapped_addr;
            b.size = unmapped_size;
            b.mapped = false;
        }
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge_blocks(id, prev);
        self.try_merge_blocks(id, next);
        self.insert_into_unmapped(id);
        self.total_allocated_memory -= unmapped_size;
        self.count_private_malloc(pool, false);
        let st = self.stat_type(pool);
        self.stats.reserved_bytes.decrease(st, unmapped_size);
        self.stats.num_device_free += 1;
        self.record_trace(
            TraceAction::SegmentUnmap,
            unmapped_addr,
            unmapped_size,
            stream,
            pool,
            id,
        );
        Ok(())
    }

    /// spec 1.11: a fully unmapped expandable segment gives its address range back.
    fn release_expandable_segment<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let seg = self.blocks[id].segment;
        let reservation = self.segments[seg]
            .expandable
            .as_ref()
            .expect("expandable")
            .reservation;
        debug_assert!(!self.blocks[id].mapped && self.blocks[id].size == reservation.size);
        let vm = backend
            .as_virtual_memory()
            .expect("checked when the segment was created");
        vm.release(reservation)?;
        self.remove_from_unmapped(id);
        self.release_block_slot(id);
        self.segments[seg].live = false;
        self.segments[seg].expandable = None;
        self.segments.remove(seg);
        Ok(())
    }

    /// spec 1.4: the pool serving a rounded size: a private pool whose
    /// filter accepts the stream (newest first, as torch 2.9+ does), else
    /// the global small or large pool.
    #[inline]
    fn get_pool(&self, size: u64, stream: StreamId) -> PoolId {
        let small = rules::is_small(size);
        if !self.captures_underway.is_empty() {
            for (id, filter) in self.captures_underway.iter().rev() {
                if filter(stream) {
                    let pool = &self.graph_pools[id];
                    return if small { pool.small } else { pool.large };
                }
            }
        }
        if small {
            POOL_SMALL
        } else {
            POOL_LARGE
        }
    }

    /// Does any live segment belong to one of these pools?
    fn owns_segments(&self, small: PoolId, large: PoolId) -> bool {
        self.segments
            .items
            .iter()
            .any(|s| s.live && (s.pool == small || s.pool == large))
    }

    /// The private pool that owns a pool slot, if any.
    #[inline]
    pub(crate) fn owner(&self, pool: PoolId) -> Option<MempoolId> {
        self.pools[pool as usize].owner
    }

    /// spec 1.5: malloc. Returns the allocated block.
    pub fn malloc<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        orig_size: u64,
        stream: StreamId,
    ) -> Result<BlockId, MallocError> {
        if orig_size >= ONE_EXABYTE {
            return Err(MallocError::Other(AllocError::OutOfMemory(Box::new(
                OutOfMemoryError {
                    message: "CUDA out of memory. Tried to allocate more than 1EB memory.".into(),
                    device: self.device,
                    requested: orig_size,
                    alloc_size: orig_size,
                    stream,
                    device_free: 0,
                    device_total: 0,
                    allowed: self.allowed_memory_maximum,
                },
            ))));
        }
        if self.captures_underway.is_empty() {
            self.process_events(backend)?;
        }

        let size = rules::round_size(orig_size, &self.config);
        let pool = self.get_pool(size, stream);
        let mut p = AllocParams {
            size,
            stream,
            pool,
            alloc_size: rules::allocation_size(size, &self.config),
            stat_type: self.stat_type(pool),
            block: NIL,
        };

        let mut found = self.get_free_block(&mut p)
            || (self.trigger_free_memory_callbacks(backend)? && self.get_free_block(&mut p));
        if !found && self.config.policy.cross_stream_reuse && self.captures_underway.is_empty() {
            // Reservoir-only policy (caching/cross_stream.rs): borrow a block
            // cached on another stream; it is handed out on its own stream.
            if let Some(id) = self.take_from_other_stream(backend, p.pool, p.size, stream)? {
                p.block = id;
                p.stream = self.blocks[id].stream;
                found = true;
            }
        }

        if !found {
            if self.gc_enabled() {
                self.garbage_collect_cached_blocks(backend)?;
            }
            found = self.alloc_block(backend, &mut p, false)?
                || (self.release_available_cached_blocks(backend, &p)?
                    && self.alloc_block(backend, &mut p, false)?)
                || (self.captures_underway.is_empty()
                    && self.release_cached_blocks(backend, MempoolId::DEFAULT)?
                    && self.alloc_block(backend, &mut p, true)?);
            // The block comes from the device (for callbacks and debug output).
            self.obs.fresh = found;
        }

        if !found {
            return Err(MallocError::Oom(Box::new(
                self.out_of_memory(backend, &p, orig_size)?,
            )));
        }

        let split = rules::should_split(
            self.blocks[p.block].size,
            p.size,
            self.pools[p.pool as usize].is_small,
            &self.config,
        );
        let id = self.alloc_found_block(&p, orig_size, split);
        if p.stream != stream {
            self.record_stream(id, stream);
        }
        let b = &self.blocks[id];
        backend.on_block_handed_out(DevicePtr(b.addr), b.size, stream);
        Ok(id)
    }

    /// spec 1.9: build the out-of-memory error after every attempt failed.
    fn out_of_memory<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &AllocParams,
        orig_size: u64,
    ) -> Result<OomReport, MallocError> {
        let info = backend.mem_info()?;
        self.record_trace(TraceAction::Oom, info.free, p.size, p.stream, p.pool, NIL);
        self.stats.num_ooms += 1;

        let allocated = self.stats.allocated_bytes.all().current as u64;
        let reserved = self.stats.reserved_bytes.all().current as u64;
        // Free cached blocks of private pools (none until private pools exist).
        let in_private_pools: u64 = self.pools[2..]
            .iter()
            .flat_map(|pool| pool.blocks.iter())
            .map(|k| k.size)
            .sum();
        let allowed_info = match self.allowed_memory_maximum {
            Some(a) => format!("{} allowed; ", format_size(a)),
            None => String::new(),
        };
        let private_msg = if in_private_pools > 0 {
            format!(
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                format_size(in_private_pools)
            )
        } else {
            String::new()
        };
        // torch 2.15: the advice depends on whether expandable segments are on.
        let advice = if self.config.expandable_segments {
            " expandable_segments is enabled. If instead the process is running out of virtual \
             address space (VSZ), expandable segments may be over-reserving VA (each segment \
             reserves ~9/8 of device memory, times the number of streams); reduce it via \
             PYTORCH_CUDA_ALLOC_CONF expandable_segments_reserve / \
             expandable_segments_reserve_by_class."
        } else {
            " If reserved but unallocated memory is large try setting \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
             documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
        };
        let message = format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} \
             is free. {}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by \
             PyTorch but unallocated.{advice}",
            format_size(p.alloc_size),
            self.device,
            format_size(info.total),
            format_size(info.free),
            allowed_info,
            format_size(allocated + in_private_pools),
            private_msg,
            format_size(reserved.saturating_sub(allocated + in_private_pools)),
        );
        Ok(OomReport {
            error: OutOfMemoryError {
                message,
                device: self.device,
                requested: orig_size,
                alloc_size: p.alloc_size,
                stream: p.stream,
                device_free: info.free,
                device_total: info.total,
                allowed: self.allowed_memory_maximum,
            },
            observers: self.oom_observers.clone(),
        })
    }

    /// spec 1.6: best fit keyed by (stream, size, address) with the oversize rules.
    fn get_free_block(&mut self, p: &mut AllocParams) -> bool {
        let gc = self.gc_enabled();
        let max_split = self.config.max_split_size;
        let max_non_split = self.config.max_non_split_rounding_size;
        let pool = &mut self.pools[p.pool as usize];
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        let mut candidates = pool.blocks.range(FreeKey::search(p.stream, p.size)..);
        let Some(&first) = candidates.next() else {
            return false;
        };
        let mut hit = first;
        if hit.stream != p.stream {
            return false;
        }
        if self.blocks[hit.id].expandable {
            if self.config.expandable_segments {
                // Best fit by the size a block can grow to: a block followed by
                // unmapped space counts as that much larger (spec 1.6).
                let blocks = &self.blocks;
                let expandable_size = |k: &FreeKey| {
                    let b = &blocks[k.id];
                    b.size
                        + if b.next != NIL && !blocks[b.next].mapped {
                            blocks[b.next].size
                        } else {
                            0
                        }
                };
                for next in candidates {
                    if !blocks[hit.id].expandable
                        || next.stream != p.stream
                        || expandable_size(next) >= expandable_size(&hit)
                    {
                        break;
                    }
                    hit = *next;
                }
            } else {
                // Expandable segments were turned off: skip their blocks.
                match candidates.find(|k| !self.blocks[k.id].expandable || k.stream != p.stream) {
                    Some(k) if k.stream == p.stream => hit = *k,
                    _ => return false,
                }
            }
        }
        let pool = &mut self.pools[p.pool as usize];
        if p.size < max_split && hit.size >= max_split {
            return false;
        }
        if p.size >= max_split && hit.size >= p.size.saturating_add(max_non_split) {
            return false;
        }
        pool.blocks.remove(&hit);
        p.block = hit.id;
        true
    }

    /// spec 1.5 step 4: run the free-memory callbacks; true if any freed memory.
    fn trigger_free_memory_callbacks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<bool, MallocError> {
        if self.free_memory_callbacks.is_empty() {
            return Ok(false);
        }
        let mut callbacks = std::mem::take(&mut self.free_memory_callbacks);
        let mut to_free = Vec::new();
        for cb in callbacks.iter_mut() {
            to_free.extend(cb());
        }
        self.free_memory_callbacks = callbacks;
        let mut freed = false;
        for ptr in to_free {
            if let Some(id) = self.allocated.remove(&ptr.0) {
                self.free(backend, id).map_err(MallocError::Other)?;
                freed = true;
            }
        }
        Ok(freed)
    }

    /// spec 1.9: ask the driver for a new segment of `p.alloc_size` bytes.
    fn alloc_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &mut AllocParams,
        is_retry: bool,
    ) -> Result<bool, MallocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let size = p.alloc_size;
        if let Some(allowed) = self.allowed_memory_maximum {
            if self.total_allocated_memory + size > allowed {
                return Ok(false);
            }
        }
        if self.config.expandable_segments {
            return match self.try_allocate_expandable_block(backend, p.stream, p.pool, p.size)? {
                Some(id) => {
                    p.block = id;
                    self.count_private_malloc(p.pool, true);
                    Ok(true)
                }
                None => Ok(false),
            };
        }
        let ptr = match backend.allocate(size, p.stream) {
            Ok(ptr) => ptr,
            Err(e) if e.is_retryable() => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        self.count_private_malloc(p.pool, true);
        self.total_allocated_memory += size;
        self.segment_seq += 1;
        let seg = self.segments.insert(Segment {
            seq: self.segment_rank(ptr.0),
            addr: ptr.0,
            size,
            expandable: None,
            stream: p.stream,
            pool: p.pool,
            head: NIL,
            live: true,
        });
        let id = self.new_block(ptr.0, size, p.stream, p.pool, seg, true, false);
        self.segments[seg].head = id;
        p.block = id;
        self.stats.segment.increase(p.stat_type, 1);
        self.stats.reserved_bytes.increase(p.stat_type, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.record_trace(TraceAction::SegmentAlloc, ptr.0, size, p.stream, p.pool, id);
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
        let pool = self.blocks[block].pool;
        let p = AllocParams {
            size,
            stream,
            pool,
            alloc_size: size,
            stat_type: self.stat_type(pool),
            block,
        };
        self.alloc_found_block(&p, size, split)
    }

    /// spec 1.7: hand out the found block, splitting off the remainder.
    fn alloc_found_block(&mut self, p: &AllocParams, orig_size: u64, split: bool) -> BlockId {
        let st = p.stat_type;
        let mut id = p.block;
        let already_split = self.blocks[id].is_split();
        let expandable = self.blocks[id].expandable;
        if split {
            let remaining = id;
            let (addr, segment, pool) = {
                let r = &self.blocks[remaining];
                (r.addr, r.segment, r.pool)
            };
            id = self.new_block(addr, p.size, p.stream, pool, segment, true, expandable);
            self.link_before(id, remaining);
            let r = &mut self.blocks[remaining];
            r.addr += p.size;
            r.size -= p.size;
            let remaining_size = r.size;
            self.insert_into_pool(remaining);
            if expandable {
                // Expandable blocks are not counted in inactive_split (spec 1.11).
            } else if already_split {
                // An already-split inactive block shrinks by `size` bytes.
                self.stats.inactive_split_bytes.decrease(st, p.size);
            } else {
                // A previously unsplit block leaves a new inactive split remainder.
                self.stats.inactive_split_bytes.increase(st, remaining_size);
                self.stats.inactive_split.increase(st, 1);
            }
        } else if already_split && !expandable {
            // An already-split block becomes active whole.
            let size = self.blocks[id].size;
            self.stats.inactive_split_bytes.decrease(st, size);
            self.stats.inactive_split.decrease(st, 1);
        }

        let b = &mut self.blocks[id];
        b.allocated = true;
        b.requested_size = orig_size;
        let (addr, size, stream) = (b.addr, b.size, b.stream);
        self.record_trace(TraceAction::Alloc, addr, orig_size, stream, p.pool, id);
        self.note_allocated(id, addr, size, orig_size, st);
        id
    }

    /// Enters the allocated block `id` (`size` bytes at `addr`, `requested`
    /// of them asked for) in the pointer map and the allocation stats
    /// (spec 1.12), as a hand-out and a seeded allocation both do.
    pub(crate) fn note_allocated(
        &mut self,
        id: BlockId,
        addr: u64,
        size: u64,
        requested: u64,
        st: StatType,
    ) {
        self.allocated.insert(addr, id);
        let s = &mut self.stats;
        s.allocation.increase(st, 1);
        s.allocated_bytes.increase(st, size);
        s.active.increase(st, 1);
        s.active_bytes.increase(st, size);
        s.requested_bytes.increase(st, requested);
        if size >= self.config.max_split_size {
            s.oversize_allocations.increase(1);
        }
    }

    /// spec 1.10: free a block the caller no longer uses. The block has
    /// already been removed from the pointer map.
    pub fn free<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), AllocError> {
        let pool = self.blocks[id].pool;
        let st = self.stat_type(pool);
        let b = &mut self.blocks[id];
        b.allocated = false;
        let (addr, size, requested, stream) = (b.addr, b.size, b.requested_size, b.stream);
        backend.on_block_freed(DevicePtr(addr), size, stream);
        self.stats.allocation.decrease(st, 1);
        self.stats.allocated_bytes.decrease(st, size);
        self.record_trace(
            TraceAction::FreeRequested,
            addr,
            requested,
            stream,
            pool,
            id,
        );
        if size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        if self.blocks[id].stream_uses.is_empty() {
            self.free_block(id);
            Ok(())
        } else if !self.captures_underway.is_empty() {
            // No events while allocating to a pool: record them once every
            // pool allocation has ended (spec 1.10).
            self.needs_events_deferred.push(id);
            Ok(())
        } else {
            self.insert_events(backend, id)
        }
    }

    /// spec 1.10: record the events of frees deferred during pool allocation.
    fn insert_events_deferred_until_no_capture<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), BackendError> {
        // In the order the frees happened, as PyTorch walks its vector.
        let mut deferred = std::mem::take(&mut self.needs_events_deferred).into_iter();
        while let Some(id) = deferred.next() {
            // `remove_cudagraph_stream_uses`: work recorded during a capture
            // is captured, not run, so the streams recorded then are dropped
            // (the set is rebuilt by inserting the rest in its old order).
            if let Some(captured) = self.capture_stream_uses.remove(&id) {
                let uses = std::mem::take(&mut self.blocks[id].stream_uses);
                self.blocks[id].stream_uses = stream_set_order(&uses, &self.c10_streams)
                    .into_iter()
                    .filter(|s| !captured.contains(s))
                    .collect();
            }
            if let Err(e) = self.insert_events(backend, id) {
                self.needs_events_deferred = std::iter::once(id).chain(deferred).collect();
                return Err(match e {
                    AllocError::Backend(b) => b,
                    other => BackendError::Driver(other.to_string()),
                });
            }
            if self.blocks[id].event_count == 0 {
                self.free_block(id);
            }
        }
        Ok(())
    }

    /// spec 1.10: record an event on every stream that used the block.
    fn insert_events<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), AllocError> {
        let uses = std::mem::take(&mut self.blocks[id].stream_uses);
        // PyTorch keeps the capture-time uses of a block freed outside a
        // capture keyed by its Block* until a later deferred free of that
        // pointer; forgetting them here only differs when a block is reused.
        self.capture_stream_uses.remove(&id);
        // `stream_uses` is a ska::flat_hash_set in PyTorch: walk it in its order.
        for s in stream_set_order(&uses, &self.c10_streams) {
            let event = backend.record_event(s)?;
            self.blocks[id].event_count += 1;
            let hash = self.c10_streams.hash(s);
            self.events
                .get_or_insert_with(s, hash, VecDeque::new)
                .push_back((event, id));
        }
        Ok(())
    }

    /// spec 1.10: reap completed cross-stream events, per stream, stopping at
    /// the first pending event of each stream. Streams are walked in the slot
    /// order of PyTorch's `cuda_events` hash map, and a stream's entry is
    /// erased once its queue is empty (`it = cuda_events.erase(it)`).
    pub fn process_events<B: Backend + ?Sized>(&mut self, backend: &B) -> Result<(), BackendError> {
        if !self.needs_events_deferred.is_empty() {
            self.insert_events_deferred_until_no_capture(backend)?;
        }
        let mut cur = self.events.first();
        while let Some(pos) = cur {
            while let Some(&(event, id)) = self.events.value_at(pos).front() {
                if !backend.query_event(event)? {
                    break;
                }
                self.events.value_at(pos).pop_front();
                // The event has completed; giving it back cannot change the outcome.
                let _ = backend.destroy_event(event);
                self.complete_event(id);
            }
            cur = if self.events.value_at(pos).is_empty() {
                self.events.erase_at(pos)
            } else {
                self.events.next(pos)
            };
        }
        Ok(())
    }

    #[inline]
    fn complete_event(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(id);
        }
    }

    /// spec 1.9: wait for every outstanding event and free their blocks.
    /// With `only`, just the events of that private pool's blocks.
    fn synchronize_and_free_events<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        only: Option<MempoolId>,
    ) -> Result<(), BackendError> {
        self.stats.num_sync_all_streams += 1;
        self.insert_events_deferred_until_no_capture(backend)?;
        let mut result = Ok(());
        let mut cur = self.events.first();
        while let Some(pos) = cur {
            let queue = std::mem::take(self.events.value_at(pos));
            let mut keep = VecDeque::new();
            for (event, id) in queue {
                if only.is_some() && self.owner(self.blocks[id].pool) != only {
                    keep.push_back((event, id));
                    continue;
                }
                if let Err(e) = backend.synchronize_event(event) {
                    // A device that cannot synchronise is lost; keep going so
                    // the bookkeeping stays whole, and report the first error.
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
                let _ = backend.destroy_event(event);
                self.complete_event(id);
            }
            let empty = keep.is_empty();
            *self.events.value_at(pos) = keep;
            cur = if empty {
                self.events.erase_at(pos)
            } else {
                self.events.next(pos)
            };
        }
        result
    }

    /// spec 1.10: return a block to its pool, merging free neighbours.
    fn free_block(&mut self, id: BlockId) {
        let (addr, requested, stream, original_size, prev, next, pool) = {
            let b = &self.blocks[id];
            debug_assert!(!b.allocated && b.event_count == 0 && b.stream_uses.is_empty());
            (
                b.addr,
                b.requested_size,
                b.stream,
                b.size,
                b.prev,
                b.next,
                b.pool,
            )
        };
        self.record_trace(
            TraceAction::FreeCompleted,
            addr,
            requested,
            stream,
            pool,
            id,
        );
        let mut net_blocks: i64 = 0;
        let mut net_bytes: i64 = 0;
        for candidate in [prev, next] {
            let subsumed = self.try_merge_blocks(id, candidate);
            if subsumed > 0 {
                net_blocks -= 1;
                net_bytes -= subsumed as i64;
            }
        }
        self.insert_into_pool(id);
        if self.blocks[id].is_split() {
            net_blocks += 1;
            net_bytes += self.blocks[id].size as i64;
        }
        let st = self.stat_type(pool);
        let expandable = self.blocks[id].expandable;
        let s = &mut self.stats;
        if !expandable {
            apply_net(&mut s.inactive_split, st, net_blocks);
            apply_net(&mut s.inactive_split_bytes, st, net_bytes);
        }
        s.active.decrease(st, 1);
        s.active_bytes.decrease(st, original_size);
        s.requested_bytes.decrease(st, requested);
    }

    /// PyTorch's `try_merge_blocks`: absorb `src` into `dst` if it is free.
    fn try_merge_blocks(&mut self, dst: BlockId, src: BlockId) -> u64 {
        if src == NIL {
            return 0;
        }
        {
            let s = &self.blocks[src];
            if s.allocated || s.event_count > 0 || !s.stream_uses.is_empty() {
                return 0;
            }
            if s.mapped != self.blocks[dst].mapped {
                return 0;
            }
        }
        if self.blocks[src].mapped {
            self.remove_from_pool(src);
        } else {
            self.remove_from_unmapped(src);
        }
        let s = {
            let b = &self.blocks[src];
            MergedNeighbour {
                addr: b.addr,
                size: b.size,
                prev: b.prev,
                next: b.next,
                segment: b.segment,
            }
        };
        if self.blocks[dst].prev == src {
            // [src dst]
            let d = &mut self.blocks[dst];
            d.addr = s.addr;
            d.prev = s.prev;
            if s.prev != NIL {
                self.blocks[s.prev].next = dst;
            } else {
                self.segments[s.segment].head = dst;
            }
            if self.obs.active {
                // PyTorch moves the segment's stack to the new head.
                self.move_segment_context(src, dst);
            }
        } else {
            // [dst src]
            self.blocks[dst].next = s.next;
            if s.next != NIL {
                self.blocks[s.next].prev = dst;
            }
        }
        self.blocks[dst].size += s.size;
        self.release_block_slot(src);
        s.size
    }

    fn release_block_slot(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.live = false;
        b.stream_uses = Vec::new();
        if !self.capture_stream_uses.is_empty() {
            self.capture_stream_uses.remove(&id);
        }
        self.blocks.remove(id);
    }

    /// spec 1.8: free old unsplit large-pool blocks until reserved memory is
    /// back under the threshold.
    fn garbage_collect_cached_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), MallocError> {
        let Some(allowed) = self.allowed_memory_maximum else {
            return Ok(());
        };
        let gc_threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= gc_threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - gc_threshold;
        let mut reclaimed = 0u64;
        let clock = self.pools[POOL_LARGE as usize].get_free_blocks_call_count;
        let age = |b: &Block| (clock - b.gc_count_base) as i32 as i64 as u64;
        let mut total_age: u64 = 0;
        let mut freeable: u64 = 0;
        for k in &self.pools[POOL_LARGE as usize].blocks {
            let b = &self.blocks[k.id];
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
            let candidates: Vec<BlockId> = self.pools[POOL_LARGE as usize]
                .blocks
                .iter()
                .map(|k| k.id)
                .filter(|&id| {
                    let b = &self.blocks[id];
                    !b.is_split() && !b.expandable && age(b) as f64 >= threshold
                })
                .collect();
            for id in candidates {
                block_freed = true;
                let b = &self.blocks[id];
                reclaimed += b.size;
                total_age -= age(b);
                freeable -= 1;
                self.release_block(backend, id)?;
            }
        }
        Ok(())
    }

    /// spec 1.9: with max_split_size set, free one cached oversize block big
    /// enough for the request, or several starting from the largest.
    fn release_available_cached_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &AllocParams,
    ) -> Result<bool, MallocError> {
        let max_split = self.config.max_split_size;
        if max_split == u64::MAX {
            return Ok(false);
        }
        let key_size = p.size.max(max_split);
        let pool = &self.pools[p.pool as usize];
        let search = FreeKey::search(p.stream, key_size);
        // Blocks at or above max_split_size are never split while the setting
        // is unchanged; one split by an earlier setting stays (PyTorch would
        // hand its interior address to cudaFree).
        if let Some(&hit) = pool.blocks.range(search..).next() {
            let b = &self.blocks[hit.id];
            if hit.stream == p.stream && !b.is_split() && !b.expandable {
                self.release_block(backend, hit.id)?;
                return Ok(true);
            }
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let mut released = 0u64;
        let mut victims = Vec::new();
        for k in pool.blocks.range(..search).rev() {
            if released >= key_size || k.size < max_split || k.stream != p.stream {
                break;
            }
            if self.blocks[k.id].is_split() || self.blocks[k.id].expandable {
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
    pub fn release_cached_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        pool: MempoolId,
    ) -> Result<bool, MallocError> {
        if pool.is_default() && self.captures_underway.is_empty() {
            self.synchronize_and_free_events(backend, None)?;
            self.release_blocks(backend, POOL_LARGE)?;
            self.release_blocks(backend, POOL_SMALL)?;
        }
        // In `graph_pools_freeable`'s hash-map order; erasing the visited entry
        // (below) does not change the order of the rest.
        let freeable: Vec<MempoolId> = self.graph_pools_freeable.iter().collect();
        for id in freeable {
            if !pool.is_default() {
                if id != pool {
                    continue;
                }
                self.synchronize_and_free_events(backend, Some(id))?;
            }
            let (small, large) = {
                let p = &self.graph_pools[&id];
                (p.small, p.large)
            };
            self.release_blocks(backend, small)?;
            self.release_blocks(backend, large)?;
            // PyTorch erases the pool when its driver allocation count is 0.
            // With expandable segments that count (one up per allocation that
            // mapped pages, one down per unmap) can reach 0 while segments
            // remain, and PyTorch would leave blocks pointing at a deleted
            // pool: keep the pool until it owns nothing.
            if self.graph_pools[&id].cuda_malloc_count == 0 && !self.owns_segments(small, large) {
                self.erase_private_pool(id);
            }
        }
        Ok(true)
    }

    /// Free every whole (unsplit) free segment of a pool, in pool order.
    /// Expandable blocks give back their fully free pages instead, after the
    /// whole segments (spec 1.11).
    fn release_blocks<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        pool: PoolId,
    ) -> Result<(), BackendError> {
        let mut victims = Vec::new();
        let mut to_unmap = Vec::new();
        for k in &self.pools[pool as usize].blocks {
            let b = &self.blocks[k.id];
            if b.expandable {
                to_unmap.push(k.id);
            } else if !b.is_split() {
                victims.push(k.id);
            }
        }
        for id in victims {
            self.release_block(backend, id)?;
        }
        for id in to_unmap {
            self.unmap_block(backend, id)?;
            if !self.blocks[id].is_split() {
                self.release_expandable_segment(backend, id)?;
            }
        }
        Ok(())
    }

    /// spec 1.9: give a whole free segment back to the driver.
    fn release_block<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let (addr, size, stream, pool, seg) = {
            let b = &self.blocks[id];
            debug_assert!(!b.is_split() && !b.allocated);
            (b.addr, b.size, b.stream, b.pool, b.segment)
        };
        backend.free(DevicePtr(addr), size)?;
        self.stats.num_device_free += 1;
        self.record_trace(TraceAction::SegmentFree, addr, size, stream, pool, id);
        self.total_allocated_memory -= size;
        self.count_private_malloc(pool, false);
        let st = self.stat_type(pool);
        self.stats.segment.decrease(st, 1);
        self.stats.reserved_bytes.decrease(st, size);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.remove_from_pool(id);
        self.release_block_slot(id);
        self.segments[seg].live = false;
        self.segments.remove(seg);
        Ok(())
    }

    /// spec 1.10: `record_stream`.
    pub fn record_stream(&mut self, id: BlockId, stream: StreamId) {
        let b = &mut self.blocks[id];
        if stream == b.stream {
            return;
        }
        if !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        if !self.captures_underway.is_empty() {
            let captured = self.capture_stream_uses.entry(id).or_default();
            if !captured.contains(&stream) {
                captured.push(stream);
            }
        }
    }

    /// spec 1.13: largest free block, seeded with the device's free memory.
    pub fn cache_info<B: Backend + ?Sized>(&self, backend: &B) -> Result<u64, BackendError> {
        let mut largest = backend.mem_info()?.free;
        for pool in &self.pools {
            for k in &pool.blocks {
                largest = largest.max(k.size);
            }
        }
        Ok(largest)
    }

    /// spec 1.13: the segment base and total size of an allocated block.
    pub fn base_allocation(&self, id: BlockId) -> Result<(u64, u64), AllocError> {
        let seg = &self.segments[self.blocks[id].segment];
        if seg.expandable.is_some() {
            return Err(AllocError::InvalidState(
                "Tensors allocated with expandable_segments:True cannot be shared between \
                 processes. Consider using expandable_segments:False in data loading workers via \
                 torch.cuda.memory._set_allocator_settings('expandable_segments:False')"
                    .into(),
            ));
        }
        Ok((seg.addr, seg.size))
    }

    /// spec 1.13: limit reserved memory to `fraction` of the device.
    pub fn set_memory_fraction(&mut self, fraction: f64, total: u64) {
        self.allowed_memory_maximum = if fraction < 1.0 {
            Some((fraction * total as f64) as u64)
        } else {
            None
        };
    }

    /// The id of a segment's blocks in address order.
    pub fn segment_blocks(&self, seg: SegmentId) -> SegmentBlocks<'_> {
        SegmentBlocks {
            state: self,
            next: self.segments[seg].head,
        }
    }
}

/// Iterator over the blocks of one segment, in address order.
pub(crate) struct SegmentBlocks<'a> {
    state: &'a DeviceState,
    next: BlockId,
}

impl Iterator for SegmentBlocks<'_> {
    type Item = BlockId;
    fn next(&mut self) -> Option<BlockId> {
        if self.next == NIL {
            return None;
        }
        let id = self.next;
        self.next = self.state.blocks[id].next;
        Some(id)
    }
}

/// Apply a net change as one increase or decrease, as PyTorch does (so the
/// lifetime totals see the net, not each step).
#[inline]
fn apply_net(array: &mut crate::stats::StatArray, st: StatType, net: i64) {
    if net > 0 {
        array.increase(st, net as u64);
    } else if net < 0 {
        array.decrease(st, (-net) as u64);
    }
}

/// What `try_merge_blocks` keeps of the block it absorbs (no clone of the
/// whole block, whose `stream_uses` is a `Vec`).
struct MergedNeighbour {
    addr: u64,
    size: u64,
    prev: BlockId,
    next: BlockId,
    segment: SegmentId,
}
