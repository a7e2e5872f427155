//! The block store: segments tiled by blocks, and the free lists that index
//! them. Pure mechanism, shared by allocators: no settings, no statistics,
//! and no backend except the virtual-memory calls by which an expandable
//! segment maps and unmaps its own pages ([`Expandable`]); whoever owns a
//! [`BlockStore`] decides when to split, merge, obtain or give back memory
//! (the caching allocator in `caching/`, after PyTorch's
//! `DeviceCachingAllocator`).
//!
//! * [`Slab`]: values addressed by `u32` ids; blocks and segments refer to
//!   each other by id, so splitting and merging are index updates and no
//!   operation allocates once the slabs are warm.
//! * [`Block`], [`Segment`]: PyTorch's `Block` and segment; a segment's
//!   blocks form a doubly linked list in address order from its `head`.
//! * [`Expandable`]: PyTorch's `ExpandableSegment`, the mapped pages of an
//!   expandable segment's reservation.
//! * [`BlockStore`]: link, split and merge blocks inside a segment; walk a
//!   segment's blocks.
//! * [`FreeList`]: free blocks sorted by a key the owner chooses (PyTorch's
//!   `BlockPool` unmapped set; a heap's (size, address) order).
//! * [`SizeClassList`]: the same sorted set for keys ordered by (group,
//!   size, ...), indexed by size-class bitmaps: best fit in one lookup
//!   (PyTorch's `BlockPool::blocks`).

mod block;
mod check;
mod chunked;
mod expandable;
mod free_list;
mod ranked;
mod size_classes;
mod slab;

pub(crate) use block::{Block, BlockId, PoolId, Segment, SegmentId, NIL};
pub(crate) use expandable::Expandable;
pub(crate) use free_list::FreeList;
pub(crate) use ranked::RankedKey;
pub(crate) use size_classes::{Cursor, SizeClassList, SizeClassed, Slot};
pub(crate) use slab::Slab;

use crate::ids::StreamId;

/// Every block and segment of one device.
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockStore {
    /// The blocks. Invariant: the live blocks of a live segment form one
    /// list from its `head` by `next`, `prev` mirroring `next`, tiling the
    /// segment exactly in address order; every live block belongs to a live
    /// segment.
    pub blocks: Slab<Block>,
    /// The segments. Invariant: a live segment's `head` is a live block.
    pub segments: Slab<Segment>,
    /// Blocks made so far (the next block's `registration`).
    pub registrations: u64,
}

impl BlockStore {
    /// The next block's [`Block::registration`]: PyTorch 2.12's `Block`
    /// constructor takes `++registration_counter_global`.
    #[inline]
    fn next_registration(&mut self) -> u64 {
        self.registrations += 1;
        self.registrations
    }

    /// A new live block (not linked, not in any free list), registered
    /// after every block made before it.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn new_block(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        segment: SegmentId,
        mapped: bool,
        expandable: bool,
    ) -> BlockId {
        let registration = self.next_registration();
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
            registration,
            live: true,
        })
    }

    /// Link the unlinked block `new` right before `at` in `at`'s segment.
    #[inline]
    pub fn link_before(&mut self, new: BlockId, at: BlockId) {
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
    #[inline]
    pub fn link_after(&mut self, new: BlockId, at: BlockId) {
        let next = self.blocks[at].next;
        self.blocks[new].prev = at;
        self.blocks[new].next = next;
        self.blocks[at].next = new;
        if next != NIL {
            self.blocks[next].prev = new;
        }
    }

    /// Split the first `size` bytes off `at` as a new mapped block of
    /// `stream`, linked before it; `at` keeps the rest. `at` must not be in
    /// a free list (its key changes).
    #[inline]
    pub fn split_front(&mut self, at: BlockId, size: u64, stream: StreamId) -> BlockId {
        let (addr, segment, pool, expandable) = {
            let r = &self.blocks[at];
            (r.addr, r.segment, r.pool, r.expandable)
        };
        let id = self.new_block(addr, size, stream, pool, segment, true, expandable);
        self.link_before(id, at);
        let r = &mut self.blocks[at];
        r.addr += size;
        r.size -= size;
        id
    }

    /// Split `at` after its first `keep` bytes: the rest becomes a new block
    /// (same stream, pool and segment; `mapped` as given) linked after it.
    /// `at` must not be in a free list.
    pub fn split_back(&mut self, at: BlockId, keep: u64, mapped: bool) -> BlockId {
        let (addr, size, stream, pool, segment, expandable) = {
            let b = &self.blocks[at];
            (b.addr, b.size, b.stream, b.pool, b.segment, b.expandable)
        };
        let rest = self.new_block(
            addr + keep,
            size - keep,
            stream,
            pool,
            segment,
            mapped,
            expandable,
        );
        self.link_after(rest, at);
        self.blocks[at].size = keep;
        rest
    }

    /// Absorb the neighbour `src` into `dst` (PyTorch's `try_merge_blocks`
    /// once it decided to merge): `dst` covers both and takes `src`'s place
    /// in the list. `src` stays live, unlinked, for the caller to inspect
    /// and then [`free_block_slot`](Self::free_block_slot). Returns the
    /// bytes absorbed.
    #[inline]
    pub fn merge(&mut self, dst: BlockId, src: BlockId) -> u64 {
        let (addr, size, prev, next, segment) = {
            let b = &self.blocks[src];
            (b.addr, b.size, b.prev, b.next, b.segment)
        };
        if self.blocks[dst].prev == src {
            // [src dst]
            let d = &mut self.blocks[dst];
            d.addr = addr;
            d.prev = prev;
            if prev != NIL {
                self.blocks[prev].next = dst;
            } else {
                self.segments[segment].head = dst;
            }
        } else {
            // [dst src]
            self.blocks[dst].next = next;
            if next != NIL {
                self.blocks[next].prev = dst;
            }
        }
        self.blocks[dst].size += size;
        size
    }

    /// Give a dead block's slot back (dropping its stream list).
    #[inline]
    pub fn free_block_slot(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        b.live = false;
        b.stream_uses = Vec::new();
        self.blocks.remove(id);
    }

    /// Give a segment's slot back, once its last block's slot is freed.
    pub fn remove_segment(&mut self, seg: SegmentId) {
        let s = &mut self.segments[seg];
        s.live = false;
        s.expandable = None;
        self.segments.remove(seg);
    }

    /// The ids of a segment's blocks in address order.
    pub fn segment_blocks(&self, seg: SegmentId) -> SegmentBlocks<'_> {
        SegmentBlocks {
            blocks: &self.blocks,
            next: self.segments[seg].head,
        }
    }
}

/// Iterator over the blocks of one segment, in address order.
pub(crate) struct SegmentBlocks<'a> {
    blocks: &'a Slab<Block>,
    next: BlockId,
}

impl Iterator for SegmentBlocks<'_> {
    type Item = BlockId;
    fn next(&mut self) -> Option<BlockId> {
        if self.next == NIL {
            return None;
        }
        let id = self.next;
        self.next = self.blocks[id].next;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store with one 4 KiB segment at 0x1000, one block covering it.
    fn one_segment() -> (BlockStore, BlockId) {
        let mut s = BlockStore::default();
        let seg = s.segments.insert(Segment {
            addr: 0x1000,
            seq: 1,
            size: 4096,
            expandable: None,
            stream: StreamId::DEFAULT,
            pool: 0,
            head: NIL,
            live: true,
        });
        let id = s.new_block(0x1000, 4096, StreamId::DEFAULT, 0, seg, true, false);
        s.segments[seg].head = id;
        (s, id)
    }

    fn layout(s: &BlockStore) -> Vec<(u64, u64)> {
        s.segment_blocks(0)
            .map(|b| (s.blocks[b].addr, s.blocks[b].size))
            .collect()
    }

    #[test]
    fn split_and_merge_keep_the_segment_tiled() {
        let (mut s, whole) = one_segment();
        let front = s.split_front(whole, 1024, StreamId::DEFAULT);
        let back = s.split_back(whole, 1024, true);
        assert_eq!(layout(&s), [(0x1000, 1024), (0x1400, 1024), (0x1800, 2048)]);
        assert!(s.blocks[whole].is_split());
        s.check_tiling().unwrap();

        assert_eq!(s.merge(whole, front), 1024);
        s.free_block_slot(front);
        assert_eq!(s.segments[0].head, whole);
        assert_eq!(s.merge(whole, back), 2048);
        s.free_block_slot(back);
        assert_eq!(layout(&s), [(0x1000, 4096)]);
        assert!(!s.blocks[whole].is_split());
        s.check_tiling().unwrap();

        // Freed slots are reused.
        let again = s.split_front(whole, 512, StreamId::DEFAULT);
        assert!(again == front || again == back);
        s.check_tiling().unwrap();
    }

    #[test]
    fn the_checker_finds_a_gap() {
        let (mut s, whole) = one_segment();
        s.split_back(whole, 1024, true);
        s.blocks[whole].size = 512;
        let e = s.check_tiling().unwrap_err();
        assert!(e.contains("gap or overlap"), "{e}");
    }
}
