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
mod config;
mod counters;
mod streams;
mod vm;

pub use clock::{Access, AccessKind, AsyncSimDevice, RaceKind, RaceReport, HOLD_NS};
pub use config::{
    AddressPolicy, CostModel, SimConfig, DEFAULT_ADDRESS_HIGH, DEFAULT_ADDRESS_LOW,
    DEFAULT_CAPACITY, DEFAULT_GRANULARITY, DEFAULT_PAGE_SIZE, FAKE_DRIVER_CAPACITY,
};
pub use counters::{CallKind, CallResult, DeviceCall, SimCounters};
pub use streams::HoldSemantics;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::backend::{
    Backend, BackendError, DevicePtr, EventId, HostMapping, MemInfo, StreamId, VirtualMemory,
};
use addr::{round_up, AddressSpace};

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
        let mut c = SimCounters {
            events_created: s.events_created,
            forced_syncs: s.forced_syncs,
            held_streams: s.held_streams() as u64,
            pending_ops: s.pending_ops(),
            ..st.c
        };
        c.live_allocs = st.allocs.len() as u64;
        c.bytes_in_use = st.used;
        c.streams_created = s.streams_created;
        c.events_recorded = s.events_recorded;
        c.live_events = s.live_events() as u64;
        c
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

#[cfg(test)]
mod tests;
