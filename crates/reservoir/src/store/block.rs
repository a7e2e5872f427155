//! Blocks and segments: the records the store links, splits and merges.

use crate::ids::StreamId;

use std::fmt;
use std::hash::{Hash, Hasher};
use std::num::NonZeroU32;

/// A block: its slot in the block slab. Only the store's slab makes one.
/// It holds the slab's slot number, which is never 0 (the slab's slot 0 is
/// a placeholder), so `Option<BlockId>` is four bytes, "no block" costs no
/// sentinel and indexing costs no arithmetic. Ids order as their slots;
/// they hash and print as their [`index`](BlockId::index) (the slot
/// counted from 0, as bare `u32` ids were, so side tables keep their
/// order).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(transparent)]
pub(crate) struct BlockId(NonZeroU32);

/// A segment: its slot in the segment slab. Only the store's slab makes one
/// (held as [`BlockId`] is); ids order as their slots, hash and print as
/// their [`index`](SegmentId::index).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(transparent)]
pub(crate) struct SegmentId(NonZeroU32);

const _: () = assert!(std::mem::size_of::<Option<BlockId>>() == 4);
const _: () = assert!(std::mem::size_of::<Option<SegmentId>>() == 4);

/// The slab ids: made from a slot number, read back as one, by the store's
/// slab alone (the trait is not exported from the store).
pub(crate) trait SlabId: Copy {
    /// The id of slot `slot` (`0 < slot`; slot 0 is the slab's placeholder).
    fn from_slot(slot: u32) -> Self;
    /// The slot this id names (never 0).
    fn slot(self) -> usize;
}

/// What a slab keeps in its placeholder slot 0, which no id names.
pub(crate) trait Placeholder {
    /// A dead record.
    fn placeholder() -> Self;
}

macro_rules! slab_id {
    ($t:ident) => {
        impl SlabId for $t {
            #[inline]
            fn from_slot(slot: u32) -> Self {
                match NonZeroU32::new(slot) {
                    Some(n) => $t(n),
                    None => panic!("slot 0 is the slab's placeholder"),
                }
            }
            #[inline]
            fn slot(self) -> usize {
                self.0.get() as usize
            }
        }

        impl $t {
            /// The lowest id (index 0): a lower bound for ordered keys.
            #[allow(dead_code)]
            pub(crate) const FIRST: $t = $t(NonZeroU32::MIN);

            /// The id of index `index`, for tests of side tables keyed by id.
            #[cfg(test)]
            #[allow(dead_code)]
            pub(crate) fn for_test(index: u32) -> $t {
                <$t as SlabId>::from_slot(index + 1)
            }

            /// The id counted from 0 (its slot less the placeholder), for
            /// messages and hashing: the store's alone.
            #[inline]
            pub(super) fn index(self) -> u32 {
                self.0.get() - 1
            }
        }

        impl Hash for $t {
            #[inline]
            fn hash<H: Hasher>(&self, state: &mut H) {
                self.index().hash(state);
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($t), self.index())
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.index())
            }
        }
    };
}

slab_id!(BlockId);
slab_id!(SegmentId);

/// The free list set (pool) a block returns to when free. The store only
/// carries it; its owner numbers the pools ([`PoolId::new`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub(crate) struct PoolId(u32);

impl PoolId {
    /// Pool number `n`, as its owner numbers them.
    #[inline]
    pub(crate) const fn new(n: u32) -> PoolId {
        PoolId(n)
    }

    /// The pool's number, to index its owner's table.
    #[inline]
    pub(crate) const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoolId({})", self.0)
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A piece of a segment, free or allocated (PyTorch's `Block`).
#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// First byte. Invariant: `addr == prev.addr + prev.size` when there is a `prev`.
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
    /// Neighbour at lower address in the same segment, if any.
    pub(super) prev: Option<BlockId>,
    /// Neighbour at higher address in the same segment, if any.
    pub(super) next: Option<BlockId>,
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

impl Placeholder for Block {
    fn placeholder() -> Block {
        Block {
            addr: 0,
            size: 0,
            requested_size: 0,
            stream: StreamId::DEFAULT,
            pool: PoolId(0),
            segment: SegmentId(NonZeroU32::MIN),
            prev: None,
            next: None,
            allocated: false,
            mapped: false,
            expandable: false,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            registration: 0,
            rank: 0,
            live: false,
        }
    }
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

    /// Neighbour at lower address, if any.
    #[inline]
    pub fn prev(&self) -> Option<BlockId> {
        self.prev
    }

    /// Neighbour at higher address, if any.
    #[inline]
    pub fn next(&self) -> Option<BlockId> {
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
        // Not `||`: both links read at once, one test (as `prev | next != 0`).
        self.prev.is_some() | self.next.is_some()
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
    /// The block at `addr`. Invariant: it has no `prev`.
    pub(super) head: BlockId,
    /// The slot holds a live segment.
    pub(super) live: bool,
}

impl Placeholder for Segment {
    fn placeholder() -> Segment {
        Segment {
            addr: 0,
            seq: 0,
            size: 0,
            expandable: None,
            stream: StreamId::DEFAULT,
            pool: PoolId(0),
            head: BlockId(NonZeroU32::MIN),
            live: false,
        }
    }
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
