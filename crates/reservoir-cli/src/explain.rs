//! The explanation of each setting's reserved peak and first OOM in the
//! outputs of `reservoir replay` (see [`reservoir_replay::replay::explain`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context, Result};

use crate::table::shown_name;
use reservoir::format::format_size;
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::explain::{
    add_levers, explain_on_device, Explanation, SiteUsage, Unusable,
};
use reservoir_replay::replay::levers::{Imbalance, Lever};
use reservoir_replay::replay::recorded::overlay_config;
use reservoir_replay::replay::roles::{basis_words, largest, RoleBytes};
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::{ReplayOptions, ReplayReport, ReplaySetting, StartState};

/// General changes tried, in order, to avoid an OOM (added to the
/// setting's own), after those relevant to its causes (see
/// `reservoir_replay::replay::diagnose`).
const FIXES: [&str; 5] = [
    "expandable_segments:True",
    "garbage_collection_threshold:0.8",
    "max_split_size_mb:512",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
];

/// Sites shown per moment in the table output.
const TEXT_SITES: usize = 5;

/// The candidate fixes for `setting`: each change of [`FIXES`] that the
/// setting does not already have, named by the change.
fn candidates(setting: &ReplaySetting) -> Vec<ReplaySetting> {
    FIXES
        .iter()
        .filter(|c| !setting.config.contains(*c))
        .map(|c| ReplaySetting::new(*c, overlay_config(&setting.config, c)))
        .filter(|s| s.allocator_config().is_ok())
        .collect()
}

/// Explain every report of one input, on a device of `device_total` bytes
/// in all when given (`--device-total`: an error if below `capacity`);
/// `imbalance`: the devices of the input's file (or ranks) when it is the
/// heaviest of several and imbalanced (the `imbalance` lever).
#[allow(clippy::too_many_arguments)]
pub fn explain_all(
    trace: &Trace,
    start: Option<&StartState>,
    settings: &[ReplaySetting],
    reports: &[ReplayReport],
    capacity: u64,
    device_total: Option<u64>,
    sites: &Sites,
    imbalance: Option<&Imbalance>,
) -> Result<Vec<Explanation>> {
    if let Some(total) = device_total.filter(|&t| t < capacity) {
        anyhow::bail!(
            "--device-total {} ({total} bytes) is below the {} ({capacity} bytes) the allocator \
             is given (--capacity, or for a recorded OOM device_free + reserved): the device \
             holds at least what its allocator may use",
            format_size(total),
            format_size(capacity)
        );
    }
    let options = ReplayOptions::without_timeline(capacity);
    settings
        .iter()
        .zip(reports)
        .enumerate()
        .map(|(i, (s, r))| {
            let mut e = explain_on_device(
                trace,
                start,
                s,
                &options,
                r,
                sites,
                &candidates(s),
                device_total,
            )
            .with_context(|| format!("explaining the peak and OOM of {}", s.name))?;
            // The program levers of the first setting, the one the
            // summary reads (each costs a few replays).
            if i == 0 {
                add_levers(&mut e, trace, start, s, &options, sites, imbalance)
                    .with_context(|| format!("replaying the program levers of {}", s.name))?;
            }
            Ok(e)
        })
        .collect()
}

/// The program levers as text lines, each with the peak its replay gave.
pub fn levers_text(out: &mut String, levers: &[Lever], heading: &str) {
    if levers.is_empty() {
        return;
    }
    let _ = writeln!(out, "  {heading}:");
    for l in levers {
        let _ = writeln!(
            out,
            "    {:26} {:>12} reserved {:>4}  {}",
            l.name,
            format_size(l.peak_reserved),
            if l.fits { "fits" } else { "no" },
            l.replayed
        );
    }
}

fn sites_text(out: &mut String, sites: &[SiteUsage]) {
    for s in sites.iter().take(TEXT_SITES) {
        let _ = writeln!(
            out,
            "    {:>12}  {:>6} x  {}",
            format_size(s.bytes),
            s.count,
            s.site
        );
    }
}

/// The live bytes by role, one line: each role holding bytes, largest
/// first, with how it was mostly decided.
pub fn roles_text(
    roles: &BTreeMap<&'static str, u64>,
    basis: &BTreeMap<&'static str, RoleBytes>,
) -> String {
    let parts: Vec<String> = largest(roles)
        .into_iter()
        .map(|(r, b)| {
            let how = basis.get(r.key()).map_or("", basis_words);
            format!("{} {} ({how})", r.words(), format_size(b))
        })
        .collect();
    if parts.is_empty() {
        "nothing live".to_string()
    } else {
        parts.join(", ")
    }
}

/// The reason's words.
pub fn reason(r: Unusable) -> &'static str {
    match r {
        Unusable::WrongStream => "wrong stream",
        Unusable::WrongPool => "wrong pool (small/large)",
        Unusable::TooSmall => "too small",
        Unusable::SplitLimit => "split limit (max_split_size)",
    }
}

/// The explanations as text, after the table.
pub fn render_text(ex: &[Explanation]) -> String {
    let mut out = String::new();
    for e in ex {
        if let Some(p) = &e.peak {
            let _ = writeln!(
                out,
                "\n{}: reserved peak {} at op {} ({} allocated); live allocations by site:",
                shown_name(&e.setting),
                format_size(p.reserved),
                p.op,
                format_size(p.allocated)
            );
            sites_text(&mut out, &p.top_sites);
            let _ = writeln!(
                out,
                "  live bytes by role: {}",
                roles_text(&p.roles, &p.role_basis)
            );
            levers_text(
                &mut out,
                &p.levers,
                "program levers to cut the peak (each proven by a replay)",
            );
        }
        if let Some(o) = &e.oom {
            let _ = writeln!(
                out,
                "\n{}: first OOM at op {}: {} (rounded {}) on stream {} from {}; {} reserved, {} allocated after it",
                shown_name(&e.setting),
                o.op,
                format_size(o.bytes),
                format_size(o.rounded),
                o.stream,
                o.site,
                format_size(o.reserved),
                format_size(o.allocated)
            );
            if o.unusable_free.is_empty() {
                out.push_str("  no free block was left\n");
            } else {
                out.push_str("  free blocks that could not serve it:\n");
            }
            for u in &o.unusable_free {
                let _ = writeln!(
                    out,
                    "    {:28} {:>6} blocks {:>12} (largest {})",
                    reason(u.reason),
                    u.blocks,
                    format_size(u.bytes),
                    format_size(u.largest)
                );
            }
            out.push_str("  live allocations by site:\n");
            sites_text(&mut out, &o.top_sites);
            let _ = writeln!(
                out,
                "  live bytes by role: {}",
                roles_text(&o.roles, &o.role_basis)
            );
            crate::diagnose::render_text(&mut out, &o.diagnosis);
            levers_text(
                &mut out,
                &o.levers,
                "program levers, after the settings fix (each proven by a replay)",
            );
        }
    }
    out
}
