//! The observer owner: history settings, the history ring, trace trackers,
//! callbacks, debug verbosity and the stacks kept for blocks and segments.
//! The recording itself (PyTorch's `record_trace`) is in `history.rs`.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::backend::{DevicePtr, StreamId};
use crate::caching::request::{FreeMemoryCallback, OomObserver};
use crate::ids::MempoolId;
use crate::observe::callbacks::CallbackRegistry;
use crate::observe::debug::DebugVerbosity;
use crate::observe::trace::{Context, Frame, RecordContext, RingBuffer, TraceAction, TraceEntry};
use crate::store::BlockId;

/// Whether and how much history is kept (PyTorch's `enabled` argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HistoryMode {
    /// Nothing is recorded; the history is cleared (`enabled=None`).
    #[default]
    Off,
    /// Only stacks of live blocks matter: the history keeps one entry
    /// (`enabled="state"` forces `max_entries = 1`).
    State,
    /// Every event is kept, up to `max_entries` (`enabled="all"`).
    All,
}

/// Where stacks come from when a [`RecordContext`] level asks for one.
#[derive(Clone, Default)]
pub enum ContextRecorder {
    /// Capture a [`std::backtrace::Backtrace`] of the calling thread,
    /// symbolized only when a history or snapshot is read.
    #[default]
    Backtrace,
    /// Call a function returning the frames (for example a Python
    /// interpreter's stack, through an FFI layer).
    Custom(Arc<dyn Fn() -> Arc<[Frame]> + Send + Sync>),
}

impl ContextRecorder {
    pub(crate) fn gather_context(&self) -> Context {
        match self {
            ContextRecorder::Backtrace => Context::capture(),
            ContextRecorder::Custom(f) => Context::from_frames(f()),
        }
    }
}

impl std::fmt::Debug for ContextRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContextRecorder::Backtrace => f.write_str("Backtrace"),
            ContextRecorder::Custom(_) => f.write_str("Custom"),
        }
    }
}

/// Settings of [`CachingAllocator::record_memory_history`](crate::caching::CachingAllocator::record_memory_history),
/// PyTorch's `torch.cuda.memory._record_memory_history(enabled, context,
/// stacks, max_entries, clear_history)`.
#[derive(Clone, Debug)]
pub struct HistoryConfig {
    /// Off, state-only or all events.
    pub enabled: HistoryMode,
    /// Which events gather a stack (ignored, as `Never`, when `enabled` is `Off`).
    pub context: RecordContext,
    /// Ring-buffer size for [`HistoryMode::All`] (at least 1; default
    /// unbounded, PyTorch's `sys.maxsize`).
    pub max_entries: usize,
    /// Where stacks come from.
    pub recorder: ContextRecorder,
    /// Drop the entries recorded so far.
    pub clear_history: bool,
}

impl Default for HistoryConfig {
    /// PyTorch's defaults: `enabled="all"`, `context="all"`, unbounded.
    fn default() -> Self {
        HistoryConfig {
            enabled: HistoryMode::All,
            context: RecordContext::All,
            max_entries: usize::MAX,
            recorder: ContextRecorder::Backtrace,
            clear_history: false,
        }
    }
}

impl HistoryConfig {
    /// Recording off (`enabled=None`).
    pub fn off() -> HistoryConfig {
        HistoryConfig {
            enabled: HistoryMode::Off,
            context: RecordContext::Never,
            ..HistoryConfig::default()
        }
    }

    /// Every event, no stacks: the cheapest full history.
    pub fn events_only(max_entries: usize) -> HistoryConfig {
        HistoryConfig {
            enabled: HistoryMode::All,
            context: RecordContext::Never,
            max_entries,
            ..HistoryConfig::default()
        }
    }
}

/// A callback run on every trace entry the allocator records, even with
/// history off (PyTorch's `AllocatorTraceTracker`). Runs under the
/// allocator's lock: it must not call back into the allocator.
pub type TraceTracker = Arc<dyn Fn(&TraceEntry) + Send + Sync>;

/// One recorded event with its (not yet symbolized) stack: a plain record.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    action: TraceAction,
    addr: u64,
    size: u64,
    stream: StreamId,
    time_us: i64,
    pool: MempoolId,
    context: Option<Context>,
}

impl Recorded {
    /// The event `action` on `size` bytes at `addr`, of private pool `pool`
    /// (the default id for the global pools), at `time_us`, with its stack.
    #[inline]
    pub fn new(
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        time_us: i64,
        pool: MempoolId,
        context: Option<Context>,
    ) -> Recorded {
        Recorded {
            action,
            addr,
            size,
            stream,
            time_us,
            pool,
            context,
        }
    }

    pub fn to_entry(&self) -> TraceEntry {
        let mut e = TraceEntry::new(self.action, self.addr, self.size, self.stream);
        e.time_us = Some(self.time_us);
        // torch 2.15 writes these on every entry.
        e.compile_context = Some("N/A".into());
        e.user_metadata = Some(String::new());
        e.pool_id = Some(pool_id_tuple(self.pool));
        if let Some(c) = &self.context {
            e.frames = c.frames();
            e.empty_frames_key = e.frames.is_empty();
        }
        e
    }
}

/// A pool id as PyTorch writes it: a tuple of two signed 64-bit ints.
pub(crate) fn pool_id_tuple(id: MempoolId) -> (i64, i64) {
    (id.0 as i64, id.1 as i64)
}

/// A segment's stack, recorded for the block that was its first block at
/// `addr` in the segment created `seq`-th (checked on use: a block slot
/// may be reused while nothing observes).
#[derive(Clone, Debug)]
pub(crate) struct SegmentContext {
    addr: u64,
    seq: u64,
    ctx: Context,
}

impl SegmentContext {
    /// The stack `ctx` of the segment created `seq`-th, whose first block
    /// is at `addr`.
    #[inline]
    pub fn new(addr: u64, seq: u64, ctx: Context) -> SegmentContext {
        SegmentContext { addr, seq, ctx }
    }

    /// The segment's `seq`.
    #[inline]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Recorded for a first block at `addr` of the segment created `seq`-th.
    #[inline]
    pub fn is_for(&self, addr: u64, seq: u64) -> bool {
        self.addr == addr && self.seq == seq
    }

    /// The stack.
    #[inline]
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The stack, taken.
    #[inline]
    pub fn into_context(self) -> Context {
        self.ctx
    }
}

/// What observes a device: history, trackers, callbacks, debug output.
///
/// Stacks recorded for blocks are kept here, not in the blocks, so that
/// blocks stay as small and cheap to move as without recording.
///
/// The fields change only through the methods below, which keep the
/// invariants: `active` is on exactly while something needs the slow path
/// (recomputed by every setter); the ring keeps at most its `max_entries`;
/// every entry recorded goes to every tracker; allocation stacks are kept
/// only while `active` (so that freeing their block drops them).
pub(crate) struct Observe {
    /// Something needs the slow path: history on, a tracker, debug output,
    /// or blocks still holding a stack (so that freeing them drops it).
    active: bool,
    /// History is recorded (`enabled` is not `None`).
    record_history: bool,
    /// Which events keep a stack in the history.
    when: RecordContext,
    /// The history, bounded by its `max_entries`.
    ring: RingBuffer<Recorded>,
    /// Called on every entry recorded, even with history off.
    trackers: Vec<TraceTracker>,
    /// Debug output levels.
    verbosity: DebugVerbosity,
    /// Named callbacks fired on allocator events.
    callbacks: Arc<CallbackRegistry>,
    /// Stack of the public operation in progress (set under the lock).
    cur_ctx: Option<Context>,
    /// The block about to be handed out came from the device, not the cache.
    fresh: bool,
    /// Allocation stacks (PyTorch's `context_when_allocated`), by block.
    /// Invariant: only active blocks have one, and the slow path is on
    /// while any exists, so that freeing the block drops it.
    block_ctx: FxHashMap<BlockId, Context>,
    /// Segment stacks (PyTorch's `context_when_segment_allocated`), by the
    /// block holding them.
    seg_ctx: FxHashMap<BlockId, SegmentContext>,
    /// Run when the cache has no fitting block (see `malloc.rs`), in the
    /// order registered.
    free_memory_callbacks: Vec<FreeMemoryCallback>,
    /// Told of every out-of-memory error, outside the lock (see `oom.rs`).
    oom_observers: Vec<OomObserver>,
}

impl Observe {
    pub fn new(callbacks: Arc<CallbackRegistry>) -> Observe {
        Observe {
            active: false,
            record_history: false,
            when: RecordContext::Never,
            ring: RingBuffer::new(1),
            trackers: Vec::new(),
            verbosity: DebugVerbosity::OFF,
            callbacks,
            cur_ctx: None,
            fresh: false,
            block_ctx: FxHashMap::default(),
            seg_ctx: FxHashMap::default(),
            free_memory_callbacks: Vec::new(),
            oom_observers: Vec::new(),
        }
    }

    /// Recompute `active` after a change.
    fn refresh(&mut self) {
        let active = self.record_history
            || !self.trackers.is_empty()
            || !self.verbosity.is_off()
            || !self.block_ctx.is_empty();
        if active && !self.active {
            // `fresh` may be stale from a malloc made while inactive.
            self.fresh = false;
        }
        self.active = active;
    }

    /// PyTorch's `recordHistory(enabled, recorder, max_entries, when)`.
    pub fn configure(&mut self, c: &HistoryConfig) {
        let enabled = c.enabled != HistoryMode::Off;
        self.record_history = enabled;
        let max = if c.enabled == HistoryMode::All {
            c.max_entries
        } else {
            1
        };
        self.ring.set_max_entries(max);
        self.when = if enabled {
            c.context
        } else {
            RecordContext::Never
        };
        if !enabled || c.clear_history {
            self.ring.clear();
        }
        self.refresh();
    }

    // -- The switches -------------------------------------------------------

    /// Something needs the slow path (history, a tracker, debug output or
    /// a kept stack).
    #[inline]
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// The slow path of `record_trace` must run: [`Observe::is_active`] or
    /// a callback is registered.
    #[inline]
    pub fn is_observing(&self) -> bool {
        self.active | self.callbacks.is_active()
    }

    /// History is recorded (`isHistoryEnabled`).
    #[inline]
    pub fn is_recording(&self) -> bool {
        self.record_history
    }

    /// Which events gather a stack.
    #[inline]
    pub fn record_context(&self) -> RecordContext {
        self.when
    }

    /// The debug output levels in force.
    #[inline]
    pub fn verbosity(&self) -> DebugVerbosity {
        self.verbosity
    }

    /// Set the debug output levels.
    pub fn set_verbosity(&mut self, verbosity: DebugVerbosity) {
        self.verbosity = verbosity;
        self.refresh();
    }

    /// Call `tracker` on every entry recorded from now on.
    pub fn add_tracker(&mut self, tracker: TraceTracker) {
        self.trackers.push(tracker);
        self.refresh();
    }

    /// The callback registry.
    #[inline]
    pub fn callbacks(&self) -> &CallbackRegistry {
        &self.callbacks
    }

    /// Use `callbacks` as the callback registry.
    pub fn set_callbacks(&mut self, callbacks: Arc<CallbackRegistry>) {
        self.callbacks = callbacks;
    }

    // -- The operation in progress --------------------------------------

    /// The stack of the public operation in progress, if gathered.
    #[inline]
    pub fn current_context(&self) -> Option<&Context> {
        self.cur_ctx.as_ref()
    }

    /// Set (or, with `None`, clear) the stack of the operation in progress.
    #[inline]
    pub fn set_current_context(&mut self, ctx: Option<Context>) {
        self.cur_ctx = ctx;
    }

    /// Note whether the block about to be handed out comes from the device.
    #[inline]
    pub fn set_fresh(&mut self, fresh: bool) {
        self.fresh = fresh;
    }

    /// Whether the block handed out came from the device; reset.
    #[inline]
    pub fn take_fresh(&mut self) -> bool {
        std::mem::take(&mut self.fresh)
    }

    // -- The history ------------------------------------------------------

    /// Something takes recorded entries (the history or a tracker): worth
    /// building one.
    #[inline]
    pub fn takes_entries(&self) -> bool {
        self.record_history || !self.trackers.is_empty()
    }

    /// Record one entry: its stack only if the recording level keeps stacks
    /// in entries (`Alloc` or above); every tracker sees it, and the history
    /// keeps it if recording.
    pub fn record(&mut self, mut rec: Recorded) {
        if self.when < RecordContext::Alloc {
            rec.context = None;
        }
        if !self.trackers.is_empty() {
            let entry = rec.to_entry();
            for t in &self.trackers {
                t(&entry);
            }
        }
        if self.record_history {
            self.ring.push(rec);
        }
    }

    /// The history, oldest first.
    pub fn entries(&self) -> Vec<TraceEntry> {
        self.ring.entries().map(Recorded::to_entry).collect()
    }

    /// Drop the recorded entries, keep recording.
    pub fn clear_history(&mut self) {
        self.ring.clear();
    }

    // -- Stacks of blocks and segments ----------------------------------

    /// The allocation stack of `block`.
    #[inline]
    pub fn block_context(&self, block: BlockId) -> Option<&Context> {
        self.block_ctx.get(&block)
    }

    /// The blocks holding an allocation stack.
    pub fn blocks_with_context(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.block_ctx.keys().copied()
    }

    /// Keep `ctx` as the allocation stack of `block` (or, with `None`,
    /// drop it); the slow path stays on while any is kept.
    pub fn set_block_context(&mut self, block: BlockId, ctx: Option<Context>) {
        let was_empty = self.block_ctx.is_empty();
        match ctx {
            Some(c) => {
                self.block_ctx.insert(block, c);
            }
            None => {
                self.block_ctx.remove(&block);
            }
        }
        if was_empty != self.block_ctx.is_empty() {
            self.refresh();
        }
    }

    /// The segment stack kept by `block`, unchecked (see
    /// [`SegmentContext::is_for`]).
    #[inline]
    pub fn segment_context(&self, block: BlockId) -> Option<&SegmentContext> {
        self.seg_ctx.get(&block)
    }

    /// Keep `c` as the segment stack held by `block` (or, with `None`, drop
    /// it).
    pub fn set_segment_context(&mut self, block: BlockId, c: Option<SegmentContext>) {
        match c {
            Some(c) => {
                self.seg_ctx.insert(block, c);
            }
            None => {
                self.seg_ctx.remove(&block);
            }
        }
    }

    /// The segment stack held by `block`, no longer held.
    pub fn take_segment_context(&mut self, block: BlockId) -> Option<SegmentContext> {
        self.seg_ctx.remove(&block)
    }
}

impl Observe {
    /// Register a callback run when the cache has no block for a request.
    pub fn add_free_memory_callback(&mut self, callback: FreeMemoryCallback) {
        self.free_memory_callbacks.push(callback);
    }

    /// Some free-memory callback is registered.
    #[inline]
    pub fn has_free_memory_callbacks(&self) -> bool {
        !self.free_memory_callbacks.is_empty()
    }

    /// Run every free-memory callback, in the order registered: the
    /// pointers they ask to free, in that order.
    pub fn run_free_memory_callbacks(&mut self) -> Vec<DevicePtr> {
        let mut to_free = Vec::new();
        for cb in self.free_memory_callbacks.iter_mut() {
            to_free.extend(cb());
        }
        to_free
    }

    /// Register an observer told of every out-of-memory error.
    pub fn add_oom_observer(&mut self, observer: OomObserver) {
        self.oom_observers.push(observer);
    }

    /// The out-of-memory observers, to be called after the lock is released.
    pub fn oom_observers(&self) -> Vec<OomObserver> {
        self.oom_observers.clone()
    }
}
