//! The state of one device's caching allocator: PyTorch's
//! `DeviceCachingAllocator`, as the aggregate of its owners.
//!
//! Everything here runs under the device lock held by
//! [`CachingAllocator`](super::CachingAllocator). The behaviour lives in the
//! owners' files, each named after PyTorch's function or concept: `malloc`,
//! `free`, `release`, `events`, `expandable`, `pools`, `accounting`, `oom`,
//! `policy`; the blocks and segments are a [`BlockStore`]. Each function
//! mirrors the PyTorch function of the same name; the spec section is named
//! on each.

pub(crate) mod accounting;
pub(crate) mod events;
pub(crate) mod observe;
pub(crate) mod pools;
pub(crate) mod streams;

use self::accounting::Accounting;
use self::events::Events;
use self::observe::Observe;
use self::pools::{Pools, PrivatePools};
use self::streams::Streams;
use super::pointer_map::PointerMap;
use crate::backend::{Backend, BackendError};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::store::{BlockId, BlockStore};

/// The state of one device's caching allocator: the aggregate of its
/// owners, the device and the settings, nothing loose. Each owner's
/// invariants are written on its type; `check.rs` recounts them after every
/// operation in tests.
pub(crate) struct DeviceState {
    /// The device index, for messages and trace entries.
    pub(in crate::caching) device: i8,
    /// The settings in force (replaced at run time by `set_config`); the
    /// policy's state is theirs ([`AllocatorConfig::policy`]).
    pub(in crate::caching) config: AllocatorConfig,
    /// Segments and their blocks (see `store`).
    pub(in crate::caching) store: BlockStore,
    /// Free lists, by pool slot, and the rule their keys are built by (see
    /// [`Pools`]). Invariant: a mapped block is in its pool's `blocks`
    /// exactly when it is live, not allocated and has no pending events or
    /// stream uses; an unmapped block is always in `unmapped`.
    pub(in crate::caching) pools: Pools,
    /// Allocated blocks by address (PyTorch's sharded `allocated_blocks`).
    /// Invariant: holds exactly the allocated blocks.
    pub(in crate::caching) allocated: PointerMap,
    /// PyTorch's statistics, the bytes taken from the driver and the
    /// per-process limit, changed only through [`Accounting`]'s named
    /// events. Invariant: every gauge equals a recount of the blocks and
    /// segments.
    pub(in crate::caching) acct: Accounting,
    /// Cross-stream events and deferred frees (see `events.rs`).
    pub(in crate::caching) events: Events,
    /// History, trace trackers, callbacks, out-of-memory observers and
    /// debug output (see `observe.rs`).
    pub(in crate::caching) obs: Observe,
    /// Private pools and the allocations routed to them (see `pools.rs`).
    pub(in crate::caching) private: PrivatePools,
    /// The streams the backend confirmed and the cross-stream reuses (see
    /// `streams.rs`).
    pub(in crate::caching) streams: Streams,
}

impl DeviceState {
    /// Refuse a stream the backend does not know, before anything changes
    /// (see [`Streams::check`]).
    #[inline]
    pub fn check_stream<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: crate::backend::StreamId,
    ) -> Result<(), AllocError> {
        self.streams.check(backend, stream)
    }
}

impl DeviceState {
    pub fn new(device: i8, config: AllocatorConfig) -> DeviceState {
        let acct = Accounting::new(config.max_split_size);
        let free_order = config.torch_release.rules().free_block_order;
        let mut store = BlockStore::default();
        // The release's order, decided once: each block carries its rank.
        store.set_block_rank(pools::block_rank(free_order));
        DeviceState {
            device,
            config,
            store,
            pools: Pools::new(),
            allocated: PointerMap::default(),
            acct,
            events: Events::new(device),
            obs: Observe::new(Default::default()),
            private: PrivatePools::default(),
            streams: Streams::default(),
        }
    }

    /// spec 1.13: largest free block, seeded with the device's free memory.
    pub fn cache_info<B: Backend + ?Sized>(&self, backend: &B) -> Result<u64, BackendError> {
        let mut largest = backend.mem_info()?.free;
        for pool in self.pools.iter() {
            for k in pool.iter() {
                largest = largest.max(k.size);
            }
        }
        Ok(largest)
    }

    /// spec 1.13: the segment base and total size of an allocated block.
    pub fn base_allocation(&self, id: BlockId) -> Result<(u64, u64), AllocError> {
        let seg = self.store.segment(self.store.block(id).segment());
        if seg.expandable().is_some() {
            return Err(AllocError::InvalidState(
                "Tensors allocated with expandable_segments:True cannot be shared between \
                 processes. Consider using expandable_segments:False in data loading workers via \
                 torch.cuda.memory._set_allocator_settings('expandable_segments:False')"
                    .into(),
            ));
        }
        Ok((seg.addr(), seg.size()))
    }
}
