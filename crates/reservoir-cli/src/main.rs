//! `reservoir`: drive and inspect the Reservoir caching allocator.
//!
//! ```text
//! reservoir replay [--workload NAME[:key=value,...]] [--setting NAME=CONF]... [--config CONF]...
//!                  [--capacity SIZE] [--json]
//! reservoir workload NAME[:key=value,...] [--out FILE]
//! reservoir workloads
//! ```

mod size;
mod table;

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use reservoir::format::format_size;
use reservoir::replay::{replay_all, ReplayOptions, ReplaySetting};
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir::workload::{self, Workload, WorkloadKind};

/// Reservoir: PyTorch's CUDA caching allocator in Rust, and tools to study it
/// without a GPU.
#[derive(Debug, Parser)]
#[command(name = "reservoir", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a workload through the allocator on a simulated device, once
    /// per allocator setting, and compare the settings.
    Replay(ReplayArgs),
    /// Write a built-in workload's trace in the oracle's text format (for
    /// `oracle_replay.py TRACE OUT.json`).
    Workload(WorkloadArgs),
    /// List the built-in workloads and their parameters.
    Workloads,
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// Built-in workload: a preset name, optionally with parameters, e.g.
    /// `gpt-train:layers=24,hidden=2048,batch=8` (see `reservoir workloads`).
    #[arg(long, short, value_name = "NAME", default_value = "gpt-train")]
    workload: String,

    /// A named allocator setting, NAME=PYTORCH_CUDA_ALLOC_CONF (repeatable),
    /// e.g. `--setting big-split=max_split_size_mb:512`. Without any
    /// --setting or --config: pytorch, max-split-128, roundup-4 and gc-0.8.
    #[arg(long = "setting", short = 's', value_name = "NAME=CONF")]
    settings: Vec<String>,

    /// An allocator setting named after itself (repeatable), e.g.
    /// `--config expandable_segments:False`; "" is PyTorch's defaults.
    /// Replayed after the --setting ones.
    #[arg(long = "config", short = 'c', value_name = "CONF")]
    configs: Vec<String>,

    /// Simulated device capacity: bytes, or a number with K/M/G/T (binary
    /// units, optional iB/B), e.g. 80GiB, 24G, 1.5T.
    #[arg(long, value_name = "SIZE", default_value = "80GiB", value_parser = size::parse_size)]
    capacity: u64,

    /// Print the reports as a JSON array, one object per setting, instead of
    /// the table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct WorkloadArgs {
    /// Built-in workload: a preset name, optionally with parameters
    /// (`NAME:key=value,...`).
    #[arg(value_name = "NAME")]
    name: String,

    /// Write the trace to this file instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    out: Option<PathBuf>,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => cmd_replay(args),
        Command::Workload(args) => cmd_workload(args),
        Command::Workloads => cmd_workloads(),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The settings to compare, in command-line order (--setting first).
fn settings(args: &ReplayArgs) -> Result<Vec<ReplaySetting>> {
    if args.settings.is_empty() && args.configs.is_empty() {
        return Ok(ReplaySetting::defaults());
    }
    let mut out = Vec::new();
    for s in &args.settings {
        if !s.contains('=') {
            bail!(
                "--setting {s:?}: expected NAME=CONF, e.g. --setting \
                 max-split-128=max_split_size_mb:128 (use --config CONF for an unnamed setting)"
            );
        }
        out.push(ReplaySetting::parse(s).with_context(|| format!("--setting {s:?}"))?);
    }
    for c in &args.configs {
        let setting = ReplaySetting::from_config(c);
        setting
            .allocator_config()
            .with_context(|| format!("--config {c:?}"))?;
        out.push(setting);
    }
    let mut seen = HashSet::new();
    for s in &out {
        if !seen.insert(s.name.as_str()) {
            bail!("the setting name {:?} is given twice", s.name);
        }
    }
    Ok(out)
}

fn load_workload(spec: &str) -> Result<Workload> {
    Workload::parse(spec).with_context(|| format!("workload {spec:?}"))
}

fn cmd_replay(args: ReplayArgs) -> Result<()> {
    if args.capacity == 0 {
        bail!("--capacity must be more than 0 bytes");
    }
    let settings = settings(&args)?;
    let w = load_workload(&args.workload)?;
    let trace = w.trace();
    let options = ReplayOptions {
        capacity: args.capacity,
        ..ReplayOptions::default()
    };

    // A progress bar only on a terminal, and only once the replay has taken
    // more than a second.
    let total = (trace.ops.len() * settings.len()) as u64;
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    bar.set_style(
        ProgressStyle::with_template("{spinner} replaying [{bar:40}] {percent}% ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut shown = false;
    let reports = replay_all(&trace, &settings, &options, &mut |done| {
        if !shown && tty && start.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_position(done as u64);
    })
    .with_context(|| format!("replaying workload {}", w.preset))?;
    bar.finish_and_clear();

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &reports).context("writing JSON")?;
        writeln!(out)?;
    } else {
        writeln!(out, "workload {}", w.spec())?;
        writeln!(
            out,
            "{} ops replayed on a simulated {} device ({} settings) in {:.2} s\n",
            trace.ops.len(),
            format_size(args.capacity),
            settings.len(),
            start.elapsed().as_secs_f64()
        )?;
        write!(out, "{}", table::render(&reports))?;
    }
    out.flush()?;
    Ok(())
}

fn cmd_workload(args: WorkloadArgs) -> Result<()> {
    let w = load_workload(&args.name)?;
    let trace = w.trace();
    match &args.out {
        Some(path) => {
            let f =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let mut f = BufWriter::new(f);
            trace
                .write_to(&mut f)
                .and_then(|_| f.flush())
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "wrote {} ops of {} to {}",
                trace.ops.len(),
                w.spec(),
                path.display()
            );
        }
        None => {
            let stdout = std::io::stdout();
            let mut out = BufWriter::new(stdout.lock());
            trace
                .write_to(&mut out)
                .and_then(|_| out.flush())
                .context("writing the trace")?;
        }
    }
    Ok(())
}

fn cmd_workloads() -> Result<()> {
    let presets = workload::presets();
    let w = presets.iter().map(|p| p.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    out.push_str("Built-in workloads (reservoir replay --workload NAME[:key=value,...]):\n\n");
    for p in presets {
        out.push_str(&format!("  {:w$}  {}\n", p.name, p.description));
    }
    for kind in [WorkloadKind::GptTrain, WorkloadKind::LlmInfer] {
        let names: Vec<&str> = presets
            .iter()
            .filter(|p| p.kind == kind)
            .map(|p| p.name)
            .collect();
        out.push_str(&format!(
            "\nParameters of {} ({}):\n",
            kind,
            names.join(", ")
        ));
        let kw = kind.params().iter().map(|p| p.key.len()).max().unwrap_or(0);
        for p in kind.params() {
            out.push_str(&format!("  {:kw$}  {}\n", p.key, p.help));
        }
    }
    out.push_str(&format!(
        "\nThe default device capacity is {} (--capacity).\n",
        format_size(DEFAULT_CAPACITY)
    ));
    print!("{out}");
    Ok(())
}
