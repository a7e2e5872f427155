//! The free-list owners: a pool's free and unmapped blocks ordered as
//! PyTorch's `BlockPool` orders them, and the private pools. The operations
//! that move blocks between pools are in `pools.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::StreamId;
use crate::caching::stream_order::MempoolSet;
use crate::config::FreeBlockOrder;
use crate::ids::MempoolId;
use crate::pluggable::PluggableAllocator;
use crate::store::{
    BlockId, BlockRank, Cursor, FreeList, PoolId, RankedKey, SizeClassList, SizeClassed, Slot,
};

/// The global large pool (free blocks above 1 MiB).
pub(crate) const POOL_LARGE: PoolId = PoolId::new(0);
/// The global small pool (free blocks of at most 1 MiB).
pub(crate) const POOL_SMALL: PoolId = PoolId::new(1);

/// Ordering key of free blocks: (stream, size, rank, address), the order of
/// PyTorch's comparator of `BlockPool::blocks`. The rank breaks ties among
/// blocks of equal size and is what changed between releases: the
/// segment's creation number since torch 2.13
/// (`BlockComparatorSizeCounterAddress`: the oldest segment first, which is
/// what the oracle showed before the comparator was read, see README "Spec
/// errors found"), the block's creation number in 2.12, the segment's
/// address in 2.11 (`DeviceState::free_key`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKey {
    pub stream: StreamId,
    pub size: u64,
    /// What breaks ties among blocks of equal size (see `DeviceState::free_key`).
    rank: u64,
    /// Address within the segment order: ascending.
    addr: u64,
    pub id: BlockId,
}

impl FreeKey {
    /// The key of a free block.
    #[inline]
    pub fn new(stream: StreamId, size: u64, rank: u64, addr: u64, id: BlockId) -> FreeKey {
        FreeKey {
            stream,
            size,
            rank,
            addr,
            id,
        }
    }

    /// The smallest key of `(stream, size)`: a lower bound for best fit.
    #[inline]
    pub fn search(stream: StreamId, size: u64) -> FreeKey {
        FreeKey {
            stream,
            size,
            rank: 0,
            addr: 0,
            id: BlockId::FIRST,
        }
    }

    /// The block's address.
    #[allow(dead_code)]
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

/// What a block's rank is under a release's free-block order (see
/// `DeviceState::free_key`): 2.13 and later rank by the segment's counter
/// (the segment's address under `rank_by_address`, which sets `seq` to
/// it); 2.11 by the segment's address (segments do not overlap, so
/// (segment address, address) is the address order); 2.12 by the block's
/// `registration_counter`.
pub(crate) fn block_rank(order: FreeBlockOrder) -> BlockRank {
    match order {
        FreeBlockOrder::SegmentCreation => BlockRank::SegmentSeq,
        FreeBlockOrder::Address => BlockRank::SegmentAddress,
        FreeBlockOrder::BlockCreation => BlockRank::Registration,
    }
}

/// A [`FreeKey`] without its stream: what a stream's size classes store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKeyInStream {
    size: u64,
    rank: u64,
    addr: u64,
    id: BlockId,
}

impl RankedKey for FreeKeyInStream {
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline]
    fn rank(&self) -> u64 {
        self.rank
    }
}

impl SizeClassed for FreeKey {
    type Inner = FreeKeyInStream;
    #[inline]
    fn group(&self) -> u64 {
        self.stream.0
    }
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline]
    fn inner(&self) -> FreeKeyInStream {
        FreeKeyInStream {
            size: self.size,
            rank: self.rank,
            addr: self.addr,
            id: self.id,
        }
    }
    #[inline]
    fn join(group: u64, k: FreeKeyInStream) -> FreeKey {
        FreeKey {
            stream: StreamId(group),
            size: k.size,
            rank: k.rank,
            addr: k.addr,
            id: k.id,
        }
    }
}

/// Ordering key of unmapped blocks: (stream, address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct UnmappedKey {
    pub stream: StreamId,
    pub addr: u64,
    pub id: BlockId,
}

/// Every pool's free lists: PyTorch's `large_blocks`, `small_blocks` and the
/// private pools' `BlockPool`s, as one owner.
///
/// Slots: [`POOL_LARGE`], [`POOL_SMALL`], then the slots of private pools
/// (see `caching/pools.rs`); read and changed per slot (`pools[slot]`), a
/// slot added only by [`Pools::add_slot`].
///
/// Invariant: every [`FreeKey`] in every slot carries its block's rank as
/// the store holds it (`DeviceState::free_key`); when the store's rule
/// changes, [`Pools::rekey`] builds them all again, so no key of another
/// rule is left.
pub(crate) struct Pools {
    slots: Vec<BlockPool>,
}

impl Pools {
    /// The global large and small pools.
    pub fn new() -> Pools {
        Pools {
            slots: vec![BlockPool::new(false, None), BlockPool::new(true, None)],
        }
    }

    /// A new slot at the end, for a private pool's small or large blocks.
    pub fn add_slot(&mut self, pool: BlockPool) -> PoolId {
        self.slots.push(pool);
        PoolId::new((self.slots.len() - 1) as u32)
    }

    /// Every cached free block taken out and put back under `key_of` (its
    /// key under the store's new rank rule). Re-keyed, not freed again: the
    /// GC age goes on.
    pub fn rekey(&mut self, mut key_of: impl FnMut(BlockId) -> FreeKey) {
        let cached: Vec<(usize, FreeKey)> = (self.slots.iter().enumerate())
            .flat_map(|(pool, p)| p.iter().map(move |key| (pool, key)))
            .collect();
        for (pool, key) in &cached {
            let removed = self.slots[*pool].remove(key);
            debug_assert!(removed, "block missing from its pool");
        }
        for (pool, old) in cached {
            self.slots[pool].insert(key_of(old.id));
        }
    }
}

impl std::ops::Deref for Pools {
    type Target = [BlockPool];
    #[inline]
    fn deref(&self) -> &[BlockPool] {
        &self.slots
    }
}

impl std::ops::DerefMut for Pools {
    #[inline]
    fn deref_mut(&mut self) -> &mut [BlockPool] {
        &mut self.slots
    }
}

/// Free blocks of one kind (PyTorch's `BlockPool`).
///
/// Invariant (kept with the callers in `caching/pools.rs`, which compute
/// the keys from the blocks): a free mapped block is in exactly one pool's
/// `blocks`, under the [`FreeKey`] of its current stream, size and address;
/// an unmapped block (only of expandable segments) is in its pool's
/// `unmapped` under its [`UnmappedKey`]; a block whose key fields change is
/// removed first and inserted again after.
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    /// Free, mapped blocks in (stream, size, address) order, indexed by
    /// stream and size class.
    blocks: SizeClassList<FreeKey>,
    /// Unmapped blocks of expandable segments in (stream, address) order.
    unmapped: FreeList<UnmappedKey>,
    /// Small pool (blocks of at most 1 MiB)?
    is_small: bool,
    /// The private pool this belongs to (None for the global pools and for
    /// the slots of erased private pools).
    owner: Option<MempoolId>,
    /// Free-block searches so far: the garbage collector's clock.
    get_free_blocks_call_count: i64,
    /// Blocks are handed out whole, never split (a private pool of
    /// `MemPool(no_split=True)`, PyTorch's `no_split_pools`).
    no_split: bool,
}

/// Where [`BlockPool::lower_bound`] found a free block, for
/// [`BlockPool::erase`].
pub(crate) type Found = (FreeKey, Slot);

impl BlockPool {
    /// An empty pool of small or large blocks, of a private pool or global.
    pub fn new(is_small: bool, owner: Option<MempoolId>) -> BlockPool {
        BlockPool {
            blocks: SizeClassList::default(),
            unmapped: FreeList::default(),
            is_small,
            owner,
            get_free_blocks_call_count: 0,
            no_split: false,
        }
    }

    /// Blocks of this pool are never split (`MemPool(no_split=True)`).
    #[inline]
    pub fn no_split(&self) -> bool {
        self.no_split
    }

    /// Hand this pool's blocks out whole from now on.
    pub fn set_no_split(&mut self) {
        self.no_split = true;
    }

    /// Small pool (blocks of at most 1 MiB)?
    #[inline]
    pub fn is_small(&self) -> bool {
        self.is_small
    }

    /// The private pool this belongs to (None for the global pools).
    #[inline]
    pub fn owner(&self) -> Option<MempoolId> {
        self.owner
    }

    /// The private pool owning this slot was erased: the slot waits for
    /// reuse, owned by none.
    pub fn disown(&mut self) {
        self.owner = None;
        self.no_split = false;
    }

    /// The garbage collector's clock: free-block searches so far (PyTorch's
    /// `get_free_blocks_call_count`).
    #[inline]
    pub fn gc_clock(&self) -> i64 {
        self.get_free_blocks_call_count
    }

    /// spec 1.6, the start of PyTorch's `get_free_block`: count the search
    /// on the GC clock when garbage collection tracks reuse (`track_reuse`),
    /// then `blocks.lower_bound(search_key)`: the first free block at or
    /// after (`stream`, `size`), or `None` at the end or when it is on
    /// another stream. Take it with [`erase`](Self::erase).
    #[inline]
    pub fn lower_bound(&mut self, stream: StreamId, size: u64, track_reuse: bool) -> Option<Found> {
        if track_reuse {
            // Track block reuse interval only when garbage collection is enabled.
            self.get_free_blocks_call_count += 1;
        }
        let found = self.blocks.first_from(&FreeKey::search(stream, size))?;
        (found.0.stream == stream).then_some(found)
    }

    /// Take the free block `key` out of the pool, found at `slot` by
    /// [`lower_bound`](Self::lower_bound) (or anywhere after it on the same
    /// search: it is then searched for). False if it was not there.
    #[inline]
    pub fn erase(&mut self, slot: Slot, key: &FreeKey) -> bool {
        self.blocks.remove_at(slot, key)
    }

    /// PyTorch's `insert_into_blocks`: a free block, under its current
    /// `key`, into the pool, its GC age starting now: returns false if it
    /// was there already, and the count the block's age starts from (for
    /// [`BlockStore::start_gc_age`](crate::store::BlockStore::start_gc_age)).
    #[inline]
    pub fn insert_into_blocks(&mut self, key: FreeKey) -> (bool, i64) {
        (self.blocks.insert(key), self.get_free_blocks_call_count)
    }

    /// A free block back into the pool under a new key, its GC age going
    /// on (re-keyed, not freed again). False if it was there already.
    #[inline]
    pub fn insert(&mut self, key: FreeKey) -> bool {
        self.blocks.insert(key)
    }

    /// Take a free block out of the pool by its current key; false if it
    /// was not there.
    #[inline]
    pub fn remove(&mut self, key: &FreeKey) -> bool {
        self.blocks.remove(key)
    }

    /// Is the free block of this key in the pool?
    #[inline]
    pub fn contains(&self, key: &FreeKey) -> bool {
        self.blocks.contains(key)
    }

    /// The free blocks at or after `key`, in (stream, size, address) order
    /// (a best-fit search).
    #[inline]
    pub fn from(&self, key: &FreeKey) -> Cursor<'_, FreeKey> {
        self.blocks.from(key)
    }

    /// The free blocks strictly before `key`, in descending order.
    #[inline]
    pub fn before(&self, key: &FreeKey) -> Cursor<'_, FreeKey> {
        self.blocks.before(key)
    }

    /// Every free block, in (stream, size, address) order.
    #[inline]
    pub fn iter(&self) -> Cursor<'_, FreeKey> {
        self.blocks.iter()
    }

    /// Number of free (mapped) blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// An unmapped block of an expandable segment into the pool's unmapped
    /// set; false if it was there already.
    #[inline]
    pub fn insert_unmapped(&mut self, key: UnmappedKey) -> bool {
        self.unmapped.insert(key)
    }

    /// Take an unmapped block out of the unmapped set; false if it was not
    /// there.
    #[inline]
    pub fn remove_unmapped(&mut self, key: &UnmappedKey) -> bool {
        self.unmapped.remove(key)
    }

    /// Is the unmapped block of this key in the unmapped set?
    pub fn contains_unmapped(&self, key: &UnmappedKey) -> bool {
        self.unmapped.contains(key)
    }

    /// The unmapped blocks of `stream`, by address.
    #[inline]
    pub fn unmapped_of(&self, stream: StreamId) -> impl Iterator<Item = &UnmappedKey> + '_ {
        let from = UnmappedKey {
            stream,
            addr: 0,
            id: BlockId::FIRST,
        };
        self.unmapped
            .range(from..)
            .take_while(move |k| k.stream == stream)
    }

    /// Number of unmapped blocks.
    pub fn unmapped_len(&self) -> usize {
        self.unmapped.len()
    }
}

/// Decides whether an allocation on a stream goes to a private pool
/// (PyTorch's capture filter). See [`PoolFilter`](crate::caching::PoolFilter).
pub(crate) type FilterFn = Arc<dyn Fn(StreamId) -> bool + Send + Sync>;

/// A private memory pool (PyTorch's `PrivatePool`, CUDA-graph style).
pub(crate) struct PrivatePool {
    /// Users (captures, MemPools) still holding the pool; at 0 it is freeable.
    use_count: u32,
    /// Driver allocations (and expandable allocations) not given back yet.
    cuda_malloc_count: u32,
    /// The pool's large-block pool.
    large: PoolId,
    /// The pool's small-block pool.
    small: PoolId,
    /// Where the pool's segments come from when not from the backend
    /// (`MemPool(allocator=...)`, PyTorch's `PrivatePool::allocator_`): its
    /// `alloc` for a new segment, its `free` to give one back.
    allocator: Option<Arc<PluggableAllocator>>,
}

impl PrivatePool {
    /// Users (captures, MemPools) still holding the pool.
    #[inline]
    pub fn use_count(&self) -> u32 {
        self.use_count
    }

    /// Driver allocations (and expandable allocations) not given back yet.
    #[inline]
    pub fn cuda_malloc_count(&self) -> u32 {
        self.cuda_malloc_count
    }

    /// The pool's large-block pool slot.
    #[inline]
    pub fn large(&self) -> PoolId {
        self.large
    }

    /// The pool's small-block pool slot.
    #[inline]
    pub fn small(&self) -> PoolId {
        self.small
    }

    /// The pool's own segment allocator, if it has one.
    #[inline]
    pub fn allocator(&self) -> Option<&Arc<PluggableAllocator>> {
        self.allocator.as_ref()
    }
}

/// The private pools of one device (PyTorch's `graph_pools` and friends).
#[derive(Default)]
pub(crate) struct PrivatePools {
    /// Private pools by id (PyTorch's `graph_pools`). Invariant: each owns
    /// two slots of `DeviceState::pools` (small and large) whose `owner` is
    /// its id; a pool stays while it owns a segment.
    graph_pools: BTreeMap<MempoolId, PrivatePool>,
    /// Private pools whose use count reached 0 (`graph_pools_freeable`).
    /// Invariant: a subset of `graph_pools`' keys.
    graph_pools_freeable: MempoolSet,
    /// Pools being allocated to, with their filters (`captures_underway`),
    /// oldest first. Invariant: ids are distinct keys of `graph_pools`.
    captures_underway: Vec<(MempoolId, FilterFn)>,
    /// Pool slots of erased private pools, for reuse (their `owner` is None).
    free_pool_slots: Vec<PoolId>,
    /// Pools whose free blocks an allocation outside every private pool
    /// may take before it runs out of memory (PyTorch's `use_on_oom_pools`,
    /// `MemPool(use_on_oom=True)`), in the order they were marked.
    /// Invariant: distinct keys of `graph_pools`.
    use_on_oom: Vec<MempoolId>,
}

impl PrivatePools {
    /// Is any pool being allocated to (`!captures_underway.empty()`)?
    #[inline]
    pub fn any_capture_underway(&self) -> bool {
        !self.captures_underway.is_empty()
    }

    /// spec 1.4: the private pool an allocation on `stream` goes to: the
    /// newest capture whose filter accepts the stream (as torch 2.9+ does).
    #[inline]
    pub fn capture_pool(&self, stream: StreamId) -> Option<&PrivatePool> {
        self.captures_underway
            .iter()
            .rev()
            .find(|(_, filter)| filter(stream))
            .map(|(id, _)| &self.graph_pools[id])
    }

    /// Is the pool `id` being allocated to?
    pub fn is_capturing_to(&self, id: MempoolId) -> bool {
        self.captures_underway.iter().any(|(c, _)| *c == id)
    }

    /// The private pool `id`, if it exists.
    #[inline]
    pub fn get(&self, id: MempoolId) -> Option<&PrivatePool> {
        self.graph_pools.get(&id)
    }

    /// Was the pool `id` released by all its users (waiting to be freed)?
    pub fn is_freeable(&self, id: MempoolId) -> bool {
        self.graph_pools_freeable.contains(&id)
    }

    /// The freeable pools, in `graph_pools_freeable`'s hash-map order.
    pub fn freeable(&self) -> Vec<MempoolId> {
        self.graph_pools_freeable.iter().collect()
    }

    /// A slot of an erased private pool, for reuse.
    pub fn take_free_slot(&mut self) -> Option<PoolId> {
        self.free_pool_slots.pop()
    }

    /// A new private pool `id` with its two pool slots, used once. `id` is
    /// not a pool yet.
    pub fn create(&mut self, id: MempoolId, small: PoolId, large: PoolId) {
        let old = self.graph_pools.insert(
            id,
            PrivatePool {
                use_count: 1,
                cuda_malloc_count: 0,
                large,
                small,
                allocator: None,
            },
        );
        debug_assert!(old.is_none(), "private pool {id:?} created twice");
    }

    /// One more user of the existing pool `id`; false if there is none.
    pub fn add_use(&mut self, id: MempoolId) -> bool {
        match self.graph_pools.get_mut(&id) {
            Some(p) => {
                p.use_count += 1;
                true
            }
            None => false,
        }
    }

    /// One user less of the pool `id` (which has one); at zero it becomes
    /// freeable.
    pub fn drop_use(&mut self, id: MempoolId) {
        let p = self.graph_pools.get_mut(&id).expect("a private pool");
        debug_assert!(p.use_count > 0, "private pool {id:?} has no user");
        p.use_count -= 1;
        if p.use_count == 0 {
            self.graph_pools_freeable.insert(id);
        }
    }

    /// Start allocating to the existing pool `id` (not being allocated to)
    /// for the allocations `filter` accepts.
    pub fn begin_capture(&mut self, id: MempoolId, filter: FilterFn) {
        debug_assert!(self.graph_pools.contains_key(&id) && !self.is_capturing_to(id));
        self.captures_underway.push((id, filter));
    }

    /// Stop allocating to the pool `id`; false if it was not being
    /// allocated to.
    pub fn end_capture(&mut self, id: MempoolId) -> bool {
        match self.captures_underway.iter().position(|(c, _)| *c == id) {
            Some(i) => {
                self.captures_underway.remove(i);
                true
            }
            None => false,
        }
    }

    /// Count a driver allocation (`up`) or free of the pool `id`.
    pub fn count_malloc(&mut self, id: MempoolId, up: bool) {
        let p = self.graph_pools.get_mut(&id).expect("owner pool exists");
        if up {
            p.cuda_malloc_count += 1;
        } else {
            p.cuda_malloc_count = p.cuda_malloc_count.saturating_sub(1);
        }
    }

    /// Give the existing pool `id` its own segment allocator.
    pub fn set_allocator(&mut self, id: MempoolId, allocator: Arc<PluggableAllocator>) {
        let p = self.graph_pools.get_mut(&id).expect("a private pool");
        p.allocator = Some(allocator);
    }

    /// Mark (`on`) or unmark the existing pool `id` as one whose free
    /// blocks serve allocations that would otherwise run out of memory.
    pub fn set_use_on_oom(&mut self, id: MempoolId, on: bool) {
        self.use_on_oom.retain(|p| *p != id);
        if on {
            debug_assert!(self.graph_pools.contains_key(&id));
            self.use_on_oom.push(id);
        }
    }

    /// The pools marked use-on-OOM, in the order they were marked.
    pub fn use_on_oom(&self) -> &[MempoolId] {
        &self.use_on_oom
    }

    /// Erase the pool `id`, if it exists; its two slots wait for reuse.
    /// Returns them: the caller disowns them
    /// ([`BlockPool::disown`]).
    pub fn erase(&mut self, id: MempoolId) -> Option<[PoolId; 2]> {
        self.graph_pools_freeable.remove(&id);
        self.use_on_oom.retain(|p| *p != id);
        let p = self.graph_pools.remove(&id)?;
        let slots = [p.small, p.large];
        self.free_pool_slots.extend(slots);
        Some(slots)
    }
}
