//! What the allocators let a program watch, shared by both of them
//! ([`CachingAllocator`](crate::caching::CachingAllocator) and
//! [`HeapAllocator`](crate::heap::HeapAllocator)): nothing here decides
//! anything, it records and reports.
//!
//! * [`trace`]: the allocation history, PyTorch's trace entries
//!   ([`TraceEntry`](trace::TraceEntry)), the ring buffer that keeps them and
//!   the stack contexts attached to them.
//! * [`callbacks`]: PyTorch's MPS callback registry, named callbacks fired
//!   with an [`AllocatorEvent`](callbacks::AllocatorEvent).
//! * [`debug`]: `tracing` debug output of the allocators' decisions
//!   (`RESERVOIR_DEBUG_VERBOSITY`).
//! * [`snapshot`]: the memory snapshot report, PyTorch's segments, blocks
//!   and history as a typed model ([`Snapshot`](snapshot::Snapshot)),
//!   written with [`pickle`], the subset of Python's pickle PyTorch's
//!   viewers read.
//!
//! Inside, bottom to top: `pickle`, `trace`, `callbacks` and `debug` use
//! nothing of each other; `snapshot` uses `trace` (its history entries) and
//! `pickle` (its encoding). All of them use only
//! [`backend`](crate::backend)'s ids from the rest of the crate.

pub mod callbacks;
pub mod debug;
pub mod pickle;
pub mod snapshot;
pub mod trace;
