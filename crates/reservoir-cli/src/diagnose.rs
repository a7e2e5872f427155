//! The diagnosis of an OOM in the outputs of `reservoir replay` (issue 30
//! item 1; see [`reservoir_replay::replay::diagnose`]): the shortfall, the
//! causes with their bytes and rule, and the cheapest change that avoids
//! it, proven by replay.

use std::fmt::Write as _;

use reservoir::format::format_size;
use reservoir_replay::replay::diagnose::{Cause, CauseClass, Diagnosis, Rule};

/// The cause's class and rule in words, e.g. `fragmentation (split limit)`.
pub fn cause_name(c: &Cause) -> String {
    let class = match c.class {
        CauseClass::Capacity => "capacity",
        CauseClass::Fragmentation => "fragmentation",
        CauseClass::StreamStranding => "stream stranding",
        CauseClass::PoolRetention => "pool retention",
        CauseClass::MemoryFraction => "memory fraction",
        CauseClass::OutsideAllocator => "outside the allocator",
    };
    match c.rule {
        None => class.to_string(),
        Some(r) => format!(
            "{class} ({})",
            match r {
                Rule::Rounding => "rounding",
                Rule::SplitLimit => "split limit",
                Rule::Oversize => "oversize",
                Rule::PoolSplit => "pool split",
                Rule::ExpandableGranularity => "expandable granularity",
                Rule::Scattered => "scattered",
            }
        ),
    }
}

/// The diagnosis as text lines, indented under the OOM's explanation.
pub fn render_text(out: &mut String, d: &Diagnosis) {
    let _ = writeln!(
        out,
        "  diagnosis: {} short (the allocator may use {}; live tensors asked for {})",
        format_size(d.shortfall),
        format_size(d.limit),
        format_size(d.live_requested)
    );
    for c in &d.causes {
        let _ = writeln!(
            out,
            "    {:34} {:>12}  {}",
            cause_name(c),
            format_size(c.bytes),
            c.sentence
        );
    }
    let _ = writeln!(out, "  fix: {}", d.verdict);
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The diagnosis as HTML: a table of the causes and the fix.
pub fn render_html(out: &mut String, d: &Diagnosis) {
    let _ = writeln!(
        out,
        "<p class=\"oom\">Diagnosis: <b>{} short</b> (the allocator may use {}; live tensors asked for {}).</p>",
        format_size(d.shortfall),
        format_size(d.limit),
        format_size(d.live_requested)
    );
    out.push_str("<table class=\"numbers\"><tr><th>cause</th><th>bytes</th><th>why</th></tr>\n");
    for c in &d.causes {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&cause_name(c)),
            format_size(c.bytes),
            esc(&c.sentence)
        );
    }
    out.push_str("</table>\n");
    let _ = writeln!(out, "<p class=\"fidelity\">Fix: {}</p>", esc(&d.verdict));
}
