//! Reservoir's own policies: knobs PyTorch does not have. They live beside
//! PyTorch's settings (in [`AllocatorConfig::policy`](super::AllocatorConfig::policy)),
//! never in a settings string, and their defaults leave the allocator
//! PyTorch-exact.

/// Reservoir-only policies, all off by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReservoirPolicy {
    /// When a stream's pool has no fitting free block, take one cached on
    /// another stream, making the allocating stream wait on an event
    /// recorded on the block's stream (as RMM does) instead of asking the
    /// driver for more memory. The block keeps its segment's stream and
    /// records the allocating stream as a user, so it returns to its own
    /// stream's pool only after the borrower's work.
    /// Needs [`Backend::stream_wait_event`](crate::backend::Backend::stream_wait_event);
    /// on backends without it the policy does nothing.
    pub cross_stream_reuse: bool,
}
