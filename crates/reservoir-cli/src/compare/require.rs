//! What `reservoir compare --require POLICY` and `--require-steady POLICY`
//! check on the compared rows: a policy within each input's bound, never
//! out of memory where another policy is not, never reserving more than
//! another policy, and (steady) no more steady-state driver time than
//! `pytorch`, with a file of known exceptions (`--steady-exceptions`).

use std::path::Path;

use anyhow::Result;

use reservoir::format::format_size;
use reservoir_replay::compare::CompareRow;

use super::CompareArgs;
use crate::table::format_ns;

/// The input names of a `--steady-exceptions` file: one per line; blank
/// lines, lines starting with `#` and what follows ` #` are skipped (input
/// names hold `#`: `file.pickle#0`).
pub(super) fn read_exceptions(path: &Path) -> Result<Vec<String>> {
    let text = crate::read_text_file("--steady-exceptions", path)?;
    Ok(text
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect())
}

/// The outcome of --require-steady with a list of known exceptions: the
/// violations not listed, the listed inputs that now meet the requirement,
/// the listed inputs that were not compared, and the listed violations.
#[derive(Default)]
struct SteadyCheck {
    new: Vec<String>,
    now_within: Vec<String>,
    unknown: Vec<String>,
    known: Vec<String>,
}

fn check_steady(rows: &[CompareRow], policy: &str, exceptions: &[String]) -> SteadyCheck {
    let bad = steady_violations(rows, policy);
    let mut c = SteadyCheck::default();
    for (input, why) in bad.iter() {
        if exceptions.contains(input) {
            c.known.push(why.clone());
        } else {
            c.new.push(why.clone());
        }
    }
    for e in exceptions {
        if !rows.iter().any(|r| &r.input == e) {
            c.unknown.push(e.clone());
        } else if !bad.iter().any(|(input, _)| input == e) {
            c.now_within.push(e.clone());
        }
    }
    c
}

/// The inputs on which `policy`'s steady-state driver time exceeds
/// `pytorch`'s: the input's name, and a line with both times.
fn steady_violations(rows: &[CompareRow], policy: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in rows {
        let find = |name: &str| r.policies.iter().find(|p| p.policy == name);
        let (Some(p), Some(py)) = (find(policy), find("pytorch")) else {
            continue;
        };
        if p.steady_driver_time_ns > py.steady_driver_time_ns {
            out.push((
                r.input.clone(),
                format!(
                "{}: {} spends {} of simulated driver time in steady state (from op {} of {}: {}), \
                 more than pytorch ({}: {})",
                r.input,
                policy,
                format_ns(p.steady_driver_time_ns as f64),
                r.steady_start,
                r.ops,
                p.steady_calls,
                format_ns(py.steady_driver_time_ns as f64),
                py.steady_calls
            ),
            ));
        }
    }
    out
}

/// The inputs on which `policy` exceeds the bound or reserves more than
/// another policy, with the reason.
fn violations(rows: &[CompareRow], policy: &str) -> Vec<String> {
    let mut out = Vec::new();
    for r in rows {
        let Some(p) = r.policies.iter().find(|p| p.policy == policy) else {
            continue;
        };
        if !p.within_bound {
            out.push(format!(
                "{}: {} reserves {} at its peak, over the bound {} (peak live {})",
                r.input,
                policy,
                format_size(p.peak_reserved),
                format_size(r.bound),
                format_size(p.peak_live)
            ));
        }
        if p.ooms > 0 {
            if let Some(o) = r
                .policies
                .iter()
                .find(|o| o.policy != policy && o.ooms == 0)
            {
                out.push(format!(
                    "{}: {} runs out of memory {} time(s) on {}, where {} does not",
                    r.input,
                    policy,
                    p.ooms,
                    format_size(r.capacity),
                    o.policy
                ));
            }
        }
        // A policy that ran out of memory skipped allocations: its peak is
        // not the whole program's.
        for o in r
            .policies
            .iter()
            .filter(|o| o.policy != policy && o.ooms == 0)
        {
            if p.peak_reserved > o.peak_reserved {
                out.push(format!(
                    "{}: {} reserves {} at its peak, more than {} ({})",
                    r.input,
                    policy,
                    format_size(p.peak_reserved),
                    o.policy,
                    format_size(o.peak_reserved)
                ));
            }
        }
    }
    out
}

/// The `--require` and `--require-steady` bounds `rows` miss, one message
/// each (known `--require-steady` exceptions are only warned about).
pub(super) fn requirement_failures(
    args: &CompareArgs,
    rows: &[CompareRow],
    exceptions: &[String],
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(req) = &args.require {
        let bad = violations(rows, req);
        if !bad.is_empty() {
            failures.push(format!(
                "--require {req}: {} violations on {} inputs:\n  {}",
                bad.len(),
                rows.len(),
                bad.join("\n  ")
            ));
        }
    }
    if let Some(req) = &args.require_steady {
        let c = check_steady(rows, req, exceptions);
        let file = args
            .steady_exceptions
            .as_deref()
            .map_or(String::new(), |f| f.display().to_string());
        if !c.known.is_empty() {
            eprintln!(
                "--require-steady {req}: {} of {} inputs miss it, as {file} lists:\n  {}",
                c.known.len(),
                rows.len(),
                c.known.join("\n  ")
            );
        }
        if !c.new.is_empty() {
            failures.push(format!(
                "--require-steady {req}: more steady-state driver time than pytorch on {} of {} inputs{}:\n  {}",
                c.new.len(),
                rows.len(),
                if file.is_empty() { String::new() } else { format!(" not listed in {file}") },
                c.new.join("\n  ")
            ));
        }
        if !c.now_within.is_empty() {
            failures.push(format!(
                "--require-steady {req}: {file} lists inputs that now meet it (remove them from the file):\n  {}",
                c.now_within.join("\n  ")
            ));
        }
        if !c.unknown.is_empty() {
            failures.push(format!(
                "--require-steady {req}: {file} lists inputs that were not compared (a renamed trace, or a missing --traces folder or --workload):\n  {}",
                c.unknown.join("\n  ")
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exceptions_keep_the_hash_of_input_names_and_skip_comments() {
        let path = std::env::temp_dir().join(format!("steady-exc-{}.txt", std::process::id()));
        std::fs::write(
            &path,
            "# a comment\n\n  octree/a.pickle#0  # trailing comment\nworkload gpt-train\n   # indented comment\n",
        )
        .unwrap();
        let names = read_exceptions(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(names, ["octree/a.pickle#0", "workload gpt-train"]);
        let e = read_exceptions(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
