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

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use super::history::Observe;
use super::malloc::FreeMemoryCallback;
use super::oom::OomObserver;
use super::pools::BlockPool;
use super::pools::{FilterFn, PrivatePool};
use super::stream_order::{C10Streams, MempoolSet, StreamTable};
use crate::backend::{Backend, BackendError, EventId, StreamId};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::stats::DeviceStats;
use crate::store::{BlockId, BlockStore, PoolId};

/// The state of one device's caching allocator.
pub(crate) struct DeviceState {
    pub device: i8,
    pub config: AllocatorConfig,
    /// Segments and their blocks (see `store`).
    pub store: BlockStore,
    pub pools: Vec<BlockPool>,
    /// Allocated blocks by address (PyTorch's sharded `allocated_blocks`).
    pub allocated: FxHashMap<u64, BlockId>,
    pub stats: DeviceStats,
    /// Bytes obtained from the driver (PyTorch's `total_allocated_memory`).
    pub total_allocated_memory: u64,
    /// The per-process limit (`set_per_process_memory_fraction` below 1.0).
    pub allowed_memory_maximum: Option<u64>,
    /// Per-stream FIFOs of (event, block) recorded at cross-stream frees,
    /// in PyTorch's `cuda_events` hash-map layout (see `stream_order`).
    pub events: StreamTable<VecDeque<(EventId, BlockId)>>,
    /// c10 stream ids, which order `events` as PyTorch's hash map does.
    pub c10_streams: C10Streams,
    /// History, trace trackers, callbacks and debug output (see `history.rs`).
    pub obs: Observe,
    /// Private pools by id (PyTorch's `graph_pools`).
    pub graph_pools: BTreeMap<MempoolId, PrivatePool>,
    /// Private pools whose use count reached 0 (`graph_pools_freeable`).
    pub graph_pools_freeable: MempoolSet,
    /// Pools being allocated to, with their filters (`captures_underway`).
    pub captures_underway: Vec<(MempoolId, FilterFn)>,
    /// Cross-stream frees made while allocating to a pool, waiting for the
    /// end of all captures before their events are recorded.
    pub needs_events_deferred: Vec<BlockId>,
    /// Streams recorded on a block while a pool allocation was underway
    /// (PyTorch's `block_to_cudagraph_stream_uses`): a free deferred until the
    /// end of all captures does not wait for them.
    pub capture_stream_uses: FxHashMap<BlockId, Vec<StreamId>>,
    /// Pool slots of erased private pools, for reuse.
    pub free_pool_slots: Vec<PoolId>,
    /// Segments created so far (the next segment's `seq`).
    pub segment_seq: u64,
    /// Rank segments among equal free blocks by address (PyTorch's source
    /// order, what recorded traces show) instead of creation order; set by
    /// replays of recorded traces (see `caching::seed`).
    pub rank_by_address: bool,
    /// `max_split_size` changed at run time: the oversize counters then mix
    /// two thresholds (as in PyTorch) and cannot be recounted.
    pub max_split_changed: bool,
    pub free_memory_callbacks: Vec<FreeMemoryCallback>,
    pub oom_observers: Vec<OomObserver>,
    /// Blocks borrowed from another stream's pool (cross-stream reuse).
    pub cross_stream_reuses: u64,
}

impl DeviceState {
    pub fn new(device: i8, config: AllocatorConfig) -> DeviceState {
        let stats = DeviceStats {
            max_split_size: if config.max_split_size == u64::MAX {
                -1
            } else {
                config.max_split_size as i64
            },
            ..DeviceStats::default()
        };
        DeviceState {
            device,
            config,
            store: BlockStore::default(),
            pools: vec![BlockPool::new(false, None), BlockPool::new(true, None)],
            allocated: FxHashMap::default(),
            stats,
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            events: StreamTable::new(),
            c10_streams: C10Streams::new(device),
            obs: Observe::new(Default::default()),
            graph_pools: BTreeMap::new(),
            graph_pools_freeable: MempoolSet::default(),
            captures_underway: Vec::new(),
            needs_events_deferred: Vec::new(),
            capture_stream_uses: FxHashMap::default(),
            free_pool_slots: Vec::new(),
            segment_seq: 0,
            rank_by_address: false,
            max_split_changed: false,
            free_memory_callbacks: Vec::new(),
            oom_observers: Vec::new(),
            cross_stream_reuses: 0,
        }
    }

    /// spec 1.13: largest free block, seeded with the device's free memory.
    pub fn cache_info<B: Backend + ?Sized>(&self, backend: &B) -> Result<u64, BackendError> {
        let mut largest = backend.mem_info()?.free;
        for pool in &self.pools {
            for k in &pool.blocks {
                largest = largest.max(k.size);
            }
        }
        Ok(largest)
    }

    /// spec 1.13: the segment base and total size of an allocated block.
    pub fn base_allocation(&self, id: BlockId) -> Result<(u64, u64), AllocError> {
        let seg = &self.store.segments[self.store.blocks[id].segment];
        if seg.expandable.is_some() {
            return Err(AllocError::InvalidState(
                "Tensors allocated with expandable_segments:True cannot be shared between \
                 processes. Consider using expandable_segments:False in data loading workers via \
                 torch.cuda.memory._set_allocator_settings('expandable_segments:False')"
                    .into(),
            ));
        }
        Ok((seg.addr, seg.size))
    }
}
