//! The summary a user reads first (issue 41 item 4): for one input of
//! `reservoir replay`, what happened, why, what to do and what fits, taken
//! from the explanation and diagnosis of its first setting and the
//! `--min-capacity` headline (nothing is computed again). It heads the
//! input's text, its section of the HTML report, and is each of its JSON
//! reports' `summary` object.

use std::fmt::Write as _;

use reservoir::format::format_size;
use reservoir_replay::replay::explain::Explanation;
use reservoir_replay::replay::levers::Lever;
use reservoir_replay::replay::roles::{largest, Role};
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

/// One role of the live bytes in the summary.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SummaryRole {
    /// The role's key (`activations`, `parameters`, ...).
    pub role: &'static str,
    /// Its live bytes.
    pub bytes: u64,
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
    /// Why, by role: the largest roles of the live bytes (at most three,
    /// largest first) at the OOM, else at the reserved peak (see
    /// `reservoir_replay::replay::roles`); empty without an explanation.
    pub roles: Vec<SummaryRole>,
    /// Where `roles` were taken: `oom` or `peak` (`null` when empty).
    pub roles_at: Option<&'static str>,
    /// What to do: the diagnosis's verdict (the cheapest proven fix's
    /// sentence, or why none was found); `null` without an OOM.
    pub fix: Option<String>,
    /// The program levers, after the settings fix: those of the OOM, or
    /// without one those that cut the reserved peak, each proven by a
    /// replay (`reservoir_replay::replay::levers`).
    pub levers: Vec<Lever>,
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
        let (role_map, roles_at) = match (oom, explanation.and_then(|e| e.peak.as_ref())) {
            (Some(o), _) => (Some(&o.roles), Some("oom")),
            (None, Some(p)) => (Some(&p.roles), Some("peak")),
            (None, None) => (None, None),
        };
        let roles: Vec<SummaryRole> = role_map
            .map(|m| {
                largest(m)
                    .into_iter()
                    .take(CAUSES)
                    .map(|(r, bytes)| SummaryRole {
                        role: r.key(),
                        bytes,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let roles_at = roles_at.filter(|_| !roles.is_empty());
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
            roles,
            roles_at,
            fix: oom.map(|o| o.diagnosis.verdict.clone()),
            levers: match (oom, explanation.and_then(|e| e.peak.as_ref())) {
                (Some(o), _) => o.levers.clone(),
                (None, Some(p)) => p.levers.clone(),
                (None, None) => Vec::new(),
            },
            fits,
        }
    }

    /// The largest roles in words: `memory by role at the OOM: activations
    /// saved for backward 3 GiB, parameters 1 GiB`.
    fn roles_line(&self) -> Option<String> {
        let at = self.roles_at?;
        let parts: Vec<String> = self
            .roles
            .iter()
            .map(|r| {
                let words = Role::from_key(r.role).map_or(r.role, Role::words);
                format!("{words} {}", format_size(r.bytes))
            })
            .collect();
        let at = if at == "oom" { "the OOM" } else { "the peak" };
        Some(format!("memory by role at {at}: {}", parts.join(", ")))
    }

    /// The words above the levers: after the settings fix at an OOM, or
    /// to cut the peak without one (`None` without levers).
    fn levers_heading(&self) -> Option<String> {
        if self.levers.is_empty() {
            return None;
        }
        Some(if self.oom_op.is_some() {
            "then the program levers, each proven by replaying the changed trace".to_string()
        } else {
            "to cut the peak, the program levers, each proven by replaying the changed trace"
                .to_string()
        })
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
        if let Some(line) = self.roles_line() {
            let _ = writeln!(
                out,
                "  {}{line}",
                if self.why.is_empty() {
                    "why:           "
                } else {
                    "               "
                }
            );
        }
        if let Some(f) = &self.fix {
            let _ = writeln!(out, "  what to do:    {f}");
        }
        if let Some(head) = self.levers_heading() {
            let label = if self.fix.is_some() {
                "               "
            } else {
                "what to do:    "
            };
            let _ = writeln!(out, "  {label}{head}:");
            for l in &self.levers {
                let _ = writeln!(out, "                 - {}: {}", l.name, l.replayed);
            }
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
        if !self.why.is_empty() || !self.roles.is_empty() {
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
            if let Some(line) = self.roles_line() {
                let _ = write!(out, "<li class=\"roles\">{}</li>", esc(&line));
            }
            out.push_str("</ul></dd>\n");
        }
        if self.fix.is_some() || !self.levers.is_empty() {
            out.push_str("<dt>What to do</dt><dd>");
            if let Some(f) = &self.fix {
                out.push_str(&esc(f));
            }
            if let Some(head) = self.levers_heading() {
                let _ = write!(out, "<p>{}:</p><ul class=\"levers\">", esc(&head));
                for l in &self.levers {
                    let _ = write!(
                        out,
                        "<li><b>{}</b>{}: {}</li>",
                        esc(l.name),
                        if l.fits { " (fits)" } else { "" },
                        esc(&l.replayed)
                    );
                }
                out.push_str("</ul>");
            }
            out.push_str("</dd>\n");
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
