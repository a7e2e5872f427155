//! The `reservoir` binary, run as a user would.

use std::path::PathBuf;
use std::process::{Command, Output};

use reservoir_testkit::run::{run, stderr, stdout};
use reservoir_testkit::traces::shared_trace;

fn reservoir(args: &[&str]) -> Output {
    run(env!("CARGO_BIN_EXE_reservoir"), args)
}

#[test]
fn default_replay_prints_the_table() {
    let o = reservoir(&["replay"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.starts_with("workload gpt-train:"), "{out}");
    for needle in [
        "pytorch",
        "expandable",
        "reservoir",
        "max-split-128",
        "roundup-4",
        "gc-0.8",
        "peak allocated",
        "peak reserved",
        "fragmentation",
        "reserved-unallocated at reserved peak",
        "largest free block at reserved peak",
        "driver allocs",
        "driver frees",
        "OOMs",
        "simulated driver time",
        "allocator time per call",
        "MiB",
        "max_split_size_mb:128",
        "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    // nothing on stderr when not on a terminal (no progress bar)
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
}

#[test]
fn json_output_parses_and_has_the_keys() {
    let o = reservoir(&["replay", "--json", "--workload", "gpt-train:steps=2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    let reports = v.as_array().expect("an array");
    assert_eq!(reports.len(), 6);
    let names: Vec<&str> = reports
        .iter()
        .map(|r| r["setting"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "pytorch",
            "expandable",
            "reservoir",
            "max-split-128",
            "roundup-4",
            "gc-0.8"
        ]
    );
    for r in reports {
        for key in [
            "setting",
            "config",
            "allocator",
            "capacity",
            "peak_allocated",
            "peak_reserved",
            "fragmentation",
            "reserved_unallocated_at_peak",
            "largest_free_block_at_peak",
            "driver_allocs",
            "driver_frees",
            "ooms",
            "first_oom",
            "driver_time_ns",
            "allocator_ns_per_op",
            "memory_stats",
            "samples",
        ] {
            assert!(r.get(key).is_some(), "missing {key}");
        }
        assert_eq!(r["capacity"].as_u64(), Some(80 << 30));
        assert!(r["peak_reserved"].as_u64().unwrap() >= r["peak_allocated"].as_u64().unwrap());
        assert_eq!(r["ooms"].as_u64(), Some(0));
    }
}

#[test]
fn settings_configs_and_capacity() {
    let o = reservoir(&[
        "replay",
        "--json",
        "--setting",
        "big-split=max_split_size_mb:512",
        "--config",
        "",
        "--capacity",
        "1.5G",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = v.as_array().unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["setting"], "big-split");
    assert_eq!(r[0]["config"], "max_split_size_mb:512");
    assert_eq!(r[1]["setting"], "pytorch");
    assert_eq!(r[1]["capacity"].as_u64(), Some(3 << 29));
}

#[test]
fn out_of_memory_is_reported() {
    let o = reservoir(&["replay", "--capacity", "256MiB", "--config", ""]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("first OOM with pytorch"), "{out}");
    assert!(
        out.contains("CUDA out of memory. Tried to allocate"),
        "{out}"
    );
}

#[test]
fn bad_size_names_the_value_and_the_forms() {
    let o = reservoir(&["replay", "--capacity", "80XB"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("80XB"), "{err}");
    assert!(
        err.contains("80GiB") && err.contains("512M") && err.contains("1.5G"),
        "{err}"
    );
    let o = reservoir(&["replay", "--capacity", "0"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--capacity"), "{}", stderr(&o));
}

#[test]
fn unknown_workload_lists_the_known_ones() {
    let o = reservoir(&["replay", "--workload", "gpt-tran"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("gpt-tran"), "{err}");
    for known in [
        "gpt-train",
        "gpt2-medium-train",
        "llm-infer",
        "llama-7b-infer",
    ] {
        assert!(err.contains(known), "{known} not in {err}");
    }
    let o = reservoir(&["workload", "gpt-train:layerz=2"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("layerz") && err.contains("layers"), "{err}");
}

#[test]
fn bad_settings_are_explained() {
    let o = reservoir(&["replay", "--setting", "max_split_size_mb:128"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("NAME=CONF"), "{}", stderr(&o));
    let o = reservoir(&["replay", "--setting", "x=no_such_key:1"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no_such_key"), "{}", stderr(&o));
    let o = reservoir(&["replay", "-s", "a=", "-s", "a=max_split_size_mb:128"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("twice"), "{}", stderr(&o));
}

#[test]
fn workload_writes_an_oracle_trace() {
    let path: PathBuf =
        std::env::temp_dir().join(format!("reservoir-cli-test-{}.trace", std::process::id()));
    let p = path.to_str().unwrap();
    let o = reservoir(&["workload", "llm-infer:requests=3", "--out", p]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    let trace = reservoir_replay::oracle_trace::Trace::parse(&text).unwrap();
    let again = reservoir_replay::workload::generate("llm-infer:requests=3").unwrap();
    assert_eq!(trace.ops, again.ops);
    assert!(stderr(&o).contains(&format!("wrote {} ops", trace.ops.len())));
    // to standard output
    let o = reservoir(&["workload", "llm-infer:requests=3"]);
    assert!(o.status.success());
    assert_eq!(stdout(&o), text);
}

#[test]
fn workloads_lists_every_preset() {
    let o = reservoir(&["workloads"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for p in reservoir_replay::workload::presets() {
        assert!(out.contains(p.name), "{} missing", p.name);
        assert!(
            out.contains(p.description),
            "{} description missing",
            p.name
        );
    }
    assert!(out.contains("kv_heads") && out.contains("layers"), "{out}");
}

#[test]
fn html_report_has_one_series_per_setting_per_timeline() {
    let out = std::env::temp_dir().join(format!("reservoir-cli-test-{}.html", std::process::id()));
    let o = reservoir(&[
        "replay",
        "--workload",
        "gpt-train:layers=2,steps=2",
        "--policy",
        "pytorch",
        "--policy",
        "expandable",
        "--config",
        "max_split_size_mb:64",
        "--html",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_file(&out).ok();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert!(
        !page.contains("http://") || !page.contains("<script src"),
        "no network"
    );
    for which in ["allocated", "reserved"] {
        let n = page
            .matches(&format!("<path class=\"series {which}\""))
            .count();
        assert_eq!(n, 3, "{which} series");
        for (i, name) in ["pytorch", "expandable", "max_split_size_mb:64"]
            .iter()
            .enumerate()
        {
            let tag = format!("id=\"{which}-0-{i}\" data-setting=\"{name}\"");
            assert!(page.contains(&tag), "missing {tag}");
        }
    }
    // Each series has points (not an empty path).
    assert!(!page.contains("d=\"\""));
    assert!(page.contains("<svg class=\"segmap\" id=\"segmap-0\""));
    assert!(page.matches("class=\"block live\"").count() > 0);
    assert!(page.contains("<table class=\"numbers\">"));
}

#[test]
fn unknown_policy_lists_the_known_ones() {
    let o = reservoir(&[
        "replay",
        "--workload",
        "gpt-train:steps=1",
        "--policy",
        "fastest",
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("unknown policy \"fastest\"") && e.contains("expandable"),
        "{e}"
    );
}

#[test]
fn replaying_a_recorded_snapshot_is_exact() {
    let Some(file) = shared_trace("select_n-bert-llama/ec5be110_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let o = reservoir(&["replay", file.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = v.as_array().unwrap();
    let names: Vec<&str> = a.iter().map(|r| r["setting"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "pytorch",
            "expandable",
            "reservoir",
            "max-split-128",
            "roundup-4",
            "gc-0.8"
        ]
    );
    for r in a {
        for k in [
            "peak_allocated",
            "peak_reserved",
            "fragmentation",
            "driver_allocs",
            "driver_frees",
            "ooms",
            "file",
            "device",
        ] {
            assert!(r.get(k).is_some(), "missing {k}");
        }
    }
    let f = &a[0]["fidelity"];
    assert_eq!(f["segment_events_total"], 1163);
    assert_eq!(f["segment_events_matched"], 1163);
    assert_eq!(f["placements_total"], f["placements_matched"]);
    assert_eq!(f["segment_events_exact"], true);
    assert!(a[1]["fidelity"].is_null());
    // expandable segments change the driver calls
    assert_ne!(a[0]["driver_frees"], a[1]["driver_frees"]);

    // the human table names the fidelity
    let o = reservoir(&["replay", file.to_str().unwrap(), "--policy", "pytorch"]);
    let out = stdout(&o);
    assert!(out.contains("segment events 1163/1163 (exact)"), "{out}");
}

#[test]
fn state_only_snapshots_and_conversion() {
    let Some(file) = shared_trace("stateonly-attention/9e5bfb67_memory.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let o = reservoir(&["replay", file.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no trace entries"), "{}", stderr(&o));

    let file = shared_trace("cs336-kkaitlyn111/1fcf79fe_memory_ctx512_forward.pickle").unwrap();
    let out = std::env::temp_dir().join(format!("reservoir-cli-conv-{}.txt", std::process::id()));
    let o = reservoir(&[
        "convert",
        file.to_str().unwrap(),
        "--oracle-trace",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    std::fs::remove_file(&out).ok();
    let trace = reservoir_replay::oracle_trace::Trace::parse(&text).unwrap();
    // 1301 allocs + 657 frees + empty_cache calls, after the prelude
    assert!(trace.ops.len() > 1301 + 657, "{}", trace.ops.len());
    assert!(text.contains("# prelude: the first "));
}

#[test]
fn the_mps_heap_policy_replays_workloads_and_recordings() {
    let o = reservoir(&[
        "replay",
        "--json",
        "--workload",
        "gpt-train:steps=2",
        "-p",
        "mps-heap",
        "-p",
        "pytorch",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = v.as_array().unwrap();
    assert_eq!(r[0]["setting"], "mps-heap");
    assert_eq!(r[0]["allocator"], "mps-heap");
    assert_eq!(r[1]["allocator"], "caching");
    assert!(r[0]["memory_stats"]["segment.all.peak"].as_i64().unwrap() > 0);
    // The HTML segment map is the heap allocator's at its reserved peak.
    let html = std::env::temp_dir().join(format!("mps-heap-{}.html", std::process::id()));
    let o = reservoir(&[
        "replay",
        "--workload",
        "gpt-train:steps=2",
        "-p",
        "mps-heap",
        "--html",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let page = std::fs::read_to_string(&html).unwrap();
    let _ = std::fs::remove_file(&html);
    let peak = r[0]["peak_reserved"].as_u64().unwrap();
    let map = format!("segments, {}", reservoir::format::format_size(peak));
    assert!(page.contains(&map), "no {map:?} in the HTML report");
    let o = reservoir(&[
        "replay",
        "--workload",
        "gpt-train:steps=2",
        "-p",
        "mps-heap",
    ]);
    assert!(
        stdout(&o).contains("PyTorch's MPS heap allocator"),
        "{}",
        stdout(&o)
    );
    let o = reservoir(&["replay", "-p", "mps-heapz"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("mps-heap"), "{}", stderr(&o));
    let Some(trace) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let o = reservoir(&[
        "replay",
        trace.to_str().unwrap(),
        "-p",
        "mps-heap",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["allocator"], "mps-heap");
    assert!(v[0]["fidelity"].is_null());
}

#[test]
fn cold_start_replays_from_an_empty_allocator() {
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let f = file.to_str().unwrap();
    let args = ["replay", f, "-p", "pytorch", "-p", "expandable", "--json"];
    let o = reservoir(&[&args[..], &["--start", "cold"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = v.as_array().unwrap();
    assert_eq!(a.len(), 2);
    for r in a {
        assert_eq!(r["start"], "cold");
        assert!(r["fidelity"].is_null(), "no fidelity on a cold start");
        assert!(r["peak_live"].as_u64().unwrap() > 0);
        assert!(r["peak_reserved"].as_u64() >= r["peak_live"].as_u64());
    }
    // peak live is the same whatever the policy
    assert_eq!(a[0]["peak_live"], a[1]["peak_live"]);
    // the recorded start stays the default
    let o = reservoir(&args);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["start"], "recorded");
    assert!(!v[0]["fidelity"].is_null());
    // the table says where it started
    let o = reservoir(&["replay", f, "-p", "pytorch", "--start", "cold"]);
    let out = stdout(&o);
    assert!(out.contains("from a cold start (the 6 blocks"), "{out}");
    assert!(out.contains("peak reserved / peak live"), "{out}");
    assert!(
        out.contains("fidelity: not measured on a cold start"),
        "{out}"
    );
    // a bad mode is named
    let o = reservoir(&["replay", f, "--start", "warm"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("warm"), "{}", stderr(&o));
}

#[test]
fn errors_print_each_cause_once() {
    // A pickle cut inside its first FRAME: the pickle reader's cause used to
    // be printed twice (once in the load error's message, once as its source).
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("truncated.pickle");
    std::fs::write(&path, b"\x80\x04\x95\x01\x02\x03\x04\x05\x06\x07").unwrap();
    let o = reservoir(&["replay", path.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("cannot load"), "{err}");
    assert!(err.contains("opcode FRAME"), "{err}");
    assert_eq!(
        err.matches("needs 8 bytes but only 7 are left").count(),
        1,
        "{err}"
    );
    assert_eq!(err.matches("at byte 2").count(), 1, "{err}");
    // A missing file: the OS error once.
    let missing = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-such-file.pickle");
    let o = reservoir(&["replay", missing.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(err.matches("No such file").count(), 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn min_capacity_prints_the_headline_and_json() {
    let w = "gpt-train:layers=2,steps=2";
    let args = [
        "replay",
        "--workload",
        w,
        "-p",
        "pytorch",
        "-p",
        "expandable",
    ];
    let o = reservoir(&[&args[..], &["--min-capacity"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("minimum capacity (no OOM)"), "{out}");
    assert!(out.contains("this run fits on a "), "{out}");
    assert!(out.contains(" GPU with `"), "{out}");
    let o = reservoir(&[&args[..], &["--min-capacity", "--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for r in v.as_array().unwrap() {
        let m = r["min_capacity"].as_u64().expect("min_capacity");
        assert_eq!(m % (2 << 20), 0);
        assert!(m >= r["peak_live"].as_u64().unwrap());
    }
    // without the flag, no key
    let o = reservoir(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v[0].get("min_capacity").is_none());
    // a recorded trace, from its recorded start and cold
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    for start in ["recorded", "cold"] {
        let f = file.to_str().unwrap();
        let o = reservoir(&[
            "replay",
            f,
            "-p",
            "pytorch",
            "--start",
            start,
            "--min-capacity",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v[0]["min_capacity"].as_u64().unwrap() >= v[0]["peak_live"].as_u64().unwrap());
    }
}

#[test]
fn compare_puts_policies_side_by_side() {
    let args = [
        "compare",
        "--no-traces",
        "--workload",
        "gpt-train:layers=2,steps=2",
        "--workload",
        "llm-infer:requests=4",
    ];
    let o = reservoir(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "workload gpt-train:layers=2,steps=2",
        "pytorch",
        "expandable",
        "peak live",
        "min capacity",
        "median",
        "p90",
        "worst",
        "within bound",
        "steady time",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    let o = reservoir(&[&args[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 2);
    // steady state: the second half of the ops after the live peak, part
    // of the driver time
    let p = &v["rows"][0]["policies"][0];
    assert!(p["steady_driver_time_ns"].as_u64().unwrap() <= p["driver_time_ns"].as_u64().unwrap());
    assert!(v["summary"][0]["total_steady_driver_time_ns"].is_u64());
    let row = &v["rows"][0];
    let (ops, start) = (
        row["ops"].as_u64().unwrap(),
        row["steady_start"].as_u64().unwrap(),
    );
    assert!(ops / 2 <= start && start <= ops, "{ops} {start}");
    assert!(out.contains("steady time: the second half of each input's ops, from its peak"));
    assert_eq!(v["summary"].as_array().unwrap().len(), 3);
    assert_eq!(v["summary"][2]["policy"], "reservoir");
    assert_eq!(v["summary"][0]["policy"], "pytorch");
    assert_eq!(v["rows"][0]["policies"][1]["policy"], "expandable");
    // recorded traces from a cold start; a state-only snapshot is skipped
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let dir = file.parent().unwrap().to_str().unwrap();
    let o = reservoir(&["compare", "--traces", dir, "--no-workloads", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["start"], "cold");
    assert_eq!(v["rows"][0]["input"], "91c77ee1_snapshot.pickle#0");
    let state_only = shared_trace("stateonly-attention/9e5bfb67_memory.pickle").unwrap();
    let dir = state_only.parent().unwrap().to_str().unwrap();
    let o = reservoir(&["compare", "--traces", dir, "--no-workloads"]);
    assert!(!o.status.success(), "nothing to compare");
    assert!(stderr(&o).contains("nothing to compare"), "{}", stderr(&o));
    let o = reservoir(&["compare", "--traces", "/no/such/folder"]);
    assert!(stderr(&o).contains("--traces DIR"), "{}", stderr(&o));
}

#[test]
fn peak_and_oom_are_explained_in_table_json_and_html() {
    // gpt-train needs 890 MiB in PyTorch mode, 844 MiB with expandable
    // segments: on 860 MiB PyTorch mode runs out of memory.
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("explain.html");
    let args = [
        "replay",
        "--workload",
        "gpt-train",
        "-p",
        "pytorch",
        "--capacity",
        "860MiB",
        "--html",
        html.to_str().unwrap(),
    ];
    let o = reservoir(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "pytorch: reserved peak",
        "live allocations by site:",
        "pytorch: first OOM at op",
        "free blocks that could not serve it:",
        // The diagnosis (issue 30 item 1): the shortfall, the causes and
        // the proven fix.
        "  diagnosis: 30.00 MiB short (the allocator may use 860.00 MiB",
        "    fragmentation (scattered)             47.00 MiB",
        "  fix: set `expandable_segments:True` in the settings: proven by replay: no OOM, peak reserved 848.00 MiB",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("first OOM at op"),
        "no OOM explanation in the HTML"
    );
    assert!(page.contains("Diagnosis: <b>30.00 MiB short</b>"));
    assert!(page.contains("<td>fragmentation (scattered)</td><td>47.00 MiB</td>"));
    assert!(page
        .contains("Fix: set `expandable_segments:True` in the settings: proven by replay: no OOM"));
    let o = reservoir(&[&args[..7], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ex = &v[0]["explain"];
    assert_eq!(ex["setting"], "pytorch");
    assert_eq!(ex["oom"]["avoided_by"], "expandable_segments:True");
    let d = &ex["oom"]["diagnosis"];
    assert_eq!(d["shortfall"], 30 << 20);
    assert_eq!(d["causes"][0]["class"], "fragmentation");
    assert_eq!(d["causes"][0]["rule"], "scattered");
    assert_eq!(d["fix"]["kind"], "setting");
    assert_eq!(d["fix"]["peak_reserved"], 848 << 20);
    assert!(!ex["oom"]["unusable_free"].as_array().unwrap().is_empty());
    assert!(ex["peak"]["top_sites"][0]["bytes"].as_u64().unwrap() > 0);
    // A workload names what each allocation is for: at PyTorch mode's
    // reserved peak (the optimizer step) the AdamW state is the largest.
    assert_eq!(
        ex["peak"]["top_sites"][0]["site"], "optimizer state (AdamW)",
        "{}",
        ex["peak"]["top_sites"]
    );
    assert!(
        !out.contains(reservoir_replay::replay::sites::NO_STACK),
        "{out}"
    );

    // A recorded snapshot given by its absolute path: sites are the
    // innermost user frames, and the HTML names the file without its folder.
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let abs = file.canonicalize().unwrap();
    let abs = abs.to_str().unwrap();
    let o = reservoir(&[
        "replay",
        abs,
        "-p",
        "pytorch",
        "--html",
        html.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v[0]["explain"]["peak"]["top_sites"][0]["site"],
        "generate_snapshot.py:20:forward"
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("91c77ee1_snapshot.pickle (device 0)"));
    let dir = file
        .canonicalize()
        .unwrap()
        .parent()
        .unwrap()
        .display()
        .to_string();
    assert!(
        !page.contains(&dir),
        "the HTML report has the absolute path {dir}"
    );
    assert!(page.contains("generate_snapshot.py:20:forward"));
}

#[test]
fn compare_steady_exceptions_tolerate_listed_inputs_and_only_shrink() {
    // gpt-train (2 layers, 2 steps): the `reservoir` policy makes a driver
    // call in the steady state where PyTorch mode makes none; llm-infer
    // (4 requests): none for either (checked here, so the test says why it
    // expects what it expects).
    let (fails, passes) = ("gpt-train:layers=2,steps=2", "llm-infer:requests=4");
    let base = [
        "compare",
        "--no-traces",
        "--policy",
        "pytorch",
        "--policy",
        "reservoir",
        "-w",
        fails,
        "-w",
        passes,
    ];
    let v = reservoir(&[&base[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    let steady = |row: usize, p: usize| {
        v["rows"][row]["policies"][p]["steady_driver_time_ns"]
            .as_u64()
            .unwrap()
    };
    assert!(steady(0, 1) > steady(0, 0), "{v}");
    assert!(steady(1, 1) <= steady(1, 0), "{v}");

    let dir = std::env::temp_dir().join(format!("reservoir-steady-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |lines: &str| {
        let f = dir.join("exceptions.txt");
        std::fs::write(&f, lines).unwrap();
        reservoir(
            &[
                &base[..],
                &[
                    "--require-steady",
                    "reservoir",
                    "--steady-exceptions",
                    f.to_str().unwrap(),
                ],
            ]
            .concat(),
        )
    };
    // Not listed: the run fails and names the input.
    let o = run("# nothing known\n");
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains(&format!("workload {fails}")) && err.contains("not listed in"),
        "{err}"
    );
    // Listed (with a comment): reported, not failed.
    let o = run(&format!(
        "# why: see BENCHMARKS\nworkload {fails}   # one map per step\n\n"
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 of 2 inputs miss it"),
        "{}",
        stderr(&o)
    );
    // A listed input that meets the requirement fails the run: the list
    // only shrinks.
    let o = run(&format!("workload {fails}\nworkload {passes}\n"));
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("now meet it") && err.contains(&format!("workload {passes}")),
        "{err}"
    );
    // So does a listed input that was not compared.
    let o = run(&format!("workload {fails}\nworkload nope\n"));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("were not compared"), "{}", stderr(&o));
    // A missing file is named; the flag needs --require-steady.
    let missing = dir.join("missing.txt");
    let o = reservoir(
        &[
            &base[..],
            &[
                "--require-steady",
                "reservoir",
                "--steady-exceptions",
                missing.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("cannot read --steady-exceptions"),
        "{}",
        stderr(&o)
    );
    let o = reservoir(
        &[
            &base[..],
            &["--steady-exceptions", missing.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--require-steady"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn compare_require_fails_on_a_policy_over_the_bound_or_worse_than_another() {
    // llm-infer: expandable segments reserve more than PyTorch mode at the
    // peak (reservoir compare), and PyTorch mode stays within the bound.
    let base = [
        "compare",
        "--no-traces",
        "--workload",
        "llm-infer:requests=4",
    ];
    let v = reservoir(&[&base[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    let p = v["rows"][0]["policies"].as_array().unwrap();
    let reserved: Vec<u64> = p
        .iter()
        .map(|x| x["peak_reserved"].as_u64().unwrap())
        .collect();
    let least = *reserved.iter().min().unwrap();
    for (i, x) in p.iter().enumerate() {
        let name = x["policy"].as_str().unwrap();
        let ok = x["within_bound"] == true && reserved[i] == least;
        let o = reservoir(&[&base[..], &["--require", name]].concat());
        let (out, err) = (stdout(&o), stderr(&o));
        assert_eq!(o.status.success(), ok, "{name}: {out}\n{err}");
        if !ok {
            assert!(err.contains(&format!("--require {name}")), "{err}");
        }
        // the output is printed either way
        assert!(out.contains("within bound"), "{out}");
    }
    // --require-steady: steady-state driver time at most pytorch's
    let steady: Vec<u64> = p
        .iter()
        .map(|x| x["steady_driver_time_ns"].as_u64().unwrap())
        .collect();
    for (i, x) in p.iter().enumerate() {
        let name = x["policy"].as_str().unwrap();
        let ok = steady[i] <= steady[0];
        let o = reservoir(&[&base[..], &["--require-steady", name]].concat());
        let err = stderr(&o);
        assert_eq!(o.status.success(), ok, "{name}: {err}");
        if !ok {
            assert!(err.contains("steady-state driver time"), "{err}");
            // each violation says which calls made the time
            assert!(err.contains("in steady state (from op "), "{err}");
        }
        // the steady-state calls by kind, in the JSON
        for kind in ["mallocs", "frees", "maps", "unmaps", "reserves", "releases"] {
            assert!(x["steady_calls"][kind].is_u64(), "{name}: {kind}");
        }
    }
    let o = reservoir(
        &[
            &base[..],
            &["--policy", "reservoir", "--require-steady", "reservoir"],
        ]
        .concat(),
    );
    assert!(stderr(&o).contains("\"pytorch\" is not a compared policy"));
    // an unknown policy is refused before any work
    let o = reservoir(&[&base[..], &["--require", "max-split-128"]].concat());
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("not a compared policy"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn compare_capacity_sets_the_device_of_every_input() {
    let base = [
        "compare",
        "--no-traces",
        "--workload",
        "llm-infer",
        "--policy",
        "pytorch",
        "--policy",
        "reservoir",
    ];
    // `bound`: each input's own bound. llm-infer's PyTorch mode needs more
    // (1.17 x live against 1.09 x) and runs out of memory; `reservoir` fits.
    let o = reservoir(&[&base[..], &["--capacity", "bound", "--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let row = &v["rows"][0];
    assert_eq!(row["capacity"], row["bound"]);
    assert!(row["policies"][0]["ooms"].as_u64().unwrap() > 0, "{row}");
    assert_eq!(row["policies"][1]["ooms"], 0);
    assert_eq!(v["summary"][0]["inputs_with_ooms"], 1);
    assert_eq!(v["summary"][1]["inputs_with_ooms"], 0);
    // the table says it too
    let o = reservoir(&[&base[..], &["--capacity", "BOUND"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("OOMs") && out.contains("OOM inputs"), "{out}");
    // --require: running out of memory where another policy does not is
    // a violation; the peak of a policy that ran out is not compared with
    let o = reservoir(&[&base[..], &["--capacity", "bound", "--require", "pytorch"]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("pytorch runs out of memory") && err.contains("where reservoir does not"),
        "{err}"
    );
    let o = reservoir(
        &[
            &base[..],
            &["--capacity", "bound", "--require", "reservoir"],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // a size: the same device for every input (the default is 80 GiB)
    let o = reservoir(&[&base[..], &["--capacity", "1GiB", "--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["rows"][0]["capacity"], 1u64 << 30);
    let o = reservoir(&[&base[..], &["--json"]].concat());
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["rows"][0]["capacity"], 80u64 << 30);
    // anything else is refused, naming the value and what is accepted
    let o = reservoir(&[&base[..], &["--capacity", "lots"]].concat());
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("\"lots\"") && err.contains("`bound`"), "{err}");
}

/// Issue 29 (3): a 65,536-character setting name panicked in the table
/// ("Formatting argument out of range", exit 101). Names of `--setting`
/// and `--policy` are refused past 100 characters with a clear error that
/// does not repeat the whole argument; a long `--config` (named after
/// itself) is shown cut with an ellipsis in the table, and whole in the
/// JSON.
#[test]
fn long_setting_names_are_refused_or_cut_without_a_panic() {
    let long = "a".repeat(65_536);
    let o = reservoir(&[
        "replay",
        "-w",
        "gpt-train:steps=1",
        "--setting",
        &format!("{long}=max_split_size_mb:200"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("65536 characters") && err.contains("at most 100"),
        "{err}"
    );
    assert!(
        err.len() < 1_000,
        "the error repeats the argument: {} bytes",
        err.len()
    );
    let o = reservoir(&[
        "replay",
        "-w",
        "gpt-train:steps=1",
        "--policy",
        &format!("gc-0.{long}"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("at most 100"), "{}", stderr(&o));

    // a config of 60 settings (1,320 characters) names its column
    let config = vec!["max_split_size_mb:200"; 60].join(",");
    let o = reservoir(&["replay", "-w", "gpt-train:steps=1", "--config", &config]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let cut = format!("{}…", &config[..99]);
    assert!(out.contains(&cut), "{out}");
    assert!(
        out.contains(&format!("  {config}\n")),
        "the settings list has it whole"
    );
    let o = reservoir(&[
        "replay",
        "-w",
        "gpt-train:steps=1",
        "--json",
        "--config",
        &config,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["setting"].as_str(), Some(config.as_str()));

    // 3,000 settings (65,999 characters): no panic, whatever the length cap
    // of settings strings says
    let config = vec!["max_split_size_mb:200"; 3_000].join(",");
    let o = reservoir(&["replay", "-w", "gpt-train:steps=1", "--config", &config]);
    assert_ne!(o.status.code(), Some(101), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

/// Issue 29 (4): `reservoir replay /dev/zero` grew past 6 GB and never
/// ended. Inputs are regular files of at most `RESERVOIR_MAX_INPUT_BYTES`
/// (8 GiB by default); the error says the size, the limit and how to
/// raise it.
#[test]
fn replay_refuses_devices_and_files_over_the_size_limit() {
    let t = std::time::Instant::now();
    let o = reservoir(&["replay", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("/dev/zero: not a regular file (a character device)"),
        "{err}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let file = file.to_str().unwrap();
    let run = |limit: &str| {
        Command::new(env!("CARGO_BIN_EXE_reservoir"))
            .args(["replay", "--policy", "pytorch", "--json", file])
            .env("RESERVOIR_MAX_INPUT_BYTES", limit)
            .output()
            .unwrap()
    };
    let o = run("100000");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    for needle in [
        "140309 bytes",
        "input size limit of 100000 bytes",
        "RESERVOIR_MAX_INPUT_BYTES=BYTES",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    let o = run("140309");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run("lots");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("RESERVOIR_MAX_INPUT_BYTES=\"lots\": expected a number of bytes"),
        "{}",
        stderr(&o)
    );
}

/// Issue 29 (4): `compare --traces DIR` followed symbolic links: with
/// `DIR/self -> .` each trace was compared 40 times, and a link to
/// `/dev/zero` was read without end. Links to folders are now listed as
/// skipped, links to files are read when they are regular files.
#[test]
fn compare_does_not_follow_links_to_folders() {
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let dir = std::env::temp_dir().join(format!("reservoir-cli-links-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&file, dir.join("mlp.pickle")).unwrap();
    std::os::unix::fs::symlink(".", dir.join("self")).unwrap();
    let compare = |dir: &std::path::Path| {
        let o = reservoir(&[
            "compare",
            "--traces",
            dir.to_str().unwrap(),
            "--no-workloads",
            "--policy",
            "pytorch",
            "--json",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let v = compare(&dir);
    let inputs: Vec<&str> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["input"].as_str().unwrap())
        .collect();
    assert_eq!(inputs, ["mlp.pickle#0"]);
    assert_eq!(v["skipped"][0]["file"], "self");
    let why = v["skipped"][0]["reason"].as_str().unwrap();
    assert!(why.contains("symbolic link to a folder"), "{why}");
    // a link to a device is refused unread, and listed as skipped
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.pickle")).unwrap();
    let v = compare(&dir);
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    let skipped = v["skipped"].as_array().unwrap();
    let zero = skipped
        .iter()
        .find(|s| s["file"] == "zero.pickle")
        .unwrap_or_else(|| panic!("{skipped:?}"));
    assert!(
        zero["reason"]
            .as_str()
            .unwrap()
            .contains("not a regular file"),
        "{zero}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 29 (8): trace entries of an unknown action were dropped without a
/// warning while the fidelity line still said "exact". The snapshot of
/// tomi-mlp with its `free_requested` action renamed (same length, so the
/// pickle stays valid) to an action no PyTorch wrote.
#[test]
fn unknown_trace_actions_are_warned_about_and_not_called_exact() {
    let Some(file) = shared_trace("tomi-mlp/91c77ee1_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let bytes = std::fs::read(&file).unwrap();
    let (from, to) = (b"free_requested", b"free_announced");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the action is in the pickle");
    let mut renamed = bytes.clone();
    renamed[at..at + to.len()].copy_from_slice(to);
    let path = std::env::temp_dir().join(format!(
        "reservoir-unknown-action-{}.pickle",
        std::process::id()
    ));
    std::fs::write(&path, &renamed).unwrap();
    let p = path.to_str().unwrap();

    let o = reservoir(&["replay", "--policy", "pytorch", p]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let warning = "236 entries of unknown action \"free_announced\" skipped";
    assert_eq!(err.matches(warning).count(), 1, "warned once: {err}");
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.starts_with("fidelity of pytorch"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(!line.contains("(exact)"), "{line}");
    assert!(line.contains(&format!("not exact: {warning}")), "{line}");
    let o = reservoir(&["replay", "--policy", "pytorch", "--json", p]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["skipped_entries"]["free_announced"], 236);

    // the unchanged file: exact, no warning, no key
    let o = reservoir(&[
        "replay",
        "--policy",
        "pytorch",
        "--json",
        file.to_str().unwrap(),
    ]);
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v[0].get("skipped_entries").is_none(), "{}", v[0]);
    let _ = std::fs::remove_file(&path);
}

/// Issue 29 (8): `--policy large-segment-1000000000` failed the whole
/// command (the explanation of its OOM tried a fix that failed); with
/// expandable segments its 1 PB pages failed the replay itself. Now that
/// setting's column reports its OOMs and the other settings run.
#[test]
fn a_setting_that_cannot_fit_reports_its_ooms_while_the_others_run() {
    for args in [
        &[
            "--policy",
            "pytorch",
            "--policy",
            "large-segment-1000000000",
        ][..],
        &[
            "--policy",
            "pytorch",
            "--setting",
            "huge-pages=expandable_segments:True,large_segment_size_mb:1000000000",
        ][..],
    ] {
        let o = reservoir(&[&["replay", "-w", "gpt-train:steps=1", "--json"][..], args].concat());
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v[0]["setting"], "pytorch");
        assert_eq!(v[0]["ooms"], 0, "{args:?}");
        assert!(v[1]["ooms"].as_u64().unwrap() > 0, "{args:?}: {}", v[1]);
        assert!(v[1]["first_oom"]["message"].is_string(), "{}", v[1]);
    }
}

/// Issue 29 (8): `--capacity 18446744073709551615` overflowed in the
/// allocator. A capacity past the largest simulated device (16 TiB) is
/// refused up front, naming the value and the limit; 16 TiB runs.
#[test]
fn capacity_past_the_largest_simulated_device_is_refused() {
    for cmd in [
        &["replay", "-w", "gpt-train:steps=1"][..],
        &["compare", "--no-traces", "-w", "gpt-train:steps=1"][..],
    ] {
        let o = reservoir(&[cmd, &["--capacity", "18446744073709551615"][..]].concat());
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(
                "18446744073709551615 bytes, more than the largest simulated device, 16 TiB"
            ),
            "{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    let o = reservoir(&[
        "replay",
        "-w",
        "gpt-train:steps=1",
        "--json",
        "--capacity",
        "16T",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["capacity"].as_u64(), Some(16 << 40));
}

/// Issue 29 (5): `--workload gpt-train:layers=100000` reached 5.8 GB in
/// 12 s. A workload's ops are counted (without keeping them, stopping at
/// the limit) before it is generated; past `RESERVOIR_MAX_WORKLOAD_OPS`
/// (20 M by default) it is refused with the limit and how to raise it.
#[test]
fn workloads_past_the_size_limit_are_refused_up_front() {
    for cmd in [
        &["replay", "-w", "gpt-train:layers=100000"][..],
        &["workload", "gpt-train:layers=100000"][..],
        &["compare", "--no-traces", "-w", "gpt-train:layers=100000"][..],
        &["replay", "-w", "llm-infer:requests=2000000"][..],
    ] {
        let t = std::time::Instant::now();
        let o = reservoir(cmd);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("more than 20000000 ops") && err.contains("RESERVOIR_MAX_WORKLOAD_OPS=N"),
            "{cmd:?}: {err}"
        );
        assert!(t.elapsed() < std::time::Duration::from_secs(30), "{cmd:?}");
    }
    let with_limit = |limit: &str| {
        Command::new(env!("CARGO_BIN_EXE_reservoir"))
            .args(["workload", "gpt-train"])
            .env("RESERVOIR_MAX_WORKLOAD_OPS", limit)
            .output()
            .unwrap()
    };
    // gpt-train has 3,710 ops
    let o = with_limit("3709");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("more than 3709 ops"), "{}", stderr(&o));
    let o = with_limit("3710");
    assert!(o.status.success(), "{}", stderr(&o));
    let o = with_limit("many");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("RESERVOIR_MAX_WORKLOAD_OPS=\"many\": expected a number of ops"),
        "{}",
        stderr(&o)
    );
}

/// Issue 41 item 5: a recording that ends at its OOM (the program crashed
/// there) has no future: every "no OOM" claim covers the run only up to
/// the failure, and the output says so (the diagnosis' verdict, the
/// `--min-capacity` headline, `recording_ends_at_oom` in the JSON).
#[test]
fn a_recording_that_ends_at_its_oom_says_so() {
    use reservoir::backend::StreamId;
    use reservoir::caching::CachingAllocator;
    use reservoir::config::AllocatorConfig;
    use reservoir::sim::{SimConfig, SimDevice};
    const MIB: u64 = 1 << 20;
    let dev = SimDevice::new(SimConfig {
        capacity: 64 * MIB,
        ..SimConfig::default()
    });
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
    alloc.record_history(Some(usize::MAX));
    let _a = alloc.raw_alloc(30 * MIB, StreamId::DEFAULT).unwrap();
    let _b = alloc.raw_alloc(20 * MIB, StreamId::DEFAULT).unwrap();
    assert!(alloc.raw_alloc(20 * MIB, StreamId::DEFAULT).is_err());
    let file =
        std::env::temp_dir().join(format!("reservoir-cli-ends-{}.pickle", std::process::id()));
    std::fs::write(&file, alloc.snapshot(None).to_pickle().unwrap()).unwrap();
    let f = file.to_str().unwrap();
    let o = reservoir(&["replay", f, "-p", "pytorch", "--min-capacity"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("(up to op 2 only: the recording ends at its OOM there"),
        "{out}"
    );
    assert!(
        out.contains("(the recording ends at this OOM (op 2): the replay proves the run only up to the failure"),
        "{out}"
    );
    let o = reservoir(&["replay", f, "-p", "pytorch", "--min-capacity", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v[0]["recording_ends_at_oom"], 2);
    assert_eq!(
        v[0]["explain"]["oom"]["diagnosis"]["recording_ends_at_failure"],
        true
    );
    let _ = std::fs::remove_file(file);
}

/// The summary (issue 41 item 4) of `page`: what comes before the first
/// timeline, from the `<body>` on.
fn before_timelines(page: &str) -> &str {
    let body = page.find("<body>").expect("a body");
    let end = page.find("<svg class=\"timeline\"").unwrap_or(page.len());
    &page[body..end]
}

#[test]
fn memory_by_role_in_text_json_and_html() {
    // gpt-train on 860 MiB (issue 41 item 1): PyTorch mode's reserved peak
    // is the optimizer step, its OOM in the next step's forward.
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("roles.html");
    let args = [
        "replay",
        "--workload",
        "gpt-train",
        "-p",
        "pytorch",
        "--capacity",
        "860MiB",
        "--html",
        html.to_str().unwrap(),
    ];
    let o = reservoir(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "  live bytes by role: ",
        "parameters ",
        " (frames)",
        "memory by role at the OOM: ",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    let o = reservoir(&[&args[..7], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ex = &v[0]["explain"];
    let keys = [
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "temporaries",
        "inputs",
        "other",
    ];
    for at in ["peak", "oom"] {
        let roles = ex[at]["roles"].as_object().expect(at);
        assert_eq!(roles.len(), keys.len(), "{at}: {roles:?}");
        let sum: u64 = keys.iter().map(|k| roles[*k].as_u64().unwrap()).sum();
        // Every live byte has one role.
        assert_eq!(sum, ex[at]["allocated"].as_u64().unwrap(), "{at}");
        assert!(roles["parameters"].as_u64().unwrap() > 0, "{at}");
        assert!(
            ex[at]["role_basis"]["parameters"]["frames"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
    // At the optimizer step: the AdamW state and the gradients; of the
    // activations only the loss (one 512-byte block, freed by
    // `loss.item()` after the step); at the OOM (a forward): activations,
    // no gradients (set to None by `zero_grad`).
    let peak = &ex["peak"]["roles"];
    assert!(peak["optimizer_state"].as_u64().unwrap() > 0, "{peak}");
    assert!(peak["gradients"].as_u64().unwrap() > 0, "{peak}");
    assert_eq!(peak["activations"], 512, "{peak}");
    let oom = &ex["oom"]["roles"];
    assert!(oom["activations"].as_u64().unwrap() > 0, "{oom}");
    assert_eq!(oom["gradients"], 0, "{oom}");
    // The summary names the largest roles at the OOM.
    let s = &v[0]["summary"];
    assert_eq!(s["roles_at"], "oom");
    let first = s["roles"][0]["role"].as_str().unwrap();
    let max = keys
        .iter()
        .map(|k| oom[*k].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(oom[first].as_u64().unwrap(), max, "{s}");
    // The HTML: the roles in the summary's "why" and beside the sites.
    let page = std::fs::read_to_string(&html).unwrap();
    let first_screen = before_timelines(&page);
    assert!(
        first_screen.contains("<li class=\"roles\">memory by role at the OOM: "),
        "{first_screen}"
    );
    assert_eq!(page.matches("<table class=\"numbers roles\">").count(), 2);
}

#[test]
fn the_summary_comes_first_in_text_html_and_json() {
    // gpt-train on 860 MiB: PyTorch mode runs out of memory, 30 MiB short;
    // expandable segments fit.
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("summary.html");
    let args = [
        "replay",
        "--workload",
        "gpt-train",
        "-p",
        "pytorch",
        "-p",
        "expandable",
        "--capacity",
        "860MiB",
        "--min-capacity",
        "--html",
        html.to_str().unwrap(),
    ];
    let o = reservoir(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // The text: the summary, before the table.
    let summary = out.find("summary (pytorch):").expect(&out);
    let table = out.find("\npeak reserved ").expect(&out);
    assert!(
        summary < table,
        "the summary is not above the table:\n{out}"
    );
    let block = &out[summary..table];
    for needle in [
        "  what happened: OOM at op ",
        ": short by 30.00 MiB (",
        "  why:           fragmentation (scattered) 47.00 MiB: ",
        "  what to do:    set `expandable_segments:True` in the settings: proven by replay: no OOM",
        "  what fits:     this run fits on a ",
    ] {
        assert!(block.contains(needle), "missing {needle:?} in\n{block}");
    }
    let (what, why, todo, fits) = (
        block.find("what happened").unwrap(),
        block.find("why:").unwrap(),
        block.find("what to do").unwrap(),
        block.find("what fits").unwrap(),
    );
    assert!(what < why && why < todo && todo < fits, "{block}");

    // The JSON: a `summary` object per report, the same for each setting
    // of the input, made of the explanation's numbers.
    let o = reservoir(&[&args[..10], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let s = &v[0]["summary"];
    assert_eq!(s, &v[1]["summary"]);
    assert_eq!(s["setting"], "pytorch");
    let op = v[0]["explain"]["oom"]["op"].as_u64().unwrap();
    assert_eq!(s["oom_op"], op);
    assert_eq!(s["shortfall"], 30 << 20);
    assert_eq!(s["peak_reserved"], v[0]["peak_reserved"]);
    assert_eq!(
        s["happened"],
        format!("OOM at op {op}: short by 30.00 MiB (1 OOM in all)")
    );
    assert_eq!(s["why"][0]["cause"], "fragmentation (scattered)");
    assert_eq!(s["why"][0]["bytes"], 47 << 20);
    assert_eq!(s["fix"], v[0]["explain"]["oom"]["diagnosis"]["verdict"]);
    assert!(
        s["fits"]
            .as_str()
            .unwrap()
            .starts_with("this run fits on a "),
        "{s}"
    );

    // The HTML: the summary and the diagnosis before the timelines, within
    // the first screen (the first 4,000 bytes of the body); one table of
    // settings; an OOM marker on each timeline for PyTorch mode only.
    let page = std::fs::read_to_string(&html).unwrap();
    let first = before_timelines(&page);
    let body = &page[page.find("<body>").unwrap()..];
    let at = body.find("<div class=\"summary\">").expect("a summary");
    let short = body.find(": short by 30.00 MiB").expect("the shortfall");
    let fix = body
        .find("<dt>What to do</dt><dd>set `expandable_segments:True`")
        .expect("the fix");
    assert!(
        at < short && short < fix && fix < 4_000,
        "{}",
        &body[..fix.min(6_000)]
    );
    assert!(first.contains("<table class=\"numbers settings\">"));
    assert!(first.contains("Diagnosis: <b>30.00 MiB short</b>"));
    assert_eq!(
        page.matches("<table class=\"numbers settings\">").count(),
        1
    );
    assert_eq!(
        page.matches("live allocations by site at its reserved peak")
            .count(),
        1
    );
    assert!(
        !page.contains("expandable: reserved peak"),
        "a per-setting peak table"
    );
    let marker = format!("<g class=\"oom-marker\" data-setting=\"pytorch\" data-op=\"{op}\"><title>OOM with pytorch at op {op}: ");
    assert_eq!(page.matches(&marker).count(), 2, "one marker per timeline");
    assert_eq!(
        page.matches("class=\"oom-marker\"").count(),
        2,
        "no marker without an OOM"
    );
}

#[test]
fn a_real_snapshot_has_its_summary_first() {
    let Some(file) = shared_trace("select_n-bert-llama/ec5be110_snapshot.pickle") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("summary-real.html");
    let file = file.to_str().unwrap();
    // As recorded: no OOM.
    let o = reservoir(&["replay", file, "-p", "pytorch", "-p", "expandable"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let summary = out
        .find("summary (pytorch):\n  what happened: no OOM, peak reserved 20.97 GiB\n")
        .expect(&out);
    assert!(summary < out.find("\npeak reserved ").expect(&out), "{out}");
    // On 19 GiB: an OOM, diagnosed first and marked on the timelines.
    let o = reservoir(&[
        "replay",
        file,
        "-p",
        "pytorch",
        "-p",
        "expandable",
        "--capacity",
        "19GiB",
        "--html",
        html.to_str().unwrap(),
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let op = v[0]["summary"]["oom_op"]
        .as_u64()
        .expect("an OOM on 19 GiB");
    assert!(v[0]["summary"]["shortfall"].as_u64().unwrap() > 0);
    assert!(!v[0]["summary"]["why"].as_array().unwrap().is_empty());
    let page = std::fs::read_to_string(&html).unwrap();
    let first = before_timelines(&page);
    assert!(
        first.contains(&format!("OOM at op {op}: short by ")),
        "{first}"
    );
    assert!(first.contains("<dt>What to do</dt>"));
    assert!(page.contains(&format!("data-setting=\"pytorch\" data-op=\"{op}\"")));
}

/// Program levers (issue 41 item 2): after the cheapest settings fix (or
/// the proven "free" when no setting helps), each lever's transformed trace
/// replayed, in the text, the summary, `--json` and the HTML summary.
#[test]
fn program_levers_follow_the_settings_fix_in_text_json_and_html() {
    // On 600 MiB no setting avoids gpt-train's OOM: the levers replay with
    // PyTorch's defaults; halving the micro-batch fits, sharding the
    // optimizer state does not.
    let html = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("levers.html");
    let args = [
        "replay",
        "--workload",
        "gpt-train",
        "-p",
        "pytorch",
        "--capacity",
        "600MiB",
        "--html",
        html.to_str().unwrap(),
    ];
    let o = reservoir(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let micro = "halved the micro-batch (factor 1/2): the 1530 activation and temporary allocations of the trace (6.05 GiB in all) made half their size, every other allocation kept; replayed with PyTorch's default settings: peak reserved 592.00 MiB (allocated 535.42 MiB), fits in 600.00 MiB";
    for needle in [
        "  program levers, after the settings fix (each proven by a replay):",
        "    smaller micro-batch          592.00 MiB reserved fits  halved",
        micro,
        "sharded the optimizer state over 8 ranks (ZeRO stage 1; none of 2, 4, 8 ranks fits; 8 shown)",
        "does not fit in 600.00 MiB (its replay there runs out of memory); on an unbounded device it peaks at ",
        "checkpointed the 2 of 4 sites holding the most saved activations when they peak (op ",
        "                 then the program levers, each proven by replaying the changed trace:",
        "                 - smaller micro-batch: halved the micro-batch",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in\n{out}");
    }
    // In the summary, after the fix and before what fits.
    let (todo, then, fits) = (
        out.find("  what to do:    free ").unwrap(),
        out.find("then the program levers").unwrap(),
        out.find("  what fits:").unwrap(),
    );
    assert!(todo < then && then < fits, "{out}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<ul class=\"levers\"><li><b>smaller micro-batch</b> (fits): halved"));

    let o = reservoir(&[&args[..7], &["--json"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let levers = v[0]["explain"]["oom"]["levers"].as_array().unwrap();
    let names: Vec<&str> = levers
        .iter()
        .map(|l| l["lever"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "micro_batch",
            "optimizer_sharding",
            "activation_checkpointing",
            "lower_precision",
            "in_place"
        ]
    );
    assert_eq!(levers[0]["fits"], true);
    assert_eq!(levers[0]["peak_reserved"], 592 << 20);
    assert!(levers[0]["peak_allocated"].as_u64().unwrap() < 600 << 20);
    assert_eq!(levers[0]["replayed"], micro);
    assert_eq!(levers[1]["fits"], false);
    assert_eq!(v[0]["summary"]["levers"], v[0]["explain"]["oom"]["levers"]);

    // On 860 MiB expandable segments avoid the OOM: the levers replay
    // with them.
    let o = reservoir(&[
        "replay",
        "--workload",
        "gpt-train",
        "-p",
        "pytorch",
        "--capacity",
        "860MiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let needle = "replayed with `expandable_segments:True`: peak reserved 564.00 MiB (allocated 530.42 MiB), fits in 860.00 MiB";
    assert!(out.contains(needle), "missing {needle:?} in\n{out}");

    // Without an OOM, the levers cut the peak.
    let o = reservoir(&[
        "replay",
        "--workload",
        "gpt-train",
        "-p",
        "pytorch",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let peak = &v[0]["explain"]["peak"];
    let levers = peak["levers"].as_array().unwrap();
    assert_eq!(levers.len(), 5, "{peak}");
    for l in levers {
        assert!(
            l["peak_reserved"].as_u64().unwrap() < v[0]["peak_reserved"].as_u64().unwrap(),
            "{l}"
        );
    }
}
