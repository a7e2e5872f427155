//! Snapshot and pickle I/O against every real trace in `../shared/traces`,
//! plus hostile inputs.
//!
//! For each file: it loads; write → read gives an identical model; the
//! consistency checks pass; where `SOURCES.md` lists figures for the file
//! (entries, action counts, segments, streams, pre-trace frees) they match;
//! and, when `python3` is available, Python's `pickle` loads the written
//! file, finds only opcodes `MemoryViz.js` reads, finds the same data as in
//! the original, and passes `_memory_viz.py`'s per-segment checks.
//!
//! The traces folder is `../shared/traces` beside the workspace, or
//! `RESERVOIR_TRACES` (`reservoir_testkit::traces::shared_traces`).
//! Without it the real-file test prints why and passes. Run with
//! `--nocapture` to see the table of files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use proptest::prelude::*;
use reservoir::observe::pickle::{Value, WriteOptions};
use reservoir::observe::snapshot::{
    AllocatorSettings, Block, BlockHistory, BlockState, ExternalAnnotation, ExtraKeys, Segment,
    SegmentType, Snapshot,
};
use reservoir::observe::trace::{Frame, TraceAction, TraceEntry};
use reservoir::StreamId;
use reservoir_replay::input::{
    self, AddressKind, InputFormat, LoadedContent, ReadSnapshot, SnapshotFormat,
};
use reservoir_replay::pickle::{self, Limits, PickleErrorKind};
use reservoir_testkit::traces::{shared_traces, trace_files};

// ---------------------------------------------------------------------------
// Locating the traces

fn rel(dir: &Path, f: &Path) -> String {
    f.strip_prefix(dir)
        .unwrap_or(f)
        .to_string_lossy()
        .replace('\\', "/")
}

// ---------------------------------------------------------------------------
// Figures from SOURCES.md

/// Table rows of SOURCES.md, keyed by `folder/file`, as column → cell maps
/// (several rows per file for multi-device traces).
fn parse_sources(path: &Path) -> BTreeMap<String, Vec<BTreeMap<String, String>>> {
    let mut out: BTreeMap<String, Vec<BTreeMap<String, String>>> = BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(path) else {
        return out;
    };
    let mut header: Option<Vec<String>> = None;
    for line in text.lines() {
        let line = line.trim();
        if !line.starts_with('|') {
            header = None;
            continue;
        }
        let cells: Vec<String> = line
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect();
        if cells
            .iter()
            .all(|c| c.chars().all(|ch| ch == '-' || ch == ':'))
        {
            continue;
        }
        match &header {
            None => header = Some(cells),
            Some(h) => {
                let row: BTreeMap<String, String> = h.iter().cloned().zip(cells).collect();
                if let Some(name) = row.get("folder/file") {
                    out.entry(name.clone()).or_default().push(row);
                }
            }
        }
    }
    out
}

fn num(row: &BTreeMap<String, String>, col: &str) -> Option<u64> {
    row.get(col)?.parse().ok()
}

fn nums(row: &BTreeMap<String, String>, col: &str) -> Option<Vec<u64>> {
    let cell = row.get(col)?;
    let v: Vec<u64> = cell
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    (!v.is_empty()).then_some(v)
}

/// Compare a snapshot with the figures SOURCES.md gives for it.
fn check_against_sources(
    snap: &Snapshot,
    rows: &[BTreeMap<String, String>],
) -> Result<usize, String> {
    let mut checked = 0;
    for row in rows {
        if let Some(segs) = num(row, "segments").or_else(|| num(row, "segs")) {
            if segs != snap.segments.len() as u64 {
                return Err(format!(
                    "SOURCES.md says {segs} segments, read {}",
                    snap.segments.len()
                ));
            }
            checked += 1;
        }
        // The column counts history entries over all blocks.
        if let Some(h) = num(row, "blocks w/ history") {
            let n: usize = snap
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .map(|b| b.history.as_ref().map_or(0, Vec::len))
                .sum();
            if h != n as u64 {
                return Err(format!(
                    "SOURCES.md says {h} block-history entries, read {n}"
                ));
            }
            checked += 1;
        }
        if let Some(devs) = row.get("devices").filter(|d| d.starts_with('[')) {
            let mut d: Vec<u32> = snap.segments.iter().map(|s| s.device).collect();
            d.sort_unstable();
            d.dedup();
            let want = format!("{d:?}");
            if &want != devs {
                return Err(format!("SOURCES.md says devices {devs}, read {want}"));
            }
            checked += 1;
        }
        let Some(dev) = num(row, "dev") else { continue };
        let empty = Vec::new();
        let trace = snap.device_traces.get(dev as usize).unwrap_or(&empty);
        let count = |a: TraceAction| trace.iter().filter(|e| e.action == a).count() as u64;
        if let Some(n) = num(row, "entries") {
            if n != trace.len() as u64 {
                return Err(format!(
                    "SOURCES.md says {n} entries on device {dev}, read {}",
                    trace.len()
                ));
            }
            checked += 1;
        }
        use TraceAction::*;
        if let Some(v) = nums(row, "alloc / free_req / free_compl") {
            let got = vec![count(Alloc), count(FreeRequested), count(FreeCompleted)];
            if v != got {
                return Err(format!(
                    "SOURCES.md says alloc/free_req/free_compl {v:?}, read {got:?}"
                ));
            }
            checked += 1;
        }
        if let Some(v) = nums(row, "seg_alloc/free (map/unmap)") {
            let got = vec![
                count(SegmentAlloc),
                count(SegmentFree),
                count(SegmentMap),
                count(SegmentUnmap),
            ];
            if v != got {
                return Err(format!(
                    "SOURCES.md says segment events {v:?}, read {got:?}"
                ));
            }
            checked += 1;
        }
        if let Some(n) = num(row, "oom") {
            if n != count(Oom) {
                return Err(format!("SOURCES.md says {n} ooms, read {}", count(Oom)));
            }
            checked += 1;
        }
        if let Some(n) = num(row, "streams") {
            let s: BTreeSet<u64> = trace.iter().map(|e| e.stream.0).collect();
            if n != s.len() as u64 {
                return Err(format!("SOURCES.md says {n} streams, read {}", s.len()));
            }
            checked += 1;
        }
        if let Some(n) = num(row, "pre-trace frees") {
            let mut seen = BTreeSet::new();
            let mut pre = 0u64;
            for e in trace {
                match e.action {
                    Alloc => {
                        seen.insert(e.addr);
                    }
                    FreeCompleted if !seen.contains(&e.addr) => pre += 1,
                    _ => {}
                }
            }
            if n != pre {
                return Err(format!(
                    "SOURCES.md says {n} pre-trace frees, counted {pre}"
                ));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

// ---------------------------------------------------------------------------
// The real files

struct Row {
    file: String,
    format: String,
    segments: String,
    entries: usize,
    result: String,
}

/// Loads, checks and round-trips one file; returns its table row and, for
/// pickles, the written copy for Python to check.
fn check_file(
    dir: &Path,
    f: &Path,
    out_dir: &Path,
    sources: &BTreeMap<String, Vec<BTreeMap<String, String>>>,
) -> Result<(Row, Option<PathBuf>), String> {
    let name = rel(dir, f);
    let loaded = input::load(f).map_err(|e| format!("load: {e}"))?;
    let input = loaded.to_trace_input();
    match &loaded.content {
        LoadedContent::Snapshot(snap) => {
            snap.check_consistency()
                .map_err(|e| format!("consistency: {e}"))?;
            if !loaded.warnings.is_empty() {
                return Err(format!("unexpected warnings: {:?}", loaded.warnings));
            }
            let figures = match sources.get(&name) {
                Some(rows) => check_against_sources(snap, rows)?,
                None => 0,
            };
            let bytes = snap.to_pickle().map_err(|e| format!("write: {e}"))?;
            let back = Snapshot::from_pickle(&bytes).map_err(|e| format!("re-read: {e}"))?;
            if &back != snap {
                return Err("write -> read gives a different model".into());
            }
            // Protocol 2 (no frames, BINPUT memo) must round-trip too (checked
            // on the smaller files, to keep the test quick).
            let small = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0) < 1_000_000;
            let p2 = if !small {
                Ok(bytes.clone())
            } else {
                snap.to_pickle_with(&WriteOptions {
                    protocol: 2,
                    ..WriteOptions::default()
                })
                .map_err(|e| format!("write p2: {e}"))
            }?;
            if Snapshot::from_pickle(&p2).map_err(|e| format!("re-read p2: {e}"))? != *snap {
                return Err("protocol-2 write -> read gives a different model".into());
            }
            // JSON expands every shared stack: check the export on the smaller files.
            if small {
                serde_json::from_str::<serde_json::Value>(
                    &snap.to_json().map_err(|e| format!("json: {e}"))?,
                )
                .map_err(|e| format!("json re-parse: {e}"))?;
            }
            memoryviz_opcodes_only(&bytes)?;
            let written = out_dir.join(name.replace('/', "__"));
            std::fs::write(&written, &bytes).map_err(|e| format!("{}: {e}", written.display()))?;
            let segs = snap.segments.len().to_string();
            let result = format!(
                "identical ({} -> {} bytes{})",
                std::fs::metadata(f).map(|m| m.len()).unwrap_or(0),
                bytes.len(),
                if figures > 0 {
                    format!(", {figures} SOURCES.md figures match")
                } else {
                    String::new()
                }
            );
            let row = Row {
                file: name,
                format: loaded.format.to_string(),
                segments: segs,
                entries: snap.num_trace_entries(),
                result,
            };
            Ok((row, Some(written)))
        }
        LoadedContent::Events(trace) => {
            check_events(trace)?;
            let dev = &trace.devices[0];
            let allocs = dev
                .events
                .iter()
                .filter(|e| e.action == TraceAction::Alloc)
                .count();
            let frees = dev
                .events
                .iter()
                .filter(|e| e.action == TraceAction::FreeCompleted)
                .count();
            // Figures SOURCES.md states in prose for these files.
            let expected: Option<(usize, usize)> = match name.as_str() {
                n if n.ends_with("031e31d6_assets_trace.alloc_data.json") => Some((458, 206)),
                n if n.ends_with("8e2fcf7d_assets_cudagraph.alloc_data.json") => Some((2206, 2004)),
                n if n.ends_with("07702e3a_input_alexnet_train.log") => Some((193, 193)),
                _ => None,
            };
            if let Some(want) = expected {
                if want != (allocs, frees) {
                    return Err(format!(
                        "expected {want:?} allocs/frees, read {:?}",
                        (allocs, frees)
                    ));
                }
            }
            let row = Row {
                file: name,
                format: loaded.format.to_string(),
                segments: "-".into(),
                entries: input.num_events(),
                result: format!(
                    "{allocs} allocs / {frees} frees, {:?} addresses (no pickle to round-trip)",
                    trace.addresses
                ),
            };
            Ok((row, None))
        }
    }
}

/// Walks a pickle the writer produced: only opcodes `MemoryViz.js` reads
/// (spec 2.6), `PROTO` 2 to 4, and `FRAME` lengths that land on opcode
/// boundaries.
fn memoryviz_opcodes_only(data: &[u8]) -> Result<(), String> {
    use reservoir::observe::pickle::op::*;
    let mut i = 0;
    let mut frame_end = None;
    while i < data.len() {
        if frame_end == Some(i) {
            frame_end = None;
        }
        let o = data[i];
        let arg = |n: usize| -> Result<usize, String> {
            data.get(i + 1..i + 1 + n)
                .map(|_| n)
                .ok_or_else(|| format!("truncated opcode at {i}"))
        };
        let len_at = |n: usize| -> Result<usize, String> {
            let b = data
                .get(i + 1..i + 1 + n)
                .ok_or_else(|| format!("truncated opcode at {i}"))?;
            Ok(b.iter().rev().fold(0usize, |a, &x| a << 8 | usize::from(x)))
        };
        let skip = match o {
            PROTO => {
                let v = *data.get(i + 1).ok_or("truncated PROTO")?;
                if !(2..=4).contains(&v) {
                    return Err(format!("PROTO {v}"));
                }
                1
            }
            FRAME => {
                if frame_end.is_some() {
                    return Err(format!("FRAME at {i} inside a frame"));
                }
                frame_end = Some(i + 9 + len_at(8)?);
                8
            }
            BININT1 | BINGET | BINPUT => arg(1)?,
            BININT2 => arg(2)?,
            BININT | LONG_BINGET | LONG_BINPUT => arg(4)?,
            BINFLOAT => arg(8)?,
            LONG1 | SHORT_BINUNICODE => 1 + len_at(1)?,
            BINUNICODE => 4 + len_at(4)?,
            MARK | STOP | EMPTY_DICT | EMPTY_LIST | EMPTY_TUPLE | DICT | LIST | TUPLE | TUPLE1
            | TUPLE2 | TUPLE3 | SETITEM | SETITEMS | APPEND | APPENDS | NEWTRUE | NEWFALSE
            | NONE | MEMOIZE => 0,
            other => {
                return Err(format!(
                    "opcode {:?} at {i} is not read by MemoryViz.js",
                    reservoir::observe::pickle::opcode_name(other)
                ))
            }
        };
        i += 1 + skip;
        if let Some(end) = frame_end {
            if i > end {
                return Err(format!(
                    "opcode ending at {i} straddles the frame ending at {end}"
                ));
            }
        }
    }
    if data.last() != Some(&STOP) || frame_end.is_some_and(|e| e != data.len()) {
        return Err("pickle does not end with STOP at a frame boundary".into());
    }
    Ok(())
}

/// Every free matches a live allocation of the same size; allocations never
/// reuse a live address.
fn check_events(t: &input::TraceInput) -> Result<(), String> {
    for d in &t.devices {
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        for b in d.initially_allocated.iter().flatten() {
            live.insert(b.addr, b.size);
        }
        for (i, e) in d.events.iter().enumerate() {
            match e.action {
                TraceAction::Alloc => {
                    if live.insert(e.addr, e.size).is_some() {
                        return Err(format!("event {i}: alloc of live address {:#x}", e.addr));
                    }
                }
                TraceAction::FreeRequested => {
                    if live.get(&e.addr) != Some(&e.size) {
                        return Err(format!(
                            "event {i}: free of {:#x} which is not live",
                            e.addr
                        ));
                    }
                }
                TraceAction::FreeCompleted => {
                    live.remove(&e.addr)
                        .ok_or(format!("event {i}: completed free of dead {:#x}", e.addr))?;
                }
                other => return Err(format!("event {i}: unexpected {other}")),
            }
        }
    }
    Ok(())
}

const PY_CHECK: &str = r#"
import pickle, pickletools, sys
ALLOWED = {"PROTO", "FRAME", "MARK", "STOP", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "DICT", "LIST",
           "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM", "SETITEMS", "APPEND", "APPENDS", "BININT",
           "BININT1", "BININT2", "LONG1", "BINFLOAT", "NEWTRUE", "NEWFALSE", "NONE", "SHORT_BINUNICODE",
           "BINUNICODE", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET", "LONG_BINGET"}

def norm(d):
    if isinstance(d, list):
        d = {"segments": d, "device_traces": []}
    for t in d.get("device_traces", []):
        for e in t:
            if e.get("action") == "oom" and "device_free" in e:
                e.pop("addr", None)
    return d

def diff(a, b, path="<root>"):
    if type(a) is not type(b):
        return f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, dict):
        if set(a) != set(b):
            return f"{path}: keys {sorted(set(a) ^ set(b))} differ"
        for k in a:
            r = diff(a[k], b[k], f"{path}.{k}")
            if r: return r
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            r = diff(x, y, f"{path}[{i}]")
            if r: return r
    elif a != b:
        return f"{path}: {a!r} vs {b!r}"
    return None

def check(orig, written):
    data = open(written, "rb").read()
    # pickletools is slow pure Python: the Rust side walks every file's
    # opcodes; Python double-checks the smaller ones.
    if len(data) < 300_000:
        ops = set()
        for op, arg, pos in pickletools.genops(data):
            ops.add(op.name)
            if op.name == "PROTO" and not 2 <= arg <= 4:
                return f"PROTO {arg}"
        if not ops <= ALLOWED:
            return f"opcodes MemoryViz.js cannot read: {sorted(ops - ALLOWED)}"
    w = pickle.loads(data)
    for i, s in enumerate(w["segments"]):
        bl = s["blocks"]
        if s["total_size"] != sum(b["size"] for b in bl):
            return f"segments[{i}]: total_size != sum of block sizes"
        if s["allocated_size"] != sum(b["size"] for b in bl if b["state"] == "active_allocated"):
            return f"segments[{i}]: allocated_size != sum of active_allocated sizes"
        if s["active_size"] != sum(b["size"] for b in bl if b["state"] != "inactive"):
            return f"segments[{i}]: active_size != sum of active sizes"
    if orig != "-":
        with open(orig, "rb") as f:
            o = norm(pickle.load(f))
        if o != w:
            return "differs from the original: " + str(diff(o, w))
    return None

args = sys.argv[1:]
bad = 0
for orig, written in zip(args[0::2], args[1::2]):
    try:
        r = check(orig, written)
    except Exception as e:
        r = f"{type(e).__name__}: {e}"
    if r:
        bad += 1
        print(f"FAIL {written}: {r}")
print(f"checked {len(args) // 2} files, {bad} failed")
"#;

fn python3() -> Option<&'static str> {
    Command::new("python3")
        .arg("-c")
        .arg("pass")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}

/// Runs the Python checks on (original or "-", written) pairs; returns failures.
fn python_check(pairs: &[(String, PathBuf)]) -> Result<Vec<String>, String> {
    let Some(py) = python3() else {
        return Err("python3 not found".into());
    };
    let mut cmd = Command::new(py);
    cmd.arg("-c").arg(PY_CHECK);
    for (o, w) in pairs {
        cmd.arg(o).arg(w);
    }
    let out = cmd.output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() || !stdout.contains("checked") {
        return Err(format!(
            "python3 failed: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .map(str::to_string)
        .collect())
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("reservoir-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn real_trace_files() {
    let Some(dir) = shared_traces() else {
        println!("skipping real_trace_files: ../shared/traces not found (set RESERVOIR_TRACES to its path)");
        return;
    };
    let files = trace_files(&dir);
    if files.is_empty() {
        println!("skipping real_trace_files: no files in {}", dir.display());
        return;
    }
    let sources = parse_sources(&dir.join("SOURCES.md"));
    let tmp = TempDir::new("snapshot-files");
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut pairs = Vec::new();
    for f in &files {
        match check_file(&dir, f, &tmp.0, &sources) {
            Ok((row, written)) => {
                if let Some(w) = written {
                    pairs.push((f.to_string_lossy().into_owned(), w));
                }
                rows.push(row);
            }
            Err(e) => failures.push(format!("{}: {e}", rel(&dir, f))),
        }
    }
    let python = match python_check(&pairs) {
        Ok(fails) => {
            let ok = fails.is_empty();
            failures.extend(fails);
            if ok {
                format!(
                    "python3: all {} written pickles load and match",
                    pairs.len()
                )
            } else {
                "python3: FAILURES".into()
            }
        }
        Err(e) if e == "python3 not found" => format!("python3 checks skipped: {e}"),
        Err(e) => {
            failures.push(e);
            "python3: error".into()
        }
    };
    println!("| file | detected format | segments | trace entries | round trip |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.file, r.format, r.segments, r.entries, r.result
        );
    }
    println!("{} files, {python}", files.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

// ---------------------------------------------------------------------------
// A synthetic snapshot exercising every field (used when no traces exist too)

fn frames(n: usize, tag: &str) -> Arc<[Frame]> {
    (0..n)
        .map(|i| Frame {
            name: format!("f{i}_{tag}"),
            filename: format!("/src/{tag}.py"),
            line: i as i64 + 1,
        })
        .collect::<Vec<_>>()
        .into()
}

fn synthetic() -> Snapshot {
    let stack = frames(4, "model");
    let mut cpp = frames(2, "cpp").to_vec();
    cpp[1].line = -1; // C++ frames without a line number
    let cpp: Arc<[Frame]> = cpp.into();
    let mut entries = Vec::new();
    for (i, a) in TraceAction::ALL.into_iter().enumerate() {
        let mut e = TraceEntry::new(
            a,
            0x7f00_0000_0000 + i as u64 * 512,
            512,
            StreamId(i as u64 % 2),
        );
        e.time_us = Some(1_700_000_000_000_000 + i as i64);
        e.frames = if i % 2 == 0 {
            stack.clone()
        } else {
            cpp.clone()
        };
        e.compile_context = Some("N/A".into());
        e.user_metadata = Some(String::new());
        entries.push(e);
    }
    let seg = Segment {
        device: 0,
        address: 0x7f00_0000_0000,
        total_size: 2 << 20,
        allocated_size: 1024,
        active_size: 1536,
        requested_size: Some(1500),
        stream: StreamId(0),
        segment_type: SegmentType::Small,
        segment_pool_id: Some((0, 0)),
        is_expandable: Some(false),
        frames: Some(stack.clone()),
        blocks: vec![
            Block {
                address: Some(0x7f00_0000_0000),
                size: 1024,
                requested_size: Some(1000),
                state: BlockState::ActiveAllocated,
                frames: Some(stack.clone()),
                ..Block::default()
            },
            Block {
                address: Some(0x7f00_0000_0400),
                size: 512,
                requested_size: Some(500),
                state: BlockState::ActivePendingFree,
                frames: Some(cpp.clone()),
                ..Block::default()
            },
            Block {
                address: Some(0x7f00_0000_0600),
                size: (2 << 20) - 1536,
                requested_size: Some(7),
                state: BlockState::Inactive,
                frames: Some(Arc::from(Vec::new())),
                extra: ExtraKeys(vec![("future_key".into(), Value::from("kept"))]),
                ..Block::default()
            },
        ],
        extra: ExtraKeys::default(),
    };
    let legacy = Segment {
        device: 1,
        address: 0x8000_0000,
        total_size: 20 << 20,
        allocated_size: 20 << 20,
        active_size: 20 << 20,
        requested_size: None,
        stream: StreamId(u64::MAX),
        segment_type: SegmentType::Large,
        blocks: vec![Block {
            size: 20 << 20,
            requested_size: Some(19 << 20),
            state: BlockState::ActiveAllocated,
            history: Some(vec![BlockHistory {
                addr: 0x8000_0000,
                real_size: 19 << 20,
                frames: Some(stack.clone()),
                ..BlockHistory::default()
            }]),
            ..Block::default()
        }],
        ..Segment::default()
    };
    Snapshot {
        segments: vec![seg, legacy],
        device_traces: vec![entries, Vec::new()],
        allocator_settings: Some(AllocatorSettings {
            pytorch_cuda_alloc_conf: Some("expandable_segments:True".into()),
            max_split_size: Some(-1),
            garbage_collection_threshold: Some(0.5),
            expandable_segments: Some(true),
            roundup_power2_divisions: Some(vec![(1, 0), (2, 4)]),
            extra: ExtraKeys(vec![("new_setting".into(), Value::Int(3))]),
            ..AllocatorSettings::default()
        }),
        external_annotations: Some(vec![ExternalAnnotation {
            stage: Some("START".into()),
            name: Some("step".into()),
            device: Some(0),
            time_us: Some(5),
            extra: ExtraKeys(vec![(
                "user".into(),
                Value::list(vec![Value::Int(1), Value::None]),
            )]),
        }]),
        extra: ExtraKeys(vec![("host_segments".into(), Value::list(vec![]))]),
    }
}

#[test]
fn synthetic_snapshot_round_trips_everywhere() {
    let snap = synthetic();
    snap.check_consistency().unwrap();
    for protocol in 2..=4 {
        let bytes = snap
            .to_pickle_with(&WriteOptions {
                protocol,
                ..WriteOptions::default()
            })
            .unwrap();
        let loaded = input::load_bytes(&bytes).unwrap();
        assert_eq!(
            loaded.format,
            InputFormat::Snapshot(SnapshotFormat::Pytorch2_0)
        );
        assert_eq!(loaded.snapshot(), Some(&snap), "protocol {protocol}");
    }
    let json: serde_json::Value = serde_json::from_str(&snap.to_json().unwrap()).unwrap();
    assert_eq!(json["segments"][0]["blocks"][2]["future_key"], "kept");
    assert_eq!(
        json["segments"][0]["blocks"][1]["state"],
        "active_pending_free"
    );
    assert_eq!(
        json["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"],
        "expandable_segments:True"
    );
    assert_eq!(json["host_segments"], serde_json::json!([]));
    // Python reads it too.
    let tmp = TempDir::new("synthetic");
    let w = tmp.0.join("synthetic.pickle");
    std::fs::write(&w, snap.to_pickle().unwrap()).unwrap();
    match python_check(&[("-".into(), w)]) {
        Ok(f) => assert!(f.is_empty(), "{f:?}"),
        Err(e) if e == "python3 not found" => println!("python3 not found; skipped"),
        Err(e) => panic!("{e}"),
    }
    // The trace input view.
    let t = snap.to_trace_input();
    assert_eq!(t.addresses, AddressKind::Device);
    assert_eq!(
        t.devices.iter().map(|d| d.device).collect::<Vec<_>>(),
        vec![0, 1]
    );
    assert_eq!(t.devices[0].events.len(), TraceAction::ALL.len());
    assert_eq!(t.devices[1].final_segments.as_ref().unwrap().len(), 1);
}

#[test]
fn inconsistencies_are_reported() {
    let mut snap = synthetic();
    snap.segments[0].allocated_size += 1;
    snap.segments[0].blocks[1].address = Some(1);
    snap.segments[1].address = snap.segments[0].address + 4096;
    snap.segments[1].device = 0;
    let err = snap.check_consistency().unwrap_err();
    let text: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(text.len(), 3, "{text:?}");
    assert!(
        text[0].starts_with("segments[0].blocks[1].address is 0x1"),
        "{text:?}"
    );
    assert!(
        text[1].starts_with("segments[0].allocated_size is 1025"),
        "{text:?}"
    );
    assert_eq!(text[2], "segments[1] starts inside segments[0]");
}

// ---------------------------------------------------------------------------
// Schema errors name the path

fn set_path(v: &Value, path: &[&str], new: Value) -> Value {
    let Some((first, rest)) = path.split_first() else {
        return new;
    };
    match v {
        Value::Dict(d) => Value::dict(
            d.iter()
                .map(|(k, x)| {
                    if k.as_str() == Some(first) {
                        (k.clone(), set_path(x, rest, new.clone()))
                    } else {
                        (k.clone(), x.clone())
                    }
                })
                .collect(),
        ),
        Value::List(l) => {
            let i: usize = first.parse().unwrap();
            Value::list(
                l.iter()
                    .enumerate()
                    .map(|(j, x)| {
                        if j == i {
                            set_path(x, rest, new.clone())
                        } else {
                            x.clone()
                        }
                    })
                    .collect(),
            )
        }
        other => panic!("cannot descend into {other:?}"),
    }
}

#[test]
fn schema_errors_name_the_key() {
    let v = synthetic().to_value();
    let cases: Vec<(&[&str], Value, &str)> = vec![
        (
            &["segments", "0", "blocks", "2", "size"],
            Value::from("x"),
            "segments[0].blocks[2].size: expected int, found str \"x\"",
        ),
        (
            &["segments", "1", "address"],
            Value::Int(-5),
            "segments[1].address: expected an int in 0..2^64, found int -5",
        ),
        (
            &["segments", "0", "segment_type"],
            Value::from("huge"),
            "segments[0].segment_type: expected \"small\" or \"large\", found str \"huge\"",
        ),
        (
            &["device_traces", "0", "3", "action"],
            Value::Int(1),
            "device_traces[0][3].action: expected str, found int 1",
        ),
        (
            &["device_traces", "0", "2", "frames", "1", "line"],
            Value::None,
            "device_traces[0][2].frames[1].line: expected int, found None",
        ),
        (
            &["segments", "0", "segment_pool_id"],
            Value::Int(0),
            "segments[0].segment_pool_id: expected a pair of ints, found int 0",
        ),
        (
            &["allocator_settings", "roundup_power2_divisions", "2"],
            Value::Float(1.0),
            "allocator_settings.roundup_power2_divisions[\"2\"]: expected int, found float",
        ),
        (
            &["segments"],
            Value::Int(3),
            "segments: expected list, found int 3",
        ),
    ];
    for (path, new, want) in cases {
        let bad = set_path(&v, path, new);
        let err = Snapshot::from_value(&bad).unwrap_err();
        assert_eq!(err.to_string(), want);
    }
    // Missing keys.
    let Value::Dict(d) = &v else { unreachable!() };
    let no_segments = Value::dict(
        d.iter()
            .filter(|(k, _)| k.as_str() != Some("segments"))
            .cloned()
            .collect(),
    );
    assert_eq!(
        Snapshot::from_value(&no_segments).unwrap_err().to_string(),
        "<root>: missing key \"segments\""
    );
    // Unknown actions are skipped with a warning, unknown entry keys too.
    let bad = set_path(
        &v,
        &["device_traces", "0", "0", "action"],
        Value::from("annotate"),
    );
    let d = Snapshot::decode(&bad).unwrap();
    assert_eq!(
        d.snapshot.device_traces[0].len(),
        TraceAction::ALL.len() - 1
    );
    assert_eq!(
        d.warnings,
        vec!["skipped trace entries with unknown action \"annotate\"".to_string()]
    );
}

// ---------------------------------------------------------------------------
// Hostile input: errors, never panics

fn small_valid_pickles() -> Vec<Vec<u8>> {
    let snap = synthetic();
    let mut out = vec![
        snap.to_pickle().unwrap(),
        snap.to_pickle_with(&WriteOptions {
            protocol: 2,
            ..WriteOptions::default()
        })
        .unwrap(),
        // Python 3 protocol 0 of {'a': [1, 2.5, 'x', None, True, 10**30]}
        b"(dp0\nVa\np1\n(lp2\nI1\naF2.5\naVx\np3\naNaI01\naL1000000000000000000000000000000L\nas."
            .to_vec(),
    ];
    if let Some(dir) = shared_traces() {
        if let Some(f) = trace_files(&dir)
            .into_iter()
            .filter(|f| f.extension().is_some_and(|e| e == "pickle" || e == "pkl"))
            .min_by_key(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(u64::MAX))
        {
            out.push(std::fs::read(f).unwrap());
        }
    }
    out
}

#[test]
fn truncated_at_every_offset_is_an_error() {
    for data in small_valid_pickles() {
        assert!(pickle::from_slice(&data).is_ok());
        for n in 0..data.len() {
            let prefix = &data[..n];
            let e = pickle::from_slice(prefix).expect_err("a truncated pickle must not load");
            assert!(e.offset <= n, "offset {} beyond the input ({n})", e.offset);
            assert!(input::load_bytes(prefix).is_err());
        }
    }
}

#[test]
fn deeply_nested_lists() {
    for depth in [1_000usize, 1_000_000] {
        let mut data = vec![0x80, 4];
        data.extend(std::iter::repeat(b']').take(depth));
        data.extend(std::iter::repeat(b'a').take(depth - 1));
        data.push(b'.');
        let e = pickle::from_slice(&data).unwrap_err();
        assert!(
            matches!(
                e.kind,
                PickleErrorKind::Limit {
                    what: "nesting depth",
                    ..
                }
            ),
            "{e}"
        );
        // Mark-based nesting: ( ( ( ... l l l
        let mut data = vec![0x80, 4];
        data.extend(std::iter::repeat(b'(').take(depth));
        data.extend(std::iter::repeat(b'l').take(depth));
        data.push(b'.');
        assert!(pickle::from_slice(&data).is_err());
    }
}

#[test]
fn huge_declared_lengths() {
    for data in [
        &b"\x80\x04\x8c\xff"[..],
        b"\x80\x04X\xff\xff\xff\xffabc.",
        b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffabc.",
        b"\x80\x04\x8e\xff\xff\xff\xff\xff\xff\xff\xff.",
        b"\x80\x04\x96\xff\xff\xff\xff\xff\xff\xff\x7f.",
        b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff.",
        b"\x80\x04\x8b\xff\xff\xff\x7f.",
        b"\x80\x04B\xff\xff\xff\xff.",
        b"\x80\x04T\xff\xff\xff\x7f.",
    ] {
        let e = pickle::from_slice(data).unwrap_err();
        assert!(matches!(e.kind, PickleErrorKind::Truncated { .. }), "{e}");
    }
}

#[test]
fn every_opcode_byte_is_handled() {
    let tails: [&[u8]; 4] = [
        b"",
        b".",
        b"\x00\x00\x00\x00\x00\x00\x00\x00.",
        b"abc\ndef\n.",
    ];
    for b in 0..=255u8 {
        for prefix in [
            &b""[..],
            b"\x80\x04",
            b"\x80\x04N",
            b"\x80\x04(N",
            b"\x80\x04]N",
        ] {
            for tail in tails {
                let mut data = prefix.to_vec();
                data.push(b);
                data.extend_from_slice(tail);
                let _ = pickle::from_slice(&data);
                let _ = input::load_bytes(&data);
            }
        }
    }
}

#[test]
fn memo_abuse() {
    // GET of entries never stored.
    for data in [
        &b"\x80\x04h\x00."[..],
        b"\x80\x04j\x00\x00\x00\x80.",
        b"g7\n.",
        b"g-1\n.",
    ] {
        assert!(pickle::from_slice(data).is_err());
    }
    // A sparse PUT far away works, and does not allocate a table that big.
    let v = pickle::from_slice(b"\x80\x04Nr\xfe\xff\xff\xff0j\xfe\xff\xff\xff.").unwrap();
    assert_eq!(v, Value::None);
    // The memo limit holds.
    let limits = Limits {
        max_memo: 1000,
        ..Limits::default()
    };
    let mut data = vec![0x80, 4, b'N'];
    for i in 0..2000u32 {
        data.push(b'r');
        data.extend(i.wrapping_mul(2_654_435_761).to_le_bytes());
    }
    data.push(b'.');
    let e = pickle::from_slice_with(&data, &limits).unwrap_err();
    assert!(
        matches!(e.kind, PickleErrorKind::Limit { what: "memo", .. }),
        "{e}"
    );
    // Self-reference through the memo.
    let e = pickle::from_slice(b"\x80\x04}\x94(K\x01h\x00u.").unwrap_err();
    assert_eq!(e.kind, PickleErrorKind::Recursive);
    // Exponential sharing is bounded by the tree budget.
    let mut data = vec![0x80, 4, b'N', 0x94];
    for i in 0..80u32 {
        data.extend([b'(', b'j']);
        data.extend(i.to_le_bytes());
        data.push(b'j');
        data.extend(i.to_le_bytes());
        data.extend([b'l', 0x94]);
    }
    data.push(b'.');
    let e = pickle::from_slice(&data).unwrap_err();
    assert!(
        matches!(
            e.kind,
            PickleErrorKind::Limit {
                what: "value tree size",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn hostile_alloc_data_and_logs() {
    let cases: [(&str, &str); 6] = [
        (
            r#"{"actions":[0,0,0],"elements_size":[8]}"#,
            "actions[2]: element 0 appears a third time",
        ),
        (
            r#"{"actions":[5],"elements_size":[8]}"#,
            "actions[0]: element 5 out of range (1 elements)",
        ),
        (
            r#"{"actions":[0],"elements_size":["8"]}"#,
            "elements_size[0]: expected int, found str \"8\"",
        ),
        (
            r#"{"actions":[0],"elements_size":[8],"elements_info":[0],"suffix_table":[[0,1],[0,0]],"string_table":["a.py:1:f"]}"#,
            "elements_info[0]: suffix_table has a cycle",
        ),
        (
            r#"{"actions":[0],"elements_size":[8],"elements_info":[3],"suffix_table":[[0,null]],"string_table":["a.py:1:f"]}"#,
            "elements_info[0]: suffix 3 out of range (1 suffixes)",
        ),
        (
            r#"{"actions":[0],"elements_size":[8],"elements_info":[0],"suffix_table":[[9,null]],"string_table":[]}"#,
            "suffix_table[0][0]: string 9 out of range",
        ),
    ];
    for (json, want) in cases {
        let e = input::load_bytes(json.as_bytes()).unwrap_err();
        assert_eq!(e.to_string(), want);
    }
    let ok = input::load_bytes(
        br#"{"actions":[0,1,0],"elements_size":[8,16],"initially_allocated":[1]}"#,
    )
    .unwrap();
    assert_eq!(ok.format, InputFormat::AllocData);
    let t = ok.to_trace_input();
    assert_eq!(t.addresses, AddressKind::Synthetic);
    assert_eq!(t.devices[0].initially_allocated.as_ref().unwrap().len(), 1);
    check_events(&t).unwrap();
    for bad in [
        "0 1\n",
        "0 1 2 3\n",
        "1 0 5\n",
        "0 1 -5\n",
        "0 1 5\n1 2 5\n",
    ] {
        assert!(input::load_bytes(bad.as_bytes()).is_err(), "{bad:?}");
    }
    assert!(input::load_bytes(b"").is_err());
    assert!(input::load_bytes(b"\x00\x01").is_err());
    assert!(input::load_bytes(b"{\"x\": 1}").is_err());
    assert!(input::load_bytes(b"{not json").is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = pickle::from_slice(&data);
        let _ = input::load_bytes(&data);
        let mut with_proto = vec![0x80, 4];
        with_proto.extend(&data);
        let _ = pickle::from_slice(&with_proto);
    }

    #[test]
    fn mutated_snapshots_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let mut data = synthetic().to_pickle().unwrap();
        for (at, byte, kind) in edits {
            let i = at.index(data.len());
            match kind {
                0 => data[i] = byte,
                1 => data.insert(i, byte),
                _ => { data.remove(i); }
            }
        }
        if let Ok(loaded) = input::load_bytes(&data) {
            let _ = loaded.to_trace_input();
            if let Some(s) = loaded.snapshot() {
                let _ = s.check_consistency();
                let _ = s.to_pickle();
                let _ = s.to_json();
            }
        }
    }

    #[test]
    fn values_round_trip(v in arb_value()) {
        for protocol in 2..=4 {
            let bytes = reservoir::observe::pickle::to_vec_with(&v, &WriteOptions { protocol, ..WriteOptions::default() }).unwrap();
            prop_assert_eq!(&pickle::from_slice(&bytes).unwrap(), &v);
        }
    }
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::None),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::Int),
        any::<u64>().prop_map(Value::from),
        any::<i128>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("NaN != NaN", |f| !f.is_nan())
            .prop_map(Value::Float),
        ".{0,300}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::list),
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::tuple),
            proptest::collection::vec((inner.clone(), inner), 0..6).prop_map(Value::dict),
        ]
    })
}
