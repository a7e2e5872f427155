//! Issue 44 (item 4): the command line never panics. Arbitrary argument
//! vectors (option names and values, option-looking strings such as
//! `--capacity=1` and `-a.pickle`, strings of 65,536 characters and more,
//! bytes that are not UTF-8) run through the command's own entry point,
//! [`reservoir_cli::run_captured`], in this process: each ends in output
//! or an error message, never a panic.
//!
//! The runs are kept small and harmless: they run in a scratch folder
//! (the only paths they can name are in it, `/dev/zero` and a missing
//! one), `RESERVOIR_TRACES` names an empty folder and
//! `RESERVOIR_MAX_WORKLOAD_OPS` refuses every preset's size, so a command
//! line that parses replays at most a tiny workload or a two-block file.
//! This file holds one test: it sets the process's working folder and
//! environment. `PROPTEST_CASES=N` runs N cases (default 128).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt as _;

use proptest::prelude::*;
use proptest::sample::select;

/// Subcommands, and things that are none.
const COMMANDS: &[&str] = &[
    "replay",
    "compare",
    "diff",
    "convert",
    "workload",
    "workloads",
    "help",
    "--help",
    "--version",
    "bogus",
    "",
    "-a.pickle",
    "--",
];

/// Arguments worth combining: every option, option-looking values, sizes
/// at and past the limits, workload specs, paths.
const POOL: &[&str] = &[
    "--workload",
    "-w",
    "--policy",
    "-p",
    "--setting",
    "-s",
    "--config",
    "-c",
    "--capacity",
    "--device-total",
    "--device",
    "--start",
    "--min-capacity",
    "--json",
    "--html",
    "--torch",
    "--jobs",
    "--out",
    "-o",
    "--oracle-trace",
    "--traces",
    "--no-workloads",
    "--no-traces",
    "--require",
    "--require-steady",
    "--steady-exceptions",
    "--shard",
    "--merge",
    "--top",
    "--",
    "-",
    "--capacity=1",
    "--capacity=",
    "--jobs=0",
    "--jobs=4097",
    "--jobs=2",
    "-j",
    "-a.pickle",
    "./-a.pickle",
    "-wgpt-train",
    "--policy=pytorch",
    "--start=cold",
    "--device=4294967296",
    "0",
    "1",
    "-1",
    "2",
    "257",
    "4096",
    "18446744073709551615",
    "18446744073709551616",
    "1e400",
    "NaN",
    "80GiB",
    "16TiB",
    "17TiB",
    "1.5T",
    "0.0000001K",
    "bound",
    "1/2",
    "2/1",
    "0/0",
    "pytorch",
    "expandable",
    "reservoir",
    "mps-heap",
    "max-split-",
    "roundup-0",
    "gc-2",
    "large-segment-99999999999",
    "pytorch-2.99",
    "2.13",
    "cold",
    "recorded",
    "a=b",
    "=",
    "x=max_split_size_mb:1",
    "max_split_size_mb:0",
    "expandable_segments:True",
    "gpt-train",
    "gpt-train:layers=1,steps=1",
    "gpt-train:layers=1,steps=1,hidden=64,heads=1",
    "gpt-train:layers=0",
    "gpt-train:layers=99999999999999999999",
    "llama-7b-infer:requests=1,layers=1",
    "gpt-train:steps=1,layers=1,batch=1,seq=1",
    "gpt-train:,,,",
    "nope:a=b",
    "/dev/zero",
    "/nonexistent/x.pickle",
    "report.html",
    "out.txt",
    ".",
    "é",
    "\u{0}",
];

fn arg() -> impl Strategy<Value = OsString> {
    // No arbitrary string may name a path outside the scratch folder.
    let safe = |s: &String| !s.contains('/');
    prop_oneof![
        6 => select(POOL).prop_map(OsString::from),
        2 => "[ -~]{0,16}".prop_filter("no path", safe).prop_map(OsString::from),
        1 => any::<String>().prop_filter("no path", safe).prop_map(OsString::from),
        1 => prop::collection::vec(any::<u8>(), 0..12)
            .prop_filter("no path", |v| !v.contains(&b'/'))
            .prop_map(OsString::from_vec),
        1 => (select(&["a", "-", "9", ",", "é", "--capacity=", "gpt-train:"][..]), 65_536..70_000usize)
            .prop_map(|(s, n)| OsString::from(s.repeat(n / s.len()))),
        1 => (select(&["gpt-train:layers=1,steps=1", "--setting", "x="][..]), 65_536..70_000usize)
            .prop_map(|(s, n)| OsString::from(format!("{s}{}", ",".repeat(n)))),
    ]
}

fn argv() -> impl Strategy<Value = Vec<OsString>> {
    (select(COMMANDS), prop::collection::vec(arg(), 0..8)).prop_map(|(cmd, rest)| {
        let mut v = vec![OsString::from("reservoir")];
        if !cmd.is_empty() {
            v.push(cmd.into());
        }
        v.extend(rest);
        v
    })
}

/// Shown for a failing case: the arguments, long ones cut.
fn show(args: &[OsString]) -> String {
    let cut: Vec<String> = args
        .iter()
        .map(|a| {
            let s = a.to_string_lossy();
            match s.char_indices().nth(60) {
                Some((i, _)) => format!("{}... ({} bytes)", &s[..i], a.len()),
                None => s.into_owned(),
            }
        })
        .collect();
    format!("{cut:?}")
}

#[test]
fn arbitrary_command_lines_never_panic() {
    let dir = std::env::temp_dir().join(format!("reservoir-args-proptest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("traces")).unwrap();
    // A two-block allocatorSim log named like an option.
    std::fs::write(dir.join("-a.pickle"), "0 2 1048576\n1 3 2097152\n").unwrap();
    std::env::set_current_dir(&dir).unwrap();
    std::env::set_var("RESERVOIR_TRACES", dir.join("traces"));
    std::env::set_var("RESERVOIR_MAX_WORKLOAD_OPS", "5000");
    std::env::remove_var("RAYON_NUM_THREADS");
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(128);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(args in argv())| {
        let shown = show(&args);
        let result = std::panic::catch_unwind(|| reservoir_cli::run_captured(args.clone()));
        match result {
            Err(_) => prop_assert!(false, "panicked on {shown}"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                prop_assert!(!e.message.is_empty(), "empty error for {shown}");
                prop_assert!(!e.message.contains("panicked"), "{shown}: {}", e.message);
            }
        }
    });
    std::env::set_current_dir(std::env::temp_dir()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
