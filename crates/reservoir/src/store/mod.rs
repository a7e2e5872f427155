//! The block store: segments tiled by blocks, and the free lists that index
//! them. Pure mechanism, shared by allocators: no settings, no statistics,
//! and no backend except the virtual-memory calls by which an expandable
//! segment maps and unmaps its own pages ([`Expandable`]); whoever owns a
//! [`BlockStore`] decides when to split, merge, obtain or give back memory
//! (the caching allocator in `caching/`, after PyTorch's
//! `DeviceCachingAllocator`).
//!
//! * [`Slab`]: values addressed by typed ids ([`BlockId`], [`SegmentId`]:
//!   newtypes only the slab makes); blocks and segments refer to each other
//!   by id, a block's neighbours as `Option<BlockId>` (four bytes, no
//!   sentinel), so splitting and merging are index updates and no
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
//!
//! # Invariants
//!
//! The store is sealed: [`Block`] and [`Segment`] fields are private to this
//! module, and they change only through [`BlockStore`]'s named events
//! ([`new_segment`](BlockStore::new_segment),
//! [`hand_out`](BlockStore::hand_out), [`give_back`](BlockStore::give_back),
//! [`split_front`](BlockStore::split_front) /
//! [`split_back`](BlockStore::split_back), [`merge`](BlockStore::merge),
//! [`map`](BlockStore::map) / [`unmap`](BlockStore::unmap), the stream-use
//! and event counts, and the slot releases). Between events, and as
//! [`check_tiling`](BlockStore::check_tiling) checks:
//!
//! 1. Every live segment has a live `head` block, which has no `prev`.
//! 2. The blocks reached from a live segment's `head` by `next` are live,
//!    non-empty, name that segment, have `prev` mirroring `next`, and tile
//!    the segment exactly in address order (the first at the segment's
//!    `addr`, each next at `addr + size` of the one before, the last ending
//!    at the segment's end).
//! 3. Every block of a segment has the segment's stream and pool.
//! 4. Every live block is reached from a live segment (no orphan blocks).
//! 5. A block is `expandable` exactly when its segment has a mapping state,
//!    and only blocks of expandable segments are unmapped.
//! 6. Live blocks' `registration`s are distinct and at most the number of
//!    blocks made (the counters are the store's: segments are made only by
//!    [`BlockStore::new_segment`], blocks only by it and the splits).
//! 7. Every live block's `rank` is the value the store's [`BlockRank`] rule
//!    gives it (its segment's `seq` or address, or its `registration`).

mod block;
mod check;
mod chunked;
mod expandable;
mod free_list;
mod ranked;
mod size_classes;
mod slab;

pub(crate) use block::{Block, BlockId, PoolId, Segment, SegmentId};

pub(crate) use expandable::Expandable;
pub(crate) use free_list::FreeList;
pub(crate) use ranked::RankedKey;
pub(crate) use size_classes::{Cursor, SizeClassList, SizeClassed, Slot};
pub(crate) use slab::Slab;

use crate::ids::StreamId;

/// Every block and segment of one device. The slabs are private: read a
/// record with [`block`](Self::block) / [`segment`](Self::segment), change
/// one only through the events below (the invariants are in the module
/// documentation).
#[derive(Clone, Debug, Default)]
pub(crate) struct BlockStore {
    /// The blocks.
    blocks: Slab<Block, BlockId>,
    /// The segments.
    segments: Slab<Segment, SegmentId>,
    /// Blocks made so far (the next block's `registration`).
    registrations: u64,
    /// Segments made so far (the next segment's creation number).
    segments_made: u64,
    /// Rank new segments by address instead of by creation number (torch
    /// 2.11's order, what recorded traces show; set by replays).
    rank_by_address: bool,
    /// What a block's `rank` is (decided once by the owner, see
    /// [`set_block_rank`](Self::set_block_rank)).
    block_rank: BlockRank,
}

/// What orders free blocks of equal size: the value each block carries as
/// its [`rank`](Block::rank), computed when the block is made. The owner
/// picks the rule once (the caching allocator: from the release's free
/// block order), so no call decides it again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum BlockRank {
    /// The segment's rank ([`Segment::seq`]: its creation number, or its
    /// address under [`rank_segments_by_address`](BlockStore::rank_segments_by_address)).
    #[default]
    SegmentSeq,
    /// The segment's address.
    SegmentAddress,
    /// The block's own [`registration`](Block::registration).
    Registration,
}

impl BlockStore {
    // -- Reading

    /// The block `id`.
    #[inline]
    pub fn block(&self, id: BlockId) -> &Block {
        &self.blocks[id]
    }

    /// The segment `id`.
    #[inline]
    pub fn segment(&self, id: SegmentId) -> &Segment {
        &self.segments[id]
    }

    /// True when `id` names a live block.
    pub fn is_live_block(&self, id: BlockId) -> bool {
        self.blocks.get(id).is_some_and(|b| b.live)
    }

    /// Live segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The live segments with their ids, in slot order.
    pub fn live_segments(&self) -> impl Iterator<Item = (SegmentId, &Segment)> + '_ {
        self.segments.iter().filter(|(_, s)| s.live)
    }

    /// Segments made so far (each [`new_segment`](Self::new_segment) counts one).
    #[inline]
    pub fn segments_made(&self) -> u64 {
        self.segments_made
    }

    /// True when new segments are ranked by address (see
    /// [`rank_segments_by_address`](Self::rank_segments_by_address)).
    #[inline]
    pub fn ranks_by_address(&self) -> bool {
        self.rank_by_address
    }

    /// Rank segments made from now on by their address instead of their
    /// creation number.
    pub fn rank_segments_by_address(&mut self, on: bool) {
        self.rank_by_address = on;
    }

    /// The rule blocks are ranked by (see [`set_block_rank`](Self::set_block_rank)).
    #[inline]
    pub fn block_rank(&self) -> BlockRank {
        self.block_rank
    }

    /// Rank blocks by `rule` from now on, re-ranking every live block (the
    /// owner then re-keys its free lists, which find each block by the key
    /// they hold for it).
    pub fn set_block_rank(&mut self, rule: BlockRank) {
        self.block_rank = rule;
        for i in 0..self.blocks.items.len() {
            if self.blocks.items[i].live {
                let b = &self.blocks.items[i];
                let rank = self.rank_of(b.segment, b.registration);
                self.blocks.items[i].rank = rank;
            }
        }
    }

    /// The rank, under the store's rule, of a block of `segment` made with
    /// `registration`.
    #[inline]
    fn rank_of(&self, segment: SegmentId, registration: u64) -> u64 {
        match self.block_rank {
            BlockRank::SegmentSeq => self.segments[segment].seq,
            BlockRank::SegmentAddress => self.segments[segment].addr,
            BlockRank::Registration => registration,
        }
    }

    // -- Making and dropping records

    /// The next block's [`Block::registration`]: PyTorch 2.12's `Block`
    /// constructor takes `++registration_counter_global`.
    #[inline]
    fn next_registration(&mut self) -> u64 {
        self.registrations += 1;
        self.registrations
    }

    /// A new live block, in no free list, registered after every block made
    /// before it, its `prev` and `next` links `links` from the start (the
    /// caller links its neighbours to it; `(None, None)`: not linked).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn new_block(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        segment: SegmentId,
        mapped: bool,
        expandable: bool,
        (prev, next): (Option<BlockId>, Option<BlockId>),
    ) -> BlockId {
        let registration = self.next_registration();
        let rank = self.rank_of(segment, registration);
        self.blocks.insert(Block {
            addr,
            size,
            requested_size: 0,
            stream,
            pool,
            segment,
            prev,
            next,
            allocated: false,
            mapped,
            expandable,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_count_base: 0,
            registration,
            rank,
            live: true,
        })
    }

    /// Make a segment: `size` bytes at `addr` for `stream` and `pool`,
    /// expandable when `mapping` is given, tiled by one free block (mapped
    /// as `mapped` says) that is returned with the segment. The segment
    /// counts one more made; its rank is that count, or its address under
    /// [`rank_segments_by_address`](Self::rank_segments_by_address).
    pub fn new_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        mapping: Option<Box<Expandable>>,
        mapped: bool,
    ) -> (SegmentId, BlockId) {
        self.segments_made += 1;
        let seq = if self.rank_by_address {
            addr
        } else {
            self.segments_made
        };
        let expandable = mapping.is_some();
        // The head is the block made right below, in the slot the block
        // slab gives next.
        let head = self.blocks.next_id();
        let seg = self.segments.insert(Segment {
            addr,
            seq,
            size,
            expandable: mapping,
            stream,
            pool,
            head,
            live: true,
        });
        let made = self.new_block(
            addr,
            size,
            stream,
            pool,
            seg,
            mapped,
            expandable,
            (None, None),
        );
        debug_assert_eq!(made, head, "the head is made in the slot reserved for it");
        (seg, made)
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

    // -- Handing out and giving back

    /// The block is handed out to a caller who asked for `requested` bytes;
    /// returns it, to read.
    #[inline]
    pub fn hand_out(&mut self, id: BlockId, requested: u64) -> &Block {
        let b = &mut self.blocks[id];
        b.allocated = true;
        b.requested_size = requested;
        b
    }

    /// The caller gave the block back (its `requested_size` stays, stale);
    /// returns it, to read.
    #[inline]
    pub fn give_back(&mut self, id: BlockId) -> &Block {
        let b = &mut self.blocks[id];
        b.allocated = false;
        b
    }

    /// A whole (unsplit) segment and its one block move to `stream` for good.
    pub fn move_to_stream(&mut self, seg: SegmentId, stream: StreamId) {
        let head = self.segments[seg].head;
        debug_assert!(!self.blocks[head].is_split(), "only a whole segment moves");
        self.blocks[head].stream = stream;
        self.segments[seg].stream = stream;
    }

    // -- Stream uses and events (`record_stream`, `insert_events`)

    /// `stream` used the block (`record_stream`): remembered once, unless it
    /// is the block's own stream.
    #[inline]
    pub fn record_use(&mut self, id: BlockId, stream: StreamId) {
        let b = &mut self.blocks[id];
        if stream != b.stream && !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
    }

    /// Forget the block's stream uses (keeping the list's capacity).
    #[inline]
    pub fn forget_uses(&mut self, id: BlockId) {
        self.blocks[id].stream_uses.clear();
    }

    /// Take the block's stream uses, leaving none.
    #[inline]
    pub fn take_uses(&mut self, id: BlockId) -> Vec<StreamId> {
        std::mem::take(&mut self.blocks[id].stream_uses)
    }

    /// Put back stream uses taken by [`take_uses`](Self::take_uses)
    /// (filtered or reordered).
    #[inline]
    pub fn restore_uses(&mut self, id: BlockId, uses: Vec<StreamId>) {
        self.blocks[id].stream_uses = uses;
    }

    /// `n` more cross-stream events were recorded for the block.
    #[inline]
    pub fn await_events(&mut self, id: BlockId, n: u32) {
        self.blocks[id].event_count += n;
    }

    /// One of the block's events completed; returns how many remain.
    #[inline]
    pub fn event_done(&mut self, id: BlockId) -> u32 {
        let b = &mut self.blocks[id];
        b.event_count -= 1;
        b.event_count
    }

    /// The block entered its pool when the pool had counted `count`
    /// free-block searches (its GC age starts there).
    #[inline]
    pub fn start_gc_age(&mut self, id: BlockId, count: i64) {
        self.blocks[id].gc_count_base = count;
    }

    // -- Mapping (expandable segments)

    /// The block's pages are now mapped.
    #[inline]
    pub fn map(&mut self, id: BlockId) {
        self.blocks[id].mapped = true;
    }

    /// The block's pages are now unmapped.
    #[inline]
    pub fn unmap(&mut self, id: BlockId) {
        self.blocks[id].mapped = false;
    }

    /// The mapping state of an expandable segment, to map or unmap pages.
    #[inline]
    pub fn mapping_mut(&mut self, seg: SegmentId) -> Option<&mut Expandable> {
        self.segments[seg].expandable.as_deref_mut()
    }

    // -- Splitting and merging

    /// Split the first `size` bytes off `at` as a new mapped block of
    /// `stream`, linked before it; `at` keeps the rest. `at` must not be in
    /// a free list (its key changes).
    #[inline]
    pub fn split_front(&mut self, at: BlockId, size: u64, stream: StreamId) -> BlockId {
        let (addr, segment, pool, expandable, prev) = {
            let r = &self.blocks[at];
            (r.addr, r.segment, r.pool, r.expandable, r.prev)
        };
        // Made linked between `prev` and `at`.
        let links = (prev, Some(at));
        let id = self.new_block(addr, size, stream, pool, segment, true, expandable, links);
        let r = &mut self.blocks[at];
        r.prev = Some(id);
        r.addr += size;
        r.size -= size;
        match prev {
            Some(prev) => self.blocks[prev].next = Some(id),
            None => self.segments[segment].head = id,
        }
        id
    }

    /// Split `at` after its first `keep` bytes: the rest becomes a new block
    /// (same stream, pool and segment; `mapped` as given) linked after it.
    /// `at` must not be in a free list.
    pub fn split_back(&mut self, at: BlockId, keep: u64, mapped: bool) -> BlockId {
        let (addr, size, stream, pool, segment, expandable, next) = {
            let b = &self.blocks[at];
            (
                b.addr,
                b.size,
                b.stream,
                b.pool,
                b.segment,
                b.expandable,
                b.next,
            )
        };
        // Made linked between `at` and `next`.
        let links = (Some(at), next);
        let (addr, size) = (addr + keep, size - keep);
        let rest = self.new_block(addr, size, stream, pool, segment, mapped, expandable, links);
        let b = &mut self.blocks[at];
        b.next = Some(rest);
        b.size = keep;
        if let Some(next) = next {
            self.blocks[next].prev = Some(rest);
        }
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
        if self.blocks[dst].prev == Some(src) {
            // [src dst]
            let d = &mut self.blocks[dst];
            d.addr = addr;
            d.prev = prev;
            if let Some(prev) = prev {
                self.blocks[prev].next = Some(dst);
            } else {
                self.segments[segment].head = dst;
            }
        } else {
            // [dst src]
            self.blocks[dst].next = next;
            if let Some(next) = next {
                self.blocks[next].prev = Some(dst);
            }
        }
        self.blocks[dst].size += size;
        size
    }

    /// The ids of a segment's blocks in address order.
    pub fn segment_blocks(&self, seg: SegmentId) -> SegmentBlocks<'_> {
        SegmentBlocks {
            blocks: &self.blocks,
            next: Some(self.segments[seg].head),
        }
    }
}

/// Iterator over the blocks of one segment, in address order.
pub(crate) struct SegmentBlocks<'a> {
    blocks: &'a Slab<Block, BlockId>,
    next: Option<BlockId>,
}

impl Iterator for SegmentBlocks<'_> {
    type Item = BlockId;
    fn next(&mut self) -> Option<BlockId> {
        let id = self.next?;
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
        let (_, id) = s.new_segment(0x1000, 4096, StreamId::DEFAULT, PoolId::new(0), None, true);
        (s, id)
    }

    fn layout(s: &BlockStore) -> Vec<(u64, u64)> {
        let (first, _) = s.live_segments().next().unwrap();
        s.segment_blocks(first)
            .map(|b| (s.blocks[b].addr, s.blocks[b].size))
            .collect()
    }

    /// Each block carries the rank its rule gives it: made under one rule,
    /// re-ranked when the rule changes, and a wrong rank is caught by the
    /// checker (invariant 7).
    #[test]
    fn blocks_carry_the_rank_of_the_rule() {
        let (mut s, whole) = one_segment();
        let (seg2, other) =
            s.new_segment(0x9000, 4096, StreamId::DEFAULT, PoolId::new(0), None, true);
        let front = s.split_front(whole, 1024, StreamId::DEFAULT);
        let ranks = |s: &BlockStore| [whole, front, other].map(|b| s.blocks[b].rank);
        // The default rule: the segment's creation number.
        assert_eq!(ranks(&s), [1, 1, 2]);
        s.set_block_rank(BlockRank::SegmentAddress);
        assert_eq!(ranks(&s), [0x1000, 0x1000, 0x9000]);
        s.set_block_rank(BlockRank::Registration);
        assert_eq!(ranks(&s), [1, 3, 2]);
        s.check_tiling().unwrap();
        // A block made under a rule gets that rule's rank.
        let back = s.split_back(other, 512, true);
        assert_eq!(s.blocks[back].rank, 4);
        s.set_block_rank(BlockRank::SegmentSeq);
        assert_eq!(s.blocks[back].rank, s.segments[seg2].seq);
        s.check_tiling().unwrap();
        s.blocks[back].rank += 1;
        let err = s.check_tiling().unwrap_err();
        assert!(err.contains("rank"), "{err}");
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
        assert_eq!(s.segments[s.blocks[whole].segment].head, whole);
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
