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
//! * [`stats`] and [`config`] mirror PyTorch's statistics and settings.
//! * [`observe`] is what both allocators report: the allocation history
//!   ([`observe::trace`]), the MPS-style registry of named allocator
//!   callbacks ([`observe::callbacks`]), `tracing` debug output
//!   ([`observe::debug`], `RESERVOIR_DEBUG_VERBOSITY`), and PyTorch's memory
//!   snapshot ([`observe::snapshot`], built by
//!   [`caching::CachingAllocator::snapshot`], written as a pickle by
//!   [`observe::pickle`]).
//! * [`pluggable`] is PyTorch's `CUDAPluggableAllocator`: an allocator made
//!   of user functions, also usable as the [`Backend`] under the caching
//!   allocator.
//!
//! The layers, bottom to top: each line uses only the lines above it.
//!
//! ```text
//! ids, format, checksum, rng,           plain types and helpers; import nothing
//! stats, sync (crate-private)           of the crate
//! backend                               the device contract; optional capabilities
//!                                       (VirtualMemory, Memcpy, DeviceWork, HostWrite,
//!                                       HostMapping)
//! error                                 AllocError (wraps BackendError)
//! sim                                   the simulated devices (no allocator inside)
//! store (crate-private)                 BlockStore: blocks, segments, split/merge,
//!                                       FreeList<K>, SizeClassList<K>; pure mechanism
//! observe: pickle, trace, callbacks,    what the allocators report: history entries,
//!          debug, snapshot              callbacks, debug output, the snapshot model
//!                                       and its pickle encoding
//! config                                settings (PyTorch's keys, the snapshot's
//!                                       allocator_settings)
//! caching | heap | pluggable            the three allocators of PyTorch's headers;
//!                                       caching/policy.rs is where Reservoir's own
//!                                       policies hook in
//! device_allocator                      the c10 DeviceAllocator contract
//! ```
//!
//! Paths: the history, callback, debug and snapshot modules used to sit at
//! the crate root (`reservoir::trace`, `reservoir::callbacks`,
//! `reservoir::debug`, `reservoir::snapshot`, `reservoir::pickle`); they
//! are now under [`observe`] (`reservoir::observe::trace`, ...), with no
//! aliases left at the root. The two types most often named,
//! [`Snapshot`] and [`TraceEntry`], are also re-exported here.
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
pub mod checksum;
pub mod config;
pub mod device_allocator;
pub mod error;
pub mod format;
pub mod heap;
pub mod ids;
pub mod observe;
pub mod outfile;
pub mod pluggable;
pub mod rng;
pub mod sim;
pub mod stats;
pub(crate) mod store;
pub(crate) mod sync;

pub use backend::{Backend, BackendError, MemInfo};
pub use caching::CachingAllocator;
pub use config::{AllocatorConfig, ReleaseRules, TorchRelease};
pub use error::AllocError;
pub use ids::{DeviceIndex, DevicePtr, EventId, MempoolId, StreamId};
pub use observe::snapshot::Snapshot;
pub use observe::trace::TraceEntry;
pub use stats::{DeviceStats, Stat, StatArray, StatType};
