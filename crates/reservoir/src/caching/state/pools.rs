//! The free-list owners: a pool's free and unmapped blocks ordered as
//! PyTorch's `BlockPool` orders them, and the private pools. The operations
//! that move blocks between pools are in `pools.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::backend::StreamId;
use crate::caching::stream_order::MempoolSet;
use crate::ids::MempoolId;
use crate::store::{BlockId, FreeList, PoolId, RankedKey, SizeClassList, SizeClassed};

/// The global large pool (free blocks above 1 MiB).
pub(crate) const POOL_LARGE: PoolId = 0;
/// The global small pool (free blocks of at most 1 MiB).
pub(crate) const POOL_SMALL: PoolId = 1;

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

/// A [`FreeKey`] without its stream: what a stream's size classes store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKeyInStream {
    size: u64,
    rank: u64,
    addr: u64,
    id: BlockId,
}

impl RankedKey for FreeKeyInStream {
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline]
    fn rank(&self) -> u64 {
        self.rank
    }
}

impl SizeClassed for FreeKey {
    type Inner = FreeKeyInStream;
    #[inline]
    fn group(&self) -> u64 {
        self.stream.0
    }
    #[inline]
    fn size(&self) -> u64 {
        self.size
    }
    #[inline]
    fn inner(&self) -> FreeKeyInStream {
        FreeKeyInStream {
            size: self.size,
            rank: self.rank,
            addr: self.addr,
            id: self.id,
        }
    }
    #[inline]
    fn join(group: u64, k: FreeKeyInStream) -> FreeKey {
        FreeKey {
            stream: StreamId(group),
            size: k.size,
            rank: k.rank,
            addr: k.addr,
            id: k.id,
        }
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
    /// Free, mapped blocks in (stream, size, address) order, indexed by
    /// stream and size class.
    pub blocks: SizeClassList<FreeKey>,
    /// Unmapped blocks of expandable segments in (stream, address) order.
    pub unmapped: FreeList<UnmappedKey>,
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
            blocks: SizeClassList::default(),
            unmapped: FreeList::default(),
            is_small,
            owner,
            get_free_blocks_call_count: 0,
        }
    }
}

/// Decides whether an allocation on a stream goes to a private pool
/// (PyTorch's capture filter). See [`PoolFilter`].
pub(crate) type FilterFn = Arc<dyn Fn(StreamId) -> bool + Send + Sync>;

/// A private memory pool (PyTorch's `PrivatePool`, CUDA-graph style).
pub(crate) struct PrivatePool {
    /// Users (captures, MemPools) still holding the pool; at 0 it is freeable.
    pub use_count: u32,
    /// Driver allocations (and expandable allocations) not given back yet.
    pub cuda_malloc_count: u32,
    /// The pool's large-block pool.
    pub large: PoolId,
    /// The pool's small-block pool.
    pub small: PoolId,
}

/// The private pools of one device (PyTorch's `graph_pools` and friends).
#[derive(Default)]
pub(crate) struct PrivatePools {
    /// Private pools by id (PyTorch's `graph_pools`). Invariant: each owns
    /// two slots of `DeviceState::pools` (small and large) whose `owner` is
    /// its id; a pool stays while it owns a segment.
    pub graph_pools: BTreeMap<MempoolId, PrivatePool>,
    /// Private pools whose use count reached 0 (`graph_pools_freeable`).
    /// Invariant: a subset of `graph_pools`' keys.
    pub graph_pools_freeable: MempoolSet,
    /// Pools being allocated to, with their filters (`captures_underway`),
    /// oldest first. Invariant: ids are distinct keys of `graph_pools`.
    pub captures_underway: Vec<(MempoolId, FilterFn)>,
    /// Pool slots of erased private pools, for reuse (their `owner` is None).
    pub free_pool_slots: Vec<PoolId>,
}
