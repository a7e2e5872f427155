//! Memory history, trace trackers, allocator callbacks and debug output:
//! everything the allocator reports as it works (PyTorch's
//! `_record_memory_history`, `attachAllocatorTraceTracker`, the MPS
//! callback registry and `PYTORCH_DEBUG_MPS_ALLOCATOR`).
//!
//! Every place where PyTorch calls `record_trace` calls
//! [`DeviceState::record_trace`], which costs one branch while nothing
//! observes the allocator; the work is in [`DeviceState::observe_slow`].
//!
//! Contexts follow PyTorch's `RecordContext`:
//! * `malloc` gathers a stack at level `State` or above; the allocated
//!   block keeps it (snapshot `frames`), and so does a segment created for
//!   it (segment `frames`, on the segment's first block).
//! * `free` and `empty_cache` gather one only at level `All`; otherwise a
//!   free's entries reuse the allocation's stack and a segment release the
//!   segment's.
//! * Trace entries carry the stack only at level `Alloc` or above.
//! * A block handed back to the cache (`free_completed`) drops its stack.

use super::state::observe::{Recorded, SegmentContext};
use super::state::DeviceState;
use crate::backend::{DevicePtr, StreamId};
use crate::format::format_size;
use crate::observe::callbacks::{AllocatorEvent, EventType};
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::trace::{Context, TraceAction};
use crate::store::{BlockId, PoolId};
impl DeviceState {
    /// Allocation stacks are held only by live active blocks, and the slow
    /// path is on while any exists (so freeing drops the stack).
    pub(crate) fn check_contexts(&self) -> Result<(), super::InvariantViolation> {
        for id in self.obs.blocks_with_context() {
            let b = self.store.block(id);
            if !b.live() || !(b.allocated() || b.event_count() > 0 || !b.stream_uses().is_empty()) {
                return Err(super::InvariantViolation(format!(
                    "free block {id} at {:#x} still holds an allocation stack",
                    b.addr()
                )));
            }
        }
        let holding = self.obs.blocks_with_context().count();
        if holding > 0 && !self.obs.is_active() {
            return Err(super::InvariantViolation(format!(
                "{holding} blocks hold a stack but the observing slow path is off"
            )));
        }
        Ok(())
    }

    /// The segment stack recorded for `block`, if still its own.
    pub(crate) fn segment_context(&self, block: BlockId) -> Option<&Context> {
        let c = self.obs.segment_context(block)?;
        let b = self.store.block(block);
        (b.live() && c.is_for(b.addr(), self.store.segment(b.segment()).seq()))
            .then_some(c.context())
    }

    /// The allocation stack of `block`.
    pub(crate) fn block_context(&self, block: BlockId) -> Option<&Context> {
        self.obs.block_context(block)
    }

    fn set_segment_context(&mut self, block: BlockId, ctx: Option<Context>) {
        let c = ctx.map(|ctx| {
            let b = self.store.block(block);
            SegmentContext::new(b.addr(), self.store.segment(b.segment()).seq(), ctx)
        });
        self.obs.set_segment_context(block, c);
    }

    /// `try_merge_blocks` of `[src dst]`: `dst` (now starting at `src`'s
    /// address) takes `src`'s segment stack, or none (PyTorch's move).
    pub(crate) fn move_segment_context(&mut self, src: BlockId, dst: BlockId) {
        let ctx = self.obs.take_segment_context(src).and_then(|c| {
            let b = self.store.block(src);
            (b.live() && self.store.segment(b.segment()).seq() == c.seq()).then(|| c.into_context())
        });
        self.set_segment_context(dst, ctx);
    }

    /// PyTorch's `record_trace`: one branch unless something observes.
    /// `block` is the block or segment head the event is about (`None`
    /// for `oom` and `snapshot`), `pool` its pool.
    #[inline]
    pub(crate) fn record_trace(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        block: Option<BlockId>,
    ) {
        if self.obs.is_observing() {
            self.observe_slow(action, addr, size, stream, pool, block);
        }
    }

    #[cold]
    fn observe_slow(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: PoolId,
        block: Option<BlockId>,
    ) {
        let cur = self.obs.current_context().cloned();
        let block_ctx = |s: &Self| block.and_then(|b| s.block_context(b).cloned());
        let seg_ctx = |s: &Self| block.and_then(|b| s.segment_context(b).cloned());
        let ctx = match (action, block) {
            (TraceAction::Alloc, Some(block)) => {
                self.obs.set_block_context(block, cur.clone());
                cur
            }
            (TraceAction::FreeRequested, _) => cur.or_else(|| block_ctx(self)),
            (TraceAction::FreeCompleted, Some(block)) => {
                let c = cur.or_else(|| block_ctx(self));
                self.obs.set_block_context(block, None);
                c
            }
            (TraceAction::SegmentAlloc, Some(block)) => {
                self.set_segment_context(block, cur.clone());
                cur
            }
            (TraceAction::SegmentMap, Some(block)) => {
                if self.store.block(block).prev().is_none() && self.segment_context(block).is_none()
                {
                    self.set_segment_context(block, cur.clone());
                }
                cur
            }
            (TraceAction::SegmentFree, Some(block)) => {
                let c = cur.or_else(|| seg_ctx(self));
                self.obs.take_segment_context(block);
                c
            }
            (TraceAction::SegmentUnmap, _) => cur.or_else(|| seg_ctx(self)),
            (TraceAction::Oom, _) => cur,
            (TraceAction::Snapshot, _) => None,
            // A block event without its block: no caller records one.
            (_, None) => cur,
        };
        let small = self.pools[pool.index()].is_small();
        let owner = self.owner(pool).unwrap_or_default();
        if self.obs.takes_entries() {
            let rec = Recorded::new(action, addr, size, stream, now_us(), owner, ctx);
            self.obs.record(rec);
        }
        self.report(action, addr, size, stream, small, block);
    }

    /// Callbacks and debug output for one event.
    fn report(
        &mut self,
        action: TraceAction,
        addr: u64,
        size: u64,
        stream: StreamId,
        small: bool,
        block: Option<BlockId>,
    ) {
        let v = self.obs.verbosity();
        let pool_name = if small { "small" } else { "large" };
        let event = match (action, block) {
            (TraceAction::Alloc, Some(block)) => {
                let fresh = self.obs.take_fresh();
                let block_size = self.store.block(block).size();
                if fresh && v.logs(DebugVerbosity::ALLOCATIONS, small) {
                    tracing::info!(
                        target: TARGET,
                        "Allocated {pool_name} block of size {} at {addr:#x} from new device memory \
                         (requested {}, stream {}, allocated {}, reserved {})",
                        format_size(block_size),
                        format_size(size),
                        stream.0,
                        format_size(self.acct.allocated_bytes()),
                        format_size(self.acct.reserved_bytes()),
                    );
                } else if !fresh && v.logs(DebugVerbosity::RECYCLES, small) {
                    tracing::info!(
                        target: TARGET,
                        "Reusing {pool_name} block of size {} at {addr:#x} (requested {}, stream {})",
                        format_size(block_size),
                        format_size(size),
                        stream.0,
                    );
                }
                let kind = if fresh {
                    EventType::Allocated
                } else {
                    EventType::Recycled
                };
                Some((kind, block_size))
            }
            (TraceAction::FreeCompleted, Some(block)) => {
                let block_size = self.store.block(block).size();
                if v.logs(DebugVerbosity::RELEASES, small) {
                    tracing::info!(
                        target: TARGET,
                        "Returned {pool_name} block of size {} at {addr:#x} to the cache (stream {})",
                        format_size(block_size),
                        stream.0,
                    );
                }
                Some((EventType::Freed, block_size))
            }
            (TraceAction::SegmentAlloc | TraceAction::SegmentMap, _) => {
                if v.logs(DebugVerbosity::ALLOCATIONS, small) {
                    let what = if action == TraceAction::SegmentAlloc {
                        "segment"
                    } else {
                        "expandable-segment pages"
                    };
                    tracing::info!(
                        target: TARGET,
                        "Allocated {pool_name} {what} of size {} at {addr:#x} (stream {}, reserved {})",
                        format_size(size),
                        stream.0,
                        format_size(self.acct.reserved_bytes()),
                    );
                }
                None
            }
            (TraceAction::SegmentFree | TraceAction::SegmentUnmap, _) => {
                if v.logs(DebugVerbosity::RELEASES, small) {
                    let what = if action == TraceAction::SegmentFree {
                        "segment"
                    } else {
                        "expandable-segment pages"
                    };
                    tracing::info!(
                        target: TARGET,
                        "Released {pool_name} {what} of size {} at {addr:#x} (stream {}, reserved {})",
                        format_size(size),
                        stream.0,
                        format_size(self.acct.reserved_bytes()),
                    );
                }
                Some((EventType::Released, size))
            }
            (TraceAction::Oom, _) => {
                if v.contains(DebugVerbosity::PROFILING) {
                    tracing::info!(
                        target: TARGET,
                        "Out of memory: {} request on stream {} failed after every retry \
                         (device free {})",
                        format_size(size),
                        stream.0,
                        format_size(addr),
                    );
                }
                None
            }
            // A block event without its block: no caller records one.
            (TraceAction::FreeRequested | TraceAction::Snapshot, _) | (_, None) => None,
        };
        if let Some((event, size)) = event {
            self.obs.callbacks().fire(&AllocatorEvent {
                event,
                device: self.device,
                ptr: DevicePtr(addr),
                size,
                stream,
            });
        }
    }
}

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}
