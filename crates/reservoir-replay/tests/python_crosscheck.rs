//! Cross-check against Python: every real trace under `../shared/traces`
//! (recursive) is loaded, its format detected, and — for snapshot pickles —
//! written back with this crate's writer and read again (read → write →
//! read must give an identical model). The written pickles are then loaded
//! by CPython's own `pickle` module (no torch needed) and put through the
//! checks `torch/cuda/_memory_viz.py` and `MemoryViz.js` rely on:
//!
//! * per segment, `total_size` = sum of block sizes, `allocated_size` = sum
//!   of `active_allocated` block sizes, `active_size` = sum of non-inactive
//!   block sizes (and `segsum`'s "allocated + free == total" follows);
//! * block `address`es are the running sum from the segment address;
//! * block states are the three the viewers know, every non-inactive block
//!   has `frames` or a legacy `history`;
//! * every `device_traces` entry has `action` (a known one), `size`,
//!   `stream`, and `addr` (or `device_free` for `oom`), and its `frames`, if
//!   present, are dicts with `name`, `filename`, `line`.
//!
//! Without `python3` the Python half prints why and is skipped (CI has it);
//! without the traces folder the whole test is skipped. Run with
//! `cargo test -p reservoir-replay --test python_crosscheck -- --nocapture` to see
//! the per-file table.

use std::path::PathBuf;
use std::process::Command;

use reservoir::observe::snapshot::Snapshot;
use reservoir_replay::input::{self, InputFormat, LoadedContent, ReadSnapshot};
use reservoir_testkit::traces::{shared_traces, trace_files};

const PY: &str = r#"
import pickle, sys
STATES = {"active_allocated", "active_pending_free", "inactive"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "snapshot", "oom", "annotate"}

def frames_ok(fr, where):
    if not isinstance(fr, list):
        return f"{where}.frames is not a list"
    for j, f in enumerate(fr):
        if not isinstance(f, dict) or not {"name", "filename", "line"} <= set(f):
            return f"{where}.frames[{j}] lacks name/filename/line"
    return None

def check(path):
    with open(path, "rb") as f:
        data = pickle.load(f)
    if isinstance(data, list):
        data = {"segments": data, "device_traces": []}
    for i, seg in enumerate(data["segments"]):
        w = f"segments[{i}]"
        for k in ("device", "address", "total_size", "allocated_size", "active_size", "stream", "segment_type", "blocks"):
            if k not in seg:
                return f"{w} lacks {k}"
        blocks = seg["blocks"]
        total = alloc = active = 0
        addr = seg["address"]
        for j, b in enumerate(blocks):
            bw = f"{w}.blocks[{j}]"
            if b["state"] not in STATES:
                return f"{bw}.state {b['state']!r}"
            if "frames" in b:
                r = frames_ok(b["frames"], bw)
                if r: return r
            elif "history" not in b and b["state"] != "inactive":
                # (inactive legacy blocks may lack both: the viewers fall
                # back to the size, and PyTorch 2.0 wrote such blocks)
                return f"{bw} has neither frames nor history"
            if "address" in b and b["address"] != addr:
                return f"{bw}.address {b['address']} != running sum {addr}"
            addr += b["size"]
            total += b["size"]
            if b["state"] == "active_allocated":
                alloc += b["size"]
            if b["state"] != "inactive":
                active += b["size"]
        if seg["total_size"] != total:
            return f"{w}.total_size {seg['total_size']} != sum of block sizes {total}"
        if seg["allocated_size"] != alloc:
            return f"{w}.allocated_size {seg['allocated_size']} != {alloc}"
        if seg["active_size"] != active:
            return f"{w}.active_size {seg['active_size']} != {active}"
        free = total - active
        if alloc + (active - alloc) + free != seg["total_size"]:
            return f"{w}: segsum does not add up"
    n = 0
    for d, trace in enumerate(data.get("device_traces", [])):
        for i, e in enumerate(trace):
            w = f"device_traces[{d}][{i}]"
            n += 1
            if e.get("action") not in ACTIONS:
                return f"{w}.action {e.get('action')!r}"
            need = ["size", "stream"] + (["device_free"] if e["action"] == "oom" else ["addr"])
            for k in need:
                if k not in e:
                    return f"{w} lacks {k}"
            if "frames" in e:
                r = frames_ok(e["frames"], w)
                if r: return r
    return f"ok {len(data['segments'])} segments, {n} trace entries"

bad = 0
for p in sys.argv[1:]:
    try:
        r = check(p)
    except Exception as ex:
        r = f"{type(ex).__name__}: {ex}"
    if not r.startswith("ok"):
        bad += 1
    print(f"{p}\t{r}")
print(f"checked {len(sys.argv) - 1} files, {bad} failed")
"#;

fn python3() -> Option<&'static str> {
    Command::new("python3")
        .args(["-c", "import pickle"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| "python3")
}

struct Row {
    file: String,
    format: String,
    result: String,
}

#[test]
fn real_traces_round_trip_and_load_in_python() {
    let Some(dir) = shared_traces() else {
        println!("skipping: ../shared/traces not found (set RESERVOIR_TRACES to its path)");
        return;
    };
    let tmp = std::env::temp_dir().join(format!("reservoir-pycheck-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut written = Vec::new();
    for (i, f) in trace_files(&dir).iter().enumerate() {
        let name = f
            .strip_prefix(&dir)
            .unwrap_or(f)
            .to_string_lossy()
            .replace('\\', "/");
        let data = std::fs::read(f).unwrap();
        let (format, result) = match input::load_bytes(&data) {
            Err(e) => {
                failures.push(format!("{name}: does not load: {e}"));
                ("?".to_string(), format!("LOAD ERROR: {e}"))
            }
            Ok(l) => {
                let format = match l.format {
                    InputFormat::Snapshot(s) => format!("pickle, {s}"),
                    other => other.to_string(),
                };
                let result = match &l.content {
                    LoadedContent::Snapshot(s) => match round_trip(s) {
                        Ok(bytes) => {
                            let out = tmp.join(format!("{i:03}.pickle"));
                            std::fs::write(&out, &bytes).unwrap();
                            written.push((name.clone(), out));
                            format!(
                                "ok ({} B → {} B, {} segments, {} trace entries)",
                                data.len(),
                                bytes.len(),
                                s.segments.len(),
                                s.num_trace_entries()
                            )
                        }
                        Err(e) => {
                            failures.push(format!("{name}: {e}"));
                            format!("FAIL: {e}")
                        }
                    },
                    LoadedContent::Events(t) => {
                        let n: usize = t.devices.iter().map(|d| d.events.len()).sum();
                        format!("read ok ({n} events); no writer for this format")
                    }
                };
                (format, result)
            }
        };
        rows.push(Row {
            file: name,
            format,
            result,
        });
    }
    // Python half.
    let mut py_status = std::collections::BTreeMap::new();
    let python_note = match python3() {
        None => "python3 not found: Python cross-check skipped".to_string(),
        Some(py) => {
            let out = Command::new(py)
                .arg("-c")
                .arg(PY)
                .args(written.iter().map(|(_, p)| p))
                .output()
                .expect("run python3");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            if !out.status.success() || !stdout.contains("checked") {
                failures.push(format!(
                    "python3 failed: {stdout}{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            for line in stdout.lines() {
                if let Some((p, r)) = line.split_once('\t') {
                    py_status.insert(PathBuf::from(p), r.to_string());
                }
            }
            stdout.lines().last().unwrap_or("").to_string()
        }
    };
    let _ = std::fs::remove_dir_all(&tmp);
    for (name, p) in &written {
        if let Some(r) = py_status.get(p) {
            if !r.starts_with("ok") {
                failures.push(format!("{name}: python: {r}"));
            }
        }
    }
    let py_of = |file: &str| -> String {
        written
            .iter()
            .find(|(n, _)| n == file)
            .and_then(|(_, p)| py_status.get(p))
            .map(|r| {
                if r.starts_with("ok") {
                    "ok".to_string()
                } else {
                    r.clone()
                }
            })
            .unwrap_or_else(|| "–".to_string())
    };
    println!(
        "| file | detected format | read → write → read | python pickle + _memory_viz checks |"
    );
    println!("|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {} |",
            r.file,
            r.format,
            r.result,
            py_of(&r.file)
        );
    }
    println!("{} files; {python_note}", rows.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Write the snapshot and read it back; the model must be identical.
fn round_trip(s: &Snapshot) -> Result<Vec<u8>, String> {
    let bytes = s.to_pickle().map_err(|e| format!("write: {e}"))?;
    let back = Snapshot::from_pickle(&bytes).map_err(|e| format!("re-read: {e}"))?;
    if &back != s {
        return Err("re-read model differs from the original".into());
    }
    Ok(bytes)
}
