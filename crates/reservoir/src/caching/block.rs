//! Blocks, segments and pools: the data the caching allocator works on.
//!
//! Blocks live in a slab and refer to each other by [`BlockId`]; policy code
//! never holds a reference across an operation, so splitting and merging are
//! index updates, and no operation allocates once the slab is warm.

use std::collections::BTreeSet;

use crate::backend::StreamId;

/// Index of a block in the slab.
pub(crate) type BlockId = u32;

/// Index of a segment in the segment slab.
pub(crate) type SegmentId = u32;

/// Index of a pool ([`POOL_LARGE`], [`POOL_SMALL`], then private pools).
pub(crate) type PoolId = u32;

/// "No block".
pub(crate) const NIL: BlockId = u32::MAX;

/// The global large pool (free blocks above 1 MiB).
pub(crate) const POOL_LARGE: PoolId = 0;
/// The global small pool (free blocks of at most 1 MiB).
pub(crate) const POOL_SMALL: PoolId = 1;

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

/// The virtual-memory side of an expandable segment (PyTorch's
/// `ExpandableSegment`): a reserved range mapped page by page.
#[derive(Clone, Debug)]
pub(crate) struct Expandable {
    /// The reserved range.
    pub reservation: crate::backend::Reservation,
    /// Page size: 2 MiB for the small pool, `large_segment_size` for the large.
    pub page_size: u64,
    /// Which pages are mapped, trimmed after the last mapped page.
    /// Invariant: runs of mapped blocks cover exactly the mapped pages.
    pub pages: Vec<bool>,
}

/// One driver allocation (PyTorch's segment), or one expandable segment's
/// whole reserved range (its blocks tile the range, mapped or not).
#[derive(Clone, Debug)]
pub(crate) struct Segment {
    /// First address.
    pub addr: u64,
    /// Creation order (never reused): orders free blocks of equal size
    /// across segments, see [`FreeKey`].
    pub seq: u64,
    /// Bytes obtained from the driver (the reserved range if expandable).
    pub size: u64,
    /// The mapping state, for expandable segments.
    pub expandable: Option<Box<Expandable>>,
    /// Stream the segment serves.
    pub stream: StreamId,
    /// Pool of its blocks.
    pub pool: PoolId,
    /// The block at `addr`.
    pub head: BlockId,
    /// The slot holds a live segment.
    pub live: bool,
}

/// Ordering key of free blocks: (stream, size, address), the order of
/// PyTorch's `BlockComparatorSize`, except that among blocks of equal size
/// the *highest* address comes first: that is what torch 2.15 does (measured
/// on the oracle, see README "Spec errors found"), although its source
/// compares addresses ascending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKey {
    pub stream: StreamId,
    pub size: u64,
    /// `!segment_base`: segments in descending address order.
    rank: u64,
    /// Address within the segment order: ascending.
    addr: u64,
    pub id: BlockId,
}

impl FreeKey {
    /// The key of a free block.
    #[inline]
    pub fn new(stream: StreamId, size: u64, segment_base: u64, addr: u64, id: BlockId) -> FreeKey {
        FreeKey {
            stream,
            size,
            rank: segment_base,
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
            id: 0,
        }
    }

    /// The block's address.
    #[allow(dead_code)]
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

/// Ordering key of unmapped blocks: (stream, address).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct UnmappedKey {
    pub stream: StreamId,
    pub addr: u64,
    pub id: BlockId,
}

/// Free blocks of one kind (PyTorch's `BlockPool`).
#[derive(Clone, Debug)]
pub(crate) struct BlockPool {
    /// Free, mapped blocks in (stream, size, address) order.
    pub blocks: BTreeSet<FreeKey>,
    /// Unmapped blocks of expandable segments in (stream, address) order.
    pub unmapped: BTreeSet<UnmappedKey>,
    /// Small pool (blocks of at most 1 MiB)?
    pub is_small: bool,
    /// The private pool this belongs to (None for the global pools).
    pub owner: Option<crate::ids::MempoolId>,
    /// Free-block searches so far: the garbage collector's clock.
    pub get_free_blocks_call_count: i64,
}

impl BlockPool {
    pub fn new(is_small: bool, owner: Option<crate::ids::MempoolId>) -> BlockPool {
        BlockPool {
            blocks: BTreeSet::new(),
            unmapped: BTreeSet::new(),
            is_small,
            owner,
            get_free_blocks_call_count: 0,
        }
    }
}

/// A slab of values addressed by `u32` ids, reusing freed slots.
#[derive(Clone, Debug)]
pub(crate) struct Slab<T> {
    pub items: Vec<T>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Store `value`, returning its id.
    #[inline]
    pub fn insert(&mut self, value: T) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = value;
                id
            }
            None => {
                self.items.push(value);
                (self.items.len() - 1) as u32
            }
        }
    }

    /// Mark `id` reusable. The caller clears the value's `live` flag.
    #[inline]
    pub fn remove(&mut self, id: u32) {
        self.free.push(id);
    }

    /// Number of live values.
    pub fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, id: u32) -> &T {
        &self.items[id as usize]
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, id: u32) -> &mut T {
        &mut self.items[id as usize]
    }
}
