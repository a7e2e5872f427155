//! What the allocator's face (`heap/mod.rs`) reads of the [`State`] and the
//! named events it changes it by: settings, totals and statistics, the
//! buffer at an address and its record, the events recorded for a
//! buffer's work, and the history. Every other change goes through the
//! allocation path (`mod.rs`) and the release paths (`release.rs`).

use super::{BufState, State};
use crate::backend::{DevicePtr, EventId};
use crate::heap::types::PoolKind;
use crate::observe::debug::DebugVerbosity;
use crate::observe::trace::{RingBuffer, TraceEntry};
use crate::stats::DeviceStats;
use crate::store::BlockId;

impl State {
    // -- Settings and limits ----------------------------------------------

    /// The debug output levels.
    pub fn debug(&self) -> DebugVerbosity {
        self.debug
    }

    /// Set the debug output levels.
    pub fn set_debug(&mut self, v: DebugVerbosity) {
        self.debug = v;
    }

    /// Fire every callback event, not only `AllocationFailed` (the Reservoir
    /// extension).
    pub fn set_all_callback_events(&mut self, on: bool) {
        self.all_callback_events = on;
    }

    /// The device has unified memory.
    pub fn unified(&self) -> bool {
        self.unified
    }

    /// The recommended max memory (`recommendedMaxWorkingSetSize`).
    pub fn max_device_size(&self) -> u64 {
        self.max_device_size
    }

    /// The max buffer length: a request of at least this is refused.
    pub fn max_buffer_size(&self) -> u64 {
        self.max_buffer_size
    }

    /// The high and low watermark ratios.
    pub fn ratios(&self) -> (f64, f64) {
        (self.high_ratio, self.low_ratio)
    }

    /// `m_max_total_allowed_size` (`u64::MAX` when unlimited).
    pub fn max_total_allowed(&self) -> u64 {
        self.max_total_allowed
    }

    /// `m_low_watermark_limit` (`u64::MAX` when disabled).
    pub fn low_limit(&self) -> u64 {
        self.low_limit
    }

    // -- Totals and statistics --------------------------------------------

    /// `m_total_allocated_memory`: bytes of attached heaps.
    pub fn total_allocated(&self) -> u64 {
        self.total_allocated
    }

    /// `m_current_allocated_memory`: bytes of buffers in use or pending free.
    pub fn current_allocated(&self) -> u64 {
        self.current_allocated
    }

    /// The bytes of `pool`'s available buffers.
    pub fn pool_available_size(&self, pool: PoolKind) -> u64 {
        self.pools[pool.index()].available_size
    }

    /// The statistics.
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// A request retried after releasing the cache.
    pub fn count_alloc_retry(&mut self) {
        self.stats.num_alloc_retries += 1;
    }

    /// A request that failed for want of memory.
    pub fn count_oom(&mut self) {
        self.stats.num_ooms += 1;
    }

    /// A wait for the device (`COMMIT_AND_WAIT`).
    pub fn count_sync_all_streams(&mut self) {
        self.stats.num_sync_all_streams += 1;
    }

    /// Zero lifetime totals and event counters.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Reset every peak to its current value.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    // -- Buffers ------------------------------------------------------------

    /// The buffer at `ptr` (in use, available or pending free; not a zombie).
    pub fn buffer_at(&self, ptr: DevicePtr) -> Option<BlockId> {
        self.ptrs.get(&ptr.0).copied()
    }

    /// Where buffer `b` is in its life.
    pub fn buffer_state(&self, b: BlockId) -> BufState {
        self.bufs[&b].state
    }

    /// The size buffer `b` was last asked for.
    pub fn requested(&self, b: BlockId) -> u64 {
        self.bufs[&b].requested
    }

    /// Buffer `b`'s number (`buf_id`).
    pub fn buffer_id(&self, b: BlockId) -> u64 {
        self.bufs[&b].id
    }

    /// The shape set on buffer `b` (empty when none).
    pub fn shape(&self, b: BlockId) -> &[i64] {
        &self.bufs[&b].shape
    }

    /// Set buffer `b`'s shape (`setBufferShape`); cleared when it is freed.
    pub fn set_shape(&mut self, b: BlockId, shape: Vec<i64>) {
        self.bufs.get_mut(&b).expect("a buffer").shape = shape;
    }

    /// Buffer `b`'s `MPSEvent`, if one was recorded.
    pub fn buffer_event(&self, b: BlockId) -> Option<EventId> {
        self.bufs[&b].event
    }

    /// Work recorded on buffer `b`: `used` completes with the work; the
    /// buffer keeps it until then (its retain count).
    pub fn record_use(&mut self, b: BlockId, used: EventId) {
        self.bufs.get_mut(&b).expect("a buffer").events.push(used);
    }

    /// `recordEvents` on shared buffer `b`: the work (`used`) and the
    /// buffer's new `MPSEvent`; the event it replaces is handed back, to be
    /// destroyed.
    pub fn record_buffer_event(
        &mut self,
        b: BlockId,
        used: EventId,
        event: EventId,
    ) -> Option<EventId> {
        let buf = self.bufs.get_mut(&b).expect("a buffer");
        buf.events.push(used);
        buf.event.replace(event)
    }

    // -- History ------------------------------------------------------------

    /// Record the allocation history, at most `max_entries` (kept entries
    /// stay), or stop and drop it (`None`).
    pub fn set_history(&mut self, max_entries: Option<usize>) {
        match (max_entries, self.history.as_mut()) {
            (None, _) => self.history = None,
            (Some(n), Some(h)) => h.set_max_entries(n),
            (Some(n), None) => self.history = Some(RingBuffer::new(n)),
        }
    }

    /// The history recorded, oldest first, when recording.
    pub fn history_entries(&self) -> Option<Vec<TraceEntry>> {
        (self.history.as_ref()).map(|h| h.entries().cloned().collect())
    }
}
