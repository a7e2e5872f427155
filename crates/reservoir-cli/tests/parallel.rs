//! Issue 31 (3), many inputs at once: `reservoir compare`, `replay A B C`
//! and `--min-capacity` replay on every core (`--jobs N`, default every
//! core) and print what the one-thread run prints; a folder of per-rank
//! snapshots is summarised per rank and for the job; the `--json` outputs
//! of a `--shard K/N` split merge (`compare --merge`) into the whole run's.
//!
//! The host-timed allocator nanoseconds (`ns/op`, `allocator_ns_*`) are
//! wall-clock measurements that differ between any two runs, one thread or
//! not: they are masked before comparing; everything else is compared byte
//! for byte.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use reservoir_testkit::run::{stderr, stdout};
use reservoir_testkit::traces::shared_trace;

/// `reservoir ARGS` with the environment `env` added.
fn reservoir_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reservoir"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("reservoir runs")
}

fn reservoir(args: &[&str]) -> Output {
    reservoir_env(args, &[])
}

/// Its standard output, after checking that it succeeded.
fn ok(o: &Output) -> String {
    assert!(o.status.success(), "failed: {}", stderr(o));
    stdout(o)
}

/// Zero every host-timed number (`allocator_*` keys ending in `ns` or
/// holding `_ns_`) in a JSON output, and print it back.
fn mask_json(text: &str) -> String {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k.starts_with("allocator_") && (k.ends_with("_ns") || k.contains("_ns_")) {
                        *x = serde_json::json!(0);
                    } else {
                        walk(x);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut v: serde_json::Value = serde_json::from_str(text).expect("JSON output");
    walk(&mut v);
    serde_json::to_string_pretty(&v).unwrap()
}

/// `reservoir compare`'s text without its last column (`ns/op`, host
/// time, the last of the first table; its width changes no other column).
fn mask_compare_text(text: &str) -> String {
    let (rows, rest) = text.split_once("\n\n").expect("two tables");
    let rows: Vec<&str> = rows
        .lines()
        .map(|l| {
            l.trim_end()
                .rsplit_once(' ')
                .map_or(l, |(a, _)| a)
                .trim_end()
        })
        .collect();
    format!("{}\n\n{rest}", rows.join("\n"))
}

/// `reservoir replay`'s text without its host-timed rows (`allocator time
/// per call`), each run of spaces one space (those rows set the width of
/// the columns).
fn mask_replay_text(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("allocator time per call"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A fresh, empty folder for this test.
fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("reservoir-par-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Small shared traces with trace entries (`None` without ../shared/traces).
fn small_traces() -> Option<Vec<PathBuf>> {
    [
        "octree-nca/55ff68f5_cuda_single_step.pickle",
        "mlsys-experiments-linear/ce57167c_profile_no_grad.pkl",
        "mlsys-experiments-linear/2b1505da_profile_grad.pkl",
        "allocatorsim-alexnet/07702e3a_input_alexnet_train.log",
    ]
    .iter()
    .map(|rel| shared_trace(rel))
    .collect()
}

/// A folder of one job's per-rank snapshots, `rank0.pickle` ...
/// `rank2.pickle` (links to small shared traces), beside a file of
/// another name; `None` without the shared traces.
fn rank_folder(name: &str) -> Option<PathBuf> {
    let traces = small_traces()?;
    let dir = fresh_dir(name);
    for (i, t) in traces[..3].iter().enumerate() {
        std::os::unix::fs::symlink(t, dir.join(format!("rank{i}.pickle"))).unwrap();
    }
    std::os::unix::fs::symlink(&traces[3], dir.join("alexnet_train.log")).unwrap();
    Some(dir)
}

/// The workloads of these tests: small, so a debug build compares them in
/// seconds.
const WORKLOADS: [&str; 4] = [
    "-w",
    "gpt-train:layers=2,steps=2",
    "-w",
    "llm-infer:requests=4",
];

#[test]
fn compare_prints_the_same_on_one_thread_and_several() {
    let dir = rank_folder("threads");
    let dir_s = dir.as_ref().map(|d| d.to_str().unwrap().to_string());
    let mut base = vec!["compare"];
    match &dir_s {
        Some(d) => base.extend(["--traces", d]),
        None => {
            eprintln!("../shared/traces not found: workloads only");
            base.push("--no-traces");
        }
    }
    base.extend(WORKLOADS);
    for json in [false, true] {
        let mut args = base.clone();
        if json {
            args.push("--json");
        }
        let mask = |o: &Output| {
            let out = ok(o);
            if json {
                mask_json(&out)
            } else {
                mask_compare_text(&out)
            }
        };
        let one = mask(&reservoir(&[&args[..], &["--jobs", "1"]].concat()));
        let three = mask(&reservoir(&[&args[..], &["--jobs", "3"]].concat()));
        assert_eq!(one, three, "--jobs 1 and --jobs 3 differ");
        let env_one = mask(&reservoir_env(&args, &[("RAYON_NUM_THREADS", "1")]));
        let env_four = mask(&reservoir_env(&args, &[("RAYON_NUM_THREADS", "4")]));
        assert_eq!(one, env_one, "--jobs 1 and RAYON_NUM_THREADS=1 differ");
        assert_eq!(one, env_four, "one thread and RAYON_NUM_THREADS=4 differ");
        if !json {
            assert!(one.contains("workload llm-infer:requests=4"), "{one}");
        }
    }
    if let Some(d) = dir {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn replay_of_several_files_prints_the_same_on_one_thread_and_several() {
    let Some(traces) = small_traces() else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let files: Vec<&str> = traces.iter().map(|t| t.to_str().unwrap()).collect();
    for json in [false, true] {
        let mut args = vec!["replay", "--min-capacity", "--start", "cold"];
        args.extend(&files);
        if json {
            args.push("--json");
        }
        let run = |jobs: &str| {
            let out = ok(&reservoir(&[&args[..], &["--jobs", jobs]].concat()));
            if json {
                mask_json(&out)
            } else {
                mask_replay_text(&out)
            }
        };
        let one = run("1");
        assert_eq!(one, run("3"), "--jobs 1 and --jobs 3 differ");
        if json {
            // One report per file and setting, in the order of the files.
            let v: serde_json::Value = serde_json::from_str(&one).unwrap();
            let reports = v.as_array().unwrap();
            assert_eq!(reports.len(), 4 * 6);
            for (k, r) in reports.iter().enumerate() {
                assert_eq!(r["file"], files[k / 6], "report {k}");
                assert!(r["min_capacity"].is_u64(), "report {k}: {r}");
            }
        } else {
            // The files' sections in the order given.
            let at: Vec<usize> = files.iter().map(|f| one.find(f).unwrap()).collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
        }
    }
}

/// The bytes of `p`'s `min_capacity` (`None`: JSON null).
fn min_of(p: &serde_json::Value) -> Option<u64> {
    p["min_capacity"].as_u64()
}

#[test]
fn per_rank_snapshots_are_summarised_per_rank_and_for_the_job() {
    let Some(dir) = rank_folder("ranks") else {
        eprintln!("skipped: ../shared/traces not found");
        return;
    };
    let d = dir.to_str().unwrap();
    let args = ["compare", "--traces", d, "--no-workloads"];
    let v: serde_json::Value =
        serde_json::from_str(&ok(&reservoir(&[&args[..], &["--json"]].concat()))).unwrap();
    let jobs = v["rank_jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "one job: {jobs:?}");
    let job = &jobs[0];
    assert_eq!(job["pattern"], "rank{rank}.pickle");
    let ranks = job["ranks"].as_array().unwrap();
    assert_eq!(
        ranks
            .iter()
            .map(|r| r["rank"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // Each rank's cells are its row's; the job needs the largest of them.
    let rows = v["rows"].as_array().unwrap();
    let row_of = |input: &str| rows.iter().find(|r| r["input"] == input).unwrap();
    let policies = ["pytorch", "expandable", "reservoir"];
    for (k, policy) in policies.iter().enumerate() {
        let mut mins = Vec::new();
        for (i, r) in ranks.iter().enumerate() {
            let input = format!("rank{i}.pickle#0");
            assert_eq!(r["inputs"], serde_json::json!([input]));
            let p = &row_of(&input)["policies"][k];
            assert_eq!(p["policy"], *policy);
            assert_eq!(r["policies"][k]["policy"], *policy);
            assert_eq!(min_of(&r["policies"][k]), min_of(p), "rank {i} {policy}");
            assert_eq!(r["policies"][k]["peak_reserved"], p["peak_reserved"]);
            mins.push(min_of(p).expect("these traces fit"));
        }
        let fits = mins.iter().copied().max().unwrap();
        let worst = mins.iter().position(|&m| m == fits).unwrap() as u64;
        let summary = &job["policies"][k];
        assert_eq!(summary["policy"], *policy);
        assert_eq!(summary["fits_every_rank"].as_u64(), Some(fits), "{policy}");
        assert_eq!(summary["worst_rank"].as_u64(), Some(worst), "{policy}");
        // The ranks are not all alike: the job's size is not rank 0's.
        assert!(fits > mins[0], "{policy}: {mins:?}");
    }
    let text = ok(&reservoir(&args));
    assert!(
        text.contains("per-rank snapshots of one job, rank{rank}.pickle (3 ranks)"),
        "{text}"
    );
    for line in ["fits every rank", "worst rank"] {
        assert!(text.lines().any(|l| l.starts_with(line)), "{line}: {text}");
    }
    // The other file is no rank; alone, a rank file is no job.
    std::fs::remove_file(dir.join("rank1.pickle")).unwrap();
    std::fs::remove_file(dir.join("rank2.pickle")).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&ok(&reservoir(&[&args[..], &["--json"]].concat()))).unwrap();
    assert_eq!(v["rank_jobs"], serde_json::json!([]));
    assert!(!ok(&reservoir(&args)).contains("per-rank"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Run `args` with `--shard K/N` for each part, write each part's JSON in
/// `dir`, and return the files, last part first.
fn split_run(args: &[&str], parts: usize, dir: &Path) -> Vec<String> {
    (1..=parts)
        .rev()
        .map(|k| {
            let shard = format!("{k}/{parts}");
            let out = ok(&reservoir(&[args, &["--json", "--shard", &shard]].concat()));
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["shard"], serde_json::json!({"index": k, "count": parts}));
            let f = dir.join(format!("part{k}of{parts}.json"));
            std::fs::write(&f, out).unwrap();
            f.to_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn a_split_run_merged_is_the_whole_run() {
    let dir = rank_folder("merge");
    let parts_dir = fresh_dir("merge-parts");
    let dir_s = dir.as_ref().map(|d| d.to_str().unwrap().to_string());
    let mut args = vec!["compare"];
    match &dir_s {
        Some(d) => args.extend(["--traces", d]),
        None => args.push("--no-traces"),
    }
    args.extend(WORKLOADS);
    let whole_json = mask_json(&ok(&reservoir(&[&args[..], &["--json"]].concat())));
    let whole_text = mask_compare_text(&ok(&reservoir(&args)));
    // More parts than some have inputs for: an empty part merges too.
    for parts in [2, 7] {
        let files = split_run(&args, parts, &parts_dir);
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        let merged = reservoir(&[&["compare", "--json", "--merge"][..], &files].concat());
        assert_eq!(mask_json(&ok(&merged)), whole_json, "{parts} parts, JSON");
        let merged = reservoir(&[&["compare", "--merge"][..], &files].concat());
        assert_eq!(
            mask_compare_text(&ok(&merged)),
            whole_text,
            "{parts} parts, text"
        );
    }
    // --require checks the merged rows as it checks a run's.
    let files = split_run(&args, 2, &parts_dir);
    let o = reservoir(&[
        "compare",
        "--merge",
        &files[0],
        &files[1],
        "--require",
        "pytorch",
    ]);
    assert!(
        !o.status.success(),
        "pytorch is over the bound on gpt-train"
    );
    assert!(stderr(&o).contains("--require pytorch:"), "{}", stderr(&o));
    for d in [dir, Some(parts_dir)].into_iter().flatten() {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn bad_parts_and_arguments_are_refused_by_name() {
    let dir = fresh_dir("bad-merge");
    let args = [
        "compare",
        "--no-traces",
        "-w",
        "gpt-train:layers=2,steps=2",
        "-w",
        "llm-infer:requests=4",
    ];
    let files = split_run(&args, 2, &dir);
    let (p2, p1) = (files[0].as_str(), files[1].as_str());
    let fails = |args: &[&str], needle: &str| {
        let o = reservoir(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        let e = stderr(&o);
        assert!(e.contains(needle), "{args:?}: {needle:?} not in {e}");
        assert!(stdout(&o).is_empty(), "{args:?} printed {}", stdout(&o));
    };
    fails(&["compare", "--merge", p1], "part 2 of 2 is missing");
    fails(
        &["compare", "--merge", p1, p1],
        "part 1 of 2 is given twice",
    );
    let whole = dir.join("whole.json");
    std::fs::write(&whole, ok(&reservoir(&[&args[..], &["--json"]].concat()))).unwrap();
    let whole = whole.to_str().unwrap();
    fails(&["compare", "--merge", p1, whole], "some files are parts");
    fails(&["compare", "--merge", whole, whole], "is in both");
    let three = split_run(&args, 3, &dir);
    fails(&["compare", "--merge", p1, p2, &three[0]], "a part of 2");
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "not json").unwrap();
    fails(
        &["compare", "--merge", junk.to_str().unwrap()],
        "junk.json: not JSON",
    );
    std::fs::write(&junk, "{\"rows\": 3}").unwrap();
    fails(
        &["compare", "--merge", junk.to_str().unwrap()],
        "no \"rows\" array",
    );
    fails(
        &["compare", "--merge", "/no/such.json"],
        "cannot read --merge /no/such.json: No such file",
    );
    fails(
        &["compare", "--merge", p1, "--no-traces"],
        "cannot be used with",
    );
    fails(&["compare", "--shard", "3/2"], "\"3/2\" is not K/N");
    fails(&["compare", "--shard", "0/2"], "\"0/2\" is not K/N");
    fails(
        &["compare", "--jobs", "0"],
        "\"0\" is not a number of threads",
    );
    fails(
        &["replay", "--jobs", "many"],
        "\"many\" is not a number of threads",
    );
    let _ = std::fs::remove_dir_all(dir);
}
