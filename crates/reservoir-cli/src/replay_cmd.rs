//! `reservoir replay`: the command that replays recorded inputs and
//! workloads with each setting and reports them.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;

use crate::{
    check_work, explain, html, imbalance, limit, lints, load_recorded, load_workload_counted,
    max_replay_ooms, par, replays_per_setting, settings, summary::Summary, table, RecordedInput,
    ReplayArgs,
};
use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::placement::Limit;
use reservoir_replay::replay::capacity::{min_capacity, MinCapacity};
use reservoir_replay::replay::diagnose::recording_ends_at;
use reservoir_replay::replay::explain::Explanation;
use reservoir_replay::replay::levers::Imbalance;
use reservoir_replay::replay::lints::SettingLints;
use reservoir_replay::replay::recorded::{
    describe_skipped, replay_recorded, Fidelity, RecordedReport, StartMode,
};
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::{
    replay_all, ReplayOptions, ReplayReport, ReplaySetting, StartState,
};
use reservoir_replay::workload::Workload;

/// `reservoir replay`: each recorded input and the workload replayed with
/// each setting, reported as text, JSON and (`--html`) a page. The files
/// are read, and each input's settings replayed, on every core (at most
/// `--jobs` threads); the reports keep the order of the files and the
/// settings.
pub(crate) fn cmd_replay(args: ReplayArgs) -> Result<()> {
    if args.capacity == Some(0) {
        bail!("--capacity must be more than 0 bytes");
    }
    par::with_jobs(args.jobs, || replay_inputs(&args))?
}

fn replay_inputs(args: &ReplayArgs) -> Result<()> {
    let loaded: Vec<Result<Vec<RecordedInput>>> = args
        .files
        .par_iter()
        .with_max_len(1)
        .map(|f| load_recorded(f, args))
        .collect();
    let mut recorded = Vec::new();
    for l in loaded {
        recorded.extend(l?);
    }
    let spec = match (&args.workload, args.files.is_empty()) {
        (Some(w), _) => Some(w.as_str()),
        (None, true) => Some("gpt-train"),
        (None, false) => None,
    };
    let workload = match spec {
        Some(spec) => {
            let (w, ops) = load_workload_counted(spec)?;
            let settings = settings(args, None)?;
            // The work, estimated before the trace is generated.
            check_work(
                spec,
                ops,
                settings.len(),
                replays_per_setting(args.min_capacity),
            )?;
            Some((w, settings))
        }
        None => None,
    };
    let wl = match &workload {
        Some((w, settings)) => {
            let (trace, sites) = w.trace_and_sites();
            Some((w, trace, sites, settings.clone()))
        }
        None => None,
    };

    let total: u64 = recorded
        .iter()
        .map(|r| (r.rec.trace.ops.len() * r.settings.len()) as u64)
        .sum::<u64>()
        + wl.as_ref()
            .map_or(0, |(_, t, _, s)| (t.ops.len() * s.len()) as u64);
    let run = Run {
        args,
        progress: Progress::new(total),
        start: Instant::now(),
        max_ooms: if wl.is_some() {
            max_replay_ooms()?
        } else {
            None
        },
    };
    let (parts, last) = rayon::join(
        || run.all_recorded(&recorded),
        || {
            wl.as_ref()
                .map(|(w, trace, sites, settings)| run.workload(w, trace, sites, settings))
        },
    );
    run.progress.bar.finish_and_clear();
    let mut out = Output::default();
    for part in parts.into_iter().chain(last) {
        let part = part?;
        out.text.push_str(&part.text);
        out.json.extend(part.json);
        out.sections.extend(part.section);
    }
    out.write(args)
}

/// A `reservoir replay` in progress: its progress bar, shared by the
/// inputs replayed at once.
struct Run<'a> {
    args: &'a ReplayArgs,
    progress: Progress,
    start: Instant,
    /// The out-of-memory cap of the workload's replays (recorded inputs
    /// are not capped).
    max_ooms: Option<u64>,
}

/// The reports of one input: its text, its JSON reports (one per setting)
/// and its section of the page (with `--html`).
struct Part {
    text: String,
    json: Vec<serde_json::Value>,
    section: Option<html::Section>,
}

/// The reports of every input, in order.
#[derive(Default)]
struct Output {
    sections: Vec<html::Section>,
    json: Vec<serde_json::Value>,
    text: String,
}

/// The replays of one recorded input: each setting's report and fidelity,
/// and its JSON report.
struct Replayed {
    reports: Vec<ReplayReport>,
    fids: Vec<(String, Option<Fidelity>)>,
    json: Vec<serde_json::Value>,
}

impl Run<'_> {
    /// Replay every recorded input (at once), then report each (at once),
    /// the heaviest of the devices (or ranks) side by side with the
    /// imbalance lever ([`crate::imbalance`]). The first error, in input
    /// order, is returned.
    fn all_recorded(&self, recorded: &[RecordedInput]) -> Vec<Result<Part>> {
        let replayed: Vec<Result<Replayed>> = recorded
            .par_iter()
            .with_max_len(1)
            .map(|input| self.replay_recorded(input))
            .collect();
        let members: Vec<imbalance::Member<'_>> = recorded
            .iter()
            .zip(&replayed)
            .map(|(input, r)| imbalance::Member {
                file: &input.file,
                device: input.rec.device,
                trace: &input.rec.trace,
                sites: &input.rec.sites,
                report: r.as_ref().ok().and_then(|r| r.reports.first()),
            })
            .collect();
        let imbalances = imbalance::imbalances(&members);
        recorded
            .par_iter()
            .zip(replayed)
            .zip(imbalances)
            .with_max_len(1)
            .map(|((input, r), im)| self.recorded(input, r?, im.as_ref()))
            .collect()
    }

    /// Replay one recorded input with each of its settings (at once).
    fn replay_recorded(&self, input: &RecordedInput) -> Result<Replayed> {
        let args = self.args;
        let replays: Vec<Result<_>> = input
            .settings
            .par_iter()
            .with_max_len(1)
            .map(|s| {
                let options = ReplayOptions {
                    capacity: input.capacity,
                    ..ReplayOptions::default()
                };
                let compare = s.name == "pytorch" && args.start == StartMode::Recorded;
                let mut done = 0;
                replay_recorded(&input.rec, s, &options, compare, &mut |n| {
                    self.progress.advance(n as u64 - done.min(n as u64));
                    done = n as u64;
                })
                .with_context(|| format!("replaying {} with {}", input.file, s.name))
            })
            .collect();
        let mut reports: Vec<ReplayReport> = Vec::new();
        let mut fids = Vec::new();
        let mut json = Vec::new();
        for (s, r) in input.settings.iter().zip(replays) {
            let (report, fid) = r?;
            let rr = RecordedReport {
                file: input.file.clone(),
                device: input.rec.device,
                start: args.start,
                events: input.events,
                report,
                fidelity: fid,
                skipped_entries: input.skipped.clone(),
            };
            let mut value = serde_json::to_value(&rr).context("serializing a report")?;
            if let Some(obj) = value.as_object_mut() {
                // The release of PyTorch mode and how it was decided (the
                // header's `PyTorch mode:` line).
                obj.insert("torch_release".into(), input.torch.release.version().into());
                obj.insert("torch_release_how".into(), input.torch.how.clone().into());
                // The allocator that recorded the file (`pytorch-cuda`,
                // `torch_npu`): see `reservoir_replay::recorder`.
                obj.insert("recorded_by".into(), input.recorder.recorder.key().into());
            }
            json.push(value);
            fids.push((s.name.clone(), rr.fidelity.clone()));
            reports.push(rr.report);
        }
        Ok(Replayed {
            reports,
            fids,
            json,
        })
    }

    /// Report one recorded input from its replays; `imbalance`: the
    /// devices side by side when it is the heaviest and imbalanced.
    fn recorded(
        &self,
        input: &RecordedInput,
        replayed: Replayed,
        imbalance: Option<&Imbalance>,
    ) -> Result<Part> {
        let args = self.args;
        let Replayed {
            reports,
            fids,
            mut json,
        } = replayed;
        let title = format!("{} (device {})", input.file, input.rec.device);
        let (explanations, lints, analysis, limit_html, summary) = Analysed {
            label: &title,
            trace: &input.rec.trace,
            start: Some(&input.rec.start),
            sites: &input.rec.sites,
            settings: &input.settings,
            capacity: input.capacity,
            device_total: args.device_total,
            bars: &self.progress.bars,
            imbalance,
        }
        .analyse(&reports, args.min_capacity, &mut json)?;
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
        // Who recorded the file, when not PyTorch's CUDA allocator.
        let note = input
            .recorder
            .note()
            .map_or_else(String::new, |n| format!("{n}\n"));
        let mut text = String::new();
        let _ = writeln!(
            text,
            "{title}\n{}\n{note}{} trace entries -> {} ops {start}; simulated {} device{}\n",
            input.torch.header(),
            input.events,
            input.rec.trace.ops.len(),
            format_size(input.capacity),
            if input.rec.capacity.is_some() && args.capacity.is_none() {
                " (the capacity inferred from the recording: its OOMs, or its expandable-segment reservations)"
            } else {
                ""
            }
        );
        push_summary(&mut text, summary.as_ref());
        text.push_str(&analysis);
        fidelity_text(&mut text, input, args.start, &fids, &reports);
        text.push('\n');
        let section = if args.html.is_some() {
            Some(
                html::Section::recorded(
                    format!("{} (device {})", file_name(&input.file), input.rec.device),
                    &input.rec,
                    &input.settings,
                    input.capacity,
                    &reports,
                    &fids,
                )?
                .with_explanations(explanations)
                .with_lints(lints)
                .with_skipped(describe_skipped(&input.skipped))
                .with_recorder_note(input.recorder.note())
                .with_limit(limit_html)
                .with_summary(summary),
            )
        } else {
            None
        };
        Ok(Part {
            text,
            json,
            section,
        })
    }

    /// Replay the workload with each setting (at once) and report it.
    fn workload(
        &self,
        w: &Workload,
        trace: &Trace,
        sites: &Sites,
        settings: &[ReplaySetting],
    ) -> Result<Part> {
        let options = ReplayOptions {
            capacity: self.args.capacity.unwrap_or(DEFAULT_CAPACITY),
            max_ooms: self.max_ooms,
            ..ReplayOptions::default()
        };
        let replays: Vec<_> = settings
            .par_iter()
            .with_max_len(1)
            .map(|s| {
                let mut done = 0;
                replay_all(trace, std::slice::from_ref(s), &options, &mut |n| {
                    self.progress.advance(n as u64 - done.min(n as u64));
                    done = n as u64;
                })
            })
            .collect();
        let mut reports = Vec::with_capacity(settings.len());
        for r in replays {
            reports.extend(r.with_context(|| format!("replaying workload {}", w.spec()))?);
        }
        let mut json = Vec::new();
        for r in &reports {
            json.push(serde_json::to_value(r).context("serializing a report")?);
        }
        let title = format!("workload {}", w.spec());
        let (explanations, lints, analysis, limit_html, summary) = Analysed {
            label: &title,
            trace,
            start: None,
            sites,
            settings,
            capacity: options.capacity,
            device_total: self.args.device_total,
            bars: &self.progress.bars,
            imbalance: None,
        }
        .analyse(&reports, self.args.min_capacity, &mut json)?;
        let mut text = String::new();
        let _ = writeln!(text, "{title}");
        let _ = writeln!(
            text,
            "{} ops replayed on a simulated {} device ({} settings) in {:.2} s\n",
            trace.ops.len(),
            format_size(options.capacity),
            settings.len(),
            self.start.elapsed().as_secs_f64()
        );
        push_summary(&mut text, summary.as_ref());
        text.push_str(&analysis);
        let section = if self.args.html.is_some() {
            Some(
                html::Section::workload(title, trace, settings, options.capacity, &reports)?
                    .with_explanations(explanations)
                    .with_lints(lints)
                    .with_limit(limit_html)
                    .with_summary(summary),
            )
        } else {
            None
        };
        Ok(Part {
            text,
            json,
            section,
        })
    }
}

impl Output {
    /// Write the page (`--html`) and the report, JSON (`--json`) or text, to
    /// standard output.
    fn write(self, args: &ReplayArgs) -> Result<()> {
        if let Some(path) = &args.html {
            crate::output::write_html(path, html::render(&self.sections))?;
        }
        crate::output::with_stdout(|out| {
            if args.json {
                serde_json::to_writer_pretty(&mut *out, &self.json).context("writing JSON")?;
                writeln!(out)?;
            } else {
                out.write_all(self.text.trim_end().as_bytes())?;
                writeln!(out)?;
            }
            Ok(())
        })
    }
}

/// The fidelity lines of a recorded input's text report: each measured
/// [`Fidelity`](reservoir_replay::replay::recorded::Fidelity) (`fids`, by
/// setting), or why `pytorch`'s was not measured.
fn fidelity_text(
    text: &mut String,
    input: &RecordedInput,
    start: StartMode,
    fids: &[(String, Option<Fidelity>)],
    reports: &[ReplayReport],
) {
    for (name, f) in fids {
        if let Some(f) = f {
            let _ = writeln!(
                text,
                "\nfidelity of {name} (PyTorch mode): segment events {}/{} ({}), \
                 block placements {}/{}, peak reserved {} (recorded {}), OOMs {} (recorded {})",
                f.segment_events_matched,
                f.segment_events_total,
                match (input.skipped.is_empty(), f.segment_events_exact) {
                    (true, exact) if input.recorder.recorder.is_foreign() => format!(
                        "{} with the padding of {} modelled: {} bytes added to each request",
                        if exact { "exact" } else { "differs" },
                        input.recorder.recorder.name(),
                        input.recorder.recorder.request_padding()
                    ),
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
        } else if name == "pytorch" && start == StartMode::Cold {
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
}

/// A progress bar on a terminal, shown once the replay has taken more than
/// a second; the replays running at once each advance it. The bars of the
/// `--min-capacity` searches are drawn beside it.
struct Progress {
    bars: MultiProgress,
    bar: ProgressBar,
    tty: bool,
    start: Instant,
    shown: AtomicBool,
}

impl Progress {
    fn new(total: u64) -> Self {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} replaying [{bar:40}] {percent}% ({eta} left)")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        let tty = std::io::stderr().is_terminal();
        Progress {
            bars: MultiProgress::with_draw_target(if tty {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            }),
            bar,
            tty,
            start: Instant::now(),
            shown: AtomicBool::new(false),
        }
    }

    /// `ops` more ops replayed.
    fn advance(&self, ops: u64) {
        if self.tty
            && !self.shown.load(Ordering::Relaxed)
            && self.start.elapsed() > Duration::from_secs(1)
            && !self.shown.swap(true, Ordering::Relaxed)
        {
            self.bars.insert(0, self.bar.clone());
        }
        self.bar.inc(ops);
    }
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
    /// The device's total memory (`--device-total`).
    device_total: Option<u64>,
    /// Where the `--min-capacity` progress bars are drawn (beside those of
    /// the other inputs searched at once).
    bars: &'a MultiProgress,
    /// The devices side by side when this one is the heaviest and
    /// imbalanced (the `imbalance` lever).
    imbalance: Option<&'a Imbalance>,
}

/// What [`Analysed::analyse`] returns: the explanations, the lints, the
/// text, the HTML of the limit (with `--min-capacity`) and the summary of
/// the first setting.
type Analysis = (
    Vec<Explanation>,
    Vec<SettingLints>,
    String,
    Option<String>,
    Option<Summary>,
);

/// The summary block at the top of an input's text (after its header).
fn push_summary(text: &mut String, summary: Option<&Summary>) {
    if let Some(s) = summary {
        text.push_str(&s.text());
        text.push('\n');
    }
}

impl Analysed<'_> {
    /// Explain each setting's reserved peak and first OOM, lint it and,
    /// with `min_capacity`, find each setting's smallest device; add them
    /// to the input's JSON reports (`json`, one per setting) and return the
    /// explanations and lints, the text of the table, the explanations and
    /// the lints, and (with `min_capacity`) the HTML of the limit and the
    /// taxes.
    fn analyse(
        &self,
        reports: &[ReplayReport],
        min_capacity: bool,
        json: &mut [serde_json::Value],
    ) -> Result<Analysis> {
        let explanations = explain::explain_all(
            self.trace,
            self.start,
            self.settings,
            reports,
            self.capacity,
            self.device_total,
            self.sites,
            self.imbalance,
        )?;
        add_explanations(json, &explanations)?;
        let mins = if min_capacity {
            let mins =
                min_capacities(self.trace, self.start, self.settings, self.label, self.bars)?;
            add_min_capacity(json, &mins);
            Some(mins)
        } else {
            None
        };
        // The yardstick of the minimum capacities (see `limit`).
        let limit = mins.as_ref().map(|mins| {
            let l = limit::limit_of(self.trace, self.start);
            let taxes: Vec<_> = mins
                .iter()
                .map(|m| limit::tax(m.min_capacity, &l))
                .collect();
            limit::add_json(json, &l, &taxes);
            (l, taxes)
        });
        // The recording ends at an OOM (the program crashed there): the
        // minimum capacities cover the run only up to it.
        let ends = reports
            .iter()
            .filter_map(|r| r.first_oom.as_ref())
            .map(|o| o.op)
            .find(|&op| recording_ends_at(self.trace, op));
        if let (Some(op), Some(_)) = (ends, mins.as_ref()) {
            for v in json.iter_mut() {
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("recording_ends_at_oom".into(), serde_json::json!(op));
                }
            }
        }
        let headline = mins.as_deref().and_then(min_capacity_headline);
        let ends = ends.filter(|_| mins.is_some());
        let summary = reports
            .first()
            .map(|r| Summary::new(r, explanations.first(), headline.as_deref(), ends));
        if let Some(s) = &summary {
            let value = serde_json::to_value(s).context("serializing the summary")?;
            for v in json.iter_mut() {
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("summary".into(), value.clone());
                }
            }
        }
        let mut text = render_table(reports, mins.as_deref(), headline, limit.as_ref(), ends);
        text.push_str(&explain::render_text(&explanations));
        let lints = lints::lint_all(
            self.trace,
            self.start,
            self.settings,
            reports,
            self.capacity,
            self.sites,
        )?;
        lints::add_json(json, &lints)?;
        text.push_str(&lints::render_text(&lints));
        let html = limit.as_ref().zip(mins.as_ref()).map(|((l, taxes), mins)| {
            let named: Vec<_> = mins
                .iter()
                .map(|m| (m.setting.clone(), m.min_capacity))
                .collect();
            limit::html(l, &named, taxes)
        });
        Ok((explanations, lints, text, html, summary))
    }
}

/// The smallest capacity of each setting (`--min-capacity`), the settings
/// searched at once, with a progress bar on a terminal.
fn min_capacities(
    trace: &Trace,
    start: Option<&StartState>,
    settings: &[ReplaySetting],
    label: &str,
    bars: &MultiProgress,
) -> Result<Vec<MinCapacity>> {
    let bar = bars.add(par::progress_bar(
        settings.len() as u64,
        "{spinner} minimum capacity [{bar:20}] {pos}/{len} {msg}",
    ));
    let found: Vec<Result<MinCapacity>> = settings
        .par_iter()
        .with_max_len(1)
        .map(|s| {
            bar.set_message(format!("{}: {label}", s.name));
            let m = min_capacity(trace, start, s, &mut |lo, hi| {
                bar.set_message(format!(
                    "{}: between {} and {} ({label})",
                    s.name,
                    format_size(lo),
                    format_size(hi)
                ));
            })
            .with_context(|| format!("finding the minimum capacity of {label} with {}", s.name));
            bar.inc(1);
            m
        })
        .collect();
    bar.finish_and_clear();
    bars.remove(&bar);
    found.into_iter().collect()
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

/// The comparison table, with the minimum capacities and their taxes when
/// measured.
fn render_table(
    reports: &[ReplayReport],
    mins: Option<&[MinCapacity]>,
    headline: Option<String>,
    limit: Option<&(Limit, Vec<Option<limit::Tax>>)>,
    ends_at_oom: Option<u64>,
) -> String {
    let Some(mins) = mins else {
        return table::render(reports);
    };
    let cells = mins
        .iter()
        .map(|m| m.min_capacity.map_or("> 16 TiB".to_string(), format_size))
        .collect();
    let mut extra = vec![("minimum capacity (no OOM)", cells)];
    if let Some((_, taxes)) = limit {
        let cells = taxes.iter().map(|t| limit::tax_cell(*t)).collect();
        extra.push(("fragmentation tax (vs best placement)", cells));
    }
    let mut out = table::render_with(reports, extra);
    if let Some(h) = headline {
        let _ = writeln!(
            out,
            "
{h}"
        );
        if let Some(op) = ends_at_oom {
            let _ = writeln!(
                out,
                "(up to op {op} only: the recording ends at its OOM there, so what the program does after the failure was never recorded and is not covered)"
            );
        }
    }
    if let Some((l, taxes)) = limit {
        let named: Vec<_> = mins
            .iter()
            .map(|m| m.setting.clone())
            .zip(taxes.iter().copied())
            .collect();
        out.push_str(&limit::replay_text(l, &named));
    }
    out
}
