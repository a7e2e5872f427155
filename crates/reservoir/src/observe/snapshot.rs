//! Memory snapshots: PyTorch's segments, blocks and allocation history, as a
//! typed model the allocator builds and writes as PyTorch's pickle (spec
//! section 2).
//!
//! * [`Snapshot`] mirrors the dict `torch.cuda.memory._snapshot()` returns:
//!   [`Segment`]s with their [`Block`]s, per-device trace entries
//!   ([`TraceEntry`](crate::observe::trace::TraceEntry)), [`AllocatorSettings`] and
//!   [`ExternalAnnotation`]s. Keys that differ between PyTorch versions are
//!   `Option`s and unknown keys are kept in `extra` fields, so a reader (the
//!   `reservoir-replay` crate decodes every layout PyTorch has written) can
//!   write back what it read.
//! * [`Snapshot::to_pickle`] writes a pickle that Python and
//!   `MemoryViz.js` (pytorch.org/memory_viz) load; with the `json` feature,
//!   `Snapshot::to_json` exports JSON.
//! * [`Snapshot::check_consistency`] verifies what the viewers assume of
//!   each segment.
//!
//! ```
//! use reservoir::observe::snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
//! use reservoir::StreamId;
//!
//! let seg = Segment {
//!     address: 0x7f00_0000_0000,
//!     total_size: 2 << 20,
//!     allocated_size: 512,
//!     active_size: 512,
//!     stream: StreamId::DEFAULT,
//!     segment_type: SegmentType::Small,
//!     blocks: vec![
//!         Block { size: 512, requested_size: Some(500), state: BlockState::ActiveAllocated, ..Block::default() },
//!         Block { size: (2 << 20) - 512, state: BlockState::Inactive, ..Block::default() },
//!     ],
//!     ..Segment::default()
//! };
//! let snap = Snapshot { segments: vec![seg], ..Snapshot::default() };
//! snap.check_consistency().unwrap();
//! let bytes = snap.to_pickle().unwrap();
//! assert_eq!(bytes[0], reservoir::observe::pickle::op::PROTO);
//! ```

mod check;
mod encode;
mod model;

pub use check::{ConsistencyError, Inconsistency};
pub use model::{
    AllocatorSettings, Block, BlockHistory, BlockState, ExternalAnnotation, ExtraKeys,
    LayoutSummary, Segment, SegmentType, Snapshot,
};
