//! Settings of a [`HostDevice`](crate::HostDevice): plain data with
//! documented defaults, validated when the device is built.

use crate::mapping::{os_page_size, physical_memory};

/// Default virtual-memory granularity: 2 MiB (the page size of CUDA's
/// virtual-memory API on current GPUs, and of the simulated device).
pub const DEFAULT_GRANULARITY: u64 = 2 << 20;

/// The default capacity is physical memory divided by this: a host device
/// may hand out at most half of the machine's memory unless told otherwise.
pub const DEFAULT_CAPACITY_DIVISOR: u64 = 2;

/// Capacity used when the system does not report its physical memory: 1 GiB.
pub const FALLBACK_CAPACITY: u64 = 1 << 30;

/// The default capacity budget: [`physical_memory`] divided by
/// [`DEFAULT_CAPACITY_DIVISOR`], or [`FALLBACK_CAPACITY`] when the system
/// does not say.
pub fn default_capacity() -> u64 {
    physical_memory()
        .map(|b| b / DEFAULT_CAPACITY_DIVISOR)
        .filter(|&b| b > 0)
        .unwrap_or(FALLBACK_CAPACITY)
}

/// Settings of a [`HostDevice`](crate::HostDevice). See each field for its
/// default; build one with struct-update syntax:
///
/// ```
/// use reservoir_host::HostConfig;
/// let config = HostConfig { capacity: 256 << 20, ..HostConfig::default() };
/// assert_eq!(config.vm_granularity, 2 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// The capacity budget in bytes: what [`MemInfo::total`] reports, and
    /// the most memory the device hands out at once. Plain allocations count
    /// their size rounded up to the OS page size; virtual-memory mappings
    /// count their length. Reservations (address space only) count nothing.
    /// Going over it is [`BackendError::OutOfMemory`]. Default
    /// [`default_capacity`] (half of physical memory). Must be positive; can
    /// change at run time ([`HostDevice::set_capacity`]).
    ///
    /// [`MemInfo::total`]: reservoir::MemInfo::total
    /// [`BackendError::OutOfMemory`]: reservoir::BackendError::OutOfMemory
    /// [`HostDevice::set_capacity`]: crate::HostDevice::set_capacity
    pub capacity: u64,
    /// The virtual-memory granularity
    /// ([`VirtualMemory::granularity`](reservoir::backend::VirtualMemory::granularity)):
    /// reservations start at a multiple of it, and reservation sizes, map
    /// and unmap offsets and lengths are multiples of it. Default
    /// [`DEFAULT_GRANULARITY`] (2 MiB). Must be a power of two and a multiple
    /// of the OS page size. The caching allocator maps expandable segments in
    /// 2 MiB (small pool) and `large_segment_size` (large pool) pages, so
    /// keep it at most 2 MiB to serve expandable segments.
    pub vm_granularity: u64,
    /// Back every plain allocation with its own memfd mapped `MAP_SHARED`,
    /// so that it can be shared with other processes
    /// ([`HostDevice::ipc_get_handle`](crate::HostDevice::ipc_get_handle),
    /// the caching allocator's `share_ipc_handle`). Costs one open file
    /// descriptor per live allocation. Default false (anonymous private
    /// memory). Linux only.
    pub shareable: bool,
    /// The most streams the device holds, the default stream and
    /// registered streams included: [`create_stream`] past it fails.
    /// Default [`DEFAULT_STREAM_LIMIT`] (65,536).
    /// [`HostDevice::register_stream`](crate::HostDevice::register_stream)
    /// is not limited.
    ///
    /// [`create_stream`]: reservoir::Backend::create_stream
    /// [`DEFAULT_STREAM_LIMIT`]: reservoir::backend::DEFAULT_STREAM_LIMIT
    pub max_streams: usize,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            capacity: default_capacity(),
            vm_granularity: DEFAULT_GRANULARITY,
            shareable: false,
            max_streams: reservoir::backend::DEFAULT_STREAM_LIMIT,
        }
    }
}

impl HostConfig {
    /// The default settings with a capacity of `bytes`.
    pub fn with_capacity(bytes: u64) -> Self {
        HostConfig {
            capacity: bytes,
            ..HostConfig::default()
        }
    }

    /// Check every field; the error names the field at fault.
    pub fn validate(&self) -> Result<(), HostConfigError> {
        if self.capacity == 0 {
            return Err(HostConfigError::ZeroCapacity);
        }
        let page_size = os_page_size();
        let g = self.vm_granularity;
        if !g.is_power_of_two() || g % page_size != 0 || usize::try_from(g).is_err() {
            return Err(HostConfigError::Granularity {
                value: g,
                page_size,
            });
        }
        Ok(())
    }
}

/// A [`HostConfig`] field out of range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostConfigError {
    /// `capacity` is zero.
    #[error("HostConfig.capacity must be positive")]
    ZeroCapacity,
    /// `vm_granularity` is not a power-of-two multiple of the page size.
    #[error(
        "HostConfig.vm_granularity = {value}: must be a power of two and a multiple of the OS page \
         size ({page_size})"
    )]
    Granularity {
        /// The value given.
        value: u64,
        /// The OS page size.
        page_size: u64,
    },
}
