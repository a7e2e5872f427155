//! # Reservoir
//!
//! A caching device-memory allocator: the allocator family PyTorch describes in
//! its device-allocator headers, rebuilt in Rust and usable outside PyTorch.
//!
//! * [`caching::CachingAllocator`] is PyTorch's CUDA caching allocator, exact:
//!   same rounding, pools, splitting, merging, retry chain, statistics and
//!   out-of-memory text (see `../shared/spec/pytorch-allocator.md`).
//! * [`heap::HeapAllocator`] is PyTorch's MPS heap allocator (heaps of
//!   whole, never split buffers; watermarks; spec section 4).
//! * [`backend::Backend`] is the small contract a device fulfils; the
//!   [`sim`] module is a simulated device, the embedded default.
//! * [`stats`], [`trace`], [`config`] mirror PyTorch's statistics, history and
//!   settings; [`caching::CachingAllocator::snapshot`] builds PyTorch's memory
//!   snapshot ([`snapshot`]).
//! * [`pluggable`] is PyTorch's `CUDAPluggableAllocator`: an allocator made
//!   of user functions, also usable as the [`Backend`] under the caching
//!   allocator.
//! * [`callbacks`] is the MPS-style registry of named allocator callbacks;
//!   [`debug`] selects `tracing` debug output (`RESERVOIR_DEBUG_VERBOSITY`).
//!
//! The layers, bottom to top (each uses only what is below it):
//!
//! ```text
//! ids, error, format, checksum, rng     plain types and helpers
//! backend                               the device contract; optional capabilities
//!                                       (VirtualMemory, Memcpy, DeviceWork, HostWrite,
//!                                       HostMapping)
//! sim                                   the simulated devices (no allocator inside)
//! store (crate-private)                 BlockStore: blocks, segments, split/merge,
//!                                       FreeList<K>, SizeClassList<K>;
//!                                       pure mechanism
//! config, stats, trace, callbacks,      settings, statistics, history entries,
//! debug, snapshot, pickle (writer)      callbacks, debug output, the report model
//! caching | heap | pluggable            the three allocators of PyTorch's headers;
//!                                       caching/policy.rs is where Reservoir's own
//!                                       policies hook in
//! device_allocator                      the c10 DeviceAllocator contract, registry
//! ```
//!
//! Replay, snapshot decoding and workloads live in `reservoir-replay`; real
//! devices in `reservoir-host`, `reservoir-opencl` and `reservoir-cuda`; the
//! C ABI in `reservoir-capi`.
//!
//! ```
//! use reservoir::{AllocatorConfig, CachingAllocator, StreamId};
//! use reservoir::sim::SimDevice;
//!
//! let alloc = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
//! let p = alloc.raw_alloc(3 << 20, StreamId::DEFAULT).unwrap();
//! // A 3 MiB request is served from a fresh 20 MiB segment.
//! assert_eq!(alloc.stats().reserved_bytes.all().current, 20 << 20);
//! alloc.raw_free(p).unwrap();
//! alloc.empty_cache();
//! assert_eq!(alloc.stats().reserved_bytes.all().current, 0);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
pub mod caching;
pub mod callbacks;
pub mod checksum;
pub mod config;
pub mod debug;
pub mod device_allocator;
pub mod error;
pub mod format;
pub mod heap;
pub mod ids;
pub mod pickle;
pub mod pluggable;
pub mod rng;
pub mod sim;
pub mod snapshot;
pub mod stats;
pub(crate) mod store;
pub(crate) mod sync;
pub mod trace;

pub use backend::{Backend, BackendError, MemInfo};
pub use caching::CachingAllocator;
pub use config::AllocatorConfig;
pub use error::AllocError;
pub use ids::{DeviceIndex, DevicePtr, EventId, MempoolId, StreamId};
pub use stats::{DeviceStats, Stat, StatArray, StatType};
