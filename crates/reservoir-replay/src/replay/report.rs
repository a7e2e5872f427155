//! What a replay measured.

use std::collections::BTreeMap;

use crate::oracle_trace::AllocId;

/// The result of replaying a trace with one setting.
///
/// Serialized (`serde_json`) with exactly these field names, which are
/// stable: tools may rely on them. Sizes are bytes, times nanoseconds.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// The setting's name (`pytorch`, `max-split-128`, ...).
    pub setting: String,
    /// Its `PYTORCH_CUDA_ALLOC_CONF`-style string ("" = defaults).
    pub config: String,
    /// The allocator replayed: `caching` (PyTorch's CUDA caching
    /// allocator) or `mps-heap` (PyTorch's MPS heap allocator).
    pub allocator: String,
    /// Simulated device capacity.
    pub capacity: u64,
    /// Ops replayed.
    pub ops: u64,
    /// Allocation ops (`a`), failed ones included.
    pub alloc_ops: u64,
    /// Free ops (`f`) that freed something (frees of failed allocations are
    /// skipped).
    pub free_ops: u64,
    /// Highest allocated bytes (`allocated_bytes.all.peak`).
    pub peak_allocated: u64,
    /// Highest reserved bytes (`reserved_bytes.all.peak`).
    pub peak_reserved: u64,
    /// Highest bytes callers asked for and held (`requested_bytes.all.peak`):
    /// the same whatever the setting (as long as no allocation fails), the
    /// least any allocator must reserve.
    pub peak_live: u64,
    /// `peak_reserved / peak_allocated`: 1.0 is no overhead; `null` when
    /// nothing was allocated.
    pub fragmentation: Option<f64>,
    /// Reserved bytes not allocated when reserved bytes first reached their
    /// peak (`peak.reserved - peak.allocated`; 0 if nothing was reserved).
    pub reserved_unallocated_at_peak: u64,
    /// The largest free (inactive) block at that moment.
    pub largest_free_block_at_peak: u64,
    /// The state at that moment (`null` if nothing was ever reserved).
    /// The two fields above are taken from it.
    pub peak: Option<PeakState>,
    /// Driver allocations (`num_device_alloc`).
    pub driver_allocs: u64,
    /// Driver frees (`num_device_free`).
    pub driver_frees: u64,
    /// Allocations that failed with out of memory.
    pub ooms: u64,
    /// The first of them (`null` if none).
    pub first_oom: Option<OomRecord>,
    /// Simulated driver time: the simulated device's cost model summed over
    /// its calls.
    pub driver_time_ns: u64,
    /// Calls into the allocator (allocations, frees, `record_stream`,
    /// `empty_cache`).
    pub allocator_calls: u64,
    /// How many of them were timed (see
    /// [`ReplayOptions::time_one_in`](super::ReplayOptions::time_one_in)).
    pub allocator_timed_calls: u64,
    /// Wall time spent inside the allocator (host time of this machine):
    /// the mean of the timed calls times `allocator_calls`.
    pub allocator_time_ns: u64,
    /// Mean wall time of a timed allocator call, ns.
    pub allocator_ns_per_op: f64,
    /// Median wall time of a timed allocator call, ns (within 12.5 %): less
    /// sensitive than the mean to a busy machine.
    pub allocator_ns_p50: f64,
    /// 99th percentile of the wall time of a timed call, ns (within 12.5 %).
    pub allocator_ns_p99: f64,
    /// Named streams in first-use order, with the ids they were given
    /// (JSON: `[name, id]` pairs; the default stream, id 0, is not listed).
    pub streams: Vec<(String, u64)>,
    /// `torch.cuda.memory_stats()` keys at the end of the trace.
    pub memory_stats: BTreeMap<String, i64>,
    /// The allocated and reserved bytes over the replay, downsampled: per
    /// bucket of ops, the points of lowest and highest allocated bytes (at
    /// most [`ReplayOptions::max_samples`](super::ReplayOptions::max_samples)
    /// points, in op order).
    pub samples: Vec<Sample>,
}

/// The allocator's state when reserved bytes first reached their peak.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PeakState {
    /// The op after which it was taken.
    pub op: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Reserved bytes.
    pub reserved: u64,
    /// Segments.
    pub segments: u64,
    /// Free (inactive) blocks.
    pub free_blocks: u64,
    /// The largest of them.
    pub largest_free_block: u64,
}

/// An allocation that failed with out of memory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OomRecord {
    /// Op index.
    pub op: u64,
    /// Source line of the op.
    pub line: u64,
    /// The trace's id of the allocation.
    pub id: AllocId,
    /// Bytes requested.
    pub bytes: u64,
    /// The stream's id.
    pub stream: u64,
    /// PyTorch's message (`CUDA out of memory. Tried to allocate ...`).
    pub message: String,
}

/// One point of the time series.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Sample {
    /// Op index (the state after that op).
    pub op: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Reserved bytes.
    pub reserved: u64,
}

impl ReplayReport {
    /// The setting in words, for tables: the settings string, or what the
    /// defaults are.
    pub fn describe_setting(&self) -> String {
        match (self.allocator.as_str(), self.config.is_empty()) {
            ("mps-heap", _) => {
                "(PyTorch's MPS heap allocator, unified memory, default watermarks)".into()
            }
            (_, true) => "(PyTorch defaults)".into(),
            (_, false) => self.config.clone(),
        }
    }
}
