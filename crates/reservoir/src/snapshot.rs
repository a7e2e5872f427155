//! Memory snapshots: PyTorch's segments, blocks and allocation history, as a
//! typed model that reads and writes PyTorch's pickles (spec section 2).
//!
//! * [`Snapshot`] mirrors the dict `torch.cuda.memory._snapshot()` returns:
//!   [`Segment`]s with their [`Block`]s, per-device trace entries
//!   ([`TraceEntry`](crate::trace::TraceEntry)), [`AllocatorSettings`] and
//!   [`ExternalAnnotation`]s. Every layout PyTorch has written is read (see
//!   [`SnapshotFormat`]); keys a layout lacks are `None`, unknown keys are
//!   kept, so writing a snapshot back reproduces what was read.
//! * [`Snapshot::to_pickle`] writes a pickle that Python and
//!   `MemoryViz.js` (pytorch.org/memory_viz) load; [`Snapshot::to_json`]
//!   exports JSON.
//! * [`Snapshot::check_consistency`] verifies what the viewers assume of
//!   each segment.
//! * [`load`] reads a file of any supported kind, sniffing the format: a
//!   snapshot pickle, the `alloc_data` JSON of an old `_memory_viz` page, or
//!   the `alloc free size` log of the allocatorSim simulator.
//!   [`LoadedInput::to_trace_input`] turns any of them into a [`TraceInput`]:
//!   per-device events in order, with what is known of the allocator state.
//!
//! ```
//! use reservoir::snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
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
//! let back = Snapshot::from_pickle(&bytes).unwrap();
//! assert_eq!(back, snap);
//! ```

mod check;
mod decode;
mod encode;
mod events;
mod model;

use std::fmt;
use std::path::{Path, PathBuf};

pub use check::{ConsistencyError, Inconsistency};
pub use decode::{Decoded, SchemaError, SnapshotFormat};
pub use events::{AddressKind, DeviceEvents, LiveBlock, TraceInput};
pub use model::{
    AllocatorSettings, Block, BlockHistory, BlockState, ExternalAnnotation, ExtraKeys, Segment,
    SegmentType, Snapshot,
};

use crate::pickle::{self, PickleError, WriteError};

/// Why an input could not be loaded or a snapshot written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The pickle itself is malformed or hostile.
    #[error("pickle {0}")]
    Pickle(#[from] PickleError),
    /// The data has the wrong shape (names the key or index).
    #[error("{0}")]
    Schema(#[from] SchemaError),
    /// A JSON input is not valid JSON.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The snapshot holds a value the pickle writer cannot express.
    #[error("writing pickle: {0}")]
    Write(#[from] WriteError),
    /// The input is none of the supported formats.
    #[error("unrecognized input: {0}")]
    UnknownFormat(String),
}

/// The kind of file [`load`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// A PyTorch memory snapshot pickle, in the given layout.
    Snapshot(SnapshotFormat),
    /// The `alloc_data` JSON object of an old `_memory_viz.trace_plot` page.
    AllocData,
    /// The `alloc_event free_event size` log of the allocatorSim simulator.
    AllocatorSimLog,
}

impl fmt::Display for InputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InputFormat::Snapshot(s) => write!(f, "snapshot: {s}"),
            InputFormat::AllocData => f.write_str("alloc_data JSON (old _memory_viz page)"),
            InputFormat::AllocatorSimLog => f.write_str("allocatorSim log (alloc free size)"),
        }
    }
}

/// What a loaded file holds.
#[derive(Clone, Debug, PartialEq)]
pub enum LoadedContent {
    /// A snapshot (from a pickle).
    Snapshot(Snapshot),
    /// An event sequence without allocator state (the non-pickle formats).
    Events(TraceInput),
}

/// A loaded input: its format, its content, and what the reader skipped.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadedInput {
    /// The format detected.
    pub format: InputFormat,
    /// The content.
    pub content: LoadedContent,
    /// Things skipped or guessed while reading, with counts.
    pub warnings: Vec<String>,
}

impl LoadedInput {
    /// The snapshot, for snapshot inputs.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        match &self.content {
            LoadedContent::Snapshot(s) => Some(s),
            LoadedContent::Events(_) => None,
        }
    }

    /// The input as replayable events (snapshots: see
    /// [`Snapshot::to_trace_input`]).
    pub fn to_trace_input(&self) -> TraceInput {
        match &self.content {
            LoadedContent::Snapshot(s) => s.to_trace_input(),
            LoadedContent::Events(t) => t.clone(),
        }
    }
}

impl Snapshot {
    /// Read a snapshot pickle (any layout; warnings dropped).
    pub fn from_pickle(bytes: &[u8]) -> Result<Snapshot, Error> {
        let v = pickle::from_slice(bytes)?;
        Ok(Snapshot::from_value(&v)?)
    }

    /// Read a snapshot pickle file.
    pub fn read(path: impl AsRef<Path>) -> Result<Snapshot, Error> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Snapshot::from_pickle(&bytes)
    }

    /// Write the snapshot as a pickle file (see [`Snapshot::to_pickle`]).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let path = path.as_ref();
        let bytes = self.to_pickle()?;
        std::fs::write(path, bytes).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Load a trace file of any supported kind (see [`load_bytes`]).
pub fn load(path: impl AsRef<Path>) -> Result<LoadedInput, Error> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    load_bytes(&bytes)
}

/// Load trace data, sniffing the format: a pickle (first byte `PROTO`, or a
/// protocol 0/1 pickle ending in `STOP`) is a snapshot; a JSON object is
/// `alloc_data`; lines of three unsigned ints are an allocatorSim log.
pub fn load_bytes(bytes: &[u8]) -> Result<LoadedInput, Error> {
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(pickle::op::PROTO) => load_pickle(bytes),
        Some(b'{') => load_alloc_data(bytes),
        Some(b) if b.is_ascii_digit() => load_allocator_sim_log(bytes),
        Some(b) if pickle::opcode_name(b).is_some() && bytes.last() == Some(&pickle::op::STOP) => {
            load_pickle(bytes)
        }
        Some(b) => Err(Error::UnknownFormat(format!("starts with byte {b:#04x}"))),
        None => Err(Error::UnknownFormat("empty input".into())),
    }
}

/// Load a snapshot pickle.
pub fn load_pickle(bytes: &[u8]) -> Result<LoadedInput, Error> {
    let v = pickle::from_slice(bytes)?;
    let d = Snapshot::decode(&v)?;
    Ok(LoadedInput {
        format: InputFormat::Snapshot(d.format),
        content: LoadedContent::Snapshot(d.snapshot),
        warnings: d.warnings,
    })
}

/// Load the `alloc_data` JSON object of an old `_memory_viz.trace_plot`
/// page. Element `i` allocates `elements_size[i]` bytes; `actions` lists
/// elements in time order, first occurrence = alloc, second = free
/// (elements in `initially_allocated` are live at the start). When every
/// element's interned stack starts with a `b<hex address>_<version> …`
/// description (pages from PyTorch ≈2.1), the recorded addresses are used;
/// otherwise element `i` gets the synthetic handle `i + 1`.
pub fn load_alloc_data(bytes: &[u8]) -> Result<LoadedInput, Error> {
    let json: serde_json::Value = serde_json::from_slice(bytes)?;
    let obj = json
        .as_object()
        .ok_or_else(|| Error::UnknownFormat("JSON that is not an object".into()))?;
    if !obj.contains_key("actions") || !obj.contains_key("elements_size") {
        return Err(Error::UnknownFormat(
            "JSON without alloc_data keys (actions, elements_size)".into(),
        ));
    }
    let v = json_to_value(&json, 0).map_err(Error::UnknownFormat)?;
    let (trace, warnings) = events::alloc_data(&v).map_err(decode::Fail::into_schema_error)?;
    Ok(LoadedInput {
        format: InputFormat::AllocData,
        content: LoadedContent::Events(trace),
        warnings,
    })
}

/// Load an allocatorSim log: one line per block, `alloc_event free_event
/// size`, both events indexing one shared counter. Block `k` (line order)
/// gets the synthetic handle `k + 1`; the trace starts from an empty
/// allocator.
pub fn load_allocator_sim_log(bytes: &[u8]) -> Result<LoadedInput, Error> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Error::UnknownFormat("log that is not UTF-8".into()))?;
    let trace = events::allocator_sim_log(text).map_err(decode::Fail::into_schema_error)?;
    Ok(LoadedInput {
        format: InputFormat::AllocatorSimLog,
        content: LoadedContent::Events(trace),
        warnings: Vec::new(),
    })
}

/// JSON → pickle value model, so one set of typed accessors serves both.
/// serde_json bounds nesting at 128 while parsing; this stays within it.
fn json_to_value(j: &serde_json::Value, depth: usize) -> Result<pickle::Value, String> {
    use pickle::Value;
    if depth > 256 {
        return Err("JSON nested too deeply".into());
    }
    Ok(match j {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Int(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::Float(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        serde_json::Value::String(s) => Value::from(s.as_str()),
        serde_json::Value::Array(a) => Value::list(
            a.iter()
                .map(|x| json_to_value(x, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        serde_json::Value::Object(o) => Value::dict(
            o.iter()
                .map(|(k, v)| Ok((Value::from(k.as_str()), json_to_value(v, depth + 1)?)))
                .collect::<Result<_, String>>()?,
        ),
    })
}
