//! Pickle [`Value`] → [`Snapshot`], with errors that name the bad key.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use reservoir::backend::StreamId;
use reservoir::observe::pickle::Value;
use reservoir::observe::snapshot::{
    AllocatorSettings, Block, BlockHistory, BlockState, ExternalAnnotation, Segment, SegmentType,
    Snapshot,
};
use reservoir::observe::trace::{Frame, TraceAction, TraceEntry};

/// A value of the wrong shape: the path of the key or index that was wrong
/// (`segments[3].blocks[7].size`) and what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct SchemaError {
    /// Where, e.g. `device_traces[0][17].action`; `<root>` for the top.
    pub path: String,
    /// What was wrong, e.g. `expected int, found str`.
    pub message: String,
}

/// Which layout of PyTorch's snapshot a file used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotFormat {
    /// A bare list of segments (`torch.cuda.memory_snapshot()`, and what
    /// PyTorch dumped before 2.0).
    SegmentList,
    /// PyTorch 2.0: blocks carry `history`, segments lack `is_expandable`,
    /// `segment_pool_id` and `frames`.
    Pytorch2_0,
    /// Trace entries without `time_us` (≈2.1).
    NoTimeUs,
    /// The current dict layout: trace entries carry `time_us` (or there are
    /// none to tell).
    Current,
}

impl SnapshotFormat {
    /// A short name for reports.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotFormat::SegmentList => "segment list (pre-2.0 / memory_snapshot())",
            SnapshotFormat::Pytorch2_0 => "2.0 (block history)",
            SnapshotFormat::NoTimeUs => "dict, no time_us (~2.1)",
            SnapshotFormat::Current => "dict (current)",
        }
    }
}

impl fmt::Display for SnapshotFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The result of [`ReadSnapshot::decode`](super::ReadSnapshot::decode): the model, the layout it came in,
/// and what the reader skipped.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The layout detected.
    pub format: SnapshotFormat,
    /// Things skipped (unknown trace-entry actions or keys), with counts.
    pub warnings: Vec<String>,
    /// Trace entries skipped for an action this model does not know, by
    /// action name (also among the warnings). A replay of a trace with
    /// skipped entries cannot claim to be exact.
    pub skipped_actions: BTreeMap<String, u64>,
}

/// Convert a decoded pickle into the model, reporting the layout and what
/// was skipped (see [`ReadSnapshot::decode`](super::ReadSnapshot::decode)).
pub(super) fn decode(value: &Value) -> Result<Decoded, SchemaError> {
    let mut d = Decoder::default();
    let result = d.snapshot(value);
    match result {
        Ok(snapshot) => {
            let format = if matches!(value, Value::List(_) | Value::Tuple(_)) {
                SnapshotFormat::SegmentList
            } else if d.legacy_blocks {
                SnapshotFormat::Pytorch2_0
            } else if d.entries_without_time {
                SnapshotFormat::NoTimeUs
            } else {
                SnapshotFormat::Current
            };
            Ok(Decoded {
                snapshot,
                format,
                skipped_actions: std::mem::take(&mut d.skipped_actions),
                warnings: d.warnings.finish(),
            })
        }
        Err(f) => Err(f.into_schema_error()),
    }
}

// ----- paths and failures -----

#[derive(Debug)]
enum Seg {
    Key(&'static str),
    Index(usize),
    DictKey(String),
    Line(usize),
}

/// A failure with its path, innermost segment first.
#[derive(Debug)]
pub(super) struct Fail {
    path: Vec<Seg>,
    message: String,
}

pub(super) type R<T> = Result<T, Fail>;

impl Fail {
    pub(super) fn new(message: impl Into<String>) -> Fail {
        Fail {
            path: Vec::new(),
            message: message.into(),
        }
    }

    pub(super) fn into_schema_error(self) -> SchemaError {
        let mut path = String::new();
        for seg in self.path.iter().rev() {
            match seg {
                Seg::Key(k) => {
                    if !path.is_empty() {
                        path.push('.');
                    }
                    path.push_str(k);
                }
                Seg::Index(i) => path.push_str(&format!("[{i}]")),
                Seg::DictKey(k) => path.push_str(&format!("[{k:?}]")),
                Seg::Line(n) => path.push_str(&format!("line {n}")),
            }
        }
        if path.is_empty() {
            path.push_str("<root>");
        }
        SchemaError {
            path,
            message: self.message,
        }
    }
}

pub(super) trait At<T> {
    fn key(self, k: &'static str) -> R<T>;
    fn idx(self, i: usize) -> R<T>;
    fn dict_key(self, k: &str) -> R<T>;
    fn line(self, n: usize) -> R<T>;
}

impl<T> At<T> for R<T> {
    fn key(self, k: &'static str) -> R<T> {
        self.map_err(|mut f| {
            f.path.push(Seg::Key(k));
            f
        })
    }

    fn idx(self, i: usize) -> R<T> {
        self.map_err(|mut f| {
            f.path.push(Seg::Index(i));
            f
        })
    }

    fn dict_key(self, k: &str) -> R<T> {
        self.map_err(|mut f| {
            f.path.push(Seg::DictKey(k.to_string()));
            f
        })
    }

    fn line(self, n: usize) -> R<T> {
        self.map_err(|mut f| {
            f.path.push(Seg::Line(n));
            f
        })
    }
}

fn found(v: &Value) -> String {
    match v {
        Value::Int(i) => format!("int {i}"),
        Value::BigInt(b) => format!("int {b}"),
        Value::Str(s) if s.len() <= 40 => format!("str {s:?}"),
        other => other.type_name().to_string(),
    }
}

pub(super) fn expected(what: &str, v: &Value) -> Fail {
    Fail::new(format!("expected {what}, found {}", found(v)))
}

pub(super) fn missing(key: &str) -> Fail {
    Fail::new(format!("missing key {key:?}"))
}

pub(super) fn as_u64(v: &Value) -> R<u64> {
    match v {
        Value::Int(_) | Value::BigInt(_) => {
            v.as_u64().ok_or_else(|| expected("an int in 0..2^64", v))
        }
        _ => Err(expected("int", v)),
    }
}

pub(super) fn as_i64(v: &Value) -> R<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        _ => Err(expected("int in the i64 range", v)),
    }
}

fn as_u32(v: &Value) -> R<u32> {
    let u = as_u64(v)?;
    u32::try_from(u).map_err(|_| expected("an int in 0..2^32", v))
}

fn as_bool(v: &Value) -> R<bool> {
    v.as_bool().ok_or_else(|| expected("bool", v))
}

pub(super) fn as_str(v: &Value) -> R<&str> {
    v.as_str().ok_or_else(|| expected("str", v))
}

fn as_f64(v: &Value) -> R<f64> {
    match v {
        Value::Float(f) => Ok(*f),
        Value::Int(i) => Ok(*i as f64),
        _ => Err(expected("float", v)),
    }
}

pub(super) fn as_seq(v: &Value) -> R<&[Value]> {
    v.as_seq().ok_or_else(|| expected("list", v))
}

pub(super) fn as_dict(v: &Value) -> R<&[(Value, Value)]> {
    v.as_dict().ok_or_else(|| expected("dict", v))
}

/// Iterate a dict with string keys.
fn str_pairs(v: &Value) -> R<impl Iterator<Item = R<(&str, &Value)>>> {
    Ok(as_dict(v)?.iter().map(|(k, v)| match k {
        Value::Str(s) => Ok((&**s, v)),
        other => Err(Fail::new(format!(
            "expected str keys, found a {} key",
            other.type_name()
        ))),
    }))
}

// ----- warnings -----

#[derive(Default)]
pub(super) struct Warnings {
    counts: BTreeMap<String, usize>,
}

impl Warnings {
    pub(super) fn add(&mut self, msg: impl Into<String>) {
        *self.counts.entry(msg.into()).or_insert(0) += 1;
    }

    pub(super) fn finish(self) -> Vec<String> {
        self.counts
            .into_iter()
            .map(|(m, n)| {
                if n == 1 {
                    m
                } else {
                    format!("{m} ({n} times)")
                }
            })
            .collect()
    }
}

// ----- the decoder -----

#[derive(Default)]
struct Decoder {
    /// Frame lists already converted, by the address and length of the
    /// shared pickle list (the root value is alive throughout).
    frame_lists: FxHashMap<(usize, usize), Arc<[Frame]>>,
    /// Frame lists already converted, by the addresses of their frame dicts.
    frame_seqs: FxHashMap<Vec<usize>, Arc<[Frame]>>,
    /// Frame dicts already converted, by address.
    frame_dicts: FxHashMap<usize, Frame>,
    empty_frames: Option<Arc<[Frame]>>,
    /// Trace entries skipped for an unknown action, by action.
    skipped_actions: BTreeMap<String, u64>,
    warnings: Warnings,
    legacy_blocks: bool,
    entries_without_time: bool,
}

impl Decoder {
    fn snapshot(&mut self, v: &Value) -> R<Snapshot> {
        if let Value::List(_) | Value::Tuple(_) = v {
            let segments = self.segments(v).key("segments")?;
            return Ok(Snapshot {
                segments,
                ..Snapshot::default()
            });
        }
        let mut snap = Snapshot::default();
        let mut have_segments = false;
        for kv in str_pairs(v)? {
            let (k, v) = kv?;
            match k {
                "segments" => {
                    snap.segments = self.segments(v).key("segments")?;
                    have_segments = true;
                }
                "device_traces" => {
                    snap.device_traces = self.device_traces(v).key("device_traces")?
                }
                "allocator_settings" => {
                    snap.allocator_settings = Some(allocator_settings(v).key("allocator_settings")?)
                }
                "external_annotations" => {
                    snap.external_annotations = Some(annotations(v).key("external_annotations")?)
                }
                _ => snap.extra.0.push(extra_value(k, v)?),
            }
        }
        if !have_segments {
            return Err(missing("segments"));
        }
        Ok(snap)
    }

    fn segments(&mut self, v: &Value) -> R<Vec<Segment>> {
        let items = as_seq(v)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, s) in items.iter().enumerate() {
            out.push(self.segment(s).idx(i)?);
        }
        Ok(out)
    }

    fn segment(&mut self, v: &Value) -> R<Segment> {
        let mut seg = Segment::default();
        let (
            mut device,
            mut address,
            mut total,
            mut allocated,
            mut active,
            mut stream,
            mut ty,
            mut blocks,
        ) = (None, None, None, None, None, None, None, None);
        for kv in str_pairs(v)? {
            let (k, v) = kv?;
            match k {
                "device" => device = Some(as_u32(v).key("device")?),
                "address" => address = Some(as_u64(v).key("address")?),
                "total_size" => total = Some(as_u64(v).key("total_size")?),
                "allocated_size" => allocated = Some(as_u64(v).key("allocated_size")?),
                "active_size" => active = Some(as_u64(v).key("active_size")?),
                "requested_size" => seg.requested_size = Some(as_u64(v).key("requested_size")?),
                "stream" => stream = Some(as_u64(v).key("stream")?),
                "segment_type" => ty = Some(segment_type(v).key("segment_type")?),
                "segment_pool_id" => seg.segment_pool_id = Some(pool_id(v).key("segment_pool_id")?),
                "is_expandable" => seg.is_expandable = Some(as_bool(v).key("is_expandable")?),
                "frames" => seg.frames = Some(self.frames(v).key("frames")?),
                "blocks" => blocks = Some(self.blocks(v).key("blocks")?),
                _ => seg.extra.0.push(extra_value(k, v)?),
            }
        }
        if seg.is_expandable.is_none() {
            self.legacy_blocks = true;
        }
        seg.device = device.ok_or_else(|| missing("device"))?;
        seg.address = address.ok_or_else(|| missing("address"))?;
        seg.total_size = total.ok_or_else(|| missing("total_size"))?;
        seg.allocated_size = allocated.ok_or_else(|| missing("allocated_size"))?;
        seg.active_size = active.ok_or_else(|| missing("active_size"))?;
        seg.stream = StreamId(stream.ok_or_else(|| missing("stream"))?);
        seg.segment_type = ty.ok_or_else(|| missing("segment_type"))?;
        seg.blocks = blocks.ok_or_else(|| missing("blocks"))?;
        Ok(seg)
    }

    fn blocks(&mut self, v: &Value) -> R<Vec<Block>> {
        let items = as_seq(v)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, b) in items.iter().enumerate() {
            out.push(self.block(b).idx(i)?);
        }
        Ok(out)
    }

    fn block(&mut self, v: &Value) -> R<Block> {
        let mut b = Block::default();
        let (mut size, mut state) = (None, None);
        for kv in str_pairs(v)? {
            let (k, v) = kv?;
            match k {
                "address" => b.address = Some(as_u64(v).key("address")?),
                "size" => size = Some(as_u64(v).key("size")?),
                "requested_size" => b.requested_size = Some(as_u64(v).key("requested_size")?),
                "state" => state = Some(block_state(v).key("state")?),
                "frames" => b.frames = Some(self.frames(v).key("frames")?),
                "history" => {
                    b.history = Some(self.history(v).key("history")?);
                    self.legacy_blocks = true;
                }
                _ => b.extra.0.push(extra_value(k, v)?),
            }
        }
        b.size = size.ok_or_else(|| missing("size"))?;
        b.state = state.ok_or_else(|| missing("state"))?;
        Ok(b)
    }

    fn history(&mut self, v: &Value) -> R<Vec<BlockHistory>> {
        let items = as_seq(v)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, h) in items.iter().enumerate() {
            out.push(self.history_entry(h).idx(i)?);
        }
        Ok(out)
    }

    fn history_entry(&mut self, v: &Value) -> R<BlockHistory> {
        let mut h = BlockHistory::default();
        let (mut addr, mut real_size) = (None, None);
        for kv in str_pairs(v)? {
            let (k, v) = kv?;
            match k {
                "addr" => addr = Some(as_u64(v).key("addr")?),
                "real_size" => real_size = Some(as_u64(v).key("real_size")?),
                "frames" => h.frames = Some(self.frames(v).key("frames")?),
                _ => h.extra.0.push(extra_value(k, v)?),
            }
        }
        h.addr = addr.ok_or_else(|| missing("addr"))?;
        h.real_size = real_size.ok_or_else(|| missing("real_size"))?;
        Ok(h)
    }

    fn device_traces(&mut self, v: &Value) -> R<Vec<Vec<TraceEntry>>> {
        let devices = as_seq(v)?;
        let mut out = Vec::with_capacity(devices.len());
        for (d, trace) in devices.iter().enumerate() {
            out.push(self.trace(trace).idx(d)?);
        }
        Ok(out)
    }

    fn trace(&mut self, v: &Value) -> R<Vec<TraceEntry>> {
        let items = as_seq(v)?;
        let mut out = Vec::with_capacity(items.len());
        for (i, e) in items.iter().enumerate() {
            if let Some(entry) = self.entry(e).idx(i)? {
                out.push(entry);
            }
        }
        Ok(out)
    }

    /// One trace entry; `None` (with a warning) for an unknown action.
    fn entry(&mut self, v: &Value) -> R<Option<TraceEntry>> {
        let mut e = TraceEntry::new(TraceAction::Alloc, 0, 0, StreamId::DEFAULT);
        let (mut action, mut addr, mut device_free, mut size, mut stream) =
            (None, None, None, None, None);
        for kv in str_pairs(v)? {
            let (k, v) = kv?;
            match k {
                "action" => {
                    let name = as_str(v).key("action")?;
                    match TraceAction::parse(name) {
                        Some(a) => action = Some(a),
                        None => {
                            self.warnings.add(format!(
                                "skipped trace entries with unknown action {name:?}"
                            ));
                            *self.skipped_actions.entry(name.to_string()).or_insert(0) += 1;
                            return Ok(None);
                        }
                    }
                }
                "addr" => addr = Some(as_u64(v).key("addr")?),
                "device_free" => device_free = Some(as_u64(v).key("device_free")?),
                "size" => size = Some(as_u64(v).key("size")?),
                "stream" => stream = Some(as_u64(v).key("stream")?),
                "time_us" => e.time_us = Some(as_i64(v).key("time_us")?),
                "frames" => {
                    e.frames = self.frames(v).key("frames")?;
                    e.empty_frames_key = e.frames.is_empty();
                }
                "compile_context" => {
                    e.compile_context = Some(as_str(v).key("compile_context")?.to_string())
                }
                "user_metadata" => {
                    e.user_metadata = Some(as_str(v).key("user_metadata")?.to_string())
                }
                "pool_id" => e.pool_id = Some(pool_id(v).key("pool_id")?),
                other => self
                    .warnings
                    .add(format!("ignored trace-entry key {other:?}")),
            }
        }
        e.action = action.ok_or_else(|| missing("action"))?;
        e.addr = if e.action == TraceAction::Oom {
            device_free.or(addr).ok_or_else(|| missing("device_free"))?
        } else {
            if device_free.is_some() {
                self.warnings
                    .add(format!("ignored device_free of {} trace entries", e.action));
            }
            addr.ok_or_else(|| missing("addr"))?
        };
        e.size = size.ok_or_else(|| missing("size"))?;
        e.stream = StreamId(stream.ok_or_else(|| missing("stream"))?);
        if e.time_us.is_none() {
            self.entries_without_time = true;
        }
        if e.frames.is_empty() {
            e.frames = self.empty();
        }
        Ok(Some(e))
    }

    fn empty(&mut self) -> Arc<[Frame]> {
        self.empty_frames
            .get_or_insert_with(|| Arc::from(Vec::new()))
            .clone()
    }

    fn frames(&mut self, v: &Value) -> R<Arc<[Frame]>> {
        let items = match v {
            Value::List(a) | Value::Tuple(a) => a,
            other => return Err(expected("list", other)),
        };
        if items.is_empty() {
            return Ok(self.empty());
        }
        let key = (Arc::as_ptr(items) as *const u8 as usize, items.len());
        if let Some(f) = self.frame_lists.get(&key) {
            return Ok(f.clone());
        }
        // PyTorch shares frame dicts far more than frame lists: lists made of
        // the same dicts are equal, and get one Arc.
        let mut ids = Vec::with_capacity(items.len());
        for (i, f) in items.iter().enumerate() {
            match f {
                Value::Dict(d) => ids.push(Arc::as_ptr(d) as *const u8 as usize),
                other => return Err(expected("dict", other)).idx(i),
            }
        }
        if let Some(f) = self.frame_seqs.get(&ids) {
            let f = f.clone();
            self.frame_lists.insert(key, f.clone());
            return Ok(f);
        }
        let mut out = Vec::with_capacity(items.len());
        for (i, f) in items.iter().enumerate() {
            out.push(self.frame(f).idx(i)?);
        }
        let arc: Arc<[Frame]> = out.into();
        self.frame_lists.insert(key, arc.clone());
        self.frame_seqs.insert(ids, arc.clone());
        Ok(arc)
    }

    fn frame(&mut self, v: &Value) -> R<Frame> {
        let key = match v {
            Value::Dict(d) => Arc::as_ptr(d) as *const u8 as usize,
            other => return Err(expected("dict", other)),
        };
        if let Some(f) = self.frame_dicts.get(&key) {
            return Ok(f.clone());
        }
        let (mut name, mut filename, mut line) = (None, None, None);
        for kv in str_pairs(v)? {
            let (k, v) = kv?;
            match k {
                "name" => name = Some(as_str(v).key("name")?),
                "filename" => filename = Some(as_str(v).key("filename")?),
                "line" => line = Some(frame_line(v).key("line")?),
                other => self.warnings.add(format!("ignored frame key {other:?}")),
            }
        }
        let f = Frame {
            name: name.ok_or_else(|| missing("name"))?.to_string(),
            filename: filename.ok_or_else(|| missing("filename"))?.to_string(),
            line: line.ok_or_else(|| missing("line"))?,
        };
        self.frame_dicts.insert(key, f.clone());
        Ok(f)
    }
}

/// A frame's line. C++ frames without a line number carry `size_t(-1)`
/// (2^64 - 1); lines of 2^63 and above are kept as the negative `i64` with
/// the same bits, and written back unsigned.
fn frame_line(v: &Value) -> R<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BigInt(b) => b
            .to_u64()
            .map(|u| u as i64)
            .ok_or_else(|| expected("an int in -2^63..2^64", v)),
        _ => Err(expected("int", v)),
    }
}

fn segment_type(v: &Value) -> R<SegmentType> {
    match as_str(v)? {
        "small" => Ok(SegmentType::Small),
        "large" => Ok(SegmentType::Large),
        _ => Err(expected("\"small\" or \"large\"", v)),
    }
}

fn block_state(v: &Value) -> R<BlockState> {
    BlockState::parse(as_str(v)?).ok_or_else(|| {
        expected(
            "\"active_allocated\", \"active_pending_free\" or \"inactive\"",
            v,
        )
    })
}

/// The value of an unknown key, kept in `extra`. It must be plain data the
/// pickle writer can write back (real snapshots hold only dicts, lists,
/// tuples, str, int, float, bool and None), so that every snapshot that
/// loads also saves: bytes, sets, globals and ints wider than 255 bytes are
/// refused here, naming the key.
fn extra_value(k: &str, v: &Value) -> R<(String, Value)> {
    writable(v).dict_key(k)?;
    Ok((k.to_string(), v.clone()))
}

fn writable(v: &Value) -> R<()> {
    // Iterative: the walk must not depend on the nesting depth.
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::Bytes(_) | Value::Set(_) | Value::Global(_) => {
                return Err(Fail::new(format!(
                    "unknown key holds a {} value, which snapshots never contain and the pickle writer cannot write",
                    v.type_name()
                )))
            }
            Value::BigInt(b) if b.to_signed_le().len() > 255 => {
                return Err(Fail::new(
                    "unknown key holds an int wider than 255 bytes, which the pickle writer cannot write",
                ))
            }
            Value::List(x) | Value::Tuple(x) => stack.extend(x.iter()),
            Value::Dict(d) => {
                for (k, x) in d.iter() {
                    stack.push(k);
                    stack.push(x);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn pool_id(v: &Value) -> R<(i64, i64)> {
    match as_seq(v) {
        Ok([a, b]) => Ok((as_i64(a).idx(0)?, as_i64(b).idx(1)?)),
        _ => Err(expected("a pair of ints", v)),
    }
}

fn allocator_settings(v: &Value) -> R<AllocatorSettings> {
    let mut s = AllocatorSettings::default();
    for kv in str_pairs(v)? {
        let (k, v) = kv?;
        match k {
            "PYTORCH_CUDA_ALLOC_CONF" => {
                s.pytorch_cuda_alloc_conf =
                    Some(as_str(v).key("PYTORCH_CUDA_ALLOC_CONF")?.to_string())
            }
            "max_split_size" => s.max_split_size = Some(as_i64(v).key("max_split_size")?),
            "garbage_collection_threshold" => {
                s.garbage_collection_threshold =
                    Some(as_f64(v).key("garbage_collection_threshold")?)
            }
            "expandable_segments" => {
                s.expandable_segments = Some(as_bool(v).key("expandable_segments")?)
            }
            "pinned_num_register_threads" => {
                s.pinned_num_register_threads = Some(as_i64(v).key("pinned_num_register_threads")?)
            }
            "release_lock_on_cudamalloc" => {
                s.release_lock_on_cudamalloc = Some(as_bool(v).key("release_lock_on_cudamalloc")?)
            }
            "pinned_use_cuda_host_register" => {
                s.pinned_use_cuda_host_register =
                    Some(as_bool(v).key("pinned_use_cuda_host_register")?)
            }
            "graph_capture_record_stream_reuse" => {
                s.graph_capture_record_stream_reuse =
                    Some(as_bool(v).key("graph_capture_record_stream_reuse")?)
            }
            "max_round_threshold" => {
                s.max_round_threshold = Some(as_i64(v).key("max_round_threshold")?)
            }
            "max_cached_size" => s.max_cached_size = Some(as_i64(v).key("max_cached_size")?),
            "roundup_power2_divisions" => {
                s.roundup_power2_divisions =
                    Some(roundup_divisions(v).key("roundup_power2_divisions")?)
            }
            _ => s.extra.0.push(extra_value(k, v)?),
        }
    }
    Ok(s)
}

fn roundup_divisions(v: &Value) -> R<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for kv in str_pairs(v)? {
        let (k, v) = kv?;
        let start: u64 = k
            .parse()
            .map_err(|_| Fail::new(format!("expected a numeric key, found {k:?}")))?;
        out.push((start, as_u64(v).dict_key(k)?));
    }
    Ok(out)
}

fn annotations(v: &Value) -> R<Vec<ExternalAnnotation>> {
    let items = as_seq(v)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, a) in items.iter().enumerate() {
        out.push(annotation(a).idx(i)?);
    }
    Ok(out)
}

fn annotation(v: &Value) -> R<ExternalAnnotation> {
    let mut a = ExternalAnnotation::default();
    for kv in str_pairs(v)? {
        let (k, v) = kv?;
        match k {
            "stage" => a.stage = Some(as_str(v).key("stage")?.to_string()),
            "name" => a.name = Some(as_str(v).key("name")?.to_string()),
            "device" => a.device = Some(as_i64(v).key("device")?),
            "time_us" => a.time_us = Some(as_i64(v).key("time_us")?),
            _ => a.extra.0.push(extra_value(k, v)?),
        }
    }
    Ok(a)
}
