//! The observer owner: history settings, the history ring, trace trackers,
//! callbacks, debug verbosity and the stacks kept for blocks and segments.
//! The recording itself (PyTorch's `record_trace`) is in `history.rs`.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::backend::StreamId;
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

/// One recorded event with its (not yet symbolized) stack.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub(in crate::caching) action: TraceAction,
    pub(in crate::caching) addr: u64,
    pub(in crate::caching) size: u64,
    pub(in crate::caching) stream: StreamId,
    pub(in crate::caching) time_us: i64,
    pub(in crate::caching) pool: MempoolId,
    pub(in crate::caching) context: Option<Context>,
}

impl Recorded {
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
    pub(in crate::caching) addr: u64,
    pub(in crate::caching) seq: u64,
    pub(in crate::caching) ctx: Context,
}

/// What observes a device: history, trackers, callbacks, debug output.
///
/// Stacks recorded for blocks are kept here, not in the blocks, so that
/// blocks stay as small and cheap to move as without recording.
pub(crate) struct Observe {
    /// Something needs the slow path: history on, a tracker, debug output,
    /// or blocks still holding a stack (so that freeing them drops it).
    pub active: bool,
    pub record_history: bool,
    pub when: RecordContext,
    pub ring: RingBuffer<Recorded>,
    pub trackers: Vec<TraceTracker>,
    pub verbosity: DebugVerbosity,
    pub callbacks: Arc<CallbackRegistry>,
    /// Stack of the public operation in progress (set under the lock).
    pub cur_ctx: Option<Context>,
    /// The block about to be handed out came from the device, not the cache.
    pub fresh: bool,
    /// Allocation stacks (PyTorch's `context_when_allocated`), by block.
    /// Invariant: only active blocks have one, and the slow path is on
    /// while any exists, so that freeing the block drops it.
    pub block_ctx: FxHashMap<BlockId, Context>,
    /// Segment stacks (PyTorch's `context_when_segment_allocated`), by the
    /// block holding them.
    pub seg_ctx: FxHashMap<BlockId, SegmentContext>,
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
        }
    }

    /// Recompute [`Observe::active`] after a change.
    pub fn refresh(&mut self) {
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

    /// The history, oldest first.
    pub fn entries(&self) -> Vec<TraceEntry> {
        self.ring.entries().map(Recorded::to_entry).collect()
    }
}
