//! The constants, usage flags and pool kinds of `MPSAllocator.h` (spec 4.1),
//! and the MPS allocator's `format_size` of each PyTorch era.

use crate::store::PoolId;
use std::fmt;

pub use crate::format::{format_size_2_6, SizeFormat};

const MIB: u64 = 1 << 20;

/// `kMaxSmallAlloc`: buffers up to 1 MiB go to the small pools.
pub const MAX_SMALL_ALLOC: u64 = MIB;
/// `kMinLargeAlloc`: below 10 MiB a new heap is 32 MiB.
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// `kRoundLarge`: single-buffer heaps are rounded up to 2 MiB.
pub const ROUND_LARGE: u64 = 2 * MIB;
/// `kSmallHeap`: the heap of a small buffer, 8 MiB.
pub const SMALL_HEAP: u64 = 8 * MIB;
/// `kLargeHeap`: the heap of a buffer under 10 MiB, 32 MiB; also how much
/// larger than the request a reused whole buffer may be (spec 4.2 step 5).
pub const LARGE_HEAP: u64 = 32 * MIB;
/// `kXLargeHeapD`: the extra-large heap on a discrete GPU, 128 MiB.
pub const XLARGE_HEAP_DISCRETE: u64 = 128 * MIB;
/// `kXLargeHeapU`: the extra-large heap on unified memory, 1 GiB.
pub const XLARGE_HEAP_UNIFIED: u64 = 1024 * MIB;
/// `kMaxScalarAlloc`: the largest scalar buffer, 8 bytes.
pub const MAX_SCALAR_ALLOC: u64 = 8;

/// `UsageFlags` (spec 4.1): what a buffer is for; a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UsageFlags(pub u32);

impl UsageFlags {
    /// Private storage (0: the absence of `SHARED`).
    pub const PRIVATE: UsageFlags = UsageFlags(0);
    /// Small pool.
    pub const SMALL: UsageFlags = UsageFlags(1);
    /// Shared (host-visible) storage.
    pub const SHARED: UsageFlags = UsageFlags(2);
    /// Managed storage.
    pub const MANAGED: UsageFlags = UsageFlags(4);
    /// Automatic hazard tracking.
    pub const HAZARD: UsageFlags = UsageFlags(8);
    /// The scalar pool.
    pub const SCALAR: UsageFlags = UsageFlags(16);

    /// True when every bit of `other` is set (`PRIVATE` is always contained).
    pub fn contains(self, other: UsageFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The resource options of a buffer with these flags (spec 4.1).
    pub fn resource_options(self) -> ResourceOptions {
        let storage = if self.contains(UsageFlags::MANAGED) {
            StorageMode::Managed
        } else if self.contains(UsageFlags::SHARED) {
            StorageMode::Shared
        } else {
            StorageMode::Private
        };
        ResourceOptions {
            storage,
            hazard_tracked: self.contains(UsageFlags::HAZARD),
        }
    }
}

impl std::ops::BitOr for UsageFlags {
    type Output = UsageFlags;
    fn bitor(self, rhs: UsageFlags) -> UsageFlags {
        UsageFlags(self.0 | rhs.0)
    }
}

/// Metal's storage mode of a heap and its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageMode {
    /// `MTLStorageModeManaged`.
    Managed,
    /// `MTLStorageModeShared`: visible to the host.
    Shared,
    /// `MTLStorageModePrivate`: device only.
    Private,
}

/// `HeapBlock::getOptions`: storage mode and hazard tracking (the CPU cache
/// mode is always the default one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceOptions {
    /// The storage mode.
    pub storage: StorageMode,
    /// `MTLHazardTrackingModeTracked` (else untracked).
    pub hazard_tracked: bool,
}

/// The five buffer pools (`BufferPool::Kind`, spec 4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKind {
    /// Private buffers above 1 MiB.
    PrivateLarge = 0,
    /// Shared buffers above 1 MiB.
    SharedLarge = 1,
    /// Private buffers up to 1 MiB.
    PrivateSmall = 2,
    /// Shared buffers up to 1 MiB.
    SharedSmall = 3,
    /// Scalars (at most 8 bytes), not hazard tracked.
    Scalar = 4,
}

impl PoolKind {
    /// Every pool, in the order `release_cached_buffers` empties them.
    pub const ALL: [PoolKind; 5] = [
        PoolKind::PrivateLarge,
        PoolKind::SharedLarge,
        PoolKind::PrivateSmall,
        PoolKind::SharedSmall,
        PoolKind::Scalar,
    ];

    /// The pool's usage flags.
    pub fn usage(self) -> UsageFlags {
        use UsageFlags as U;
        match self {
            PoolKind::PrivateLarge => U::PRIVATE | U::HAZARD,
            PoolKind::SharedLarge => U::SHARED | U::HAZARD,
            PoolKind::PrivateSmall => U::SMALL | U::PRIVATE | U::HAZARD,
            PoolKind::SharedSmall => U::SMALL | U::SHARED | U::HAZARD,
            PoolKind::Scalar => U::SMALL | U::SHARED | U::SCALAR,
        }
    }

    /// A small pool (the scalar pool is one).
    pub fn is_small(self) -> bool {
        self.usage().contains(UsageFlags::SMALL)
    }

    /// A shared pool.
    pub fn is_shared(self) -> bool {
        self.usage().contains(UsageFlags::SHARED)
    }

    /// "shared" or "private", as the messages say.
    pub fn storage_word(self) -> &'static str {
        if self.is_shared() {
            "shared"
        } else {
            "private"
        }
    }

    /// " scalar" for the scalar pool, "" otherwise (debug messages).
    pub(crate) fn scalar_word(self) -> &'static str {
        if self == PoolKind::Scalar {
            " scalar"
        } else {
            ""
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The pool the store's pool id `pool` names (the heap numbers its
    /// pools by [`index`](Self::index), see [`pool_id`](Self::pool_id)).
    pub(crate) fn from_pool(pool: PoolId) -> PoolKind {
        PoolKind::ALL[pool.index()]
    }

    /// The store's pool id of this pool.
    pub(crate) fn pool_id(self) -> PoolId {
        PoolId::new(self as u32)
    }
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = if self.is_small() { "small" } else { "large" };
        write!(f, "{size} {}{}", self.storage_word(), self.scalar_word())
    }
}

/// The MPS allocator's `format_size` in the seed's 2.7-era code
/// (pytorch/pytorch 57ba412), which is c10's
/// `c10::CachingAllocator::format_size`: "bytes" up to 1024 bytes, then
/// "KiB" up to 1 MiB, "MiB" up to 1 GiB, else "GiB", the size divided as a
/// `double` and printed with two decimals; the boundaries are inclusive.
///
/// ```
/// use reservoir::heap::format_size;
/// assert_eq!(format_size(1024), "1024 bytes");
/// assert_eq!(format_size(1025), "1.00 KiB");
/// assert_eq!(format_size(32 << 20), "32.00 MiB");
/// assert_eq!(format_size(524_293_232), "500.00 MiB");
/// assert_eq!(format_size(3 << 30), "3.00 GiB");
/// ```
pub fn format_size(size: u64) -> String {
    crate::format::format_size(size)
}
