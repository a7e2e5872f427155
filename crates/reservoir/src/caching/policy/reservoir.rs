//! The `reservoir` policy ([`ReservoirPolicy::Reservoir`](crate::config::ReservoirPolicy::Reservoir),
//! off in PyTorch mode), with its own fit ([`DeviceState::reservoir_fit`]).
//!
//! Measured on the cold-start replay of `../shared/traces` (BENCHMARKS.md
//! "The `reservoir` policy"), the bytes PyTorch's expandable segments
//! reserve beyond the live bytes come from (a) the 20 MiB pages of the large
//! pool and (b) free pages in the middle of a segment that no later request
//! fits, so the segment grows at its end while they stay mapped: nothing is
//! unmapped until an out-of-memory. This policy
//!
//! 1. maps expandable segments of both pools in 2 MiB pages
//!    ([`DeviceState::expandable_page_size`]);
//! 2. grows a segment where it maps the fewest pages
//!    ([`DeviceState::fewest_pages_run`]): a free block followed (or
//!    preceded) by unmapped pages is extended by the missing pages instead
//!    of mapping the whole request at the segment's end; a segment has
//!    address space for twice the device
//!    ([`DeviceState::expandable_address_space`]), so the holes the trim
//!    leaves never run it out of addresses on a device the program nearly
//!    fills;
//! 3. on a cache miss, before the driver is asked for the pages the
//!    growth maps, compares the reserved bytes plus those pages with a
//!    target: the larger of the peak of allocated bytes so far and the
//!    bytes allocated once this request is served, plus 1/64 and
//!    [`TARGET_SLACK`] (8 MiB), never more than the bound of issue 17
//!    (1/20 + 4 MiB).
//!    Over the target, free pages of the default pools' expandable segments
//!    that the growth does not use are unmapped (`unmap_block`, spec 1.11),
//!    from the largest free block first and only as many pages as bring
//!    the growth under the target: at the block's start when the block
//!    before it is unmapped, else at its end (so the unmapped space grows
//!    and what stays mapped can be extended later). Under
//!    the target nothing happens: a program whose cache fits makes no unmap
//!    calls (hysteresis).
//!
//!
//! Whole segments (docs/benchmarks-history.md "Steady state: segments of their own"): the sim's
//! cost model charges a mapped 2 MiB page about 11x what `cudaMalloc`
//! charges for the same bytes, so a cache that grows by mapping pages spends
//! far more driver time than PyTorch mode's. A request of at least
//! [`WHOLE_SEGMENT_MIN`] bytes therefore gets a segment of its own from the
//! driver (`cudaMalloc`, [`DeviceState::whole_segment_size`]) when growing
//! an expandable segment for it would map as many bytes (a 2 MiB multiple
//! that reuses no free byte: the peak is the same) or would need a trim
//! (churn; the 2 MiB rounding may then waste up to
//! 1/[`WHOLE_SEGMENT_WASTE_DIV`]). Such a segment, once free, serves only a
//! request it fits as tightly ([`whole_segment_fits`]); the others skip
//! it, so it is never carved and stays one free block the trim gives back
//! whole (`cudaFree`, cheap) before any page is unmapped.
//!
//! Online only: the target uses the allocation history, never the future.
#![forbid(unsafe_code)]

use crate::backend::{Backend, BackendError, StreamId};
use crate::caching::request::AllocParams;
use crate::caching::rules;
use crate::caching::rules::{MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER};
use crate::caching::state::pools::FreeKey;
use crate::caching::state::pools::{POOL_LARGE, POOL_SMALL};
use crate::caching::state::DeviceState;
use crate::config::waste_bound;
use crate::store::{BlockId, PoolId};

/// A run of free and unmapped blocks of an expandable segment that can
/// hold a request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrowthRun {
    /// Its first block.
    pub start: BlockId,
    /// The bytes of its blocks that serve the request (contiguous from
    /// `start`'s address).
    pub bytes: u64,
    /// The unmapped bytes serving the request from it maps.
    pub maps: u64,
}

/// The smallest rounded request served from a segment of its own: PyTorch's
/// `kMinLargeAlloc` (10 MiB), from which `get_allocation_size` rounds to
/// 2 MiB (spec 1.4), so the segment is the request rounded to 2 MiB.
pub(crate) const WHOLE_SEGMENT_MIN: u64 = MIN_LARGE_ALLOC;

/// A segment of its own wastes at most `1 / WHOLE_SEGMENT_WASTE_DIV` of
/// the request it serves (its 2 MiB rounding, or the slack of a reused
/// segment). Measured: 1/32 and 1/128 give the same counts, 1/1024 keeps
/// 12 % more steady-state driver time.
pub(crate) const WHOLE_SEGMENT_WASTE_DIV: u64 = 128;

/// Whether a free segment of its own of `block_size` bytes may serve a
/// rounded request of `size` bytes under the `reservoir` policy: the
/// request is at least [`WHOLE_SEGMENT_MIN`] and the segment wastes at most
/// 1/[`WHOLE_SEGMENT_WASTE_DIV`] of it. Any other request skips it, so it
/// is never carved.
pub(crate) fn whole_segment_fits(size: u64, block_size: u64) -> bool {
    size >= WHOLE_SEGMENT_MIN
        && block_size >= size
        && block_size - size <= size / WHOLE_SEGMENT_WASTE_DIV
}

/// The bytes the target allows above `peak + peak / 64`
/// ([`DeviceState::reservoir_target`]). Measured (docs/benchmarks-history.md "Steady
/// state: growth arenas"): with 2 MiB (the page) the small
/// workloads `llm-infer` and `llm-infer-concat` unmap and remap the same
/// 2 to 6 MiB every decode step; 6 MiB stops the first, 8 MiB both; 12 and
/// 16 MiB gain nothing more.
pub(crate) const TARGET_SLACK: u64 = 8 << 20;

/// The most the target allows above the peak of allocated bytes `peak`:
/// 1/64 of it plus [`TARGET_SLACK`], capped at issue 17's bound for one
/// stream ([`waste_bound`]: `peak / 20 + 4 MiB` above the peak), so that a
/// cache at its target stays within the bound on small inputs too.
pub(crate) fn target_headroom(peak: u64) -> u64 {
    (peak / 64 + TARGET_SLACK).min(waste_bound(peak, 1) - peak)
}

impl DeviceState {
    /// The reserved bytes the `reservoir` policy lets the cache reach
    /// without unmapping free pages, for a request of `size` bytes.
    pub(crate) fn reservoir_target(&self, size: u64) -> u64 {
        let allocated = self.acct.stats().allocated_bytes.all();
        let peak = (allocated.peak.max(0) as u64).max(allocated.current.max(0) as u64 + size);
        peak + target_headroom(peak)
    }

    /// The size of the segment of its own that a rounded request of `size`
    /// bytes in `pool` gets if the cache grows for it (the request rounded
    /// to 2 MiB, spec 1.4), or `None` if an expandable segment grows
    /// instead. A large-pool request of at least [`WHOLE_SEGMENT_MIN`] gets
    /// one when
    /// * it is a multiple of 2 MiB and growing at `run` (the run that maps
    ///   the fewest pages, [`fewest_pages_run`](Self::fewest_pages_run))
    ///   would use no free byte: the peak is the same either way; or
    /// * the growth would pass `target` (the cache churns: free memory is
    ///   given back anyway, and a segment is cheaper to get and give back
    ///   than pages) and the rounding wastes at most
    ///   1/[`WHOLE_SEGMENT_WASTE_DIV`] of the request.
    ///
    /// Measured: letting every growth that reuses a free tail, or needs no
    /// trim, take a rounded segment of its own puts the peak above
    /// expandable segments' on 16 to 18 of the 74 inputs.
    pub(crate) fn whole_segment_size(
        &self,
        pool: PoolId,
        size: u64,
        run: Option<GrowthRun>,
        target: u64,
    ) -> Option<u64> {
        // Without virtual memory (expandable segments dropped) the policy
        // runs PyTorch's segments unchanged.
        if pool != POOL_LARGE || size < WHOLE_SEGMENT_MIN || !self.config.expandable_segments {
            return None;
        }
        let seg = size.div_ceil(ROUND_LARGE) * ROUND_LARGE;
        let maps = run.map_or(size, |r| r.maps);
        let needs_trim = self.acct.total_allocated_memory() + maps > target;
        let no_free_byte_reused = seg == size && maps >= size;
        let churn = needs_trim && whole_segment_fits(size, seg);
        (no_free_byte_reused || churn).then_some(seg)
    }

    /// Of the runs of free and unmapped blocks of `stream`'s expandable
    /// segments in `pool` that hold `size` bytes, the one that maps the
    /// fewest bytes (the lowest address on a tie); `None` if there is none
    /// (a new segment is needed).
    pub(crate) fn fewest_pages_run(
        &self,
        stream: StreamId,
        pool: PoolId,
        size: u64,
    ) -> Option<GrowthRun> {
        let mut best: Option<GrowthRun> = None;
        for k in self.pools[pool.index()].unmapped_of(stream) {
            let start = self.run_start(k.id);
            let run = self.run_bytes(start, size);
            // A run that ends in a mapped block past unmapped ones leaves
            // most of that block free: not a place to grow.
            let leaves_free = run.ends_mapped && run.bytes.saturating_sub(size) >= SMALL_BUFFER;
            if run.bytes >= size && !leaves_free && best.map_or(true, |b| run.unmapped < b.maps) {
                best = Some(GrowthRun {
                    start,
                    bytes: run.bytes,
                    maps: run.unmapped,
                });
            }
        }
        best
    }

    /// Before the cache grows for a request of `size` bytes on `stream` in
    /// `pool`: if reserved plus the bytes the growth maps would pass
    /// [`reservoir_target`](Self::reservoir_target), unmap free pages the
    /// growth does not use, largest free block first, until it would not.
    /// Returns whether the growth is a segment of its own
    /// ([`whole_segment_size`](Self::whole_segment_size)). A driver error
    /// stops the trim and fails the request (each release or unmap that
    /// failed changed nothing; what was not trimmed stays cached).
    pub(crate) fn trim_before_growth<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
        pool: PoolId,
        size: u64,
    ) -> Result<bool, BackendError> {
        let target = self.reservoir_target(size);
        let run = self.fewest_pages_run(stream, pool, size);
        let whole = self.whole_segment_size(pool, size, run, target);
        let own_segment = whole.is_some();
        let run = if own_segment { None } else { run };
        let maps = whole.unwrap_or_else(|| run.map_or(size, |r| r.maps));
        if self.acct.total_allocated_memory() + maps <= target {
            return Ok(own_segment);
        }
        if self.config.expandable_segments {
            self.release_whole_segments(
                backend,
                (self.acct.total_allocated_memory() + maps) - target,
            )?;
        }
        if self.acct.total_allocated_memory() + maps <= target {
            return Ok(own_segment);
        }
        // The addresses of the blocks the growth uses (contiguous).
        let used = run.map(|r| {
            let addr = self.store.block(r.start).addr();
            addr..addr + r.bytes
        });
        let mut free: Vec<(u64, BlockId)> = [POOL_LARGE, POOL_SMALL]
            .iter()
            .flat_map(|&pool| self.pools[pool.index()].iter())
            .filter(|k| {
                let b = self.store.block(k.id);
                b.expandable() && !used.as_ref().is_some_and(|u| u.contains(&b.addr()))
            })
            .map(|k| (k.size, k.id))
            .collect();
        free.sort_unstable_by(|a, b| b.cmp(a));
        for (_, id) in free {
            let over = (self.acct.total_allocated_memory() + maps).saturating_sub(target);
            if over == 0 {
                break;
            }
            let (from, to) = self.pages_to_unmap(id, over);
            self.unmap_block_range(backend, id, from, to)?;
        }
        Ok(own_segment)
    }

    /// Give back free whole segments of the large pool (any stream) until
    /// `over` bytes are released: the smallest one of at least `over`
    /// bytes if there is one, else the largest first.
    fn release_whole_segments<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        over: u64,
    ) -> Result<(), BackendError> {
        let mut whole: Vec<(u64, BlockId)> = self.pools[POOL_LARGE.index()]
            .iter()
            .filter(|k| {
                let b = self.store.block(k.id);
                !b.expandable() && !b.is_split()
            })
            .map(|k| (k.size, k.id))
            .collect();
        if whole.is_empty() {
            return Ok(());
        }
        whole.sort_unstable();
        let victims: Vec<BlockId> = match whole.iter().find(|(size, _)| *size >= over) {
            Some(&(_, id)) => vec![id],
            None => {
                let mut released = 0;
                whole
                    .iter()
                    .rev()
                    .take_while(|(size, _)| {
                        let take = released < over;
                        released += size;
                        take
                    })
                    .map(|&(_, id)| id)
                    .collect()
            }
        };
        for id in victims {
            // Freeing is not ordered with the stream's work: wait for it
            // first (as `unmap_block_range` does).
            backend.synchronize_stream(self.store.block(id).stream())?;
            self.release_block(backend, id)?;
        }
        Ok(())
    }

    /// The whole pages of the free expandable block `id` to unmap to give
    /// back `bytes` (fewer if it has fewer): at its start if the block
    /// before it is unmapped, else at its end.
    fn pages_to_unmap(&self, id: BlockId, bytes: u64) -> (u64, u64) {
        let b = self.store.block(id);
        let (base, page) = {
            let e = self
                .store
                .segment(b.segment())
                .expandable()
                .expect("an expandable block");
            (e.base(), e.page_size())
        };
        let first = base + (b.addr() - base).div_ceil(page) * page;
        let last = base + (b.addr() + b.size() - base) / page * page;
        if first >= last {
            return (b.addr(), b.addr());
        }
        let len = bytes.div_ceil(page).saturating_mul(page).min(last - first);
        let prev_unmapped = b
            .prev()
            .is_some_and(|prev| !self.store.block(prev).mapped());
        if prev_unmapped {
            (first, first + len)
        } else {
            (last - len, last)
        }
    }

    /// The `reservoir` policy keeps whole segments whole: the
    /// first free block from `p`'s search key on its stream that is expandable or
    /// that the request fits. Out of line: the common fit takes the first block.
    #[cold]
    #[inline(never)]
    fn next_block_not_skipped(&self, p: &AllocParams) -> Option<FreeKey> {
        self.pools[p.pool.index()]
            .from(&FreeKey::search(p.stream, p.size))
            .find(|k| {
                k.stream != p.stream
                    || self.store.block(k.id).expandable()
                    || !self.skips_whole_block(p.pool, p.size, k.size)
            })
            .filter(|k| k.stream == p.stream)
    }

    /// The `reservoir` policy's fit ([`choose_fit`](Self::choose_fit)):
    /// PyTorch's best fit (spec 1.6, [`get_free_block`](Self::get_free_block))
    /// except that a free whole segment of the large pool serves only a
    /// request it fits tightly ([`skips_whole_block`](Self::skips_whole_block)),
    /// and an expandable block is not passed over for a block of a whole
    /// segment (so whole segments stay whole). Off while allocating to a
    /// private pool, where it is PyTorch's.
    #[inline(never)]
    pub(in crate::caching) fn reservoir_fit(&mut self, p: &mut AllocParams) -> bool {
        let gc = self.gc_enabled();
        let pool = &mut self.pools[p.pool.index()];
        let Some((mut hit, slot)) = pool.lower_bound(p.stream, p.size, gc) else {
            return false;
        };
        if !self.store.block(hit.id).expandable()
            && self.skips_whole_block(p.pool, p.size, hit.size)
        {
            match self.next_block_not_skipped(p) {
                Some(k) => hit = k,
                None => return false,
            }
        }
        if self.store.block(hit.id).expandable() {
            let keeps_whole = self.maps_fewest_pages();
            match self.expandable_best_fit(hit, p, keeps_whole) {
                Some(k) => hit = k,
                None => return false,
            }
        }
        let pool = &mut self.pools[p.pool.index()];
        if rules::oversize_misfit(p.size, hit.size, &self.config) {
            return false;
        }
        let removed = pool.erase(slot, &hit);
        debug_assert!(removed, "the hit is in its pool");
        p.block = Some(hit.id);
        true
    }
}
