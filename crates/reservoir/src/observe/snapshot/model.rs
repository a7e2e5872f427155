//! The typed snapshot model (spec sections 2.2 to 2.5).

use std::fmt;
use std::sync::Arc;

use serde::ser::SerializeMap;

use crate::backend::StreamId;
use crate::observe::pickle::Value;
use crate::observe::trace::{Frame, TraceEntry};

/// A PyTorch memory snapshot: what `torch.cuda.memory._snapshot()` returns.
///
/// Keys that differ between PyTorch versions are `Option`s (`None` = the key
/// was absent), so a snapshot read from a file writes back the same keys.
/// Keys this model does not know are kept in `extra` fields, in order.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Snapshot {
    /// Every segment of every device, sorted by device then address.
    pub segments: Vec<Segment>,
    /// The recorded history, indexed by device, oldest entry first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator's settings (PyTorch ≈2.3+).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<AllocatorSettings>,
    /// `record_function` scopes and other user annotations (PyTorch ≈2.6+).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external_annotations: Option<Vec<ExternalAnnotation>>,
    /// Other top-level keys (e.g. newer `host_segments`), kept verbatim.
    #[serde(flatten)]
    pub extra: ExtraKeys,
}

/// The shape of a segment list in four numbers: what a fragmentation scan
/// reads, without building the [`Segment`]s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayoutSummary {
    /// Segments, counting each mapped run of an expandable segment as one.
    pub segments: u64,
    /// Blocks in them.
    pub blocks: u64,
    /// Blocks in the [`BlockState::Inactive`] state.
    pub free_blocks: u64,
    /// The size of the largest of those (0 without any).
    pub largest_free_block: u64,
}

impl LayoutSummary {
    /// Count a segment list.
    pub fn of(segments: &[Segment]) -> LayoutSummary {
        let mut sum = LayoutSummary {
            segments: segments.len() as u64,
            ..LayoutSummary::default()
        };
        for b in segments.iter().flat_map(|s| &s.blocks) {
            sum.add_block(b.state, b.size);
        }
        sum
    }

    /// Count one block.
    #[inline]
    pub fn add_block(&mut self, state: BlockState, size: u64) {
        self.blocks += 1;
        if state == BlockState::Inactive {
            self.free_blocks += 1;
            self.largest_free_block = self.largest_free_block.max(size);
        }
    }
}

/// One segment: a driver allocation, or one mapped run of an expandable
/// segment (spec 2.3).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Segment {
    /// Device index.
    pub device: u32,
    /// Start address.
    pub address: u64,
    /// Bytes in the segment (= sum of the block sizes).
    pub total_size: u64,
    /// Bytes of allocated blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks (allocated or waiting for other streams).
    pub active_size: u64,
    /// Bytes callers asked for, over the active blocks (absent before ≈2.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_size: Option<u64>,
    /// The stream the segment belongs to (a `cudaStream_t` value; 0 is the
    /// default stream).
    pub stream: StreamId,
    /// Small (≤ 1 MiB blocks) or large pool.
    pub segment_type: SegmentType,
    /// The owning memory pool, `(0, 0)` for the default pools (absent before
    /// ≈2.1; see [`Segment::pool_id`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_pool_id: Option<(i64, i64)>,
    /// Whether this is an expandable segment (absent before ≈2.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_expandable: Option<bool>,
    /// Stack of the `cudaMalloc` (absent before ≈2.1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Arc<[Frame]>>,
    /// The blocks, in address order, tiling the segment.
    pub blocks: Vec<Block>,
    /// Keys this model does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: ExtraKeys,
}

/// A piece of a segment (spec 2.3).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Block {
    /// Address as recorded (absent in PyTorch 2.0 snapshots; viewers use
    /// the running sum of sizes, see [`Segment::blocks_with_addresses`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<u64>,
    /// Bytes (rounded size).
    pub size: u64,
    /// Bytes the caller asked for. For inactive blocks PyTorch leaves the
    /// value of the block's last use.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested_size: Option<u64>,
    /// Allocated, waiting for other streams, or free.
    pub state: BlockState,
    /// Stack of the allocation (absent in PyTorch 2.0 snapshots, which keep
    /// stacks in `history`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Arc<[Frame]>>,
    /// PyTorch 2.0's per-block history of allocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<Vec<BlockHistory>>,
    /// Keys this model does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: ExtraKeys,
}

/// One allocation in a PyTorch 2.0 block's `history`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct BlockHistory {
    /// Address of the allocation.
    pub addr: u64,
    /// Bytes the caller asked for.
    pub real_size: u64,
    /// Stack of the allocation, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frames: Option<Arc<[Frame]>>,
    /// Keys this model does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: ExtraKeys,
}

/// The pool a segment belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentType {
    /// The small pool (blocks of at most 1 MiB, 2 MiB segments).
    Small,
    /// The large pool.
    #[default]
    Large,
}

impl SegmentType {
    /// PyTorch's name: `"small"` or `"large"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Small => "small",
            SegmentType::Large => "large",
        }
    }
}

/// The state of a block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by the caller, waiting for work on other streams to finish.
    ActivePendingFree,
    /// Free, cached.
    #[default]
    Inactive,
}

impl BlockState {
    /// PyTorch's name (`"active_allocated"`, `"active_pending_free"`,
    /// `"inactive"`).
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }

    /// Parse PyTorch's name; `"active_awaiting_free"` (the name in
    /// `_snapshot`'s docstring) is accepted for the pending state.
    pub fn parse(s: &str) -> Option<BlockState> {
        Some(match s {
            "active_allocated" => BlockState::ActiveAllocated,
            "active_pending_free" | "active_awaiting_free" => BlockState::ActivePendingFree,
            "inactive" => BlockState::Inactive,
            _ => return None,
        })
    }

    /// Allocated or pending free.
    pub fn is_active(self) -> bool {
        self != BlockState::Inactive
    }
}

impl fmt::Display for BlockState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The allocator's settings at snapshot time (spec 2.5). Every key is
/// optional: the set grew across PyTorch versions.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct AllocatorSettings {
    /// The last `PYTORCH_CUDA_ALLOC_CONF` string applied (`""` if never set).
    #[serde(
        rename = "PYTORCH_CUDA_ALLOC_CONF",
        skip_serializing_if = "Option::is_none"
    )]
    pub pytorch_cuda_alloc_conf: Option<String>,
    /// `max_split_size` in bytes; -1 means unlimited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_split_size: Option<i64>,
    /// `garbage_collection_threshold` (0 = off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub garbage_collection_threshold: Option<f64>,
    /// `expandable_segments`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expandable_segments: Option<bool>,
    /// `pinned_num_register_threads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_num_register_threads: Option<i64>,
    /// `release_lock_on_cudamalloc`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_lock_on_cudamalloc: Option<bool>,
    /// `pinned_use_cuda_host_register`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned_use_cuda_host_register: Option<bool>,
    /// `graph_capture_record_stream_reuse` (newest versions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_capture_record_stream_reuse: Option<bool>,
    /// `max_round_threshold`: pinned-memory rounding threshold in bytes,
    /// -1 when unset (torch 2.15).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_round_threshold: Option<i64>,
    /// `max_cached_size`: largest pinned block kept cached, in bytes, -1
    /// when unset (torch 2.15).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cached_size: Option<i64>,
    /// `roundup_power2_divisions`: (interval start in MiB, divisions), in
    /// file order (PyTorch writes the keys as strings `"1"`, `"2"`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub roundup_power2_divisions: Option<Vec<(u64, u64)>>,
    /// Keys this model does not know, kept verbatim.
    #[serde(flatten)]
    pub extra: ExtraKeys,
}

/// One entry of `external_annotations`: a user scope boundary or other
/// metadata.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ExternalAnnotation {
    /// `"START"` or `"END"` for `record_function` scopes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The scope's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Device index.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<i64>,
    /// Microseconds since the Unix epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_us: Option<i64>,
    /// Other metadata keys, kept verbatim.
    #[serde(flatten)]
    pub extra: ExtraKeys,
}

/// Dict keys a model type does not know, with their values, in file order.
/// Written back as they were read; serialized to JSON as plain keys of the
/// enclosing object.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExtraKeys(pub Vec<(String, Value)>);

impl ExtraKeys {
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value of `key` (the last one if repeated).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }
}

impl serde::Serialize for ExtraKeys {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl Segment {
    /// The owning pool, `(0, 0)` when not recorded.
    pub fn pool_id(&self) -> (i64, i64) {
        self.segment_pool_id.unwrap_or((0, 0))
    }

    /// Whether the segment is expandable (`false` when not recorded).
    pub fn expandable(&self) -> bool {
        self.is_expandable.unwrap_or(false)
    }

    /// One past the last byte (saturating).
    pub fn end(&self) -> u64 {
        self.address.saturating_add(self.total_size)
    }

    /// The blocks with their addresses computed as the viewers do: the
    /// segment's address plus the sizes of the blocks before (saturating).
    /// Equal to the recorded addresses in every consistent snapshot.
    pub fn blocks_with_addresses(&self) -> impl Iterator<Item = (u64, &Block)> + '_ {
        self.blocks.iter().scan(self.address, |addr, b| {
            let a = *addr;
            *addr = addr.saturating_add(b.size);
            Some((a, b))
        })
    }
}

impl Block {
    /// The requested size, falling back as the viewers do: the first history
    /// entry's `real_size`, else the block size.
    pub fn requested_or_size(&self) -> u64 {
        self.requested_size
            .or_else(|| {
                self.history
                    .as_ref()
                    .and_then(|h| h.first())
                    .map(|h| h.real_size)
            })
            .unwrap_or(self.size)
    }

    /// The allocation stack, falling back to the first history entry's.
    pub fn frames_or_history(&self) -> Option<&Arc<[Frame]>> {
        self.frames
            .as_ref()
            .or_else(|| self.history.as_ref()?.first()?.frames.as_ref())
    }
}

impl Snapshot {
    /// Number of trace entries over all devices.
    pub fn num_trace_entries(&self) -> usize {
        self.device_traces.iter().map(Vec::len).sum()
    }

    /// Device indices that own a segment or have trace entries, ascending
    /// (the devices `MemoryViz.js` offers).
    pub fn devices(&self) -> Vec<u32> {
        let mut d: Vec<u32> = self.segments.iter().map(|s| s.device).collect();
        d.extend(
            self.device_traces
                .iter()
                .enumerate()
                .filter(|(_, t)| !t.is_empty())
                .filter_map(|(i, _)| u32::try_from(i).ok()),
        );
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The segments of one device.
    pub fn segments_of(&self, device: u32) -> impl Iterator<Item = &Segment> + '_ {
        self.segments.iter().filter(move |s| s.device == device)
    }

    /// Bytes reserved (sum of segment sizes) over all devices.
    pub fn reserved_bytes(&self) -> u64 {
        self.segments
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.total_size))
    }

    /// Bytes allocated (sum of allocated block sizes) over all devices.
    pub fn allocated_bytes(&self) -> u64 {
        self.segments
            .iter()
            .fold(0u64, |a, s| a.saturating_add(s.allocated_size))
    }

    /// JSON export of the whole model (serde); keys mirror PyTorch's dict.
    #[cfg(feature = "json")]
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// Indented JSON export.
    #[cfg(feature = "json")]
    pub fn to_json_pretty(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}
