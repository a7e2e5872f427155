//! `reservoir`: drive and inspect the Reservoir caching allocator.
//!
//! ```text
//! reservoir replay [FILE]... [--workload NAME[:key=value,...]] [--policy NAME]...
//!                  [--setting NAME=CONF]... [--config CONF]... [--capacity SIZE] [--device N]
//!                  [--json] [--html REPORT.html]
//! reservoir convert FILE --oracle-trace OUT [--device N]
//! reservoir workload NAME[:key=value,...] [--out FILE]
//! reservoir workloads
//! reservoir compare [--traces DIR] [--policy NAME]... [--no-workloads] [--no-traces] [--json]
//! ```

mod compare;
mod explain;
mod html;
mod size;
mod table;

use std::collections::HashSet;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::capacity::{min_capacity, MinCapacity};
use reservoir_replay::replay::explain::Explanation;
use reservoir_replay::replay::recorded::{
    convert, describe_skipped, overlay_config, recorded_setting, replay_recorded, RecordedReport,
    RecordedTrace, StartMode,
};
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::{
    replay_all, ReplayOptions, ReplayReport, ReplaySetting, StartState,
};
use reservoir_replay::workload::{self, Workload, WorkloadKind};

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
    /// Replay recorded snapshots (or a built-in workload) through the
    /// allocator on a simulated device, once per allocator setting: how
    /// exactly PyTorch's recorded behaviour is reproduced, and what other
    /// settings would have done.
    Replay(ReplayArgs),
    /// Convert a recorded snapshot's trace to the oracle's text format (for
    /// `oracle_replay.py TRACE OUT.json`).
    Convert(ConvertArgs),
    /// Write a built-in workload's trace in the oracle's text format (for
    /// `oracle_replay.py TRACE OUT.json`).
    Workload(WorkloadArgs),
    /// List the built-in workloads and their parameters.
    Workloads,
    /// Compare policies (PyTorch mode, expandable segments) side by side on
    /// every recorded trace of a folder, from a cold start, and every
    /// built-in workload: peak live and reserved bytes, their ratio, the
    /// minimum capacity, driver calls and time, allocator time per call.
    Compare(compare::CompareArgs),
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// Recorded traces: PyTorch memory snapshot pickles
    /// (`torch.cuda.memory._dump_snapshot`), `alloc_data` JSON of old
    /// `_memory_viz` pages, or allocatorSim logs.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,

    /// Built-in workload: a preset name, optionally with parameters, e.g.
    /// `gpt-train:layers=24,hidden=2048,batch=8` (see `reservoir workloads`).
    /// The default when no FILE is given: gpt-train.
    #[arg(long, short, value_name = "NAME")]
    workload: Option<String>,

    /// A named policy (repeatable): `pytorch` (the recorded settings),
    /// `expandable` (expandable_segments:True), `max-split-N`
    /// (max_split_size_mb:N, default 128), `roundup-N`
    /// (roundup_power2_divisions:N, default 4), `gc-T`
    /// (garbage_collection_threshold:T with a 0.95 memory fraction, default
    /// 0.8), `large-segment-N` (large_segment_size_mb:N), `mps-heap`
    /// (PyTorch's MPS heap allocator instead). What-if policies change the
    /// recorded settings. Without any policy, --setting or
    /// --config: all of them with their defaults.
    #[arg(long = "policy", short = 'p', value_name = "NAME")]
    policies: Vec<String>,

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
    /// units, optional iB/B), e.g. 80GiB, 24G, 1.5T; at most 16 TiB.
    /// Default: for a recorded trace with OOMs, the capacity that reproduces them
    /// (device_free + reserved at the first oom entry); else 80GiB.
    #[arg(long, value_name = "SIZE", value_parser = size::parse_capacity)]
    capacity: Option<u64>,

    /// The device whose trace to replay (default: every device with events).
    #[arg(long, value_name = "N")]
    device: Option<u32>,

    /// Where a recorded trace's replay starts: `recorded` (the segments and
    /// blocks PyTorch held at the first entry, at their recorded addresses:
    /// exact replay) or `cold` (an empty allocator: the blocks live at the
    /// first entry are allocated first, in address order; policies are
    /// compared on this).
    #[arg(long, value_name = "MODE", default_value = "recorded")]
    start: StartMode,

    /// Also find, for each setting, the smallest device capacity (to 2 MiB)
    /// on which the trace runs without an out-of-memory error, by bisection
    /// over the deterministic replay; prints the headline "fits on a X GPU
    /// with `A`, needs Y with PyTorch's defaults" and adds `min_capacity`
    /// to the JSON.
    #[arg(long)]
    min_capacity: bool,

    /// Print the reports as a JSON array, one object per input and setting,
    /// instead of the table.
    #[arg(long)]
    json: bool,

    /// Also write a self-contained HTML report (timelines, segment map at
    /// the peak, the numbers).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct ConvertArgs {
    /// A recorded trace (any format `reservoir replay` reads).
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Write the oracle's text format here. Traces that start mid-run get a
    /// prelude that rebuilds the start state with allocations (see the
    /// header comment of the output).
    #[arg(long = "oracle-trace", value_name = "OUT")]
    oracle_trace: PathBuf,

    /// The device (default: the first with events).
    #[arg(long, value_name = "N")]
    device: Option<u32>,
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
        Command::Convert(args) => cmd_convert(args),
        Command::Workload(args) => cmd_workload(args),
        Command::Workloads => cmd_workloads(),
        Command::Compare(args) => compare::cmd_compare(args),
    };
    if let Err(e) = result {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes, `: `-separated, each said once: many errors
/// already include their cause in their own message (`pickle at byte 2:
/// ...` wraps the pickle reader's error and names it as its source), so a
/// cause whose text was already printed is skipped.
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let msg = cause.to_string();
        if msg.is_empty() || out.contains(&msg) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
    }
    out
}

/// The what-if policies replayed on a recorded trace when none is named.
const DEFAULT_POLICIES: [&str; 6] = [
    "pytorch",
    "expandable",
    "reservoir",
    "max-split-128",
    "roundup-4",
    "gc-0.8",
];

/// The longest name a setting may have (`--setting NAME=CONF`, `--policy
/// NAME`), in characters: a name labels a column of the tables. A
/// `--config CONF` setting is named after its configuration, which may be
/// longer; the tables cut it (see [`table::MAX_SHOWN_NAME`]). See
/// docs/limits.md.
const MAX_SETTING_NAME: usize = table::MAX_SHOWN_NAME;

/// `s` quoted for an error message: whole when short, else its first
/// [`table::MAX_SHOWN_NAME`] characters and its length (a message should
/// not repeat a 64 KiB argument).
fn quoted(s: &str) -> String {
    match s.char_indices().nth(table::MAX_SHOWN_NAME) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes in all)", &s[..cut], s.len()),
    }
}

/// Refuse a setting name longer than [`MAX_SETTING_NAME`].
fn check_setting_name(what: &str, name: &str) -> Result<()> {
    let n = name.chars().count();
    if n > MAX_SETTING_NAME {
        bail!(
            "{what} {}: the name is {n} characters long; a setting's name is at most \
             {MAX_SETTING_NAME} (it labels a column of the table; --config CONF names a \
             setting after its configuration)",
            quoted(name)
        );
    }
    Ok(())
}

/// The setting of a named policy on top of the recorded settings `base`.
fn policy_setting(name: &str, base: &str) -> Result<ReplaySetting> {
    check_setting_name("--policy", name)?;
    let param = |prefix: &str| name.strip_prefix(prefix).map(|r| r.trim_start_matches('-'));
    let change = if name == "pytorch" {
        return Ok(ReplaySetting::new("pytorch", base));
    } else if name == "mps-heap" {
        return Ok(ReplaySetting::mps_heap());
    } else if name == "expandable" {
        "expandable_segments:True".to_string()
    } else if name == "reservoir" {
        "policy:reservoir".to_string()
    } else if let Some(n) = param("max-split") {
        format!("max_split_size_mb:{}", if n.is_empty() { "128" } else { n })
    } else if let Some(n) = param("roundup") {
        format!(
            "roundup_power2_divisions:{}",
            if n.is_empty() { "4" } else { n }
        )
    } else if let Some(t) = param("gc") {
        format!(
            "garbage_collection_threshold:{},per_process_memory_fraction:0.95",
            if t.is_empty() { "0.8" } else { t }
        )
    } else if let Some(n) = param("large-segment") {
        format!(
            "large_segment_size_mb:{}",
            if n.is_empty() { "64" } else { n }
        )
    } else {
        bail!(
            "unknown policy {name:?}; known: pytorch, expandable, reservoir, max-split-N, roundup-N, \
             gc-T, large-segment-N, mps-heap (or use --setting NAME=CONF)"
        );
    };
    let setting = ReplaySetting::new(name, overlay_config(base, &change));
    setting
        .allocator_config()
        .with_context(|| format!("--policy {}", quoted(name)))?;
    Ok(setting)
}

/// The settings to compare, in command-line order (--policy, then
/// --setting, then --config); `recorded` is the recorded settings string
/// of a recorded trace (None for a workload).
fn settings(args: &ReplayArgs, recorded: Option<&str>) -> Result<Vec<ReplaySetting>> {
    let mut out = Vec::new();
    if args.policies.is_empty() && args.settings.is_empty() && args.configs.is_empty() {
        match recorded {
            None => return Ok(ReplaySetting::defaults()),
            Some(base) => {
                for p in DEFAULT_POLICIES {
                    out.push(policy_setting(p, base)?);
                }
                return Ok(out);
            }
        }
    }
    for p in &args.policies {
        out.push(policy_setting(p, recorded.unwrap_or(""))?);
    }
    for s in &args.settings {
        if !s.contains('=') {
            bail!(
                "--setting {s:?}: expected NAME=CONF, e.g. --setting \
                 max-split-128=max_split_size_mb:128 (use --config CONF for an unnamed setting)"
            );
        }
        if let Some((name, _)) = s.split_once('=') {
            check_setting_name("--setting", name.trim())?;
        }
        out.push(ReplaySetting::parse(s).with_context(|| format!("--setting {}", quoted(s)))?);
    }
    for c in &args.configs {
        let setting = ReplaySetting::from_config(c);
        setting
            .allocator_config()
            .with_context(|| format!("--config {}", quoted(c)))?;
        out.push(setting);
    }
    let mut seen = HashSet::new();
    for s in &out {
        if !seen.insert(s.name.as_str()) {
            bail!("the setting name {} is given twice", quoted(&s.name));
        }
    }
    Ok(out)
}

/// Parse a workload spec and check its size (at most
/// [`workload::max_workload_ops`] ops) before anything generates it.
fn load_workload(spec: &str) -> Result<Workload> {
    let w = Workload::parse(spec).with_context(|| format!("workload {}", quoted(spec)))?;
    workload::max_workload_ops()
        .and_then(|limit| w.check_size(limit))
        .with_context(|| format!("workload {}", quoted(spec)))?;
    Ok(w)
}

/// One device trace of a recorded file, converted.
struct RecordedInput {
    file: String,
    rec: RecordedTrace,
    /// Blocks live at the first entry.
    live_at_start: usize,
    events: u64,
    settings: Vec<ReplaySetting>,
    capacity: u64,
    /// Entries of the file skipped for an unknown action.
    skipped: Skipped,
}

/// One device trace of a recorded file, converted.
struct Converted {
    device: u32,
    /// Recorded trace entries of the device.
    events: u64,
    rec: RecordedTrace,
}

/// The trace entries a reader skipped for an unknown action, by action.
type Skipped = std::collections::BTreeMap<String, u64>;

/// Load `path` and convert the trace of each device with trace entries
/// (only `device`, when given); also returns the recorded settings string
/// and the entries skipped for an unknown action, which are warned about
/// once on standard error.
fn convert_file(
    path: &std::path::Path,
    device: Option<u32>,
) -> Result<(String, Vec<Converted>, Skipped)> {
    let loaded = input::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    if !loaded.skipped_actions.is_empty() {
        eprintln!(
            "warning: {}: {} (an action this version does not know; the replay leaves them out)",
            path.display(),
            describe_skipped(&loaded.skipped_actions)
        );
    }
    let input = loaded.to_trace_input();
    let recorded = recorded_setting(input.allocator_settings.as_ref());
    let config = recorded
        .allocator_config()
        .with_context(|| format!("{}: recorded allocator settings", path.display()))?;
    let mut out = Vec::new();
    for dev in &input.devices {
        if device.is_some_and(|d| d != dev.device) || dev.events.is_empty() {
            continue;
        }
        let rec = convert(dev, &config, input.addresses == AddressKind::Synthetic)
            .with_context(|| format!("{}, device {}", path.display(), dev.device))?;
        out.push(Converted {
            device: dev.device,
            events: dev.events.len() as u64,
            rec,
        });
    }
    if out.is_empty() {
        match device {
            Some(d) => bail!("{}: device {d} has no trace entries", path.display()),
            None => bail!(
                "{}: no trace entries (a state-only snapshot: record with \
                 torch.cuda.memory._record_memory_history() to get a trace)",
                path.display()
            ),
        }
    }
    Ok((recorded.config, out, loaded.skipped_actions))
}

/// Load `path` and convert the trace of each selected device.
fn load_recorded(path: &std::path::Path, args: &ReplayArgs) -> Result<Vec<RecordedInput>> {
    let (recorded, devices, skipped) = convert_file(path, args.device)?;
    let settings = settings(args, Some(&recorded))?;
    let mut out = Vec::new();
    for Converted { events, rec, .. } in devices {
        let live_at_start = rec.live_at_start_count();
        let rec = rec.with_start(args.start);
        let capacity = args.capacity.or(rec.capacity).unwrap_or(DEFAULT_CAPACITY);
        out.push(RecordedInput {
            file: path.display().to_string(),
            live_at_start,
            events,
            rec,
            settings: settings.clone(),
            capacity,
            skipped: skipped.clone(),
        });
    }
    Ok(out)
}

/// A progress bar on a terminal, shown once the replay has taken more than
/// a second.
struct Progress {
    bar: ProgressBar,
    tty: bool,
    start: Instant,
    shown: bool,
}

impl Progress {
    fn new(total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} replaying [{bar:40}] {percent}% ({eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Progress {
            bar,
            tty: std::io::stderr().is_terminal(),
            start: Instant::now(),
            shown: false,
        }
    }

    fn set(&mut self, done: u64) {
        if !self.shown && self.tty && self.start.elapsed() > Duration::from_secs(1) {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.shown = true;
        }
        self.bar.set_position(done);
    }
}

fn cmd_replay(args: ReplayArgs) -> Result<()> {
    if args.capacity == Some(0) {
        bail!("--capacity must be more than 0 bytes");
    }
    let mut recorded = Vec::new();
    for f in &args.files {
        recorded.extend(load_recorded(f, &args)?);
    }
    let workload = match (&args.workload, args.files.is_empty()) {
        (Some(w), _) => Some(load_workload(w)?),
        (None, true) => Some(load_workload("gpt-train")?),
        (None, false) => None,
    };
    let wl = match &workload {
        Some(w) => {
            let (trace, sites) = w.trace_and_sites();
            Some((w, trace, sites, settings(&args, None)?))
        }
        None => None,
    };

    let total: u64 = recorded
        .iter()
        .map(|r| (r.rec.trace.ops.len() * r.settings.len()) as u64)
        .sum::<u64>()
        + wl.as_ref()
            .map_or(0, |(_, t, _, s)| (t.ops.len() * s.len()) as u64);
    let mut progress = Progress::new(total);
    let mut base = 0u64;
    let start = Instant::now();

    let mut sections: Vec<html::Section> = Vec::new();
    let mut json: Vec<serde_json::Value> = Vec::new();
    let mut text = String::new();
    for input in &recorded {
        let mut reports: Vec<ReplayReport> = Vec::new();
        let mut fids = Vec::new();
        let first_json = json.len();
        for s in &input.settings {
            let options = ReplayOptions {
                capacity: input.capacity,
                ..ReplayOptions::default()
            };
            let compare = s.name == "pytorch" && args.start == StartMode::Recorded;
            let (report, fid) = replay_recorded(&input.rec, s, &options, compare, &mut |n| {
                progress.set(base + n as u64)
            })
            .with_context(|| format!("replaying {} with {}", input.file, s.name))?;
            base += input.rec.trace.ops.len() as u64;
            let rr = RecordedReport {
                file: input.file.clone(),
                device: input.rec.device,
                start: args.start,
                events: input.events,
                report,
                fidelity: fid,
                skipped_entries: input.skipped.clone(),
            };
            json.push(serde_json::to_value(&rr).context("serializing a report")?);
            fids.push((s.name.clone(), rr.fidelity.clone()));
            reports.push(rr.report);
        }
        let title = format!("{} (device {})", input.file, input.rec.device);
        let (explanations, analysis) = Analysed {
            label: &title,
            trace: &input.rec.trace,
            start: Some(&input.rec.start),
            sites: &input.rec.sites,
            settings: &input.settings,
            capacity: input.capacity,
        }
        .analyse(&reports, args.min_capacity, &mut json[first_json..])?;
        let start = match args.start {
            StartMode::Recorded => format!(
                "from a start state of {} segments and {} expandable segments",
                input.rec.start.segments.len(),
                input.rec.start.expandable.len()
            ),
            StartMode::Cold => format!(
                "from a cold start (the {} blocks live at the first entry allocated first)",
                input.live_at_start
            ),
        };
        let _ = writeln!(
            text,
            "{title}\n{} trace entries -> {} ops {start}; simulated {} device{}\n",
            input.events,
            input.rec.trace.ops.len(),
            format_size(input.capacity),
            if input.rec.capacity.is_some() && args.capacity.is_none() {
                " (the capacity inferred from the recording: its OOMs, or its expandable-segment reservations)"
            } else {
                ""
            }
        );
        text.push_str(&analysis);
        for (name, f) in &fids {
            if let Some(f) = f {
                let _ = writeln!(
                    text,
                    "\nfidelity of {name} (PyTorch mode): segment events {}/{} ({}), \
                     block placements {}/{}, peak reserved {} (recorded {}), OOMs {} (recorded {})",
                    f.segment_events_matched,
                    f.segment_events_total,
                    match (input.skipped.is_empty(), f.segment_events_exact) {
                        (true, true) => "exact".to_string(),
                        (true, false) => "differs".to_string(),
                        (false, _) => format!(
                            "not exact: {} from the recording",
                            describe_skipped(&input.skipped)
                        ),
                    },
                    f.placements_matched,
                    f.placements_total,
                    format_size(reports[0].peak_reserved),
                    format_size(f.recorded_peak_reserved),
                    reports[0].ooms,
                    f.recorded_ooms
                );
            } else if name == "pytorch" && args.start == StartMode::Cold {
                let _ = writeln!(
                    text,
                    "\nfidelity: not measured on a cold start (use --start recorded)"
                );
            } else if name == "pytorch" && !input.rec.segments_known {
                let _ = writeln!(
                    text,
                    "\nfidelity: not measured (the source recorded no segments)"
                );
            }
        }
        text.push('\n');
        if args.html.is_some() {
            sections.push(
                html::Section::recorded(
                    format!("{} (device {})", file_name(&input.file), input.rec.device),
                    &input.rec,
                    &input.settings,
                    input.capacity,
                    &reports,
                    &fids,
                )?
                .with_explanations(explanations)
                .with_skipped(describe_skipped(&input.skipped)),
            );
        }
    }
    if let Some((w, trace, sites, settings)) = &wl {
        let options = ReplayOptions {
            capacity: args.capacity.unwrap_or(DEFAULT_CAPACITY),
            ..ReplayOptions::default()
        };
        let b = base;
        let reports = replay_all(trace, settings, &options, &mut |done| {
            progress.set(b + done as u64)
        })
        .with_context(|| format!("replaying workload {}", w.preset))?;
        let first_json = json.len();
        for r in &reports {
            json.push(serde_json::to_value(r).context("serializing a report")?);
        }
        let title = format!("workload {}", w.spec());
        let (explanations, analysis) = Analysed {
            label: &title,
            trace,
            start: None,
            sites,
            settings,
            capacity: options.capacity,
        }
        .analyse(&reports, args.min_capacity, &mut json[first_json..])?;
        let _ = writeln!(text, "{title}");
        let _ = writeln!(
            text,
            "{} ops replayed on a simulated {} device ({} settings) in {:.2} s\n",
            trace.ops.len(),
            format_size(options.capacity),
            settings.len(),
            start.elapsed().as_secs_f64()
        );
        text.push_str(&analysis);
        if args.html.is_some() {
            sections.push(
                html::Section::workload(title, trace, settings, options.capacity, &reports)?
                    .with_explanations(explanations),
            );
        }
    }
    progress.bar.finish_and_clear();

    if let Some(path) = &args.html {
        let page = html::render(&sections);
        std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &json).context("writing JSON")?;
        writeln!(out)?;
    } else {
        out.write_all(text.trim_end().as_bytes())?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

/// One replayed input (a recorded device trace or a workload), for what
/// `reservoir replay` adds to its reports.
struct Analysed<'a> {
    /// The input's name in messages and progress bars.
    label: &'a str,
    trace: &'a Trace,
    start: Option<&'a StartState>,
    sites: &'a Sites,
    settings: &'a [ReplaySetting],
    capacity: u64,
}

impl Analysed<'_> {
    /// Explain each setting's reserved peak and first OOM and, with
    /// `min_capacity`, find each setting's smallest device; add both to the
    /// input's JSON reports (`json`, one per setting) and return the
    /// explanations with the text of the table and the explanations.
    fn analyse(
        &self,
        reports: &[ReplayReport],
        min_capacity: bool,
        json: &mut [serde_json::Value],
    ) -> Result<(Vec<Explanation>, String)> {
        let explanations = explain::explain_all(
            self.trace,
            self.start,
            self.settings,
            reports,
            self.capacity,
            self.sites,
        )?;
        add_explanations(json, &explanations)?;
        let mins = if min_capacity {
            let mins = min_capacities(self.trace, self.start, self.settings, self.label)?;
            add_min_capacity(json, &mins);
            Some(mins)
        } else {
            None
        };
        let mut text = render_table(reports, mins.as_deref());
        text.push_str(&explain::render_text(&explanations));
        Ok((explanations, text))
    }
}

/// The smallest capacity of each setting (`--min-capacity`), with a
/// progress bar on a terminal.
fn min_capacities(
    trace: &Trace,
    start: Option<&StartState>,
    settings: &[ReplaySetting],
    label: &str,
) -> Result<Vec<MinCapacity>> {
    let bar = ProgressBar::with_draw_target(
        Some(settings.len() as u64),
        if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("{spinner} minimum capacity [{bar:20}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut out = Vec::with_capacity(settings.len());
    for s in settings {
        bar.set_message(format!("{}: {label}", s.name));
        let m = min_capacity(trace, start, s, &mut |lo, hi| {
            bar.set_message(format!(
                "{}: between {} and {} ({label})",
                s.name,
                format_size(lo),
                format_size(hi)
            ));
        })
        .with_context(|| format!("finding the minimum capacity of {label} with {}", s.name))?;
        out.push(m);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(out)
}

/// A path's file name (reports written to share carry no directory of the
/// machine they ran on).
fn file_name(path: &str) -> String {
    std::path::Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Add `explain` (the peak and first OOM, see
/// `reservoir_replay::replay::explain::Explanation`) to each JSON report.
fn add_explanations(json: &mut [serde_json::Value], ex: &[Explanation]) -> Result<()> {
    for (v, e) in json.iter_mut().zip(ex) {
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "explain".into(),
                serde_json::to_value(e).context("serializing an explanation")?,
            );
        }
    }
    Ok(())
}

/// Add `min_capacity` (bytes, `null` when nothing up to 16 TiB fits) to
/// each JSON report, in the same order as `mins`.
fn add_min_capacity(json: &mut [serde_json::Value], mins: &[MinCapacity]) {
    for (v, m) in json.iter_mut().zip(mins) {
        if let Some(obj) = v.as_object_mut() {
            obj.insert("min_capacity".into(), serde_json::json!(m.min_capacity));
        }
    }
}

/// The headline of `--min-capacity`: the smallest device with the best
/// setting, and what `pytorch` needs.
fn min_capacity_headline(mins: &[MinCapacity]) -> Option<String> {
    let best = mins
        .iter()
        .filter_map(|m| m.min_capacity.map(|c| (c, m)))
        .min_by_key(|(c, _)| *c)?;
    let mut line = format!(
        "this run fits on a {} GPU with `{}`",
        format_size(best.0),
        best.1.setting
    );
    if let Some(py) = mins.iter().find(|m| m.setting == "pytorch") {
        if py.setting != best.1.setting {
            match py.min_capacity {
                Some(c) if c == best.0 => line.push_str(", as with PyTorch's defaults"),
                Some(c) => {
                    let _ = write!(line, ", needs {} with PyTorch's defaults", format_size(c));
                }
                None => line.push_str(", does not fit on 16 TiB with PyTorch's defaults"),
            }
        }
    }
    Some(line)
}

/// The comparison table, with the minimum capacities when measured.
fn render_table(reports: &[ReplayReport], mins: Option<&[MinCapacity]>) -> String {
    let Some(mins) = mins else {
        return table::render(reports);
    };
    let cells = mins
        .iter()
        .map(|m| m.min_capacity.map_or("> 16 TiB".to_string(), format_size))
        .collect();
    let mut out = table::render_with(reports, vec![("minimum capacity (no OOM)", cells)]);
    if let Some(h) = min_capacity_headline(mins) {
        let _ = writeln!(
            out,
            "
{h}"
        );
    }
    out
}

fn cmd_convert(args: ConvertArgs) -> Result<()> {
    let loaded =
        input::load(&args.file).with_context(|| format!("cannot load {}", args.file.display()))?;
    let input = loaded.to_trace_input();
    let recorded = recorded_setting(input.allocator_settings.as_ref());
    let config = recorded.allocator_config()?;
    let dev = input
        .devices
        .iter()
        .find(|d| args.device.map_or(!d.events.is_empty(), |n| d.device == n))
        .with_context(|| format!("{}: no device trace to convert", args.file.display()))?;
    let rec = convert(dev, &config, input.addresses == AddressKind::Synthetic)
        .with_context(|| format!("{}, device {}", args.file.display(), dev.device))?;
    if let Some((base, _, _)) = rec
        .start
        .expandable
        .iter()
        .find(|(_, x, _)| !x.mapped.is_empty())
    {
        bail!(
            "{}, device {}: the start state has mapped pages in the expandable segment at {base:#x}; \
             the oracle prelude cannot rebuild expandable segments (replay it with `reservoir replay`)",
            args.file.display(),
            dev.device
        );
    }
    let (trace, prelude) = reservoir_replay::replay::recorded::oracle_trace(&rec);
    let mut header = vec![
        format!(
            "converted from {} device {}",
            args.file.display(),
            dev.device
        ),
        format!("recorded settings: {:?}", recorded.config),
    ];
    if let Some(c) = rec.capacity {
        header.push(format!("capacity inferred from the recording: {c}"));
    }
    header.push(format!(
        "prelude: the first {} ops ({} segment allocations) rebuild the start state; \
         compare segment events after them",
        prelude.ops, prelude.segments
    ));
    let trace = reservoir_replay::oracle_trace::Trace::from_ops(trace.ops, header);
    let f = File::create(&args.oracle_trace)
        .with_context(|| format!("cannot create {}", args.oracle_trace.display()))?;
    let mut f = BufWriter::new(f);
    trace
        .write_to(&mut f)
        .and_then(|_| f.flush())
        .with_context(|| format!("cannot write {}", args.oracle_trace.display()))?;
    eprintln!(
        "wrote {} ops ({} of prelude) to {}",
        trace.ops.len(),
        prelude.ops,
        args.oracle_trace.display()
    );
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
