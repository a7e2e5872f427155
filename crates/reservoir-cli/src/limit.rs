//! The yardstick of `--min-capacity` (`reservoir replay`) and of `reservoir
//! compare`: the least memory any allocator that cannot move allocations
//! could use for a trace ([`reservoir_replay::placement`]: peak live bytes
//! and the best offline placement), and each setting's *fragmentation
//! tax*: its minimum capacity minus that best placement, in bytes and in
//! percent of the best placement.
//!
//! The minimum capacity is found in 2 MiB steps (the smallest multiple of
//! 2 MiB that fits), so a tax is at most 2 MiB above the true one. A tax
//! below zero means the setting fits on less than the best placement
//! *found*: possible when that placement is a heuristic one (not proven
//! optimal), and because the placement is one contiguous address range
//! while a caching allocator's memory is several driver allocations
//! (segments, or pages mapped under a virtual range with expandable
//! segments) that the driver puts anywhere, and that the allocator releases
//! and creates again (PyTorch frees its cached segments and retries before
//! it reports an OOM): only the peak live bytes bound those. Each is said
//! where it happens.

use std::fmt::Write as _;

use reservoir::format::format_size;
use reservoir_replay::compare::CompareRow;
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::placement::{self, Limit, DEFAULT_WORK_BUDGET};
use reservoir_replay::replay::StartState;

use crate::html::esc;

/// The limit of `trace` (from `start`), with the default exact-search
/// budget.
pub(crate) fn limit_of(trace: &Trace, start: Option<&StartState>) -> Limit {
    placement::limit(trace, start, DEFAULT_WORK_BUDGET)
}

/// A setting's fragmentation tax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Tax {
    /// Minimum capacity minus the best placement (negative when below).
    pub bytes: i64,
    /// `bytes` in percent of the best placement; `None` when it is 0.
    pub pct: Option<f64>,
}

/// The tax of a setting with minimum capacity `min` (`None`: nothing up to
/// 16 TiB fits, no tax).
pub(crate) fn tax(min: Option<u64>, limit: &Limit) -> Option<Tax> {
    let min = min?;
    let bytes = i64::try_from(i128::from(min) - i128::from(limit.best_placement)).ok()?;
    let pct =
        (limit.best_placement > 0).then(|| bytes as f64 * 100.0 / limit.best_placement as f64);
    Some(Tax { bytes, pct })
}

/// A tax as a cell: `+12.00 MiB (3.1%)`, `-2.00 MiB (-0.4%)` or `-`.
pub(crate) fn tax_cell(t: Option<Tax>) -> String {
    let Some(t) = t else {
        return "-".to_string();
    };
    let sign = if t.bytes < 0 { "-" } else { "+" };
    let size = format_size(t.bytes.unsigned_abs());
    match t.pct {
        Some(p) => format!("{sign}{size} ({p:.1}%)"),
        None => format!("{sign}{size}"),
    }
}

/// The best placement in words: `1.20 GiB, exact (proven optimal)` or
/// `1.25 GiB, heuristic (lower bound 1.20 GiB: at most 50.00 MiB above the
/// optimum)`.
pub(crate) fn placement_words(l: &Limit) -> String {
    if l.exact {
        format!("{}, exact (proven optimal)", format_size(l.best_placement))
    } else {
        format!(
            "{}, heuristic (lower bound {}: at most {} above the optimum)",
            format_size(l.best_placement),
            format_size(l.lower_bound),
            format_size(l.gap)
        )
    }
}

/// The limit of one input in a line.
pub(crate) fn limit_line(l: &Limit) -> String {
    format!(
        "the limit: peak live {}; the best placement of its {} allocations by any allocator that \
         cannot move them (each rounded up to {} bytes) {}",
        format_size(l.peak_live),
        l.allocations,
        l.unit,
        placement_words(l)
    )
}

/// What the tax column means, and why a tax is negative where one is.
/// `negative`: the settings whose tax is below zero.
pub(crate) fn tax_notes(l: &Limit, negative: &[&str]) -> String {
    let mut out = String::from(
        "fragmentation tax = minimum capacity - best placement (in % of the best placement); \
         the minimum capacity is found in 2 MiB steps, so a tax is at most 2 MiB above the true one",
    );
    if !negative.is_empty() {
        let _ = write!(
            out,
            "\nbelow zero for {}: it fits on less than the best placement found, {}",
            negative.join(", "),
            if l.exact {
                "which is optimal for one contiguous address range: the setting's memory is \
                 several driver allocations (segments, or pages mapped under a virtual range) that \
                 the driver places anywhere and that it releases and creates again, so only the \
                 peak live bytes bound it"
            } else {
                "which is a heuristic one (the optimum lies between the lower bound and it); and \
                 the setting's memory is several driver allocations (segments, or pages mapped \
                 under a virtual range) that the driver places anywhere, so only the peak live \
                 bytes bound it"
            }
        );
    }
    out
}

/// The settings among `taxes` (by name) whose tax is below zero.
fn negatives(taxes: &[(String, Option<Tax>)]) -> Vec<&str> {
    taxes
        .iter()
        .filter(|(_, t)| t.is_some_and(|t| t.bytes < 0))
        .map(|(n, _)| n.as_str())
        .collect()
}

/// Text for `reservoir replay --min-capacity` after the table: the limit
/// and the notes on the tax row.
pub(crate) fn replay_text(l: &Limit, taxes: &[(String, Option<Tax>)]) -> String {
    format!("{}\n{}\n", limit_line(l), tax_notes(l, &negatives(taxes)))
}

/// Add `limit` (the input's [`Limit`]) and `fragmentation_tax_bytes`,
/// `fragmentation_tax_pct` (`null` when there is none) to each JSON report,
/// in the order of `taxes`.
pub(crate) fn add_json(json: &mut [serde_json::Value], l: &Limit, taxes: &[Option<Tax>]) {
    for (v, t) in json.iter_mut().zip(taxes) {
        if let Some(obj) = v.as_object_mut() {
            obj.insert("limit".into(), serde_json::json!(l));
            obj.insert(
                "fragmentation_tax_bytes".into(),
                serde_json::json!(t.map(|t| t.bytes)),
            );
            obj.insert(
                "fragmentation_tax_pct".into(),
                serde_json::json!(t.and_then(|t| t.pct)),
            );
        }
    }
}

/// The HTML of the limit: a paragraph and a table of each setting's
/// minimum capacity and tax (`mins` and `taxes` by setting, in order).
pub(crate) fn html(l: &Limit, mins: &[(String, Option<u64>)], taxes: &[Option<Tax>]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<h3>The limit and each setting's fragmentation tax</h3>\n<p class=\"fidelity\">{}</p>",
        esc(&limit_line(l))
    );
    out.push_str(
        "<table class=\"numbers\"><tr><th>setting</th><th>minimum capacity (no OOM)</th>\
         <th>fragmentation tax</th></tr>\n",
    );
    for ((name, min), t) in mins.iter().zip(taxes) {
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            min.map_or("> 16 TiB".to_string(), format_size),
            esc(&tax_cell(*t))
        );
    }
    out.push_str("</table>\n");
    let named: Vec<(String, Option<Tax>)> = mins
        .iter()
        .map(|(n, _)| n.clone())
        .zip(taxes.iter().copied())
        .collect();
    let _ = writeln!(
        out,
        "<p class=\"fidelity\">{}</p>",
        esc(&tax_notes(l, &negatives(&named))).replace('\n', "<br>")
    );
    out
}

/// The limits of `reservoir compare`: one per input, in the order of the
/// rows.
pub(crate) struct CompareLimits<'a> {
    pub rows: &'a [CompareRow],
    pub limits: &'a [Limit],
}

/// One policy's taxes over the compared inputs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TaxSummary {
    /// The policy.
    pub policy: String,
    /// Inputs with a tax (a minimum capacity and a non-empty placement).
    pub inputs: usize,
    /// Median tax, % of the best placement.
    pub median_pct: f64,
    /// Largest tax, %.
    pub worst_pct: f64,
    /// The input of the largest tax.
    pub worst_input: String,
    /// Median tax, bytes.
    pub median_bytes: i64,
    /// Largest tax, bytes.
    pub worst_bytes: i64,
}

fn median<T: Copy + PartialOrd>(v: &mut [T]) -> Option<T> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    // The lower median: an element of the list.
    v.get(v.len().saturating_sub(1) / 2).copied()
}

impl CompareLimits<'_> {
    /// The tax of policy `k` of row `r`.
    fn tax(&self, r: usize, k: usize) -> Option<Tax> {
        tax(self.rows[r].policies[k].min_capacity, &self.limits[r])
    }

    /// The tax cells of row `r`, one per policy.
    pub(crate) fn cells(&self, r: usize) -> Vec<String> {
        (0..self.rows[r].policies.len())
            .map(|k| tax_cell(self.tax(r, k)))
            .collect()
    }

    /// The median and worst tax per policy (the policies of the first row).
    pub(crate) fn summary(&self) -> Vec<TaxSummary> {
        let Some(first) = self.rows.first() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for p in &first.policies {
            let mut taxes: Vec<(Tax, &str)> = Vec::new();
            for (r, row) in self.rows.iter().enumerate() {
                if let Some(k) = row.policies.iter().position(|q| q.policy == p.policy) {
                    if let Some(t) = self.tax(r, k).filter(|t| t.pct.is_some()) {
                        taxes.push((t, &row.input));
                    }
                }
            }
            let Some(&(worst, worst_input)) = taxes.iter().max_by(|a, b| {
                a.0.pct
                    .partial_cmp(&b.0.pct)
                    .unwrap_or(std::cmp::Ordering::Equal)
            }) else {
                continue;
            };
            let mut pcts: Vec<f64> = taxes.iter().filter_map(|(t, _)| t.pct).collect();
            let mut bytes: Vec<i64> = taxes.iter().map(|(t, _)| t.bytes).collect();
            out.push(TaxSummary {
                policy: p.policy.clone(),
                inputs: taxes.len(),
                median_pct: median(&mut pcts).unwrap_or(0.0),
                worst_pct: worst.pct.unwrap_or(0.0),
                worst_input: worst_input.to_string(),
                median_bytes: median(&mut bytes).unwrap_or(0),
                worst_bytes: bytes.iter().copied().max().unwrap_or(0),
            });
        }
        out
    }

    /// The text after `reservoir compare`'s tables: each input's limit, then
    /// the median and worst tax per policy.
    pub(crate) fn text(&self) -> String {
        let mut cells: Vec<[String; 5]> = vec![[
            "input".into(),
            "peak live".into(),
            "best placement".into(),
            "exact".into(),
            "gap".into(),
        ]];
        for (row, l) in self.rows.iter().zip(self.limits) {
            cells.push([
                row.input.clone(),
                format_size(l.peak_live),
                format_size(l.best_placement),
                if l.exact { "yes" } else { "no" }.into(),
                if l.exact {
                    "-".into()
                } else {
                    format_size(l.gap)
                },
            ]);
        }
        let mut out = String::from(
            "the limit: peak live and the best placement by any allocator that cannot move \
             allocations (requests rounded up to 512 bytes; exact: proven optimal, else \
             heuristic with its gap to the lower bound)\n",
        );
        crate::table::write_aligned(&mut out, &cells, 1);
        let summary = self.summary();
        let _ = writeln!(
            out,
            "\nfragmentation tax (min capacity - best placement, % of the best placement; min \
             capacity in 2 MiB steps, so at most 2 MiB above the true tax) over {} inputs",
            self.rows.len()
        );
        let _ = writeln!(
            out,
            "{:12} {:>7} {:>9} {:>9} {:>12} {:>12}  worst input",
            "policy", "inputs", "median", "worst", "median", "worst"
        );
        for s in &summary {
            let _ = writeln!(
                out,
                "{:12} {:>7} {:>8.1}% {:>8.1}% {:>12} {:>12}  {}",
                s.policy,
                s.inputs,
                s.median_pct,
                s.worst_pct,
                signed_size(s.median_bytes),
                signed_size(s.worst_bytes),
                s.worst_input
            );
        }
        let below: Vec<String> = self
            .rows
            .iter()
            .enumerate()
            .flat_map(|(r, row)| {
                (0..row.policies.len()).filter_map(move |k| {
                    let t = self.tax(r, k)?;
                    (t.bytes < 0).then(|| {
                        format!(
                            "{} with {} ({}, placement {})",
                            row.input,
                            row.policies[k].policy,
                            tax_cell(Some(t)),
                            if self.limits[r].exact {
                                "exact: the setting's segments are separate driver allocations, \
                                 not one address range"
                            } else {
                                "heuristic: the optimum may be lower; the setting's segments are \
                                 separate driver allocations"
                            }
                        )
                    })
                })
            })
            .collect();
        if !below.is_empty() {
            let _ = writeln!(
                out,
                "below zero (fits on less than the best placement found):\n  {}",
                below.join("\n  ")
            );
        }
        out
    }

    /// The summary as JSON (`fragmentation_tax` of `reservoir compare
    /// --json`).
    pub(crate) fn summary_json(&self) -> serde_json::Value {
        serde_json::Value::Array(self.summary().iter().map(TaxSummary::to_json).collect())
    }

    /// Add `limit` to each row of `rows_json` (the rows, in order) and
    /// `fragmentation_tax_bytes`, `fragmentation_tax_pct` to each policy.
    pub(crate) fn add_json(&self, rows_json: &mut serde_json::Value) {
        if let Some(rows) = rows_json.as_array_mut() {
            for (r, v) in rows.iter_mut().enumerate() {
                let Some(l) = self.limits.get(r) else {
                    continue;
                };
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("limit".into(), serde_json::json!(l));
                    if let Some(ps) = obj.get_mut("policies").and_then(|p| p.as_array_mut()) {
                        for (k, p) in ps.iter_mut().enumerate() {
                            let t = self.tax(r, k);
                            if let Some(p) = p.as_object_mut() {
                                p.insert(
                                    "fragmentation_tax_bytes".into(),
                                    serde_json::json!(t.map(|t| t.bytes)),
                                );
                                p.insert(
                                    "fragmentation_tax_pct".into(),
                                    serde_json::json!(t.and_then(|t| t.pct)),
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

impl TaxSummary {
    /// As JSON: the fields by name.
    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "policy": self.policy,
            "inputs": self.inputs,
            "median_pct": self.median_pct,
            "worst_pct": self.worst_pct,
            "worst_input": self.worst_input,
            "median_bytes": self.median_bytes,
            "worst_bytes": self.worst_bytes,
        })
    }
}

/// A signed size: `+2.00 MiB`, `-512 bytes`.
fn signed_size(bytes: i64) -> String {
    format!(
        "{}{}",
        if bytes < 0 { "-" } else { "+" },
        format_size(bytes.unsigned_abs())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(best: u64, exact: bool) -> Limit {
        Limit {
            peak_live: best - 100,
            best_placement: best,
            exact,
            lower_bound: if exact { best } else { best - 1024 },
            gap: if exact { 0 } else { 1024 },
            unit: 512,
            allocations: 3,
        }
    }

    #[test]
    fn tax_is_min_capacity_minus_best_placement() {
        let l = limit(100 << 20, true);
        let t = tax(Some(104 << 20), &l).unwrap();
        assert_eq!(t.bytes, 4 << 20);
        assert!((t.pct.unwrap() - 4.0).abs() < 1e-9);
        assert_eq!(tax_cell(Some(t)), "+4.00 MiB (4.0%)");
        let below = tax(Some(98 << 20), &l).unwrap();
        assert_eq!(tax_cell(Some(below)), "-2.00 MiB (-2.0%)");
        assert_eq!(tax(None, &l), None);
        assert_eq!(tax_cell(None), "-");
        // An empty trace: no percentage.
        let empty = Limit {
            peak_live: 0,
            best_placement: 0,
            exact: true,
            lower_bound: 0,
            gap: 0,
            unit: 512,
            allocations: 0,
        };
        assert_eq!(tax(Some(2 << 20), &empty).unwrap().pct, None);
    }

    #[test]
    fn a_negative_tax_is_explained() {
        let notes = tax_notes(&limit(100 << 20, false), &["expandable"]);
        assert!(notes.contains("2 MiB steps"), "{notes}");
        assert!(notes.contains("below zero for expandable"), "{notes}");
        assert!(notes.contains("heuristic"), "{notes}");
        let exact = tax_notes(&limit(100 << 20, true), &["expandable"]);
        assert!(exact.contains("several driver allocations"), "{exact}");
        assert!(
            exact.contains("optimal for one contiguous address range"),
            "{exact}"
        );
        assert!(!tax_notes(&limit(100 << 20, true), &[]).contains("below zero"));
        assert!(placement_words(&limit(1 << 30, false)).contains("at most 1024 bytes above"));
    }
}
