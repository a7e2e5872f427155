//! `reservoir diff A B`: two snapshots of the same program compared (see
//! [`reservoir_replay::diff`]): a table on standard output, `--json OUT`
//! (the keys of [`Diff`], stable) and `--html OUT` (a self-contained page
//! with a bar chart of the site changes).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::html::esc;
use crate::{convert_file_as, parse_torch_release, policy_setting, quoted, size, Converted};
use reservoir::format::format_size;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir::TorchRelease;
use reservoir_replay::diff::{self, Delta, Diff, Measured, Side, DEFAULT_TOP};
use reservoir_replay::replay::{AllocatorKind, ReplayOptions, ReplaySetting};

#[derive(Debug, Args)]
pub(crate) struct DiffArgs {
    /// The first snapshot ("before", or one rank): any recorded trace
    /// `reservoir replay` reads.
    #[arg(value_name = "A")]
    a: PathBuf,

    /// The second snapshot ("after", or another rank).
    #[arg(value_name = "B")]
    b: PathBuf,

    /// Also write the diff as JSON to OUT (`-`: standard output, instead of
    /// the table). Keys: `a`, `b` (each side: `file`, `device`, `setting`,
    /// `config`, `capacity`, `source`, `source_note`, `exact`,
    /// `recorded_by`, `peak_allocated`, `peak_allocated_op`,
    /// `peak_reserved`, `peak_reserved_op`, `fragmentation_bytes`,
    /// `fragmentation_percent`, `fragmentation_op`, `ooms`, `first_oom`,
    /// `sites_live_at_peak`), `peak_allocated`, `peak_reserved`,
    /// `fragmentation` (at the allocated peak), `ooms` (each `a`, `b`,
    /// `delta`, `percent`), `sites` (`site`, `change`, `a_bytes`, `b_bytes`,
    /// `delta`, `a_count`, `b_count`, `a_site`: A's name of a site that
    /// moved to another line), `sites_total`, `changes` (`grew`, `shrank`,
    /// `new`, `gone`, `same`, `moved`), `top`.
    #[arg(long, value_name = "OUT")]
    json: Option<PathBuf>,

    /// Also write a self-contained HTML page (the numbers, a bar chart of
    /// the site changes) to OUT.
    #[arg(long, value_name = "OUT")]
    html: Option<PathBuf>,

    /// Replay both with this named policy instead of their recorded
    /// settings (as `reservoir replay --policy`): a what-if, not the
    /// recordings.
    #[arg(long, short = 'p', value_name = "NAME", conflicts_with = "setting")]
    policy: Option<String>,

    /// Replay both with this setting, NAME=PYTORCH_CUDA_ALLOC_CONF, instead
    /// of their recorded settings: a what-if, not the recordings.
    #[arg(long, short = 's', value_name = "NAME=CONF")]
    setting: Option<String>,

    /// Sites listed, by largest change.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_TOP)]
    top: usize,

    /// The device of each file: `N` for both, `A:B` for device A of the
    /// first file and device B of the second (two ranks recorded as devices
    /// of one machine). Default: the first device with trace entries.
    #[arg(long, value_name = "N|A:B", value_parser = parse_devices)]
    device: Option<(u32, u32)>,

    /// Simulated device capacity (as `reservoir replay --capacity`).
    /// Default: each file's inferred capacity (its OOMs reproduced), else
    /// 80GiB.
    #[arg(long, value_name = "SIZE", value_parser = size::parse_capacity)]
    capacity: Option<u64>,

    /// The PyTorch release of PyTorch mode (default: the one each file
    /// shows, else the newest).
    #[arg(long, value_name = "RELEASE", value_parser = parse_torch_release)]
    torch: Option<TorchRelease>,
}

/// `--device N` (both files) or `--device A:B` (device A of the first file,
/// B of the second): each a device index of at most 255.
fn parse_devices(s: &str) -> Result<(u32, u32), String> {
    let one = |v: &str| -> Result<u32, String> {
        match v.trim().parse::<u32>() {
            Ok(n) if n <= 255 => Ok(n),
            _ => Err(format!(
                "{v:?} is not a device index (0 to 255): expected N, or A:B for device A of the \
                 first file and B of the second"
            )),
        }
    };
    match s.split_once(':') {
        Some((a, b)) => Ok((one(a)?, one(b)?)),
        None => one(s).map(|n| (n, n)),
    }
}

/// One file loaded and measured: device `device` of it, else the first
/// with trace entries.
fn measure(
    path: &Path,
    device: Option<u32>,
    args: &DiffArgs,
) -> Result<(Measured, Option<String>)> {
    let (_, devices, _, _) = convert_file_as(path, device, args.torch)?;
    let more = devices.len() > 1;
    let Some(Converted {
        rec,
        recorder,
        device,
        config: recorded,
        ..
    }) = devices.into_iter().next()
    else {
        bail!("{}: no device trace", path.display());
    };
    if more {
        eprintln!(
            "note: {} has traces of several devices; comparing device {device} (--device N, or \
             A:B for each file, picks one)",
            path.display()
        );
    }
    let setting = match (&args.policy, &args.setting) {
        (Some(p), _) => policy_setting(p, &recorded)?,
        (None, Some(s)) => {
            if !s.contains('=') {
                bail!("--setting {}: expected NAME=CONF", quoted(s));
            }
            ReplaySetting::parse(s).with_context(|| format!("--setting {}", quoted(s)))?
        }
        (None, None) => ReplaySetting::new("pytorch", recorded.clone()),
    };
    let pytorch_mode = setting.config == recorded && setting.allocator == AllocatorKind::Caching;
    let options =
        ReplayOptions::without_timeline(args.capacity.or(rec.capacity).unwrap_or(DEFAULT_CAPACITY));
    let file = path.display().to_string();
    let mut m = diff::measure(&file, &rec, &setting, &options, pytorch_mode)
        .with_context(|| format!("replaying {file} with {}", setting.name))?;
    m.side.recorded_by = recorder.recorder.key().to_string();
    Ok((m, recorder.note()))
}

/// `reservoir diff A B`.
pub(crate) fn cmd_diff(args: DiffArgs) -> Result<()> {
    if args.capacity == Some(0) {
        bail!("--capacity must be more than 0 bytes");
    }
    let (a, note_a) = measure(&args.a, args.device.map(|d| d.0), &args)?;
    let (b, note_b) = measure(&args.b, args.device.map(|d| d.1), &args)?;
    let d = diff::compare(a, b, args.top);
    // Who recorded each file, when not PyTorch's CUDA allocator.
    let notes: Vec<String> = if note_a.is_some() && note_a == note_b {
        note_a
            .map(|n| format!("A and B: {n}"))
            .into_iter()
            .collect()
    } else {
        [("A", note_a), ("B", note_b)]
            .into_iter()
            .filter_map(|(k, n)| n.map(|n| format!("{k}: {n}")))
            .collect()
    };
    if let Some(path) = &args.html {
        crate::output::write_html(path, render_html(&d, &notes))?;
    }
    let json = serde_json::to_string_pretty(&d).context("serializing the diff")? + "\n";
    let text = match args.json.as_deref() {
        Some(p) if p == Path::new("-") => json,
        Some(p) => {
            reservoir::outfile::write_file(p, |w| std::io::Write::write_all(w, json.as_bytes()))
                .with_context(|| format!("cannot write {}", p.display()))?;
            render_text(&d, &notes)
        }
        None => render_text(&d, &notes),
    };
    crate::output::with_stdout(|out| Ok(out.write_all(text.as_bytes())?))
}

/// `+1.50 MiB`, `-512 B`, `0 B`.
fn signed_size(delta: i64) -> String {
    let s = format_size(delta.unsigned_abs());
    match delta.signum() {
        1 => format!("+{s}"),
        -1 => format!("-{s}"),
        _ => s,
    }
}

fn percent(d: &Delta) -> String {
    match d.percent {
        Some(p) => format!("{p:+.1}%"),
        None if d.b == 0 => "-".to_string(),
        None => "new".to_string(),
    }
}

fn first_oom(s: &Side) -> String {
    match &s.first_oom {
        Some(o) => format!("{} at {} (op {})", format_size(o.bytes), o.site, o.op),
        None => "-".to_string(),
    }
}

fn side_label(s: &Side) -> String {
    format!("{} (device {})", s.file, s.device)
}

/// The table of standard output.
fn render_text(d: &Diff, notes: &[String]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "A = {}\nB = {}", side_label(&d.a), side_label(&d.b));
    let _ = writeln!(out, "A measured from {}", d.a.source_note);
    let _ = writeln!(out, "B measured from {}", d.b.source_note);
    for n in notes {
        let _ = writeln!(out, "{n}");
    }
    out.push('\n');
    let frag = |s: &Side| {
        format!(
            "{} ({:.1}%)",
            format_size(s.fragmentation_bytes),
            s.fragmentation_percent
        )
    };
    let rows: Vec<[String; 5]> = vec![
        [
            "".into(),
            "A".into(),
            "B".into(),
            "B - A".into(),
            "%".into(),
        ],
        [
            "peak allocated (live)".into(),
            format_size(d.a.peak_allocated),
            format_size(d.b.peak_allocated),
            signed_size(d.peak_allocated.delta),
            percent(&d.peak_allocated),
        ],
        [
            "peak reserved".into(),
            format_size(d.a.peak_reserved),
            format_size(d.b.peak_reserved),
            signed_size(d.peak_reserved.delta),
            percent(&d.peak_reserved),
        ],
        [
            "fragmentation at allocated peak".into(),
            frag(&d.a),
            frag(&d.b),
            signed_size(d.fragmentation.delta),
            percent(&d.fragmentation),
        ],
        [
            "OOMs".into(),
            d.a.ooms.to_string(),
            d.b.ooms.to_string(),
            format!("{:+}", d.ooms.delta),
            percent(&d.ooms),
        ],
    ];
    let w: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let _ = writeln!(
            out,
            "{:w0$}  {:>w1$}  {:>w2$}  {:>w3$}  {:>w4$}",
            r[0],
            r[1],
            r[2],
            r[3],
            r[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4]
        );
    }
    if d.a.first_oom.is_some() || d.b.first_oom.is_some() {
        let _ = writeln!(out, "first OOM of A: {}", first_oom(&d.a));
        let _ = writeln!(out, "first OOM of B: {}", first_oom(&d.b));
    }
    let c = &d.changes;
    let _ = writeln!(
        out,
        "\nlive bytes by site at each one's allocated peak: {} site{} ({} grew, {} shrank, {} new, \
         {} gone, {} same{}){}",
        d.sites_total,
        if d.sites_total == 1 { "" } else { "s" },
        c.grew,
        c.shrank,
        c.new,
        c.gone,
        c.same,
        moved_words(c.moved),
        if d.sites.len() < d.sites_total as usize {
            format!("; the {} largest changes:", d.sites.len())
        } else {
            ":".to_string()
        }
    );
    for s in &d.sites {
        let _ = writeln!(
            out,
            "  {:<6} {:>12} {:>12} {:>13}  {:>6} -> {:<6} {}",
            s.change.as_str(),
            format_size(s.a_bytes),
            format_size(s.b_bytes),
            signed_size(s.delta),
            s.a_count,
            s.b_count,
            site_words(s)
        );
    }
    out
}

/// ", N moved" when sites were matched across a move.
fn moved_words(moved: u64) -> String {
    if moved == 0 {
        String::new()
    } else {
        format!("; {moved} of them moved to another line")
    }
}

/// A listed site, with A's name when it moved.
fn site_words(s: &reservoir_replay::diff::SiteDelta) -> String {
    match &s.a_site {
        Some(a) => format!("{} (moved from {a})", s.site),
        None => s.site.clone(),
    }
}

/// A path's file name (pages carry no directory of the machine they were
/// made on).
fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map_or_else(|| path.to_string(), |n| n.to_string_lossy().into_owned())
}

/// The self-contained page: the numbers, a bar chart of the listed sites'
/// changes (`<rect class="bar grew">` ... one per site, `data-site` its
/// name), and the site table.
fn render_html(d: &Diff, notes: &[String]) -> String {
    let (a, b) = (file_name(&d.a.file), file_name(&d.b.file));
    let mut out = format!(
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Reservoir diff: {a} vs {b}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 20px; color: #222; }}
h1 {{ font-size: 22px; }} h2 {{ font-size: 18px; border-top: 1px solid #ccc; padding-top: 10px; }}
table.numbers {{ border-collapse: collapse; font-size: 13px; }}
table.numbers td, table.numbers th {{ border: 1px solid #ccc; padding: 3px 8px; text-align: right; }}
table.numbers td:first-child, table.numbers td.site {{ text-align: left; }}
p.source {{ font-size: 13px; }}
</style></head><body>
<h1>Reservoir diff</h1>
"#,
        a = esc(&a),
        b = esc(&b)
    );
    for (k, s, name) in [("A", &d.a, &a), ("B", &d.b, &b)] {
        let _ = writeln!(
            out,
            r#"<p class="source"><b>{k}</b> = {} (device {}), measured from {}.</p>"#,
            esc(name),
            s.device,
            esc(&s.source_note)
        );
    }
    for n in notes {
        let _ = writeln!(out, r#"<p class="source">{}</p>"#, esc(n));
    }
    out.push_str(
        "<table class=\"numbers\"><tr><th></th><th>A</th><th>B</th><th>B - A</th><th>%</th></tr>\n",
    );
    let frag = |s: &Side| {
        format!(
            "{} ({:.1}%)",
            format_size(s.fragmentation_bytes),
            s.fragmentation_percent
        )
    };
    let rows = [
        (
            "peak allocated (live)",
            format_size(d.a.peak_allocated),
            format_size(d.b.peak_allocated),
            &d.peak_allocated,
        ),
        (
            "peak reserved",
            format_size(d.a.peak_reserved),
            format_size(d.b.peak_reserved),
            &d.peak_reserved,
        ),
        (
            "fragmentation at allocated peak",
            frag(&d.a),
            frag(&d.b),
            &d.fragmentation,
        ),
    ];
    for (label, x, y, delta) in rows {
        let _ = writeln!(
            out,
            "<tr><td>{label}</td><td>{x}</td><td>{y}</td><td>{}</td><td>{}</td></tr>",
            signed_size(delta.delta),
            percent(delta)
        );
    }
    let _ = writeln!(
        out,
        "<tr><td>OOMs</td><td>{}</td><td>{}</td><td>{:+}</td><td>{}</td></tr>",
        d.a.ooms,
        d.b.ooms,
        d.ooms.delta,
        percent(&d.ooms)
    );
    let _ = writeln!(
        out,
        "<tr><td>first OOM</td><td>{}</td><td>{}</td><td></td><td></td></tr></table>",
        esc(&first_oom(&d.a)),
        esc(&first_oom(&d.b))
    );
    let c = &d.changes;
    let _ = writeln!(
        out,
        "<h2>Live bytes by site at each one's allocated peak</h2>\n<p class=\"source\">{} site{}: \
         {} grew, {} shrank, {} new, {} gone, {} same; the {} largest changes below.</p>",
        d.sites_total,
        if d.sites_total == 1 { "" } else { "s" },
        c.grew,
        c.shrank,
        c.new,
        c.gone,
        c.same,
        d.sites.len()
    );
    bar_chart(&mut out, d);
    out.push_str("<table class=\"numbers\"><tr><th>change</th><th>A</th><th>B</th><th>B - A</th><th>allocations A</th><th>allocations B</th><th>site</th></tr>\n");
    for s in &d.sites {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"site\">{}</td></tr>",
            s.change.as_str(),
            format_size(s.a_bytes),
            format_size(s.b_bytes),
            signed_size(s.delta),
            s.a_count,
            s.b_count,
            esc(&site_words(s))
        );
    }
    out.push_str("</table>\n</body></html>\n");
    out
}

/// One horizontal bar per listed site, from a zero line: growth to the
/// right (red), shrinkage to the left (green).
fn bar_chart(out: &mut String, d: &Diff) {
    const W: f64 = 1200.0;
    const LABEL: f64 = 420.0;
    const ROW: f64 = 18.0;
    let max = d
        .sites
        .iter()
        .map(|s| s.delta.unsigned_abs())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let height = ROW * d.sites.len() as f64 + 10.0;
    let half = (W - LABEL - 20.0) / 2.0;
    let zero = LABEL + 10.0 + half;
    let _ = writeln!(
        out,
        r#"<svg class="site-deltas" width="{W}" height="{height}" viewBox="0 0 {W} {height}" xmlns="http://www.w3.org/2000/svg">"#
    );
    for (i, s) in d.sites.iter().enumerate() {
        let y = 5.0 + i as f64 * ROW;
        let w = s.delta.unsigned_abs() as f64 / max * half;
        let x = if s.delta < 0 { zero - w } else { zero };
        let color = if s.delta < 0 { "#2ca02c" } else { "#d62728" };
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="end">{}</text><rect class="bar {}" data-site="{}" x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{color}"><title>{}</title></rect>"#,
            LABEL,
            y + ROW * 0.7,
            esc(&s.site),
            s.change.as_str(),
            esc(&s.site),
            y + 2.0,
            w.max(0.5),
            ROW - 4.0,
            esc(&signed_size(s.delta))
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{zero:.1}" x2="{zero:.1}" y1="0" y2="{height}" stroke="#444"/></svg>"##
    );
}
