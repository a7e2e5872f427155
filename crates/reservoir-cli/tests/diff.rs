//! `reservoir diff A B`: two real snapshots of one program, a file with
//! itself, a synthetic pair with a known site growth, the JSON keys, the
//! HTML page and bad inputs (issue 30, item 4); what `reservoir replay` and
//! `reservoir diff` say of a `torch_npu` recording (item 5).

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use reservoir::backend::StreamId;
use reservoir::caching::CachingAllocator;
use reservoir::config::AllocatorConfig;
use reservoir::observe::trace::{Frame, TraceAction};
use reservoir::sim::{SimConfig, SimDevice};
use reservoir_testkit::run::{run, stderr, stdout};
use reservoir_testkit::traces::shared_trace;
use serde_json::Value;

fn reservoir(args: &[&str]) -> Output {
    run(env!("CARGO_BIN_EXE_reservoir"), args)
}

fn tmp(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("diff-{}-{name}", std::process::id()))
}

/// `reservoir diff A B --json -` parsed, with extra arguments.
fn diff_json(a: &Path, b: &Path, extra: &[&str]) -> Value {
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let mut args = vec!["diff", a, b, "--json", "-"];
    args.extend_from_slice(extra);
    let out = reservoir(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("the JSON parses")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an i64: {v}"))
}

/// The keys of `v`, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
    k.sort();
    k
}

/// Every key is present, the deltas are B - A, the sites are sorted by
/// their absolute change and counted by class.
fn check_shape(v: &Value) {
    assert_eq!(
        keys(v),
        [
            "a",
            "b",
            "changes",
            "fragmentation",
            "ooms",
            "peak_allocated",
            "peak_reserved",
            "sites",
            "sites_total",
            "top"
        ]
    );
    for side in ["a", "b"] {
        assert_eq!(
            keys(&v[side]),
            [
                "capacity",
                "config",
                "device",
                "exact",
                "file",
                "first_oom",
                "fragmentation_bytes",
                "fragmentation_op",
                "fragmentation_percent",
                "ooms",
                "peak_allocated",
                "peak_allocated_op",
                "peak_reserved",
                "peak_reserved_op",
                "recorded_by",
                "setting",
                "sites_live_at_peak",
                "source",
                "source_note"
            ]
        );
    }
    for (k, side_key) in [
        ("peak_allocated", "peak_allocated"),
        ("peak_reserved", "peak_reserved"),
        ("fragmentation", "fragmentation_bytes"),
        ("ooms", "ooms"),
    ] {
        assert_eq!(keys(&v[k]), ["a", "b", "delta", "percent"], "{k}");
        assert_eq!(v[k]["a"], v["a"][side_key], "{k}");
        assert_eq!(v[k]["b"], v["b"][side_key], "{k}");
        assert_eq!(
            i(&v[k]["delta"]),
            u(&v[k]["b"]) as i64 - u(&v[k]["a"]) as i64,
            "{k}"
        );
    }
    let sites = v["sites"].as_array().unwrap();
    assert!(sites.len() as u64 <= u(&v["sites_total"]));
    assert!(sites.len() as u64 <= u(&v["top"]));
    for w in sites.windows(2) {
        assert!(i(&w[0]["delta"]).unsigned_abs() >= i(&w[1]["delta"]).unsigned_abs());
    }
    for s in sites {
        assert_eq!(
            keys(s),
            ["a_bytes", "a_count", "a_site", "b_bytes", "b_count", "change", "delta", "site"]
        );
        assert_eq!(
            i(&s["delta"]),
            u(&s["b_bytes"]) as i64 - u(&s["a_bytes"]) as i64
        );
    }
    let c = &v["changes"];
    assert_eq!(keys(c), ["gone", "grew", "moved", "new", "same", "shrank"]);
    let total: u64 = ["gone", "grew", "new", "same", "shrank"]
        .iter()
        .map(|k| u(&c[k]))
        .sum();
    assert_eq!(total, u(&v["sites_total"]));
}

/// Two recordings of the same program (the CS336 Transformer forward pass
/// in mixed precision at context 128 and 256, one commit): both replayed
/// exactly, everything grows, and the live bytes by site at each peak add
/// up to that peak.
#[test]
fn two_real_snapshots_of_one_program() {
    let (Some(a), Some(b)) = (
        shared_trace("cs336-kkaitlyn111/bebd77a3_memory_ctx128_forward_mixed.pickle"),
        shared_trace("cs336-kkaitlyn111/73107f1a_memory_ctx256_forward_mixed.pickle"),
    ) else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let html = tmp("real.html");
    let json = tmp("real.json");
    let out = reservoir(&[
        "diff",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--top",
        "1000",
        "--html",
        html.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("A measured from the recording: replayed in PyTorch mode"),
        "{text}"
    );
    assert!(text.contains("peak allocated (live)"), "{text}");
    assert!(text.contains("fragmentation at allocated peak"), "{text}");
    assert!(
        text.contains("19 sites (19 grew, 0 shrank, 0 new, 0 gone, 0 same)"),
        "{text}"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_shape(&v);
    for side in ["a", "b"] {
        assert_eq!(v[side]["source"], "recording", "{side}");
        assert_eq!(v[side]["exact"], true, "{side}");
        assert_eq!(v[side]["recorded_by"], "pytorch-cuda", "{side}");
        assert_eq!(v[side]["setting"], "pytorch", "{side}");
    }
    // The sites at each peak hold exactly that peak's allocated bytes.
    let sum = |k: &str| -> u64 {
        v["sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| u(&s[k]))
            .sum()
    };
    assert_eq!(sum("a_bytes"), u(&v["a"]["peak_allocated"]));
    assert_eq!(sum("b_bytes"), u(&v["b"]["peak_allocated"]));
    assert!(i(&v["peak_allocated"]["delta"]) > 0);
    assert_eq!(v["sites"][0]["site"], "_backends.py:288:einsum");
    assert_eq!(v["sites"][0]["change"], "grew");
    // The page: the numbers, one bar per listed site, no directory.
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(page.ends_with("</html>\n"));
    assert!(page.contains("<svg class=\"site-deltas\""));
    assert_eq!(page.matches("<rect class=\"bar grew\"").count(), 19);
    assert!(page.contains("bebd77a3_memory_ctx128_forward_mixed.pickle"));
    assert!(!page.contains("shared/traces"), "the page names files only");
    assert!(!page.contains("<script"));
    let _ = std::fs::remove_file(html);
    let _ = std::fs::remove_file(json);
}

/// A file diffed with itself: every delta is zero, every site the same.
#[test]
fn a_snapshot_diffed_with_itself_changes_nothing() {
    let Some(f) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let v = diff_json(&f, &f, &["--top", "1000"]);
    check_shape(&v);
    for k in ["peak_allocated", "peak_reserved", "fragmentation", "ooms"] {
        assert_eq!(v[k]["delta"], 0, "{k}");
    }
    assert!(u(&v["peak_allocated"]["a"]) > 0);
    let c = &v["changes"];
    assert_eq!(u(&c["same"]), u(&v["sites_total"]));
    assert!(u(&c["same"]) > 0);
    for s in v["sites"].as_array().unwrap() {
        assert_eq!(s["change"], "same");
        assert_eq!(s["delta"], 0);
    }
    assert_eq!(v["a"], v["b"]);
}

fn frame(site: &str) -> Arc<[Frame]> {
    let (func, line) = site.split_once(':').unwrap();
    vec![
        Frame {
            name: "c10::cuda::CUDACachingAllocator::malloc".into(),
            filename: "??".into(),
            line: 0,
        },
        Frame {
            name: func.into(),
            filename: "/home/user/project/model.py".into(),
            line: line.parse().unwrap(),
        },
    ]
    .into()
}

/// A snapshot recorded by the allocator on a simulated device: `held`
/// allocations (site, bytes) made and kept, then `temp` ones made and
/// freed; each allocation entry gets a stack naming its site.
fn synthetic_snapshot(held: &[(&str, u64)], temp: &[(&str, u64)]) -> Vec<u8> {
    synthetic_snapshot_after(&[], held, temp)
}

/// [`synthetic_snapshot`] of an allocator that first made and freed `pre`
/// allocations before recording: the snapshot starts with a full cache.
fn synthetic_snapshot_after(pre: &[u64], held: &[(&str, u64)], temp: &[(&str, u64)]) -> Vec<u8> {
    let dev = SimDevice::new(SimConfig {
        capacity: 1 << 34,
        ..SimConfig::default()
    });
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
    let early: Vec<_> = pre
        .iter()
        .map(|&b| alloc.raw_alloc(b, StreamId::DEFAULT).unwrap())
        .collect();
    for p in early {
        alloc.raw_free(p).unwrap();
    }
    alloc.record_history(Some(usize::MAX));
    let mut sites = Vec::new();
    for &(site, bytes) in held {
        alloc.raw_alloc(bytes, StreamId::DEFAULT).unwrap();
        sites.push(site);
    }
    let mut ptrs = Vec::new();
    for &(site, bytes) in temp {
        ptrs.push(alloc.raw_alloc(bytes, StreamId::DEFAULT).unwrap());
        sites.push(site);
    }
    for p in ptrs {
        alloc.raw_free(p).unwrap();
    }
    let mut snap = alloc.snapshot(None);
    let mut next = sites.iter();
    for e in snap.device_traces.iter_mut().flatten() {
        if e.action == TraceAction::Alloc {
            e.frames = frame(next.next().expect("one site per allocation"));
        }
    }
    assert!(next.next().is_none());
    snap.to_pickle().unwrap()
}

const MIB: u64 = 1 << 20;

/// A: weights 4 x 2 MiB, activations 3 x 4 MiB, a 512 KiB scratch buffer;
/// B: the same weights, activations 3 x 6 MiB, a 1 MiB cache instead of
/// the scratch buffer. Every byte of each peak is known.
#[test]
fn a_synthetic_pair_with_a_known_site_growth() {
    let weights = [("weights:10", 2 * MIB); 4];
    let a = synthetic_snapshot(
        &weights,
        &[
            ("act:20", 4 * MIB),
            ("act:20", 4 * MIB),
            ("act:20", 4 * MIB),
            ("scratch:30", MIB / 2),
        ],
    );
    let b = synthetic_snapshot(
        &weights,
        &[
            ("act:20", 6 * MIB),
            ("act:20", 6 * MIB),
            ("act:20", 6 * MIB),
            ("cache:40", MIB),
        ],
    );
    let (pa, pb) = (tmp("a.pickle"), tmp("b.pickle"));
    std::fs::write(&pa, a).unwrap();
    std::fs::write(&pb, b).unwrap();
    let v = diff_json(&pa, &pb, &[]);
    check_shape(&v);
    assert_eq!(u(&v["a"]["peak_allocated"]), 8 * MIB + 12 * MIB + MIB / 2);
    assert_eq!(u(&v["b"]["peak_allocated"]), 8 * MIB + 18 * MIB + MIB);
    assert_eq!(i(&v["peak_allocated"]["delta"]), (6 * MIB + MIB / 2) as i64);
    let got: Vec<(String, String, u64, u64, i64, u64, u64)> = v["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["site"].as_str().unwrap().to_string(),
                s["change"].as_str().unwrap().to_string(),
                u(&s["a_bytes"]),
                u(&s["b_bytes"]),
                i(&s["delta"]),
                u(&s["a_count"]),
                u(&s["b_count"]),
            )
        })
        .collect();
    let row = |site: &str, change: &str, a: u64, b: u64, na: u64, nb: u64| {
        (
            site.to_string(),
            change.to_string(),
            a,
            b,
            b as i64 - a as i64,
            na,
            nb,
        )
    };
    assert_eq!(
        got,
        [
            row("model.py:20:act", "grew", 12 * MIB, 18 * MIB, 3, 3),
            row("model.py:40:cache", "new", 0, MIB, 0, 1),
            row("model.py:30:scratch", "gone", MIB / 2, 0, 1, 0),
            row("model.py:10:weights", "same", 8 * MIB, 8 * MIB, 4, 4),
        ]
    );
    assert_eq!(
        v["changes"],
        serde_json::json!({"grew": 1, "shrank": 0, "new": 1, "gone": 1, "same": 1, "moved": 0})
    );
    // --top keeps the largest changes; the counts stay those of every site.
    let top = diff_json(&pa, &pb, &["--top", "1"]);
    assert_eq!(top["sites"].as_array().unwrap().len(), 1);
    assert_eq!(top["sites"][0]["site"], "model.py:20:act");
    assert_eq!(top["sites_total"], 4);
    // A what-if setting says so.
    let what_if = diff_json(&pa, &pb, &["--policy", "expandable"]);
    assert_eq!(what_if["a"]["source"], "what-if");
    assert_eq!(what_if["a"]["exact"], Value::Null);
    assert!(what_if["a"]["source_note"]
        .as_str()
        .unwrap()
        .contains("not the recording"));
    // On a 22 MiB device A (one 20 MiB large segment and a 2 MiB small
    // one) fits; B's third activation needs a second large segment: an OOM.
    assert_eq!(u(&v["a"]["peak_reserved"]), 22 * MIB);
    assert_eq!(u(&v["b"]["peak_reserved"]), 42 * MIB);
    let small = diff_json(&pa, &pb, &["--capacity", "22MiB"]);
    check_shape(&small);
    assert_eq!((u(&small["a"]["ooms"]), u(&small["b"]["ooms"])), (0, 1));
    assert_eq!(i(&small["ooms"]["delta"]), 1);
    assert_eq!(small["a"]["first_oom"], Value::Null);
    assert_eq!(small["b"]["first_oom"]["bytes"], 6 * MIB);
    assert_eq!(small["b"]["first_oom"]["site"], "model.py:20:act");
    assert_eq!(small["b"]["source"], "replay", "the recording had no OOM");
    let out = reservoir(&[
        "diff",
        pa.to_str().unwrap(),
        pb.to_str().unwrap(),
        "--capacity",
        "22MiB",
    ]);
    assert!(
        stdout(&out).contains("first OOM of B: 6.00 MiB at model.py:20:act"),
        "{}",
        stdout(&out)
    );
    // The table.
    let out = reservoir(&["diff", pa.to_str().unwrap(), pb.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("4 sites (1 grew, 0 shrank, 1 new, 1 gone, 1 same)"),
        "{text}"
    );
    assert!(text.contains("+6.00 MiB"), "{text}");
    let _ = std::fs::remove_file(pa);
    let _ = std::fs::remove_file(pb);
}

/// Issue 41 item 5: a site that moved three lines between the runs (code
/// added above it) is one site that grew, not a gone and a new one.
#[test]
fn a_site_that_moved_is_matched_by_its_call_path() {
    let a = synthetic_snapshot(
        &[("weights:10", 2 * MIB)],
        &[("act:20", 4 * MIB), ("act:20", 4 * MIB)],
    );
    let b = synthetic_snapshot(
        &[("weights:10", 2 * MIB)],
        &[("act:23", 6 * MIB), ("act:23", 6 * MIB)],
    );
    let (pa, pb) = (tmp("moved-a.pickle"), tmp("moved-b.pickle"));
    std::fs::write(&pa, a).unwrap();
    std::fs::write(&pb, b).unwrap();
    let v = diff_json(&pa, &pb, &[]);
    check_shape(&v);
    assert_eq!(v["sites"][0]["site"], "model.py:23:act");
    assert_eq!(v["sites"][0]["a_site"], "model.py:20:act");
    assert_eq!(v["sites"][0]["change"], "grew");
    assert_eq!(i(&v["sites"][0]["delta"]), (4 * MIB) as i64);
    assert_eq!(v["sites"][1]["a_site"], Value::Null);
    assert_eq!(
        v["changes"],
        serde_json::json!({"grew": 1, "shrank": 0, "new": 0, "gone": 0, "same": 1, "moved": 1})
    );
    let out = reservoir(&["diff", pa.to_str().unwrap(), pb.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(
        text.contains("model.py:23:act (moved from model.py:20:act)"),
        "{text}"
    );
    assert!(
        text.contains(
            "2 sites (1 grew, 0 shrank, 0 new, 0 gone, 1 same; 1 of them moved to another line)"
        ),
        "{text}"
    );
    let _ = std::fs::remove_file(pa);
    let _ = std::fs::remove_file(pb);
}

/// Issue 41 item 5: a snapshot that starts with a full cache peaks in
/// reserved bytes at its first op, where the cache is free but nothing is
/// fragmented; fragmentation is taken at the allocated peak instead.
#[test]
fn fragmentation_is_taken_at_the_allocated_peak() {
    // 20 MiB made and freed before recording: one cached 20 MiB segment.
    // Then 3 x 6 MiB live at once in it: 18 of 20 MiB allocated at the peak.
    let a = synthetic_snapshot_after(&[20 * MIB], &[], &[("act:20", 6 * MIB); 3]);
    let pa = tmp("full-cache.pickle");
    std::fs::write(&pa, a).unwrap();
    let v = diff_json(&pa, &pa, &[]);
    check_shape(&v);
    assert_eq!(u(&v["a"]["peak_reserved"]), 20 * MIB);
    assert_eq!(u(&v["a"]["peak_allocated"]), 18 * MIB);
    assert_eq!(u(&v["a"]["fragmentation_bytes"]), 2 * MIB);
    assert_eq!(v["a"]["fragmentation_op"], v["a"]["peak_allocated_op"]);
    assert!((v["a"]["fragmentation_percent"].as_f64().unwrap() - 10.0).abs() < 1e-9);
    let _ = std::fs::remove_file(pa);
}

/// Bad inputs: a clear error naming the file, nothing written.
#[test]
fn bad_inputs_name_the_file() {
    let missing = tmp("no-such-file.pickle");
    let junk = tmp("junk.pickle");
    std::fs::write(&junk, b"this is not a snapshot").unwrap();
    let Some(good) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let html = tmp("bad.html");
    for (a, b, bad) in [(&missing, &good, &missing), (&good, &junk, &junk)] {
        let out = reservoir(&[
            "diff",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
        ]);
        assert!(!out.status.success());
        let err = stderr(&out);
        assert!(err.starts_with("error: cannot load "), "{err}");
        assert!(err.contains(bad.to_str().unwrap()), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(stdout(&out).is_empty());
        assert!(!html.exists(), "nothing is written on an error");
    }
    let out = reservoir(&[
        "diff",
        good.to_str().unwrap(),
        good.to_str().unwrap(),
        "--policy",
        "nope",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown policy \"nope\""),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_file(junk);
}

/// `../shared/traces-foreign/npu-memsnapdump`, beside the real traces.
fn npu_file(name: &str) -> Option<PathBuf> {
    let dir = reservoir_testkit::traces::shared_traces()?
        .parent()?
        .join("traces-foreign/npu-memsnapdump");
    Some(dir.join(name)).filter(|p| p.is_file())
}

/// A `torch_npu` (Ascend) recording: `reservoir replay` says who recorded
/// it and that its padding is modelled, in the table (the fidelity line:
/// exact with the padding modelled, not a bare "differs"), the JSON
/// (`recorded_by`) and the page; `reservoir diff` of the two recordings of
/// the same demo (issue 30, item 5).
#[test]
fn torch_npu_recordings_say_who_recorded_them() {
    let (Some(a), Some(b)) = (
        npu_file("0a5ea068_snapshot_with_empty_cache.pkl"),
        npu_file("cf9c16e4_snapshot_expandable.pkl"),
    ) else {
        eprintln!("skipped: ../shared/traces-foreign not found");
        return;
    };
    let html = tmp("npu.html");
    let out = reservoir(&[
        "replay",
        a.to_str().unwrap(),
        "--policy",
        "pytorch",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let who = "recorded by torch_npu's NPU caching allocator (Ascend), which pads each request by \
               32 bytes: a PyTorch-CUDA-exact replay is not expected to match";
    assert!(text.contains(who), "{text}");
    assert!(
        text.contains(
            "segment events 45/45 (exact with the padding of torch_npu's NPU caching allocator \
             (Ascend) modelled: 32 bytes added to each request), block placements 2899/2899"
        ),
        "{text}"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<p class=\"fidelity recorder\">recorded by torch_npu"),
        "the page says it too"
    );
    let _ = std::fs::remove_file(html);
    let out = reservoir(&[
        "replay",
        b.to_str().unwrap(),
        "--policy",
        "pytorch",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["recorded_by"], "torch_npu");
    assert_eq!(v[0]["fidelity"]["segment_events_exact"], true);
    assert_eq!(v[0]["config"], "expandable_segments:True");
    // The two recordings of the demo, diffed.
    let v = diff_json(&a, &b, &[]);
    check_shape(&v);
    assert_eq!(v["a"]["recorded_by"], "torch_npu");
    assert_eq!(v["b"]["recorded_by"], "torch_npu");
    assert_eq!(
        (&v["a"]["source"], &v["a"]["exact"]),
        (&Value::from("recording"), &Value::from(true))
    );
    assert_eq!(
        (&v["b"]["source"], &v["b"]["exact"]),
        (&Value::from("replay"), &Value::from(false))
    );
    assert!(v["b"]["source_note"]
        .as_str()
        .unwrap()
        .contains("block placements 2159/2899"));
}

/// A PyTorch CUDA recording says so in the JSON and adds no line.
#[test]
fn pytorch_cuda_recordings_are_not_called_foreign() {
    let Some(f) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let out = reservoir(&[
        "replay",
        f.to_str().unwrap(),
        "--policy",
        "pytorch",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v[0]["recorded_by"], "pytorch-cuda");
    let out = reservoir(&["replay", f.to_str().unwrap(), "--policy", "pytorch"]);
    assert!(!stdout(&out).contains("recorded by"), "{}", stdout(&out));
}
