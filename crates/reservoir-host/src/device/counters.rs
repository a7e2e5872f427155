//! The host device's counter snapshot ([`HostCounters`]) and what it still
//! holds ([`LeakReport`]).

use std::fmt;
use std::ops::{Deref, DerefMut};

use reservoir::backend::DeviceCounters;
#[cfg(doc)]
use reservoir::backend::{Ipc, Memcpy};

#[cfg(doc)]
use super::HostDevice;

/// A snapshot of the host device's counters ([`HostDevice::counters`]): the
/// counters every device keeps ([`DeviceCounters`], whose fields it
/// dereferences to: `counters.allocs`) and the host device's own. Plain
/// allocations count their size rounded up to the OS page size; mapped
/// virtual memory counts the mapped ranges; refused calls are those the
/// budget or the OS refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostCounters {
    /// The counters every device keeps.
    pub device: DeviceCounters,
    /// Live reservations.
    pub live_reservations: u64,
    /// Bytes mapped read-write in reservations now.
    pub mapped_bytes: u64,
    /// Successful copies ([`Memcpy::copy`]).
    pub copies: u64,
    /// Shared allocations of other processes opened ([`Ipc::open_segment`]).
    pub ipc_opens: u64,
    /// Those still open.
    pub live_ipc_mappings: u64,
}

impl Deref for HostCounters {
    type Target = DeviceCounters;
    fn deref(&self) -> &DeviceCounters {
        &self.device
    }
}

impl DerefMut for HostCounters {
    fn deref_mut(&mut self) -> &mut DeviceCounters {
        &mut self.device
    }
}

/// What a [`HostDevice`] still holds: reported by [`HostDevice::leak_report`]
/// and logged (`tracing::warn!`) when a device is dropped with live memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakReport {
    /// Live plain allocations.
    pub allocations: u64,
    /// Their bytes, as requested.
    pub allocation_bytes: u64,
    /// Live reservations.
    pub reservations: u64,
    /// Their address space in bytes.
    pub reserved_bytes: u64,
    /// Bytes still mapped inside them.
    pub mapped_bytes: u64,
}

impl LeakReport {
    /// True when nothing is live.
    pub fn is_empty(&self) -> bool {
        self.allocations == 0 && self.reservations == 0
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} allocation(s) of {} bytes, {} reservation(s) of {} bytes ({} bytes mapped)",
            self.allocations,
            self.allocation_bytes,
            self.reservations,
            self.reserved_bytes,
            self.mapped_bytes
        )
    }
}
