//! The one seam where Reservoir-only policies hook into PyTorch's algorithm.
//!
//! Everything else in `caching/` is PyTorch's `DeviceCachingAllocator`, exact.
//! A Reservoir policy changes what happens at a named point of that
//! algorithm, through a hook here; [`ReservoirPolicy::PyTorch`] makes every
//! hook PyTorch's own step, so PyTorch mode runs PyTorch's algorithm
//! unchanged. The policy is one enum, chosen once with the settings
//! ([`AllocatorConfig::policy`](crate::config::AllocatorConfig::policy)) and
//! matched in the hooks (static dispatch, no trait object): on the hot path
//! (a request the cache serves) the only hook is the choice of the fit.
//!
//! Hooks:
//! * [`DeviceState::choose_fit`]: the free block a request gets (spec 1.6):
//!   PyTorch's best fit ([`DeviceState::get_free_block`]) or the `reservoir`
//!   policy's ([`DeviceState::reservoir_fit`]).
//! * [`DeviceState::policy_on_cache_miss`]: the request's own pool has no
//!   fitting block, even after the free-memory callbacks (spec 1.5 step 4);
//!   it runs before garbage collection and the driver.
//! * [`DeviceState::expandable_page_size`]: the mapping granularity of a new
//!   expandable segment (spec 1.11).
//! * [`DeviceState::expandable_address_space`]: the address space a new
//!   expandable segment reserves (spec 1.11).
//! * [`DeviceState::maps_fewest_pages`]: where an expandable segment grows
//!   (spec 1.11 `find_expandable_block`): PyTorch takes the lowest address
//!   that holds the request, the `reservoir` policy the place that maps the
//!   fewest pages.
//!
//! To add a policy: a variant of [`ReservoirPolicy`] with its name in
//! [`ReservoirPolicy::named`], an arm in the hooks it needs, and its code in
//! a file under `policy/`.

mod cross_stream;
mod reservoir;

use super::request::{AllocParams, MallocError};
use super::state::pools::POOL_LARGE;
use super::state::DeviceState;
use crate::backend::Backend;
use crate::config::ReservoirPolicy;
use crate::store::PoolId;

impl DeviceState {
    /// Hook, "choose the fit" (spec 1.6): take the free block that serves
    /// `p` out of its pool (`p.block`), or say there is none. PyTorch mode
    /// (and cross-stream reuse, which changes only the cache miss) is
    /// PyTorch's best fit, [`get_free_block`](Self::get_free_block); the
    /// `reservoir` policy has its own, [`reservoir_fit`](Self::reservoir_fit).
    #[inline]
    pub(super) fn choose_fit(&mut self, p: &mut AllocParams) -> bool {
        match self.config.policy {
            ReservoirPolicy::PyTorch | ReservoirPolicy::CrossStreamReuse => self.get_free_block(p),
            ReservoirPolicy::Reservoir => self.reservoir_fit(p),
        }
    }

    /// Hook: the cache has no block for `p` on its stream. True if the
    /// policy found one: `p.block` is set, out of its pool, and `p.stream`
    /// is the stream it is handed out on.
    #[inline]
    pub(super) fn policy_on_cache_miss<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &mut AllocParams,
    ) -> Result<bool, MallocError> {
        match self.config.policy {
            ReservoirPolicy::PyTorch => Ok(false),
            // Off while allocations go to a private pool.
            _ if self.private.any_capture_underway() => Ok(false),
            ReservoirPolicy::Reservoir => {
                // Never serves the request itself: it makes room so that
                // the driver path below maps as little as possible, and
                // chooses whether that growth is a segment of its own.
                p.own_segment = self.trim_before_growth(backend, p.stream, p.pool, p.size)?;
                Ok(false)
            }
            ReservoirPolicy::CrossStreamReuse => {
                // Borrow a block cached on another stream; it is handed out
                // on its own stream (see `policy/cross_stream.rs`).
                match self.take_from_other_stream(backend, p.pool, p.size, p.stream)? {
                    Some(id) => {
                        p.block = Some(id);
                        p.stream = self.store.block(id).stream();
                        Ok(true)
                    }
                    None => Ok(false),
                }
            }
        }
    }

    /// Hook: whether `find_expandable_block` serves a request from the run
    /// of free and unmapped blocks that maps the fewest pages
    /// ([`fewest_pages_run`](Self::fewest_pages_run)) instead of the lowest
    /// address that holds it.
    #[inline]
    pub(super) fn maps_fewest_pages(&self) -> bool {
        self.config.policy == ReservoirPolicy::Reservoir && !self.private.any_capture_underway()
    }

    /// Hook: whether the best-fit search for a rounded request of `size`
    /// bytes in `pool` passes over a free non-expandable block of
    /// `block_size` bytes. Never in PyTorch mode; under the `reservoir`
    /// policy a whole segment serves only a request it fits tightly.
    #[inline]
    pub(super) fn skips_whole_block(&self, pool: PoolId, size: u64, block_size: u64) -> bool {
        pool == POOL_LARGE
            && self.config.expandable_segments
            && self.maps_fewest_pages()
            && !reservoir::whole_segment_fits(size, block_size)
    }

    /// Hook: the address space a new expandable segment reserves on a
    /// device of `total` bytes. PyTorch reserves 1 1/8 of the device
    /// (`ExpandableSegment`'s `max_handles`). The `reservoir` policy
    /// reserves twice the device: it unmaps free pages anywhere in a
    /// segment, and with holes the mapped pages spread over more addresses,
    /// so under PyTorch's size a growth that would extend a segment meets
    /// the end of its space on a device the program nearly fills, and the
    /// layout (and the driver calls) then depend on the device's size.
    /// Measured (BENCHMARKS.md "On a device the size of the bound"): with
    /// twice the device, every input replays the same on a device of its
    /// bound as on 80 GiB. Address space costs no memory.
    ///
    /// In whole pages of `page` bytes. Saturating: a device that reports
    /// nearly 2^64 bytes asks for the largest whole number of pages below
    /// 2^64, which no backend can reserve (a device error, as PyTorch's
    /// `cuMemAddressReserve` failure is), instead of overflowing.
    #[inline]
    pub(super) fn expandable_address_space(&self, total: u64, page: u64) -> u64 {
        let space = if self.config.policy == ReservoirPolicy::Reservoir {
            total.saturating_mul(2)
        } else {
            total.saturating_add(total / 8)
        };
        whole_pages(space, page)
    }

    /// Hook: the page size of a new expandable segment of a small or large
    /// pool. PyTorch maps the large pool in `large_segment_size` pages
    /// (20 MiB by default); the `reservoir` policy maps both pools in
    /// 2 MiB pages (the device's virtual-memory granularity).
    #[inline]
    pub(super) fn expandable_page_size(&self, small: bool) -> u64 {
        if small || self.config.policy == ReservoirPolicy::Reservoir {
            super::rules::SMALL_BUFFER
        } else {
            self.config.large_segment_size
        }
    }
}

/// `space` rounded up to whole pages of `page` bytes (0 is taken as 1), or
/// the largest whole number of pages that `u64` holds when that overflows.
pub(super) fn whole_pages(space: u64, page: u64) -> u64 {
    let page = page.max(1);
    space
        .checked_next_multiple_of(page)
        .unwrap_or(u64::MAX / page * page)
}
