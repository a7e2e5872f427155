//! The simulated device: the embedded default [`Backend`].
//!
//! [`SimDevice`] is a device that exists only as bookkeeping. It behaves like
//! the fake CUDA driver that the real PyTorch allocator runs on in
//! `../shared/oracle` (`src/fakecudart.cpp`), so that a replay through
//! Reservoir on a `SimDevice` can be compared call by call with a replay
//! through PyTorch on the fake driver:
//!
//! * **Capacity** is enforced exactly, as the fake's `acct_take` does: an
//!   allocation of `size` bytes counts `round_up(size, granularity)` against
//!   the capacity (2 MiB units by default) and fails with
//!   [`BackendError::OutOfMemory`] when
//!   `used + accounted + context_reserved > capacity`.
//! * **Addresses** never overlap and are deterministic. By default they are
//!   placed where Linux's top-down `mmap` places the fake's anonymous
//!   mappings ([`AddressPolicy::LinuxMmap`]), so tie-breaking by address in a
//!   best-fit search behaves like on the oracle. Recorded addresses can be
//!   replayed ([`AddressPolicy::Scripted`]).
//! * **Streams and events** follow the fake's completion model (see
//!   [`HoldSemantics`]): work completes at once unless its stream is held.
//!   [`AsyncSimDevice`] is the same memory with work of given durations on a
//!   simulated clock and a race sanitizer.
//! * **Virtual memory** ([`VirtualMemory`]): reservations take address space
//!   only; mapped pages count against the capacity.
//! * **Observability and faults**: counters ([`SimCounters`]), a device-call
//!   log ([`DeviceCall`], the oracle's `device_calls`), a driver cost model
//!   ([`CostModel`]) and fault injection ([`SimDevice::fail_nth_alloc`],
//!   [`SimDevice::fail_allocs_above`], [`SimDevice::set_capacity`]).
//!
//! ```
//! use reservoir::backend::{Backend, StreamId};
//! use reservoir::sim::{SimConfig, SimDevice};
//!
//! let dev = SimDevice::new(SimConfig { capacity: 8 << 20, ..SimConfig::default() });
//! let a = dev.allocate(1, StreamId::DEFAULT).unwrap(); // counts 2 MiB
//! let b = dev.allocate(6 << 20, StreamId::DEFAULT).unwrap();
//! assert!(dev.allocate(1, StreamId::DEFAULT).unwrap_err().is_retryable());
//! assert!(b < a); // top-down placement
//! dev.free(a, 1).unwrap();
//! dev.free(b, 6 << 20).unwrap();
//! assert_eq!(dev.counters().bytes_in_use, 0);
//! ```
//!
//! All state sits behind one mutex: the device is `Send + Sync` and every
//! method takes `&self`.

mod addr;
mod clock;
mod streams;

pub use clock::{Access, AccessKind, AsyncSimDevice, RaceKind, RaceReport, HOLD_NS};
pub use streams::HoldSemantics;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::backend::{
    Backend, BackendError, DevicePtr, EventId, HostMapping, MemInfo, Reservation, StreamId,
    VirtualMemory,
};
use addr::{round_up, AddressSpace};

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

/// A snapshot of the simulated device's counters ([`SimDevice::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimCounters {
    /// Successful allocations ([`Backend::allocate`]).
    pub allocs: u64,
    /// Successful frees ([`Backend::free`]).
    pub frees: u64,
    /// Allocations that failed with out of memory (capacity or injected).
    pub failed_allocs: u64,
    /// Live plain allocations.
    pub live_allocs: u64,
    /// Bytes accounted against the capacity now: plain allocations (rounded
    /// to the accounting granularity) plus mapped pages. Excludes
    /// [`SimConfig::context_reserved`].
    pub bytes_in_use: u64,
    /// Highest `bytes_in_use` since creation or [`SimDevice::reset_peak`].
    pub peak_bytes: u64,
    /// Successful address-space reservations.
    pub reserves: u64,
    /// Released reservations.
    pub releases: u64,
    /// Successful map calls.
    pub maps: u64,
    /// Successful unmap calls.
    pub unmaps: u64,
    /// Map calls that failed with out of memory (capacity or injected).
    pub failed_maps: u64,
    /// Virtual-memory pages mapped now.
    pub pages_mapped: u64,
    /// Streams created ([`Backend::create_stream`] and
    /// [`SimDevice::register_stream`]).
    pub streams_created: u64,
    /// Events handed out.
    pub events_created: u64,
    /// Events recorded on a stream.
    pub events_recorded: u64,
    /// Events handed out and not destroyed yet.
    pub live_events: u64,
    /// Synchronisations that had to complete work of a held stream.
    pub forced_syncs: u64,
    /// Streams held now.
    pub held_streams: u64,
    /// Operations enqueued and not completed yet, over all streams.
    pub pending_ops: u64,
    /// Scripted addresses that could not be used (their range was not free).
    pub scripted_fallbacks: u64,
    /// Simulated driver time accumulated by the [`CostModel`], in ns.
    pub driver_time_ns: u64,
}

/// The kind of a logged device call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallKind {
    /// [`Backend::allocate`] (`cudaMalloc`).
    Alloc,
    /// [`Backend::free`] (`cudaFree`).
    Free,
    /// [`VirtualMemory::reserve`] (`cuMemAddressReserve`).
    Reserve,
    /// [`VirtualMemory::release`] (`cuMemAddressFree`).
    Release,
    /// [`VirtualMemory::map`] (`cuMemCreate` + `cuMemMap`).
    Map,
    /// [`VirtualMemory::unmap`] (`cuMemUnmap` + `cuMemRelease`).
    Unmap,
}

impl CallKind {
    /// The name of the matching call in the oracle's `device_calls`
    /// (`alloc`, `free`, `reserve`, `addr_free`, `map`, `unmap`).
    pub fn oracle_name(self) -> &'static str {
        match self {
            CallKind::Alloc => "alloc",
            CallKind::Free => "free",
            CallKind::Reserve => "reserve",
            CallKind::Release => "addr_free",
            CallKind::Map => "map",
            CallKind::Unmap => "unmap",
        }
    }
}

/// The outcome of a logged device call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CallResult {
    /// The call succeeded.
    Ok,
    /// The call failed with out of memory.
    OutOfMemory,
}

impl CallResult {
    /// The oracle's `error` code: 0 for success, 2 for out of memory
    /// (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn error_code(self) -> u32 {
        match self {
            CallResult::Ok => 0,
            CallResult::OutOfMemory => 2,
        }
    }
}

/// One entry of the device-call log ([`SimDevice::call_log`]), the
/// counterpart of a record of the oracle's `device_calls`. Calls rejected
/// as invalid (unknown address, bad range) are not logged, as in the fake
/// driver; failed allocations and maps are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceCall {
    /// What was called.
    pub kind: CallKind,
    /// Bytes: the allocation size, the reservation size, or the mapped or
    /// unmapped length.
    pub size: u64,
    /// The allocation (null for a failed allocation), or the reservation's
    /// base for reserve, release, map and unmap.
    pub addr: DevicePtr,
    /// Offset of the mapped or unmapped range in its reservation (0 for other
    /// calls).
    pub offset: u64,
    /// The stream passed to [`Backend::allocate`]; the default stream for
    /// other calls.
    pub stream: StreamId,
    /// Success or out of memory.
    pub result: CallResult,
    /// The tag set with [`SimDevice::set_call_tag`] when the call was made
    /// (a replay sets it to the op index, like the oracle's `op`).
    pub tag: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
enum Placement {
    LinuxMmap,
    BumpUp,
}

#[derive(Clone, Copy, Debug)]
struct Alloc {
    size: u64,
    acct: u64,
    raw: u64,
    raw_end: u64,
}

#[derive(Clone, Debug)]
struct Resv {
    size: u64,
    raw: u64,
    raw_end: u64,
    /// Mapped runs: offset -> length (one per map call, split by partial
    /// unmaps). Never overlapping.
    mapped: BTreeMap<u64, u64>,
}

#[derive(Clone, Debug, Default)]
struct Faults {
    /// Allocate-call numbers (1-based, over the device's life) that fail.
    nth_alloc: BTreeSet<u64>,
    /// Map-call numbers that fail.
    nth_map: BTreeSet<u64>,
    /// Allocations larger than this fail.
    allocs_above: Option<u64>,
}

struct State {
    capacity: u64,
    acct_gran: u64,
    context_reserved: u64,
    vm_gran: u64,
    cost: CostModel,
    placement: Placement,
    script: VecDeque<u64>,
    space: AddressSpace,
    allocs: FxHashMap<u64, Alloc>,
    resv: FxHashMap<u64, Resv>,
    used: u64,
    c: SimCounters,
    faults: Faults,
    alloc_calls: u64,
    map_calls: u64,
    log_on: bool,
    log: Vec<DeviceCall>,
    tag: Option<u64>,
    streams: streams::Streams,
    /// [`SimConfig::max_streams`].
    max_streams: usize,
}

/// The simulated device. See the [module documentation](self).
pub struct SimDevice {
    state: Mutex<State>,
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("capacity", &self.capacity())
            .field("counters", &self.counters())
            .finish_non_exhaustive()
    }
}

impl Default for SimDevice {
    fn default() -> Self {
        SimDevice::new(SimConfig::default())
    }
}

fn invalid(msg: String) -> BackendError {
    BackendError::InvalidValue(msg)
}

impl SimDevice {
    /// A device with these settings (normalised as each field documents).
    ///
    /// # Panics
    ///
    /// If the placement window is empty after rounding
    /// (`address_low >= address_high`) or `address_low` is below one page.
    pub fn new(config: SimConfig) -> Self {
        let page = config.page_size.max(1).next_power_of_two();
        let low = round_up(config.address_low, page);
        let high = config.address_high & !(page - 1);
        assert!(
            low >= page && low < high,
            "sim: empty placement window [{low:#x}, {high:#x})"
        );
        let vm_gran = round_up(config.vm_granularity.max(1), page);
        let (placement, script) = match config.address_policy {
            AddressPolicy::LinuxMmap => (Placement::LinuxMmap, VecDeque::new()),
            AddressPolicy::BumpUp => (Placement::BumpUp, VecDeque::new()),
            AddressPolicy::Scripted(s) => (Placement::LinuxMmap, s),
        };
        SimDevice {
            state: Mutex::new(State {
                capacity: config.capacity,
                acct_gran: config.accounting_granularity.max(1),
                context_reserved: config.context_reserved,
                vm_gran,
                cost: config.cost,
                placement,
                script,
                space: AddressSpace::new(page, low, high),
                allocs: FxHashMap::default(),
                resv: FxHashMap::default(),
                used: 0,
                c: SimCounters::default(),
                faults: Faults::default(),
                alloc_calls: 0,
                map_calls: 0,
                log_on: config.call_log,
                log: Vec::new(),
                tag: None,
                streams: streams::Streams::new(config.hold_semantics),
                max_streams: config.max_streams,
            }),
        }
    }

    /// A device that hands out `addresses` in order (a recorded trace's
    /// segment addresses), then places like [`AddressPolicy::LinuxMmap`].
    /// Replaces `config.address_policy`.
    pub fn with_recorded_addresses(
        config: SimConfig,
        addresses: impl IntoIterator<Item = u64>,
    ) -> Self {
        SimDevice::new(SimConfig {
            address_policy: AddressPolicy::Scripted(addresses.into_iter().collect()),
            ..config
        })
    }

    /// Append addresses to hand out before the configured policy places
    /// anything (see [`AddressPolicy::Scripted`]).
    pub fn push_recorded_addresses(&self, addresses: impl IntoIterator<Item = u64>) {
        self.state.lock().script.extend(addresses);
    }

    /// Scripted addresses not used yet.
    pub fn recorded_addresses_left(&self) -> usize {
        self.state.lock().script.len()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> SimCounters {
        let st = self.state.lock();
        let s = &st.streams;
        SimCounters {
            live_allocs: st.allocs.len() as u64,
            bytes_in_use: st.used,
            streams_created: s.streams_created,
            events_created: s.events_created,
            events_recorded: s.events_recorded,
            live_events: s.live_events() as u64,
            forced_syncs: s.forced_syncs,
            held_streams: s.held_streams() as u64,
            pending_ops: s.pending_ops(),
            ..st.c
        }
    }

    /// Restart the peak at the current use.
    pub fn reset_peak(&self) {
        let mut st = self.state.lock();
        st.c.peak_bytes = st.used;
    }

    /// The current capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.state.lock().capacity
    }

    /// Change the capacity at run time (shrink or grow). Memory already in
    /// use stays; shrinking below it makes every new allocation fail and
    /// [`MemInfo::free`] report 0.
    pub fn set_capacity(&self, bytes: u64) {
        self.state.lock().capacity = bytes;
    }

    /// Make the `n`-th [`allocate`](Backend::allocate) call from now fail
    /// with out of memory (`n = 1`: the next call; 0 is treated as 1).
    /// Several can be pending at once. Injected failures are counted,
    /// charged and logged like real ones.
    pub fn fail_nth_alloc(&self, n: u64) {
        let mut st = self.state.lock();
        let at = st.alloc_calls + n.max(1);
        st.faults.nth_alloc.insert(at);
    }

    /// Make the `n`-th valid [`map`](VirtualMemory::map) call from now fail
    /// with out of memory (`n = 1`: the next call; 0 is treated as 1).
    pub fn fail_nth_map(&self, n: u64) {
        let mut st = self.state.lock();
        let at = st.map_calls + n.max(1);
        st.faults.nth_map.insert(at);
    }

    /// Make every allocation of more than `bytes` bytes fail with out of
    /// memory until [`clear_faults`](Self::clear_faults). Maps are not
    /// affected.
    pub fn fail_allocs_above(&self, bytes: u64) {
        self.state.lock().faults.allocs_above = Some(bytes);
    }

    /// Cancel every injected fault (pending `n`-th failures and the size
    /// limit). The capacity is a setting, not a fault: it stays.
    pub fn clear_faults(&self) {
        self.state.lock().faults = Faults::default();
    }

    /// Turn the device-call log on or off (entries already logged stay).
    pub fn set_call_log(&self, on: bool) {
        self.state.lock().log_on = on;
    }

    /// Tag the following logged calls (`None`: untagged).
    pub fn set_call_tag(&self, tag: Option<u64>) {
        self.state.lock().tag = tag;
    }

    /// A copy of the device-call log.
    pub fn call_log(&self) -> Vec<DeviceCall> {
        self.state.lock().log.clone()
    }

    /// The device-call log, leaving it empty.
    pub fn take_call_log(&self) -> Vec<DeviceCall> {
        std::mem::take(&mut self.state.lock().log)
    }

    /// The size a live allocation was made with, if `ptr` is one.
    pub fn allocation_size(&self, ptr: DevicePtr) -> Option<u64> {
        self.state.lock().allocs.get(&ptr.0).map(|a| a.size)
    }

    /// Make `id` a known stream (for replays that keep recorded stream
    /// handles). Idempotent; [`create_stream`](Backend::create_stream) skips
    /// registered ids.
    pub fn register_stream(&self, id: StreamId) {
        self.state.lock().streams.register(id);
    }

    /// Every known stream, the default stream first, then in creation order.
    pub fn streams(&self) -> Vec<StreamId> {
        self.state.lock().streams.ids()
    }

    /// Hold `stream`: work enqueued on it (and, under
    /// [`HoldSemantics::AllEvents`], every event recorded on it) stays pending
    /// until [`release_stream`](Self::release_stream). Streams that wait for
    /// its pending work stay blocked too.
    pub fn hold_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().streams.hold(stream)
    }

    /// Release a held stream: its pending work completes (and whatever waited
    /// for it). Releasing a stream that is not held is a no-op.
    pub fn release_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().streams.release(stream)
    }

    /// Is `stream` held?
    pub fn is_stream_held(&self, stream: StreamId) -> Result<bool, BackendError> {
        self.state.lock().streams.is_held(stream)
    }

    /// Enqueue one unit of opaque work (a kernel) on `stream`: it completes at
    /// once unless the stream is held (the oracle's `k` op).
    pub fn enqueue_work(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().streams.enqueue_work(stream)
    }

    /// Make `stream` wait for `event` (`cudaStreamWaitEvent`): work enqueued
    /// on `stream` afterwards completes only after the event has.
    pub fn wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.state.lock().streams.wait_event(stream, event)
    }

    /// Operations enqueued on `stream` and not completed.
    pub fn stream_pending(&self, stream: StreamId) -> Result<u64, BackendError> {
        self.state.lock().streams.pending(stream)
    }

    /// Complete all work on every stream (`cudaDeviceSynchronize`).
    pub fn synchronize_all(&self) {
        self.state.lock().streams.synchronize_all();
    }
}

impl State {
    fn free_bytes(&self) -> u64 {
        self.capacity
            .saturating_sub(self.used)
            .saturating_sub(self.context_reserved)
    }

    fn fits(&self, bytes: u64) -> bool {
        self.used
            .saturating_add(bytes)
            .saturating_add(self.context_reserved)
            <= self.capacity
    }

    fn take(&mut self, bytes: u64) {
        self.used += bytes;
        self.c.peak_bytes = self.c.peak_bytes.max(self.used);
    }

    fn log(
        &mut self,
        kind: CallKind,
        size: u64,
        addr: u64,
        offset: u64,
        stream: StreamId,
        result: CallResult,
    ) {
        if self.log_on {
            self.log.push(DeviceCall {
                kind,
                size,
                addr: DevicePtr(addr),
                offset,
                stream,
                result,
                tag: self.tag,
            });
        }
    }

    /// Place `[?, ? + len)` by the fallback policy, aligned to `align` (a
    /// multiple of the page size, or the page size). Returns (addr, raw, raw_end).
    fn place_by_policy(&mut self, len: u64, align: u64) -> Option<(u64, u64, u64)> {
        let page = self.space.page();
        let raw_len = if align > page {
            len.checked_add(align)?
        } else {
            len
        };
        let raw = match self.placement {
            Placement::LinuxMmap => self.space.take_top_down(raw_len)?,
            Placement::BumpUp => self.space.take_bump(raw_len)?,
        };
        Some((round_up(raw, align), raw, raw + raw_len))
    }

    /// Find room for `size` bytes aligned to `align` (only for policy
    /// placement: scripted addresses are used as given).
    fn place(&mut self, size: u64, align: u64) -> Option<(u64, u64, u64)> {
        let page = self.space.page();
        if let Some(a) = self.script.pop_front() {
            let raw = a & !(page - 1);
            if let Some(end) = a.checked_add(size).map(|e| round_up(e, page)) {
                if self.space.take_exact(raw, end) {
                    return Some((a, raw, end));
                }
            }
            self.c.scripted_fallbacks += 1;
            tracing::debug!(
                addr = a,
                size,
                "sim: scripted address not free, falling back"
            );
        }
        let len = size.checked_add(page - 1)? & !(page - 1);
        self.place_by_policy(len, align)
    }

    fn alloc_failed(&mut self, size: u64, stream: StreamId, why: &str) -> BackendError {
        self.c.failed_allocs += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.alloc_ns);
        self.log(CallKind::Alloc, size, 0, 0, stream, CallResult::OutOfMemory);
        tracing::debug!(size, why, "sim: allocation failed");
        BackendError::OutOfMemory {
            requested: size,
            free: self.free_bytes(),
        }
    }

    fn allocate(&mut self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        if size == 0 {
            return Err(invalid(
                "zero-byte allocation on the sim device".to_string(),
            ));
        }
        self.alloc_calls += 1;
        let n = self.alloc_calls;
        if self.faults.nth_alloc.remove(&n) {
            return Err(self.alloc_failed(size, stream, "injected (nth allocation)"));
        }
        if self.faults.allocs_above.is_some_and(|b| size > b) {
            return Err(self.alloc_failed(size, stream, "injected (size limit)"));
        }
        let acct = round_up(size, self.acct_gran);
        if !self.fits(acct) {
            return Err(self.alloc_failed(size, stream, "capacity"));
        }
        let page = self.space.page();
        let Some((addr, raw, raw_end)) = self.place(size, page) else {
            return Err(self.alloc_failed(size, stream, "address space exhausted"));
        };
        self.take(acct);
        self.allocs.insert(
            addr,
            Alloc {
                size,
                acct,
                raw,
                raw_end,
            },
        );
        self.c.allocs += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.alloc(size));
        self.log(CallKind::Alloc, size, addr, 0, stream, CallResult::Ok);
        Ok(DevicePtr(addr))
    }

    fn free(&mut self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let Some(a) = self.allocs.get(&ptr.0).copied() else {
            return Err(invalid(format!(
                "free of {ptr}: not a live allocation of the sim device"
            )));
        };
        if a.size != size {
            return Err(invalid(format!(
                "free of {ptr} with size {size}, but it was allocated with size {}",
                a.size
            )));
        }
        self.allocs.remove(&ptr.0);
        self.space.give(a.raw, a.raw_end);
        self.used -= a.acct;
        self.c.frees += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.free(size));
        self.log(
            CallKind::Free,
            size,
            ptr.0,
            0,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }

    fn reserve(&mut self, size: u64) -> Result<Reservation, BackendError> {
        if size == 0 || size % self.vm_gran != 0 {
            return Err(invalid(format!(
                "reserve of {size} bytes: not a positive multiple of the granularity {}",
                self.vm_gran
            )));
        }
        let Some((base, raw, raw_end)) = self.place(size, self.vm_gran) else {
            self.log(
                CallKind::Reserve,
                size,
                0,
                0,
                StreamId::DEFAULT,
                CallResult::OutOfMemory,
            );
            return Err(BackendError::OutOfMemory {
                requested: size,
                free: self.free_bytes(),
            });
        };
        self.resv.insert(
            base,
            Resv {
                size,
                raw,
                raw_end,
                mapped: BTreeMap::new(),
            },
        );
        self.c.reserves += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.reserve_ns);
        self.log(
            CallKind::Reserve,
            size,
            base,
            0,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(Reservation {
            base: DevicePtr(base),
            size,
        })
    }

    /// Validate a map/unmap range of a live reservation.
    fn check_range(&self, r: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        let Some(resv) = self.resv.get(&r.base.0) else {
            return Err(invalid(format!(
                "reservation at {}: not a live reservation of the sim device",
                r.base
            )));
        };
        if resv.size != r.size {
            return Err(invalid(format!(
                "reservation at {} has size {}, not {}",
                r.base, resv.size, r.size
            )));
        }
        let g = self.vm_gran;
        if len == 0 || offset % g != 0 || len % g != 0 {
            return Err(invalid(format!(
                "range [{offset:#x}, +{len:#x}) of reservation {}: not granularity-aligned ({g:#x}) or empty",
                r.base
            )));
        }
        if offset.checked_add(len).map_or(true, |e| e > resv.size) {
            return Err(invalid(format!(
                "range [{offset:#x}, +{len:#x}) is outside reservation {} of {} bytes",
                r.base, resv.size
            )));
        }
        Ok(())
    }

    fn map(&mut self, r: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_range(r, offset, len)?;
        let resv = &self.resv[&r.base.0];
        let end = offset + len;
        if let Some((&o, &l)) = resv.mapped.range(..end).next_back() {
            if o + l > offset {
                return Err(invalid(format!(
                    "map of [{offset:#x}, {end:#x}) in reservation {}: [{o:#x}, {:#x}) is already mapped",
                    r.base,
                    o + l
                )));
            }
        }
        self.map_calls += 1;
        let n = self.map_calls;
        let injected = self.faults.nth_map.remove(&n);
        if injected || !self.fits(len) {
            self.c.failed_maps += 1;
            self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.map_ns);
            self.log(
                CallKind::Map,
                len,
                r.base.0,
                offset,
                StreamId::DEFAULT,
                CallResult::OutOfMemory,
            );
            tracing::debug!(len, injected, "sim: map failed");
            return Err(BackendError::OutOfMemory {
                requested: len,
                free: self.free_bytes(),
            });
        }
        self.resv
            .get_mut(&r.base.0)
            .expect("checked")
            .mapped
            .insert(offset, len);
        self.take(len);
        let pages = len / self.vm_gran;
        self.c.maps += 1;
        self.c.pages_mapped += pages;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.map(pages));
        self.log(
            CallKind::Map,
            len,
            r.base.0,
            offset,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }

    fn unmap(&mut self, r: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.check_range(r, offset, len)?;
        let end = offset + len;
        let resv = self.resv.get_mut(&r.base.0).expect("checked");
        // The runs covering [offset, end), which must be contiguous.
        let not_mapped = || {
            invalid(format!(
                "unmap of [{offset:#x}, {end:#x}) in reservation {}: not all of it is mapped",
                r.base
            ))
        };
        let Some((&first, &first_len)) = resv.mapped.range(..=offset).next_back() else {
            return Err(not_mapped());
        };
        let mut covered = first + first_len;
        if covered <= offset {
            return Err(not_mapped());
        }
        let mut runs = vec![first];
        while covered < end {
            match resv.mapped.get(&covered) {
                Some(&l) => {
                    runs.push(covered);
                    covered += l;
                }
                None => return Err(not_mapped()),
            }
        }
        for o in runs {
            resv.mapped.remove(&o);
        }
        if first < offset {
            resv.mapped.insert(first, offset - first);
        }
        if end < covered {
            resv.mapped.insert(end, covered - end);
        }
        self.used -= len;
        let pages = len / self.vm_gran;
        self.c.unmaps += 1;
        self.c.pages_mapped -= pages;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.unmap(pages));
        self.log(
            CallKind::Unmap,
            len,
            r.base.0,
            offset,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }

    fn release(&mut self, r: Reservation) -> Result<(), BackendError> {
        let Some(resv) = self.resv.get(&r.base.0) else {
            return Err(invalid(format!(
                "release of {}: not a live reservation of the sim device",
                r.base
            )));
        };
        if resv.size != r.size {
            return Err(invalid(format!(
                "release of reservation {} with size {}, but it has size {}",
                r.base, r.size, resv.size
            )));
        }
        if !resv.mapped.is_empty() {
            let mapped: u64 = resv.mapped.values().sum();
            return Err(invalid(format!(
                "release of reservation {}: {mapped} bytes are still mapped",
                r.base
            )));
        }
        let resv = self.resv.remove(&r.base.0).expect("checked");
        self.space.give(resv.raw, resv.raw_end);
        self.c.releases += 1;
        self.c.driver_time_ns = self.c.driver_time_ns.saturating_add(self.cost.release_ns);
        self.log(
            CallKind::Release,
            r.size,
            r.base.0,
            0,
            StreamId::DEFAULT,
            CallResult::Ok,
        );
        Ok(())
    }
}

impl Backend for SimDevice {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        self.state.lock().allocate(size, stream)
    }

    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        self.state.lock().free(ptr, size)
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let st = self.state.lock();
        Ok(MemInfo {
            free: st.free_bytes(),
            total: st.capacity,
        })
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        let mut st = self.state.lock();
        let (live, max) = (st.streams.len(), st.max_streams);
        if live >= max {
            return Err(BackendError::Driver(format!(
                "the sim device holds {live} streams, its limit (SimConfig::max_streams = {max}); \
                 streams cannot be destroyed, so reuse the ones you have or raise the limit"
            )));
        }
        Ok(st.streams.create())
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().streams.check(stream)
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        self.state.lock().streams.record(stream)
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        self.state.lock().streams.query(event)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        self.state.lock().streams.synchronize_event(event)
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        self.state.lock().streams.destroy_event(event)
    }

    /// Complete all work enqueued on `stream` so far, also held work (counted
    /// as a forced sync). The stream stays held for later work.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().streams.synchronize_stream(stream)
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.synchronize_all();
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.wait_event(stream, event)
    }

    fn as_virtual_memory(&self) -> Option<&dyn VirtualMemory> {
        Some(self)
    }

    fn as_host_mapping(&self) -> Option<&dyn HostMapping> {
        Some(self)
    }
}

/// The simulated device models unified memory: the host address of device
/// memory is its device address. It holds no bytes (the device simulates
/// addresses only), so the address is for bookkeeping, not for reading.
impl HostMapping for SimDevice {
    fn host_address(&self, ptr: DevicePtr, len: u64) -> Result<u64, BackendError> {
        let st = self.state.lock();
        let inside = st
            .allocs
            .iter()
            .any(|(&base, a)| base <= ptr.0 && ptr.0.saturating_add(len) <= base + a.size);
        if inside {
            Ok(ptr.0)
        } else {
            Err(BackendError::InvalidValue(format!(
                "range [{ptr}, +{len}) is not inside a live allocation of the sim device"
            )))
        }
    }
}

impl VirtualMemory for SimDevice {
    fn granularity(&self) -> u64 {
        self.state.lock().vm_gran
    }

    /// Reserve address space (no capacity cost). `size` must be a positive
    /// multiple of the granularity.
    fn reserve(&self, size: u64) -> Result<Reservation, BackendError> {
        self.state.lock().reserve(size)
    }

    /// Map `[offset, offset + len)`: granularity-aligned, inside the
    /// reservation, not mapped yet. Counts `len` against the capacity.
    fn map(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.state.lock().map(reservation, offset, len)
    }

    /// Unmap `[offset, offset + len)`, all of which must be mapped (it may
    /// span several map calls, or part of one).
    fn unmap(&self, reservation: Reservation, offset: u64, len: u64) -> Result<(), BackendError> {
        self.state.lock().unmap(reservation, offset, len)
    }

    fn release(&self, reservation: Reservation) -> Result<(), BackendError> {
        self.state.lock().release(reservation)
    }
}

#[cfg(test)]
mod tests;
