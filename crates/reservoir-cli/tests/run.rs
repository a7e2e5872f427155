//! The `reservoir` command as a library (`reservoir_cli::run`,
//! `reservoir_cli::run_captured`, what the Python wheel calls) and the
//! binary's behaviour on a closed standard output.

use std::io::Read;
use std::process::{Command, Stdio};

use reservoir_testkit::traces::shared_trace;

const WORKLOAD: &str = "gpt-train:layers=1,steps=2";

/// `reservoir replay ... --json | head -c0`: the reader is gone before the
/// report is written. The command ends quietly with 141 (a shell's status
/// for SIGPIPE), not "error: writing JSON: Broken pipe" (status 1, as
/// before), a panic (`diff`, which printed with `print!`: status 101) or
/// success (`workloads`: status 0).
#[test]
fn a_closed_stdout_ends_quietly() {
    let snap =
        shared_trace("cs336-bcrafton/06f51ae4_memory_snapshot.pickle").expect("../shared/traces");
    let snap = snap.to_str().unwrap();
    for args in [
        &["replay", "--workload", WORKLOAD, "-p", "pytorch", "--json"][..],
        &["workloads"][..],
        &["workload", WORKLOAD][..],
        &["diff", snap, snap][..],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_reservoir"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(141), "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}");
    }
}

#[test]
fn run_captured_keeps_stdout_and_the_page_in_memory() {
    let dir = std::env::temp_dir().join(format!("reservoir-run-captured-{}", std::process::id()));
    let page = dir.join("report.html");
    let args = [
        "reservoir",
        "replay",
        "--workload",
        WORKLOAD,
        "-p",
        "pytorch",
        "-p",
        "expandable",
        "--json",
        "--html",
    ];
    let got =
        reservoir_cli::run_captured(args.iter().copied().chain([page.to_str().unwrap()])).unwrap();
    let json: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    let reports = json.as_array().unwrap();
    assert_eq!(reports.len(), 2);
    assert_eq!(reports[1]["setting"], "expandable");
    let html = got.html.unwrap();
    assert!(html.contains("class=\"segmap\"") && html.contains("class=\"timeline\""));
    assert!(!page.exists(), "the page is kept, not written");
    // The binary prints the same JSON (the measured times aside).
    let out = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(&args[1..args.len() - 1])
        .output()
        .unwrap();
    assert!(out.status.success());
    let untimed = |v: &serde_json::Value| {
        let mut v = v.clone();
        for r in v.as_array_mut().unwrap() {
            let r = r.as_object_mut().unwrap();
            r.retain(|k, _| !k.starts_with("allocator_ns") && k != "allocator_time_ns");
        }
        v
    };
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(untimed(&json), untimed(&printed));
}

#[test]
fn run_captured_returns_the_commands_error_message() {
    let e = reservoir_cli::run_captured(["reservoir", "replay", "-p", "fastest"]).unwrap_err();
    let out = Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(["replay", "-p", "fastest"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        format!("error: {e}\n")
    );
    // A command line clap refuses: its first line, without `error: `.
    let e = reservoir_cli::run_captured(["reservoir", "replay", "--capacity", "lots"]).unwrap_err();
    assert!(
        e.message
            .starts_with("invalid value 'lots' for '--capacity <SIZE>'"),
        "{e}"
    );
    assert_eq!(
        reservoir_cli::run(["reservoir", "replay", "--capacity", "lots"]),
        2
    );
}
