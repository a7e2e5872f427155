//! The human-readable comparison table of `reservoir replay`.

use std::fmt::Write as _;

use reservoir::format::format_size;
use reservoir_replay::replay::ReplayReport;

/// Appends `cells` to `out` as aligned text columns, two spaces apart: the
/// first `left` columns left-aligned, the rest right-aligned; each line
/// without trailing spaces. Widths are counted in characters and may be any
/// size: the padding is written by hand, since `format!`'s `{:w$}` panics
/// for a width of 65,536 or more (a `--workload` argument or a merged
/// input's name can be that long).
pub fn write_aligned<R: AsRef<[String]>>(out: &mut String, cells: &[R], left: usize) {
    let columns = cells.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            cells
                .iter()
                .filter_map(|r| r.as_ref().get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in cells {
        let mut line = String::new();
        for (c, (cell, &w)) in row.as_ref().iter().zip(&widths).enumerate() {
            let pad = w.saturating_sub(cell.chars().count());
            if c < left {
                line.push_str(cell);
                push_spaces(&mut line, pad);
            } else {
                push_spaces(&mut line, pad);
                line.push_str(cell);
            }
            line.push_str("  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// Appends `n` spaces to `out`.
fn push_spaces(out: &mut String, n: usize) {
    out.extend(std::iter::repeat(' ').take(n));
}

/// A duration in nanoseconds, with a unit that keeps 3-4 significant digits.
pub fn format_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// The most characters of a setting's name the tables show: a longer name
/// (a `--config` string is named after itself) is cut there with an
/// ellipsis. The JSON output and the `settings:` list keep every setting's
/// full configuration. See docs/limits.md.
pub const MAX_SHOWN_NAME: usize = 100;

/// `name` as the tables show it: at most [`MAX_SHOWN_NAME`] characters, the
/// last of them `…` when it was cut.
pub fn shown_name(name: &str) -> std::borrow::Cow<'_, str> {
    match name.char_indices().nth(MAX_SHOWN_NAME - 1) {
        Some((cut, _)) if name[cut..].chars().nth(1).is_some() => {
            format!("{}…", &name[..cut]).into()
        }
        _ => name.into(),
    }
}

/// The rows of the table: a label and one cell per report.
fn rows(reports: &[ReplayReport]) -> Vec<(&'static str, Vec<String>)> {
    let col = |f: &dyn Fn(&ReplayReport) -> String| reports.iter().map(f).collect::<Vec<_>>();
    vec![
        ("peak live (requested)", col(&|r| format_size(r.peak_live))),
        ("peak allocated", col(&|r| format_size(r.peak_allocated))),
        ("peak reserved", col(&|r| format_size(r.peak_reserved))),
        (
            "peak reserved / peak live",
            col(&|r| match r.peak_live {
                0 => "-".to_string(),
                live => format!("{:.3}x", r.peak_reserved as f64 / live as f64),
            }),
        ),
        (
            "fragmentation (reserved/allocated)",
            col(&|r| match r.fragmentation {
                Some(f) => format!("{f:.3}x"),
                None => "-".to_string(),
            }),
        ),
        (
            "reserved-unallocated at reserved peak",
            col(&|r| format_size(r.reserved_unallocated_at_peak)),
        ),
        (
            "largest free block at reserved peak",
            col(&|r| format_size(r.largest_free_block_at_peak)),
        ),
        ("driver allocs", col(&|r| r.driver_allocs.to_string())),
        ("driver frees", col(&|r| r.driver_frees.to_string())),
        ("OOMs", col(&|r| r.ooms.to_string())),
        (
            "simulated driver time",
            col(&|r| format_ns(r.driver_time_ns as f64)),
        ),
        (
            "allocator time per call (mean)",
            col(&|r| format_ns(r.allocator_ns_per_op)),
        ),
        (
            "allocator time per call (median)",
            col(&|r| format_ns(r.allocator_ns_p50)),
        ),
    ]
}

/// The table: one column per setting, then the settings strings and the
/// first out-of-memory message of each setting that had one.
pub fn render(reports: &[ReplayReport]) -> String {
    render_with(reports, Vec::new())
}

/// [`render`] with `extra` rows (a label and one cell per report) after
/// the standard ones.
pub fn render_with(reports: &[ReplayReport], extra: Vec<(&'static str, Vec<String>)>) -> String {
    let mut rows = rows(reports);
    rows.extend(extra);
    let names: Vec<_> = reports.iter().map(|r| shown_name(&r.setting)).collect();
    let label_w = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let widths: Vec<usize> = reports
        .iter()
        .enumerate()
        .map(|(i, _)| {
            rows.iter()
                .map(|(_, cells)| cells[i].len())
                .chain(std::iter::once(names[i].len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(out, "{:label_w$}", "");
    for (name, w) in names.iter().zip(&widths) {
        let _ = write!(out, "  {name:>w$}");
    }
    out.push('\n');
    for (label, cells) in &rows {
        let _ = write!(out, "{label:label_w$}");
        for (c, w) in cells.iter().zip(&widths) {
            let _ = write!(out, "  {c:>w$}");
        }
        out.push('\n');
    }
    out.push('\n');
    let name_w = names.iter().map(|n| n.len()).max().unwrap_or(0);
    out.push_str("settings:\n");
    for (r, name) in reports.iter().zip(&names) {
        let _ = writeln!(out, "  {name:name_w$}  {}", r.describe_setting());
    }
    for (r, name) in reports.iter().zip(&names) {
        if let Some(o) = &r.first_oom {
            let _ = writeln!(
                out,
                "\nfirst OOM with {} (op {}, line {}; {} OOMs in all):\n  {}",
                name, o.op, o.line, r.ooms, o.message
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_columns_of_any_width() {
        // `{:w$}` panics from a width of 65,536 on.
        for n in [3, 65_535, 65_536, 200_000] {
            let long = "é".repeat(n);
            let cells = vec![
                vec![long.clone(), "1".to_string()],
                vec!["ab".to_string(), "22".to_string()],
            ];
            let mut out = String::new();
            write_aligned(&mut out, &cells, 1);
            let lines: Vec<&str> = out.lines().collect();
            assert_eq!(lines.len(), 2);
            assert_eq!(lines[0], format!("{long}   1"));
            assert_eq!(lines[1], format!("ab{}  22", " ".repeat(n - 2)));
        }
    }

    #[test]
    fn durations() {
        assert_eq!(format_ns(12.4), "12 ns");
        assert_eq!(format_ns(1_500.0), "1.50 us");
        assert_eq!(format_ns(2_345_678.0), "2.35 ms");
        assert_eq!(format_ns(3.2e9), "3.20 s");
    }

    #[test]
    fn long_names_are_cut_with_an_ellipsis() {
        let exact = "n".repeat(MAX_SHOWN_NAME);
        assert_eq!(shown_name(&exact), exact);
        let long = "é".repeat(MAX_SHOWN_NAME + 1);
        let shown = shown_name(&long);
        assert_eq!(shown.chars().count(), MAX_SHOWN_NAME);
        assert!(shown.ends_with("é…"), "{shown}");
        assert_eq!(shown_name("pytorch"), "pytorch");
    }
}
