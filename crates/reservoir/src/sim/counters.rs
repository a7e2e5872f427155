//! What the simulated device reports about itself: its counters
//! ([`SimCounters`]) and its device-call log ([`DeviceCall`]).

use std::ops::{Deref, DerefMut};

#[cfg(doc)]
use super::{CostModel, SimConfig, SimDevice};
#[cfg(doc)]
use crate::backend::{Backend, VirtualMemory};
use crate::backend::{DeviceCounters, DevicePtr, StreamId};

/// A snapshot of the simulated device's counters ([`SimDevice::counters`]):
/// the counters every device keeps ([`DeviceCounters`], whose fields it
/// dereferences to: `counters.allocs`) and the simulated device's own.
/// Plain allocations count their size rounded up to the accounting
/// granularity, mapped pages their pages; `bytes_in_use` excludes
/// [`SimConfig::context_reserved`]; failed allocations and maps are those
/// refused for capacity or by an injected fault; created streams include
/// [`SimDevice::register_stream`]'s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimCounters {
    /// The counters every device keeps.
    pub device: DeviceCounters,
    /// Virtual-memory pages mapped now.
    pub pages_mapped: u64,
    /// Events handed out.
    pub events_created: u64,
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

impl Deref for SimCounters {
    type Target = DeviceCounters;
    fn deref(&self) -> &DeviceCounters {
        &self.device
    }
}

impl DerefMut for SimCounters {
    fn deref_mut(&mut self) -> &mut DeviceCounters {
        &mut self.device
    }
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
