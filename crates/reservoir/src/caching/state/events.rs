//! The cross-stream events owner: per-stream event FIFOs, deferred frees and
//! stream uses recorded during captures. The algorithm over them (PyTorch's
//! `insert_events`, `process_events`, `synchronize_and_free_events`) is in
//! `events.rs`, which changes them only through the methods below.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::backend::{EventId, StreamId};
use crate::caching::stream_order::{C10Streams, StreamTable};
use crate::store::BlockId;

/// The events queued on one stream, oldest first, each with its block.
pub(crate) type EventQueue = VecDeque<(EventId, BlockId)>;

/// A stream's queue, by its position in PyTorch's `cuda_events` hash-map
/// order (an iterator of that map). Valid until the queues are next
/// changed other than through it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueAt(usize);

/// The cross-stream events of one device and the frees waiting for them.
pub(crate) struct Events {
    /// Per-stream FIFOs of (event, block) recorded at cross-stream frees,
    /// in PyTorch's `cuda_events` hash-map layout (see `stream_order`).
    /// Invariant: a block's `event_count` is the number of its entries; a
    /// block with entries is neither allocated nor in a pool; no queue is
    /// empty once a walk has moved past it ([`Events::next_queue`]).
    queues: StreamTable<EventQueue>,
    /// c10 stream ids, which order `queues` as PyTorch's hash map does.
    c10_streams: C10Streams,
    /// Cross-stream frees made while allocating to a pool, waiting for the
    /// end of all captures before their events are recorded, in the order
    /// of the frees. Invariant: their blocks are free, not in a pool, with
    /// no events yet.
    needs_events_deferred: Vec<BlockId>,
    /// Streams recorded on a block while a pool allocation was underway
    /// (PyTorch's `block_to_cudagraph_stream_uses`): a free deferred until the
    /// end of all captures does not wait for them. Keys are live blocks.
    capture_stream_uses: FxHashMap<BlockId, Vec<StreamId>>,
}

impl Events {
    /// No events, on device `device` (whose index seeds the c10 stream ids).
    pub fn new(device: i8) -> Events {
        Events {
            queues: StreamTable::new(),
            c10_streams: C10Streams::new(device),
            needs_events_deferred: Vec::new(),
            capture_stream_uses: FxHashMap::default(),
        }
    }

    /// No queued event and no deferred free: nothing for `process_events`
    /// to do (asked by every malloc).
    #[inline]
    pub fn is_idle(&self) -> bool {
        self.needs_events_deferred.is_empty() && self.queues.is_empty()
    }

    /// Some frees wait for the end of all captures.
    #[inline]
    pub fn has_deferred(&self) -> bool {
        !self.needs_events_deferred.is_empty()
    }

    /// The c10 stream ids, which order stream sets and the queues.
    #[inline]
    pub fn c10_streams(&self) -> &C10Streams {
        &self.c10_streams
    }

    /// Give `stream` the c10 id PyTorch would give it.
    pub fn set_c10_stream_id(&mut self, stream: StreamId, id: i64) {
        self.c10_streams.set_id(stream, id);
    }

    // -- Recording (`insert_events`) --------------------------------------

    /// Queue the events recorded for the free of block `id`, one per
    /// stream, and return how many, for the block store's `event_count`
    /// ([`BlockStore::await_events`](crate::store::BlockStore::await_events)).
    /// The capture-time stream uses of the block are done with.
    pub fn record(&mut self, id: BlockId, events: Vec<(StreamId, EventId)>) -> u32 {
        // PyTorch keeps the capture-time uses of a block freed outside a
        // capture keyed by its Block* until a later deferred free of that
        // pointer; forgetting them here only differs when a block is reused.
        self.capture_stream_uses.remove(&id);
        let n = events.len() as u32;
        for (s, event) in events {
            let hash = self.c10_streams.hash(s);
            self.queues
                .get_or_insert_with(s, hash, VecDeque::new)
                .push_back((event, id));
        }
        n
    }

    // -- Walking the queues (`process_events`, `synchronize_and_free_events`)

    /// The first stream's queue, in PyTorch's hash-map order.
    #[inline]
    pub fn first_queue(&self) -> Option<QueueAt> {
        self.queues.first().map(QueueAt)
    }

    /// The oldest event of the queue `at` (still queued).
    #[inline]
    pub fn front(&mut self, at: QueueAt) -> Option<(EventId, BlockId)> {
        self.queues.value_at(at.0).front().copied()
    }

    /// Take the oldest event of the queue `at` off it; the caller completes
    /// it (one less on its block's `event_count`).
    #[inline]
    pub fn pop_front(&mut self, at: QueueAt) -> Option<(EventId, BlockId)> {
        self.queues.value_at(at.0).pop_front()
    }

    /// Take every event of the queue `at`, to wait for them; what is still
    /// pending goes back with [`Events::restore_queue`] before
    /// [`Events::next_queue`].
    pub fn take_queue(&mut self, at: QueueAt) -> EventQueue {
        std::mem::take(self.queues.value_at(at.0))
    }

    /// Put back the events of the queue `at` still pending, in order.
    pub fn restore_queue(&mut self, at: QueueAt, keep: EventQueue) {
        *self.queues.value_at(at.0) = keep;
    }

    /// Move past the queue `at` to the next stream's: an emptied queue is
    /// erased (`it = cuda_events.erase(it)`), so that none is kept.
    #[inline]
    pub fn next_queue(&mut self, at: QueueAt) -> Option<QueueAt> {
        let next = if self.queues.value_at(at.0).is_empty() {
            self.queues.erase_at(at.0)
        } else {
            self.queues.next(at.0)
        };
        next.map(QueueAt)
    }

    // -- Deferred frees -----------------------------------------------------

    /// Defer the events of the free of block `id` (marked free, not in a
    /// pool) until the end of all captures.
    pub fn defer(&mut self, id: BlockId) {
        self.needs_events_deferred.push(id);
    }

    /// The deferred frees, in the order they happened; none stays deferred
    /// unless given back with [`Events::defer_again`].
    pub fn take_deferred(&mut self) -> Vec<BlockId> {
        std::mem::take(&mut self.needs_events_deferred)
    }

    /// Defer again, in order, the frees taken by [`Events::take_deferred`]
    /// whose events could not be recorded.
    pub fn defer_again(&mut self, ids: impl Iterator<Item = BlockId>) {
        debug_assert!(self.needs_events_deferred.is_empty());
        self.needs_events_deferred = ids.collect();
    }

    // -- Capture-time stream uses -------------------------------------------

    /// `record_stream(stream)` on block `id` while a pool allocation is
    /// underway (PyTorch's `block_to_cudagraph_stream_uses[block].insert`).
    pub fn note_capture_use(&mut self, id: BlockId, stream: StreamId) {
        let captured = self.capture_stream_uses.entry(id).or_default();
        if !captured.contains(&stream) {
            captured.push(stream);
        }
    }

    /// The capture-time stream uses of block `id`, which are forgotten.
    pub fn take_capture_uses(&mut self, id: BlockId) -> Option<Vec<StreamId>> {
        self.capture_stream_uses.remove(&id)
    }

    /// Forget the capture-time stream uses of block `id` (its stream uses
    /// are done with, or its slot is released). No hashing while none is
    /// kept (the common case, on every merge).
    #[inline]
    pub fn forget_capture_uses(&mut self, id: BlockId) {
        if !self.capture_stream_uses.is_empty() {
            self.capture_stream_uses.remove(&id);
        }
    }

    // -- Checks -------------------------------------------------------------

    /// The number of queued events of each block, for the invariant
    /// checker to compare with the blocks' `event_count`.
    pub fn queued_per_block(&self) -> std::collections::HashMap<BlockId, u32> {
        let mut pending = std::collections::HashMap::new();
        for queue in self.queues.values() {
            for &(_, id) in queue {
                *pending.entry(id).or_default() += 1;
            }
        }
        pending
    }

    /// The invariants that need no block: no empty queue is kept, and no
    /// block is deferred twice. `is_live` tells whether a block slot is
    /// live: deferred blocks and the keys of capture-time uses must be.
    pub fn check(&self, is_live: impl Fn(BlockId) -> bool) -> Result<(), String> {
        if let Some(s) = self
            .queues
            .keys()
            .zip(self.queues.values())
            .find_map(|(s, q)| q.is_empty().then_some(s))
        {
            return Err(format!("an empty event queue is kept for stream {}", s.0));
        }
        let mut seen = rustc_hash::FxHashSet::default();
        for &id in &self.needs_events_deferred {
            if !is_live(id) {
                return Err(format!("deferred free of block {id}, which is not live"));
            }
            if !seen.insert(id) {
                return Err(format!("block {id} is deferred twice"));
            }
        }
        if let Some(id) = self.capture_stream_uses.keys().find(|&&id| !is_live(id)) {
            return Err(format!(
                "capture-time stream uses kept for block {id}, which is not live"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(slot: u32) -> BlockId {
        BlockId::for_test(slot)
    }

    /// Recording counts the events on the block, and a walk that empties a
    /// queue erases it; an empty queue left behind is reported.
    #[test]
    fn record_counts_events_and_an_emptied_queue_is_erased() {
        let mut ev = Events::new(0);
        let count = ev.record(
            b(7),
            vec![(StreamId(1), EventId(10)), (StreamId(2), EventId(11))],
        );
        assert_eq!(count, 2);
        assert_eq!(ev.queued_per_block().get(&b(7)), Some(&2));
        let at = ev.first_queue().expect("a queue");
        let taken = ev.take_queue(at);
        assert_eq!(taken.len(), 1);
        ev.restore_queue(at, EventQueue::new());
        assert!(ev.check(|_| true).is_err(), "an empty queue is kept");
        let next = ev.next_queue(at).expect("the other stream's queue");
        assert!(ev.check(|_| true).is_ok());
        assert!(ev.pop_front(next).is_some());
        assert_eq!(ev.next_queue(next), None);
        assert!(ev.is_idle());
    }

    /// Deferred frees and capture-time uses must name live blocks, and a
    /// block is deferred once.
    #[test]
    fn deferred_and_captured_blocks_must_be_live() {
        let mut ev = Events::new(0);
        ev.defer(b(3));
        assert!(ev.has_deferred() && !ev.is_idle());
        assert!(ev.check(|id| id == b(3)).is_ok());
        assert!(ev.check(|_| false).is_err());
        ev.defer(b(3));
        assert!(ev.check(|_| true).is_err(), "deferred twice");
        assert_eq!(ev.take_deferred(), vec![b(3), b(3)]);
        ev.note_capture_use(b(5), StreamId(2));
        ev.note_capture_use(b(5), StreamId(2));
        assert!(ev.check(|id| id != b(5)).is_err());
        ev.forget_capture_uses(b(5));
        assert_eq!(ev.take_capture_uses(b(5)), None);
        assert!(ev.check(|_| false).is_ok());
        assert!(ev.is_idle());
    }
}
