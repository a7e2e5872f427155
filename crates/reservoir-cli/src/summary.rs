//! The summary a user reads first (issue 41 item 4): for one input of
//! `reservoir replay`, what happened, why, what to do and what fits, taken
//! from the explanation and diagnosis of its first setting and the
//! `--min-capacity` headline (nothing is computed again). It heads the
//! input's text, its section of the HTML report, and is each of its JSON
//! reports' `summary` object.

use std::fmt::Write as _;

use reservoir::format::format_size;
use reservoir_replay::replay::explain::Explanation;
use reservoir_replay::replay::ReplayReport;

use crate::diagnose::cause_name;
use crate::table::shown_name;

/// `s` escaped for HTML (as `html::esc`, which imports this module).
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Causes the summary names (the largest first).
const CAUSES: usize = 3;

/// One cause in the summary.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SummaryCause {
    /// The class and rule in words, e.g. `fragmentation (scattered)`.
    pub cause: String,
    /// The bytes it accounts for.
    pub bytes: u64,
    /// The diagnosis's sentence.
    pub sentence: String,
}

/// The summary of one input (the JSON `summary` object; docs/replay.md).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// The setting summarized: the input's first (PyTorch's defaults unless
    /// `--policy`/`--config` say otherwise).
    pub setting: String,
    /// The op of its first OOM; `null` without one.
    pub oom_op: Option<u64>,
    /// The diagnosis's shortfall at that OOM; `null` without one.
    pub shortfall: Option<u64>,
    /// Its reserved peak.
    pub peak_reserved: u64,
    /// What happened, one line: `OOM at op N: short by X` or `no OOM, peak
    /// reserved Y`.
    pub happened: String,
    /// Why: the diagnosis's first causes by bytes (empty without an OOM).
    pub why: Vec<SummaryCause>,
    /// What to do: the diagnosis's verdict (the cheapest proven fix's
    /// sentence, or why none was found); `null` without an OOM.
    pub fix: Option<String>,
    /// What fits: the `--min-capacity` headline (with the clause saying
    /// the recording ends at its OOM when it does); `null` when not
    /// measured.
    pub fits: Option<String>,
}

impl Summary {
    /// The summary of the first setting's `report` and `explanation`, with
    /// the `--min-capacity` `headline` and the op the recording ends at (an
    /// OOM) when known.
    pub fn new(
        report: &ReplayReport,
        explanation: Option<&Explanation>,
        headline: Option<&str>,
        ends_at_oom: Option<u64>,
    ) -> Summary {
        let oom = explanation.and_then(|e| e.oom.as_ref());
        let happened = match (oom, &report.first_oom) {
            (Some(o), _) => format!(
                "OOM at op {}: short by {} ({} OOM{} in all)",
                o.op,
                format_size(o.diagnosis.shortfall),
                report.ooms,
                if report.ooms == 1 { "" } else { "s" }
            ),
            (None, Some(o)) => format!("OOM at op {}", o.op),
            (None, None) => format!(
                "no OOM, peak reserved {}",
                format_size(report.peak_reserved)
            ),
        };
        let fits = headline.map(|h| match ends_at_oom {
            Some(op) => format!("{h} (up to op {op} only: the recording ends at its OOM there)"),
            None => h.to_string(),
        });
        Summary {
            setting: report.setting.clone(),
            oom_op: report.first_oom.as_ref().map(|o| o.op),
            shortfall: oom.map(|o| o.diagnosis.shortfall),
            peak_reserved: report.peak_reserved,
            happened,
            why: oom
                .map(|o| {
                    o.diagnosis
                        .causes
                        .iter()
                        .take(CAUSES)
                        .map(|c| SummaryCause {
                            cause: cause_name(c),
                            bytes: c.bytes,
                            sentence: c.sentence.clone(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
            fix: oom.map(|o| o.diagnosis.verdict.clone()),
            fits,
        }
    }

    /// The summary as text: a block of labelled lines.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "summary ({}):", shown_name(&self.setting));
        let _ = writeln!(out, "  what happened: {}", self.happened);
        for (i, c) in self.why.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}{} {}: {}",
                if i == 0 {
                    "why:           "
                } else {
                    "               "
                },
                c.cause,
                format_size(c.bytes),
                c.sentence
            );
        }
        if let Some(f) = &self.fix {
            let _ = writeln!(out, "  what to do:    {f}");
        }
        match &self.fits {
            Some(f) => {
                let _ = writeln!(out, "  what fits:     {f}");
            }
            None => out.push_str("  what fits:     not measured (add --min-capacity)\n"),
        }
        out
    }

    /// The summary as HTML: a `<div class="summary">` of labelled lines.
    pub fn html(&self, out: &mut String) {
        let _ = writeln!(
            out,
            r#"<div class="summary"><h3>Summary ({})</h3><dl>"#,
            esc(&self.setting)
        );
        let class = if self.oom_op.is_some() {
            " class=\"oom\""
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "<dt>What happened</dt><dd{class}>{}</dd>",
            esc(&self.happened)
        );
        if !self.why.is_empty() {
            out.push_str("<dt>Why</dt><dd><ul>");
            for c in &self.why {
                let _ = write!(
                    out,
                    "<li><b>{}</b> {}: {}</li>",
                    esc(&c.cause),
                    format_size(c.bytes),
                    esc(&c.sentence)
                );
            }
            out.push_str("</ul></dd>\n");
        }
        if let Some(f) = &self.fix {
            let _ = writeln!(out, "<dt>What to do</dt><dd>{}</dd>", esc(f));
        }
        let _ = writeln!(
            out,
            "<dt>What fits</dt><dd>{}</dd></dl></div>",
            esc(self
                .fits
                .as_deref()
                .unwrap_or("not measured (replay with --min-capacity)"))
        );
    }
}
