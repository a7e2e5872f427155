//! Blocks and segments: the records the store links, splits and merges.

use crate::ids::StreamId;

/// Index of a block in the block slab.
pub(crate) type BlockId = u32;

/// Index of a segment in the segment slab.
pub(crate) type SegmentId = u32;

/// Index of the free list set (pool) a block returns to when free. The
/// store only carries it; its owner numbers the pools.
pub(crate) type PoolId = u32;

/// "No block".
pub(crate) const NIL: BlockId = u32::MAX;

/// A piece of a segment, free or allocated (PyTorch's `Block`).
#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// First byte. Invariant: `addr == prev.addr + prev.size` when `prev != NIL`.
    pub(super) addr: u64,
    /// Bytes (rounded). Invariant: the blocks of a segment tile it exactly.
    pub(super) size: u64,
    /// Bytes the caller asked for when the block was last handed out. Never
    /// cleared on free (PyTorch keeps the stale value; snapshots show it).
    pub(super) requested_size: u64,
    /// The allocation stream; every block of a segment has the segment's stream.
    pub(super) stream: StreamId,
    /// The pool the block returns to when free.
    pub(super) pool: PoolId,
    /// The segment the block belongs to.
    pub(super) segment: SegmentId,
    /// Neighbour at lower address in the same segment, or [`NIL`].
    pub(super) prev: BlockId,
    /// Neighbour at higher address in the same segment, or [`NIL`].
    pub(super) next: BlockId,
    /// Handed out to a caller. Invariant: allocated blocks are in the
    /// pointer map, free blocks with no pending events are in their pool.
    pub(super) allocated: bool,
    /// Backed by physical memory (always true outside expandable segments).
    /// Unmapped blocks live in their pool's `unmapped` set, never in `blocks`.
    pub(super) mapped: bool,
    /// Part of an expandable segment.
    pub(super) expandable: bool,
    /// Outstanding cross-stream events. Invariant: > 0 only while the block
    /// is neither allocated nor in a pool (PyTorch's `active_pending_free`).
    pub(super) event_count: u32,
    /// Streams other than `stream` that used the block (`record_stream`).
    pub(super) stream_uses: Vec<StreamId>,
    /// The pool's free-block search count when the block was (re)inserted.
    pub(super) gc_count_base: i64,
    /// When the block record was made, counting every block the store has
    /// made (PyTorch 2.12's per-`Block` `registration_counter`; see
    /// [`BlockStore::new_block`](super::BlockStore::new_block)).
    pub(super) registration: u64,
    /// What orders this block among free blocks of equal size, by the
    /// store's [`BlockRank`](super::BlockRank) rule: computed when the
    /// block is made (and for every block when the rule changes), never
    /// per call. Invariant: equals the rule's value for this block.
    pub(super) rank: u64,
    /// The slot holds a live block (false on the slab's free list).
    /// (Stacks recorded for blocks live in side tables, see `history.rs`.)
    pub(super) live: bool,
}

impl Block {
    /// First byte.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes (rounded).
    #[inline]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes the caller asked for when the block was last handed out (stale once free).
    #[inline]
    pub fn requested_size(&self) -> u64 {
        self.requested_size
    }

    /// The allocation stream.
    #[inline]
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The pool the block returns to when free.
    #[inline]
    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// The segment the block belongs to.
    #[inline]
    pub fn segment(&self) -> SegmentId {
        self.segment
    }

    /// Neighbour at lower address, or [`NIL`].
    #[inline]
    pub fn prev(&self) -> BlockId {
        self.prev
    }

    /// Neighbour at higher address, or [`NIL`].
    #[inline]
    pub fn next(&self) -> BlockId {
        self.next
    }

    /// Handed out to a caller.
    #[inline]
    pub fn allocated(&self) -> bool {
        self.allocated
    }

    /// Backed by physical memory.
    #[inline]
    pub fn mapped(&self) -> bool {
        self.mapped
    }

    /// Part of an expandable segment.
    #[inline]
    pub fn expandable(&self) -> bool {
        self.expandable
    }

    /// Outstanding cross-stream events.
    #[inline]
    pub fn event_count(&self) -> u32 {
        self.event_count
    }

    /// The pool's free-block search count when the block entered it.
    #[inline]
    pub fn gc_count_base(&self) -> i64 {
        self.gc_count_base
    }

    /// What orders this block among free blocks of equal size (see
    /// [`BlockStore::set_block_rank`](super::BlockStore::set_block_rank)).
    #[inline]
    pub fn rank(&self) -> u64 {
        self.rank
    }

    /// The slot holds a live block.
    #[inline]
    pub fn live(&self) -> bool {
        self.live
    }

    /// Streams other than [`stream`](Self::stream) that used the block (`record_stream`).
    #[inline]
    pub fn stream_uses(&self) -> &[StreamId] {
        &self.stream_uses
    }

    /// True when the block shares its segment with other blocks.
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// One driver allocation (PyTorch's segment), or one expandable segment's
/// whole reserved range (its blocks tile the range, mapped or not).
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// First address.
    pub(super) addr: u64,
    /// Rank among segments: orders free blocks of equal size across
    /// segments (the caching allocator's `FreeKey`). Never reused.
    pub(super) seq: u64,
    /// Bytes obtained from the driver (the reserved range if expandable).
    pub(super) size: u64,
    /// The mapping state, for expandable segments.
    pub(super) expandable: Option<Box<super::Expandable>>,
    /// Stream the segment serves.
    pub(super) stream: StreamId,
    /// Pool of its blocks.
    pub(super) pool: PoolId,
    /// The block at `addr`. Invariant: its `prev` is [`NIL`].
    pub(super) head: BlockId,
    /// The slot holds a live segment.
    pub(super) live: bool,
}

impl Segment {
    /// First address.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Rank among segments (the caching allocator's `FreeKey`).
    #[inline]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Bytes obtained from the driver (the reserved range if expandable).
    #[inline]
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Stream the segment serves.
    #[inline]
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// Pool of its blocks.
    #[inline]
    pub fn pool(&self) -> PoolId {
        self.pool
    }

    /// The block at [`addr`](Self::addr).
    #[inline]
    pub fn head(&self) -> BlockId {
        self.head
    }

    /// The slot holds a live segment.
    #[inline]
    pub fn live(&self) -> bool {
        self.live
    }

    /// The mapping state, for expandable segments.
    #[inline]
    pub fn expandable(&self) -> Option<&super::Expandable> {
        self.expandable.as_deref()
    }
}
