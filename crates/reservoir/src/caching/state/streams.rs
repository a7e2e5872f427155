//! The streams owner: the streams a backend confirmed (so that only a
//! stream's first use asks it) and the blocks borrowed across streams by
//! the Reservoir-only cross-stream reuse policy. Neither is PyTorch state:
//! PyTorch trusts every stream it is handed (they come from `c10::Stream`)
//! and never lends a block to another stream.

use crate::backend::{Backend, StreamId};
use crate::error::AllocError;

/// The streams of one device.
///
/// Invariant: `set` and `last` hold only streams the backend confirmed
/// while its [`Backend::stream_epoch`] was `epoch`; a new epoch empties
/// them before anything is looked up. `cross_stream_reuses` only grows.
#[derive(Default)]
pub(crate) struct Streams {
    /// The backend's stream epoch the confirmations below belong to.
    epoch: u64,
    /// The last stream confirmed (the common case: one side stream in a row).
    last: Option<u64>,
    /// The non-default streams confirmed.
    set: rustc_hash::FxHashSet<u64>,
    /// Blocks borrowed from another stream's pool (see `policy.rs`); 0 in
    /// PyTorch mode.
    cross_stream_reuses: u64,
}

impl Streams {
    /// Refuse a stream the backend does not know, before anything changes:
    /// [`AllocError::UnknownStream`] naming it. The default stream is always
    /// known.
    #[inline]
    pub fn check<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        if stream == StreamId::DEFAULT {
            return Ok(());
        }
        if self.last == Some(stream.0) && self.epoch == backend.stream_epoch() {
            return Ok(());
        }
        self.check_slow(backend, stream)
    }

    #[inline(never)]
    fn check_slow<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let epoch = backend.stream_epoch();
        if self.epoch != epoch {
            self.set.clear();
            self.last = None;
            self.epoch = epoch;
        }
        if !self.set.contains(&stream.0) {
            backend
                .check_stream(stream)
                .map_err(|e| AllocError::from_stream_check(stream, e))?;
            // Re-read: `check_stream` may have run while another stream was
            // forgotten.
            if backend.stream_epoch() == epoch {
                self.set.insert(stream.0);
            }
        }
        self.last = Some(stream.0);
        Ok(())
    }

    /// A block was handed to a stream from another stream's cache.
    #[inline]
    pub fn note_cross_stream_reuse(&mut self) {
        self.cross_stream_reuses += 1;
    }

    /// Blocks handed to a stream from another stream's cache so far.
    pub fn cross_stream_reuses(&self) -> u64 {
        self.cross_stream_reuses
    }
}
