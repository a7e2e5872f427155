//! `reservoir replay`: the command that replays recorded inputs and
//! workloads with each setting and reports them.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::{
    explain, html, limit, lints, load_recorded, load_workload, settings, table, RecordedInput,
    ReplayArgs,
};
use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::placement::Limit;
use reservoir_replay::replay::capacity::{min_capacity, MinCapacity};
use reservoir_replay::replay::explain::Explanation;
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
/// each setting, reported as text, JSON and (`--html`) a page.
pub(crate) fn cmd_replay(args: ReplayArgs) -> Result<()> {
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
    let mut run = Run {
        args: &args,
        progress: Progress::new(total),
        base: 0,
        start: Instant::now(),
        sections: Vec::new(),
        json: Vec::new(),
        text: String::new(),
    };
    for input in &recorded {
        run.recorded(input)?;
    }
    if let Some((w, trace, sites, settings)) = &wl {
        run.workload(w, trace, sites, settings)?;
    }
    run.progress.bar.finish_and_clear();
    run.write()
}

/// A `reservoir replay` in progress: its progress bar and the reports
/// written so far.
struct Run<'a> {
    args: &'a ReplayArgs,
    progress: Progress,
    /// Ops replayed before the current input (over all its settings).
    base: u64,
    start: Instant,
    sections: Vec<html::Section>,
    json: Vec<serde_json::Value>,
    text: String,
}

impl Run<'_> {
    /// Replay one recorded input with each of its settings and report it.
    fn recorded(&mut self, input: &RecordedInput) -> Result<()> {
        let args = self.args;
        let mut reports: Vec<ReplayReport> = Vec::new();
        let mut fids = Vec::new();
        let first_json = self.json.len();
        for s in &input.settings {
            let options = ReplayOptions {
                capacity: input.capacity,
                ..ReplayOptions::default()
            };
            let compare = s.name == "pytorch" && args.start == StartMode::Recorded;
            let (progress, base) = (&mut self.progress, self.base);
            let (report, fid) = replay_recorded(&input.rec, s, &options, compare, &mut |n| {
                progress.set(base + n as u64)
            })
            .with_context(|| format!("replaying {} with {}", input.file, s.name))?;
            self.base += input.rec.trace.ops.len() as u64;
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
            self.json.push(value);
            fids.push((s.name.clone(), rr.fidelity.clone()));
            reports.push(rr.report);
        }
        let title = format!("{} (device {})", input.file, input.rec.device);
        let (explanations, lints, analysis, limit_html) = Analysed {
            label: &title,
            trace: &input.rec.trace,
            start: Some(&input.rec.start),
            sites: &input.rec.sites,
            settings: &input.settings,
            capacity: input.capacity,
            device_total: args.device_total,
        }
        .analyse(&reports, args.min_capacity, &mut self.json[first_json..])?;
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
        let _ = writeln!(
            self.text,
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
        self.text.push_str(&analysis);
        fidelity_text(&mut self.text, input, args.start, &fids, &reports);
        self.text.push('\n');
        if args.html.is_some() {
            self.sections.push(
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
                .with_limit(limit_html),
            );
        }
        Ok(())
    }

    /// Replay the workload with each setting and report it.
    fn workload(
        &mut self,
        w: &Workload,
        trace: &Trace,
        sites: &Sites,
        settings: &[ReplaySetting],
    ) -> Result<()> {
        let options = ReplayOptions {
            capacity: self.args.capacity.unwrap_or(DEFAULT_CAPACITY),
            ..ReplayOptions::default()
        };
        let (progress, b) = (&mut self.progress, self.base);
        let reports = replay_all(trace, settings, &options, &mut |done| {
            progress.set(b + done as u64)
        })
        .with_context(|| format!("replaying workload {}", w.preset))?;
        let first_json = self.json.len();
        for r in &reports {
            self.json
                .push(serde_json::to_value(r).context("serializing a report")?);
        }
        let title = format!("workload {}", w.spec());
        let (explanations, lints, analysis, limit_html) = Analysed {
            label: &title,
            trace,
            start: None,
            sites,
            settings,
            capacity: options.capacity,
            device_total: self.args.device_total,
        }
        .analyse(
            &reports,
            self.args.min_capacity,
            &mut self.json[first_json..],
        )?;
        let _ = writeln!(self.text, "{title}");
        let _ = writeln!(
            self.text,
            "{} ops replayed on a simulated {} device ({} settings) in {:.2} s\n",
            trace.ops.len(),
            format_size(options.capacity),
            settings.len(),
            self.start.elapsed().as_secs_f64()
        );
        self.text.push_str(&analysis);
        if self.args.html.is_some() {
            self.sections.push(
                html::Section::workload(title, trace, settings, options.capacity, &reports)?
                    .with_explanations(explanations)
                    .with_lints(lints)
                    .with_limit(limit_html),
            );
        }
        Ok(())
    }

    /// Write the page (`--html`) and the report, JSON (`--json`) or text, to
    /// standard output.
    fn write(self) -> Result<()> {
        if let Some(path) = &self.args.html {
            crate::output::write_html(path, html::render(&self.sections))?;
        }
        crate::output::with_stdout(|out| {
            if self.args.json {
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
}

/// What [`Analysed::analyse`] returns: the explanations, the lints, the
/// text, and the HTML of the limit (with `--min-capacity`).
type Analysis = (Vec<Explanation>, Vec<SettingLints>, String, Option<String>);

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
        )?;
        add_explanations(json, &explanations)?;
        let mins = if min_capacity {
            let mins = min_capacities(self.trace, self.start, self.settings, self.label)?;
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
        let mut text = render_table(reports, mins.as_deref(), limit.as_ref());
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
        Ok((explanations, lints, text, html))
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

/// The comparison table, with the minimum capacities and their taxes when
/// measured.
fn render_table(
    reports: &[ReplayReport],
    mins: Option<&[MinCapacity]>,
    limit: Option<&(Limit, Vec<Option<limit::Tax>>)>,
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
    if let Some(h) = min_capacity_headline(mins) {
        let _ = writeln!(
            out,
            "
{h}"
        );
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
