//! `reservoir compare`: every recorded trace of a folder (from a cold start)
//! and every built-in workload, under PyTorch mode and expandable segments
//! side by side (see [`reservoir_replay::compare`]).

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use rayon::prelude::*;

use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::compare::{
    compare_row, compare_setting, peak_ratio, summarize, trace_bound, CompareInput, CompareRow,
    PolicySummary,
};
use reservoir_replay::placement::Limit;
use reservoir_replay::replay::recorded::StartMode;
use reservoir_replay::replay::{ReplayError, StartState};
use reservoir_replay::workload;

use crate::limit::{self, CompareLimits};
use crate::table::format_ns;
use crate::{convert_file, policy_setting, Converted};
use crate::{par, ranks};

mod require;
use require::{read_exceptions, requirement_failures};

/// The policies compared when none is named.
const DEFAULT_POLICIES: [&str; 3] = ["pytorch", "expandable", "reservoir"];

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The folder of recorded traces (searched recursively; `.md` files are
    /// skipped, symbolic links to folders are not followed). Default: `$RESERVOIR_TRACES`, else `../shared/traces`.
    #[arg(long, value_name = "DIR")]
    traces: Option<PathBuf>,

    /// A policy to compare (repeatable; the names of `reservoir replay
    /// --policy`). Default: pytorch, expandable and reservoir.
    #[arg(long = "policy", short = 'p', value_name = "NAME")]
    policies: Vec<String>,

    /// A built-in workload to include (repeatable, `NAME[:key=value,...]`).
    /// Default: every preset.
    #[arg(long = "workload", short = 'w', value_name = "NAME")]
    workloads: Vec<String>,

    /// Leave out the built-in workloads.
    #[arg(long)]
    no_workloads: bool,

    /// Leave out the recorded traces.
    #[arg(long)]
    no_traces: bool,

    /// Print the rows and the summary as one JSON object instead of tables.
    #[arg(long)]
    json: bool,

    /// Fail (exit status 1, after the output) when this policy exceeds the
    /// bound (1.05 x peak live + 4 MiB per allocating stream) on any input,
    /// reserves more at its peak than another compared policy that did not
    /// run out of memory, or runs out of memory where another compared
    /// policy does not: the CI check of a default policy.
    #[arg(long, value_name = "POLICY")]
    require: Option<String>,

    /// Fail (exit status 1, after the output) when this policy's
    /// steady-state driver time exceeds PyTorch mode's (`pytorch`) on any
    /// input. The steady state is the second half of each input's ops and
    /// what follows its peak of live bytes (a program still growing is not
    /// in one).
    #[arg(long, value_name = "POLICY")]
    require_steady: Option<String>,

    /// With --require-steady: the inputs known to miss it, one name per
    /// line as the input column prints it (a line starting with `#`, and
    /// what follows ` #` on a line, are comments). They are
    /// reported, not failed; a listed input that now meets the requirement,
    /// or that was not compared, fails the run, so the list only shrinks.
    /// CI passes `tools/steady-exceptions.txt` (BENCHMARKS.md, "Steady state
    /// after the peak").
    #[arg(long, value_name = "FILE", requires = "require_steady")]
    steady_exceptions: Option<PathBuf>,

    /// The simulated device's capacity for every input: a size (bytes, or
    /// a number with K/M/G/T, e.g. 24GiB), or `bound` for each input's own
    /// bound (1.05 x peak live + 4 MiB per allocating stream): how each
    /// policy fares on a device that holds no more than the bound allows.
    /// A policy that needs more runs out of memory (the OOMs column).
    /// Default: a recorded trace's own (the capacity that reproduces its
    /// OOMs), else 80 GiB.
    #[arg(long, value_name = "SIZE|bound", value_parser = parse_capacity)]
    capacity: Option<Capacity>,

    /// Replay on at most N threads (default: every core, or
    /// `RAYON_NUM_THREADS`). The output is the same with any N.
    #[arg(long, value_name = "N", value_parser = par::parse_jobs)]
    jobs: Option<usize>,

    /// Compare only the K-th of N equal parts of the inputs (1-based, in
    /// input order: the trace files, then the workloads), e.g. `--shard
    /// 2/8` on the second of 8 machines; with --json the output says which
    /// part it is, and `--merge` puts the parts back together.
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    shard: Option<Shard>,

    /// Compare nothing: merge the `--json` outputs of earlier runs (the
    /// parts of one `--shard K/N` split, in any order, or any runs, in the
    /// order given) and print them as one run would, tables or (--json)
    /// JSON; --require and --require-steady check the merged rows.
    #[arg(
        long,
        value_name = "JSON",
        num_args = 1..,
        conflicts_with_all = ["traces", "workloads", "no_workloads", "no_traces", "capacity", "shard", "jobs"]
    )]
    merge: Vec<PathBuf>,
}

/// A `--shard K/N` argument: part `index` (1-based) of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shard {
    index: usize,
    count: usize,
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    let bad = || format!("{s:?} is not K/N with 1 <= K <= N (e.g. 2/8: the second of 8 parts)");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let index: usize = k.trim().parse().map_err(|_| bad())?;
    let count: usize = n.trim().parse().map_err(|_| bad())?;
    if index == 0 || index > count {
        return Err(bad());
    }
    Ok(Shard { index, count })
}

impl Shard {
    /// The part of `len` units this shard takes: `[(K-1) len / N, K len / N)`.
    fn range(self, len: usize) -> std::ops::Range<usize> {
        (self.index - 1) * len / self.count..self.index * len / self.count
    }
}

/// A `--capacity` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Capacity {
    /// This many bytes for every input.
    Size(u64),
    /// Each input's own bound ([`trace_bound`]).
    Bound,
}

fn parse_capacity(s: &str) -> Result<Capacity, String> {
    if s.trim().eq_ignore_ascii_case("bound") {
        return Ok(Capacity::Bound);
    }
    crate::size::parse_capacity(s)
        .map(Capacity::Size)
        .map_err(|e| format!("{e}, or `bound` (each input's bound)"))
}

/// Every trace file under `dir`, recursively, in path order, and the
/// symbolic links to folders found there, which are not descended: a link
/// back up (`DIR/self -> .`) would list every trace again at each level
/// (two such links: 2^40 paths before the OS stops them). A symbolic link
/// to a file is listed (the loader reads only regular files and refuses
/// the others, e.g. a link to `/dev/zero`).
fn trace_files(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut out = Vec::new();
    let mut linked_dirs = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries =
            std::fs::read_dir(&d).with_context(|| format!("cannot read {}", d.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("cannot read {}", d.display()))?;
            let p = e.path();
            let t = e
                .file_type()
                .with_context(|| format!("cannot read {}", p.display()))?;
            if t.is_dir() {
                stack.push(p);
            } else if t.is_symlink() && p.is_dir() {
                linked_dirs.push(p);
            } else if p.extension().map_or(true, |x| x != "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    linked_dirs.sort();
    Ok((out, linked_dirs))
}

fn traces_dir(args: &CompareArgs) -> Result<PathBuf> {
    let dir = args
        .traces
        .clone()
        .or_else(|| std::env::var_os("RESERVOIR_TRACES").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("../shared/traces"));
    if !dir.is_dir() {
        bail!(
            "{}: not a folder of traces (give one with --traces DIR, or --no-traces)",
            dir.display()
        );
    }
    Ok(dir)
}

/// A file that was not compared, and why.
type Skipped = (String, String);

/// One thing to compare: a trace file (each of its device traces), or a
/// workload.
enum Unit {
    File { path: PathBuf, rel: String },
    Workload(String),
}

/// What to compare, in order: each trace file under the traces folder,
/// then each workload, only the `--shard` part of them; and the symbolic
/// links to folders skipped (said by the first part of a split only).
fn units(args: &CompareArgs) -> Result<(Vec<Unit>, Vec<Skipped>)> {
    let mut units = Vec::new();
    let mut skipped = Vec::new();
    if !args.no_traces {
        let dir = traces_dir(args)?;
        let (files, linked_dirs) = trace_files(&dir)?;
        let rel = |path: &Path| {
            path.strip_prefix(&dir)
                .unwrap_or(path)
                .display()
                .to_string()
        };
        // Said once, by the first part of a split.
        if args.shard.map_or(true, |s| s.index == 1) {
            for path in linked_dirs {
                skipped.push((
                    rel(&path),
                    "a symbolic link to a folder (not followed: copy or move the folder in)".into(),
                ));
            }
        }
        for path in files {
            let rel = rel(&path);
            units.push(Unit::File { path, rel });
        }
    }
    if !args.no_workloads {
        if args.workloads.is_empty() {
            units.extend(
                workload::presets()
                    .iter()
                    .map(|p| Unit::Workload(p.name.to_string())),
            );
        } else {
            units.extend(args.workloads.iter().cloned().map(Unit::Workload));
        }
    }
    if let Some(shard) = args.shard {
        let range = shard.range(units.len());
        units = units.drain(range).collect();
    }
    Ok((units, skipped))
}

/// The inputs: each device trace of each file (cold start), then each
/// workload preset (only the `--shard` part of them); and the files that
/// were skipped, with the reason. Files are read and converted on every
/// core, the inputs kept in order.
fn inputs(args: &CompareArgs) -> Result<(Vec<CompareInput>, Vec<Skipped>)> {
    crate::check_setting_count(args.policies.len())?;
    let names: Vec<&str> = if args.policies.is_empty() {
        DEFAULT_POLICIES.to_vec()
    } else {
        args.policies.iter().map(String::as_str).collect()
    };
    let settings_for =
        |base: &str| -> Result<Vec<_>> { names.iter().map(|n| policy_setting(n, base)).collect() };
    // Read once, and only when a workload is compared.
    let max_ooms = if args.no_workloads {
        None
    } else {
        crate::max_replay_ooms()?
    };
    let (units, mut skipped) = units(args)?;
    let capacity = |mut input: CompareInput| {
        match args.capacity {
            Some(Capacity::Size(bytes)) => input.capacity = bytes,
            Some(Capacity::Bound) => {
                input.capacity = trace_bound(&input.trace, input.start.as_ref());
            }
            None => {}
        }
        input
    };
    let converted: Vec<Result<Result<Vec<CompareInput>, Skipped>>> =
        par::with_jobs(args.jobs, || {
            units
                .par_iter()
                .with_max_len(1)
                .map(|unit| -> Result<Result<Vec<CompareInput>, Skipped>> {
                    match unit {
                        Unit::File { path, rel } => {
                            let (_, devices, _) = match convert_file(path, None) {
                                Ok(v) => v,
                                Err(e) => {
                                    let why = crate::error_chain(&e);
                                    let prefix = format!("{}: ", path.display());
                                    let why = why.strip_prefix(&prefix).unwrap_or(&why).to_string();
                                    return Ok(Err((rel.clone(), why)));
                                }
                            };
                            // Each device with its own recorded settings.
                            let each = |c: Converted| -> Result<CompareInput> {
                                let rec = c.rec.with_start(StartMode::Cold);
                                Ok(capacity(CompareInput {
                                    name: format!("{rel}#{}", c.device),
                                    capacity: rec.capacity.unwrap_or(DEFAULT_CAPACITY),
                                    start: Some(rec.start),
                                    trace: rec.trace,
                                    settings: settings_for(&c.config)?,
                                    max_ooms: None,
                                }))
                            };
                            Ok(Ok(devices.into_iter().map(each).collect::<Result<_>>()?))
                        }
                        Unit::Workload(spec) => {
                            let (w, ops) = crate::load_workload_counted(spec)?;
                            // Each policy: its replay and its minimum
                            // capacity's bisection.
                            crate::check_work(
                                spec,
                                ops,
                                names.len(),
                                crate::replays_per_setting(true),
                            )?;
                            Ok(Ok(vec![capacity(CompareInput {
                                name: format!("workload {spec}"),
                                trace: w.trace(),
                                start: None::<StartState>,
                                capacity: DEFAULT_CAPACITY,
                                settings: settings_for("")?,
                                max_ooms,
                            })]))
                        }
                    }
                })
                .collect()
        })?;
    let mut out = Vec::new();
    for c in converted {
        match c? {
            Ok(inputs) => out.extend(inputs),
            Err(why) => skipped.push(why),
        }
    }
    Ok((out, skipped))
}

fn rows_table(rows: &[CompareRow], limits: &CompareLimits<'_>) -> String {
    let header = [
        "input",
        "policy",
        "peak live",
        "peak reserved",
        "ratio",
        "bound",
        "OOMs",
        "min capacity",
        "fragmentation tax",
        "driver calls",
        "driver time",
        "steady time",
        "ns/op",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for (i, r) in rows.iter().enumerate() {
        let taxes = limits.cells(i);
        for (k, p) in r.policies.iter().enumerate() {
            cells.push(vec![
                if k == 0 {
                    r.input.clone()
                } else {
                    String::new()
                },
                p.policy.clone(),
                format_size(p.peak_live),
                format_size(p.peak_reserved),
                format!("{:.3}", p.ratio),
                if p.within_bound { "ok" } else { "over" }.to_string(),
                p.ooms.to_string(),
                p.min_capacity.map_or("> 16 TiB".into(), format_size),
                taxes[k].clone(),
                p.driver_calls.to_string(),
                format_ns(p.driver_time_ns as f64),
                format_ns(p.steady_driver_time_ns as f64),
                format!("{:.0}", p.allocator_ns_per_op),
            ]);
        }
    }
    let mut out = String::new();
    crate::table::write_aligned(&mut out, &cells, 2);
    out
}

/// How many inputs the `steady time` column measures in full (their second
/// half), in part (their live bytes peak in the second half) or not at all
/// (they peak at their last op).
fn steady_state_line(rows: &[CompareRow]) -> String {
    let none = rows.iter().filter(|r| r.steady_start >= r.ops).count();
    let late = rows
        .iter()
        .filter(|r| r.steady_start > r.ops / 2 && r.steady_start < r.ops)
        .count();
    format!(
        "steady time: the second half of each input's ops, from its peak of live bytes on \
         ({} inputs whole, {late} from their peak, {none} peak at their last op and have none)\n",
        rows.len() - late - none
    )
}

fn summary_table(summary: &[PolicySummary], inputs: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "peak reserved / peak live over {inputs} inputs (bound: 1.05 x peak live + 4 MiB per allocating stream)"
    );
    let _ = writeln!(
        out,
        "{:12} {:>8} {:>8} {:>8}  {:>14}  {:>10}  {:>18}  {:>12}  {:>12}  worst input",
        "policy",
        "median",
        "p90",
        "worst",
        "within bound",
        "OOM inputs",
        "sum of min capacity",
        "driver time",
        "steady time"
    );
    for s in summary {
        let _ = writeln!(
            out,
            "{:12} {:>8.3} {:>8.3} {:>8.3}  {:>14}  {:>10}  {:>18}  {:>12}  {:>12}  {}",
            s.policy,
            s.median_ratio,
            s.p90_ratio,
            s.worst_ratio,
            format!("{}/{}", s.within_bound, s.inputs),
            s.inputs_with_ooms,
            format_size(s.total_min_capacity),
            format_ns(s.total_driver_time_ns as f64),
            format_ns(s.total_steady_driver_time_ns as f64),
            s.worst_input
        );
    }
    out
}

/// `reservoir compare`: every input under every policy, written as text or
/// JSON; fails when a `--require` or `--require-steady` bound is missed.
pub fn cmd_compare(args: CompareArgs) -> Result<()> {
    crate::check_setting_count(args.policies.len())?;
    let names: Vec<&str> = if args.policies.is_empty() {
        DEFAULT_POLICIES.to_vec()
    } else {
        args.policies.iter().map(String::as_str).collect()
    };
    if let Some(req) = &args.require {
        if !names.contains(&req.as_str()) {
            bail!("--require {req:?}: not a compared policy (add --policy {req})");
        }
    }
    if let Some(req) = &args.require_steady {
        for needed in [req.as_str(), "pytorch"] {
            if !names.contains(&needed) {
                bail!("--require-steady {req:?}: {needed:?} is not a compared policy (add --policy {needed})");
            }
        }
    }
    let exceptions = match &args.steady_exceptions {
        Some(path) => read_exceptions(path)?,
        None => Vec::new(),
    };
    let (rows, limits, skipped) = if args.merge.is_empty() {
        let (inputs, mut skipped) = inputs(&args)?;
        // A part of a split may hold nothing (more parts than inputs).
        if inputs.is_empty() && args.shard.is_none() {
            bail!("nothing to compare (no trace in the folder and --no-workloads)");
        }
        let (rows, limits, over) = compare_all(&inputs, args.jobs)?;
        skipped.extend(over);
        (rows, limits, skipped)
    } else {
        merge(&args.merge)?
    };
    let limits = CompareLimits {
        rows: &rows,
        limits: &limits,
    };
    write_comparison(&args, &rows, &limits, &skipped)?;
    let failures = requirement_failures(&args, &rows, &exceptions);
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    Ok(())
}

/// Compare every input under every setting, and find the limit of each
/// input (the yardstick of the minimum capacities, see `limit`): each
/// replay on its own core (at most `jobs` threads), the rows in input
/// order, with a progress bar on a terminal. A workload that runs out of
/// memory more often than its cap allows ([`ReplayError::TooManyOoms`]) is
/// left out of the rows and said in the skipped inputs returned, with the
/// setting and the error; any other failure of an input (the first in
/// input order) is the error.
fn compare_all(
    inputs: &[CompareInput],
    jobs: Option<usize>,
) -> Result<(Vec<CompareRow>, Vec<Limit>, Vec<Skipped>)> {
    let cells: Vec<(usize, usize)> = inputs
        .iter()
        .enumerate()
        .flat_map(|(i, input)| (0..input.settings.len()).map(move |k| (i, k)))
        .collect();
    let bar = par::progress_bar(
        cells.len() as u64,
        "{spinner} comparing [{bar:30}] {pos}/{len} replays ({eta} left) {msg}",
    );
    // The work, longest first (by ops): each idle thread takes the next
    // one (a greedy schedule: a long replay does not start last); the
    // results go back to input order.
    let mut tasks: Vec<Task> = cells
        .iter()
        .map(|&(i, k)| Task::Cell(i, k))
        .chain((0..inputs.len()).map(Task::Limit))
        .collect();
    let ops = |t: &Task| match *t {
        Task::Cell(i, _) | Task::Limit(i) => inputs[i].trace.ops.len(),
    };
    tasks.sort_by_key(|t| std::cmp::Reverse(ops(t)));
    let done: Vec<(Task, Done)> = par::with_jobs(jobs, || {
        tasks
            .into_iter()
            .par_bridge()
            .map(|t| match t {
                Task::Cell(i, k) => {
                    let r = compare_setting(&inputs[i], k);
                    bar.set_message(format!(
                        "{} ({} done)",
                        inputs[i].name, inputs[i].settings[k].name
                    ));
                    bar.inc(1);
                    (t, Done::Cell(r))
                }
                Task::Limit(i) => (
                    t,
                    Done::Limit(limit::limit_of(&inputs[i].trace, inputs[i].start.as_ref())),
                ),
            })
            .collect()
    })?;
    let mut results: Vec<Option<Result<_, _>>> = cells.iter().map(|_| None).collect();
    let mut limits: Vec<Option<Limit>> = vec![None; inputs.len()];
    let cell_index = |i: usize, k: usize| cells.binary_search(&(i, k)).expect("a cell of the list");
    for (t, d) in done {
        match (t, d) {
            (Task::Cell(i, k), Done::Cell(r)) => results[cell_index(i, k)] = Some(r),
            (Task::Limit(i), Done::Limit(l)) => limits[i] = Some(l),
            _ => unreachable!("each task gives its own kind of result"),
        }
    }
    let results: Vec<_> = results
        .into_iter()
        .map(|r| r.expect("every cell replayed"))
        .collect();
    let limits: Vec<Limit> = limits
        .into_iter()
        .map(|l| l.expect("every limit found"))
        .collect();
    bar.finish_and_clear();
    let mut results = results.into_iter();
    let mut rows = Vec::with_capacity(inputs.len());
    let mut kept = Vec::with_capacity(inputs.len());
    let mut over = Vec::new();
    for (input, limit) in inputs.iter().zip(limits) {
        let policies: Vec<_> = results.by_ref().take(input.settings.len()).collect();
        let too_many = policies
            .iter()
            .zip(&input.settings)
            .find_map(|(r, s)| match r {
                Err(e @ ReplayError::TooManyOoms { .. }) => Some(format!("under {}: {e}", s.name)),
                _ => None,
            });
        if let Some(why) = too_many {
            over.push((input.name.clone(), why));
            continue;
        }
        let policies = policies
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("comparing on {}", input.name))?;
        rows.push(compare_row(input, policies));
        kept.push(limit);
    }
    Ok((rows, kept, over))
}

/// One piece of [`compare_all`]'s work: input `i` under setting `k`, or
/// the limit of input `i`.
#[derive(Clone, Copy)]
enum Task {
    Cell(usize, usize),
    Limit(usize),
}

/// What a [`Task`] gives.
enum Done {
    Cell(Result<reservoir_replay::compare::PolicyResult, reservoir_replay::replay::ReplayError>),
    Limit(Limit),
}

/// One `--merge` file: its path, its part of a `--shard` split (`K`, `N`)
/// if it is one, and its JSON.
type Run<'a> = (&'a PathBuf, Option<(u64, u64)>, serde_json::Value);

/// The parts of a `--shard K/N` split among `runs` (file, part, JSON),
/// checked (all parts of one split, each once) and put in part order; runs
/// that are no part of a split are left in the order given.
fn order_parts(runs: &mut [Run<'_>]) -> Result<()> {
    let sharded = runs.iter().filter(|r| r.1.is_some()).count();
    if sharded == 0 {
        return Ok(());
    }
    if sharded < runs.len() {
        bail!("--merge: some files are parts of a --shard split and some are not; merge the parts first");
    }
    let count = runs[0].1.map_or(0, |s| s.1);
    let given = || {
        runs.iter()
            .map(|(f, s, _)| {
                let (k, n) = s.unwrap_or((0, 0));
                format!("{} ({k}/{n})", f.display())
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some((f, s, _)) = runs.iter().find(|r| r.1.map_or(0, |s| s.1) != count) {
        bail!(
            "--merge {}: part {} of {}, but {} is a part of {count} (parts given: {})",
            f.display(),
            s.map_or(0, |s| s.0),
            s.map_or(0, |s| s.1),
            runs[0].0.display(),
            given()
        );
    }
    for want in 1..=count {
        match runs
            .iter()
            .filter(|r| r.1.map_or(0, |s| s.0) == want)
            .count()
        {
            1 => {}
            0 => bail!(
                "--merge: part {want} of {count} is missing (parts given: {})",
                given()
            ),
            _ => bail!(
                "--merge: part {want} of {count} is given twice (parts given: {})",
                given()
            ),
        }
    }
    runs.sort_by_key(|r| r.1.map_or(0, |s| s.0));
    Ok(())
}

/// The rows, limits and skipped files of earlier `--json` runs (`--merge`):
/// the parts of a `--shard K/N` split in part order (each part once, all
/// of them), else the runs in the order given. An input compared twice is
/// refused.
fn merge(files: &[PathBuf]) -> Result<(Vec<CompareRow>, Vec<Limit>, Vec<Skipped>)> {
    let mut runs = Vec::new();
    for f in files {
        let text = crate::read_text_file("--merge", f)?;
        let v: serde_json::Value = serde_json::from_str(&text).with_context(|| {
            format!(
                "--merge {}: not JSON (the output of `reservoir compare --json`)",
                f.display()
            )
        })?;
        if !v.get("rows").is_some_and(serde_json::Value::is_array) {
            bail!(
                "--merge {}: no \"rows\" array: not the output of `reservoir compare --json`",
                f.display()
            );
        }
        let shard = match v.get("shard") {
            None => None,
            Some(s) => {
                let get = |k: &str| s.get(k).and_then(serde_json::Value::as_u64);
                match (get("index"), get("count")) {
                    (Some(index), Some(count)) if index >= 1 && index <= count => {
                        Some((index, count))
                    }
                    _ => bail!(
                        "--merge {}: \"shard\" {s} is not {{\"index\": K, \"count\": N}} with 1 <= K <= N",
                        f.display()
                    ),
                }
            }
        };
        runs.push((f, shard, v));
    }
    order_parts(&mut runs)?;
    let mut rows: Vec<CompareRow> = Vec::new();
    let mut limits = Vec::new();
    let mut skipped = Vec::new();
    let mut seen = std::collections::HashMap::new();
    for (f, _, v) in &runs {
        for (n, r) in v["rows"].as_array().into_iter().flatten().enumerate() {
            let mut row: CompareRow = serde_json::from_value(r.clone()).with_context(|| {
                format!(
                    "--merge {}: row {n} is not a row of `reservoir compare --json`",
                    f.display()
                )
            })?;
            let limit: Limit = serde_json::from_value(r["limit"].clone()).with_context(|| {
                format!(
                    "--merge {}: row {n} ({}) has no limit",
                    f.display(),
                    row.input
                )
            })?;
            // The ratio as the replay computes it (not as the text
            // rounds it).
            for p in &mut row.policies {
                p.ratio = peak_ratio(p.peak_reserved, p.peak_live);
            }
            if let Some(first) = seen.insert(row.input.clone(), f.display().to_string()) {
                bail!(
                    "--merge: input {:?} is in both {first} and {} (merge the parts of one split, or runs on different inputs)",
                    row.input,
                    f.display()
                );
            }
            rows.push(row);
            limits.push(limit);
        }
        for s in v
            .get("skipped")
            .and_then(|s| s.as_array())
            .into_iter()
            .flatten()
        {
            let field = |k: &str| s.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
            skipped.push((field("file"), field("reason")));
        }
    }
    if rows.is_empty() {
        bail!(
            "nothing to compare (no rows in the {} files merged)",
            runs.len()
        );
    }
    Ok((rows, limits, skipped))
}

/// Write the comparison to standard output: JSON (`--json`) or the tables.
fn write_comparison(
    args: &CompareArgs,
    rows: &[CompareRow],
    limits: &CompareLimits<'_>,
    skipped: &[Skipped],
) -> Result<()> {
    let summary = summarize(rows);
    crate::output::with_stdout(|out| {
        write_comparison_to(out, args, rows, limits, skipped, &summary)
    })
}

/// [`write_comparison`] to `out`.
fn write_comparison_to(
    out: &mut dyn Write,
    args: &CompareArgs,
    rows: &[CompareRow],
    limits: &CompareLimits<'_>,
    skipped: &[Skipped],
    summary: &[PolicySummary],
) -> Result<()> {
    let jobs = ranks::jobs(rows);
    if args.json {
        let skipped: Vec<serde_json::Value> = skipped
            .iter()
            .map(|(f, why)| serde_json::json!({"file": f, "reason": why}))
            .collect();
        let mut rows = serde_json::to_value(rows).context("serializing the rows")?;
        limits.add_json(&mut rows);
        let mut v = serde_json::json!({
            "start": "cold",
            "rows": rows,
            "summary": summary,
            "fragmentation_tax": limits.summary_json(),
            "rank_jobs": ranks::json(&jobs),
            "skipped": skipped,
        });
        if let (Some(shard), Some(obj)) = (args.shard, v.as_object_mut()) {
            obj.insert(
                "shard".into(),
                serde_json::json!({"index": shard.index, "count": shard.count}),
            );
        }
        serde_json::to_writer_pretty(&mut *out, &v).context("writing JSON")?;
        writeln!(out)?;
    } else {
        let mut text = rows_table(rows, limits);
        text.push('\n');
        text.push_str(&summary_table(summary, rows.len()));
        text.push_str(&steady_state_line(rows));
        text.push('\n');
        text.push_str(&limits.text());
        text.push_str(&ranks::text(&jobs));
        if !skipped.is_empty() {
            let _ = writeln!(text, "\nskipped {} inputs:", skipped.len());
            for (f, why) in skipped {
                let _ = writeln!(text, "  {f}: {why}");
            }
        }
        out.write_all(text.as_bytes())?;
    }
    Ok(())
}
