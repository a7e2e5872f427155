//! Snapshots (PyTorch's `DeviceCachingAllocator::snapshot` and
//! `_memory_snapshot_pickled`, spec 2.2 to 2.5) and
//! `getExpandableSegmentSizes`.

use std::sync::Arc;

use super::state::observe::pool_id_tuple;
use super::state::pools::POOL_LARGE;
use super::state::DeviceState;
use crate::backend::StreamId;
use crate::ids::MempoolId;
use crate::observe::pickle::Value;
use crate::observe::snapshot::{
    Block, BlockState, ExtraKeys, LayoutSummary, Segment, SegmentType, Snapshot,
};
use crate::observe::trace::{Frame, TraceAction};
use crate::store::BlockId;

/// Mapped bytes of one expandable segment (PyTorch's `StreamSegmentSize`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamSegmentSize {
    /// The stream the segment serves.
    pub stream: StreamId,
    /// A small-pool segment (2 MiB pages)?
    pub is_small_pool: bool,
    /// Bytes currently mapped.
    pub total_size: u64,
}

impl DeviceState {
    /// The snapshot model; appends the `snapshot` trace entry afterwards.
    pub(crate) fn snapshot(
        &mut self,
        mempool: Option<MempoolId>,
        include_traces: bool,
    ) -> Snapshot {
        let only = mempool.filter(|p| !p.is_default());
        let device_traces = if include_traces {
            let mut t = vec![Vec::new(); self.device.max(0) as usize];
            t.push(self.obs.entries());
            t
        } else {
            Vec::new()
        };
        let segments = self.segment_models(only);
        let total_active: u64 = segments.iter().map(|s| s.active_size).sum();
        let pool = only
            .and_then(|p| self.private.get(p))
            .map_or(POOL_LARGE, |p| p.large());
        self.record_trace(
            TraceAction::Snapshot,
            0,
            total_active,
            StreamId::DEFAULT,
            pool,
            None,
        );
        Snapshot {
            segments,
            device_traces,
            allocator_settings: Some(self.config.allocator_settings()),
            external_annotations: Some(Vec::new()),
            extra: ExtraKeys(vec![
                ("host_segments".into(), Value::list(Vec::new())),
                ("host_traces".into(), Value::list(Vec::new())),
            ]),
        }
    }

    /// The segments as PyTorch's snapshot reports them (spec 2.3), in address
    /// order: each contiguous mapped run of an expandable segment is a
    /// segment of its own (spec 1.11). With `pool`, only the segments of that
    /// pool ([`MempoolId::DEFAULT`] for the global pools).
    pub(crate) fn segment_models(&self, pool: Option<MempoolId>) -> Vec<Segment> {
        let empty: Arc<[Frame]> = Arc::from([]);
        let mut segments: Vec<Segment> = Vec::new();
        for (sid, s) in self.store.live_segments() {
            let owner = self.owner(s.pool()).unwrap_or_default();
            if pool.is_some_and(|p| p != owner) {
                continue;
            }
            let segment_type = if self.pools[s.pool().index()].is_small() {
                SegmentType::Small
            } else {
                SegmentType::Large
            };
            let mut current: Option<Segment> = None;
            for id in self.store.segment_blocks(sid) {
                let b = self.store.block(id);
                if !b.mapped() {
                    segments.extend(current.take());
                    continue;
                }
                let seg = current.get_or_insert_with(|| Segment {
                    device: self.device.max(0) as u32,
                    address: b.addr(),
                    requested_size: Some(0),
                    stream: s.stream(),
                    segment_type,
                    segment_pool_id: Some(pool_id_tuple(owner)),
                    is_expandable: Some(s.expandable().is_some()),
                    frames: Some(
                        self.segment_context(id)
                            .map_or_else(|| empty.clone(), |c| c.frames()),
                    ),
                    ..Segment::default()
                });
                let state = self.block_state(id);
                seg.total_size += b.size();
                if state == BlockState::ActiveAllocated {
                    seg.allocated_size += b.size();
                }
                if state.is_active() {
                    seg.active_size += b.size();
                    *seg.requested_size.get_or_insert(0) += b.requested_size();
                }
                seg.blocks.push(self.block_model(id, state, &empty));
            }
            segments.extend(current);
        }
        segments.sort_by_key(|s| s.address);
        segments
    }

    /// What [`segment_models`](Self::segment_models)`(None)` would count,
    /// without building the models: the replay scans it at every new peak.
    pub(crate) fn layout_summary(&self) -> LayoutSummary {
        let mut sum = LayoutSummary::default();
        for (sid, _) in self.store.live_segments() {
            let mut in_run = false;
            for id in self.store.segment_blocks(sid) {
                let b = self.store.block(id);
                if !b.mapped() {
                    in_run = false;
                    continue;
                }
                if !in_run {
                    sum.segments += 1;
                    in_run = true;
                }
                sum.add_block(self.block_state(id), b.size());
            }
        }
        sum
    }

    fn block_model(&self, id: BlockId, state: BlockState, empty: &Arc<[Frame]>) -> Block {
        let b = self.store.block(id);
        let frames = match (self.block_context(id), state) {
            (Some(c), s) if s.is_active() => c.frames(),
            _ => empty.clone(),
        };
        Block {
            address: Some(b.addr()),
            size: b.size(),
            requested_size: Some(b.requested_size()),
            state,
            frames: Some(frames),
            ..Block::default()
        }
    }

    /// PyTorch's `getExpandableSegmentSizes`: every expandable segment in
    /// creation order, except those of the default stream (PyTorch skips a
    /// null `cudaStream_t`).
    pub(crate) fn expandable_segment_sizes(&self) -> Vec<StreamSegmentSize> {
        let mut segs: Vec<_> = self
            .store
            .live_segments()
            .filter(|(_, s)| s.stream() != StreamId::DEFAULT)
            .filter_map(|(_, s)| s.expandable().map(|e| (s, e)))
            .collect();
        segs.sort_by_key(|(s, _)| s.seq());
        segs.into_iter()
            .map(|(s, e)| StreamSegmentSize {
                stream: s.stream(),
                is_small_pool: self.pools[s.pool().index()].is_small(),
                total_size: e.mapped_bytes(),
            })
            .collect()
    }
}
