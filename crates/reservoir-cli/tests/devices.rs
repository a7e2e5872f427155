//! Snapshots of several devices, and of a device other than 0 (issue 41
//! item 5): each device's replay is its own.
//!
//! * A foreign recorder's snapshot without `allocator_settings`: expandable
//!   segments are inferred for the device that mapped pages only; the other
//!   device replays its `segment_alloc`s exactly.
//! * A recording of device 1: every out-of-memory message of its replays
//!   (the recorded setting and the what-ifs) names `GPU 1`.
//! * `reservoir diff --device A:B`: a different device on each side.
//! * The `imbalance` lever: the heaviest device of a file, or rank of a
//!   folder, made to carry the mean share of the work (issue 41 item 2).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use reservoir::backend::StreamId;
use reservoir::caching::CachingAllocator;
use reservoir::config::AllocatorConfig;
use reservoir::observe::snapshot::Snapshot;
use reservoir::observe::trace::Frame;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir_testkit::run::{run, stderr, stdout};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn reservoir(args: &[&str]) -> Output {
    run(env!("CARGO_BIN_EXE_reservoir"), args)
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("devices-{}-{name}", std::process::id()))
}

/// The snapshot of an allocator of device `index` with settings `conf`
/// that made and freed a few large allocations (sizes 64 bytes short of a
/// whole 512, so that `torch_npu`'s 32-byte padding rounds them alike).
fn recording(index: i8, conf: &str) -> Snapshot {
    let dev = SimDevice::new(SimConfig::default());
    let config = AllocatorConfig::parse(conf).unwrap();
    let alloc = CachingAllocator::with_device(dev, config, index);
    alloc.record_history(Some(usize::MAX));
    let mut held = Vec::new();
    for mib in [4, 30, 6, 50, 8] {
        held.push(alloc.raw_alloc(mib * MIB - 64, StreamId::DEFAULT).unwrap());
    }
    for p in held.drain(1..3) {
        alloc.raw_free(p).unwrap();
    }
    held.push(alloc.raw_alloc(24 * MIB - 64, StreamId::DEFAULT).unwrap());
    alloc.empty_cache().unwrap();
    alloc.snapshot(None)
}

/// The snapshot of device `index` running two steps of a batch `k` times
/// a unit: 64 MiB held throughout (other, by its lifetime), then per step
/// 30 and 20 MiB times `k` made and freed (temporaries: the work).
fn batch_recording(index: i8, k: u64) -> Snapshot {
    let dev = SimDevice::new(SimConfig::default());
    let alloc = CachingAllocator::with_device(dev, AllocatorConfig::default(), index);
    alloc.record_history(Some(usize::MAX));
    let held = alloc.raw_alloc(64 * MIB, StreamId::DEFAULT).unwrap();
    for _ in 0..2 {
        let a = alloc.raw_alloc(k * 30 * MIB, StreamId::DEFAULT).unwrap();
        let b = alloc.raw_alloc(k * 20 * MIB, StreamId::DEFAULT).unwrap();
        alloc.raw_free(b).unwrap();
        alloc.raw_free(a).unwrap();
    }
    let _ = held;
    alloc.snapshot(None)
}

/// `reservoir replay FILE --json ARGS...`, parsed.
fn replay_json(path: &Path, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["replay", path.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    let out = reservoir(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str::<Value>(&stdout(&out))
        .expect("the JSON parses")
        .as_array()
        .unwrap()
        .clone()
}

/// Device 0 mapped expandable pages, device 1 allocated plain segments;
/// the file (a `torch_npu` recording: one frame of that package) records
/// no settings. Each device replays exactly in PyTorch mode, with its own
/// settings.
#[test]
fn expandable_segments_are_inferred_per_device() {
    let mut snap = recording(0, "expandable_segments:True");
    let one = recording(1, "");
    snap.segments.extend(one.segments);
    let trace0 = snap
        .device_traces
        .iter()
        .find(|t| !t.is_empty())
        .unwrap()
        .clone();
    let trace1 = one.device_traces[1].clone();
    snap.device_traces = vec![trace0, trace1];
    snap.allocator_settings = None;
    let npu: Arc<[Frame]> = vec![Frame {
        name: "malloc".into(),
        filename: "/site-packages/torch_npu/npu/memory.py".into(),
        line: 1,
    }]
    .into();
    snap.device_traces[1][0].frames = npu;
    let path = tmp("two-devices.pickle");
    std::fs::write(&path, snap.to_pickle().unwrap()).unwrap();

    let v = replay_json(&path, &["-p", "pytorch"]);
    assert_eq!(v.len(), 2, "{v:?}");
    for (r, device) in v.iter().zip([0, 1]) {
        assert_eq!(r["device"], device);
        let f = &r["fidelity"];
        assert!(
            f["segment_events_total"].as_u64().unwrap() > 0,
            "device {device}: {f}"
        );
        assert_eq!(f["segment_events_exact"], true, "device {device}: {f}");
        assert_eq!(
            f["placements_matched"], f["placements_total"],
            "device {device}: {f}"
        );
    }
    let _ = std::fs::remove_file(path);
}

/// Device 1 replayed on a device too small for it: the recorded setting's
/// OOM and those of the what-ifs name GPU 1, never GPU 0.
#[test]
fn what_if_oom_messages_name_the_device() {
    let mut snap = recording(1, "");
    snap.device_traces = vec![Vec::new(), snap.device_traces[1].clone()];
    let path = tmp("device-1.pickle");
    std::fs::write(&path, snap.to_pickle().unwrap()).unwrap();
    let v = replay_json(
        &path,
        &["--capacity", "64M", "-p", "pytorch", "-p", "expandable"],
    );
    assert_eq!(v.len(), 2, "{v:?}");
    for r in &v {
        assert_eq!(r["device"], 1);
        let message = r["first_oom"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"));
        assert!(message.contains(" GPU 1 has"), "{message}");
    }
    let out = reservoir(&["replay", path.to_str().unwrap(), "--capacity", "64M"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("GPU 1"), "{text}");
    assert!(!text.contains("GPU 0"), "{text}");
    let _ = std::fs::remove_file(path);
}

/// `reservoir diff F F --device 0:1`: device 0 of the first file against
/// device 1 of the second (here one file of two ranks); `--device N`
/// still picks N on both sides; a bad pair is refused, naming it.
#[test]
fn diff_compares_a_different_device_on_each_side() {
    let mut snap = recording(0, "");
    // Device 1 holds 10 MiB more at its peak.
    let one = {
        let dev = SimDevice::new(SimConfig::default());
        let alloc = CachingAllocator::with_device(dev, AllocatorConfig::default(), 1);
        alloc.record_history(Some(usize::MAX));
        for mib in [4, 30, 6, 50, 8, 10] {
            alloc.raw_alloc(mib * MIB - 64, StreamId::DEFAULT).unwrap();
        }
        alloc.snapshot(None)
    };
    snap.segments.extend(one.segments);
    let trace0 = snap.device_traces[0].clone();
    snap.device_traces = vec![trace0, one.device_traces[1].clone()];
    let path = tmp("ranks.pickle");
    std::fs::write(&path, snap.to_pickle().unwrap()).unwrap();
    let p = path.to_str().unwrap();

    let diff = |device: &str| -> Value {
        let out = reservoir(&["diff", p, p, "--device", device, "--json", "-"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&stdout(&out)).expect("the JSON parses")
    };
    let v = diff("0:1");
    assert_eq!(
        (&v["a"]["device"], &v["b"]["device"]),
        (&0.into(), &1.into())
    );
    let (a, b) = (
        v["a"]["peak_allocated"].as_u64().unwrap(),
        v["b"]["peak_allocated"].as_u64().unwrap(),
    );
    assert!(b > a, "{v}");
    assert_eq!(
        v["peak_allocated"]["delta"].as_i64().unwrap(),
        b as i64 - a as i64
    );
    for side in ["a", "b"] {
        assert_eq!(v[side]["source"], "recording", "{side}: {v}");
    }
    let v = diff("1");
    assert_eq!(
        (&v["a"]["device"], &v["b"]["device"]),
        (&1.into(), &1.into())
    );
    assert_eq!(v["peak_allocated"]["delta"], 0);
    for bad in ["0:x", "1:2:3", "300", ":1"] {
        let out = reservoir(&["diff", p, p, "--device", bad]);
        assert!(!out.status.success(), "{bad}");
        assert!(
            stderr(&out).contains("is not a device index"),
            "{bad}: {}",
            stderr(&out)
        );
    }
    let _ = std::fs::remove_file(path);
}

/// The `imbalance` lever of a run's reports (`explain.peak.levers`), if any.
fn imbalance_lever(report: &Value) -> Option<&Value> {
    report["explain"]["peak"]["levers"]
        .as_array()
        .unwrap_or_else(|| panic!("no peak levers in {report}"))
        .iter()
        .find(|l| l["lever"] == "imbalance")
}

/// Issue 41 item 2, the imbalance between devices: a file whose device 1
/// runs 4 times device 0's batch gets the `imbalance` lever on device 1
/// only (JSON, the summary, the text), its replay below device 1's peak; a
/// folder of two rank files gets it on the heavier rank; two equal devices
/// get none.
#[test]
fn the_heaviest_device_or_rank_gets_the_imbalance_lever() {
    let two = |k0: u64, k1: u64| {
        let mut snap = batch_recording(0, k0);
        let one = batch_recording(1, k1);
        snap.segments.extend(one.segments);
        snap.device_traces = vec![snap.device_traces[0].clone(), one.device_traces[1].clone()];
        snap
    };
    let path = tmp("imbalanced.pickle");
    std::fs::write(&path, two(1, 4).to_pickle().unwrap()).unwrap();
    let v = replay_json(&path, &["-p", "pytorch"]);
    assert_eq!(v.len(), 2, "{v:?}");
    assert!(imbalance_lever(&v[0]).is_none(), "{}", v[0]["explain"]);
    let l = imbalance_lever(&v[1]).unwrap_or_else(|| panic!("{}", v[1]["explain"]));
    let heavy = v[1]["peak_reserved"].as_u64().unwrap();
    assert!(l["peak_reserved"].as_u64().unwrap() < heavy, "{l}");
    assert_eq!(l["fits"], true);
    // Its name in words travels with it (the notebook reads it there).
    assert_eq!(l["name"], "balanced devices");
    let replayed = l["replayed"].as_str().unwrap();
    for needle in [
        "device 1 peaks at ",
        ", device 0 at ",
        "moving work so device 1 carries the mean share of the 2 devices",
        "(its activations and temporaries peak at 200.00 MiB live, the mean is 125.00 MiB): its 4 activation and temporary allocations (400.00 MiB in all) made 0.62 of their size",
    ] {
        assert!(replayed.contains(needle), "{needle:?} in {replayed}");
    }
    assert!(v[1]["summary"]["levers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|x| x == l));
    let out = reservoir(&["replay", path.to_str().unwrap(), "-p", "pytorch"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("    balanced devices "), "{text}");
    assert_eq!(text.matches("device 1 peaks at ").count(), 2, "{text}");

    // Two rank files of one folder: the heavier rank.
    let dir = tmp("ranks");
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for (rank, k) in [(0, 3), (1, 1)] {
        let mut snap = batch_recording(0, k);
        snap.device_traces.truncate(1);
        let f = dir.join(format!("rank{rank}.pickle"));
        std::fs::write(&f, snap.to_pickle().unwrap()).unwrap();
        files.push(f.to_str().unwrap().to_string());
    }
    let mut args = vec!["replay", "-p", "pytorch", "--json"];
    args.extend(files.iter().map(String::as_str));
    let out = reservoir(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Vec<Value> = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v.len(), 2);
    assert!(imbalance_lever(&v[1]).is_none());
    let l = imbalance_lever(&v[0]).unwrap_or_else(|| panic!("{}", v[0]["explain"]));
    let replayed = l["replayed"].as_str().unwrap();
    assert!(replayed.starts_with("rank 0 peaks at "), "{replayed}");
    assert!(replayed.contains(", rank 1 at "), "{replayed}");
    assert!(l["peak_reserved"].as_u64().unwrap() < v[0]["peak_reserved"].as_u64().unwrap());

    // Balanced: no imbalance lever.
    std::fs::write(&path, two(2, 2).to_pickle().unwrap()).unwrap();
    let v = replay_json(&path, &["-p", "pytorch"]);
    assert!(v.iter().all(|r| imbalance_lever(r).is_none()), "{v:?}");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_dir_all(dir);
}
