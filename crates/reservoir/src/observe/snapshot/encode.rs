//! [`Snapshot`] → pickle [`Value`], keeping the sharing of stacks so the
//! written file stays as small as PyTorch's.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::model::{
    AllocatorSettings, Block, BlockHistory, ExternalAnnotation, ExtraKeys, Segment, Snapshot,
};
use crate::observe::pickle::{self, Value, WriteError, WriteOptions};
use crate::observe::trace::{Frame, TraceAction, TraceEntry};

impl Snapshot {
    /// The snapshot as the dict PyTorch pickles: `segments`,
    /// `device_traces`, then `allocator_settings` and
    /// `external_annotations` when present, then the extra keys. Keys that
    /// are `None` in the model are left out; trace entries get a `frames`
    /// list only when they carry a stack (as PyTorch writes them; viewers
    /// default it to `[]`), and a segment's non-empty `frames` comes after
    /// its `blocks` (PyTorch's key order). Equal stacks are shared, so
    /// memoized writing stores each once.
    pub fn to_value(&self) -> Value {
        let mut e = Encoder::default();
        let mut top = vec![
            (
                e.s("segments"),
                Value::list(self.segments.iter().map(|s| e.segment(s)).collect()),
            ),
            (
                e.s("device_traces"),
                Value::list(
                    self.device_traces
                        .iter()
                        .map(|t| Value::list(t.iter().map(|x| e.entry(x)).collect()))
                        .collect(),
                ),
            ),
        ];
        if let Some(a) = &self.allocator_settings {
            top.push((e.s("allocator_settings"), e.settings(a)));
        }
        if let Some(a) = &self.external_annotations {
            top.push((
                e.s("external_annotations"),
                Value::list(a.iter().map(|x| e.annotation(x)).collect()),
            ));
        }
        e.extra(&mut top, &self.extra);
        Value::dict(top)
    }

    /// The snapshot as a pickle (protocol 4, memoized, `MemoryViz.js`
    /// compatible; see [`pickle::to_vec`]).
    pub fn to_pickle(&self) -> Result<Vec<u8>, WriteError> {
        pickle::to_vec(&self.to_value())
    }

    /// Write the snapshot's pickle to `sink`: the bytes of
    /// [`to_pickle`](Snapshot::to_pickle), streamed. The trace entries are
    /// encoded and written one at a time, and the sink gets one 64 KiB frame
    /// at a time, so the memory used is the snapshot's own plus the shared
    /// stacks, not the pickle's size (a 312 MB pickle of a long history took
    /// 3.6 GB through `to_pickle`). Wrap a file in a
    /// [`BufWriter`](std::io::BufWriter) or not: whole frames are written.
    pub fn write_pickle(&self, sink: &mut dyn std::io::Write) -> Result<(), WriteError> {
        use pickle::{Container, Stream};
        // A first pass counts the uses of each stack, so that the writing
        // pass keeps only the stacks and frames used more than once: the
        // writer memoizes a container exactly when it is referenced twice,
        // as in the tree `to_value` builds (same bytes as `to_pickle`).
        let mut e = Encoder {
            counting: true,
            ..Encoder::default()
        };
        for g in &self.segments {
            e.segment(g);
        }
        for x in self.device_traces.iter().flatten() {
            e.entry(x);
        }
        e.counting = false;
        e.selective = true;
        let mut s = Stream::new(&WriteOptions::default(), sink)?;
        let top_len = 2
            + usize::from(self.allocator_settings.is_some())
            + usize::from(self.external_annotations.is_some())
            + self.extra.0.len();
        s.begin(Container::Dict, 0)?;
        s.item(Container::Dict, 0, top_len, |s| {
            s.value(&e.s("segments"), 1)?;
            let segments = Value::list(self.segments.iter().map(|g| e.segment(g)).collect());
            s.value(&segments, 1)
        })?;
        s.item(Container::Dict, 1, top_len, |s| {
            s.value(&e.s("device_traces"), 1)?;
            let devices = self.device_traces.len();
            s.begin(Container::List, 1)?;
            for (d, trace) in self.device_traces.iter().enumerate() {
                s.item(Container::List, d, devices, |s| {
                    s.begin(Container::List, 2)?;
                    for (i, x) in trace.iter().enumerate() {
                        s.item(Container::List, i, trace.len(), |s| s.value(&e.entry(x), 3))?;
                    }
                    Ok(())
                })?;
            }
            Ok(())
        })?;
        let mut rest = Vec::new();
        if let Some(a) = &self.allocator_settings {
            rest.push((e.s("allocator_settings"), e.settings(a)));
        }
        if let Some(a) = &self.external_annotations {
            rest.push((
                e.s("external_annotations"),
                Value::list(a.iter().map(|x| e.annotation(x)).collect()),
            ));
        }
        e.extra(&mut rest, &self.extra);
        for (i, (k, v)) in rest.iter().enumerate() {
            s.item(Container::Dict, 2 + i, top_len, |s| {
                s.value(k, 1)?;
                s.value(v, 1)
            })?;
        }
        s.finish()
    }

    /// The snapshot as a pickle written with explicit options.
    pub fn to_pickle_with(&self, opts: &WriteOptions) -> Result<Vec<u8>, WriteError> {
        pickle::to_vec_with(&self.to_value(), opts)
    }
}

#[derive(Default)]
struct Encoder<'a> {
    strings: FxHashMap<&'a str, Value>,
    frame_lists: FxHashMap<(usize, usize), Value>,
    frame_dicts: FxHashMap<&'a Frame, Value>,
    /// Counting pass of [`Snapshot::write_pickle`]: `frames` only counts.
    counting: bool,
    /// Keep only stacks and frames used more than once (the writing pass of
    /// [`Snapshot::write_pickle`]); `to_value` keeps all.
    selective: bool,
    /// Uses of each stack (counting pass).
    list_uses: FxHashMap<(usize, usize), u32>,
    /// Distinct stacks holding each frame (counting pass).
    frame_uses: FxHashMap<&'a Frame, u32>,
}

impl<'a> Encoder<'a> {
    /// An interned string value.
    fn s(&mut self, s: &'a str) -> Value {
        self.strings
            .entry(s)
            .or_insert_with(|| Value::from(s))
            .clone()
    }

    fn kv(&mut self, out: &mut Vec<(Value, Value)>, key: &'static str, v: Value) {
        let k = self.s(key);
        out.push((k, v));
    }

    fn extra(&mut self, out: &mut Vec<(Value, Value)>, extra: &'a ExtraKeys) {
        for (k, v) in &extra.0 {
            let k = self.s(k);
            out.push((k, v.clone()));
        }
    }

    fn frames(&mut self, frames: &'a Arc<[Frame]>) -> Value {
        let key = (Arc::as_ptr(frames) as *const u8 as usize, frames.len());
        if self.counting {
            let n = self.list_uses.entry(key).or_insert(0);
            *n += 1;
            if *n == 1 {
                for f in frames.iter() {
                    *self.frame_uses.entry(f).or_insert(0) += 1;
                }
            }
            return Value::None;
        }
        if let Some(v) = self.frame_lists.get(&key) {
            return v.clone();
        }
        let v = Value::list(frames.iter().map(|f| self.frame(f)).collect());
        if !self.selective || self.list_uses.get(&key).is_some_and(|&n| n > 1) {
            self.frame_lists.insert(key, v.clone());
        }
        v
    }

    fn frame(&mut self, f: &'a Frame) -> Value {
        if let Some(v) = self.frame_dicts.get(f) {
            return v.clone();
        }
        let mut d = Vec::with_capacity(3);
        let name = self.s(&f.name);
        self.kv(&mut d, "name", name);
        let filename = self.s(&f.filename);
        self.kv(&mut d, "filename", filename);
        // Negative lines stand for C++'s unsigned "no line" (see decode).
        let line = if f.line < 0 {
            Value::from(f.line as u64)
        } else {
            Value::Int(f.line)
        };
        self.kv(&mut d, "line", line);
        let v = Value::dict(d);
        if !self.selective || self.frame_uses.get(f).is_some_and(|&n| n > 1) {
            self.frame_dicts.insert(f, v.clone());
        }
        v
    }

    fn segment(&mut self, s: &'a Segment) -> Value {
        let mut d = Vec::with_capacity(12 + s.extra.0.len());
        self.kv(&mut d, "device", Value::from(s.device));
        self.kv(&mut d, "address", Value::from(s.address));
        self.kv(&mut d, "total_size", Value::from(s.total_size));
        self.kv(&mut d, "allocated_size", Value::from(s.allocated_size));
        self.kv(&mut d, "active_size", Value::from(s.active_size));
        if let Some(r) = s.requested_size {
            self.kv(&mut d, "requested_size", Value::from(r));
        }
        self.kv(&mut d, "stream", Value::from(s.stream.0));
        let ty = self.s(s.segment_type.as_str());
        self.kv(&mut d, "segment_type", ty);
        if let Some((a, b)) = s.segment_pool_id {
            self.kv(
                &mut d,
                "segment_pool_id",
                Value::tuple(vec![Value::Int(a), Value::Int(b)]),
            );
        }
        if let Some(x) = s.is_expandable {
            self.kv(&mut d, "is_expandable", Value::Bool(x));
        }
        // PyTorch inserts an empty `frames` list in order, and a gathered
        // stack after `blocks` (it symbolizes all stacks at the end).
        let late_frames = s.frames.as_ref().filter(|f| !f.is_empty());
        if let Some(f) = &s.frames {
            if late_frames.is_none() {
                let f = self.frames(f);
                self.kv(&mut d, "frames", f);
            }
        }
        let blocks = Value::list(s.blocks.iter().map(|b| self.block(b)).collect());
        self.kv(&mut d, "blocks", blocks);
        if let Some(f) = late_frames {
            let f = self.frames(f);
            self.kv(&mut d, "frames", f);
        }
        self.extra(&mut d, &s.extra);
        Value::dict(d)
    }

    fn block(&mut self, b: &'a Block) -> Value {
        let mut d = Vec::with_capacity(6 + b.extra.0.len());
        if let Some(a) = b.address {
            self.kv(&mut d, "address", Value::from(a));
        }
        self.kv(&mut d, "size", Value::from(b.size));
        if let Some(r) = b.requested_size {
            self.kv(&mut d, "requested_size", Value::from(r));
        }
        let state = self.s(b.state.as_str());
        self.kv(&mut d, "state", state);
        if let Some(f) = &b.frames {
            let f = self.frames(f);
            self.kv(&mut d, "frames", f);
        }
        if let Some(h) = &b.history {
            let h = Value::list(h.iter().map(|x| self.history(x)).collect());
            self.kv(&mut d, "history", h);
        }
        self.extra(&mut d, &b.extra);
        Value::dict(d)
    }

    fn history(&mut self, h: &'a BlockHistory) -> Value {
        let mut d = Vec::with_capacity(3 + h.extra.0.len());
        self.kv(&mut d, "addr", Value::from(h.addr));
        self.kv(&mut d, "real_size", Value::from(h.real_size));
        if let Some(f) = &h.frames {
            let f = self.frames(f);
            self.kv(&mut d, "frames", f);
        }
        self.extra(&mut d, &h.extra);
        Value::dict(d)
    }

    fn entry(&mut self, e: &'a TraceEntry) -> Value {
        let mut d = Vec::with_capacity(8);
        let action = self.s(e.action.as_str());
        self.kv(&mut d, "action", action);
        if e.action == TraceAction::Oom {
            self.kv(&mut d, "device_free", Value::from(e.addr));
        } else {
            self.kv(&mut d, "addr", Value::from(e.addr));
        }
        self.kv(&mut d, "size", Value::from(e.size));
        self.kv(&mut d, "stream", Value::from(e.stream.0));
        if let Some(t) = e.time_us {
            self.kv(&mut d, "time_us", Value::Int(t));
        }
        if let Some(c) = &e.compile_context {
            let c = self.s(c);
            self.kv(&mut d, "compile_context", c);
        }
        if let Some(u) = &e.user_metadata {
            let u = self.s(u);
            self.kv(&mut d, "user_metadata", u);
        }
        if let Some((a, b)) = e.pool_id {
            self.kv(
                &mut d,
                "pool_id",
                Value::tuple(vec![Value::Int(a), Value::Int(b)]),
            );
        }
        // PyTorch writes `frames` only on entries that kept a stack
        // (context level `alloc` or `all`); viewers default it to `[]`.
        if e.empty_frames_key || !e.frames.is_empty() {
            let frames = self.frames(&e.frames);
            self.kv(&mut d, "frames", frames);
        }
        Value::dict(d)
    }

    fn settings(&mut self, a: &'a AllocatorSettings) -> Value {
        let mut d = Vec::new();
        if let Some(c) = &a.pytorch_cuda_alloc_conf {
            let c = self.s(c);
            self.kv(&mut d, "PYTORCH_CUDA_ALLOC_CONF", c);
        }
        if let Some(x) = a.max_split_size {
            self.kv(&mut d, "max_split_size", Value::Int(x));
        }
        if let Some(x) = a.garbage_collection_threshold {
            self.kv(&mut d, "garbage_collection_threshold", Value::Float(x));
        }
        if let Some(x) = a.expandable_segments {
            self.kv(&mut d, "expandable_segments", Value::Bool(x));
        }
        if let Some(x) = a.pinned_num_register_threads {
            self.kv(&mut d, "pinned_num_register_threads", Value::Int(x));
        }
        if let Some(x) = a.release_lock_on_cudamalloc {
            self.kv(&mut d, "release_lock_on_cudamalloc", Value::Bool(x));
        }
        if let Some(x) = a.pinned_use_cuda_host_register {
            self.kv(&mut d, "pinned_use_cuda_host_register", Value::Bool(x));
        }
        if let Some(x) = a.graph_capture_record_stream_reuse {
            self.kv(&mut d, "graph_capture_record_stream_reuse", Value::Bool(x));
        }
        if let Some(x) = a.max_round_threshold {
            self.kv(&mut d, "max_round_threshold", Value::Int(x));
        }
        if let Some(x) = a.max_cached_size {
            self.kv(&mut d, "max_cached_size", Value::Int(x));
        }
        if let Some(r) = &a.roundup_power2_divisions {
            let pairs = r
                .iter()
                .map(|(k, v)| (Value::from(k.to_string()), Value::from(*v)))
                .collect();
            self.kv(&mut d, "roundup_power2_divisions", Value::dict(pairs));
        }
        self.extra(&mut d, &a.extra);
        Value::dict(d)
    }

    fn annotation(&mut self, a: &'a ExternalAnnotation) -> Value {
        let mut d = Vec::new();
        if let Some(s) = &a.stage {
            let s = self.s(s);
            self.kv(&mut d, "stage", s);
        }
        if let Some(s) = &a.name {
            let s = self.s(s);
            self.kv(&mut d, "name", s);
        }
        if let Some(x) = a.device {
            self.kv(&mut d, "device", Value::Int(x));
        }
        if let Some(x) = a.time_us {
            self.kv(&mut d, "time_us", Value::Int(x));
        }
        self.extra(&mut d, &a.extra);
        Value::dict(d)
    }
}
