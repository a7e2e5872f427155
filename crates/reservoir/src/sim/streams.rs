//! Streams and events of the simulated device.
//!
//! The model is the fake CUDA driver's (`../shared/oracle/src/fakecudart.cpp`,
//! "streams, events and the asynchronous completion model"), kept to what the
//! allocator needs:
//!
//! * every stream numbers the operations enqueued on it: `submitted` is the
//!   last one enqueued, `done` the last one completed, `target` the last one
//!   allowed to complete. Operations complete in order;
//! * an event remembers `(stream, seq)`, the stream's `submitted` when it was
//!   recorded, and is complete once the stream's `done` reaches `seq`;
//! * only operations that matter are stored: waits on other streams' events.
//!   Other work is an implicit gap in the numbers;
//! * work completes as soon as it is enqueued, except on a *held* stream, where
//!   it stays pending until the stream is released, and on streams waiting for
//!   pending work of a held stream;
//! * a synchronisation (event or stream) completes the work it waits for, also
//!   on held streams (a CPU would wait), and counts a *forced sync* when it
//!   had to complete held work.
//!
//! Every stream is non-blocking (PyTorch creates its streams with
//! `cudaStreamNonBlocking`): the legacy default stream's implicit ordering
//! with blocking streams is not modelled.
//!
//! A later simulated clock only has to replace "complete when enqueued" by
//! "complete at a time" (the `target` of a stream moves with the clock), and a
//! race sanitizer stores work with byte ranges next to the waits.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::backend::{BackendError, EventId, StreamId};

/// What an event recorded on a held stream waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HoldSemantics {
    /// Every event recorded on a held stream stays pending until the stream
    /// is released (or the event synchronised), whether or not work was
    /// enqueued on the stream. Recording counts as enqueuing one operation.
    /// The default: it needs no explicit [`enqueue_work`](super::SimDevice::enqueue_work).
    #[default]
    AllEvents,
    /// The fake CUDA driver's rule: an event recorded on a held stream is
    /// pending only if work enqueued on the stream (with
    /// [`enqueue_work`](super::SimDevice::enqueue_work), the oracle's `k` op,
    /// or a wait on a pending event) has not completed. Use it to replay
    /// oracle traces faithfully.
    EnqueuedWork,
}

/// A wait of one stream on another stream's operation.
#[derive(Clone, Copy, Debug)]
struct Wait {
    /// The waiting operation's own number on the waiting stream.
    seq: u64,
    /// Index of the stream waited on.
    dep: usize,
    /// The operation of `dep` that must complete first.
    dep_seq: u64,
}

#[derive(Clone, Debug)]
struct Stream {
    id: StreamId,
    held: bool,
    submitted: u64,
    done: u64,
    target: u64,
    waits: VecDeque<Wait>,
}

impl Stream {
    fn new(id: StreamId) -> Self {
        Stream {
            id,
            held: false,
            submitted: 0,
            done: 0,
            target: 0,
            waits: VecDeque::new(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Event {
    stream: usize,
    seq: u64,
}

/// All streams and events of one simulated device.
#[derive(Clone, Debug)]
pub(crate) struct Streams {
    list: Vec<Stream>,
    by_id: FxHashMap<u64, usize>,
    next_stream: u64,
    held: usize,
    events: FxHashMap<u64, Event>,
    next_event: u64,
    semantics: HoldSemantics,
    pub(crate) streams_created: u64,
    pub(crate) events_created: u64,
    pub(crate) events_recorded: u64,
    pub(crate) forced_syncs: u64,
}

fn unknown_stream(s: StreamId) -> BackendError {
    BackendError::InvalidValue(format!(
        "unknown stream {s} on the sim device (streams come from create_stream; 0 is the \
         default stream)"
    ))
}

fn unknown_event(e: EventId) -> BackendError {
    BackendError::InvalidValue(format!("unknown event {} on the sim device", e.0))
}

impl Streams {
    pub(crate) fn new(semantics: HoldSemantics) -> Self {
        let mut s = Streams {
            list: Vec::new(),
            by_id: FxHashMap::default(),
            next_stream: 1,
            held: 0,
            events: FxHashMap::default(),
            next_event: 1,
            semantics,
            streams_created: 0,
            events_created: 0,
            events_recorded: 0,
            forced_syncs: 0,
        };
        s.add(StreamId::DEFAULT);
        s
    }

    fn add(&mut self, id: StreamId) -> usize {
        let i = self.list.len();
        self.list.push(Stream::new(id));
        self.by_id.insert(id.0, i);
        i
    }

    fn index(&self, s: StreamId) -> Result<usize, BackendError> {
        self.by_id
            .get(&s.0)
            .copied()
            .ok_or_else(|| unknown_stream(s))
    }

    fn event(&self, e: EventId) -> Result<Event, BackendError> {
        self.events
            .get(&e.0)
            .copied()
            .ok_or_else(|| unknown_event(e))
    }

    pub(crate) fn create(&mut self) -> StreamId {
        while self.by_id.contains_key(&self.next_stream) {
            self.next_stream += 1;
        }
        let id = StreamId(self.next_stream);
        self.next_stream += 1;
        self.add(id);
        self.streams_created += 1;
        id
    }

    /// Make `id` a known stream (idempotent).
    pub(crate) fn register(&mut self, id: StreamId) {
        if !self.by_id.contains_key(&id.0) {
            self.add(id);
            self.streams_created += 1;
        }
    }

    /// Streams known, the default stream included.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// `Ok` for a known stream, [`BackendError::InvalidValue`] naming it
    /// otherwise.
    pub(crate) fn check(&self, s: StreamId) -> Result<(), BackendError> {
        self.index(s).map(|_| ())
    }

    pub(crate) fn live_events(&self) -> usize {
        self.events.len()
    }

    pub(crate) fn held_streams(&self) -> usize {
        self.held
    }

    pub(crate) fn pending_ops(&self) -> u64 {
        self.list.iter().map(|s| s.submitted - s.done).sum()
    }

    /// Enqueue one operation on stream `i`.
    ///
    /// Invariant used for the fast path: when no stream is held, every
    /// operation has completed and no wait is stored.
    fn submit(&mut self, i: usize) {
        let no_holds = self.held == 0;
        let s = &mut self.list[i];
        s.submitted += 1;
        if !s.held {
            s.target = s.submitted;
        }
        if no_holds {
            s.done = s.submitted;
        }
    }

    /// Complete everything that can complete (nothing is pending without
    /// held streams).
    fn progress(&mut self) {
        if self.held > 0 {
            self.progress_all();
        }
    }

    /// Complete everything that can complete, without the fast path.
    fn progress_all(&mut self) {
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..self.list.len() {
                if !self.list[i].held {
                    self.list[i].target = self.list[i].submitted;
                }
                while self.list[i].done < self.list[i].target {
                    let target = self.list[i].target;
                    let Some(&w) = self.list[i].waits.front().filter(|w| w.seq <= target) else {
                        self.list[i].done = target;
                        changed = true;
                        break;
                    };
                    if w.seq - 1 > self.list[i].done {
                        self.list[i].done = w.seq - 1;
                        changed = true;
                    }
                    if self.list[w.dep].done < w.dep_seq {
                        break; // blocked on another stream
                    }
                    let s = &mut self.list[i];
                    s.waits.pop_front();
                    s.done = w.seq;
                    changed = true;
                }
            }
        }
    }

    /// Complete stream `i` up to `seq`, and what it waits for (a synchronise).
    fn force(&mut self, i: usize, seq: u64) {
        let seq = seq.min(self.list[i].submitted);
        if self.list[i].done >= seq {
            return;
        }
        if self.list[i].held {
            self.forced_syncs += 1;
        }
        if self.list[i].target < seq {
            self.list[i].target = seq;
        }
        loop {
            self.progress();
            if self.list[i].done >= seq {
                return;
            }
            // Blocked: the front must be a wait that is not satisfied yet.
            let Some(&w) = self.list[i].waits.front() else {
                debug_assert!(false, "stream blocked without a wait");
                return;
            };
            // Waits point at operations submitted before them: no cycles.
            self.force(w.dep, w.dep_seq);
        }
    }

    pub(crate) fn hold(&mut self, s: StreamId) -> Result<(), BackendError> {
        let i = self.index(s)?;
        if !self.list[i].held {
            self.list[i].held = true;
            self.held += 1;
        }
        Ok(())
    }

    pub(crate) fn release(&mut self, s: StreamId) -> Result<(), BackendError> {
        let i = self.index(s)?;
        if self.list[i].held {
            self.list[i].held = false;
            self.held -= 1;
        }
        self.list[i].target = self.list[i].submitted;
        self.progress_all();
        debug_assert!(self.held > 0 || self.pending_ops() == 0);
        Ok(())
    }

    pub(crate) fn is_held(&self, s: StreamId) -> Result<bool, BackendError> {
        Ok(self.list[self.index(s)?].held)
    }

    pub(crate) fn enqueue_work(&mut self, s: StreamId) -> Result<(), BackendError> {
        let i = self.index(s)?;
        self.submit(i);
        self.progress();
        Ok(())
    }

    pub(crate) fn pending(&mut self, s: StreamId) -> Result<u64, BackendError> {
        let i = self.index(s)?;
        self.progress();
        Ok(self.list[i].submitted - self.list[i].done)
    }

    pub(crate) fn record(&mut self, s: StreamId) -> Result<EventId, BackendError> {
        let i = self.index(s)?;
        if self.list[i].held && self.semantics == HoldSemantics::AllEvents {
            self.submit(i);
        }
        self.progress();
        let id = self.next_event;
        self.next_event += 1;
        self.events.insert(
            id,
            Event {
                stream: i,
                seq: self.list[i].submitted,
            },
        );
        self.events_created += 1;
        self.events_recorded += 1;
        Ok(EventId(id))
    }

    pub(crate) fn query(&mut self, e: EventId) -> Result<bool, BackendError> {
        let ev = self.event(e)?;
        self.progress();
        Ok(self.list[ev.stream].done >= ev.seq)
    }

    pub(crate) fn synchronize_event(&mut self, e: EventId) -> Result<(), BackendError> {
        let ev = self.event(e)?;
        self.force(ev.stream, ev.seq);
        Ok(())
    }

    pub(crate) fn destroy_event(&mut self, e: EventId) -> Result<(), BackendError> {
        self.events
            .remove(&e.0)
            .map(|_| ())
            .ok_or_else(|| unknown_event(e))
    }

    /// Make stream `s` wait for event `e` (`cudaStreamWaitEvent`).
    pub(crate) fn wait_event(&mut self, s: StreamId, e: EventId) -> Result<(), BackendError> {
        let i = self.index(s)?;
        let ev = self.event(e)?;
        self.progress();
        if ev.stream != i && self.list[ev.stream].done < ev.seq {
            self.submit(i);
            let seq = self.list[i].submitted;
            self.list[i].waits.push_back(Wait {
                seq,
                dep: ev.stream,
                dep_seq: ev.seq,
            });
            self.progress();
        }
        Ok(())
    }

    pub(crate) fn synchronize_stream(&mut self, s: StreamId) -> Result<(), BackendError> {
        let i = self.index(s)?;
        let seq = self.list[i].submitted;
        self.force(i, seq);
        Ok(())
    }

    pub(crate) fn synchronize_all(&mut self) {
        for i in 0..self.list.len() {
            let seq = self.list[i].submitted;
            self.force(i, seq);
        }
    }

    /// Stream ids in creation order (default stream first).
    pub(crate) fn ids(&self) -> Vec<StreamId> {
        self.list.iter().map(|s| s.id).collect()
    }
}
