//! The self-contained HTML report of `reservoir replay --html`: inline SVG,
//! no script, no network.
//!
//! Per input: the active (allocated) and reserved memory of every setting
//! on one op axis (one `<path>` per setting per timeline, with
//! `class="series allocated"` / `class="series reserved"`, `id` =
//! `<timeline>-<input>-<setting index>` and `data-setting` = the setting's
//! name), the segment map of the first setting at its reserved peak
//! (`class="block live"`, `"block free"`, `"block wasted"` for the part of a
//! live block beyond its requested size), the numbers table, and each
//! setting's reserved peak and first OOM explained (live allocations by
//! site, the free blocks that could not serve the failed request and why,
//! the settings change that avoids it). Inputs are named by their file name
//! only: the page carries no path of the machine it was made on.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use reservoir::format::format_size;
use reservoir::observe::snapshot::{BlockState, Segment};
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::explain::{Explanation, SiteUsage};
use reservoir_replay::replay::recorded::{Fidelity, RecordedTrace};
use reservoir_replay::replay::roles::{basis_words, largest, RoleBytes};
use reservoir_replay::replay::{segments_at, ReplayOptions, ReplayReport, ReplaySetting};

use crate::table::format_ns;

/// One input of the report.
pub struct Section {
    title: String,
    ops: u64,
    reports: Vec<ReplayReport>,
    fidelity: Vec<(String, Option<Fidelity>)>,
    /// The setting whose segment map is shown, and the map.
    peak_setting: String,
    peak_op: u64,
    segments: Vec<Segment>,
    /// Each setting's peak and first OOM explained.
    explanations: Vec<Explanation>,
    /// Each setting's lints.
    lints: Vec<reservoir_replay::replay::lints::SettingLints>,
    /// The trace entries the reader skipped (unknown actions), in words;
    /// empty when none.
    skipped: String,
    /// Who recorded the input when not PyTorch's CUDA allocator
    /// (`reservoir_replay::recorder`); empty otherwise.
    recorder_note: String,
    /// The limit and each setting's fragmentation tax (`--min-capacity`),
    /// as HTML; empty when not measured.
    limit: String,
    /// What happened, why, what to do and what fits (shown first).
    summary: Option<crate::summary::Summary>,
}

impl Section {
    /// A recorded trace's section.
    pub fn recorded(
        title: String,
        rec: &RecordedTrace,
        settings: &[ReplaySetting],
        capacity: u64,
        reports: &[ReplayReport],
        fidelity: &[(String, Option<Fidelity>)],
    ) -> Result<Section> {
        let ops = rec.trace.ops.len() as u64;
        Self::build(
            title,
            ops,
            settings,
            capacity,
            reports,
            fidelity.to_vec(),
            |s, o, peak| {
                segments_at(&rec.trace, Some(&rec.start), s, o, peak)
                    .context("replaying to the peak")
            },
        )
    }

    /// A built-in workload's section.
    pub fn workload(
        title: String,
        trace: &Trace,
        settings: &[ReplaySetting],
        capacity: u64,
        reports: &[ReplayReport],
    ) -> Result<Section> {
        let ops = trace.ops.len() as u64;
        Self::build(
            title,
            ops,
            settings,
            capacity,
            reports,
            Vec::new(),
            |s, o, peak| segments_at(trace, None, s, o, peak).context("replaying to the peak"),
        )
    }

    /// The section of `ops` operations; the segment map is that of the first
    /// setting at its peak, which `segments` replays to.
    fn build(
        title: String,
        ops: u64,
        settings: &[ReplaySetting],
        capacity: u64,
        reports: &[ReplayReport],
        fidelity: Vec<(String, Option<Fidelity>)>,
        segments: impl FnOnce(&ReplaySetting, &ReplayOptions, Option<u64>) -> Result<Vec<Segment>>,
    ) -> Result<Section> {
        let options = ReplayOptions {
            capacity,
            ..ReplayOptions::default()
        };
        let peak_op = reports.first().and_then(|r| r.peak.as_ref()).map(|p| p.op);
        let segments = match settings.first() {
            Some(s) => segments(s, &options, peak_op)?,
            None => Vec::new(),
        };
        Ok(Section {
            title,
            ops,
            reports: reports.to_vec(),
            fidelity,
            peak_setting: settings.first().map(|s| s.name.clone()).unwrap_or_default(),
            peak_op: peak_op.unwrap_or(0),
            segments,
            explanations: Vec::new(),
            lints: Vec::new(),
            skipped: String::new(),
            recorder_note: String::new(),
            limit: String::new(),
            summary: None,
        })
    }

    /// The section with each setting's peak and first OOM explained.
    pub fn with_explanations(mut self, explanations: Vec<Explanation>) -> Section {
        self.explanations = explanations;
        self
    }

    /// The section with each setting's lints.
    pub fn with_lints(
        mut self,
        lints: Vec<reservoir_replay::replay::lints::SettingLints>,
    ) -> Section {
        self.lints = lints;
        self
    }

    /// The section with the limit and the taxes (HTML from
    /// [`crate::limit::html`]).
    pub fn with_limit(mut self, limit: Option<String>) -> Section {
        self.limit = limit.unwrap_or_default();
        self
    }

    /// The section with its summary, shown first.
    pub fn with_summary(mut self, summary: Option<crate::summary::Summary>) -> Section {
        self.summary = summary;
        self
    }

    /// The section with the trace entries the reader skipped, in words
    /// (its fidelity is then not called exact).
    pub fn with_skipped(mut self, skipped: String) -> Section {
        self.skipped = skipped;
        self
    }

    /// The section with the line saying who recorded it (when not
    /// PyTorch's CUDA allocator), shown above its fidelity.
    pub fn with_recorder_note(mut self, note: Option<String>) -> Section {
        self.recorder_note = note.unwrap_or_default();
        self
    }
}

fn sites_html(out: &mut String, sites: &[SiteUsage]) {
    out.push_str("<table class=\"numbers\"><tr><th>site (innermost user frame)</th><th>bytes</th><th>allocations</th></tr>\n");
    for s in sites {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.site),
            format_size(s.bytes),
            s.count
        );
    }
    out.push_str("</table>\n");
}

/// The live bytes by role: one row per role holding bytes, largest first,
/// with how its bytes were mostly decided.
fn roles_html(
    out: &mut String,
    roles: &std::collections::BTreeMap<&'static str, u64>,
    basis: &std::collections::BTreeMap<&'static str, RoleBytes>,
) {
    out.push_str("<table class=\"numbers roles\"><tr><th>role</th><th>bytes</th><th>decided from</th></tr>\n");
    for (r, b) in largest(roles) {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(r.words()),
            format_size(b),
            basis.get(r.key()).map_or("", basis_words)
        );
    }
    out.push_str("</table>\n");
}

/// The settings in one table, one row each: the reserved peak, where, the
/// largest site at it, and the first OOM; then the live allocations by site
/// at the first setting's peak (the other settings' are in `--json`).
fn settings_table(out: &mut String, s: &Section) {
    out.push_str("<h3>Settings: reserved peak and first OOM</h3>\n<table class=\"numbers settings\"><tr><th>setting</th><th>reserved peak</th><th>at op</th><th>allocated there</th><th>largest site at the peak</th><th>first OOM</th></tr>\n");
    for (i, e) in s.explanations.iter().enumerate() {
        let _ = write!(
            out,
            r#"<tr><td><span class="swatch" style="background:{}"></span>{}</td>"#,
            COLORS[i % COLORS.len()],
            esc(&e.setting)
        );
        match &e.peak {
            Some(p) => {
                let top = p.top_sites.first().map_or("-".to_string(), |t| {
                    format!("{} ({})", esc(&t.site), format_size(t.bytes))
                });
                let _ = write!(
                    out,
                    "<td>{}</td><td>{}</td><td>{}</td><td>{top}</td>",
                    format_size(p.reserved),
                    p.op,
                    format_size(p.allocated)
                );
            }
            None => out.push_str("<td>-</td><td>-</td><td>-</td><td>-</td>"),
        }
        let oom = e.oom.as_ref().map_or("none".to_string(), |o| {
            format!(
                "op {}: short by {}",
                o.op,
                format_size(o.diagnosis.shortfall)
            )
        });
        let _ = writeln!(out, "<td>{oom}</td></tr>");
    }
    out.push_str("</table>\n");
    if let Some((e, p)) = s
        .explanations
        .first()
        .and_then(|e| e.peak.as_ref().map(|p| (e, p)))
    {
        let _ = writeln!(
            out,
            "<h3>{}: live allocations by site at its reserved peak (op {})</h3>",
            esc(&e.setting),
            p.op
        );
        sites_html(out, &p.top_sites);
        roles_html(out, &p.roles, &p.role_basis);
    }
}

/// Each setting's first OOM, explained.
fn explanations(out: &mut String, s: &Section) {
    for e in &s.explanations {
        if let Some(o) = &e.oom {
            let _ = writeln!(
                out,
                "<h3>{}: first OOM at op {}: {} (rounded {}) on stream {} from {}</h3>",
                esc(&e.setting),
                o.op,
                format_size(o.bytes),
                format_size(o.rounded),
                o.stream,
                esc(&o.site)
            );
            out.push_str("<table class=\"numbers\"><tr><th>free blocks that could not serve it</th><th>blocks</th><th>bytes</th><th>largest</th></tr>\n");
            for u in &o.unusable_free {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    crate::explain::reason(u.reason),
                    u.blocks,
                    format_size(u.bytes),
                    format_size(u.largest)
                );
            }
            out.push_str("</table>\n");
            sites_html(out, &o.top_sites);
            roles_html(out, &o.roles, &o.role_basis);
            crate::diagnose::render_html(out, &o.diagnosis);
        }
    }
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// `s` escaped for HTML text and attribute values.
pub(crate) fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const W: f64 = 1200.0;
const H: f64 = 260.0;
const LEFT: f64 = 80.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 30.0;

/// One timeline: `which` is "allocated" or "reserved".
fn timeline(out: &mut String, k: usize, s: &Section, which: &str, label: &str) {
    let pick = |p: &reservoir_replay::replay::Sample| {
        if which == "allocated" {
            p.allocated
        } else {
            p.reserved
        }
    };
    let ymax = s
        .reports
        .iter()
        .flat_map(|r| r.samples.iter().map(pick))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let xmax = s.ops.max(1) as f64;
    let pw = W - LEFT - 10.0;
    let ph = H - TOP - BOTTOM;
    let x = |op: u64| LEFT + op as f64 / xmax * pw;
    let y = |b: u64| TOP + ph - b as f64 / ymax * ph;
    let _ = writeln!(
        out,
        r#"<h3>{label}</h3><svg class="timeline" id="timeline-{which}-{k}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" xmlns="http://www.w3.org/2000/svg">"#
    );
    // axes and grid
    for i in 0..=4 {
        let b = ymax * i as f64 / 4.0;
        let yy = y(b as u64);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="11" text-anchor="end">{}</text>"##,
            W - 10.0,
            LEFT - 4.0,
            yy + 4.0,
            format_size(b as u64)
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" x2="{}" y1="{}" y2="{}" stroke="#444"/><text x="{}" y="{}" font-size="11" text-anchor="middle">op (0 .. {})</text>"##,
        W - 10.0,
        TOP + ph,
        TOP + ph,
        LEFT + pw / 2.0,
        H - 6.0,
        s.ops
    );
    // The first setting (PyTorch's) last, so it is drawn on top.
    for (i, r) in s.reports.iter().enumerate().rev() {
        let mut d = String::new();
        let mut last_y = None;
        for p in &r.samples {
            let (px, py) = (x(p.op), y(pick(p)));
            match last_y {
                None => {
                    let _ = write!(d, "M{px:.1},{py:.1}");
                }
                Some(ly) => {
                    // Steps: the value holds until the next sample.
                    let _ = write!(d, " L{px:.1},{ly:.1} L{px:.1},{py:.1}");
                }
            }
            last_y = Some(py);
        }
        if let Some(ly) = last_y {
            let _ = write!(d, " L{:.1},{ly:.1}", x(s.ops));
        }
        let _ = writeln!(
            out,
            r#"<path class="series {which}" id="{which}-{k}-{i}" data-setting="{}" d="{d}" fill="none" stroke="{}" stroke-width="1.5" opacity="0.85"/>"#,
            esc(&r.setting),
            COLORS[i % COLORS.len()]
        );
    }
    oom_markers(out, s, &x, ph);
    out.push_str("</svg>\n");
}

/// A dashed vertical line at each setting's first OOM, with a `<title>`
/// naming the setting, the op and the request (`class="oom-marker"`,
/// `data-setting`, `data-op`).
fn oom_markers(out: &mut String, s: &Section, x: &dyn Fn(u64) -> f64, ph: f64) {
    for (i, r) in s.reports.iter().enumerate() {
        let Some(o) = &r.first_oom else { continue };
        let xx = x(o.op);
        let _ = writeln!(
            out,
            r##"<g class="oom-marker" data-setting="{}" data-op="{}"><title>OOM with {} at op {}: {}</title><line x1="{xx:.1}" x2="{xx:.1}" y1="{TOP}" y2="{:.1}" stroke="{}" stroke-width="2" stroke-dasharray="5,3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#b00">OOM ({})</text></g>"##,
            esc(&r.setting),
            o.op,
            esc(&r.setting),
            o.op,
            esc(&o.message),
            TOP + ph,
            COLORS[i % COLORS.len()],
            xx + 3.0,
            TOP + 10.0 + 12.0 * i as f64,
            esc(&r.setting)
        );
    }
}

/// The segment map: segments in address order laid along rows, each row
/// `bytes_per_row` bytes wide.
fn segment_map(out: &mut String, k: usize, s: &Section) {
    let total: u64 = s.segments.iter().map(|g| g.total_size).sum();
    let rows = 24u64;
    let row_h = 16.0;
    let gap = 4.0;
    let pw = W - 20.0;
    let bytes_per_row = (total.div_ceil(rows)).max(1) as f64;
    let height = rows as f64 * (row_h + gap) + 10.0;
    let (mut live, mut free, mut wasted) = (0u64, 0u64, 0u64);
    let _ = writeln!(
        out,
        r#"<h3>Segment map of {} at its reserved peak (after op {}): {} segments, {}</h3>
<svg class="segmap" id="segmap-{k}" width="{W}" height="{height}" viewBox="0 0 {W} {height}" xmlns="http://www.w3.org/2000/svg">"#,
        esc(&s.peak_setting),
        s.peak_op,
        s.segments.len(),
        format_size(total)
    );
    let mut pos = 0f64; // bytes laid so far
    let rect = |out: &mut String, start: f64, len: f64, class: &str, color: &str| {
        // Split across rows.
        let mut a = start;
        let end = start + len;
        while a < end {
            let row = (a / bytes_per_row).floor();
            let row_end = (row + 1.0) * bytes_per_row;
            let b = end.min(row_end);
            let x0 = 10.0 + (a - row * bytes_per_row) / bytes_per_row * pw;
            let w = ((b - a) / bytes_per_row * pw).max(0.5);
            let y0 = 5.0 + row * (row_h + gap);
            let _ = writeln!(
                out,
                r##"<rect class="{class}" x="{x0:.2}" y="{y0:.1}" width="{w:.2}" height="{row_h}" fill="{color}" stroke="#fff" stroke-width="0.3"/>"##
            );
            a = b;
        }
    };
    for seg in &s.segments {
        for (address, b) in seg.blocks_with_addresses() {
            let start = pos + (address - seg.address) as f64;
            match b.state {
                BlockState::Inactive => {
                    free += b.size;
                    rect(out, start, b.size as f64, "block free", "#d9d9d9");
                }
                _ => {
                    let used = b.requested_or_size().min(b.size);
                    live += used;
                    wasted += b.size - used;
                    rect(out, start, used as f64, "block live", "#3a78c2");
                    if b.size > used {
                        rect(
                            out,
                            start + used as f64,
                            (b.size - used) as f64,
                            "block wasted",
                            "#f0a030",
                        );
                    }
                }
            }
        }
        // Segment boundary.
        rect(
            out,
            pos,
            (bytes_per_row / pw * 1.0).min(seg.total_size as f64),
            "segment-start",
            "#222",
        );
        pos += seg.total_size as f64;
    }
    out.push_str("</svg>\n");
    let _ = writeln!(
        out,
        r#"<p class="legend"><span style="background:#3a78c2"></span>live (requested) {} <span style="background:#f0a030"></span>wasted (rounding) {} <span style="background:#d9d9d9"></span>free (cached) {} <span style="background:#222"></span>segment start</p>"#,
        format_size(live),
        format_size(wasted),
        format_size(free)
    );
}

fn numbers(out: &mut String, s: &Section) {
    type Cell = fn(&ReplayReport) -> String;
    let rows: [(&str, Cell); 12] = [
        ("peak allocated", |r| format_size(r.peak_allocated)),
        ("peak reserved", |r| format_size(r.peak_reserved)),
        ("fragmentation (reserved/allocated)", |r| {
            r.fragmentation.map_or("-".into(), |f| format!("{f:.3}x"))
        }),
        ("reserved-unallocated at peak", |r| {
            format_size(r.reserved_unallocated_at_peak)
        }),
        ("largest free block at peak", |r| {
            format_size(r.largest_free_block_at_peak)
        }),
        ("driver allocs", |r| r.driver_allocs.to_string()),
        ("driver frees", |r| r.driver_frees.to_string()),
        ("OOMs", |r| r.ooms.to_string()),
        ("simulated driver time", |r| {
            format_ns(r.driver_time_ns as f64)
        }),
        ("allocator time per call (mean)", |r| {
            format_ns(r.allocator_ns_per_op)
        }),
        ("allocator time per call (median)", |r| {
            format_ns(r.allocator_ns_p50)
        }),
        ("settings", |r| r.describe_setting()),
    ];
    out.push_str("<table class=\"numbers\"><tr><th></th>");
    for (i, r) in s.reports.iter().enumerate() {
        let _ = write!(
            out,
            r#"<th><span class="swatch" style="background:{}"></span>{}</th>"#,
            COLORS[i % COLORS.len()],
            esc(&r.setting)
        );
    }
    out.push_str("</tr>\n");
    for (label, f) in rows {
        let _ = write!(out, "<tr><td>{label}</td>");
        for r in &s.reports {
            let _ = write!(out, "<td>{}</td>", esc(&f(r)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    if !s.recorder_note.is_empty() {
        let _ = writeln!(
            out,
            r#"<p class="fidelity recorder">{}</p>"#,
            esc(&s.recorder_note)
        );
    }
    for (name, f) in &s.fidelity {
        if let Some(f) = f {
            let _ = writeln!(
                out,
                r#"<p class="fidelity">Fidelity of <b>{}</b> (PyTorch mode): segment events {}/{}{}, block placements {}/{}, recorded peak reserved {}, recorded OOMs {}.</p>"#,
                esc(name),
                f.segment_events_matched,
                f.segment_events_total,
                if !s.skipped.is_empty() {
                    format!(" (not exact: {} from the recording)", esc(&s.skipped))
                } else if f.segment_events_exact {
                    " (exact)".to_string()
                } else {
                    String::new()
                },
                f.placements_matched,
                f.placements_total,
                format_size(f.recorded_peak_reserved),
                f.recorded_ooms
            );
        }
    }
    for r in &s.reports {
        if let Some(o) = &r.first_oom {
            let _ = writeln!(
                out,
                r#"<p class="oom">First OOM with <b>{}</b> (op {}): <code>{}</code></p>"#,
                esc(&r.setting),
                o.op,
                esc(&o.message)
            );
        }
    }
}

/// The whole page.
pub fn render(sections: &[Section]) -> String {
    let mut out = String::from(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Reservoir replay report</title>
<style>
body { font-family: system-ui, sans-serif; margin: 20px; color: #222; }
h1 { font-size: 22px; } h2 { font-size: 18px; border-top: 1px solid #ccc; padding-top: 10px; }
h3 { font-size: 14px; margin: 12px 0 4px; }
table.numbers { border-collapse: collapse; font-size: 13px; table-layout: fixed; width: 1200px; }
table.numbers td { overflow-wrap: anywhere; }
table.numbers td, table.numbers th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
table.numbers td:first-child { text-align: left; }
.swatch, .legend span { display: inline-block; width: 12px; height: 12px; margin: 0 4px 0 10px; vertical-align: middle; }
p.fidelity { font-size: 13px; } p.legend { font-size: 12px; }
div.summary { border: 2px solid #444; padding: 4px 12px; max-width: 1176px; font-size: 14px; background: #fafafa; }
div.summary dt { font-weight: bold; float: left; width: 130px; clear: left; } div.summary dd { margin: 0 0 4px 140px; }
div.summary dd.oom { color: #b00; font-weight: bold; } div.summary ul { margin: 0; padding-left: 16px; }
</style></head><body>
<h1>Reservoir replay report</h1>
"#,
    );
    for (k, s) in sections.iter().enumerate() {
        let _ = writeln!(out, "<section id=\"input-{k}\"><h2>{}</h2>", esc(&s.title));
        // What a reader needs first: the summary, the settings, the OOM
        // explained; then the timelines and the numbers.
        if let Some(summary) = &s.summary {
            summary.html(&mut out);
        }
        settings_table(&mut out, s);
        explanations(&mut out, s);
        out.push_str("<p class=\"legend\">");
        for (i, r) in s.reports.iter().enumerate() {
            let _ = write!(
                out,
                r#"<span style="background:{}"></span>{}"#,
                COLORS[i % COLORS.len()],
                esc(&r.setting)
            );
        }
        out.push_str("</p>\n");
        timeline(&mut out, k, s, "allocated", "Active (allocated) memory");
        timeline(&mut out, k, s, "reserved", "Reserved memory");
        segment_map(&mut out, k, s);
        numbers(&mut out, s);
        out.push_str(&s.limit);
        crate::lints::render_html(&mut out, &s.lints);
        out.push_str("</section>\n");
    }
    out.push_str("</body></html>\n");
    out
}
