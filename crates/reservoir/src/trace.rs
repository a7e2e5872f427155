//! Allocation history: PyTorch's trace entries (spec section 2.4) and the
//! ring buffer that keeps the most recent ones.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

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
    /// torch.compile region the entry was recorded in (PyTorch 2.6+ key
    /// `compile_context`), when recorded.
    pub compile_context: Option<String>,
    /// User metadata attached with `_set_memory_metadata` (2.7+ key
    /// `user_metadata`), when recorded.
    pub user_metadata: Option<String>,
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
            compile_context: None,
            user_metadata: None,
        }
    }
}

/// A bounded history: keeps the newest `max_entries` entries, oldest first.
#[derive(Clone, Debug)]
pub struct RingBuffer {
    entries: VecDeque<TraceEntry>,
    max_entries: usize,
}

impl RingBuffer {
    /// A buffer keeping at most `max_entries` (at least 1) entries.
    pub fn new(max_entries: usize) -> RingBuffer {
        RingBuffer {
            entries: VecDeque::new(),
            max_entries: max_entries.max(1),
        }
    }

    /// Append an entry, dropping the oldest when full.
    pub fn push(&mut self, e: TraceEntry) {
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(e);
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = &TraceEntry> {
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
