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
//! * [`CachingAllocator::snapshot`] returns a [`Snapshot`] exactly as
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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::backend::{Backend, DevicePtr, MemInfo, StreamId};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::callbacks::{AllocatorEvent, CallbackRegistry, EventType};
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::snapshot::{LayoutSummary, Segment, Snapshot};
use crate::observe::trace::{Context, Frame, RecordContext, TraceEntry};
use crate::stats::DeviceStats;
use crate::sync::{Mutex, RwLock};

pub use check::InvariantViolation;
pub use ipc::IpcShare;
pub use pools::{BlockCheckpoint, PoolCheckpoint, PoolFilter, RestoreResult, SegmentCheckpoint};
use request::MallocError;
pub use request::{FreeMemoryCallback, OomObserver};
pub use seed::{SeedError, SeededBlock, SeededExpandable, SeededSegment, Seeder};
pub use shards::{StreamShards, StreamShardsError, DEFAULT_MAX_STREAMS};
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
                state.acct.set_memory_fraction(fraction, info.total);
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

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The device index.
    pub fn device(&self) -> i8 {
        self.state.lock().device
    }

    /// Allocate `size` bytes for use on `stream` (PyTorch's
    /// `raw_alloc_with_stream`). A zero-byte request returns
    /// [`DevicePtr::NULL`] and allocates nothing.
    #[inline]
    pub fn raw_alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if size == 0 {
            return Ok(DevicePtr::NULL);
        }
        if self.record_level.load(Ordering::Relaxed) != 0 {
            let ctx = self.gather(RecordContext::State);
            return self.malloc_with(size, stream, ctx);
        }
        let mut state = self.state.lock();
        match state.malloc(&self.backend, size, stream) {
            Ok(id) => Ok(DevicePtr(state.store.blocks[id].addr)),
            Err(e) => {
                drop(state);
                self.malloc_failed(e)
            }
        }
    }

    /// [`raw_alloc`](Self::raw_alloc) with the caller's own stack (for FFI
    /// layers and replays that know the allocating code's frames). The
    /// frames are used as a gathered stack would be: kept only if history
    /// is recorded with a context level of `State` or more.
    pub fn raw_alloc_with_frames(
        &self,
        size: u64,
        stream: StreamId,
        frames: Arc<[Frame]>,
    ) -> Result<DevicePtr, AllocError> {
        if size == 0 {
            return Ok(DevicePtr::NULL);
        }
        let ctx = (self.record_level.load(Ordering::Relaxed) >= level_u8(RecordContext::State))
            .then(|| Context::from_frames(frames));
        self.malloc_with(size, stream, ctx)
    }

    fn malloc_with(
        &self,
        size: u64,
        stream: StreamId,
        ctx: Option<Context>,
    ) -> Result<DevicePtr, AllocError> {
        let mut state = self.state.lock();
        let had = ctx.is_some();
        if had {
            state.obs.set_current_context(ctx);
        }
        let r = state.malloc(&self.backend, size, stream);
        if had {
            state.obs.set_current_context(None);
        }
        match r {
            Ok(id) => Ok(DevicePtr(state.store.blocks[id].addr)),
            Err(e) => {
                drop(state);
                self.malloc_failed(e)
            }
        }
    }

    /// [`raw_alloc`](Self::raw_alloc) that returns `Ok(None)` instead of
    /// reporting an out-of-memory failure (nothing is counted, recorded or
    /// observed for it), for [`StreamShards`] to reclaim other shards'
    /// caches first.
    pub(crate) fn raw_alloc_or_would_oom(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<Option<DevicePtr>, AllocError> {
        if size == 0 {
            return Ok(Some(DevicePtr::NULL));
        }
        let ctx = self.gather(RecordContext::State);
        let r = self.with_context(ctx, |state| {
            state
                .malloc_or_would_oom(&self.backend, size, stream)
                .map(|id| DevicePtr(state.store.blocks[id].addr))
        });
        match r {
            Ok(ptr) => Ok(Some(ptr)),
            Err(MallocError::WouldOom) => Ok(None),
            Err(e) => self.malloc_failed(e).map(Some),
        }
    }

    /// Report reserved-memory changes to `gauge` too (stream shards share
    /// one; set before the shard's first driver call).
    pub(crate) fn share_device_reserved(&self, gauge: Arc<device_reserved::DeviceReserved>) {
        self.state.lock().acct.share_device_reserved(gauge);
    }

    /// A failed malloc, after the lock is released: out-of-memory
    /// observers, then `AllocationFailed` callbacks.
    #[cold]
    fn malloc_failed(&self, e: MallocError) -> Result<DevicePtr, AllocError> {
        match e {
            MallocError::Other(e) => Err(e),
            MallocError::WouldOom => Err(e.into()),
            MallocError::Oom(report) => {
                let e = report.error;
                let limit = e.allowed.unwrap_or(e.device_total);
                for obs in &report.observers {
                    obs(e.device, e.alloc_size, limit, e.device_free);
                }
                self.callbacks.fire(&AllocatorEvent {
                    event: EventType::AllocationFailed,
                    device: e.device,
                    ptr: DevicePtr::NULL,
                    size: e.requested,
                    stream: e.stream,
                });
                Err(AllocError::OutOfMemory(Box::new(e)))
            }
        }
    }

    /// Free a pointer returned by [`raw_alloc`](Self::raw_alloc). Freeing
    /// null is a no-op; a pointer this allocator did not hand out (or already
    /// freed) is an [`AllocError::InvalidPointer`] and changes nothing.
    #[inline]
    pub fn raw_free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        if self.record_level.load(Ordering::Relaxed) >= level_u8(RecordContext::All) {
            let ctx = self.gather(RecordContext::All);
            return self.with_context(ctx, |state| state.free_ptr(&self.backend, ptr));
        }
        self.state.lock().free_ptr(&self.backend, ptr)
    }

    /// Free `ptr` after synchronising the device, for a caller that cannot
    /// keep the pointer when [`raw_free`](Self::raw_free) fails with
    /// [`AllocError::FreeFailed`] (the device could not record an event on
    /// a stream that used the block, `record_stream`): once every stream's
    /// work is done no stream uses the block, and it is freed without
    /// recording any event. The synchronisation (`synchronize_device`, with
    /// the allocator's lock not held) waits for all the device's work: a
    /// slow path, for that failure only. Null is a no-op; a pointer this
    /// allocator did not hand out (or already freed) is
    /// [`AllocError::InvalidPointer`], checked before synchronising; a
    /// failed synchronisation is [`AllocError::Backend`] and frees nothing.
    #[cold]
    pub fn free_after_sync(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        if self.state.lock().allocated.get(&ptr.0).is_none() {
            return Err(AllocError::InvalidPointer { ptr });
        }
        self.backend.synchronize_device()?;
        let ctx = self.gather(RecordContext::All);
        self.with_context(ctx, |state| state.free_ptr_after_sync(&self.backend, ptr))
    }

    /// [`raw_free`](Self::raw_free) with the caller's own stack, used (as a
    /// gathered stack would be) only at context level `All`.
    pub fn raw_free_with_frames(
        &self,
        ptr: DevicePtr,
        frames: Arc<[Frame]>,
    ) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let ctx = (self.record_level.load(Ordering::Relaxed) >= level_u8(RecordContext::All))
            .then(|| Context::from_frames(frames));
        self.with_context(ctx, |state| state.free_ptr(&self.backend, ptr))
    }

    /// Allocate and return an owning handle that frees on drop.
    pub fn alloc(&self, size: u64, stream: StreamId) -> Result<Allocation<'_, B>, AllocError> {
        let ptr = self.raw_alloc(size, stream)?;
        Ok(Allocation {
            allocator: self,
            ptr,
            size,
        })
    }

    /// Mark the block at `ptr` as used by `stream` (PyTorch's
    /// `recordStream`): when freed, it is not reused until the work enqueued
    /// on `stream` so far has completed. Ignored for the allocation stream.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        state.check_stream(&self.backend, stream)?;
        state.record_stream(id, stream);
        Ok(())
    }

    /// Tell the allocator the c10 stream id PyTorch would give `stream`
    /// (see [`stream_order::c10_pool_stream_id`]). PyTorch walks its
    /// per-stream event queues in the order of a hash map keyed by these ids,
    /// so they decide which stream's cross-stream frees complete first. By
    /// default `StreamId(n)` is the n-th pool stream, the default stream 0.
    pub fn set_c10_stream_id(&self, stream: StreamId, id: i64) {
        self.state.lock().events.set_c10_stream_id(stream, id);
    }

    /// Release every cached segment that is entirely free, after waiting for
    /// outstanding cross-stream events (`torch.cuda.empty_cache`).
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.empty_cache_pool(MempoolId::DEFAULT)
    }

    /// [`empty_cache`](Self::empty_cache) scoped to one pool: the default id
    /// releases the global pools and every freeable private pool; a private
    /// pool's id releases only that pool, once it has been released by all
    /// its users (torch 2.9+ `emptyCache(mempool_id)`).
    pub fn empty_cache_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        let ctx = self.gather(RecordContext::All);
        self.with_context(ctx, |state| {
            if state.obs.verbosity().contains(DebugVerbosity::PROFILING) {
                tracing::info!(
                    target: TARGET,
                    "Attempting to release cached blocks of pool {pool:?} (reserved {}, allocated {})",
                    crate::format::format_size(state.acct.reserved_bytes()),
                    crate::format::format_size(state.acct.allocated_bytes()),
                );
            }
            state.release_cached_blocks(&self.backend, pool)?;
            Ok(())
        })
    }

    /// One half of [`empty_cache`](Self::empty_cache): with `large`, wait
    /// for outstanding events and release the large pool's free segments;
    /// without, the small pool's and the freeable private pools'.
    /// [`StreamShards`] runs the first half on every shard, then the second,
    /// in PyTorch's order (spec 1.9: one large pool keyed by stream, then
    /// the small pool).
    pub(crate) fn empty_cache_half(&self, large: bool) -> Result<(), AllocError> {
        let ctx = self.gather(RecordContext::All);
        self.with_context(ctx, |state| {
            if large {
                state.release_cached_large_blocks(&self.backend)?;
            } else {
                state.release_cached_small_and_private_blocks(&self.backend)?;
            }
            Ok(())
        })
    }

    /// Route allocations accepted by `filter` to the private pool `pool`,
    /// creating it (use count 1) or adding a use (PyTorch's
    /// `beginAllocateToPool`). Blocks of a private pool never serve other
    /// allocations.
    pub fn begin_allocate_to_pool(
        &self,
        pool: MempoolId,
        filter: PoolFilter,
    ) -> Result<(), AllocError> {
        self.state
            .lock()
            .begin_allocate_to_pool(pool, filter.into_fn())
    }

    /// Stop routing allocations to `pool` (`endAllocateToPool`).
    pub fn end_allocate_to_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        self.state.lock().end_allocate_to_pool(pool)
    }

    /// Drop one use of `pool` (`releasePool`). At zero uses its cached
    /// memory is returned by the next [`empty_cache`](Self::empty_cache) or
    /// out-of-memory flush, and the pool disappears once nothing of it is left.
    pub fn release_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        self.state.lock().release_pool(pool)
    }

    /// Current use count of a private pool (0 if unknown or released).
    pub fn pool_use_count(&self, pool: MempoolId) -> u32 {
        self.state.lock().pool_use_count(pool)
    }

    /// The segments of one pool, in address order, as a snapshot reports
    /// them (without recording a snapshot in the history).
    pub fn pool_segments(&self, pool: MempoolId) -> Vec<Segment> {
        self.state.lock().segment_models(Some(pool))
    }

    /// The state of a private pool, to restore later (`getCheckpointState`).
    pub fn checkpoint_pool(&self, pool: MempoolId) -> Result<PoolCheckpoint, AllocError> {
        self.state.lock().checkpoint(&self.backend, pool)
    }

    /// Set a private pool back to a checkpoint (`setCheckpointPoolState`):
    /// every allocation of the pool is freed, the checkpoint's allocations
    /// are created anew. A checkpoint that does not match the pool's segments
    /// is refused before anything changes.
    pub fn restore_pool_checkpoint(
        &self,
        checkpoint: &PoolCheckpoint,
    ) -> Result<RestoreResult, AllocError> {
        self.state
            .lock()
            .restore_checkpoint(&self.backend, checkpoint)
    }

    /// The statistics.
    pub fn stats(&self) -> DeviceStats {
        self.state.lock().acct.snapshot()
    }

    /// The statistics as `torch.cuda.memory_stats()` keys: the keys of the
    /// PyTorch release of the configuration
    /// ([`ReleaseRules::missing_stat_keys`](crate::config::ReleaseRules::missing_stat_keys)).
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let state = self.state.lock();
        let mut flat = state.acct.snapshot().to_flat();
        for key in state.config.torch_release.rules().missing_stat_keys() {
            flat.remove(*key);
        }
        flat
    }

    /// Blocks handed out to a stream from another stream's cache by the
    /// Reservoir-only cross-stream reuse policy
    /// ([`ReservoirPolicy::CrossStreamReuse`](crate::config::ReservoirPolicy::CrossStreamReuse)); always 0 in PyTorch mode.
    pub fn cross_stream_reuses(&self) -> u64 {
        self.state.lock().cross_stream_reuses
    }

    /// Zero lifetime totals and event counters.
    pub fn reset_accumulated_stats(&self) {
        self.state.lock().acct.reset_accumulated();
    }

    /// Set every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.state.lock().acct.reset_peak();
    }

    /// Free and total device memory, from the backend.
    pub fn mem_info(&self) -> Result<MemInfo, AllocError> {
        Ok(self.backend.mem_info()?)
    }

    /// Limit the memory this allocator may reserve to `fraction` of the
    /// device (`torch.cuda.set_per_process_memory_fraction`). 1.0 removes
    /// the limit.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidArgument(format!(
                "invalid fraction: {fraction}. Please set within [0, 1]."
            )));
        }
        let total = self.backend.mem_info()?.total;
        self.state.lock().acct.set_memory_fraction(fraction, total);
        Ok(())
    }

    /// The fraction of the device this allocator may reserve (1.0 when unlimited).
    pub fn memory_fraction(&self) -> Result<f64, AllocError> {
        let allowed = self.state.lock().acct.allowed_memory_maximum();
        Ok(match allowed {
            Some(a) => a as f64 / self.backend.mem_info()?.total as f64,
            None => 1.0,
        })
    }

    /// The largest block that could be handed out without a new driver
    /// allocation, or the device's free memory if that is larger
    /// (PyTorch's `cacheInfo`, used for workspace sizing).
    pub fn cache_info(&self) -> Result<u64, AllocError> {
        Ok(self.state.lock().cache_info(&self.backend)?)
    }

    /// The segment an allocated pointer lives in: its base address and total
    /// size (PyTorch's `getBaseAllocation`).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, u64), AllocError> {
        let state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        let (base, size) = state.base_allocation(id)?;
        Ok((DevicePtr(base), size))
    }

    /// Replace the settings at run time (PyTorch's `_set_allocator_settings`).
    /// `stats.max_split_size` keeps the value from construction, as in PyTorch.
    pub fn set_config(&self, config: AllocatorConfig) {
        let config = supported(config, &self.backend);
        let mut state = self.state.lock();
        if state.config.max_split_size != config.max_split_size {
            state.acct.note_max_split_changed();
        }
        state.config = config;
        state.set_free_order();
    }

    /// The settings in force.
    pub fn config(&self) -> AllocatorConfig {
        self.state.lock().config.clone()
    }

    /// Start (or stop, with `false`) keeping an unbounded allocation
    /// history without stacks (see [`record_memory_history`](Self::record_memory_history)).
    pub fn record_history(&self, enabled: bool) {
        self.record_history_with_limit(enabled, usize::MAX);
    }

    /// Keep the newest `max_entries` history entries, without stacks (or
    /// stop recording).
    pub fn record_history_with_limit(&self, enabled: bool, max_entries: usize) {
        self.record_memory_history(if enabled {
            HistoryConfig::events_only(max_entries)
        } else {
            HistoryConfig::off()
        });
    }

    /// Configure history recording, as PyTorch's
    /// `torch.cuda.memory._record_memory_history(enabled, context, stacks,
    /// max_entries, clear_history)`: `enabled` off clears the history;
    /// `State` keeps a single entry; `context` decides which events gather
    /// a stack (see [`RecordContext`]). Stacks already kept by live blocks
    /// stay until the blocks are freed.
    pub fn record_memory_history(&self, config: HistoryConfig) {
        let mut state = self.state.lock();
        state.obs.configure(&config);
        *self.recorder.write() = config.recorder.clone();
        self.record_level
            .store(level_u8(state.obs.record_context()), Ordering::Relaxed);
    }

    /// True while history is recorded (`isHistoryEnabled`).
    pub fn is_history_enabled(&self) -> bool {
        self.state.lock().obs.is_recording()
    }

    /// Drop the recorded entries, keep recording.
    pub fn clear_history(&self) {
        self.state.lock().obs.clear_history();
    }

    /// The recorded history, oldest first (empty when not recording).
    /// Captured backtraces are symbolized here, once each.
    pub fn history(&self) -> Vec<TraceEntry> {
        self.state.lock().obs.entries()
    }

    /// Call `tracker` on every trace entry from now on, even with history
    /// off (PyTorch's `attachAllocatorTraceTracker`). It runs under the
    /// allocator's lock and must not call back into the allocator.
    pub fn attach_trace_tracker(&self, tracker: TraceTracker) {
        let mut state = self.state.lock();
        state.obs.add_tracker(tracker);
    }

    /// The registry of named callbacks fired on allocator events (see
    /// [`crate::observe::callbacks`] for when each event fires).
    pub fn callbacks(&self) -> &Arc<CallbackRegistry> {
        &self.callbacks
    }

    /// Set the debug output levels (initially from `RESERVOIR_DEBUG_VERBOSITY`,
    /// see [`crate::observe::debug`]).
    pub fn set_debug_verbosity(&self, verbosity: DebugVerbosity) {
        let mut state = self.state.lock();
        state.obs.set_verbosity(verbosity);
    }

    /// The debug output levels in force.
    pub fn debug_verbosity(&self) -> DebugVerbosity {
        self.state.lock().obs.verbosity()
    }

    /// A snapshot of the allocator, as `torch.cuda.memory._snapshot()`
    /// returns it (spec 2.2 to 2.5): every segment (one per mapped run of
    /// an expandable segment) with its blocks and stacks, the history, and
    /// the settings. With `Some(pool)` only that pool's segments are listed
    /// (torch's `snapshot(mempool_id)`); the history is the device's whole
    /// history. Each call then appends a `snapshot` entry (size = active
    /// bytes listed) to the history, so it shows in the next snapshot.
    pub fn snapshot(&self, mempool: Option<MempoolId>) -> Snapshot {
        self.snapshot_with(mempool, true)
    }

    /// [`snapshot`](Self::snapshot), with `include_traces = false` leaving
    /// `device_traces` empty (torch's `MemPool.snapshot(include_traces)`).
    pub fn snapshot_with(&self, mempool: Option<MempoolId>, include_traces: bool) -> Snapshot {
        self.state.lock().snapshot(mempool, include_traces)
    }

    /// Bytes mapped in each expandable segment, with its stream and pool
    /// kind, in creation order (PyTorch's `getExpandableSegmentSizes`).
    /// As in PyTorch, segments of the default stream (0) are not listed.
    pub fn expandable_segment_sizes(&self) -> Vec<StreamSegmentSize> {
        self.state.lock().expandable_segment_sizes()
    }

    /// Register a callback run when the cache has no block for a request,
    /// before the driver is asked. See [`FreeMemoryCallback`].
    pub fn add_free_memory_callback(&self, callback: FreeMemoryCallback) {
        self.state.lock().free_memory_callbacks.push(callback);
    }

    /// Register an observer called (outside the lock) on every out-of-memory error.
    pub fn attach_oom_observer(&self, observer: OomObserver) {
        self.state.lock().oom_observers.push(observer);
    }

    /// The segments and their blocks, in address order, as a snapshot
    /// reports them (without recording a snapshot in the history).
    pub fn segments(&self) -> Vec<Segment> {
        self.state.lock().segment_models(None)
    }

    /// The counts of [`segments`](Self::segments) (segments, blocks, free
    /// blocks, largest free block) without building the segment list.
    pub fn layout_summary(&self) -> LayoutSummary {
        self.state.lock().layout_summary()
    }

    /// Check every internal invariant: blocks tile their segments, free lists
    /// hold exactly the free blocks, the pointer map holds exactly the
    /// allocated blocks, and every statistic equals a recount.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.state.lock().check_invariants()
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
