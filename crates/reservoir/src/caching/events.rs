//! Cross-stream events (spec 1.10): PyTorch's `insert_events`,
//! `process_events` and `synchronize_and_free_events`, over per-stream event
//! FIFOs kept in the order of PyTorch's `cuda_events` hash map (see
//! `stream_order`).

use super::release::keep_first;
use super::state::events::EventQueue;
use super::state::DeviceState;
use super::stream_order::stream_set_order;
use crate::backend::{Backend, BackendError, EventId, StreamId};
use crate::ids::MempoolId;
use crate::store::BlockId;

impl DeviceState {
    /// spec 1.10: record the events of frees deferred during pool allocation.
    pub(super) fn insert_events_deferred_until_no_capture<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), BackendError> {
        // In the order the frees happened, as PyTorch walks its vector.
        let mut deferred = self.events.take_deferred().into_iter();
        while let Some(id) = deferred.next() {
            // `remove_cudagraph_stream_uses`: work recorded during a capture
            // is captured, not run, so the streams recorded then are dropped
            // (the set is rebuilt by inserting the rest in its old order).
            if let Some(captured) = self.events.take_capture_uses(id) {
                let uses = self.store.take_uses(id);
                let kept = stream_set_order(&uses, self.events.c10_streams())
                    .into_iter()
                    .filter(|s| !captured.contains(s))
                    .collect();
                self.store.restore_uses(id, kept);
            }
            if let Err(e) = self.insert_events(backend, id) {
                // Nothing recorded for this block: it and the rest wait for
                // the next call.
                self.events.defer_again(std::iter::once(id).chain(deferred));
                return Err(e);
            }
            if self.store.block(id).event_count() == 0 {
                self.free_block(id);
            }
        }
        Ok(())
    }

    /// spec 1.10: record an event on every stream that used the block, and
    /// queue them. On a failure nothing changes (see
    /// [`record_block_events`](Self::record_block_events)).
    pub(super) fn insert_events<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        id: BlockId,
    ) -> Result<(), BackendError> {
        let events = self.record_block_events(backend, id)?;
        self.queue_block_events(id, events);
        Ok(())
    }

    /// The first half of `insert_events`: record an event on every stream
    /// that used the block, in PyTorch's order (`stream_uses` is a
    /// ska::flat_hash_set). Changes nothing in the allocator: if one
    /// cannot be recorded, the events already recorded are given back and
    /// the error returned, so that the caller can leave the block as it was
    /// (a failed free frees nothing).
    pub(super) fn record_block_events<B: Backend + ?Sized>(
        &self,
        backend: &B,
        id: BlockId,
    ) -> Result<Vec<(StreamId, EventId)>, BackendError> {
        let order = stream_set_order(
            self.store.block(id).stream_uses(),
            self.events.c10_streams(),
        );
        let mut events = Vec::with_capacity(order.len());
        for s in order {
            match backend.record_event(s) {
                Ok(event) => events.push((s, event)),
                Err(e) => {
                    for (_, event) in events {
                        // Never waited for: giving it back cannot matter.
                        let _ = backend.destroy_event(event);
                    }
                    return Err(e);
                }
            }
        }
        Ok(events)
    }

    /// The second half of `insert_events`: the block's stream uses become
    /// the recorded `events`, queued per stream. Cannot fail.
    pub(super) fn queue_block_events(&mut self, id: BlockId, events: Vec<(StreamId, EventId)>) {
        self.store.forget_uses(id);
        let n = self.events.record(id, events);
        self.store.await_events(id, n);
    }

    /// spec 1.10: reap completed cross-stream events, per stream, stopping at
    /// the first pending event of each stream. Streams are walked in the slot
    /// order of PyTorch's `cuda_events` hash map, and a stream's entry is
    /// erased once its queue is empty (`it = cuda_events.erase(it)`).
    ///
    /// Called by every malloc: with no deferred and no outstanding events
    /// (every trace without `record_stream`) it is two length checks, inlined
    /// into the caller; the walk is out of line.
    #[inline]
    pub fn process_events<B: Backend + ?Sized>(&mut self, backend: &B) -> Result<(), BackendError> {
        if self.events.is_idle() {
            return Ok(());
        }
        self.process_pending_events(backend)
    }

    /// [`process_events`](Self::process_events) when there is something to do.
    #[inline(never)]
    fn process_pending_events<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
    ) -> Result<(), BackendError> {
        if self.events.has_deferred() {
            self.insert_events_deferred_until_no_capture(backend)?;
        }
        let mut cur = self.events.first_queue();
        while let Some(at) = cur {
            while let Some((event, id)) = self.events.front(at) {
                if !backend.query_event(event)? {
                    break;
                }
                self.events.pop_front(at);
                // The event has completed; giving it back cannot change the outcome.
                let _ = backend.destroy_event(event);
                self.complete_event(id);
            }
            cur = self.events.next_queue(at);
        }
        Ok(())
    }

    #[inline]
    pub(super) fn complete_event(&mut self, id: BlockId) {
        if self.store.event_done(id) == 0 {
            self.free_block(id);
        }
    }

    /// spec 1.9: wait for every outstanding event and free their blocks.
    /// With `only`, just the events of that private pool's blocks.
    pub(super) fn synchronize_and_free_events<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        only: Option<MempoolId>,
    ) -> Result<(), BackendError> {
        self.acct.sync_all_streams();
        // A deferred free whose events cannot be recorded stays deferred;
        // the events already queued are still waited for.
        let mut result = self.insert_events_deferred_until_no_capture(backend);
        let mut cur = self.events.first_queue();
        while let Some(at) = cur {
            let queue = self.events.take_queue(at);
            let mut keep = EventQueue::new();
            for (event, id) in queue {
                if only.is_some() && self.owner(self.store.block(id).pool()) != only {
                    keep.push_back((event, id));
                    continue;
                }
                if let Err(e) = backend.synchronize_event(event) {
                    // The stream's work may still use the block: it keeps
                    // waiting (for the next call). Go on with the others and
                    // report the first error.
                    keep_first(&mut result, Err(e));
                    keep.push_back((event, id));
                    continue;
                }
                let _ = backend.destroy_event(event);
                self.complete_event(id);
            }
            self.events.restore_queue(at, keep);
            cur = self.events.next_queue(at);
        }
        result
    }
}
