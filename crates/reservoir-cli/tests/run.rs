//! The `reservoir` command as a library (`reservoir_cli::run`,
//! `reservoir_cli::run_captured`, what the Python wheel calls).

use std::process::Command;

const WORKLOAD: &str = "gpt-train:layers=1,steps=2";

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
