//! Reading memory snapshots and other allocation logs, as replay input
//! (spec section 2).
//!
//! The snapshot model itself ([`Snapshot`], its segments and blocks), its
//! pickle encoder and its consistency check are the allocator's
//! ([`reservoir::observe::snapshot`]); this module is the player's reading side:
//!
//! * [`ReadSnapshot`] decodes a pickle [`Value`], pickle bytes or a pickle
//!   file into a [`Snapshot`] (every layout PyTorch has written: see
//!   [`SnapshotFormat`]; keys a layout lacks are `None`, unknown keys are
//!   kept, so writing a snapshot back reproduces what was read), and views
//!   a snapshot as replayable events ([`ReadSnapshot::to_trace_input`]).
//! * [`load`] reads a file of any supported kind, sniffing the format: a
//!   snapshot pickle, the `alloc_data` JSON of an old `_memory_viz` page, or
//!   the `alloc free size` log of the allocatorSim simulator.
//!   [`LoadedInput::to_trace_input`] turns any of them into a [`TraceInput`]:
//!   per-device events in order, with what is known of the allocator state.
//!
//! ```
//! use reservoir::observe::snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
//! use reservoir::StreamId;
//! use reservoir_replay::input::ReadSnapshot;
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
//! let bytes = snap.to_pickle().unwrap();
//! let back = Snapshot::from_pickle(&bytes).unwrap();
//! assert_eq!(back, snap);
//! assert_eq!(back.to_trace_input().devices.len(), 1);
//! ```

mod decode;
mod events;

use std::fmt;
use std::path::Path;
use std::path::PathBuf;

pub use decode::{Decoded, SchemaError, SnapshotFormat};
pub use events::{AddressKind, DeviceEvents, LiveBlock, TraceInput};

use reservoir::format::format_size;
use reservoir::observe::pickle::{self, Value};
use reservoir::observe::snapshot::Snapshot;

use crate::pickle::PickleError;

/// The player's reading side of the allocator's [`Snapshot`] model: decoding
/// it from a pickle, and viewing it as replay input.
pub trait ReadSnapshot: Sized {
    /// Convert a decoded pickle into the model (any layout PyTorch wrote:
    /// see [`SnapshotFormat`]). Warnings are dropped; use
    /// [`ReadSnapshot::decode`] to see them.
    fn from_value(value: &Value) -> Result<Self, SchemaError>;

    /// Convert a decoded pickle into the model, reporting the layout and
    /// what was skipped. Trace entries with an action this model does not
    /// know (e.g. a newer PyTorch's `annotate`) are skipped with a warning;
    /// so are unknown keys of trace entries and frames. Unknown keys
    /// elsewhere are kept in `extra`.
    fn decode(value: &Value) -> Result<Decoded, SchemaError>;

    /// Read a snapshot pickle (any layout; warnings dropped): one pickle,
    /// nothing after its `STOP` (see [`crate::pickle::Scanner`]).
    fn from_pickle(bytes: &[u8]) -> Result<Self, Error>;

    /// Read a snapshot pickle file: a regular file of at most
    /// [`max_input_bytes`] bytes (see [`read_input`]).
    fn read(path: impl AsRef<Path>) -> Result<Self, Error>;

    /// The snapshot's traces as replay input: each device's
    /// `device_traces` entries with its final segments. Devices are those of
    /// [`Snapshot::devices`].
    fn to_trace_input(&self) -> TraceInput;
}

impl ReadSnapshot for Snapshot {
    fn from_value(value: &Value) -> Result<Snapshot, SchemaError> {
        decode::decode(value).map(|d| d.snapshot)
    }

    fn decode(value: &Value) -> Result<Decoded, SchemaError> {
        decode::decode(value)
    }

    fn from_pickle(bytes: &[u8]) -> Result<Snapshot, Error> {
        let v = crate::pickle::from_slice(bytes)?;
        pickle_end(bytes)?;
        Ok(Snapshot::from_value(&v)?)
    }

    fn read(path: impl AsRef<Path>) -> Result<Snapshot, Error> {
        let bytes = read_input(path.as_ref(), max_input_bytes()?)?;
        Snapshot::from_pickle(&bytes)
    }

    fn to_trace_input(&self) -> TraceInput {
        events::trace_input(self)
    }
}

/// Why an input could not be loaded.
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
    /// The input is none of the supported formats.
    #[error("unrecognized input: {0}")]
    UnknownFormat(String),
    /// The path names no regular file (a folder, a FIFO, a device, a
    /// socket): inputs are read whole, and a FIFO or a device may block or
    /// never end.
    #[error("{}: not a regular file ({kind}); inputs are read from regular files only", .path.display())]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is: "a folder", "a FIFO", ...
        kind: &'static str,
    },
    /// The file is larger than the input size limit ([`max_input_bytes`]).
    #[error(
        "{}: {size} bytes ({}), more than the input size limit of {limit} bytes ({}); \
         raise it with {MAX_INPUT_BYTES_ENV}=BYTES (see docs/limits.md)",
        .path.display(), format_size(*.size), format_size(*.limit)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size, or the bytes read when it grew while being read.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// A JSON or allocatorSim input holds a byte neither format can hold
    /// (a control byte other than white space: a hole of zeros, binary
    /// data); the reading stopped there.
    #[error("{format} input with byte {byte:#04x} at byte {offset}, which it cannot hold")]
    BadByte {
        /// The format the input's first byte announced.
        format: &'static str,
        /// Where the byte is.
        offset: u64,
        /// The byte.
        byte: u8,
    },
    /// [`MAX_INPUT_BYTES_ENV`] is set to something else than a number of
    /// bytes.
    #[error("{MAX_INPUT_BYTES_ENV}={value:?}: expected a number of bytes, e.g. 17179869184")]
    BadLimit {
        /// The variable's value.
        value: String,
    },
}

/// The most bytes [`load`] and [`ReadSnapshot::read`] read from one file
/// unless [`MAX_INPUT_BYTES_ENV`] says otherwise: 8 GiB, more than any
/// snapshot PyTorch writes for one process in practice (the largest of
/// `../shared/traces` is 3.7 MiB; long recordings reach a few GiB).
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 8 << 30;

/// The environment variable that sets the input size limit, in bytes.
pub const MAX_INPUT_BYTES_ENV: &str = "RESERVOIR_MAX_INPUT_BYTES";

/// The input size limit: [`MAX_INPUT_BYTES_ENV`] when set (a number of
/// bytes), else [`DEFAULT_MAX_INPUT_BYTES`].
pub fn max_input_bytes() -> Result<u64, Error> {
    match std::env::var_os(MAX_INPUT_BYTES_ENV) {
        None => Ok(DEFAULT_MAX_INPUT_BYTES),
        Some(v) => {
            let text = v.to_string_lossy();
            text.trim()
                .replace('_', "")
                .parse()
                .map_err(|_| Error::BadLimit {
                    value: text.into_owned(),
                })
        }
    }
}

/// What a path names, in words, when it is not a regular file.
fn not_a_file(meta: &std::fs::Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a folder");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if t.is_fifo() {
            return Some("a FIFO");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("not a file")
}

/// Bytes read at a time; the format checks run on each chunk as it comes.
const CHUNK_BYTES: usize = 64 << 10;

/// Open a user-named file for reading, refusing what cannot be read whole:
/// a path that names no regular file ([`Error::NotAFile`]: checked before
/// opening, so a FIFO does not block and `/dev/zero` is not read), and a file
/// of more than `limit` bytes ([`Error::TooLarge`], from its size). Returns
/// the file and its size.
fn open_regular(path: &Path, limit: u64) -> Result<(std::fs::File, u64), Error> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let check = |meta: &std::fs::Metadata| match not_a_file(meta) {
        Some(kind) => Err(Error::NotAFile {
            path: path.to_path_buf(),
            kind,
        }),
        None => Ok(()),
    };
    check(&std::fs::metadata(path).map_err(io)?)?;
    let f = std::fs::File::open(path).map_err(io)?;
    let meta = f.metadata().map_err(io)?;
    check(&meta)?;
    if meta.len() > limit {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit,
        });
    }
    Ok((f, meta.len()))
}

/// Read any user-named file whole (a list, a JSON report, a
/// configuration): a regular file of at most `limit` bytes, with the checks
/// of [`read_input`] save the format's. Every file the `reservoir` command
/// reads goes through this or [`read_input`].
pub fn read_file(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    let (f, len) = open_regular(path, limit)?;
    read_chunks(path, f, len, limit, |_, _| Ok(()))
}

/// Read an input file whole, refusing what cannot be an input before
/// reading it: a path that names no regular file ([`Error::NotAFile`]:
/// checked before opening, so a FIFO does not block), a file of more than
/// `limit` bytes ([`Error::TooLarge`]); then, while reading, a file that
/// stops being one of the formats [`load_bytes`] reads at its first bad
/// byte (see [`read_input_from`]).
pub fn read_input(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    let (f, len) = open_regular(path, limit)?;
    read_input_checked(path, f, len, limit)
}

/// The reading half of [`read_input`], from any reader (`path` names it in
/// errors): at most `limit` bytes, a chunk at a time, each chunk checked
/// as it comes. The first byte that is not white space decides the format;
/// from then on a pickle's opcode framing is followed (see
/// [`crate::pickle::Scanner`]: a byte where an opcode is due that is none,
/// such as a hole of zeros after a pickle's header, stops the reading
/// there, and so do bytes after its `STOP`), and a JSON or allocatorSim
/// input stops at a control byte neither can hold ([`Error::BadByte`]). A
/// file that is none of the formats is refused at its first byte. So the
/// reading stops at the first error, whatever the file's size.
pub fn read_input_from(
    path: &Path,
    reader: impl std::io::Read,
    limit: u64,
) -> Result<Vec<u8>, Error> {
    read_input_checked(path, reader, 0, limit)
}

fn read_input_checked(
    path: &Path,
    reader: impl std::io::Read,
    len: u64,
    limit: u64,
) -> Result<Vec<u8>, Error> {
    let mut check = FormatCheck::Undecided;
    let bytes = read_chunks(path, reader, len, limit, |bytes, from| {
        check.feed(bytes, from)
    })?;
    check.finish(&bytes)?;
    Ok(bytes)
}

/// Read `reader` whole, at most `limit` bytes (`len`: its expected size, to
/// reserve), calling `check(bytes so far, offset of the new ones)` after
/// each chunk.
fn read_chunks(
    path: &Path,
    mut reader: impl std::io::Read,
    len: u64,
    limit: u64,
    mut check: impl FnMut(&[u8], usize) -> Result<(), Error>,
) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::with_capacity(len.min(limit).min(256 << 20) as usize);
    let mut chunk = vec![0u8; CHUNK_BYTES];
    loop {
        let n = match reader.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(Error::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let size = bytes.len() as u64 + n as u64;
        if size > limit {
            // The file grew while it was read.
            return Err(Error::TooLarge {
                path: path.to_path_buf(),
                size,
                limit,
            });
        }
        let from = bytes.len();
        bytes.extend_from_slice(&chunk[..n]);
        check(&bytes, from)?;
    }
    Ok(bytes)
}

/// The format check of [`read_input_from`], fed the bytes as they come.
enum FormatCheck {
    /// Only white space so far.
    Undecided,
    /// A pickle (`first`: its first byte when it is not `PROTO`, a
    /// protocol 0 or 1 pickle, recognized by its framing alone).
    Pickle {
        scanner: crate::pickle::Scanner,
        first: Option<u8>,
    },
    /// JSON or an allocatorSim log.
    Text(&'static str),
}

impl FormatCheck {
    /// Check `bytes[from..]`, the bytes read since the last call.
    fn feed(&mut self, bytes: &[u8], from: usize) -> Result<(), Error> {
        if let FormatCheck::Undecided = self {
            let Some(b) = bytes[from..]
                .iter()
                .copied()
                .find(|b| !b.is_ascii_whitespace())
            else {
                return Ok(());
            };
            *self = match sniff(Some(b))? {
                Sniffed::Pickle { first } => FormatCheck::Pickle {
                    scanner: crate::pickle::Scanner::new(),
                    first,
                },
                Sniffed::AllocData => FormatCheck::Text("JSON"),
                Sniffed::AllocatorSimLog => FormatCheck::Text("allocatorSim log"),
            };
            // A pickle is scanned from byte 0 (white space before it is an
            // error, as for the reader).
            return self.feed(bytes, 0);
        }
        match self {
            FormatCheck::Undecided => Ok(()),
            FormatCheck::Pickle { scanner, first } => scanner
                .feed(&bytes[from..])
                .map_err(|e| pickle_error(e, *first)),
            FormatCheck::Text(format) => text_check(format, &bytes[from..], from),
        }
    }

    /// The end of the input, `bytes`. A pickle cut short is judged by the
    /// reader, whose error says more (the stack, a frame's length).
    fn finish(&self, bytes: &[u8]) -> Result<(), Error> {
        match self {
            FormatCheck::Pickle { scanner, first } => scanner.finish().map_err(|e| {
                let e = crate::pickle::from_slice(bytes).err().unwrap_or(e);
                pickle_error(e, *first)
            }),
            _ => Ok(()),
        }
    }
}

/// A framing error of a pickle whose first byte is `first` (None: `PROTO`,
/// surely a pickle): a protocol 0 pickle is recognized by its framing
/// alone, so a file that starts with an opcode but is not one is of an
/// unknown format.
fn pickle_error(e: crate::pickle::PickleError, first: Option<u8>) -> Error {
    match first {
        None => Error::Pickle(e),
        Some(b) => Error::UnknownFormat(format!(
            "starts with byte {b:#04x} (not a pickle: at byte {}: {})",
            e.offset, e.kind
        )),
    }
}

/// A JSON text or an allocatorSim log holds no control byte but white
/// space (a hole of zeros is refused at its first byte).
fn text_check(format: &'static str, new: &[u8], from: usize) -> Result<(), Error> {
    match new
        .iter()
        .position(|&b| b < 0x20 && !b.is_ascii_whitespace())
    {
        None => Ok(()),
        Some(i) => Err(Error::BadByte {
            format,
            offset: (from + i) as u64,
            byte: new[i],
        }),
    }
}

/// The formats [`load_bytes`] reads.
enum Sniffed {
    /// A pickle; `first`: its first byte when that is not `PROTO`.
    Pickle {
        first: Option<u8>,
    },
    AllocData,
    AllocatorSimLog,
}

/// The format of an input whose first byte that is not white space is
/// `first`. A pickle of protocol 0 or 1 has no `PROTO` header: any other
/// opcode is taken to start one, and the pickle's framing decides.
fn sniff(first: Option<u8>) -> Result<Sniffed, Error> {
    match first {
        Some(pickle::op::PROTO) => Ok(Sniffed::Pickle { first: None }),
        Some(b'{') => Ok(Sniffed::AllocData),
        Some(b) if b.is_ascii_digit() => Ok(Sniffed::AllocatorSimLog),
        Some(b) if pickle::opcode_name(b).is_some() => Ok(Sniffed::Pickle { first: Some(b) }),
        Some(b) => Err(Error::UnknownFormat(format!("starts with byte {b:#04x}"))),
        None => Err(Error::UnknownFormat("empty input".into())),
    }
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
    /// Trace entries skipped for an action the reader does not know, by
    /// action name (see [`Decoded::skipped_actions`]).
    pub skipped_actions: std::collections::BTreeMap<String, u64>,
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
    /// [`ReadSnapshot::to_trace_input`]).
    pub fn to_trace_input(&self) -> TraceInput {
        match &self.content {
            LoadedContent::Snapshot(s) => s.to_trace_input(),
            LoadedContent::Events(t) => t.clone(),
        }
    }
}

/// Load a trace file of any supported kind (see [`load_bytes`]): a regular
/// file of at most [`max_input_bytes`] bytes, recognized by its first bytes
/// before it is read whole (see [`read_input`]).
pub fn load(path: impl AsRef<Path>) -> Result<LoadedInput, Error> {
    load_with_limit(path, max_input_bytes()?)
}

/// [`load`] with an input size limit of `limit` bytes instead of
/// [`max_input_bytes`].
pub fn load_with_limit(path: impl AsRef<Path>, limit: u64) -> Result<LoadedInput, Error> {
    load_bytes(&read_input(path.as_ref(), limit)?)
}

/// Load trace data, sniffing the format: a pickle (first byte `PROTO`, or a
/// protocol 0/1 pickle ending in `STOP`) is a snapshot; a JSON object is
/// `alloc_data`; lines of three unsigned ints are an allocatorSim log.
pub fn load_bytes(bytes: &[u8]) -> Result<LoadedInput, Error> {
    let first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
    match sniff(first)? {
        Sniffed::Pickle { first } => {
            let v = crate::pickle::from_slice(bytes).map_err(|e| pickle_error(e, first))?;
            pickle_end(bytes)?;
            load_value(&v)
        }
        Sniffed::AllocData => load_alloc_data(bytes),
        Sniffed::AllocatorSimLog => load_allocator_sim_log(bytes),
    }
}

/// Load a snapshot pickle: one pickle, nothing after its `STOP` (an error
/// naming the offset, where [`crate::pickle::from_slice`] ignores them, as
/// Python does).
pub fn load_pickle(bytes: &[u8]) -> Result<LoadedInput, Error> {
    let v = crate::pickle::from_slice(bytes)?;
    pickle_end(bytes)?;
    load_value(&v)
}

/// After the reader read a pickle from `bytes`: nothing may follow its
/// `STOP` ([`crate::pickle::PickleErrorKind::TrailingData`]).
fn pickle_end(bytes: &[u8]) -> Result<(), Error> {
    Ok(crate::pickle::scan(bytes)?)
}

/// A snapshot from a pickle's value.
fn load_value(v: &Value) -> Result<LoadedInput, Error> {
    let d = decode::decode(v)?;
    Ok(LoadedInput {
        format: InputFormat::Snapshot(d.format),
        content: LoadedContent::Snapshot(d.snapshot),
        warnings: d.warnings,
        skipped_actions: d.skipped_actions,
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
        skipped_actions: Default::default(),
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
        skipped_actions: Default::default(),
    })
}

/// JSON → pickle value model, so one set of typed accessors serves both.
/// serde_json bounds nesting at 128 while parsing; this stays within it.
fn json_to_value(j: &serde_json::Value, depth: usize) -> Result<Value, String> {
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
