//! # reservoir-host: host memory as a device
//!
//! [`HostDevice`] is a [`reservoir::Backend`] whose "device memory" is real
//! memory of this process, obtained from `mmap`. Every [`DevicePtr`] it
//! hands out is an address you can read and write. Use it to cache
//! pinned-host-style buffers, or to test the caching allocator against
//! real pointers: a block that overlapped another live block, or was handed
//! out after its pages were unmapped, shows up as corrupt data or a refused
//! access instead of going unnoticed in bookkeeping.
//!
//! ```
//! use reservoir::{AllocatorConfig, CachingAllocator, StreamId};
//! use reservoir_host::{checksum_bytes, HostConfig, HostDevice};
//!
//! let dev = HostDevice::new(HostConfig { capacity: 256 << 20, ..HostConfig::default() }).unwrap();
//! let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
//! let p = alloc.raw_alloc(1000, StreamId::DEFAULT).unwrap();
//! alloc.backend().fill(p, 1000, 0xab).unwrap();
//! assert_eq!(alloc.backend().checksum(p, 1000).unwrap(), checksum_bytes(&[0xab; 1000]));
//! alloc.raw_free(p).unwrap();
//! ```
//!
//! ## The model
//!
//! * **Memory.** [`Backend::allocate`] maps fresh anonymous read-write
//!   memory (zero-filled) of the requested size; [`Backend::free`] unmaps
//!   it and must name a live allocation with the size it was made with, or
//!   it is a [`BackendError::InvalidValue`] naming the address (double free,
//!   foreign address, wrong size) and nothing changes. Zero-byte
//!   allocations are refused the same way.
//! * **Budget.** [`HostConfig::capacity`] (default: half of physical
//!   memory) is what [`Backend::mem_info`] reports as total. A plain
//!   allocation counts its size rounded up to the OS page size, a mapped
//!   virtual-memory range its length; a request that would go over the
//!   budget fails with [`BackendError::OutOfMemory`] (retryable: the caching
//!   allocator frees its cache and tries again). An `ENOMEM` from the
//!   kernel is reported the same way. Pages are committed lazily by the
//!   kernel: the budget is the limit that matters, not the kernel's
//!   overcommit policy. Memory is not locked (`mlock`): it is pageable host
//!   memory, not CUDA-pinned memory.
//! * **Streams and events.** Host work is synchronous. [`Backend::create_stream`]
//!   hands out fresh ids (the default stream, 0, always exists;
//!   [`HostDevice::register_stream`] adds recorded ids), an event is complete
//!   as soon as it is recorded, and every synchronisation returns at once.
//!   Unknown streams and events are still errors. So this device cannot
//!   reveal stream-ordering bugs (a block reused before another stream
//!   finished with it): use the simulated device's held streams for those.
//! * **Virtual memory** ([`VirtualMemory`], what expandable segments need),
//!   with real page tables: `reserve` maps `PROT_NONE` + `MAP_NORESERVE`
//!   address space (over-reserved and trimmed so the base is a multiple of
//!   [`HostConfig::vm_granularity`], 2 MiB by default), costing no budget;
//!   `map` commits a range read-write (`mprotect`), counted against the
//!   budget; `unmap` gives the pages back (`madvise(MADV_DONTNEED)` then
//!   `mprotect(PROT_NONE)`), so a range mapped again reads zero; `release`
//!   unmaps the reservation, which must be fully unmapped. Ranges are
//!   checked (live reservation, inside it, granularity-aligned, not already
//!   mapped on `map`, fully mapped on `unmap`) and refused with
//!   [`BackendError::InvalidValue`] before anything changes.
//! * **Copies** ([`Memcpy`]): between any two live ranges (allocations or
//!   mapped pages), synchronously; overlapping ranges behave like `memmove`.
//! * **IPC** (spec 1.16): with [`HostConfig::shareable`] every plain
//!   allocation is its own memfd mapped `MAP_SHARED`;
//!   [`HostDevice::ipc_get_handle`] exports it as a [`HostIpcHandle`]
//!   (pid, descriptor, serial, size; 32 bytes), which another process of
//!   the same user maps with [`HostDevice::ipc_open`] through
//!   `/proc/<pid>/fd/<fd>`, after checking the descriptor is that very memfd.
//!   The device implements [`Ipc`], so the caching allocator's
//!   `share_ipc_handle` / `open_ipc_handle` work over it.
//! * **Host access** ([`HostWrite`](reservoir::backend::HostWrite),
//!   [`HostMapping`](reservoir::backend::HostMapping)): the host address
//!   of live memory is its device pointer; the MPS heap allocator's scalar
//!   buffers with a value and shared buffer pointers work here.
//! * **Test helpers**: [`HostDevice::fill`], [`HostDevice::checksum`]
//!   (compare with [`checksum_bytes`]), [`HostDevice::copy_from_host`],
//!   [`HostDevice::copy_to_host`] and [`HostDevice::is_live`] check that the
//!   whole range is live memory before touching it, so a test can prove
//!   that blocks really hold data and never overlap.
//! * **Drop.** A device dropped with live allocations or reservations
//!   unmaps them and logs a [`LeakReport`] with `tracing::warn!`; it never
//!   panics.
//!
//! ## Accessing the memory directly
//!
//! The pointers are real, so your own `unsafe` code may read and write
//! them, as long as it stays inside live memory, stops before the memory is
//! freed or unmapped, and does not race with the device's own accessors
//! (`fill`, `checksum`, the copies), which touch memory under the device's
//! lock through raw pointers only. The crate itself keeps all raw pointers
//! in one private type that owns each mapping; every `unsafe` block says
//! which invariant makes it sound.
//!
//! ## Platform
//!
//! Unix, through the `libc` crate; written and tested on Linux. Elsewhere
//! `unmap` replaces the range with a fresh `PROT_NONE` mapping
//! (`MAP_FIXED`), because `MADV_DONTNEED` does not zero pages there; that
//! path is untested.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod config;
mod device;
mod ipc;
mod mapping;

#[cfg(test)]
mod tests;

pub use config::{
    default_capacity, HostConfig, HostConfigError, DEFAULT_CAPACITY_DIVISOR, DEFAULT_GRANULARITY,
    FALLBACK_CAPACITY,
};
pub use device::{checksum_bytes, HostCounters, HostDevice, LeakReport, NAME};
pub use ipc::{HostIpcHandle, HANDLE_LEN};
pub use mapping::{os_page_size, physical_memory};

// Re-exported so that users of this crate name the contract's types
// without depending on `reservoir` directly.
pub use reservoir::backend::{
    Backend, BackendError, DevicePtr, Ipc, Memcpy, Reservation, StreamId, VirtualMemory,
};
