//! Cross-stream reuse: a Reservoir-only policy ([`ReservoirPolicy::CrossStreamReuse`](crate::config::ReservoirPolicy::CrossStreamReuse)),
//! off in PyTorch mode.
//!
//! PyTorch keys free blocks by stream: a block freed on stream A serves only
//! stream A, so a program that frees on one stream and allocates on another
//! strands memory and grows the cache. RMM's pool resource instead lets a
//! stream take a block cached for another stream after making the taking
//! stream wait on an event recorded on the block's stream. This module does
//! the same, when the requesting stream's own pool has nothing that fits
//! (after the free-memory callbacks, before garbage collection and the
//! driver):
//!
//! 1. best fit over the other streams' free blocks of the same pool, with
//!    the same oversize rules as PyTorch's search (spec 1.6); blocks of
//!    expandable segments are left alone;
//! 2. an event is recorded on the block's stream and the requesting stream
//!    waits for it ([`Backend::stream_wait_event`]): whatever the block's
//!    stream enqueued on those bytes is ordered before the borrower's work;
//! 3. a block that is a whole segment moves to the requesting stream with
//!    its segment (RMM moves blocks between streams' free lists the same
//!    way): after the wait, nothing earlier can touch it, and later frees on
//!    the new stream make it reusable at once, as in PyTorch;
//! 4. a piece of a split segment cannot move alone (every block of a segment
//!    has the segment's stream, and free neighbours merge): it is handed out
//!    *on its own stream* and the requesting stream is recorded as a user
//!    (`record_stream`), so at free time an event is recorded on the borrower
//!    and the bytes return to their stream's pool only after the borrower's
//!    work.
//!
//! A backend without `stream_wait_event` answers
//! [`BackendError::Unsupported`]; the block then goes back to its pool and
//! the policy does nothing.
#![forbid(unsafe_code)]

use crate::backend::{Backend, BackendError, StreamId};
use crate::caching::rules;
use crate::caching::state::pools::FreeKey;
use crate::caching::state::DeviceState;
use crate::store::{BlockId, PoolId};

impl DeviceState {
    /// Take the best-fitting free block of `pool` cached on a stream other
    /// than `stream`, ordered after its stream's work. `None` if there is
    /// none or the backend cannot order streams.
    pub(crate) fn take_from_other_stream<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        pool: PoolId,
        size: u64,
        stream: StreamId,
    ) -> Result<Option<BlockId>, BackendError> {
        let Some(key) = self.best_fit_on_other_streams(pool, size, stream) else {
            return Ok(None);
        };
        let owner = key.stream;
        let event = backend.record_event(owner)?;
        let waited = backend.stream_wait_event(stream, event);
        // The wait holds what it needs; the event itself is not kept.
        let _ = backend.destroy_event(event);
        match waited {
            Ok(()) => {}
            Err(BackendError::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
        self.pools[pool.index()].remove(&key);
        self.streams.note_cross_stream_reuse();
        let b = self.store.block(key.id);
        if b.prev().is_none() && b.next().is_none() {
            // A whole free segment moves to the borrowing stream for good:
            // every earlier use of it is ordered before the wait above.
            let seg = b.segment();
            self.store.move_to_stream(seg, stream);
        }
        Ok(Some(key.id))
    }

    /// The smallest block of `pool` that fits `size`, over every stream but
    /// `stream`, ties broken by the pool's (stream, size, address) order.
    fn best_fit_on_other_streams(
        &self,
        pool: PoolId,
        size: u64,
        stream: StreamId,
    ) -> Option<FreeKey> {
        let blocks = &self.pools[pool.index()];
        let mut best: Option<FreeKey> = None;
        let mut next = blocks.iter().next().map(|k| k.stream);
        while let Some(s) = next {
            if s != stream {
                let hit = blocks
                    .from(&FreeKey::search(s, size))
                    .take_while(|k| k.stream == s)
                    .find(|k| !self.store.block(k.id).expandable());
                if let Some(k) = hit {
                    if !rules::oversize_misfit(size, k.size, &self.config)
                        && best.map_or(true, |b| k.size < b.size)
                    {
                        best = Some(k);
                    }
                }
            }
            next = match s.0.checked_add(1) {
                Some(n) => blocks
                    .from(&FreeKey::search(StreamId(n), 0))
                    .next()
                    .map(|k| k.stream),
                None => None,
            };
        }
        best
    }
}
