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
    pub addr: u64,
    /// Bytes (rounded). Invariant: the blocks of a segment tile it exactly.
    pub size: u64,
    /// Bytes the caller asked for when the block was last handed out. Never
    /// cleared on free (PyTorch keeps the stale value; snapshots show it).
    pub requested_size: u64,
    /// The allocation stream; every block of a segment has the segment's stream.
    pub stream: StreamId,
    /// The pool the block returns to when free.
    pub pool: PoolId,
    /// The segment the block belongs to.
    pub segment: SegmentId,
    /// Neighbour at lower address in the same segment, or [`NIL`].
    pub prev: BlockId,
    /// Neighbour at higher address in the same segment, or [`NIL`].
    pub next: BlockId,
    /// Handed out to a caller. Invariant: allocated blocks are in the
    /// pointer map, free blocks with no pending events are in their pool.
    pub allocated: bool,
    /// Backed by physical memory (always true outside expandable segments).
    /// Unmapped blocks live in their pool's `unmapped` set, never in `blocks`.
    pub mapped: bool,
    /// Part of an expandable segment.
    pub expandable: bool,
    /// Outstanding cross-stream events. Invariant: > 0 only while the block
    /// is neither allocated nor in a pool (PyTorch's `active_pending_free`).
    pub event_count: u32,
    /// Streams other than `stream` that used the block (`record_stream`).
    pub stream_uses: Vec<StreamId>,
    /// The pool's free-block search count when the block was (re)inserted.
    pub gc_count_base: i64,
    /// When the block record was made, counting every block the store has
    /// made (PyTorch 2.12's per-`Block` `registration_counter`; see
    /// [`BlockStore::new_block`](super::BlockStore::new_block)).
    pub registration: u64,
    /// The slot holds a live block (false on the slab's free list).
    /// (Stacks recorded for blocks live in side tables, see `history.rs`.)
    pub live: bool,
}

impl Block {
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
    pub addr: u64,
    /// Rank among segments: orders free blocks of equal size across
    /// segments (the caching allocator's `FreeKey`). Never reused.
    pub seq: u64,
    /// Bytes obtained from the driver (the reserved range if expandable).
    pub size: u64,
    /// The mapping state, for expandable segments.
    pub expandable: Option<Box<super::Expandable>>,
    /// Stream the segment serves.
    pub stream: StreamId,
    /// Pool of its blocks.
    pub pool: PoolId,
    /// The block at `addr`. Invariant: its `prev` is [`NIL`].
    pub head: BlockId,
    /// The slot holds a live segment.
    pub live: bool,
}
