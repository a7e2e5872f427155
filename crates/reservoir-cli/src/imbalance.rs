//! The devices of one `reservoir replay` that run side by side, for the
//! `imbalance` lever (`reservoir_replay::replay::levers::imbalance`): the
//! devices of a file with several, or the ranks of one job (files of one
//! folder whose names differ only in the rank, as `reservoir compare`
//! groups them: [`crate::ranks::rank_of`]), each device of a rank's file a
//! member. Each member's peaks are its first setting's replay (already
//! run); its work is counted only when the group is imbalanced.

use std::collections::BTreeMap;

use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::levers::{work_bytes, Imbalance, Peer};
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::ReplayReport;

use crate::ranks::rank_files;

/// One replayed device trace of the command.
pub(crate) struct Member<'a> {
    /// The file it was read from.
    pub file: &'a str,
    /// Its device.
    pub device: u32,
    pub trace: &'a Trace,
    pub sites: &'a Sites,
    /// The replay of its first setting (`None`: it has none).
    pub report: Option<&'a ReplayReport>,
}

/// For each member (in order), the imbalance of its group when it is the
/// heaviest of an imbalanced group of two or more; `None` for the others.
pub(crate) fn imbalances(members: &[Member<'_>]) -> Vec<Option<Imbalance>> {
    let mut devices: BTreeMap<&str, usize> = BTreeMap::new();
    for m in members {
        *devices.entry(m.file).or_default() += 1;
    }
    let ranks = rank_files(members.iter().map(|m| m.file));
    // group key -> (member index, its name)
    let mut groups: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        if m.report.is_none() {
            continue;
        }
        let (key, name) = match ranks.get(m.file) {
            Some((pattern, rank)) if devices[m.file] > 1 => (
                format!("ranks {pattern}"),
                format!("rank {rank} device {}", m.device),
            ),
            Some((pattern, rank)) => (format!("ranks {pattern}"), format!("rank {rank}")),
            None => (format!("file {}", m.file), format!("device {}", m.device)),
        };
        groups.entry(key).or_default().push((i, name));
    }
    let mut out: Vec<Option<Imbalance>> = members.iter().map(|_| None).collect();
    for group in groups.into_values() {
        let peers = group
            .iter()
            .filter_map(|(i, name)| {
                let r = members[*i].report?;
                Some(Peer {
                    name: name.clone(),
                    peak_reserved: r.peak_reserved,
                    peak_allocated: r.peak_allocated,
                    work: 0,
                })
            })
            .collect();
        // Imbalanced by the peaks alone: then count every member's work.
        if let Some(mut im) = Imbalance::of(peers) {
            for (p, (i, _)) in im.peers.iter_mut().zip(&group) {
                p.work = work_bytes(members[*i].trace, members[*i].sites);
            }
            let heaviest = group[im.heaviest].0;
            out[heaviest] = Some(im);
        }
    }
    out
}
