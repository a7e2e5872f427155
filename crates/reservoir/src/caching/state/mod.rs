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

use self::accounting::Accounting;
use self::events::Events;
use self::observe::Observe;
use self::pools::{BlockPool, PrivatePools};
use super::pointer_map::PointerMap;
use super::request::{FreeMemoryCallback, OomObserver};
use crate::backend::{Backend, BackendError};
use crate::config::{AllocatorConfig, FreeBlockOrder};
use crate::error::AllocError;
use crate::store::{BlockId, BlockStore};

/// The state of one device's caching allocator: the aggregate of its
/// owners. Each field's invariants are written on it (or on the owner's
/// type); `check.rs` recounts them after every operation in tests.
pub(crate) struct DeviceState {
    /// The device index, for messages and trace entries.
    pub(in crate::caching) device: i8,
    /// The settings in force (replaced at run time by `set_config`).
    pub(in crate::caching) config: AllocatorConfig,
    /// Segments and their blocks (see `store`).
    pub(in crate::caching) store: BlockStore,
    /// Free lists: [`POOL_LARGE`](self::pools::POOL_LARGE),
    /// [`POOL_SMALL`](self::pools::POOL_SMALL), then the slots of private
    /// pools (see `pools.rs`). Invariant: a mapped block is in its pool's
    /// `blocks` exactly when it is live, not allocated and has no pending
    /// events or stream uses; an unmapped block is always in `unmapped`.
    pub(in crate::caching) pools: Vec<BlockPool>,
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
    /// History, trace trackers, callbacks and debug output (see `history.rs`).
    pub(in crate::caching) obs: Observe,
    /// Private pools and the allocations routed to them (see `pools.rs`).
    pub(in crate::caching) private: PrivatePools,
    /// What ranks free blocks of equal size in every pool (see
    /// [`DeviceState::free_key`]): the release's
    /// [`ReleaseRules::free_block_order`](crate::config::ReleaseRules::free_block_order),
    /// or the segment's `seq` when the store ranks segments by address
    /// ([`BlockStore::ranks_by_address`]: torch 2.11's order, what recorded
    /// traces show; set by replays, see `caching::seed`). Decided once (by
    /// [`DeviceState::set_free_order`]), not on each key.
    pub(in crate::caching) free_order: FreeBlockOrder,
    /// Run when the cache has no fitting block (see `malloc.rs`).
    pub(in crate::caching) free_memory_callbacks: Vec<FreeMemoryCallback>,
    /// Told of every out-of-memory error, outside the lock (see `oom.rs`).
    pub(in crate::caching) oom_observers: Vec<OomObserver>,
    /// Blocks borrowed from another stream's pool (see `policy.rs`); 0 in
    /// PyTorch mode.
    pub(in crate::caching) cross_stream_reuses: u64,
    /// Streams the backend confirmed ([`Backend::check_stream`]), so that
    /// only a stream's first use asks it (see [`KnownStreams`]).
    pub(in crate::caching) known_streams: KnownStreams,
}

/// The non-default streams a backend confirmed, valid while its
/// [`Backend::stream_epoch`] stays at `epoch`. Not part of PyTorch's state:
/// PyTorch trusts every stream it is handed (they come from `c10::Stream`).
#[derive(Default)]
pub(crate) struct KnownStreams {
    epoch: u64,
    /// The last stream confirmed (the common case: one side stream in a row).
    last: Option<u64>,
    set: rustc_hash::FxHashSet<u64>,
}

impl DeviceState {
    /// Refuse a stream the backend does not know, before anything changes:
    /// [`AllocError::UnknownStream`] naming it. The default stream is always
    /// known.
    #[inline]
    pub fn check_stream<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: crate::backend::StreamId,
    ) -> Result<(), AllocError> {
        if stream == crate::backend::StreamId::DEFAULT {
            return Ok(());
        }
        let k = &self.known_streams;
        if k.last == Some(stream.0) && k.epoch == backend.stream_epoch() {
            return Ok(());
        }
        self.check_stream_slow(backend, stream)
    }

    #[inline(never)]
    fn check_stream_slow<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: crate::backend::StreamId,
    ) -> Result<(), AllocError> {
        let epoch = backend.stream_epoch();
        let k = &mut self.known_streams;
        if k.epoch != epoch {
            k.set.clear();
            k.last = None;
            k.epoch = epoch;
        }
        if !k.set.contains(&stream.0) {
            backend
                .check_stream(stream)
                .map_err(|e| AllocError::from_stream_check(stream, e))?;
            // Re-read: `check_stream` may have run while another stream was
            // forgotten.
            if backend.stream_epoch() == epoch {
                k.set.insert(stream.0);
            }
        }
        k.last = Some(stream.0);
        Ok(())
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
            pools: vec![BlockPool::new(false, None), BlockPool::new(true, None)],
            allocated: PointerMap::default(),
            acct,
            events: Events::new(device),
            obs: Observe::new(Default::default()),
            private: PrivatePools::default(),
            free_order,
            free_memory_callbacks: Vec::new(),
            oom_observers: Vec::new(),
            cross_stream_reuses: 0,
            known_streams: KnownStreams::default(),
        }
    }

    /// spec 1.13: largest free block, seeded with the device's free memory.
    pub fn cache_info<B: Backend + ?Sized>(&self, backend: &B) -> Result<u64, BackendError> {
        let mut largest = backend.mem_info()?.free;
        for pool in &self.pools {
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
