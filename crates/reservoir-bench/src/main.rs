//! `reservoir-bench`: the same allocation sequences through Reservoir in
//! PyTorch mode, PyTorch's own caching allocator (`oracle_bench`, when set
//! up) and a no-cache baseline; prints ns per op (median of repetitions, as
//! a ratio to PyTorch measured in the same run) and instructions per
//! allocator call under callgrind. See README.md.
//!
//! ```text
//! cargo run --release -p reservoir-bench [-- --quick] [--no-callgrind] [--json FILE]
//! ```

#[cfg(feature = "cubecl")]
mod cubecl;
mod fastest;
mod measure;
mod offset;
mod ops;
mod run;
mod sequences;
mod threads;

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use run::{median, Impl};

const USAGE: &str =
    "usage: reservoir-bench [--quick] [--no-callgrind] [--json FILE] [--write-traces DIR] [--threads]\n\
                     (internal: reservoir-bench --child IMPL TRACE REPS)";

struct Row {
    name: String,
    ops: usize,
    pytorch_ns: Option<f64>,
    pytorch_ir: Option<f64>,
    /// ns per op of each of [`Impl::ALL`], in that order.
    ns: Vec<f64>,
    /// Instructions per call of each of [`Impl::ALL`] (never for no-cache).
    ir: Vec<Option<f64>>,
    /// Failed allocations of each of [`Impl::ALL`] over all repetitions.
    failed_allocs: Vec<usize>,
}

impl Row {
    fn ns(&self, imp: Impl) -> f64 {
        self.ns[index(imp)]
    }

    fn ir(&self, imp: Impl) -> Option<f64> {
        self.ir[index(imp)]
    }

    /// ns per op, marked when allocations failed (a failed call is cheap).
    fn ns_cell(&self, imp: Impl) -> String {
        match self.failed_allocs[index(imp)] {
            0 => format!("{:.1}", self.ns(imp)),
            n => format!("{:.1} ({n} failed)", self.ns(imp)),
        }
    }
}

fn index(imp: Impl) -> usize {
    Impl::ALL
        .iter()
        .position(|&i| i == imp)
        .expect("every Impl is in Impl::ALL")
}

/// The command line of a benchmark run.
struct Options {
    quick: bool,
    /// Count instructions under callgrind.
    callgrind: bool,
    /// `--json FILE`.
    json: Option<String>,
    /// `--write-traces DIR`.
    write_traces: Option<String>,
}

/// Read the command line; `Err` is the exit code of a run that ends there
/// (`--threads`, or a usage error).
fn parse_args(args: &[String]) -> Result<Options, ExitCode> {
    let mut o = Options {
        quick: false,
        callgrind: true,
        json: None,
        write_traces: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--threads" => return Err(threads_table()),
            "--no-callgrind" => o.callgrind = false,
            "--write-traces" => match it.next() {
                Some(d) => o.write_traces = Some(d.clone()),
                None => return Err(usage("--write-traces needs a folder")),
            },
            "--json" => match it.next() {
                Some(f) => o.json = Some(f.clone()),
                None => return Err(usage("--json needs a file name")),
            },
            other => return Err(usage(&format!("unknown argument {other:?}"))),
        }
    }
    if o.callgrind
        && std::process::Command::new("valgrind")
            .arg("--version")
            .output()
            .is_err()
    {
        eprintln!("valgrind is not installed: instruction counts skipped (apt-get install valgrind, or pass --no-callgrind)");
        o.callgrind = false;
    }
    Ok(o)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    let o = match parse_args(&args) {
        Ok(o) => o,
        Err(code) => return code,
    };
    let reps = if o.quick { 5 } else { 11 };
    let oracle = measure::oracle_bench();
    if oracle.is_none() {
        eprintln!(
            "SKIPPED-BACKEND PyTorch: ../shared/oracle/oracle_bench or its allocbench is missing \
             (run ../shared/oracle/setup-torch.sh); PyTorch columns are empty"
        );
    }
    if let Some(dir) = o.write_traces {
        return write_sequences(Path::new(&dir), o.quick);
    }
    let dir = std::env::temp_dir().join(format!("reservoir-bench-seq-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let seqs = sequences::all(o.quick);
    let mut rows = Vec::new();
    let mut failed = false;
    for (i, seq) in seqs.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, seqs.len(), seq.name);
        let file = dir.join(format!("seq{i}.txt"));
        if let Err(e) = std::fs::write(&file, &seq.text) {
            eprintln!("cannot write {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
        let bench = Bench {
            oracle: oracle.as_deref(),
            callgrind: o.callgrind,
            reps,
        };
        rows.push(bench.row(seq, &file, &mut failed));
    }
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", table(&rows));
    if let Some(f) = o.json {
        // A temporary file renamed into place (reservoir::outfile): a failed
        // write keeps the previous file.
        let json = to_json(&rows);
        let write = |w: &mut dyn std::io::Write| w.write_all(json.as_bytes());
        if let Err(e) = reservoir::outfile::write_file(std::path::Path::new(&f), write) {
            eprintln!("cannot write {f}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// How each sequence is measured.
struct Bench<'a> {
    /// `oracle_bench`, when set up.
    oracle: Option<&'a Path>,
    callgrind: bool,
    /// Repetitions timed.
    reps: usize,
}

impl Bench<'_> {
    /// Measure `seq` (written to `file`) with every implementation; a
    /// measurement that fails is reported and sets `failed`.
    fn row(&self, seq: &sequences::Sequence, file: &Path, failed: &mut bool) -> Row {
        let (oracle, reps) = (self.oracle, self.reps);
        let ops = ops::parse(&seq.text);
        let expected = ops::calls_without_failures(&ops) * reps;
        let mut failed_allocs = vec![0; Impl::ALL.len()];
        let ns: Vec<f64> = Impl::ALL.iter().map(|&imp| {
            let (t, calls) = run::run(imp, &ops, reps);
            failed_allocs[index(imp)] = expected.saturating_sub(calls);
            if calls < expected {
                eprintln!(
                    "  {}: {} of the allocations failed (out of device memory); its ns/op is marked",
                    imp.name(),
                    expected - calls
                );
            }
            median(t)
        }).collect();
        let mut note = |r: Result<f64, String>| match r {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("  {e}");
                *failed = true;
                None
            }
        };
        let pytorch_ns = oracle.and_then(|b| note(measure::pytorch_ns(b, file, reps)));
        let mut pytorch_ir = None;
        let mut ir = vec![None; Impl::ALL.len()];
        if self.callgrind {
            pytorch_ir = oracle.and_then(|b| note(measure::pytorch_instructions(b, file, 2)));
            for &imp in Impl::ALL {
                if imp != Impl::NoCache {
                    ir[index(imp)] = note(measure::own_instructions(imp, file, 2));
                }
            }
        }
        Row {
            name: seq.name.clone(),
            ops: ops.ops.len(),
            pytorch_ns,
            pytorch_ir,
            ns,
            ir,
            failed_allocs,
        }
    }
}

/// `--write-traces DIR`: write every sequence as an oracle trace file
/// (for `oracle_bench replay` or `reservoir replay` by hand).
fn write_sequences(dir: &Path, quick: bool) -> ExitCode {
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for seq in sequences::all(quick) {
        let name: String = seq
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let file = dir.join(format!("{name}.txt"));
        let write = |w: &mut dyn std::io::Write| w.write_all(seq.text.as_bytes());
        if let Err(e) = reservoir::outfile::write_file(&file, write) {
            eprintln!("cannot write {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
        println!("{}", file.display());
    }
    ExitCode::SUCCESS
}

/// `--threads`: throughput with 1, 2 and 4 threads, each on its own
/// stream, sharing one `CachingAllocator` (one lock per device) or one
/// `StreamShards` (one lock per stream), or each with its own allocator;
/// median and best of 11 runs each, and the rate with a core per thread
/// (from the busiest thread's CPU time) where threads never wait.
fn threads_table() -> ExitCode {
    use threads::Shared;
    const REPS: usize = 11;
    println!(
        "| allocator | threads (one stream each) | M ops/s median | vs 1 thread | M ops/s best | vs 1 thread | M ops/s with a core per thread | vs 1 thread |\n|---|---|---|---|---|---|---|---|"
    );
    for shared in [Shared::DeviceLock, Shared::StreamShards, Shared::Unshared] {
        let one = threads::ops_per_second(shared, 1, REPS);
        for n in [1, 2, 4] {
            let r = if n == 1 {
                one
            } else {
                threads::ops_per_second(shared, n, REPS)
            };
            let projected = match (shared, r.core_per_thread, one.core_per_thread) {
                (Shared::DeviceLock, _, _) => "n/a (threads wait on the lock) | n/a".to_string(),
                (_, Some(p), Some(p1)) => format!("{p:.2} | {:.2}x", p / p1),
                _ => "n/a (no per-thread CPU time) | n/a".to_string(),
            };
            println!(
                "| {} | {n} | {:.2} | {:.2}x | {:.2} | {:.2}x | {projected} |",
                shared.name(),
                r.median,
                r.median / one.median,
                r.best,
                r.best / one.best
            );
        }
    }
    ExitCode::SUCCESS
}

fn usage(msg: &str) -> ExitCode {
    eprintln!("reservoir-bench: {msg}\n{USAGE}");
    ExitCode::from(2)
}

/// `--child IMPL TRACE REPS`: run under callgrind by the parent; prints
/// `counted_ops=N` like allocbench.
fn child(args: &[String]) -> ExitCode {
    let (Some(imp), Some(file), Some(reps)) = (
        args.first().and_then(|a| Impl::parse(a)),
        args.get(1),
        args.get(2).and_then(|r| r.parse::<usize>().ok()),
    ) else {
        return usage("bad --child arguments");
    };
    let text = match std::fs::read_to_string(Path::new(file)) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {file}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (_, calls) = run::run(imp, &ops::parse(&text), reps);
    println!("counted_ops={calls}");
    ExitCode::SUCCESS
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

fn table(rows: &[Row]) -> String {
    let (res, fast) = (Impl::Reservoir, Impl::Fastest);
    // The other implementations, after Reservoir's two columns: their ns/op,
    // and instructions/call for all but the no-cache baseline.
    let others: Vec<Impl> = Impl::ALL[2..].to_vec();
    let counted: Vec<Impl> = others
        .iter()
        .copied()
        .filter(|&i| i != Impl::NoCache)
        .collect();
    let mut head = vec![
        "sequence".to_string(),
        "ops".into(),
        "PyTorch ns/op".into(),
        "Reservoir ns/op".into(),
        "ratio".into(),
        "fastest ns/op".into(),
        "ratio".into(),
    ];
    head.extend(others.iter().map(|i| format!("{} ns/op", i.name())));
    head.extend(
        [
            "PyTorch instr/call",
            "Reservoir instr/call",
            "ratio",
            "fastest instr/call",
            "ratio",
        ]
        .map(String::from),
    );
    head.extend(counted.iter().map(|i| format!("{} instr/call", i.name())));
    let mut s = format!("| {} |\n|{}\n", head.join(" | "), "---|".repeat(head.len()));
    for r in rows {
        let mut cells = vec![
            r.name.clone(),
            r.ops.to_string(),
            opt(r.pytorch_ns, 1),
            r.ns_cell(res),
            ratio(Some(r.ns(res)), r.pytorch_ns),
            r.ns_cell(fast),
            ratio(Some(r.ns(fast)), r.pytorch_ns),
        ];
        cells.extend(others.iter().map(|&i| r.ns_cell(i)));
        cells.extend([
            opt(r.pytorch_ir, 0),
            opt(r.ir(res), 0),
            ratio(r.ir(res), r.pytorch_ir),
            opt(r.ir(fast), 0),
            ratio(r.ir(fast), r.pytorch_ir),
        ]);
        cells.extend(counted.iter().map(|&i| opt(r.ir(i), 0)));
        writeln!(s, "| {} |", cells.join(" | ")).unwrap();
    }
    s
}

fn to_json(rows: &[Row]) -> String {
    let num = |v: Option<f64>| v.map_or("null".into(), |v| format!("{v:.2}"));
    let items: Vec<String> = rows
        .iter()
        .map(|r| {
            let own: Vec<String> = Impl::ALL
                .iter()
                .map(|&imp| {
                    format!(
                        "{:?}:{{\"ns\":{:.2},\"instructions\":{},\"failed_allocations\":{}}}",
                        imp.name(),
                        r.ns(imp),
                        num(r.ir(imp)),
                        r.failed_allocs[index(imp)]
                    )
                })
                .collect();
            format!(
                "{{\"sequence\":{:?},\"ops\":{},\"pytorch_ns\":{},\"pytorch_instructions\":{},{}}}",
                r.name,
                r.ops,
                num(r.pytorch_ns),
                num(r.pytorch_ir),
                own.join(",")
            )
        })
        .collect();
    format!("[{}]\n", items.join(","))
}
