//! Allocation history: PyTorch's trace entries (spec section 2.4), the
//! ring buffer that keeps the most recent ones, and the stack contexts
//! attached to them.
//!
//! * [`TraceEntry`] is one entry with PyTorch's actions and fields.
//! * [`RecordContext`] is PyTorch's `RecordContext`: which events gather a
//!   stack ([`Context`]) and whether trace entries carry it.
//! * [`Context`] is a stack: either frames handed in by the caller (FFI,
//!   replay) or a [`std::backtrace::Backtrace`] captured cheaply and turned
//!   into [`Frame`]s only when a history or snapshot is read.
//!
//! Recording is configured on the allocator:
//! [`CachingAllocator::record_memory_history`](crate::caching::CachingAllocator::record_memory_history).

use std::backtrace::Backtrace;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::backend::StreamId;

/// What happened, with PyTorch's action names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TraceAction {
    /// A block was handed out (`size` = bytes the caller asked for).
    Alloc,
    /// The caller freed a block; it may still wait for other streams.
    FreeRequested,
    /// The block is back in the cache.
    FreeCompleted,
    /// A segment was obtained from the driver.
    SegmentAlloc,
    /// A segment was given back to the driver.
    SegmentFree,
    /// Pages were mapped into an expandable segment.
    SegmentMap,
    /// Pages were unmapped from an expandable segment.
    SegmentUnmap,
    /// A snapshot was taken (`size` = total active bytes).
    Snapshot,
    /// An allocation failed (`addr` holds the device's free bytes).
    Oom,
}

impl TraceAction {
    /// Every action, in PyTorch's enum order.
    pub const ALL: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];

    /// The string PyTorch writes in snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Snapshot => "snapshot",
            TraceAction::Oom => "oom",
        }
    }

    /// Parse a PyTorch action name.
    pub fn parse(s: &str) -> Option<TraceAction> {
        TraceAction::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// True for the actions that change the set of segments.
    pub fn is_segment_event(self) -> bool {
        matches!(
            self,
            TraceAction::SegmentAlloc
                | TraceAction::SegmentFree
                | TraceAction::SegmentMap
                | TraceAction::SegmentUnmap
        )
    }
}

impl fmt::Display for TraceAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stack frame of a recorded context.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Frame {
    /// Function name.
    pub name: String,
    /// Source file.
    pub filename: String,
    /// Line number.
    pub line: i64,
}

/// One entry of the allocation history (`TraceEntry` in PyTorch).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// Block or segment address; for `oom` the device's free bytes
    /// (PyTorch's `device_free`); 0 for `snapshot`.
    pub addr: u64,
    /// Bytes; meaning depends on the action (spec 2.4).
    pub size: u64,
    /// The stream the block or segment belongs to.
    pub stream: StreamId,
    /// Microseconds since the Unix epoch, when known.
    pub time_us: Option<i64>,
    /// The context captured with the entry (empty when none was kept).
    pub frames: Arc<[Frame]>,
    /// The entry has a `frames` key although `frames` is empty. PyTorch
    /// writes the key only on entries that kept a stack (context level
    /// `alloc` or `all`), and a kept stack can be empty; written entries
    /// get the key when `frames` is non-empty or this is set.
    pub empty_frames_key: bool,
    /// torch.compile region the entry was recorded in (PyTorch 2.6+ key
    /// `compile_context`), when recorded.
    pub compile_context: Option<String>,
    /// User metadata attached with `_set_memory_metadata` (2.7+ key
    /// `user_metadata`), when recorded.
    pub user_metadata: Option<String>,
    /// The memory pool of the block or segment (torch 2.15 key `pool_id`,
    /// `(0, 0)` for the default pool), when recorded.
    pub pool_id: Option<(i64, i64)>,
}

impl TraceEntry {
    /// An entry with no time and no frames.
    pub fn new(action: TraceAction, addr: u64, size: u64, stream: StreamId) -> TraceEntry {
        TraceEntry {
            action,
            addr,
            size,
            stream,
            time_us: None,
            frames: Arc::from([]),
            empty_frames_key: false,
            compile_context: None,
            user_metadata: None,
            pool_id: None,
        }
    }
}

/// A bounded history: keeps the newest `max_entries` entries, oldest first
/// (PyTorch's `RingBuffer`: when full, the oldest entry is overwritten).
#[derive(Clone, Debug)]
pub struct RingBuffer<T = TraceEntry> {
    entries: VecDeque<T>,
    max_entries: usize,
}

impl<T> RingBuffer<T> {
    /// A buffer keeping at most `max_entries` (at least 1) entries.
    pub fn new(max_entries: usize) -> RingBuffer<T> {
        RingBuffer {
            entries: VecDeque::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// Append an entry, dropping the oldest when full.
    pub fn push(&mut self, e: T) {
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(e);
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = &T> {
        self.entries.iter()
    }

    /// Drop every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// The capacity.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Change the capacity, dropping the oldest entries if needed.
    pub fn set_max_entries(&mut self, max_entries: usize) {
        self.max_entries = max_entries.max(1);
        while self.entries.len() > self.max_entries {
            self.entries.pop_front();
        }
    }
}

/// Which events gather a stack, and whether trace entries keep it
/// (PyTorch's `RecordContext`, ordered `Never < State < Alloc < All`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RecordContext {
    /// No stacks (`context=None`).
    #[default]
    Never,
    /// Stacks of allocations and segment allocations are gathered and kept
    /// with the live blocks (snapshot `frames`), not on trace entries
    /// (`context="state"`).
    State,
    /// As `State`, and trace entries carry the stack: allocation events
    /// their own, frees the allocation's (`context="alloc"`).
    Alloc,
    /// As `Alloc`, and frees and `empty_cache` gather a stack of their own
    /// (`context="all"`).
    All,
}

impl RecordContext {
    /// Parse PyTorch's `context` argument: `"state"`, `"alloc"`, `"all"`
    /// (`None` is [`RecordContext::Never`]).
    pub fn parse(s: &str) -> Option<RecordContext> {
        Some(match s {
            "state" => RecordContext::State,
            "alloc" => RecordContext::Alloc,
            "all" => RecordContext::All,
            _ => return None,
        })
    }
}

/// A stack gathered for an event (PyTorch's `GatheredContext`).
///
/// Cheap to clone (shared). A captured [`Backtrace`] is symbolized and
/// turned into [`Frame`]s only the first time [`Context::frames`] is called,
/// that is when a history or snapshot is read.
#[derive(Clone)]
pub struct Context(Arc<ContextInner>);

enum ContextInner {
    Frames(Arc<[Frame]>),
    Backtrace {
        trace: Backtrace,
        frames: OnceLock<Arc<[Frame]>>,
    },
}

impl Context {
    /// A context made of frames the caller already has (FFI, replay).
    pub fn from_frames(frames: Arc<[Frame]>) -> Context {
        Context(Arc::new(ContextInner::Frames(frames)))
    }

    /// Capture the calling thread's stack now; symbolized lazily.
    pub fn capture() -> Context {
        Context(Arc::new(ContextInner::Backtrace {
            trace: Backtrace::force_capture(),
            frames: OnceLock::new(),
        }))
    }

    /// The frames, innermost first. For a captured backtrace, each resolved
    /// symbol is one frame (`name`, `filename`, `line`; filename `"??"` and
    /// line 0 when unknown).
    pub fn frames(&self) -> Arc<[Frame]> {
        match &*self.0 {
            ContextInner::Frames(f) => f.clone(),
            ContextInner::Backtrace { trace, frames } => frames
                .get_or_init(|| parse_backtrace(&trace.to_string()))
                .clone(),
        }
    }

    /// True when both are the same captured context.
    pub fn ptr_eq(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            ContextInner::Frames(fr) => f.debug_tuple("Context").field(&fr.len()).finish(),
            ContextInner::Backtrace { .. } => f.write_str("Context(backtrace)"),
        }
    }
}

/// Turn `std`'s backtrace text (`  N: name` lines, each optionally followed
/// by `at file:line:col`) into frames.
fn parse_backtrace(text: &str) -> Arc<[Frame]> {
    let mut frames: Vec<Frame> = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(loc) = t.strip_prefix("at ") {
            if let Some(last) = frames.last_mut() {
                let mut parts = loc.rsplitn(3, ':');
                let _col = parts.next();
                let line_no = parts.next().and_then(|l| l.parse::<i64>().ok());
                match (line_no, parts.next()) {
                    (Some(l), Some(file)) => {
                        last.filename = file.to_string();
                        last.line = l;
                    }
                    _ => last.filename = loc.to_string(),
                }
            }
            continue;
        }
        if let Some((idx, name)) = t.split_once(": ") {
            if !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()) {
                frames.push(Frame {
                    name: name.to_string(),
                    filename: "??".to_string(),
                    line: 0,
                });
            }
        }
    }
    frames.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backtrace_text_is_parsed_into_frames() {
        let text = "   0: std::backtrace::Backtrace::force_capture\n             at /rustc/x/library/std/src/backtrace.rs:312:13\n   1: my_crate::f\n   2: main\n             at ./src/main.rs:7:5\n";
        let f = parse_backtrace(text);
        assert_eq!(f.len(), 3);
        assert_eq!(f[0].name, "std::backtrace::Backtrace::force_capture");
        assert_eq!(f[0].filename, "/rustc/x/library/std/src/backtrace.rs");
        assert_eq!(f[0].line, 312);
        assert_eq!(f[1].filename, "??");
        assert_eq!(f[2].line, 7);
    }

    #[test]
    fn captured_context_resolves_this_function() {
        let c = Context::capture();
        let frames = c.frames();
        assert!(!frames.is_empty());
        assert!(Arc::ptr_eq(&frames, &c.frames()), "resolved once");
    }

    #[test]
    fn ring_buffer_keeps_newest() {
        let mut r: RingBuffer<u32> = RingBuffer::new(2);
        for i in 0..5 {
            r.push(i);
        }
        assert_eq!(r.entries().copied().collect::<Vec<_>>(), vec![3, 4]);
        r.set_max_entries(1);
        assert_eq!(r.entries().copied().collect::<Vec<_>>(), vec![4]);
    }
}
