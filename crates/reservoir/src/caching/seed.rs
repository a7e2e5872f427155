//! Seeding: give an allocator a segment with a given block layout, as if a
//! sequence of allocations had produced it.
//!
//! A recorded trace usually starts mid-run: at its first entry the allocator
//! already held segments, some of their blocks allocated. To replay it, the
//! state at the first entry is rebuilt (see `reservoir_replay::replay::recorded`)
//! and laid into a fresh allocator with [`Seeder::seed_segment`]: the
//! segment is obtained from the backend (a simulated device scripted with the
//! recorded address returns that address), its blocks are linked, free ones
//! go into their pool, and every counter moves exactly as the allocations
//! that made the layout would have moved it, so
//! [`check_invariants`](CachingAllocator::check_invariants) holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::level_u8;
use super::state::pools::{POOL_LARGE, POOL_SMALL};
use super::CachingAllocator;
use crate::backend::{Backend, BackendError, DevicePtr, StreamId};
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::snapshot::LayoutSummary;
use crate::observe::trace::{Context, Frame, RecordContext};
use crate::stats::StatType;
use crate::store::Expandable;

/// One allocated block of a [`SeededSegment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeededBlock {
    /// Offset from the segment's base (a multiple of 512).
    pub offset: u64,
    /// Bytes of the block (a nonzero multiple of 512).
    pub size: u64,
    /// Bytes the caller asked for (at most `size`).
    pub requested_size: u64,
}

/// A segment to lay into an allocator: its allocated blocks, in any order;
/// every byte not covered by one is a free block (adjacent free bytes form
/// one block, as the allocator always merges them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeededSegment {
    /// The stream the segment serves.
    pub stream: StreamId,
    /// Small pool (2 MiB segments of blocks up to 1 MiB) or large pool.
    pub small: bool,
    /// Bytes to obtain from the backend (a nonzero multiple of 512).
    pub size: u64,
    /// The allocated blocks.
    pub blocks: Vec<SeededBlock>,
}

/// Why a segment could not be seeded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedError {
    /// The layout is impossible (overlap, misalignment, out of bounds).
    #[error("invalid seeded segment: {0}")]
    Layout(String),
    /// The backend refused the segment.
    #[error("the backend refused a seeded segment of {size} bytes: {source}")]
    Backend {
        /// Bytes asked for.
        size: u64,
        /// The backend's error.
        source: BackendError,
    },
}

/// Replay-only operations on a [`CachingAllocator`], kept off its own
/// (PyTorch's) surface: laying a recorded start state into a fresh
/// allocator, replaying operations with the recorded stacks and c10 stream
/// ids, and reading what a replay compares after each step. Get one with
/// [`CachingAllocator::seeder`].
pub struct Seeder<'a, B: Backend> {
    alloc: &'a CachingAllocator<B>,
}

/// Replay-only operations: seeding a recorded start state, mirroring a
/// recording's stacks and stream ids, and what a replay compares after each
/// step, all on the [`Seeder`].
impl<B: Backend> CachingAllocator<B> {
    /// The replay-only operations on this allocator (see [`Seeder`]).
    pub fn seeder(&self) -> Seeder<'_, B> {
        Seeder { alloc: self }
    }
}

impl<B: Backend> Seeder<'_, B> {
    /// Among free blocks of equal size, prefer the lowest address (torch
    /// 2.11's `BlockComparatorSize`, and what recorded traces from real GPUs
    /// show) whatever the release's own order
    /// ([`ReleaseRules::free_block_order`](crate::config::ReleaseRules::free_block_order):
    /// the oldest segment since torch 2.13, the default). Applies to
    /// segments created from now on: set it before the first allocation.
    /// Replays of recorded traces turn it on.
    pub fn rank_segments_by_address(&self, on: bool) {
        self.alloc.state.lock().rank_segments_by_address(on);
    }

    /// Allocated and reserved bytes now (`allocated_bytes.all.current`,
    /// `reserved_bytes.all.current`), without copying every statistic as
    /// [`stats`](CachingAllocator::stats) does: what a replay reads after each op.
    pub fn allocated_and_reserved(&self) -> (u64, u64) {
        let st = self.alloc.state.lock();
        (
            st.acct.stats().allocated_bytes.all().current.max(0) as u64,
            st.acct.stats().reserved_bytes.all().current.max(0) as u64,
        )
    }

    /// Obtain a segment of `seg.size` bytes from the backend and lay out
    /// `seg.blocks` in it; returns its base. Every byte not covered by a
    /// block becomes a free block in the segment's pool (a recorded trace's
    /// start state is laid in this way, see `reservoir_replay::replay::recorded`).
    ///
    /// Stats move as if the segment had been allocated from the driver and
    /// each block allocated in it (`num_device_alloc` included; call
    /// [`reset_accumulated_stats`](CachingAllocator::reset_accumulated_stats) and
    /// [`reset_peak_stats`](CachingAllocator::reset_peak_stats) after seeding to count
    /// from the seeded state on). Segments seeded in increasing address
    /// order keep PyTorch's tie-break among equal free blocks (lowest
    /// address first). Nothing changes when an error is returned.
    pub fn seed_segment(&self, seg: &SeededSegment) -> Result<DevicePtr, SeedError> {
        self.seed_segment_in_pool(seg, MempoolId::DEFAULT)
    }

    /// [`seed_segment`](Self::seed_segment) into the private pool `owner`
    /// (a recorded `segment_pool_id`; `MempoolId::DEFAULT` is the default
    /// pool), creating that pool with one use when it does not exist, as
    /// `torch.cuda.MemPool()` does: its blocks serve only allocations
    /// routed to it ([`begin_allocate_to_pool`](CachingAllocator::begin_allocate_to_pool)),
    /// and its memory goes back to the device only once it is released
    /// ([`release_pool`](CachingAllocator::release_pool)). A pool released
    /// and waiting to be freed is [`SeedError::Layout`].
    pub fn seed_segment_in_pool(
        &self,
        seg: &SeededSegment,
        owner: MempoolId,
    ) -> Result<DevicePtr, SeedError> {
        if !owner.is_default() && self.alloc.state.lock().private.is_freeable(owner) {
            return Err(SeedError::Layout(format!(
                "private pool {owner:?} was released; a segment cannot be seeded into it"
            )));
        }
        // Recorded segments list their blocks in address order already.
        let blocks: std::borrow::Cow<'_, [SeededBlock]> =
            if seg.blocks.windows(2).all(|w| w[0].offset <= w[1].offset) {
                std::borrow::Cow::Borrowed(&seg.blocks)
            } else {
                let mut sorted = seg.blocks.clone();
                sorted.sort_by_key(|b| b.offset);
                std::borrow::Cow::Owned(sorted)
            };
        let end = check_segment_layout(seg, &blocks)?;
        let ptr = self
            .alloc
            .backend
            .allocate(seg.size, seg.stream)
            .map_err(|source| SeedError::Backend {
                size: seg.size,
                source,
            })?;
        let base = ptr.0;
        let mut st = self.alloc.state.lock();
        let pool = match (owner.is_default(), seg.small) {
            (true, true) => POOL_SMALL,
            (true, false) => POOL_LARGE,
            (false, small) => st.private_pool_slot(owner, small),
        };
        let stat = StatType::for_pool(seg.small);
        let (_, head) = (st.store).new_segment(base, seg.size, seg.stream, pool, None, true);
        st.note_segment_allocated(seg.size, pool);
        st.count_private_malloc(pool, true);

        // The tiling, in address order: (offset, size, Some(requested) if
        // allocated). The segment is split unless one tile covers it.
        let whole = match &blocks[..] {
            [] => true,
            [b] => b.offset == 0 && b.size == seg.size,
            _ => false,
        };
        let split = !whole;
        let gaps_and_blocks = blocks.iter().scan(0u64, |at, b| {
            let gap = (b.offset > *at).then(|| (*at, b.offset - *at, None));
            *at = b.offset + b.size;
            Some(
                gap.into_iter()
                    .chain([(b.offset, b.size, Some(b.requested_size))]),
            )
        });
        let tail = (end < seg.size).then(|| (end, seg.size - end, None));
        let tiles: Vec<_> = gaps_and_blocks.flatten().chain(tail).collect();
        // Split off in address order, so the blocks are registered as they
        // were made.
        let mut rest = head;
        for (k, &(offset, size, requested)) in tiles.iter().enumerate() {
            let id = rest;
            if k + 1 < tiles.len() {
                rest = st.store.split_back(id, size, true);
            }
            match requested {
                Some(requested) => {
                    st.store.hand_out(id, requested);
                    st.note_allocated(id, base + offset, size, requested, stat);
                }
                None => {
                    // Keyed by the release's free-block order, its GC age from now.
                    st.insert_into_pool(id);
                    if split {
                        st.acct.inactive_split_changed(stat, 1, size as i64);
                    }
                }
            }
        }
        Ok(ptr)
    }
}

/// Mirroring a recording's operations: allocations and frees with the
/// recorded stacks, the recorded c10 stream ids, and the layout counts a
/// replay compares after each step.
impl<B: Backend> Seeder<'_, B> {
    /// [`raw_alloc`](CachingAllocator::raw_alloc) with the caller's own stack (for FFI
    /// layers and replays that know the allocating code's frames). The
    /// frames are used as a gathered stack would be: kept only if history
    /// is recorded with a context level of `State` or more.
    pub fn raw_alloc_with_frames(
        &self,
        size: u64,
        stream: StreamId,
        frames: Arc<[Frame]>,
    ) -> Result<DevicePtr, AllocError> {
        if size == 0 {
            return Ok(DevicePtr::NULL);
        }
        let ctx = (self.alloc.record_level.load(Ordering::Relaxed)
            >= level_u8(RecordContext::State))
        .then(|| Context::from_frames(frames));
        self.alloc.malloc_with(size, stream, ctx)
    }

    /// [`raw_free`](CachingAllocator::raw_free) with the caller's own stack, used (as a
    /// gathered stack would be) only at context level `All`.
    pub fn raw_free_with_frames(
        &self,
        ptr: DevicePtr,
        frames: Arc<[Frame]>,
    ) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let ctx = (self.alloc.record_level.load(Ordering::Relaxed) >= level_u8(RecordContext::All))
            .then(|| Context::from_frames(frames));
        self.alloc
            .with_context(ctx, |state| state.free_ptr(&self.alloc.backend, ptr))
    }

    /// Tell the allocator the c10 stream id PyTorch would give `stream`
    /// (see [`c10_pool_stream_id`](crate::caching::stream_order::c10_pool_stream_id)). PyTorch walks its
    /// per-stream event queues in the order of a hash map keyed by these ids,
    /// so they decide which stream's cross-stream frees complete first. By
    /// default `StreamId(n)` is the n-th pool stream, the default stream 0.
    pub fn set_c10_stream_id(&self, stream: StreamId, id: i64) {
        self.alloc.state.lock().events.set_c10_stream_id(stream, id);
    }

    /// The counts of [`segments`](CachingAllocator::segments) (segments, blocks, free
    /// blocks, largest free block) without building the segment list.
    pub fn layout_summary(&self) -> LayoutSummary {
        self.alloc.state.lock().layout_summary()
    }
}

/// An expandable segment to lay into an allocator: a reserved address range
/// of which some pages are mapped, with allocated blocks in mapped pages.
/// Every mapped byte not covered by a block is a free block; every unmapped
/// page is part of an unmapped block (adjacent ones merged, as the allocator
/// keeps them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeededExpandable {
    /// The stream the segment serves.
    pub stream: StreamId,
    /// Small pool (2 MiB pages) or large pool (`large_segment_size` pages).
    pub small: bool,
    /// Mapped ranges as (offset from the base, bytes), page-aligned.
    pub mapped: Vec<(u64, u64)>,
    /// The allocated blocks, each inside one mapped range.
    pub blocks: Vec<SeededBlock>,
}

impl<B: Backend> Seeder<'_, B> {
    /// Reserve an expandable segment (of the size the allocator would
    /// reserve under its policy, `DeviceState::expandable_address_space`:
    /// 9/8 of the device in PyTorch mode), map `seg.mapped` and lay
    /// out `seg.blocks`; returns its base. Stats move as if the pages had
    /// been mapped by allocations (`reserved_bytes` and `num_device_alloc`
    /// per mapped range; expandable segments count no `segment`), and the
    /// allocated blocks as in [`seed_segment`](Self::seed_segment).
    pub fn seed_expandable(&self, seg: &SeededExpandable) -> Result<DevicePtr, SeedError> {
        let total = self
            .alloc
            .backend
            .mem_info()
            .map_err(|source| SeedError::Backend { size: 0, source })?
            .total;
        // The policy decides the page and the address space, as for a
        // segment the allocator grows itself.
        let (page, space) = {
            let st = self.alloc.state.lock();
            let page = st.expandable_page_size(seg.small);
            (page, st.expandable_address_space(total, page))
        };
        let (mapped, blocks) = check_expandable_layout(seg, page, space)?;
        let vm = self
            .alloc
            .backend
            .as_virtual_memory()
            .ok_or(SeedError::Backend {
                size: space,
                source: BackendError::Unsupported {
                    backend: self.alloc.backend.name(),
                    what: "virtual memory (needed by expandable segments)",
                },
            })?;
        let reservation = vm.reserve(space).map_err(|source| SeedError::Backend {
            size: space,
            source,
        })?;
        for (k, &(o, l)) in mapped.iter().enumerate() {
            if let Err(source) = vm.map(reservation, o, l) {
                for &(o2, l2) in &mapped[..k] {
                    let _ = vm.unmap(reservation, o2, l2);
                }
                let _ = vm.release(reservation);
                return Err(SeedError::Backend { size: l, source });
            }
        }
        let base = reservation.base.0;
        let mut st = self.alloc.state.lock();
        let pool = if seg.small { POOL_SMALL } else { POOL_LARGE };
        let stat = StatType::for_pool(seg.small);
        let tiles = expandable_tiles(&mapped, &blocks, space);
        let mapping = Box::new(Expandable::seeded(reservation, page, &mapped));
        let head_mapped = tiles.first().is_some_and(|t| t.2);
        let (_, head) =
            (st.store).new_segment(base, space, seg.stream, pool, Some(mapping), head_mapped);
        let mapped_total: u64 = mapped.iter().map(|r| r.1).sum();
        let owner = st.owner(pool);
        st.acct
            .pages_mapped(stat, owner, mapped_total, mapped.len() as i64);

        // Split off in address order, so the blocks are registered as they
        // were made.
        let mut ids = Vec::with_capacity(tiles.len());
        let mut rest = head;
        for (k, &(_, size, _, _)) in tiles.iter().enumerate() {
            ids.push(rest);
            if let Some(next) = tiles.get(k + 1) {
                rest = st.store.split_back(rest, size, next.2);
            }
        }
        for (&id, &(offset, size, is_mapped, requested)) in ids.iter().zip(&tiles) {
            match requested {
                Some(requested) => {
                    st.store.hand_out(id, requested);
                    st.note_allocated(id, base + offset, size, requested, stat);
                }
                None if is_mapped => st.insert_into_pool(id),
                None => st.insert_into_unmapped(id),
            }
        }
        Ok(DevicePtr(base))
    }
}

/// The checks of [`Seeder::seed_segment`] before anything changes: the
/// segment's size and its `blocks` (in address order) 512-aligned, not
/// overlapping, inside the segment, none requesting more than its size.
/// Returns the end of the last block.
fn check_segment_layout(seg: &SeededSegment, blocks: &[SeededBlock]) -> Result<u64, SeedError> {
    let layout = |m: String| Err(SeedError::Layout(m));
    if seg.size == 0 || seg.size % 512 != 0 {
        return layout(format!(
            "segment size {} is not a multiple of 512",
            seg.size
        ));
    }
    let mut end = 0u64;
    for b in blocks {
        if b.size == 0 || b.size % 512 != 0 || b.offset % 512 != 0 {
            return layout(format!(
                "block at offset {} of {} bytes is not 512-aligned",
                b.offset, b.size
            ));
        }
        if b.offset < end {
            return layout(format!(
                "block at offset {} overlaps the previous one",
                b.offset
            ));
        }
        if b.requested_size > b.size {
            return layout(format!(
                "block at offset {} requested {} bytes, more than its {}",
                b.offset, b.requested_size, b.size
            ));
        }
        end = match b.offset.checked_add(b.size) {
            Some(e) if e <= seg.size => e,
            _ => {
                return layout(format!(
                    "block at offset {} of {} bytes ends past the segment ({} bytes)",
                    b.offset, b.size, seg.size
                ))
            }
        };
    }
    Ok(end)
}

/// The checks of [`Seeder::seed_expandable`] before anything changes: the
/// mapped ranges page-aligned, not empty, not overlapping and inside the
/// reservation of `space` bytes; each block 512-aligned, not overlapping,
/// inside one mapped range, none requesting more than its size. Returns the
/// mapped ranges and the blocks in address order.
#[allow(clippy::type_complexity)]
fn check_expandable_layout(
    seg: &SeededExpandable,
    page: u64,
    space: u64,
) -> Result<(Vec<(u64, u64)>, Vec<SeededBlock>), SeedError> {
    let layout = |m: String| Err(SeedError::Layout(m));
    let mut mapped = seg.mapped.clone();
    mapped.sort_unstable();
    let mut end = 0;
    for &(o, l) in &mapped {
        if l == 0
            || o % page != 0
            || l % page != 0
            || o < end
            || o.checked_add(l).map_or(true, |e| e > space)
        {
            return layout(format!(
                    "mapped range [{o:#x}, +{l:#x}) is empty, not page-aligned ({page:#x}), overlapping or past the reservation ({space:#x})"
                ));
        }
        end = o + l;
    }
    let mut blocks = seg.blocks.clone();
    blocks.sort_by_key(|b| b.offset);
    let mut bend = 0u64;
    for b in &blocks {
        let inside = mapped
            .iter()
            .any(|&(o, l)| b.offset >= o && b.offset.saturating_add(b.size) <= o + l);
        if b.size == 0
            || b.size % 512 != 0
            || b.offset % 512 != 0
            || b.offset < bend
            || b.requested_size > b.size
            || !inside
        {
            return layout(format!(
                    "block at offset {:#x} of {} bytes: unaligned, overlapping, or not inside one mapped range",
                    b.offset, b.size
                ));
        }
        bend = b.offset + b.size;
    }
    Ok((mapped, blocks))
}

/// The tiling of an expandable segment of `space` bytes whose `mapped`
/// ranges hold `blocks` (both in address order): (offset, size, mapped,
/// Some(requested) if allocated), every byte in one tile.
fn expandable_tiles(
    mapped: &[(u64, u64)],
    blocks: &[SeededBlock],
    space: u64,
) -> Vec<(u64, u64, bool, Option<u64>)> {
    // The tiling: (offset, size, mapped, Some(requested) if allocated).
    let mut tiles: Vec<(u64, u64, bool, Option<u64>)> = Vec::new();
    let mut at = 0;
    let mut bi = blocks.iter().peekable();
    for &(o, l) in mapped {
        if o > at {
            tiles.push((at, o - at, false, None));
        }
        at = o;
        while let Some(b) = bi.next_if(|b| b.offset < o + l) {
            if b.offset > at {
                tiles.push((at, b.offset - at, true, None));
            }
            tiles.push((b.offset, b.size, true, Some(b.requested_size)));
            at = b.offset + b.size;
        }
        if at < o + l {
            tiles.push((at, o + l - at, true, None));
        }
        at = o + l;
    }
    if at < space {
        tiles.push((at, space - at, false, None));
    }
    tiles
}
