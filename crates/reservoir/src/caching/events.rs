//! Cross-stream events (spec 1.10): PyTorch's `insert_events`,
//! `process_events` and `synchronize_and_free_events`, over per-stream event
//! FIFOs kept in the order of PyTorch's `cuda_events` hash map (see
//! `stream_order`).

use std::collections::VecDeque;

use super::release::keep_first;
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
        let mut deferred = std::mem::take(&mut self.events.needs_events_deferred).into_iter();
        while let Some(id) = deferred.next() {
            // `remove_cudagraph_stream_uses`: work recorded during a capture
            // is captured, not run, so the streams recorded then are dropped
            // (the set is rebuilt by inserting the rest in its old order).
            if let Some(captured) = self.events.capture_stream_uses.remove(&id) {
                let uses = std::mem::take(&mut self.store.blocks[id].stream_uses);
                self.store.blocks[id].stream_uses =
                    stream_set_order(&uses, &self.events.c10_streams)
                        .into_iter()
                        .filter(|s| !captured.contains(s))
                        .collect();
            }
            if let Err(e) = self.insert_events(backend, id) {
                // Nothing recorded for this block: it and the rest wait for
                // the next call.
                self.events.needs_events_deferred = std::iter::once(id).chain(deferred).collect();
                return Err(e);
            }
            if self.store.blocks[id].event_count == 0 {
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
        let order = stream_set_order(&self.store.blocks[id].stream_uses, &self.events.c10_streams);
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
        self.store.blocks[id].stream_uses.clear();
        // PyTorch keeps the capture-time uses of a block freed outside a
        // capture keyed by its Block* until a later deferred free of that
        // pointer; forgetting them here only differs when a block is reused.
        self.events.capture_stream_uses.remove(&id);
        self.store.blocks[id].event_count += events.len() as u32;
        for (s, event) in events {
            let hash = self.events.c10_streams.hash(s);
            self.events
                .queues
                .get_or_insert_with(s, hash, VecDeque::new)
                .push_back((event, id));
        }
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
        if self.events.needs_events_deferred.is_empty() && self.events.queues.is_empty() {
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
        if !self.events.needs_events_deferred.is_empty() {
            self.insert_events_deferred_until_no_capture(backend)?;
        }
        let mut cur = self.events.queues.first();
        while let Some(pos) = cur {
            while let Some(&(event, id)) = self.events.queues.value_at(pos).front() {
                if !backend.query_event(event)? {
                    break;
                }
                self.events.queues.value_at(pos).pop_front();
                // The event has completed; giving it back cannot change the outcome.
                let _ = backend.destroy_event(event);
                self.complete_event(id);
            }
            cur = if self.events.queues.value_at(pos).is_empty() {
                self.events.queues.erase_at(pos)
            } else {
                self.events.queues.next(pos)
            };
        }
        Ok(())
    }

    #[inline]
    pub(super) fn complete_event(&mut self, id: BlockId) {
        let b = &mut self.store.blocks[id];
        b.event_count -= 1;
        if b.event_count == 0 {
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
        let mut cur = self.events.queues.first();
        while let Some(pos) = cur {
            let queue = std::mem::take(self.events.queues.value_at(pos));
            let mut keep = VecDeque::new();
            for (event, id) in queue {
                if only.is_some() && self.owner(self.store.blocks[id].pool) != only {
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
            let empty = keep.is_empty();
            *self.events.queues.value_at(pos) = keep;
            cur = if empty {
                self.events.queues.erase_at(pos)
            } else {
                self.events.queues.next(pos)
            };
        }
        result
    }
}
