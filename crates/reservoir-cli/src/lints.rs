//! The lints of each setting (waste that is not an OOM yet, see
//! [`reservoir_replay::replay::lints`]) in the outputs of `reservoir
//! replay`: a short "waste" block per setting in the table output, a
//! `lints` array per setting in the JSON, a section per setting in the
//! HTML page.

use std::fmt::Write as _;

use anyhow::{Context, Result};

use crate::table::shown_name;
use reservoir::format::format_size;
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::lints::{lints, Lint, SettingLints};
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::{ReplayOptions, ReplayReport, ReplaySetting, StartState};

/// Sites shown per lint in the table output.
const TEXT_SITES: usize = 3;

/// The lints of every report of one input.
pub fn lint_all(
    trace: &Trace,
    start: Option<&StartState>,
    settings: &[ReplaySetting],
    reports: &[ReplayReport],
    capacity: u64,
    sites: &Sites,
) -> Result<Vec<SettingLints>> {
    let options = ReplayOptions::without_timeline(capacity);
    settings
        .iter()
        .zip(reports)
        .map(|(s, r)| {
            lints(trace, start, s, &options, r, sites)
                .with_context(|| format!("linting the replay of {}", s.name))
        })
        .collect()
}

/// Add `lints` (each lint: `kind`, `bytes`, `op`, `stream`, `pool`, `ops`,
/// `detail`, `sites`, `fix`), `lints_threshold` (bytes) and
/// `lints_computed` (false for the MPS heap allocator) to each JSON report,
/// in the same order as `lints`.
pub fn add_json(json: &mut [serde_json::Value], lints: &[SettingLints]) -> Result<()> {
    for (v, l) in json.iter_mut().zip(lints) {
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "lints".into(),
                serde_json::to_value(&l.lints).context("serializing lints")?,
            );
            obj.insert("lints_threshold".into(), l.threshold.into());
            obj.insert("lints_computed".into(), l.computed.into());
        }
    }
    Ok(())
}

fn lint_text(out: &mut String, l: &Lint) {
    let _ = writeln!(
        out,
        "  {:>12}  {}: {}",
        format_size(l.bytes),
        l.kind.label(),
        l.detail
    );
    for s in l.sites.iter().take(TEXT_SITES) {
        let _ = write!(
            out,
            "    {:>12}  {:>6} x  {}",
            format_size(s.bytes),
            s.count,
            s.site
        );
        if let Some(r) = s.request {
            let _ = write!(out, " (typically {} B)", r);
        }
        out.push('\n');
    }
    let _ = writeln!(out, "    fix: {}", l.fix);
}

/// The "waste" block of each setting with a lint, after the table.
pub fn render_text(all: &[SettingLints]) -> String {
    let mut out = String::new();
    for sl in all.iter().filter(|l| !l.lints.is_empty()) {
        let _ = writeln!(
            out,
            "\n{}: waste (lints of {} or more):",
            shown_name(&sl.setting),
            format_size(sl.threshold)
        );
        for l in &sl.lints {
            lint_text(&mut out, l);
        }
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A section per setting with lints (`class="lints"`), one table row per
/// lint.
pub fn render_html(out: &mut String, all: &[SettingLints]) {
    for sl in all.iter().filter(|l| l.computed) {
        let _ = writeln!(
            out,
            "<h3 class=\"lints\">{}: waste (lints of {} or more)</h3>",
            esc(&sl.setting),
            format_size(sl.threshold)
        );
        if sl.lints.is_empty() {
            out.push_str("<p class=\"fidelity\">No waste above the threshold.</p>\n");
            continue;
        }
        out.push_str(
            "<table class=\"numbers lints\"><tr><th>lint</th><th>bytes</th>\
             <th>what</th><th>sites</th><th>fix</th></tr>\n",
        );
        for l in &sl.lints {
            let sites = l
                .sites
                .iter()
                .map(|s| format!("{} ({}, {} x)", esc(&s.site), format_size(s.bytes), s.count))
                .collect::<Vec<_>>()
                .join("<br>");
            let _ = writeln!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                l.kind.label(),
                format_size(l.bytes),
                esc(&l.detail),
                sites,
                esc(&l.fix)
            );
        }
        out.push_str("</table>\n");
    }
}
