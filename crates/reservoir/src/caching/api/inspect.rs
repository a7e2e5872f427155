//! [`CachingAllocator`]'s snapshot, segments and invariant check.

use super::super::{CachingAllocator, InvariantViolation, StreamSegmentSize};
use crate::backend::{Backend, DevicePtr};
use crate::error::AllocError;
use crate::ids::MempoolId;
use crate::observe::snapshot::{Segment, Snapshot};

/// Looking inside: the memory snapshot (`torch.cuda.memory._snapshot()`),
/// the segments and their blocks, a pointer's segment, expandable segment
/// sizes, and the invariant check.
impl<B: Backend> CachingAllocator<B> {
    /// A snapshot of the allocator, as `torch.cuda.memory._snapshot()`
    /// returns it (spec 2.2 to 2.5): every segment (one per mapped run of
    /// an expandable segment) with its blocks and stacks, the history, and
    /// the settings. With `Some(pool)` only that pool's segments are listed
    /// (torch's `snapshot(mempool_id)`); the history is the device's whole
    /// history. Each call then appends a `snapshot` entry (size = active
    /// bytes listed) to the history, so it shows in the next snapshot.
    pub fn snapshot(&self, mempool: Option<MempoolId>) -> Snapshot {
        self.snapshot_with(mempool, true)
    }

    /// [`snapshot`](Self::snapshot), with `include_traces = false` leaving
    /// `device_traces` empty (torch's `MemPool.snapshot(include_traces)`).
    pub fn snapshot_with(&self, mempool: Option<MempoolId>, include_traces: bool) -> Snapshot {
        self.state.lock().snapshot(mempool, include_traces)
    }

    /// The segments and their blocks, in address order, as a snapshot
    /// reports them (without recording a snapshot in the history).
    pub fn segments(&self) -> Vec<Segment> {
        self.state.lock().segment_models(None)
    }

    /// Bytes mapped in each expandable segment, with its stream and pool
    /// kind, in creation order (PyTorch's `getExpandableSegmentSizes`).
    /// As in PyTorch, segments of the default stream (0) are not listed.
    pub fn expandable_segment_sizes(&self) -> Vec<StreamSegmentSize> {
        self.state.lock().expandable_segment_sizes()
    }

    /// Whether `ptr` is a live block this allocator handed out (the start
    /// of an allocation not yet freed), in any segment kind: plain,
    /// expandable or a private pool's. The owner lookup of entry points that
    /// serve several allocators (the C ABI's `record_stream`).
    pub fn is_allocated(&self, ptr: DevicePtr) -> bool {
        self.state.lock().allocated.get(&ptr.0).is_some()
    }

    /// The segment an allocated pointer lives in: its base address and total
    /// size (PyTorch's `getBaseAllocation`). Under expandable segments this
    /// is [`AllocError::InvalidState`] with PyTorch's message (such blocks
    /// cannot be shared between processes).
    pub fn base_allocation(&self, ptr: DevicePtr) -> Result<(DevicePtr, u64), AllocError> {
        let state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        let (base, size) = state.base_allocation(id)?;
        Ok((DevicePtr(base), size))
    }

    /// Check every internal invariant: blocks tile their segments, free lists
    /// hold exactly the free blocks, the pointer map holds exactly the
    /// allocated blocks, and every statistic equals a recount.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.state.lock().check_invariants()
    }
}
