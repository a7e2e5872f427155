//! The cross-stream events owner: per-stream event FIFOs, deferred frees and
//! stream uses recorded during captures. The algorithm over them (PyTorch's
//! `insert_events`, `process_events`) is in `events.rs`.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::backend::{EventId, StreamId};
use crate::caching::stream_order::{C10Streams, StreamTable};
use crate::store::BlockId;

/// The cross-stream events of one device and the frees waiting for them.
pub(crate) struct Events {
    /// Per-stream FIFOs of (event, block) recorded at cross-stream frees,
    /// in PyTorch's `cuda_events` hash-map layout (see `stream_order`).
    /// Invariant: a block's `event_count` is the number of its entries; a
    /// block with entries is neither allocated nor in a pool; no queue is
    /// empty.
    pub queues: StreamTable<VecDeque<(EventId, BlockId)>>,
    /// c10 stream ids, which order `queues` as PyTorch's hash map does.
    pub c10_streams: C10Streams,
    /// Cross-stream frees made while allocating to a pool, waiting for the
    /// end of all captures before their events are recorded. Invariant:
    /// their blocks are free, not in a pool, with no events yet.
    pub needs_events_deferred: Vec<BlockId>,
    /// Streams recorded on a block while a pool allocation was underway
    /// (PyTorch's `block_to_cudagraph_stream_uses`): a free deferred until the
    /// end of all captures does not wait for them. Keys are live blocks.
    pub capture_stream_uses: FxHashMap<BlockId, Vec<StreamId>>,
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
}
