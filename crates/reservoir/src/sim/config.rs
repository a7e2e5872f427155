//! The simulated device's configuration: capacity and granularities, the
//! placement of addresses ([`AddressPolicy`]), the driver cost model
//! ([`CostModel`]) and [`SimConfig`], which gathers them.

use std::collections::VecDeque;

use super::HoldSemantics;
#[cfg(doc)]
use super::{SimCounters, SimDevice};
#[cfg(doc)]
use crate::backend::{Backend, MemInfo, VirtualMemory};

const MIB: u64 = 1 << 20;

/// Default capacity of a [`SimConfig`]: 80 GiB.
pub const DEFAULT_CAPACITY: u64 = 80 << 30;

/// The fake CUDA driver's default capacity (`FAKECUDA_TOTAL_MEM`,
/// 85 045 870 592 bytes: what an H100 80GB HBM3 reports as total).
pub const FAKE_DRIVER_CAPACITY: u64 = 85_045_870_592;

/// Default accounting granularity and virtual-memory page size: 2 MiB (the
/// fake driver's `FAKECUDA_GRANULARITY` and `cuMemGetAllocationGranularity`).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// Default lower end of the placement window: 4 GiB.
pub const DEFAULT_ADDRESS_LOW: u64 = 0x1_0000_0000;

/// Default upper end of the placement window, the "mmap base" that Linux-style
/// placement grows down from: `0x7f00_0000_0000`.
pub const DEFAULT_ADDRESS_HIGH: u64 = 0x7f00_0000_0000;

/// Default page size of the address space (the fake driver `mmap`s each
/// allocation rounded up to it): 4096.
pub const DEFAULT_PAGE_SIZE: u64 = 4096;

/// Where the simulated device places new allocations and reservations.
///
/// Whatever the policy, every allocation occupies `round_up(size, page_size)`
/// bytes of address space, and ranges never overlap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AddressPolicy {
    /// Where Linux's top-down `mmap` puts anonymous mappings: the highest free
    /// gap of the placement window that fits, with the mapping at the top of
    /// that gap. Freed ranges become gaps again and merge with their
    /// neighbours. The default.
    ///
    /// Reservations are placed like the fake driver's `cuMemAddressReserve`:
    /// `size + granularity` bytes are taken and the base is rounded up to the
    /// virtual-memory granularity.
    #[default]
    LinuxMmap,
    /// Increasing addresses from the bottom of the placement window, never
    /// reused once freed.
    BumpUp,
    /// Hand out these addresses in order (allocations and reservations
    /// alike, one address per successful call), then fall back to
    /// [`LinuxMmap`](AddressPolicy::LinuxMmap). An address whose range is not
    /// free is skipped (consumed) and the call falls back to `LinuxMmap`
    /// ([`SimCounters::scripted_fallbacks`] counts that). Scripted addresses
    /// may lie anywhere in the 64-bit space except the first and last page.
    Scripted(VecDeque<u64>),
}

/// The driver cost model: simulated nanoseconds charged for each device call,
/// accumulated in [`SimCounters::driver_time_ns`].
///
/// The defaults are rough figures for a current datacenter GPU (CUDA 12/13,
/// H100-class), where `cudaMalloc` costs about 10 us for small segments and
/// about 100 us per GiB; they are meant for comparing policies (fewer, larger
/// driver calls versus more, smaller ones), not as measurements. Failed
/// calls are charged their fixed part only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CostModel {
    /// Fixed cost of an allocation (`cudaMalloc`). Default 10 000 ns.
    pub alloc_ns: u64,
    /// Extra allocation cost per started MiB. Default 90 ns (about 100 us in
    /// total for 1 GiB).
    pub alloc_ns_per_mib: u64,
    /// Fixed cost of a free (`cudaFree`). Default 8 000 ns.
    pub free_ns: u64,
    /// Extra free cost per started MiB. Default 20 ns.
    pub free_ns_per_mib: u64,
    /// Fixed cost of a map call (`cuMemCreate` + `cuMemMap` +
    /// `cuMemSetAccess`). Default 4 000 ns.
    pub map_ns: u64,
    /// Extra map cost per virtual-memory page. Default 2 000 ns.
    pub map_ns_per_page: u64,
    /// Fixed cost of an unmap call (`cuMemUnmap` + `cuMemRelease`). Default
    /// 3 000 ns.
    pub unmap_ns: u64,
    /// Extra unmap cost per virtual-memory page. Default 1 000 ns.
    pub unmap_ns_per_page: u64,
    /// Cost of reserving address space (`cuMemAddressReserve`). Default 2 000 ns.
    pub reserve_ns: u64,
    /// Cost of releasing address space (`cuMemAddressFree`). Default 2 000 ns.
    pub release_ns: u64,
}

impl CostModel {
    /// A model where every call is free.
    pub const ZERO: CostModel = CostModel {
        alloc_ns: 0,
        alloc_ns_per_mib: 0,
        free_ns: 0,
        free_ns_per_mib: 0,
        map_ns: 0,
        map_ns_per_page: 0,
        unmap_ns: 0,
        unmap_ns_per_page: 0,
        reserve_ns: 0,
        release_ns: 0,
    };

    /// Cost of a successful allocation of `size` bytes.
    pub fn alloc(&self, size: u64) -> u64 {
        self.alloc_ns
            .saturating_add(self.alloc_ns_per_mib.saturating_mul(size.div_ceil(MIB)))
    }

    /// Cost of freeing `size` bytes.
    pub fn free(&self, size: u64) -> u64 {
        self.free_ns
            .saturating_add(self.free_ns_per_mib.saturating_mul(size.div_ceil(MIB)))
    }

    /// Cost of a successful map of `pages` virtual-memory pages.
    pub fn map(&self, pages: u64) -> u64 {
        self.map_ns
            .saturating_add(self.map_ns_per_page.saturating_mul(pages))
    }

    /// Cost of unmapping `pages` virtual-memory pages.
    pub fn unmap(&self, pages: u64) -> u64 {
        self.unmap_ns
            .saturating_add(self.unmap_ns_per_page.saturating_mul(pages))
    }
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel {
            alloc_ns: 10_000,
            alloc_ns_per_mib: 90,
            free_ns: 8_000,
            free_ns_per_mib: 20,
            map_ns: 4_000,
            map_ns_per_page: 2_000,
            unmap_ns: 3_000,
            unmap_ns_per_page: 1_000,
            reserve_ns: 2_000,
            release_ns: 2_000,
        }
    }
}

/// Settings of a [`SimDevice`]. Plain data; see each field for its default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Device capacity in bytes, what [`MemInfo::total`] reports. Default
    /// [`DEFAULT_CAPACITY`] (80 GiB). Can change at run time
    /// ([`SimDevice::set_capacity`]).
    pub capacity: u64,
    /// Accounting unit of plain allocations: each counts
    /// `round_up(size, accounting_granularity)` against the capacity.
    /// Default [`DEFAULT_GRANULARITY`] (2 MiB); 0 is treated as 1.
    pub accounting_granularity: u64,
    /// Bytes held by "the context": shown as used in [`MemInfo::free`] and
    /// never available to allocations (the fake's `FAKECUDA_RESERVED`).
    /// Default 0.
    pub context_reserved: u64,
    /// Where addresses go. Default [`AddressPolicy::LinuxMmap`].
    pub address_policy: AddressPolicy,
    /// Lower end of the placement window (inclusive). Default
    /// [`DEFAULT_ADDRESS_LOW`]. Rounded up to the page size.
    pub address_low: u64,
    /// Upper end of the placement window (exclusive): Linux-style placement
    /// starts just below it. Default [`DEFAULT_ADDRESS_HIGH`]. Rounded down to
    /// the page size.
    pub address_high: u64,
    /// Page size of the address space: every allocation occupies its size
    /// rounded up to it. Default [`DEFAULT_PAGE_SIZE`] (4096); rounded up to
    /// a power of two.
    pub page_size: u64,
    /// Virtual-memory granularity ([`VirtualMemory::granularity`]). Default
    /// [`DEFAULT_GRANULARITY`] (2 MiB); rounded up to a multiple of the page
    /// size.
    pub vm_granularity: u64,
    /// Simulated driver costs. Default [`CostModel::default`].
    pub cost: CostModel,
    /// What events recorded on held streams wait for. Default
    /// [`HoldSemantics::AllEvents`].
    pub hold_semantics: HoldSemantics,
    /// Record the device-call log from the start. Default false.
    pub call_log: bool,
    /// The most streams the device holds, the default stream and
    /// registered streams included: [`create_stream`](Backend::create_stream)
    /// past it fails. Default
    /// [`DEFAULT_STREAM_LIMIT`](crate::backend::DEFAULT_STREAM_LIMIT)
    /// (65,536). [`SimDevice::register_stream`] is not limited (a replay
    /// registers its trace's streams).
    pub max_streams: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            capacity: DEFAULT_CAPACITY,
            accounting_granularity: DEFAULT_GRANULARITY,
            context_reserved: 0,
            address_policy: AddressPolicy::LinuxMmap,
            address_low: DEFAULT_ADDRESS_LOW,
            address_high: DEFAULT_ADDRESS_HIGH,
            page_size: DEFAULT_PAGE_SIZE,
            vm_granularity: DEFAULT_GRANULARITY,
            cost: CostModel::default(),
            hold_semantics: HoldSemantics::AllEvents,
            call_log: false,
            max_streams: crate::backend::DEFAULT_STREAM_LIMIT,
        }
    }
}

impl SimConfig {
    /// The fake CUDA driver's defaults, for replays compared with the oracle:
    /// capacity [`FAKE_DRIVER_CAPACITY`] and
    /// [`HoldSemantics::EnqueuedWork`]; everything else as [`Default`].
    pub fn like_fake_driver() -> Self {
        SimConfig {
            capacity: FAKE_DRIVER_CAPACITY,
            hold_semantics: HoldSemantics::EnqueuedWork,
            ..SimConfig::default()
        }
    }
}
