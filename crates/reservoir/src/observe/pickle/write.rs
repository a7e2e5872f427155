//! The writer: emits only what `MemoryViz.js` and Python both read.
//!
//! Bytes go to a sink ([`std::io::Write`]) one frame (64 KiB) at a time, so
//! writing a file holds one frame, never the whole pickle; [`Stream`] also
//! lets a caller write the items of a list or dict one by one (a snapshot's
//! trace entries), so that they need not all exist as [`Value`]s at once.

use std::io::Write;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::op;
use super::value::Value;

/// How [`to_vec_with`] writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    /// Pickle protocol: 2, 3 or 4 (what `MemoryViz.js` accepts). Protocol 4
    /// adds `FRAME` opcodes (every 64 KiB, as Python does) and memoizes with
    /// `MEMOIZE`; 2 and 3 memoize with `BINPUT`/`LONG_BINPUT`. Default 4,
    /// Python's default and what `torch.cuda.memory._dump_snapshot` writes.
    pub protocol: u8,
    /// Write each distinct string once and shared containers (an [`Arc`]
    /// referenced from several places) once, referring back with
    /// `BINGET`/`LONG_BINGET`. Without it, snapshots with recorded stacks
    /// grow tenfold. Default true.
    pub memoize: bool,
    /// Deepest container nesting accepted. Default 256 (the reader's limit).
    pub max_depth: usize,
}

impl Default for WriteOptions {
    fn default() -> WriteOptions {
        WriteOptions {
            protocol: 4,
            memoize: true,
            max_depth: 256,
        }
    }
}

/// A value the MemoryViz-compatible subset cannot express.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// The protocol is not 2, 3 or 4.
    #[error("protocol {0} cannot be written (choose 2, 3 or 4)")]
    Protocol(u8),
    /// The value holds something outside the writable subset.
    #[error("{0} cannot be written with the opcodes MemoryViz.js reads")]
    Unsupported(&'static str),
    /// Containers nest deeper than [`WriteOptions::max_depth`].
    #[error("containers nest deeper than {0}")]
    Depth(usize),
    /// The sink failed (the operating system's words).
    #[error("writing the pickle failed: {0}")]
    Io(String),
}

/// Write `value` with the default [`WriteOptions`] (protocol 4, memoized).
pub fn to_vec(value: &Value) -> Result<Vec<u8>, WriteError> {
    to_vec_with(value, &WriteOptions::default())
}

/// Write `value` with explicit options.
pub fn to_vec_with(value: &Value, opts: &WriteOptions) -> Result<Vec<u8>, WriteError> {
    let mut out = Vec::with_capacity(1 << 16);
    to_writer_with(value, opts, &mut out)?;
    Ok(out)
}

/// Write `value` to `sink` with explicit options, a frame (64 KiB) at a
/// time: the same bytes as [`to_vec_with`]. Wrap a file in a
/// [`std::io::BufWriter`] or not: whole frames are written.
pub fn to_writer_with(
    value: &Value,
    opts: &WriteOptions,
    sink: &mut dyn Write,
) -> Result<(), WriteError> {
    let mut s = Stream::new(opts, sink)?;
    s.value(value, 0)?;
    s.finish()
}

/// The kind of container [`Stream::begin`] opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Container {
    /// A list: each item one value.
    List,
    /// A dict: each item a key and a value.
    Dict,
}

/// A pickle written piece by piece to a sink: whole values with
/// [`value`](Stream::value), or a list or dict whose items come one at a
/// time ([`begin`](Stream::begin), then [`item`](Stream::item) for each).
/// The bytes are those [`to_vec_with`] writes for the same values.
pub struct Stream<'s> {
    w: Writer<'s>,
}

impl<'s> Stream<'s> {
    /// Start a pickle (`PROTO`, and a frame for protocol 4).
    pub fn new(opts: &WriteOptions, sink: &'s mut dyn Write) -> Result<Stream<'s>, WriteError> {
        if !(2..=4).contains(&opts.protocol) {
            return Err(WriteError::Protocol(opts.protocol));
        }
        let mut w = Writer {
            sink,
            out: Vec::with_capacity(FRAME_TARGET + 1024),
            proto: opts.protocol,
            memoize: opts.memoize,
            max_depth: opts.max_depth,
            memo_len: 0,
            strings: FxHashMap::default(),
            shared: FxHashMap::default(),
            keep: Vec::new(),
            frame_start: None,
        };
        w.out.push(op::PROTO);
        w.out.push(opts.protocol);
        if w.proto >= 4 {
            w.start_frame();
        }
        Ok(Stream { w })
    }

    /// Write one whole value at nesting `depth` (0 at the top).
    pub fn value(&mut self, v: &Value, depth: usize) -> Result<(), WriteError> {
        self.w.value(v, depth)?;
        self.w.flush_full()
    }

    /// Open an empty container at nesting `depth`, as an unshared
    /// [`Value::List`] or [`Value::Dict`] is written; fill it with
    /// [`item`](Stream::item).
    pub fn begin(&mut self, kind: Container, depth: usize) -> Result<(), WriteError> {
        self.w.check_depth(depth)?;
        self.w.out.push(match kind {
            Container::List => op::EMPTY_LIST,
            Container::Dict => op::EMPTY_DICT,
        });
        Ok(())
    }

    /// Item `index` of `len` of the container last opened: `write` writes
    /// it (one value for a list, key then value for a dict) with
    /// [`value`](Stream::value) or a nested [`begin`](Stream::begin). Items
    /// are batched as [`to_vec_with`] batches them.
    pub fn item(
        &mut self,
        kind: Container,
        index: usize,
        len: usize,
        write: impl FnOnce(&mut Stream<'s>) -> Result<(), WriteError>,
    ) -> Result<(), WriteError> {
        let chunk_start = index - index % BATCH;
        let chunk_len = BATCH.min(len - chunk_start);
        if index == chunk_start && chunk_len > 1 {
            self.w.out.push(op::MARK);
        }
        write(self)?;
        self.w.boundary()?;
        if index + 1 == chunk_start + chunk_len {
            self.w.out.push(match (kind, chunk_len > 1) {
                (Container::List, true) => op::APPENDS,
                (Container::List, false) => op::APPEND,
                (Container::Dict, true) => op::SETITEMS,
                (Container::Dict, false) => op::SETITEM,
            });
            self.w.boundary()?;
        }
        self.w.flush_full()
    }

    /// End the pickle (`STOP`) and write what is left to the sink.
    pub fn finish(mut self) -> Result<(), WriteError> {
        self.w.out.push(op::STOP);
        self.w.end_frame();
        self.w.flush_out()?;
        self.w.sink.flush().map_err(io_error)
    }
}

fn io_error(e: std::io::Error) -> WriteError {
    WriteError::Io(e.to_string())
}

const FRAME_TARGET: usize = 64 * 1024;
const BATCH: usize = 1000;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    List,
    Tuple,
    Dict,
}

struct Writer<'s> {
    sink: &'s mut dyn Write,
    /// Bytes not yet written to `sink`: the current frame (protocol 4).
    out: Vec<u8>,
    proto: u8,
    memoize: bool,
    max_depth: usize,
    memo_len: u32,
    strings: FxHashMap<Arc<str>, u32>,
    shared: FxHashMap<(usize, Kind), u32>,
    /// The memoized containers, kept alive while their address is a key of
    /// `shared` (values written piece by piece may be dropped meanwhile).
    keep: Vec<Value>,
    /// Position of the current `FRAME` opcode in `out` (protocol 4).
    frame_start: Option<usize>,
}

impl Writer<'_> {
    /// Write `out` to the sink.
    fn flush_out(&mut self) -> Result<(), WriteError> {
        self.sink.write_all(&self.out).map_err(io_error)?;
        self.out.clear();
        Ok(())
    }

    /// Write the closed frames (protocol 4), or everything once it passes a
    /// frame's size (protocols 2 and 3, which have no frames).
    fn flush_full(&mut self) -> Result<(), WriteError> {
        match self.frame_start {
            Some(start) if start > 0 => {
                self.sink.write_all(&self.out[..start]).map_err(io_error)?;
                self.out.drain(..start);
                self.frame_start = Some(0);
            }
            Some(_) => {}
            None if self.out.len() >= FRAME_TARGET => self.flush_out()?,
            None => {}
        }
        Ok(())
    }

    fn start_frame(&mut self) {
        self.frame_start = Some(self.out.len());
        self.out.push(op::FRAME);
        self.out.extend_from_slice(&[0; 8]);
    }

    fn end_frame(&mut self) {
        if let Some(start) = self.frame_start.take() {
            let len = (self.out.len() - start - 9) as u64;
            self.out[start + 1..start + 9].copy_from_slice(&len.to_le_bytes());
        }
    }

    /// Called between opcodes: closes the frame once it is big enough, and
    /// writes the closed frames to the sink.
    fn boundary(&mut self) -> Result<(), WriteError> {
        if let Some(start) = self.frame_start {
            if self.out.len() - start - 9 >= FRAME_TARGET {
                self.end_frame();
                self.start_frame();
            }
        }
        self.flush_full()
    }

    fn put(&mut self) -> Result<u32, WriteError> {
        let idx = self.memo_len;
        self.memo_len = idx
            .checked_add(1)
            .ok_or(WriteError::Unsupported("more than 4 Gi memo entries"))?;
        if self.proto >= 4 {
            self.out.push(op::MEMOIZE);
        } else if let Ok(i) = u8::try_from(idx) {
            self.out.push(op::BINPUT);
            self.out.push(i);
        } else {
            self.out.push(op::LONG_BINPUT);
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
        Ok(idx)
    }

    fn get(&mut self, idx: u32) {
        if let Ok(i) = u8::try_from(idx) {
            self.out.push(op::BINGET);
            self.out.push(i);
        } else {
            self.out.push(op::LONG_BINGET);
            self.out.extend_from_slice(&idx.to_le_bytes());
        }
    }

    /// The memo key of a container worth memoizing (shared), if any.
    fn shared_key<T: ?Sized>(&self, arc: &Arc<T>, kind: Kind) -> Option<(usize, Kind)> {
        if self.memoize && Arc::strong_count(arc) > 1 {
            Some((Arc::as_ptr(arc) as *const u8 as usize, kind))
        } else {
            None
        }
    }

    fn value(&mut self, v: &Value, depth: usize) -> Result<(), WriteError> {
        match v {
            Value::None => self.out.push(op::NONE),
            Value::Bool(true) => self.out.push(op::NEWTRUE),
            Value::Bool(false) => self.out.push(op::NEWFALSE),
            Value::Int(i) => self.int(*i),
            Value::BigInt(b) => {
                let bytes = b.to_signed_le();
                let n = u8::try_from(bytes.len())
                    .map_err(|_| WriteError::Unsupported("an int wider than 255 bytes"))?;
                self.out.push(op::LONG1);
                self.out.push(n);
                self.out.extend_from_slice(bytes);
            }
            Value::Float(f) => {
                self.out.push(op::BINFLOAT);
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => self.string(s)?,
            Value::Bytes(_) => return Err(WriteError::Unsupported("bytes")),
            Value::Set(_) => return Err(WriteError::Unsupported("a set")),
            Value::Global(_) => return Err(WriteError::Unsupported("a global reference")),
            Value::List(items) => {
                let key = self.shared_key(items, Kind::List);
                if self.memoized(key) {
                    return Ok(());
                }
                self.check_depth(depth)?;
                self.out.push(op::EMPTY_LIST);
                self.remember(key, v)?;
                for chunk in items.chunks(BATCH) {
                    if chunk.len() > 1 {
                        self.out.push(op::MARK);
                    }
                    for item in chunk {
                        self.value(item, depth + 1)?;
                        self.boundary()?;
                    }
                    self.out.push(if chunk.len() > 1 {
                        op::APPENDS
                    } else {
                        op::APPEND
                    });
                    self.boundary()?;
                }
            }
            Value::Dict(pairs) => {
                let key = self.shared_key(pairs, Kind::Dict);
                if self.memoized(key) {
                    return Ok(());
                }
                self.check_depth(depth)?;
                self.out.push(op::EMPTY_DICT);
                self.remember(key, v)?;
                for chunk in pairs.chunks(BATCH) {
                    if chunk.len() > 1 {
                        self.out.push(op::MARK);
                    }
                    for (k, v) in chunk {
                        self.value(k, depth + 1)?;
                        self.value(v, depth + 1)?;
                        self.boundary()?;
                    }
                    self.out.push(if chunk.len() > 1 {
                        op::SETITEMS
                    } else {
                        op::SETITEM
                    });
                    self.boundary()?;
                }
            }
            Value::Tuple(items) => {
                let key = self.shared_key(items, Kind::Tuple);
                if self.memoized(key) {
                    return Ok(());
                }
                self.check_depth(depth)?;
                if items.is_empty() {
                    self.out.push(op::EMPTY_TUPLE);
                } else if items.len() <= 3 {
                    for item in items.iter() {
                        self.value(item, depth + 1)?;
                    }
                    self.out
                        .push([op::TUPLE1, op::TUPLE2, op::TUPLE3][items.len() - 1]);
                } else {
                    self.out.push(op::MARK);
                    for item in items.iter() {
                        self.value(item, depth + 1)?;
                        self.boundary()?;
                    }
                    self.out.push(op::TUPLE);
                }
                self.remember(key, v)?;
            }
        }
        Ok(())
    }

    fn check_depth(&self, depth: usize) -> Result<(), WriteError> {
        if depth >= self.max_depth {
            Err(WriteError::Depth(self.max_depth))
        } else {
            Ok(())
        }
    }

    /// Writes a memo reference if the container was written before.
    fn memoized(&mut self, key: Option<(usize, Kind)>) -> bool {
        match key.and_then(|k| self.shared.get(&k).copied()) {
            Some(idx) => {
                self.get(idx);
                true
            }
            None => false,
        }
    }

    fn remember(&mut self, key: Option<(usize, Kind)>, v: &Value) -> Result<(), WriteError> {
        if let Some(k) = key {
            let idx = self.put()?;
            self.shared.insert(k, idx);
            self.keep.push(v.clone());
        }
        Ok(())
    }

    fn int(&mut self, i: i64) {
        if let Ok(b) = u8::try_from(i) {
            self.out.push(op::BININT1);
            self.out.push(b);
        } else if let Ok(h) = u16::try_from(i) {
            self.out.push(op::BININT2);
            self.out.extend_from_slice(&h.to_le_bytes());
        } else if let Ok(w) = i32::try_from(i) {
            self.out.push(op::BININT);
            self.out.extend_from_slice(&w.to_le_bytes());
        } else {
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let last = bytes[n - 1];
                let prev_neg = bytes[n - 2] & 0x80 != 0;
                if (last == 0 && !prev_neg) || (last == 0xff && prev_neg) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.push(op::LONG1);
            self.out.push(n as u8);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn string(&mut self, s: &Arc<str>) -> Result<(), WriteError> {
        if self.memoize {
            if let Some(&idx) = self.strings.get(&**s) {
                self.get(idx);
                return Ok(());
            }
        }
        match u8::try_from(s.len()) {
            Ok(n) if self.proto >= 4 => {
                self.out.push(op::SHORT_BINUNICODE);
                self.out.push(n);
            }
            _ => {
                let n = u32::try_from(s.len())
                    .map_err(|_| WriteError::Unsupported("a str longer than 4 GiB"))?;
                self.out.push(op::BINUNICODE);
                self.out.extend_from_slice(&n.to_le_bytes());
            }
        }
        self.out.extend_from_slice(s.as_bytes());
        if self.memoize {
            let idx = self.put()?;
            self.strings.insert(s.clone(), idx);
        }
        Ok(())
    }
}
