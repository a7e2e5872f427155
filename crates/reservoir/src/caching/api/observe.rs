//! [`CachingAllocator`]'s history, callbacks and debug output.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::super::{
    level_u8, CachingAllocator, FreeMemoryCallback, HistoryConfig, OomObserver, TraceTracker,
};
use crate::backend::Backend;
use crate::observe::callbacks::CallbackRegistry;
use crate::observe::debug::DebugVerbosity;
use crate::observe::trace::TraceEntry;

/// Observing the allocator as it runs: the allocation history
/// (`_record_memory_history`), trace trackers, named callbacks,
/// out-of-memory observers, free-memory callbacks and debug output.
impl<B: Backend> CachingAllocator<B> {
    /// Keep the newest `max_entries` history entries, without stacks, or
    /// with `None` stop recording (as
    /// [`HeapAllocator::record_history`](crate::heap::HeapAllocator::record_history);
    /// [`record_memory_history`](Self::record_memory_history) sets every option).
    pub fn record_history(&self, max_entries: Option<usize>) {
        self.record_memory_history(match max_entries {
            Some(max_entries) => HistoryConfig::events_only(max_entries),
            None => HistoryConfig::off(),
        });
    }

    /// Configure history recording, as PyTorch's
    /// `torch.cuda.memory._record_memory_history(enabled, context, stacks,
    /// max_entries, clear_history)`: `enabled` off clears the history;
    /// `State` keeps a single entry; `context` decides which events gather
    /// a stack (see [`RecordContext`](crate::observe::trace::RecordContext)). Stacks already kept by live blocks
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

    /// Register a callback run when the cache has no block for a request,
    /// before the driver is asked. See [`FreeMemoryCallback`].
    pub fn add_free_memory_callback(&self, callback: FreeMemoryCallback) {
        self.state.lock().obs.add_free_memory_callback(callback);
    }

    /// Register an observer called (outside the lock) on every out-of-memory error.
    pub fn attach_oom_observer(&self, observer: OomObserver) {
        self.state.lock().obs.add_oom_observer(observer);
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
}
