//! [`CachingAllocator`](super::CachingAllocator)'s methods, one file per
//! concern, each an `impl` block of its own (rustdoc lists each block as a
//! section of the type's page):
//!
//! ```text
//! settings   backend, device, settings, memory fraction
//! alloc      raw_alloc / raw_free, Allocation, record_stream, free_after_sync
//! cache      empty_cache (whole or per pool), cache_info
//! pools      private pools (CUDA graphs, MemPool) and their checkpoints
//! stats      memory_stats and its resets, mem_info
//! observe    history, trace trackers, callbacks, observers, debug output
//! inspect    snapshot, segments, base_allocation, check_invariants
//! ```
//!
//! Beside them: constructors and teardown in `caching/mod.rs`, IPC sharing in
//! `caching/ipc.rs`, and replay-only operations behind
//! [`CachingAllocator::seeder`](super::CachingAllocator::seeder)
//! (`caching/seed.rs`).

mod alloc;
mod cache;
mod inspect;
mod observe;
mod pools;
mod settings;
mod stats;
