//! Issue 44 ("Hardening, second pass"), the command's part, run as a user
//! runs it: every file the command reads goes through one reader (regular
//! files only, a size limit from the file's size), tables of any width,
//! `--jobs` within a limit, file names that look like options.
//!
//! `RESERVOIR_TEST_BIN=PATH` runs these tests against another build of
//! `reservoir` (an older one, to see them fail).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use reservoir_testkit::run::{stderr, stdout};

fn bin() -> String {
    std::env::var("RESERVOIR_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_reservoir").into())
}

/// `reservoir ARGS` in `dir` with `env` added. A run still going after
/// `WATCHDOG` is killed and the test fails: a FIFO that blocks the command
/// would otherwise hang the test (this is a guard, not a time bound: a
/// run that ends is judged by what it printed).
fn reservoir_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    const WATCHDOG: Duration = Duration::from_secs(300);
    let mut child = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("reservoir runs");
    // Read the pipes on threads, so a long output does not block the child.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut v).map(|_| v)
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut v).map(|_| v)
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > WATCHDOG {
            let _ = child.kill();
            let _ = child.wait();
            panic!("reservoir {args:?} did not end (blocked?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap().unwrap(),
        stderr: err.join().unwrap().unwrap(),
    }
}

/// A fresh scratch folder for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "reservoir-cli-hardening-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small allocatorSim log (any file name: the format is read from the
/// bytes): two blocks.
const SMALL_LOG: &str = "0 2 1048576\n1 3 2097152\n";

/// The three inputs no entry point may read: a FIFO (which blocks an
/// `open` for reading until a writer comes), `/dev/zero` (endless), and a
/// regular file over the size limit (100 bytes, with
/// `RESERVOIR_MAX_INPUT_BYTES=50`). Returns their paths.
struct BadInputs {
    fifo: PathBuf,
    big: PathBuf,
}

impl BadInputs {
    fn new(dir: &Path) -> BadInputs {
        let fifo = dir.join("fifo.pickle");
        let st = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(st.success());
        let big = dir.join("big.pickle");
        std::fs::write(&big, &SMALL_LOG.repeat(5).as_bytes()[..100]).unwrap();
        BadInputs { fifo, big }
    }
}

/// Run `args(path)` on each bad input and check the refusal: exit status
/// 1 and the reason on standard error (or, for a `--traces` folder, the
/// file listed as skipped with the reason), no panic, no block.
fn refuses_bad_inputs(name: &str, args: impl Fn(&Path, &Path) -> Vec<String>) {
    let dir = scratch(name);
    let bad = BadInputs::new(&dir);
    type Env<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&Path, &str, Env); 3] = [
        (&bad.fifo, "not a regular file (a FIFO)", &[]),
        (
            Path::new("/dev/zero"),
            "not a regular file (a character device)",
            &[],
        ),
        (
            &bad.big,
            "100 bytes (100 bytes), more than the input size limit of 50 bytes",
            &[("RESERVOIR_MAX_INPUT_BYTES", "50")],
        ),
    ];
    for (path, needle, env) in cases {
        let argv = args(path, &dir);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let o = reservoir_in(&dir, &argv, env);
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert!(!text.contains("panicked"), "{argv:?}: {text}");
        assert!(text.contains(needle), "{argv:?}: {needle:?} not in\n{text}");
        if env.is_empty() {
            assert!(
                !text.contains("RESERVOIR_MAX_INPUT_BYTES=BYTES"),
                "{argv:?}: {text}"
            );
        } else {
            assert!(
                text.contains("raise it with RESERVOIR_MAX_INPUT_BYTES=BYTES"),
                "{argv:?}: {text}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// The arguments of a run that fails on `path` with exit status 1.
fn failing(args: &[&str], path: &Path) -> Vec<String> {
    args.iter()
        .map(|a| if *a == "PATH" { s(path) } else { a.to_string() })
        .collect()
}

#[test]
fn replay_files_are_bounded_regular_files() {
    refuses_bad_inputs("replay", |p, _| {
        failing(&["replay", "--policy", "pytorch", "PATH"], p)
    });
}

#[test]
fn convert_inputs_are_bounded_regular_files() {
    refuses_bad_inputs("convert", |p, dir| {
        failing(
            &[
                "convert",
                "PATH",
                "--oracle-trace",
                &s(&dir.join("out.txt")),
            ],
            p,
        )
    });
}

#[test]
fn diff_inputs_are_bounded_regular_files() {
    refuses_bad_inputs("diff-a", |p, dir| {
        let good = dir.join("good.log");
        std::fs::write(&good, SMALL_LOG).unwrap();
        failing(&["diff", "PATH", &s(&good)], p)
    });
    refuses_bad_inputs("diff-b", |p, dir| {
        let good = dir.join("good.log");
        std::fs::write(&good, SMALL_LOG).unwrap();
        failing(&["diff", &s(&good), "PATH"], p)
    });
}

/// A file of a `--traces` folder that cannot be read is skipped, with the
/// reason, and the other inputs are compared.
#[test]
fn compare_folder_files_are_bounded_regular_files() {
    refuses_bad_inputs("traces", |p, dir| {
        let traces = dir.join("traces");
        let _ = std::fs::remove_dir_all(&traces);
        std::fs::create_dir_all(&traces).unwrap();
        std::os::unix::fs::symlink(p, traces.join("bad.pickle")).unwrap();
        vec![
            "compare".into(),
            "--traces".into(),
            s(&traces),
            "--workload".into(),
            "gpt-train:layers=1,steps=1".into(),
            "--policy".into(),
            "pytorch".into(),
            "--json".into(),
        ]
    });
}

/// Issue 44 (G4): `compare --merge /dev/zero` read 2.65 GB in 6 s, a FIFO
/// blocked.
#[test]
fn compare_merge_inputs_are_bounded_regular_files() {
    refuses_bad_inputs("merge", |p, _| failing(&["compare", "--merge", "PATH"], p));
}

#[test]
fn steady_exceptions_lists_are_bounded_regular_files() {
    refuses_bad_inputs("exceptions", |p, _| {
        failing(
            &[
                "compare",
                "--merge",
                "/nonexistent/never-read.json",
                "--policy",
                "pytorch",
                "--require-steady",
                "pytorch",
                "--steady-exceptions",
                "PATH",
            ],
            p,
        )
    });
}

/// The JSON of `compare --json` on a small workload.
fn small_compare_json(dir: &Path) -> serde_json::Value {
    let o = reservoir_in(
        dir,
        &[
            "compare",
            "--no-traces",
            "--workload",
            "gpt-train:layers=1,steps=1",
            "--policy",
            "pytorch",
            "--json",
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Issue 44 (G5): the aligned-table writer panicked (exit status 101) on a
/// column of 65,536 characters or more (`format!`'s `{:w$}` limit),
/// reached through a `--workload` argument and a merged input's name.
#[test]
fn tables_take_columns_of_any_width() {
    let dir = scratch("wide");
    // A workload spec may carry any number of empty items.
    let spec = format!("gpt-train:layers=1,steps=1{}", ",".repeat(70_000));
    let o = reservoir_in(
        &dir,
        &[
            "compare",
            "--no-traces",
            "--workload",
            &spec,
            "--policy",
            "pytorch",
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    let out = stdout(&o);
    let line = out.lines().find(|l| l.contains(&spec)).expect("the row");
    assert!(line.contains("pytorch"), "{}", &line[line.len() - 200..]);

    // A merged input's name.
    let mut v = small_compare_json(&dir);
    let long = format!("a-long-input-name-{}", "é".repeat(70_000));
    v["rows"][0]["input"] = serde_json::Value::String(long.clone());
    let file = dir.join("long.json");
    std::fs::write(&file, serde_json::to_vec(&v).unwrap()).unwrap();
    let o = reservoir_in(&dir, &["compare", "--merge", &s(&file)], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(stdout(&o).contains(&long));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 (G9): `--jobs` up to 4096 was accepted, and the run time grew
/// with the square of it (1,024 threads: 10 s, 4,096: over a minute, for
/// a run of 0.26 s). It is refused past 256 (or the number of cores where
/// more), naming the value, the limit and what to do.
#[test]
fn jobs_past_the_limit_are_refused_with_the_limit() {
    let dir = scratch("jobs");
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let limit = cores.max(256);
    let over = (limit + 1).to_string();
    for cmd in [
        &["replay", "-w", "gpt-train:layers=1,steps=1"][..],
        &["compare", "--no-traces"],
    ] {
        let o = reservoir_in(&dir, &[cmd, &["--jobs", &over]].concat(), &[]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let err = stderr(&o);
        for needle in [
            &format!("{over} threads is more than the limit of {limit}"),
            &format!("use --jobs {limit} or less, or leave --jobs out"),
        ] {
            assert!(err.contains(needle.as_str()), "{needle:?} not in {err}");
        }
    }
    let o = reservoir_in(
        &dir,
        &[
            "replay",
            "-w",
            "gpt-train:layers=1,steps=1",
            "--policy",
            "pytorch",
        ],
        &[("RAYON_NUM_THREADS", &over)],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "RAYON_NUM_THREADS={over}: more than {limit} worker threads"
        )),
        "{}",
        stderr(&o)
    );
    // The limit itself runs.
    let o = reservoir_in(
        &dir,
        &[
            "replay",
            "-w",
            "gpt-train:layers=1,steps=1",
            "--policy",
            "pytorch",
            "--jobs",
            &limit.to_string(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 (item 4): a file named like an option is replayed after `--`
/// or as `./NAME`; without either it is a usage error (exit status 2), not
/// a panic.
#[test]
fn a_file_named_like_an_option_is_replayable() {
    let dir = scratch("dash");
    std::fs::write(dir.join("-a.pickle"), SMALL_LOG).unwrap();
    for args in [
        &["replay", "--policy", "pytorch", "--", "-a.pickle"][..],
        &["replay", "--policy", "pytorch", "./-a.pickle"],
    ] {
        let o = reservoir_in(&dir, args, &[]);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).contains("-a.pickle"), "{}", stdout(&o));
    }
    let o = reservoir_in(&dir, &["replay", "-a.pickle"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 (item 3): each setting is one more replay of every input, and
/// their number was bounded only by the command line's length (some
/// 200,000 `--config` arguments); more than 64 are refused before any
/// replay, in `replay` and in `compare`.
#[test]
fn more_than_64_settings_are_refused_up_front() {
    let dir = scratch("settings");
    let configs: Vec<String> = (0..65)
        .flat_map(|i| {
            [
                "--config".to_string(),
                format!("max_split_size_mb:{}", 200 + i),
            ]
        })
        .collect();
    let configs: Vec<&str> = configs.iter().map(String::as_str).collect();
    let o = reservoir_in(
        &dir,
        &[
            &["replay", "-w", "gpt-train:layers=1,steps=1"][..],
            &configs,
        ]
        .concat(),
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o)
            .contains("65 settings (--policy, --setting, --config) is more than the limit of 64"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).is_empty());
    let policies: Vec<&str> = (0..65).flat_map(|_| ["--policy", "pytorch"]).collect();
    let o = reservoir_in(
        &dir,
        &[&["compare", "--no-traces"][..], &policies].concat(),
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("more than the limit of 64"),
        "{}",
        stderr(&o)
    );
    // 64 run.
    let o = reservoir_in(
        &dir,
        &[
            &["replay", "-w", "gpt-train:layers=1,steps=1"][..],
            &configs[..128],
        ]
        .concat(),
        &[],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 (F6): workloads were bounded in ops, not in the work a command
/// makes of them (`gpt-train:layers=800` took 45 s, `layers=5000` more than
/// ten minutes). The work, ops times replays, is estimated before the
/// trace is generated and refused past `RESERVOIR_MAX_REPLAY_WORK`
/// (default 2^32 op-replays), with the estimate and how to raise it.
#[test]
fn workload_work_is_estimated_and_refused_up_front() {
    let dir = scratch("work");
    let spec = "gpt-train:layers=1,steps=1";
    // Its ops, from the trace `reservoir workload` writes (one op a line
    // after the `#` header).
    let o = reservoir_in(&dir, &["workload", spec], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ops = stdout(&o)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count() as u64;
    assert!(ops > 0);
    let limit = "1000";
    for (args, replays, settings, each) in [
        (&["replay", "-w", spec][..], 18, 6, 3),
        (
            &[
                "replay",
                "-w",
                spec,
                "--policy",
                "pytorch",
                "--min-capacity",
            ],
            34,
            1,
            34,
        ),
        (&["compare", "--no-traces", "--workload", spec], 102, 3, 34),
    ] {
        let o = reservoir_in(&dir, args, &[("RESERVOIR_MAX_REPLAY_WORK", limit)]);
        let err = stderr(&o);
        if ops * replays <= 1000 {
            assert!(o.status.success(), "{args:?}: {err}");
            continue;
        }
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(stdout(&o).is_empty(), "{}", stdout(&o));
        let want = format!(
            "workload \"{spec}\": {ops} ops x {replays} replays ({settings} settings, up to {each} \
             replays each) = {} op-replays, more than the limit of 1000 op-replays",
            ops * replays
        );
        assert!(err.contains(&want), "{want:?} not in {err}");
        assert!(
            err.contains("raise it with RESERVOIR_MAX_REPLAY_WORK=N"),
            "{err}"
        );
    }
    // Raised, it runs; a bad value is named.
    let o = reservoir_in(
        &dir,
        &["replay", "-w", spec, "--policy", "pytorch"],
        &[("RESERVOIR_MAX_REPLAY_WORK", "1_000_000")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = reservoir_in(
        &dir,
        &["replay", "-w", spec],
        &[("RESERVOIR_MAX_REPLAY_WORK", "lots")],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("RESERVOIR_MAX_REPLAY_WORK=\"lots\": expected a number"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44 (F6): a workload far too large for its device ran out of
/// memory at nearly every allocation, and each out-of-memory error costs
/// the allocator a pass over every cached block (it releases them all, as
/// PyTorch's does): `gpt-train:layers=5000` on 80 GiB replayed for more
/// than ten minutes. A built-in workload's replay now stops past
/// `RESERVOIR_MAX_REPLAY_OOMS` (default 1000) out-of-memory errors, saying
/// so; `compare` lists the workload as skipped and compares the rest.
/// Counted, not timed: this workload meets 1660 on 16 MiB.
#[test]
fn workload_replays_stop_past_the_oom_limit() {
    let dir = scratch("ooms");
    let spec = "gpt-train:layers=8,steps=2";
    let replay = [
        "replay",
        "-w",
        spec,
        "--capacity",
        "16MiB",
        "--policy",
        "pytorch",
    ];
    let o = reservoir_in(&dir, &replay, &[]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(stdout(&o).is_empty(), "{}", stdout(&o));
    for want in [
        "out of memory 1001 times, more than the limit of 1000",
        "does not fit this device",
        "--capacity",
        "RESERVOIR_MAX_REPLAY_OOMS=N",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    // Raised (or 0, no limit), it runs on, to every one of them.
    for limit in ["100_000", "0"] {
        let mut args = replay.to_vec();
        args.push("--json");
        let o = reservoir_in(&dir, &args, &[("RESERVOIR_MAX_REPLAY_OOMS", limit)]);
        assert!(o.status.success(), "{limit}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let r = if v.is_array() { &v[0] } else { &v };
        assert_eq!(r["ooms"], 1660, "{limit}");
    }
    // `compare`: the workload over the limit is skipped, with the setting
    // and why; the other is compared.
    let small = "gpt-train:layers=1,steps=1";
    let compare = [
        "compare",
        "--no-traces",
        "--workload",
        spec,
        "--workload",
        small,
        "--capacity",
        "16MiB",
        "--policy",
        "pytorch",
        "--json",
    ];
    let o = reservoir_in(&dir, &compare, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{v}");
    assert_eq!(rows[0]["input"], format!("workload {small}"), "{v}");
    let skipped = v["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1, "{v}");
    assert_eq!(skipped[0]["file"], format!("workload {spec}"));
    let why = skipped[0]["reason"].as_str().unwrap();
    assert!(
        why.starts_with("under pytorch: ")
            && why.contains("more than the limit of 1000")
            && why.contains("RESERVOIR_MAX_REPLAY_OOMS=N"),
        "{why}"
    );
    let o = reservoir_in(&dir, &compare, &[("RESERVOIR_MAX_REPLAY_OOMS", "0")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["rows"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["rows"][0]["policies"][0]["ooms"], 1660, "{v}");
    assert!(v["skipped"].as_array().unwrap().is_empty(), "{v}");
    // A bad value is named.
    let o = reservoir_in(&dir, &replay, &[("RESERVOIR_MAX_REPLAY_OOMS", "lots")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("RESERVOIR_MAX_REPLAY_OOMS=\"lots\": expected a number"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
