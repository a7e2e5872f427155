//! The CUDA-style caching allocator, exact to PyTorch's native allocator.
//!
//! [`CachingAllocator`] owns a [`Backend`] and one device's state behind one
//! lock (as PyTorch's `DeviceCachingAllocator` does). Requests are rounded,
//! served best-fit from per-stream pools of free blocks, split and merged; the
//! driver is called only when the cache cannot serve a request, and the whole
//! retry chain (free-memory callbacks, garbage collection, releasing one
//! oversize block, flushing the cache) runs before an out-of-memory error
//! carrying PyTorch's message.
//!
//! Observing the allocator:
//! * [`CachingAllocator::record_memory_history`] keeps a history of trace
//!   entries with optional stacks (PyTorch's `_record_memory_history`),
//!   read with [`CachingAllocator::history`];
//!   [`CachingAllocator::attach_trace_tracker`] sees every entry as it is
//!   recorded.
//! * [`CachingAllocator::snapshot`] returns a
//!   [`Snapshot`](crate::observe::snapshot::Snapshot) exactly as
//!   `torch.cuda.memory._snapshot()` builds it (segments, blocks, stacks,
//!   trace, settings), ready to be written as a pickle for
//!   pytorch.org/memory_viz.
//! * [`CachingAllocator::callbacks`] is a registry of named callbacks fired
//!   on allocations, reuses, frees, releases and failures (see
//!   [`crate::observe::callbacks`]); [`CachingAllocator::attach_oom_observer`] sees
//!   out-of-memory failures.
//! * Debug output through `tracing`, selected by the
//!   `RESERVOIR_DEBUG_VERBOSITY` bitmask (see [`crate::observe::debug`]).
//!
//! With all of these off, each event costs the allocator one branch.
//!
//! Sharing and teardown:
//! * [`CachingAllocator::share_ipc_handle`] gives another process the
//!   handle of a block's segment and the block's offset (spec 1.16), which
//!   it opens with [`CachingAllocator::open_ipc_handle`] (backends with the
//!   [`Ipc`](crate::backend::Ipc) capability).
//! * Dropping the allocator (or [`CachingAllocator::close`]) gives every
//!   segment back to the backend, see [`TeardownReport`].
//!
//! ```
//! use reservoir::caching::{HistoryConfig, HistoryMode};
//! use reservoir::observe::trace::{RecordContext, TraceAction};
//! use reservoir::{AllocatorConfig, CachingAllocator, StreamId};
//! use reservoir::sim::SimDevice;
//!
//! let alloc = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
//! alloc.record_memory_history(HistoryConfig {
//!     enabled: HistoryMode::All,
//!     context: RecordContext::Alloc,
//!     max_entries: 100_000,
//!     ..HistoryConfig::default()
//! });
//! let p = alloc.raw_alloc(4096, StreamId::DEFAULT).unwrap();
//! let snap = alloc.snapshot(None);
//! assert_eq!(snap.segments[0].blocks[0].requested_size, Some(4096));
//! let actions: Vec<_> = snap.device_traces[0].iter().map(|e| e.action).collect();
//! assert_eq!(actions, [TraceAction::SegmentAlloc, TraceAction::Alloc]);
//! snap.check_consistency().unwrap();
//! let pickle = snap.to_pickle().unwrap(); // loads in Python and memory_viz
//! # assert!(!pickle.is_empty());
//! alloc.raw_free(p).unwrap();
//! ```

mod accounting;
mod api;
mod check;
mod device_reserved;
mod events;
mod expandable;
mod free;
mod history;
mod ipc;
mod live_stats;
mod malloc;
mod oom;
mod pointer_map;
mod policy;
mod pools;
mod release;
mod request;
pub mod rules;
mod seed;
mod shards;
mod snapshot;
mod state;
pub mod stream_order;
mod teardown;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::backend::{Backend, DevicePtr, StreamId};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::observe::callbacks::CallbackRegistry;
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::trace::{Context, RecordContext};
use crate::sync::{Mutex, RwLock};

pub use check::InvariantViolation;
pub use ipc::IpcShare;
pub use pools::{BlockCheckpoint, PoolCheckpoint, PoolFilter, RestoreResult, SegmentCheckpoint};
pub use request::{FreeMemoryCallback, OomObserver};
pub use seed::{SeedError, SeededBlock, SeededExpandable, SeededSegment, Seeder};
pub use shards::{ShardsSeeder, StreamShards, StreamShardsError, DEFAULT_MAX_STREAMS};
pub use snapshot::StreamSegmentSize;
pub use state::observe::{ContextRecorder, HistoryConfig, HistoryMode, TraceTracker};
use state::DeviceState;
pub use teardown::TeardownReport;

/// PyTorch's CUDA caching allocator over any [`Backend`], for one device.
///
/// `Send + Sync`: share it between threads behind an `Arc`. Every call takes
/// the device lock once.
pub struct CachingAllocator<B: Backend> {
    backend: B,
    state: Mutex<DeviceState>,
    /// The [`RecordContext`] in force, as `u8`, read without the lock to
    /// decide whether to gather a stack (PyTorch's `record_context_`).
    record_level: AtomicU8,
    /// Where stacks come from (read only when `record_level` asks).
    recorder: RwLock<ContextRecorder>,
    callbacks: Arc<CallbackRegistry>,
    /// Segments opened from other processes' IPC handles (see `ipc.rs`).
    ipc_opened: Mutex<ipc::OpenedSegments>,
}

fn level_u8(l: RecordContext) -> u8 {
    match l {
        RecordContext::Never => 0,
        RecordContext::State => 1,
        RecordContext::Alloc => 2,
        RecordContext::All => 3,
    }
}

/// Making an allocator and closing it. The other methods are grouped by
/// concern in the blocks below (files under `caching/api/`): settings,
/// allocating and freeing, the cache, private pools, statistics, observing,
/// inspecting; then IPC sharing, and [`seeder`](Self::seeder) for the
/// operations only a replay uses.
impl<B: Backend> CachingAllocator<B> {
    /// An allocator for device 0 with the given settings.
    /// `AllocatorConfig::default()` is PyTorch mode: PyTorch's allocator,
    /// exact.
    pub fn new(backend: B, config: AllocatorConfig) -> Self {
        Self::with_device(backend, config, 0)
    }

    /// An allocator for device 0 with Reservoir's default settings outside
    /// PyTorch mode, [`AllocatorConfig::reservoir`]: the `reservoir` policy,
    /// which reserves less than PyTorch's defaults (within 1.05 x the live
    /// bytes + 4 MiB per stream on every measured trace) for more simulated
    /// driver time (BENCHMARKS.md, "The `reservoir` policy"). On a backend
    /// without virtual memory it is PyTorch mode.
    ///
    /// ```
    /// use reservoir::{CachingAllocator, StreamId};
    /// use reservoir::sim::SimDevice;
    ///
    /// let alloc = CachingAllocator::reservoir(SimDevice::default());
    /// let p = alloc.raw_alloc(3 << 20, StreamId::DEFAULT).unwrap();
    /// // 2 MiB pages: 4 MiB reserved (PyTorch mode: a 20 MiB segment)
    /// assert_eq!(alloc.memory_stats()["reserved_bytes.all.current"], 4 << 20);
    /// alloc.raw_free(p).unwrap();
    /// ```
    pub fn reservoir(backend: B) -> Self {
        Self::new(backend, AllocatorConfig::reservoir())
    }

    /// An allocator for device `device`.
    pub fn with_device(backend: B, config: AllocatorConfig, device: i8) -> Self {
        let config = supported(config, &backend);
        let fraction = config.per_process_memory_fraction;
        let mut state = DeviceState::new(device, config);
        if fraction < 1.0 {
            if let Ok(info) = backend.mem_info() {
                let rounding = state.config.torch_release.rules().memory_fraction_rounding;
                state
                    .acct
                    .set_memory_fraction(fraction, info.total, rounding);
            }
        }
        let callbacks = Arc::new(CallbackRegistry::new());
        state.obs.set_callbacks(callbacks.clone());
        let verbosity = DebugVerbosity::from_env().unwrap_or_else(|e| {
            tracing::warn!(target: TARGET, "{e}; debug output stays off");
            DebugVerbosity::OFF
        });
        state.obs.set_verbosity(verbosity);
        if verbosity.contains(DebugVerbosity::PROFILING) {
            tracing::info!(
                target: TARGET,
                "Initializing caching allocator on device {device} ({} backend, settings {:?}, \
                 debug verbosity {verbosity})",
                backend.name(),
                state.config.last_settings,
            );
        }
        CachingAllocator {
            backend,
            state: Mutex::new(state),
            record_level: AtomicU8::new(0),
            recorder: RwLock::new(ContextRecorder::Backtrace),
            callbacks,
            ipc_opened: Mutex::new(ipc::OpenedSegments::default()),
        }
    }

    /// PyTorch's `maybeGatherContext(level)`: a stack if the recording
    /// level asks for one at `level`.
    #[inline]
    fn gather(&self, level: RecordContext) -> Option<Context> {
        if self.record_level.load(Ordering::Relaxed) < level_u8(level) {
            return None;
        }
        Some(self.recorder.read().gather_context())
    }

    /// Run `f` under the lock with `ctx` as the operation's stack.
    fn with_context<R>(&self, ctx: Option<Context>, f: impl FnOnce(&mut DeviceState) -> R) -> R {
        let mut state = self.state.lock();
        if ctx.is_none() {
            return f(&mut state);
        }
        state.obs.set_current_context(ctx);
        let r = f(&mut state);
        state.obs.set_current_context(None);
        r
    }

    /// Tear the allocator down and say what was found: every segment goes
    /// back to the backend after pending events are synchronised, including
    /// segments of blocks still allocated (see [`TeardownReport`]). Dropping
    /// the allocator does the same and logs the report (a warning when
    /// blocks were still allocated or the backend failed).
    pub fn close(mut self) -> TeardownReport {
        self.teardown()
    }

    fn teardown(&mut self) -> TeardownReport {
        let ipc_errors = self.close_opened_segments();
        let mut report = self.state.get_mut().teardown(&self.backend);
        report.errors.extend(ipc_errors);
        report
    }
}

impl<B: Backend> Drop for CachingAllocator<B> {
    fn drop(&mut self) {
        let report = self.teardown();
        let device = self.state.get_mut().device;
        if report.segments_released > 0 || !report.is_clean() {
            teardown::log_teardown(device, self.backend.name(), &report);
        }
    }
}

/// The settings a backend can honour: without virtual memory, expandable
/// segments are off, as PyTorch does on platforms without them (spec 1.11).
fn supported<B: Backend>(mut config: AllocatorConfig, backend: &B) -> AllocatorConfig {
    if config.expandable_segments && backend.as_virtual_memory().is_none() {
        tracing::warn!(
            backend = backend.name(),
            "expandable_segments not supported on this platform: the {} backend has no virtual \
             memory capability; continuing without expandable segments",
            backend.name()
        );
        config.expandable_segments = false;
    }
    config
}

/// An allocation that frees itself on drop.
pub struct Allocation<'a, B: Backend> {
    allocator: &'a CachingAllocator<B>,
    ptr: DevicePtr,
    size: u64,
}

impl<B: Backend> Allocation<'_, B> {
    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The bytes requested.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Mark the allocation as used by `stream` (see [`CachingAllocator::record_stream`]).
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        self.allocator.record_stream(self.ptr, stream)
    }
}

impl<B: Backend> Drop for Allocation<'_, B> {
    fn drop(&mut self) {
        // The pointer came from this allocator and is freed once: this cannot fail
        // except on a lost device, which a destructor cannot report.
        let _ = self.allocator.raw_free(self.ptr);
    }
}

impl<B: Backend> std::fmt::Debug for Allocation<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.ptr)
            .field("size", &self.size)
            .finish()
    }
}
