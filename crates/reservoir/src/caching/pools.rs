//! Pools: PyTorch's `BlockPool` (the free lists of one kind of block, with
//! the caching allocator's keys), the global large and small pools, private
//! memory pools (CUDA-graph style `MempoolId`s, spec 1.14) and pool
//! checkpoints (spec 1.15).

use std::sync::Arc;

use super::request::AllocParams;
use super::rules;
use super::state::pools::{
    block_rank, BlockPool, FilterFn, FreeKey, UnmappedKey, POOL_LARGE, POOL_SMALL,
};
use super::state::DeviceState;
use crate::backend::{Backend, DevicePtr, StreamId};
use crate::config::{AllocatorConfig, FreeBlockOrder};
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::pluggable::PluggableAllocator;
use crate::store::{Block, BlockId, PoolId};

/// Which allocations go to a private pool while it is being allocated to.
#[derive(Clone)]
pub enum PoolFilter {
    /// Allocations on this stream (a CUDA graph capturing on the stream).
    Stream(StreamId),
    /// Allocations made by this thread (`torch.cuda.use_mem_pool`).
    Thread(std::thread::ThreadId),
    /// Any rule over the allocation stream.
    Custom(Arc<dyn Fn(StreamId) -> bool + Send + Sync>),
}

impl PoolFilter {
    /// Allocations made by the calling thread.
    pub fn current_thread() -> PoolFilter {
        PoolFilter::Thread(std::thread::current().id())
    }

    pub(crate) fn into_fn(self) -> FilterFn {
        match self {
            PoolFilter::Stream(s) => Arc::new(move |stream| stream == s),
            PoolFilter::Thread(t) => Arc::new(move |_| std::thread::current().id() == t),
            PoolFilter::Custom(f) => f,
        }
    }
}

impl std::fmt::Debug for PoolFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolFilter::Stream(s) => write!(f, "PoolFilter::Stream({s})"),
            PoolFilter::Thread(t) => write!(f, "PoolFilter::Thread({t:?})"),
            PoolFilter::Custom(_) => f.write_str("PoolFilter::Custom(..)"),
        }
    }
}

/// One block of a checkpointed segment (PyTorch's `BlockState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockCheckpoint {
    /// Allocation stream.
    pub stream: StreamId,
    /// Streams recorded with `record_stream`.
    pub stream_uses: Vec<StreamId>,
    /// Bytes.
    pub size: u64,
    /// Address.
    pub ptr: DevicePtr,
    /// Allocated at the checkpoint?
    pub allocated: bool,
    /// The GC age base.
    pub gc_count_base: i64,
}

/// One checkpointed segment (PyTorch's `SegmentState`), blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentCheckpoint {
    /// The blocks, tiling the segment.
    pub blocks: Vec<BlockCheckpoint>,
    /// Small pool?
    pub is_small: bool,
}

/// The state of a private pool (PyTorch's `PrivatePoolState`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolCheckpoint {
    /// The pool.
    pub owner: MempoolId,
    /// Its segments, by address.
    pub segments: Vec<SegmentCheckpoint>,
}

/// What restoring a checkpoint changed (PyTorch's `RestoreResult`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreResult {
    /// Allocations that were live and are freed by the restore: the caller's
    /// handles to them are dead.
    pub allocations_freed: Vec<DevicePtr>,
    /// Allocations live in the checkpoint, allocated anew by the restore: the
    /// caller takes ownership (free them with `raw_free`).
    pub allocations_created: Vec<DevicePtr>,
}

fn err(msg: impl Into<String>) -> AllocError {
    AllocError::InvalidState(msg.into())
}

impl DeviceState {
    /// Count a driver allocation (`up`) or free of a private pool.
    pub(crate) fn count_private_malloc(&mut self, pool: PoolId, up: bool) {
        if let Some(id) = self.owner(pool) {
            self.private.count_malloc(id, up);
        }
    }

    fn new_pool_slot(&mut self, is_small: bool, owner: MempoolId) -> PoolId {
        let pool = BlockPool::new(is_small, Some(owner));
        match self.private.take_free_slot() {
            Some(slot) => {
                self.pools[slot.index()] = pool;
                slot
            }
            None => self.pools.add_slot(pool),
        }
    }

    /// The small or large pool slot of the private pool `id`, which is
    /// created (one use) when it does not exist.
    pub(crate) fn private_pool_slot(&mut self, id: MempoolId, small: bool) -> PoolId {
        if self.private.get(id).is_none() {
            let s = self.new_pool_slot(true, id);
            let l = self.new_pool_slot(false, id);
            self.private.create(id, s, l);
        }
        let p = self.private.get(id).expect("created above");
        if small {
            p.small()
        } else {
            p.large()
        }
    }

    pub(crate) fn erase_private_pool(&mut self, id: MempoolId) {
        for slot in self.private.erase(id).into_iter().flatten() {
            self.pools[slot.index()].disown();
        }
    }

    /// spec 1.14 `beginAllocateToPool`.
    pub(crate) fn begin_allocate_to_pool(
        &mut self,
        id: MempoolId,
        filter: FilterFn,
    ) -> Result<(), AllocError> {
        if id.is_default() {
            return Err(AllocError::InvalidArgument(
                "the default pool (0, 0) cannot be a private pool".into(),
            ));
        }
        if self.private.is_capturing_to(id) {
            return Err(err("beginAllocateToPool: already recording to mempool_id"));
        }
        if self.private.is_freeable(id) {
            return Err(err(format!(
                "private pool {id:?} was released and waits for empty_cache to free it; \
                 it cannot be allocated to again"
            )));
        }
        if !self.private.add_use(id) {
            let small = self.new_pool_slot(true, id);
            let large = self.new_pool_slot(false, id);
            self.private.create(id, small, large);
        }
        self.private.begin_capture(id, filter);
        Ok(())
    }

    /// spec 1.7 / 1.14 `setNoSplit` (`MemPool(no_split=True)`): blocks of
    /// private pool `id` are handed out whole from now on, never split.
    pub(crate) fn set_no_split(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let Some(p) = self.private.get(id) else {
            return Err(err(format!("setNoSplit: unknown private pool {id:?}")));
        };
        let (small, large) = (p.small(), p.large());
        self.pools[small.index()].set_no_split();
        self.pools[large.index()].set_no_split();
        Ok(())
    }

    /// spec 1.5 / 1.14 `setUseOnOOM` (`MemPool(use_on_oom=True)`): when an
    /// allocation outside every private pool would run out of memory, the
    /// free blocks of private pool `id` may serve it (`on`), or no longer
    /// (`!on`). Marking an unknown pool is refused and changes nothing;
    /// unmarking one is a no-op (torch's `~MemPool` unmarks every pool).
    pub(crate) fn set_use_on_oom(&mut self, id: MempoolId, on: bool) -> Result<(), AllocError> {
        if on && self.private.get(id).is_none() {
            return Err(err(format!("setUseOnOOM: unknown private pool {id:?}")));
        }
        self.private.set_use_on_oom(id, on);
        Ok(())
    }

    /// spec 1.14 `createOrIncrefPool(id, allocator)` (`MemPool(allocator=...)`):
    /// create private pool `id` (one use) whose segments come from
    /// `allocator` (its `malloc` for a new segment, its `raw_delete` to give
    /// one back) and are cached by Reservoir, or add a use to the existing
    /// pool `id` that has an allocator (which it keeps). An existing pool
    /// without one is refused and nothing changes.
    pub(crate) fn create_or_incref_pool_with_allocator(
        &mut self,
        id: MempoolId,
        allocator: Arc<PluggableAllocator>,
    ) -> Result<(), AllocError> {
        if id.is_default() {
            return Err(AllocError::InvalidArgument(
                "the default pool (0, 0) cannot be a private pool".into(),
            ));
        }
        if let Some(p) = self.private.get(id) {
            if p.allocator().is_none() {
                return Err(err(format!(
                    "createOrIncrefPool: private pool {id:?} exists without an allocator; \
                     it cannot take one"
                )));
            }
            if self.private.is_freeable(id) {
                return Err(err(format!(
                    "private pool {id:?} was released and waits for empty_cache to free it; \
                     it cannot be used again"
                )));
            }
            self.private.add_use(id);
            return Ok(());
        }
        let small = self.new_pool_slot(true, id);
        let large = self.new_pool_slot(false, id);
        self.private.create(id, small, large);
        self.private.set_allocator(id, allocator);
        Ok(())
    }

    /// The own segment allocator of the pool `pool` belongs to, if any
    /// (`MemPool(allocator=...)`).
    pub(crate) fn pool_allocator(&self, pool: PoolId) -> Option<Arc<PluggableAllocator>> {
        let id = self.owner(pool)?;
        self.private.get(id)?.allocator().cloned()
    }

    /// spec 1.5 `try_mempool_fallback` (torch 2.8+): an allocation outside
    /// every private pool for which no new segment could be had takes the
    /// best-fitting free block of the first use-on-OOM pool that has one
    /// (on its stream, of its size class), before any cached memory is
    /// released. Sets `p.pool` and `p.block`; false if no pool has a fit
    /// (then nothing changed). Pools released by all their users or being
    /// allocated to are skipped (PyTorch would assert there).
    pub(crate) fn try_mempool_fallback(&mut self, p: &mut AllocParams) -> bool {
        if self.owner(p.pool).is_some() || self.private.use_on_oom().is_empty() {
            return false;
        }
        let small = rules::is_small(p.size);
        for id in self.private.use_on_oom().to_vec() {
            if self.private.is_freeable(id) || self.private.is_capturing_to(id) {
                continue;
            }
            let Some(pool) = self.private.get(id) else {
                continue;
            };
            let mut q = AllocParams {
                pool: if small { pool.small() } else { pool.large() },
                ..*p
            };
            if self.get_free_block(&mut q) {
                *p = q;
                return true;
            }
        }
        false
    }

    /// spec 1.14 `endAllocateToPool`.
    pub(crate) fn end_allocate_to_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        if self.private.end_capture(id) {
            Ok(())
        } else {
            Err(err(
                "endAllocatePool: not currently recording to mempool_id",
            ))
        }
    }

    /// spec 1.14 `releasePool`: drop one use; at zero the pool becomes
    /// freeable and a later empty_cache or flush returns its memory.
    pub(crate) fn release_pool(&mut self, id: MempoolId) -> Result<(), AllocError> {
        let Some(p) = self.private.get(id) else {
            return Err(err(format!("releasePool: unknown private pool {id:?}")));
        };
        if p.use_count() == 0 {
            return Err(err(format!(
                "releasePool: private pool {id:?} was already released"
            )));
        }
        if p.use_count() == 1 && self.private.is_capturing_to(id) {
            // PyTorch would free the pool under a running capture and then
            // fail an internal assert on the next allocation routed to it.
            return Err(err(format!(
                "releasePool: private pool {id:?} is still being allocated to; call \
                 end_allocate_to_pool first"
            )));
        }
        self.private.drop_use(id);
        Ok(())
    }

    /// Use count of a private pool (0 for unknown pools).
    pub(crate) fn pool_use_count(&self, id: MempoolId) -> u32 {
        self.private.get(id).map_or(0, |p| p.use_count())
    }

    /// The heads (first blocks) of the segments of a private pool, by address.
    fn private_pool_heads(&self, id: MempoolId) -> Vec<BlockId> {
        let mut heads: Vec<(u64, BlockId)> = self
            .store
            .live_segments()
            .filter(|(_, s)| self.owner(s.pool()) == Some(id))
            .map(|(_, s)| (s.addr(), s.head()))
            .collect();
        heads.sort_unstable();
        heads.into_iter().map(|(_, h)| h).collect()
    }

    fn checkpointable(&self, id: MempoolId) -> Result<(), AllocError> {
        if self.private.is_freeable(id) {
            return Err(err("Not expected to checkpoint freeable graph"));
        }
        if self.private.get(id).is_none() {
            return Err(err("Could not find pool of id"));
        }
        Ok(())
    }

    /// spec 1.15 `getCheckpointState`.
    pub(crate) fn checkpoint<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: MempoolId,
    ) -> Result<PoolCheckpoint, AllocError> {
        self.checkpointable(id)?;
        if self.events.has_deferred() {
            self.process_events(backend)?;
        }
        let mut segments = Vec::new();
        for head in self.private_pool_heads(id) {
            let mut blocks = Vec::new();
            for b in self.store.segment_blocks(self.store.block(head).segment()) {
                let blk = self.store.block(b);
                if blk.event_count() > 0 {
                    return Err(err(
                        "Events should have synchronized when checkpointing block",
                    ));
                }
                blocks.push(BlockCheckpoint {
                    stream: blk.stream(),
                    stream_uses: blk.stream_uses().to_vec(),
                    size: blk.size(),
                    ptr: DevicePtr(blk.addr()),
                    allocated: blk.allocated(),
                    gc_count_base: blk.gc_count_base(),
                });
            }
            segments.push(SegmentCheckpoint {
                blocks,
                is_small: self.pools[self.store.block(head).pool().index()].is_small(),
            });
        }
        Ok(PoolCheckpoint {
            owner: id,
            segments,
        })
    }

    /// spec 1.15: the checks of `setCheckpointPoolState` before anything
    /// changes; the pool's segment heads.
    fn validate_checkpoint(&self, state: &PoolCheckpoint) -> Result<Vec<BlockId>, AllocError> {
        self.checkpointable(state.owner)?;
        // Validate: each checkpointed segment is a live segment of the pool
        // with the same extent, its blocks tile it, and nothing is pending.
        let heads = self.private_pool_heads(state.owner);
        for seg in &state.segments {
            let first = seg
                .blocks
                .first()
                .ok_or_else(|| err("checkpoint has an empty segment"))?;
            let head = heads
                .iter()
                .copied()
                .find(|&h| self.store.segment(self.store.block(h).segment()).addr() == first.ptr.0)
                .ok_or_else(|| err(format!(" could not find {}", first.ptr)))?;
            let s = self.store.segment(self.store.block(head).segment());
            let mut at = s.addr();
            for b in &seg.blocks {
                if b.ptr.0 != at || b.size == 0 {
                    return Err(err(format!(
                        "checkpoint block {} does not tile its segment",
                        b.ptr
                    )));
                }
                at += b.size;
            }
            // An expandable segment's checkpoint holds every block, the
            // unmapped ones too (PyTorch's PrivatePoolState walks the whole
            // block list). Unmapped blocks are never allocated and freeing
            // does not change them: each must be in the checkpoint as it is
            // now, free, and is left alone on restore.
            let covered = if s.expandable().is_some() {
                let mut total = 0;
                for b in self.store.segment_blocks(self.store.block(head).segment()) {
                    let blk = self.store.block(b);
                    total += blk.size();
                    if !blk.mapped()
                        && !seg
                            .blocks
                            .iter()
                            .any(|c| c.ptr.0 == blk.addr() && c.size == blk.size() && !c.allocated)
                    {
                        return Err(err(format!(
                            "checkpoint segment at {} does not hold its unmapped block at {:#x} ({} bytes) as it is",
                            first.ptr, blk.addr(), blk.size()
                        )));
                    }
                }
                total
            } else {
                s.size()
            };
            if at - s.addr() != covered {
                return Err(err(format!(
                    "checkpoint segment at {} covers {} bytes, the segment has {covered}",
                    first.ptr,
                    at - s.addr()
                )));
            }
        }
        for &h in &heads {
            for b in self.store.segment_blocks(self.store.block(h).segment()) {
                if self.store.block(b).event_count() > 0 {
                    return Err(err(
                        "Events should have synchronized when setting checkpointed block",
                    ));
                }
            }
        }
        Ok(heads)
    }

    /// spec 1.15 `setCheckpointPoolState`: free every allocated block of the
    /// pool, then re-create the checkpoint's blocks segment by segment. The
    /// checkpoint is validated first: a bad one changes nothing.
    pub(crate) fn restore_checkpoint<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        state: &PoolCheckpoint,
    ) -> Result<RestoreResult, AllocError> {
        let heads = self.validate_checkpoint(state)?;

        let mut rr = RestoreResult::default();
        // Free everything allocated in the pool.
        for &h in &heads {
            let seg = self.store.block(h).segment();
            let mut next = Some(self.store.segment(seg).head());
            while let Some(cur) = next {
                if self.store.block(cur).allocated() {
                    let addr = self.store.block(cur).addr();
                    rr.allocations_freed.push(DevicePtr(addr));
                    // Freeing merges free neighbours into `cur`, which stays live.
                    self.free_ptr(backend, DevicePtr(addr))?;
                }
                next = self.store.block(cur).next();
            }
        }
        // Re-create each checkpointed segment's blocks.
        for seg in &state.segments {
            let segment = self
                .store
                .live_segments()
                .find(|(_, s)| s.addr() == seg.blocks[0].ptr.0)
                .expect("validated above")
                .0;
            let mut next = Some(self.store.segment(segment).head());
            let mut created = Vec::new();
            for b in &seg.blocks {
                let cur = next.expect("validated above: the blocks tile the segment");
                if !self.store.block(cur).mapped() {
                    // An unmapped block of an expandable segment (validated
                    // above: the checkpoint's, free): left as it is, as
                    // PyTorch skips it.
                    debug_assert_eq!(self.store.block(cur).addr(), b.ptr.0);
                    debug_assert_eq!(self.store.block(cur).size(), b.size);
                    next = self.store.block(cur).next();
                    continue;
                }
                debug_assert!(!self.store.block(cur).allocated());
                self.remove_from_pool(cur);
                let split = self.store.block(cur).size() > b.size;
                let id = self.alloc_found_block_for_restore(cur, b.size, b.stream, split);
                created.push((id, b.allocated));
                next = self.store.block(id).next();
            }
            for (id, allocated) in created {
                if allocated {
                    rr.allocations_created
                        .push(DevicePtr(self.store.block(id).addr()));
                } else {
                    let addr = self.store.block(id).addr();
                    self.free_ptr(backend, DevicePtr(addr))?;
                }
            }
        }
        Ok(rr)
    }
}

impl DeviceState {
    /// The key of free block `id` in its pool: PyTorch's comparator of
    /// `BlockPool::blocks`, (stream, size, rank, address), the rank being
    /// what the release orders blocks of equal size by
    /// ([`ReleaseRules::free_block_order`](crate::config::ReleaseRules::free_block_order)),
    /// carried by the block ([`free_key_of`]).
    #[inline]
    pub(super) fn free_key(&self, id: BlockId) -> FreeKey {
        // The rank was computed when the block was made, by the rule
        // `set_free_order` gave the store (`block_rank`): nothing about
        // the release is decided here.
        free_key_of(self.store.block(id), id)
    }

    /// Replace the settings in force (PyTorch's `_set_allocator_settings`):
    /// a changed `max_split_size` is noted for the statistics (which keep
    /// the value from construction, as in PyTorch), and free blocks of
    /// equal size are ranked by the new release's order at once.
    pub(super) fn replace_config(&mut self, config: AllocatorConfig) {
        if self.config.max_split_size != config.max_split_size {
            self.acct.note_max_split_changed();
        }
        self.config = config;
        self.set_free_order();
    }

    /// Rank segments created from now on by address (`on`) or by creation,
    /// and free blocks of equal size by `seq` (see `set_free_order`).
    pub(super) fn rank_segments_by_address(&mut self, on: bool) {
        self.store.rank_segments_by_address(on);
        self.set_free_order();
    }

    /// Rank free blocks of equal size by the order of the release in
    /// `self.config` (or by `seq` under `rank_by_address`), re-keying the
    /// free blocks already cached when that order changes (a
    /// `set_config` naming another release). Called by the two events
    /// above, which change what it reads.
    fn set_free_order(&mut self) {
        let order = if self.store.ranks_by_address() {
            FreeBlockOrder::SegmentCreation
        } else {
            self.config.torch_release.rules().free_block_order
        };
        let rule = block_rank(order);
        if rule == self.store.block_rank() {
            return;
        }
        // Each block carries its rank: the store re-ranks every live block
        // by the new rule, then the cached free blocks are re-keyed.
        self.store.set_block_rank(rule);
        let store = &self.store;
        self.pools.rekey(|id| free_key_of(store.block(id), id));
    }

    /// PyTorch's `BlockPool::insert_into_blocks`: insert and reset the GC age.
    #[inline]
    pub(crate) fn insert_into_pool(&mut self, id: BlockId) {
        let b = self.store.block(id);
        self.insert_key_into_pool(b.pool(), free_key_of(b, id));
    }

    /// [`insert_into_pool`](Self::insert_into_pool) of the block `key.id`
    /// of pool `pool`, its key already read (the hot paths read the block
    /// once).
    #[inline(always)]
    pub(crate) fn insert_key_into_pool(&mut self, pool: PoolId, key: FreeKey) {
        let (inserted, gc_count) = self.pools[pool.index()].insert_into_blocks(key);
        self.store.start_gc_age(key.id, gc_count);
        debug_assert!(inserted, "block inserted twice into its pool");
    }

    #[inline(always)]
    pub(crate) fn remove_from_pool(&mut self, id: BlockId) {
        let pool = self.store.block(id).pool().index();
        let key = self.free_key(id);
        let removed = self.pools[pool].remove(&key);
        debug_assert!(removed, "block missing from its pool");
    }

    #[inline]
    pub(super) fn unmapped_key(&self, id: BlockId) -> UnmappedKey {
        let b = self.store.block(id);
        UnmappedKey {
            stream: b.stream(),
            addr: b.addr(),
            id,
        }
    }

    pub(crate) fn insert_into_unmapped(&mut self, id: BlockId) {
        let key = self.unmapped_key(id);
        let pool = self.store.block(id).pool().index();
        let inserted = self.pools[pool].insert_unmapped(key);
        debug_assert!(inserted, "unmapped block inserted twice");
    }

    pub(super) fn remove_from_unmapped(&mut self, id: BlockId) {
        let key = self.unmapped_key(id);
        let pool = self.store.block(id).pool().index();
        let removed = self.pools[pool].remove_unmapped(&key);
        debug_assert!(removed, "unmapped block missing from its set");
    }

    /// spec 1.4: the pool serving a rounded size: a private pool whose
    /// filter accepts the stream (newest first, as torch 2.9+ does), else
    /// the global small or large pool.
    #[inline]
    pub(super) fn get_pool(&self, size: u64, stream: StreamId) -> PoolId {
        let small = rules::is_small(size);
        if self.private.any_capture_underway() {
            if let Some(pool) = self.private.capture_pool(stream) {
                return if small { pool.small() } else { pool.large() };
            }
        }
        if small {
            POOL_SMALL
        } else {
            POOL_LARGE
        }
    }

    /// Does any live segment belong to one of these pools?
    pub(super) fn owns_segments(&self, small: PoolId, large: PoolId) -> bool {
        self.store
            .live_segments()
            .any(|(_, s)| s.pool() == small || s.pool() == large)
    }

    /// The private pool that owns a pool slot, if any.
    #[inline]
    pub(crate) fn owner(&self, pool: PoolId) -> Option<MempoolId> {
        self.pools[pool.index()].owner()
    }
}

/// The key of free block `id` (read as `b`) in its pool: see
/// [`DeviceState::free_key`].
#[inline(always)]
pub(super) fn free_key_of(b: &Block, id: BlockId) -> FreeKey {
    FreeKey::new(b.stream(), b.size(), b.rank(), b.addr(), id)
}
