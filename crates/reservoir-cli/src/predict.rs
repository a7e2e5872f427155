//! `reservoir predict SNAP@SIZE [SNAP@SIZE ...] --at SIZE`: a program's
//! peak memory at another batch or context size, from recordings of it at
//! other sizes (see [`reservoir_replay::predict`]).

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rayon::prelude::*;

use crate::{convert_file_as, output, par, policy_setting, quoted, size, Converted};
use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir::TorchRelease;
use reservoir_replay::predict::{
    replay_synthesis, Largest, PredictError, Predictor, Sample, Synthesis,
};
use reservoir_replay::replay::{ReplayReport, ReplaySetting};

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// Recordings of one program, each with the batch or context size it
    /// ran at: `FILE@SIZE`, e.g. `run_ctx128.pickle@128` (any input
    /// `reservoir replay` reads). One recording: activations and
    /// temporaries scale linearly with the size; several: each
    /// allocation gets its own law (constant, linear, quadratic).
    #[arg(value_name = "SNAP@SIZE", required = true)]
    inputs: Vec<String>,

    /// The batch or context size to predict.
    #[arg(long, value_name = "SIZE", value_parser = parse_count)]
    at: u64,

    /// The device to predict for: also find the largest size that fits it
    /// (bisection over replays). Bytes, or a number with K/M/G/T, e.g.
    /// 80GiB. Default: replay on 80 GiB and search nothing.
    #[arg(long, value_name = "SIZE", value_parser = size::parse_capacity)]
    capacity: Option<u64>,

    /// The device whose trace to use (default: the only device with
    /// trace entries).
    #[arg(long, value_name = "N")]
    device: Option<u32>,

    /// The PyTorch release (2.11 to 2.15) of PyTorch mode (default: the
    /// one the recording shows, else the newest).
    #[arg(long, value_name = "RELEASE", value_parser = crate::parse_torch_release)]
    torch: Option<TorchRelease>,

    /// Print one JSON object (`predicted.peak_allocated`,
    /// `predicted.peak_reserved`: PyTorch mode) instead of the text.
    #[arg(long)]
    json: bool,

    /// Replay on at most N threads (default: every core).
    #[arg(long, value_name = "N", value_parser = par::parse_jobs)]
    jobs: Option<usize>,
}

/// A batch or context size: a whole number above 0.
fn parse_count(s: &str) -> Result<u64, String> {
    match s.trim().replace('_', "").parse::<u64>() {
        Ok(0) => Err(format!(
            "{s:?}: the size is 0; a batch or context size is at least 1"
        )),
        Ok(n) => Ok(n),
        Err(_) => Err(format!(
            "{s:?} is not a batch or context size (a whole number above 0, e.g. 512)"
        )),
    }
}

/// Split `FILE@SIZE` at its last `@`.
fn parse_input(s: &str) -> Result<(PathBuf, u64)> {
    let Some((file, n)) = s.rsplit_once('@') else {
        bail!(
            "{}: no @SIZE: give each recording with the size it ran at, e.g. {}@128",
            quoted(s),
            quoted(s)
        );
    };
    if file.is_empty() {
        bail!("{}: no file before the @", quoted(s));
    }
    let size = parse_count(n).map_err(|e| anyhow::anyhow!("{}: {e}", quoted(s)))?;
    Ok((PathBuf::from(file), size))
}

/// `reservoir predict`.
pub(crate) fn cmd_predict(args: PredictArgs) -> Result<()> {
    par::with_jobs(args.jobs, || predict(&args))?
}

/// One recording, loaded: the sample and its recorded settings string.
fn load(arg: &str, args: &PredictArgs) -> Result<(Sample, String)> {
    let (path, size) = parse_input(arg)?;
    let (_, devices, _, _) = convert_file_as(&path, args.device, args.torch)?;
    if devices.len() > 1 {
        bail!(
            "{}: {} devices have trace entries ({}); choose one with --device N",
            path.display(),
            devices.len(),
            devices
                .iter()
                .map(|d| d.device.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let Some(Converted {
        rec,
        config,
        entries,
        ..
    }) = devices.into_iter().next()
    else {
        bail!("{}: no device trace", path.display());
    };
    let sample = Sample::new(path.display().to_string(), size, rec, &entries)?;
    Ok((sample, config))
}

/// One setting's replay of the prediction, and its largest fitting size.
struct Row {
    setting: ReplaySetting,
    report: ReplayReport,
    largest: Option<Largest>,
}

fn predict(args: &PredictArgs) -> Result<()> {
    if args.inputs.len() > reservoir_replay::predict::MAX_SAMPLES {
        return Err(PredictError::TooManySamples {
            count: args.inputs.len(),
            limit: reservoir_replay::predict::MAX_SAMPLES,
        }
        .into());
    }
    let loaded: Vec<Result<(Sample, String)>> = args
        .inputs
        .par_iter()
        .with_max_len(1)
        .map(|a| load(a, args))
        .collect();
    let mut samples = Vec::new();
    let mut configs = Vec::new();
    for l in loaded {
        let (s, c) = l?;
        samples.push(s);
        configs.push(c);
    }
    let predictor = Predictor::new(samples)?;
    let syn = predictor.synthesize(args.at)?;
    let base_config = &configs[syn.base];
    // Every prediction is replayed with `reservoir replay`'s settings.
    let settings: Vec<ReplaySetting> = crate::DEFAULT_POLICIES
        .iter()
        .map(|p| policy_setting(p, base_config))
        .collect::<Result<_>>()?;
    let capacity = args.capacity.unwrap_or(DEFAULT_CAPACITY);
    let rows: Vec<Result<Row>> = settings
        .into_par_iter()
        .with_max_len(1)
        .map(|setting| {
            let report = replay_synthesis(&syn, &setting, capacity)
                .with_context(|| format!("replaying the prediction with {}", setting.name))?;
            let largest = match args.capacity {
                Some(c) => Some(predictor.largest_fitting(&setting, c)?),
                None => None,
            };
            Ok(Row {
                setting,
                report,
                largest,
            })
        })
        .collect();
    let rows: Vec<Row> = rows.into_iter().collect::<Result<_>>()?;
    let text = if args.json {
        let mut t = serde_json::to_string_pretty(&json(args, &predictor, &syn, capacity, &rows))?;
        t.push('\n');
        t
    } else {
        text(args, &predictor, &syn, capacity, &rows)
    };
    output::with_stdout(|out| Ok(out.write_all(text.as_bytes())?))
}

fn json(
    args: &PredictArgs,
    p: &Predictor,
    syn: &Synthesis,
    capacity: u64,
    rows: &[Row],
) -> serde_json::Value {
    let recordings: Vec<serde_json::Value> = p
        .samples()
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({
                "file": s.label,
                "size": s.size,
                "allocations": s.allocations(),
                "fixed_by_rule": s.fixed_allocations(),
                "matched_with_base": (i != syn.base).then(|| p.matched(syn.base, i)),
            })
        })
        .collect();
    let settings: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "setting": r.setting.name,
                "config": r.setting.config,
                "peak_allocated": r.report.peak_allocated,
                "peak_reserved": r.report.peak_reserved,
                "ooms": r.report.ooms,
                "largest_fitting": r.largest,
            })
        })
        .collect();
    let pytorch = &rows[0].report;
    serde_json::json!({
        "at": args.at,
        "capacity": capacity,
        "recordings": recordings,
        "base": p.samples()[syn.base].label,
        "sized_by": syn.sized_by,
        "predicted": {
            "setting": rows[0].setting.name,
            "peak_allocated": pytorch.peak_allocated,
            "peak_reserved": pytorch.peak_reserved,
            "ooms": pytorch.ooms,
            "fits": pytorch.ooms == 0,
            "largest_fitting": rows[0].largest,
        },
        "settings": settings,
    })
}

fn largest_text(l: Largest) -> String {
    match l {
        Largest::None => "none (size 1 does not fit)".into(),
        Largest::Size(n) => n.to_string(),
        Largest::AtLeast(n) => format!(">= {n} (the extrapolation limit)"),
    }
}

fn text(args: &PredictArgs, p: &Predictor, syn: &Synthesis, capacity: u64, rows: &[Row]) -> String {
    let mut t = String::new();
    let base = &p.samples()[syn.base];
    let _ = writeln!(
        t,
        "prediction at size {} from {} recording(s):",
        args.at,
        p.samples().len()
    );
    for (i, s) in p.samples().iter().enumerate() {
        let matched = if i == syn.base {
            "the base".to_string()
        } else {
            format!("{} matched with the base", p.matched(syn.base, i))
        };
        let _ = writeln!(
            t,
            "  {} @{}: {} allocations ({} kept by the one-recording rule), {matched}",
            s.label,
            s.size,
            s.allocations(),
            s.fixed_allocations()
        );
    }
    let sized: Vec<String> = syn
        .sized_by
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    let _ = writeln!(
        t,
        "trace: {}'s (size {}), allocations sized by {}",
        base.label,
        base.size,
        sized.join(", ")
    );
    let _ = writeln!(
        t,
        "device: {}{}\n",
        format_size(capacity),
        if args.capacity.is_some() {
            ""
        } else {
            " (the default; --capacity SIZE also finds the largest size that fits)"
        }
    );
    let w = rows
        .iter()
        .map(|r| r.setting.name.len())
        .max()
        .unwrap_or(7)
        .max(7);
    let _ = write!(
        t,
        "{:w$}  {:>15}  {:>15}  {:>5}",
        "setting", "peak allocated", "peak reserved", "OOMs"
    );
    if args.capacity.is_some() {
        let _ = write!(t, "  largest size that fits");
    }
    t.push('\n');
    for r in rows {
        let _ = write!(
            t,
            "{:w$}  {:>15}  {:>15}  {:>5}",
            r.setting.name,
            format_size(r.report.peak_allocated),
            format_size(r.report.peak_reserved),
            r.report.ooms
        );
        if let Some(l) = r.largest {
            let _ = write!(t, "  {}", largest_text(l));
        }
        t.push('\n');
    }
    let py = &rows[0].report;
    let _ = writeln!(
        t,
        "\npredicted at size {} (PyTorch mode): peak allocated {}, peak reserved {}{}",
        args.at,
        format_size(py.peak_allocated),
        format_size(py.peak_reserved),
        if py.ooms > 0 {
            format!(
                "; does not fit {} ({} OOMs)",
                format_size(capacity),
                py.ooms
            )
        } else {
            String::new()
        }
    );
    if let Some(l) = rows[0].largest {
        let _ = writeln!(
            t,
            "largest size that fits {} (PyTorch mode): {}",
            format_size(capacity),
            largest_text(l)
        );
    }
    t
}
