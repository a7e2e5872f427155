//! The `reservoir` command as a library: [`run`] is the whole command line
//! (the `reservoir` binary is a thin caller of it, and so is the Python
//! distribution's console script, through `reservoir._native.run`), and
//! [`run_captured`] runs a command with its standard output and HTML report
//! kept in memory (the Python API builds its report objects from them).
//!
//! ```text
//! reservoir replay [FILE]... [--workload NAME[:key=value,...]] [--policy NAME]...
//!                  [--setting NAME=CONF]... [--config CONF]... [--capacity SIZE] [--device N]
//!                  [--json] [--html REPORT.html] [--torch RELEASE]
//! reservoir convert FILE --oracle-trace OUT [--device N]
//! reservoir workload NAME[:key=value,...] [--out FILE]
//! reservoir workloads
//! reservoir compare [--traces DIR] [--policy NAME]... [--no-workloads] [--no-traces] [--json]
//! reservoir diff A B [--json OUT] [--html OUT] [--policy NAME | --setting NAME=CONF] [--top N]
//! reservoir predict FILE@SIZE [FILE@SIZE]... --at SIZE [--capacity SIZE] [--json]
//! ```

#![forbid(unsafe_code)]

mod compare;
mod diagnose;
mod diff;
mod explain;
mod html;
mod imbalance;
mod limit;
mod lints;
pub mod output;
mod par;
mod predict;
mod ranks;
mod replay_cmd;
mod size;
mod summary;
mod table;

use std::collections::HashSet;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};

use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir::TorchRelease;
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::recorder::{self, Detection};
use reservoir_replay::replay::recorded::{
    convert, describe_skipped, overlay_config, recorded_setting, RecordedTrace, StartMode,
};
use reservoir_replay::replay::ReplaySetting;
use reservoir_replay::torch_release::{recorded_setting_as, ReleaseChoice};
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
    /// Compare two snapshots of the same program (before and after a
    /// change, or two ranks): peak allocated and reserved, live bytes by
    /// site at each peak (what grew, shrank, is new, is gone), OOMs and
    /// fragmentation, as the allocator ran each (the recording, replayed in
    /// PyTorch mode).
    Diff(diff::DiffArgs),
    /// Predict a program's peak memory at another batch or context size
    /// from recordings of it at other sizes (`FILE@SIZE`): the recorded
    /// trace is scaled (each allocation by its own law, fitted across the
    /// recordings) and replayed with each setting; with `--capacity`, also
    /// the largest size that fits.
    Predict(predict::PredictArgs),
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
    /// `pytorch-2.11` ... `pytorch-2.15` (the recorded settings, in PyTorch
    /// mode of that release),
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

    /// The device's total memory when the allocator was given less (the
    /// "total capacity of X" of PyTorch's OOM message): an OOM's diagnosis
    /// counts the difference as memory used outside the allocator and tries
    /// the whole device.
    #[arg(long, value_name = "SIZE", value_parser = size::parse_capacity)]
    device_total: Option<u64>,

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

    /// Replay the recording at another batch or context size, F times
    /// the recorded one (a one-recording what-if, as `reservoir predict`
    /// with one recording): every allocation made and freed within the
    /// trace (activations, temporaries) asks for F times its bytes; those
    /// made before the trace, never freed in it, or by the optimizer keep
    /// their size. A number above 0, at most 64; needs `--start cold`.
    #[arg(long, value_name = "F")]
    scale: Option<f64>,

    /// Also find, for each setting, the smallest device capacity (to 2 MiB)
    /// on which the trace runs without an out-of-memory error, by bisection
    /// over the deterministic replay; prints the headline "fits on a X GPU
    /// with `A`, needs Y with PyTorch's defaults" and adds `min_capacity`
    /// to the JSON.
    #[arg(long)]
    min_capacity: bool,

    /// Print the reports as a JSON array, one object per input and setting,
    /// instead of the table (a recorded input's also say `torch_release`,
    /// the release of PyTorch mode, and `torch_release_how`).
    #[arg(long)]
    json: bool,

    /// Also write a self-contained HTML report (timelines, segment map at
    /// the peak, the numbers).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,

    /// The PyTorch release (2.11 to 2.15) whose allocator PyTorch mode
    /// reproduces. Default: the release a snapshot was recorded with, where
    /// its keys show it, else the newest; the header says which and how.
    #[arg(long, value_name = "RELEASE", value_parser = parse_torch_release)]
    torch: Option<TorchRelease>,

    /// Replay on at most N threads (default: every core, or
    /// `RAYON_NUM_THREADS`): the files, each input's settings and the
    /// `--min-capacity` searches run at once. The output is the same with
    /// any N.
    #[arg(long, value_name = "N", value_parser = par::parse_jobs)]
    jobs: Option<usize>,
}

/// `--torch`: `2.13`, `2.13.0` or `pytorch-2.13`.
fn parse_torch_release(s: &str) -> Result<TorchRelease, String> {
    s.parse::<TorchRelease>().map_err(|_| {
        format!(
            "unsupported PyTorch release {s:?}; supported: {}",
            TorchRelease::ALL.map(|r| r.version()).join(", ")
        )
    })
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

/// Run the command line `args` (the program name first, as in
/// [`std::env::args_os`]) and return the process's exit status: 0 on
/// success, 1 after printing `error: MESSAGE` on standard error, 2 after a
/// usage error (clap's message), 0 after `--help` or `--version`, and 141
/// (a shell's status for SIGPIPE) without a word when standard output was
/// closed early (`reservoir replay ... | head`).
pub fn run<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to standard output, usage errors to
            // standard error; a closed pipe is not worth a second error.
            let _ = e.print();
            return e.exit_code();
        }
    };
    let result = execute(cli.command);
    let flushed = std::io::stdout().flush();
    match result.and(flushed.map_err(anyhow::Error::from)) {
        Ok(()) => 0,
        Err(e) if output::is_broken_pipe(&e) => 141,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            1
        }
    }
}

/// A command that failed: its message, as `reservoir` prints it after
/// `error: ` (the error and its causes, each said once), or clap's for a
/// command line it does not accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunError {
    /// The message.
    pub message: String,
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for RunError {}

/// Run the command line `args` (the program name first) with its standard
/// output and its `--html` page kept in memory instead of written (see
/// [`output::Captured`]); what it writes to standard error (warnings) still
/// goes there. A failure is returned, not printed.
pub fn run_captured<I, T>(args: I) -> std::result::Result<output::Captured, RunError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args).map_err(|e| RunError {
        message: clap_message(&e),
    })?;
    output::capture(|| execute(cli.command)).map_err(|e| RunError {
        message: error_chain(&e),
    })
}

/// A clap error's message: its first line, without clap's `error: `.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

/// Run one subcommand.
fn execute(command: Command) -> Result<()> {
    match command {
        Command::Replay(args) => replay_cmd::cmd_replay(args),
        Command::Convert(args) => cmd_convert(args),
        Command::Workload(args) => cmd_workload(args),
        Command::Workloads => cmd_workloads(),
        Command::Compare(args) => compare::cmd_compare(args),
        Command::Diff(args) => diff::cmd_diff(args),
        Command::Predict(args) => predict::cmd_predict(args),
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

/// The what-if policies replayed on a recorded trace when none is named
/// (and every `reservoir predict`).
pub(crate) const DEFAULT_POLICIES: [&str; 6] = [
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

/// The most settings one command compares (`--policy`, `--setting` and
/// `--config` together): each is one more replay of every input (and with
/// `--min-capacity` some 25 more), so the run's time grows with their
/// number. See docs/limits.md.
const MAX_SETTINGS: usize = 64;

/// Refuse more than [`MAX_SETTINGS`] settings, before any is replayed.
fn check_setting_count(n: usize) -> Result<()> {
    if n > MAX_SETTINGS {
        bail!(
            "{n} settings (--policy, --setting, --config) is more than the limit of \
             {MAX_SETTINGS} per command: each one replays every input again (and about 25 \
             times with --min-capacity); compare them in several commands"
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
    } else if let Some(release) = TorchRelease::from_policy_name(name) {
        format!(
            "{}:{}",
            reservoir::config::POLICY_KEY,
            release.policy_name()
        )
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
            "unknown policy {name:?}; known: pytorch, pytorch-2.11 ... pytorch-2.15, expandable, \
             reservoir, max-split-N, roundup-N, gc-T, large-segment-N, mps-heap (or use \
             --setting NAME=CONF)"
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
    check_setting_count(args.policies.len() + args.settings.len() + args.configs.len())?;
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

/// Read the text file `path` that the option `what` names (a `--merge`
/// report, a `--steady-exceptions` list): like every file the command reads,
/// a regular file (a FIFO or a device is refused before it is opened) of at
/// most [`input::max_input_bytes`] bytes (`RESERVOIR_MAX_INPUT_BYTES`,
/// checked from its size before it is read); see docs/limits.md.
fn read_text_file(what: &str, path: &std::path::Path) -> Result<String> {
    let bytes = input::max_input_bytes()
        .and_then(|limit| input::read_file(path, limit))
        .map_err(|e| {
            // The reader's errors start with the path: say it once.
            let why = e.to_string();
            let prefix = format!("{}: ", path.display());
            let why = why.strip_prefix(&prefix).unwrap_or(&why);
            anyhow::anyhow!("cannot read {what} {}: {why}", path.display())
        })?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{what} {}: not UTF-8 text (invalid byte at byte {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Parse a workload spec and check its size (at most
/// [`workload::max_workload_ops`] ops) before anything generates it.
fn load_workload(spec: &str) -> Result<Workload> {
    load_workload_counted(spec).map(|(w, _)| w)
}

/// [`load_workload`], and the workload's number of ops.
fn load_workload_counted(spec: &str) -> Result<(Workload, u64)> {
    let w = Workload::parse(spec).with_context(|| format!("workload {}", quoted(spec)))?;
    let ops = workload::max_workload_ops()
        .and_then(|limit| w.check_size(limit))
        .with_context(|| format!("workload {}", quoted(spec)))?;
    Ok((w, ops))
}

/// The most work a command may ask of one workload unless
/// [`MAX_REPLAY_WORK_ENV`] says otherwise, in op-replays (its ops times
/// the replays the command makes of it): 2^32, some minutes of work
/// (`compare` of the largest preset, `llama-13b-infer`, makes about 330
/// million; `replay --min-capacity` of it with the six default settings
/// about 650 million). See docs/limits.md.
const DEFAULT_MAX_REPLAY_WORK: u64 = 1 << 32;

/// The environment variable that sets the work limit, in op-replays.
const MAX_REPLAY_WORK_ENV: &str = "RESERVOIR_MAX_REPLAY_WORK";

/// Replays a command makes of an input per setting, at most: the replay
/// and up to two for its lints; with `--min-capacity` also the bisection
/// (a doubling from 80 GiB to 16 TiB and 23 halvings to 2 MiB).
fn replays_per_setting(min_capacity: bool) -> u64 {
    3 + if min_capacity { 8 + 23 } else { 0 }
}

/// Refuse, before generating it, a workload of `ops` ops that the command
/// would replay `replays` times in all when that is more than the work
/// limit ([`DEFAULT_MAX_REPLAY_WORK`], [`MAX_REPLAY_WORK_ENV`]): the
/// estimate, the limit and how to raise it.
fn check_work(spec: &str, ops: u64, settings: usize, per_setting: u64) -> Result<()> {
    let limit = match std::env::var_os(MAX_REPLAY_WORK_ENV) {
        None => DEFAULT_MAX_REPLAY_WORK,
        Some(v) => {
            let text = v.to_string_lossy();
            text.trim().replace('_', "").parse().map_err(|_| {
                anyhow::anyhow!(
                    "{MAX_REPLAY_WORK_ENV}={text:?}: expected a number of op-replays, e.g. 10000000000"
                )
            })?
        }
    };
    let replays = (settings as u64).saturating_mul(per_setting);
    let work = ops.saturating_mul(replays);
    if work > limit {
        bail!(
            "workload {}: {ops} ops x {replays} replays ({settings} settings, up to {per_setting} \
             replays each) = {work} op-replays, more than the limit of {limit} op-replays (some \
             minutes of work); raise it with {MAX_REPLAY_WORK_ENV}=N, or ask for fewer \
             settings or a smaller workload (see docs/limits.md)",
            quoted(spec)
        );
    }
    Ok(())
}

/// The most out-of-memory errors one replay of a built-in workload may
/// meet unless [`MAX_REPLAY_OOMS_ENV`] says otherwise. Each costs the
/// allocator a pass over every cached block (it releases them all before
/// failing, as PyTorch's does), so a workload far too large for the device
/// (`gpt-train:layers=5000` on 80 GiB) would replay for hours; the presets
/// meet none on their default devices. See docs/limits.md.
const DEFAULT_MAX_REPLAY_OOMS: u64 = 1000;

/// The environment variable that sets the out-of-memory cap (0: none).
const MAX_REPLAY_OOMS_ENV: &str = "RESERVOIR_MAX_REPLAY_OOMS";

/// The out-of-memory cap of a built-in workload's replay
/// ([`ReplayOptions::max_ooms`](reservoir_replay::replay::ReplayOptions::max_ooms)):
/// [`DEFAULT_MAX_REPLAY_OOMS`], or [`MAX_REPLAY_OOMS_ENV`]'s number, where 0
/// is no cap. Recorded traces, capacity searches and what-if replays are
/// never capped.
fn max_replay_ooms() -> Result<Option<u64>> {
    let limit = match std::env::var_os(MAX_REPLAY_OOMS_ENV) {
        None => DEFAULT_MAX_REPLAY_OOMS,
        Some(v) => {
            let text = v.to_string_lossy();
            text.trim().replace('_', "").parse().map_err(|_| {
                anyhow::anyhow!(
                    "{MAX_REPLAY_OOMS_ENV}={text:?}: expected a number of out-of-memory errors, \
                     e.g. 100000 (0: no limit)"
                )
            })?
        }
    };
    Ok((limit > 0).then_some(limit))
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
    /// The PyTorch release of PyTorch mode, and how it was decided.
    torch: ReleaseChoice,
    /// The allocator that recorded the file.
    recorder: Detection,
}

/// One device trace of a recorded file, converted.
struct Converted {
    device: u32,
    /// The recorded settings string of the device (PyTorch mode): the
    /// file's, with what a foreign recorder's device shows added
    /// ([`Detection::recorded_config`]).
    config: String,
    /// Recorded trace entries of the device.
    events: u64,
    rec: RecordedTrace,
    /// The allocator that recorded the file (its padding is modelled in
    /// `rec`).
    recorder: Detection,
    /// The device's recorded entries (their stacks key `reservoir
    /// predict`'s matching).
    entries: Vec<reservoir::observe::trace::TraceEntry>,
}

/// The trace entries a reader skipped for an unknown action, by action.
type Skipped = std::collections::BTreeMap<String, u64>;

/// Load `path` and convert the trace of each device with trace entries
/// (only `device`, when given), each under its own recorded settings
/// (`Converted::config`); also returns the file's recorded settings string
/// and the entries skipped for an unknown action, which are warned about
/// once on standard error.
fn convert_file(
    path: &std::path::Path,
    device: Option<u32>,
) -> Result<(String, Vec<Converted>, Skipped)> {
    convert_file_as(path, device, None).map(|(c, d, s, _)| (c, d, s))
}

/// [`convert_file`], in PyTorch mode of the release `torch` names, else the
/// one the file shows (see [`reservoir_replay::torch_release`]); the
/// recorded settings string names the release (`policy:pytorch-2.12`)
/// unless it is the newest.
fn convert_file_as(
    path: &std::path::Path,
    device: Option<u32>,
    torch: Option<TorchRelease>,
) -> Result<(String, Vec<Converted>, Skipped, ReleaseChoice)> {
    let loaded = input::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    if !loaded.skipped_actions.is_empty() {
        eprintln!(
            "warning: {}: {} (an action this version does not know; the replay leaves them out)",
            path.display(),
            describe_skipped(&loaded.skipped_actions)
        );
    }
    let input = loaded.to_trace_input();
    let (recorded, choice) = recorded_setting_as(&loaded, &input, torch);
    let recorder = recorder::detect(&loaded);
    let mut out = Vec::new();
    let synthetic = input.addresses == AddressKind::Synthetic;
    for dev in input.devices {
        if device.is_some_and(|d| d != dev.device) || dev.events.is_empty() {
            continue;
        }
        let dev_config = recorder.recorded_config(&loaded, &recorded.config, dev.device);
        let config = ReplaySetting::new(recorded.name.clone(), dev_config.clone())
            .allocator_config()
            .with_context(|| format!("{}: recorded allocator settings", path.display()))?;
        let mut rec = convert(&dev, &config, synthetic)
            .with_context(|| format!("{}, device {}", path.display(), dev.device))?;
        recorder.model(&mut rec);
        out.push(Converted {
            device: dev.device,
            config: dev_config,
            events: dev.events.len() as u64,
            rec,
            recorder: recorder.clone(),
            entries: dev.events,
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
    Ok((recorded.config, out, loaded.skipped_actions, choice))
}

/// Load `path` and convert the trace of each selected device.
fn load_recorded(path: &std::path::Path, args: &ReplayArgs) -> Result<Vec<RecordedInput>> {
    let (_, devices, skipped, torch) = convert_file_as(path, args.device, args.torch)?;
    if args.scale.is_some() && args.start != StartMode::Cold {
        bail!(
            "--scale replays from a cold start (the recorded segments hold the recorded sizes): \
             add --start cold"
        );
    }
    let mut out = Vec::new();
    for Converted {
        events,
        rec,
        recorder,
        config,
        entries,
        ..
    } in devices
    {
        let settings = settings(args, Some(&config))?;
        let live_at_start = rec.live_at_start_count();
        let rec = match args.scale {
            Some(f) => {
                let label = path.display().to_string();
                let sample = reservoir_replay::predict::Sample::new(label, 1, rec, &entries)?;
                sample.scaled(f)?.trace
            }
            None => rec,
        };
        let rec = rec.with_start(args.start);
        let capacity = args.capacity.or(rec.capacity).unwrap_or(DEFAULT_CAPACITY);
        out.push(RecordedInput {
            file: path.display().to_string(),
            live_at_start,
            events,
            rec,
            settings,
            capacity,
            skipped: skipped.clone(),
            torch: torch.clone(),
            recorder,
        });
    }
    Ok(out)
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
    if prelude.pool_ops_dropped > 0 {
        header.push(format!(
            "{} private-pool ops (p, x) left out and e <pool> written as e: oracle_replay.py \
             has no private pools, so allocations of MemPools and graph pools run in the \
             default pool here (`reservoir replay` keeps the pools)",
            prelude.pool_ops_dropped
        ));
    }
    let trace = reservoir_replay::oracle_trace::Trace::from_ops(trace.ops, header);
    // A temporary file renamed into place: a failed write keeps what was
    // there (reservoir::outfile, issue 44 G1).
    reservoir::outfile::write_file(&args.oracle_trace, |mut w| trace.write_to(&mut w))
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
            reservoir::outfile::write_file(path, |mut w| trace.write_to(&mut w))
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!(
                "wrote {} ops of {} to {}",
                trace.ops.len(),
                w.spec(),
                path.display()
            );
        }
        None => crate::output::with_stdout(|out| {
            let mut out = BufWriter::new(out);
            trace
                .write_to(&mut out)
                .and_then(|_| out.flush())
                .context("writing the trace")
        })?,
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
    output::with_stdout(|o| Ok(o.write_all(out.as_bytes())?))
}
