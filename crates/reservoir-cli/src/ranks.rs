//! Per-rank snapshots of one job (`reservoir compare` on a folder holding
//! `rank0.pickle`, `rank1.pickle`, ... or `snap_rank_3.pickle`, ...): the
//! files of one folder whose names differ only in one number, the rank,
//! summarised per rank and for the job: each rank's minimum capacity under
//! each policy, the worst rank, and the device size that fits every rank
//! (the largest of the ranks' minimum capacities).
//!
//! The rank is the number right after `rank` in the file name (`_`, `-` or
//! `.` between them allowed), else the file name's last number. Two or
//! more files of a folder with the same name around that number, and
//! different numbers in it, are one job's ranks. A rank's file may hold
//! several devices' traces: the rank needs the largest of its devices.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use reservoir::format::format_size;
use reservoir_replay::compare::CompareRow;

/// One rank of a job.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Rank {
    /// The rank number.
    pub rank: u64,
    /// Its inputs (one per device trace of its file), as the rows name them.
    pub inputs: Vec<String>,
    /// Per policy (the job's order): the smallest device it runs on
    /// without OOM, the largest of its devices' (`None`: above 16 TiB).
    pub min_capacity: Vec<Option<u64>>,
    /// Per policy: the largest peak reserved of its devices, bytes.
    pub peak_reserved: Vec<u64>,
}

/// The per-rank snapshots of one job.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Job {
    /// The file names with `{rank}` for the rank number, e.g.
    /// `run/rank{rank}.pickle`.
    pub pattern: String,
    /// The policies, in column order.
    pub policies: Vec<String>,
    /// The ranks, by rank number.
    pub ranks: Vec<Rank>,
}

impl Job {
    /// The device size that fits every rank under policy `k`: the largest
    /// of the ranks' minimum capacities (`None`: a rank fits on no device
    /// up to 16 TiB).
    pub(crate) fn fits_every_rank(&self, k: usize) -> Option<u64> {
        self.ranks
            .iter()
            .map(|r| r.min_capacity[k])
            .try_fold(0, |m, c| c.map(|c| m.max(c)))
    }

    /// The worst rank under policy `k`: the one that needs the largest
    /// device (one that fits on none first; the lowest rank on ties).
    pub(crate) fn worst_rank(&self, k: usize) -> Option<u64> {
        let key = |r: &Rank| r.min_capacity[k].map_or(u128::MAX, u128::from);
        let worst = self.ranks.iter().map(key).max()?;
        self.ranks.iter().find(|r| key(r) == worst).map(|r| r.rank)
    }
}

/// The rank of a file name: its pattern (the name with `{rank}` for the
/// number) and the number; `None` for a name without a number (or with
/// one too large for 64 bits).
pub(crate) fn rank_of(name: &str) -> Option<(String, u64)> {
    let bytes = name.as_bytes();
    // Each run of ASCII digits: (start, end).
    let mut runs = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            runs.push((start, i));
        } else {
            i += 1;
        }
    }
    let after_rank = |start: usize| {
        let before = name[..start].trim_end_matches(['_', '-', '.']);
        before.len() >= 4 && before[before.len() - 4..].eq_ignore_ascii_case("rank")
    };
    let &(start, end) = runs
        .iter()
        .rev()
        .find(|(s, _)| after_rank(*s))
        .or(runs.last())?;
    let number = name[start..end].parse().ok()?;
    Some((
        format!("{}{{rank}}{}", &name[..start], &name[end..]),
        number,
    ))
}

/// The rank of each file that is one of two or more ranks of one job:
/// file -> (its folder and pattern, its rank). A job's files are distinct,
/// with distinct numbers, in one folder, around one pattern; two files with
/// the same number (`rank01`, `rank1`) make the pattern no job.
pub(crate) fn rank_files<'a>(
    files: impl Iterator<Item = &'a str>,
) -> BTreeMap<&'a str, (String, u64)> {
    // pattern -> rank -> files
    let mut groups: BTreeMap<String, BTreeMap<u64, Vec<&str>>> = BTreeMap::new();
    for file in files {
        let (dir, name) = match file.rsplit_once('/') {
            Some((d, n)) => (format!("{d}/"), n),
            None => (String::new(), file),
        };
        if let Some((pattern, rank)) = rank_of(name) {
            let files = groups.entry(format!("{dir}{pattern}")).or_default();
            let at = files.entry(rank).or_default();
            if !at.contains(&file) {
                at.push(file);
            }
        }
    }
    let mut out = BTreeMap::new();
    for (pattern, files) in groups {
        if files.len() < 2 || files.values().any(|f| f.len() > 1) {
            continue;
        }
        for (rank, f) in files {
            out.insert(f[0], (pattern.clone(), rank));
        }
    }
    out
}

/// The jobs among `rows` (the inputs that are trace files, `FILE#DEVICE`;
/// workloads are no rank), in the order of their patterns.
pub(crate) fn jobs(rows: &[CompareRow]) -> Vec<Job> {
    let file_of = |row: &CompareRow| -> Option<String> {
        if row.input.starts_with("workload ") {
            return None;
        }
        Some(row.input.rsplit_once('#')?.0.to_string())
    };
    let files: Vec<Option<String>> = rows.iter().map(file_of).collect();
    let ranks = rank_files(files.iter().flatten().map(String::as_str));
    // pattern -> rank -> rows
    let mut groups: BTreeMap<String, BTreeMap<u64, Vec<&CompareRow>>> = BTreeMap::new();
    for (row, file) in rows.iter().zip(&files) {
        if let Some((pattern, rank)) = file.as_deref().and_then(|f| ranks.get(f)) {
            let by_rank = groups.entry(pattern.clone()).or_default();
            by_rank.entry(*rank).or_default().push(row);
        }
    }
    groups
        .into_iter()
        .filter_map(|(pattern, by_rank)| {
            let first = by_rank.values().next()?.first()?;
            let policies: Vec<String> = first.policies.iter().map(|p| p.policy.clone()).collect();
            let ranks = by_rank
                .into_iter()
                .map(|(rank, rows)| {
                    let rows = &rows;
                    let per_policy = |name: &String| {
                        let name = name.clone();
                        rows.iter()
                            .filter_map(move |r| r.policies.iter().find(|p| p.policy == name))
                    };
                    Rank {
                        rank,
                        inputs: rows.iter().map(|r| r.input.clone()).collect(),
                        min_capacity: policies
                            .iter()
                            .map(|name| {
                                let mut it = per_policy(name).peekable();
                                it.peek()?;
                                it.try_fold(0, |m, p| p.min_capacity.map(|c| m.max(c)))
                            })
                            .collect(),
                        peak_reserved: policies
                            .iter()
                            .map(|name| {
                                per_policy(name).map(|p| p.peak_reserved).max().unwrap_or(0)
                            })
                            .collect(),
                    }
                })
                .collect();
            Some(Job {
                pattern,
                policies,
                ranks,
            })
        })
        .collect()
}

fn size_cell(c: Option<u64>) -> String {
    c.map_or_else(|| "> 16 TiB".to_string(), format_size)
}

/// The jobs as text, after `reservoir compare`'s tables (nothing when
/// there is none): per rank its minimum capacity under each policy, then
/// the device that fits every rank and the worst rank.
pub(crate) fn text(jobs: &[Job]) -> String {
    let mut out = String::new();
    for job in jobs {
        let _ = writeln!(
            out,
            "\nper-rank snapshots of one job, {} ({} ranks): minimum capacity (no OOM) per rank",
            job.pattern,
            job.ranks.len()
        );
        let mut cells: Vec<Vec<String>> = Vec::new();
        let mut header = vec!["rank".to_string()];
        header.extend(job.policies.iter().cloned());
        cells.push(header);
        for r in &job.ranks {
            let mut line = vec![r.rank.to_string()];
            line.extend(r.min_capacity.iter().map(|c| size_cell(*c)));
            cells.push(line);
        }
        let k = 0..job.policies.len();
        let mut fits = vec!["fits every rank".to_string()];
        fits.extend(k.clone().map(|k| size_cell(job.fits_every_rank(k))));
        cells.push(fits);
        let mut worst = vec!["worst rank".to_string()];
        worst.extend(k.map(|k| {
            job.worst_rank(k)
                .map_or_else(|| "-".to_string(), |r| r.to_string())
        }));
        cells.push(worst);
        crate::table::write_aligned(&mut out, &cells, 1);
    }
    out
}

/// The jobs as JSON (`rank_jobs` of `reservoir compare --json`).
pub(crate) fn json(jobs: &[Job]) -> serde_json::Value {
    jobs.iter()
        .map(|job| {
            let ranks: Vec<_> = job
                .ranks
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "rank": r.rank,
                        "inputs": r.inputs,
                        "policies": job.policies.iter().enumerate().map(|(k, p)| serde_json::json!({
                            "policy": p,
                            "min_capacity": r.min_capacity[k],
                            "peak_reserved": r.peak_reserved[k],
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let policies: Vec<_> = job
                .policies
                .iter()
                .enumerate()
                .map(|(k, p)| {
                    serde_json::json!({
                        "policy": p,
                        "fits_every_rank": job.fits_every_rank(k),
                        "worst_rank": job.worst_rank(k),
                    })
                })
                .collect();
            serde_json::json!({
                "pattern": job.pattern,
                "ranks": ranks,
                "policies": policies,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_files_of_one_folder_are_one_job() {
        let r = rank_files(
            [
                "run/rank0.pickle",
                "run/rank1.pickle",
                "run/rank1.pickle",
                "other/rank0.pickle",
                "solo.pickle",
                "dup/r1.pickle",
                "dup/r01.pickle",
            ]
            .into_iter(),
        );
        let got: Vec<(&str, u64)> = r.iter().map(|(f, (_, n))| (*f, *n)).collect();
        assert_eq!(got, [("run/rank0.pickle", 0), ("run/rank1.pickle", 1)]);
    }

    #[test]
    fn the_rank_is_the_number_after_rank_else_the_last_number() {
        assert_eq!(
            rank_of("rank0.pickle"),
            Some(("rank{rank}.pickle".into(), 0))
        );
        assert_eq!(
            rank_of("job7_rank_12_snapshot.pickle"),
            Some(("job7_rank_{rank}_snapshot.pickle".into(), 12))
        );
        assert_eq!(
            rank_of("RANK-3.v2.pickle"),
            Some(("RANK-{rank}.v2.pickle".into(), 3))
        );
        assert_eq!(
            rank_of("snap_gpu5.pickle"),
            Some(("snap_gpu{rank}.pickle".into(), 5))
        );
        assert_eq!(rank_of("snapshot.pickle"), None);
        assert_eq!(rank_of("r99999999999999999999999.pickle"), None);
    }
}
