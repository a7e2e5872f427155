//! Two runs of the same program compared (`reservoir diff A B`): before and
//! after a change, or two ranks.
//!
//! Each side is one recorded device trace, [measured](measure) as the
//! allocator ran it: replayed in PyTorch mode with the recorded settings
//! from the recorded start state, the replay that reproduces the recording
//! (its [`Fidelity`] is measured and stated: [`Side::exact`],
//! [`Side::source`]). With another setting the side is a what-if replay,
//! and says so.
//!
//! Per side: peak allocated ("peak live": bytes of allocated blocks) and
//! peak reserved; fragmentation, the reserved bytes not allocated when
//! allocated bytes first peaked, the moment of greatest demand (and that as
//! a percentage of the reserved bytes then; not at the reserved peak: a
//! snapshot that starts with a full cache peaks in reserved bytes at its
//! first op, where the whole cache is free but nothing is fragmented); the OOMs
//! (count, the first one's request and site); and the live bytes by site
//! (the innermost user frame, see [`sites`](crate::replay::sites)) when
//! allocated bytes first reached their peak. [`compare`] then puts the two
//! side by side: each number's [`Delta`] (B - A, and as a percentage of A),
//! and every site's [`SiteDelta`] classed as grown, shrunk, new (live at
//! B's peak only), gone (at A's only) or the same, sorted by the absolute
//! change (then by name), the first `top` kept, with the counts of each
//! class over all sites. A site of A and one of B that differ only by their
//! line are one site that moved (code edited above it): a site live at one
//! peak only is matched to one live at the other's only by its call path
//! (the user frames' files and functions, [`call_path_of`]), or, without
//! stacks, by its file and function; among several, by the nearest line.
//! A moved site is classed by its bytes and names A's site (`a_site`).
//!
//! [`call_path_of`]: crate::replay::sites::call_path_of
//!
//! JSON keys (stable): [`Diff`]: `a`, `b` ([`Side`]), `peak_allocated`,
//! `peak_reserved`, `fragmentation`, `ooms` ([`Delta`]: `a`, `b`, `delta`,
//! `percent`), `sites` ([`SiteDelta`]: `site`, `change`, `a_bytes`,
//! `b_bytes`, `delta`, `a_count`, `b_count`, `a_site`), `sites_total`, `changes`
//! ([`ChangeCounts`]: `grew`, `shrank`, `new`, `gone`, `same`, `moved`), `top`.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::oracle_trace::{AllocId, Op};
use crate::replay::recorded::{replay_recorded, Fidelity, RecordedTrace};
use crate::replay::{
    AllocatorKind, Replay, ReplayError, ReplayOptions, ReplayReport, ReplaySetting, ReplayTarget,
};
use reservoir::caching::CachingAllocator;
use reservoir::format::format_size;
use reservoir::heap::HeapAllocator;
use reservoir::observe::snapshot::BlockState;
use reservoir::sim::SimDevice;

/// Sites listed by default (`--top`).
pub const DEFAULT_TOP: usize = 20;

/// Live bytes and allocations of each site, by site.
pub type SiteBytes = BTreeMap<String, (u64, u64)>;

/// The first OOM of a side.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FirstOom {
    /// The failed op.
    pub op: u64,
    /// Bytes requested.
    pub bytes: u64,
    /// The site of the failed allocation.
    pub site: String,
}

/// One side of a diff, as measured.
///
/// JSON keys (stable): `file`, `device`, `setting`, `config`, `capacity`, `source`,
/// `source_note`, `exact`, `recorded_by`, `peak_allocated`,
/// `peak_allocated_op`, `peak_reserved`, `peak_reserved_op`,
/// `fragmentation_bytes`, `fragmentation_percent`, `fragmentation_op`, `ooms`,
/// `first_oom`, `sites_live_at_peak`.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Side {
    /// The input file, as named.
    pub file: String,
    /// Its device.
    pub device: u32,
    /// The setting replayed (`pytorch`: the recorded settings).
    pub setting: String,
    /// Its settings string.
    pub config: String,
    /// The simulated device's capacity, bytes.
    pub capacity: u64,
    /// `recording` (PyTorch mode, reproducing the recording exactly),
    /// `replay` (PyTorch mode, not shown to match: see `source_note`) or
    /// `what-if` (another setting).
    pub source: String,
    /// The source in words.
    pub source_note: String,
    /// Whether the PyTorch-mode replay matched the recording (segment
    /// events, block placements, peak reserved, OOMs); `null` when not
    /// measured.
    pub exact: Option<bool>,
    /// The allocator that recorded the file
    /// ([`Recorder::key`](crate::recorder::Recorder::key)); set by the caller.
    pub recorded_by: String,
    /// Peak allocated bytes (blocks handed out, start state included).
    pub peak_allocated: u64,
    /// The op after which allocated bytes first reached it (`null` when at
    /// the start state, or not found).
    pub peak_allocated_op: Option<u64>,
    /// Peak reserved bytes.
    pub peak_reserved: u64,
    /// The op after which reserved bytes first reached it.
    pub peak_reserved_op: Option<u64>,
    /// Reserved bytes not allocated when allocated bytes first peaked (see
    /// the module documentation).
    pub fragmentation_bytes: u64,
    /// That, in percent of the reserved bytes then (0 when nothing was
    /// reserved).
    pub fragmentation_percent: f64,
    /// The op it was taken after: [`Side::peak_allocated_op`].
    pub fragmentation_op: Option<u64>,
    /// Allocations that failed with out of memory.
    pub ooms: u64,
    /// The first of them.
    pub first_oom: Option<FirstOom>,
    /// Sites with live allocations at the allocated peak.
    pub sites_live_at_peak: u64,
}

/// A side with its live bytes by site at the allocated peak.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The numbers.
    pub side: Side,
    /// Live block bytes and allocations by site at the allocated peak.
    pub sites: SiteBytes,
    /// What matches each of those sites to a moved one of the other side
    /// ([`moved_key`]).
    pub keys: SiteKeys,
}

/// The key matching a site to its moved self in another run, by site.
pub type SiteKeys = BTreeMap<String, String>;

/// The key matching `site` (`FILE:LINE:FUNCTION`) to its moved self: its
/// call path when one was recorded, else its file and function; `None`
/// for a placeholder.
pub fn moved_key(site: &str, call_path: &str) -> Option<String> {
    if site.starts_with('(') {
        return None;
    }
    if !call_path.is_empty() {
        return Some(call_path.to_string());
    }
    let (file, rest) = site.split_once(':')?;
    let (_, function) = rest.split_once(':')?;
    Some(format!("{file}:{function}"))
}

/// The line of `FILE:LINE:FUNCTION` (0 when it has none).
fn site_line(site: &str) -> u64 {
    site.split(':')
        .nth(1)
        .and_then(|l| l.parse().ok())
        .unwrap_or(0)
}

/// One number of both sides.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Delta {
    /// A's value.
    pub a: u64,
    /// B's value.
    pub b: u64,
    /// `b - a`.
    pub delta: i64,
    /// `delta` in percent of `a` (`null` when `a` is 0).
    pub percent: Option<f64>,
}

impl Delta {
    /// `a` and `b` compared.
    pub fn new(a: u64, b: u64) -> Delta {
        let delta = (i128::from(b) - i128::from(a)).clamp(i64::MIN.into(), i64::MAX.into()) as i64;
        Delta {
            a,
            b,
            delta,
            percent: (a > 0).then(|| delta as f64 / a as f64 * 100.0),
        }
    }
}

/// How a site changed from A's peak to B's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Live at both peaks, more bytes at B's.
    Grew,
    /// Live at both, fewer bytes at B's.
    Shrank,
    /// Live at B's peak only.
    New,
    /// Live at A's peak only.
    Gone,
    /// The same bytes at both.
    Same,
}

impl Change {
    /// The word of the tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Grew => "grew",
            Change::Shrank => "shrank",
            Change::New => "new",
            Change::Gone => "gone",
            Change::Same => "same",
        }
    }
}

/// One site at both peaks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SiteDelta {
    /// `FILE:LINE:FUNCTION`, or a placeholder in parentheses.
    pub site: String,
    /// How it changed.
    pub change: Change,
    /// Live bytes at A's peak.
    pub a_bytes: u64,
    /// Live bytes at B's peak.
    pub b_bytes: u64,
    /// `b_bytes - a_bytes`.
    pub delta: i64,
    /// Live allocations at A's peak.
    pub a_count: u64,
    /// Live allocations at B's peak.
    pub b_count: u64,
    /// A's name of the site when it moved (another line, the same call
    /// path; `site` is B's), else `null`.
    pub a_site: Option<String>,
}

/// Sites of each change, over all sites.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChangeCounts {
    /// Sites that grew.
    pub grew: u64,
    /// Sites that shrank.
    pub shrank: u64,
    /// Sites live at B's peak only.
    pub new: u64,
    /// Sites live at A's peak only.
    pub gone: u64,
    /// Sites unchanged.
    pub same: u64,
    /// Sites matched across a move (each also counted by its bytes).
    pub moved: u64,
}

/// Two sides compared (see the module documentation for the keys).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Diff {
    /// The first input.
    pub a: Side,
    /// The second input.
    pub b: Side,
    /// Peak allocated bytes.
    pub peak_allocated: Delta,
    /// Peak reserved bytes.
    pub peak_reserved: Delta,
    /// Reserved bytes not allocated at the allocated peak.
    pub fragmentation: Delta,
    /// OOMs.
    pub ooms: Delta,
    /// The `top` sites of largest absolute change (then by name).
    pub sites: Vec<SiteDelta>,
    /// Sites live at either peak.
    pub sites_total: u64,
    /// Sites of each change, over all of them.
    pub changes: ChangeCounts,
    /// The most sites listed.
    pub top: usize,
}

/// The block bytes of the `live` allocations of `r`, summed by site.
fn live_by_site<T: ReplayTarget>(
    r: &Replay<'_, T>,
    live: &BTreeSet<AllocId>,
    rec: &RecordedTrace,
) -> SiteBytes {
    let mut size_at: FxHashMap<u64, u64> = FxHashMap::default();
    for seg in r.allocator().segments() {
        for (addr, b) in seg.blocks_with_addresses() {
            if b.state != BlockState::Inactive {
                size_at.insert(addr, b.size);
            }
        }
    }
    let mut out = SiteBytes::new();
    for &id in live {
        let Some(ptr) = r.pointer(id) else { continue };
        let bytes = size_at.get(&ptr.0).copied().unwrap_or(0);
        let e = out.entry(rec.sites.site(id).to_string()).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    out
}

/// Replay `rec` to the first moment its allocated bytes reach `peak` and
/// take the op, the reserved bytes and the live bytes by site there (at the
/// end when never reached).
fn sites_at_peak<T: ReplayTarget>(
    mut r: Replay<'_, T>,
    rec: &RecordedTrace,
    peak: u64,
) -> Result<(Option<u64>, u64, SiteBytes), ReplayError> {
    let mut live: BTreeSet<AllocId> = rec.start.live_blocks().map(|(.., id)| id).collect();
    let mut at = None;
    if r.allocator().allocated_and_reserved().0 < peak {
        loop {
            let i = r.position();
            if !r.step()? {
                break;
            }
            match &rec.trace.ops[i] {
                Op::Alloc { id, .. } if r.pointer(*id).is_some() => {
                    live.insert(*id);
                }
                Op::Free { id } => {
                    live.remove(id);
                }
                _ => {}
            }
            if r.allocator().allocated_and_reserved().0 >= peak {
                at = Some(i as u64);
                break;
            }
        }
    }
    let reserved = r.allocator().allocated_and_reserved().1;
    Ok((at, reserved, live_by_site(&r, &live, rec)))
}

/// One side as the allocator of `setting` ran it: `rec` replayed from its
/// recorded start on a device of `options.capacity`; `pytorch_mode` says
/// that `setting` is the recorded one (the fidelity is then measured).
pub fn measure(
    file: &str,
    rec: &RecordedTrace,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    pytorch_mode: bool,
) -> Result<Measured, ReplayError> {
    let (report, fid) = replay_recorded(rec, setting, options, pytorch_mode, &mut |_| {})?;
    let quiet = rec.start.quiet();
    let peak = report.peak_allocated;
    let (peak_op, reserved_at_peak, sites) = match setting.allocator {
        AllocatorKind::Caching => sites_at_peak(
            Replay::<CachingAllocator<SimDevice>>::build(
                &rec.trace,
                Some(&quiet),
                setting,
                options,
            )?,
            rec,
            peak,
        )?,
        AllocatorKind::MpsHeap => sites_at_peak(
            Replay::<HeapAllocator<SimDevice>>::build(&rec.trace, Some(&quiet), setting, options)?,
            rec,
            peak,
        )?,
    };
    let keys = sites
        .keys()
        .filter_map(|site| Some((site.clone(), moved_key(site, rec.sites.call_path(site))?)))
        .collect();
    Ok(Measured {
        side: side(
            file,
            rec,
            setting,
            &report,
            fid.as_ref(),
            pytorch_mode,
            (peak_op, reserved_at_peak),
            &sites,
        ),
        sites,
        keys,
    })
}

#[allow(clippy::too_many_arguments)]
fn side(
    file: &str,
    rec: &RecordedTrace,
    setting: &ReplaySetting,
    report: &ReplayReport,
    fid: Option<&Fidelity>,
    pytorch_mode: bool,
    (peak_allocated_op, reserved_at_peak): (Option<u64>, u64),
    sites: &SiteBytes,
) -> Side {
    let exact = fid.map(|f| f.is_exact(report));
    let (source, source_note) = match (pytorch_mode, fid, exact) {
        (true, Some(f), Some(true)) => (
            "recording",
            format!(
                "the recording: replayed in PyTorch mode with the recorded settings, which \
                 reproduces it exactly ({} segment events, {} block placements, peak reserved \
                 and OOMs matched)",
                f.segment_events_total, f.placements_total
            ),
        ),
        (true, Some(f), _) => (
            "replay",
            format!(
                "a replay in PyTorch mode with the recorded settings, which differs from the \
                 recording (segment events {}/{}, block placements {}/{}, recorded peak \
                 reserved {}, recorded OOMs {})",
                f.segment_events_matched,
                f.segment_events_total,
                f.placements_matched,
                f.placements_total,
                format_size(f.recorded_peak_reserved),
                f.recorded_ooms
            ),
        ),
        (true, None, _) => (
            "replay",
            "a replay in PyTorch mode with the recorded settings (the source recorded no \
             segments to check it against)"
                .to_string(),
        ),
        (false, ..) => ("what-if", {
            let how = report.describe_setting();
            let how = if how.starts_with('(') {
                how
            } else {
                format!("({how})")
            };
            format!(
                "a what-if replay with {} {how}, not the recording",
                setting.name
            )
        }),
    };
    let peak_reserved_op = report.peak.as_ref().map(|p| p.op);
    let fragmentation_bytes = reserved_at_peak.saturating_sub(report.peak_allocated);
    let fragmentation_percent = if reserved_at_peak > 0 {
        fragmentation_bytes as f64 / reserved_at_peak as f64 * 100.0
    } else {
        0.0
    };
    Side {
        file: file.to_string(),
        device: rec.device,
        setting: setting.name.clone(),
        config: setting.config.clone(),
        capacity: report.capacity,
        source: source.to_string(),
        source_note,
        exact,
        recorded_by: crate::recorder::Recorder::PytorchCuda.key().to_string(),
        peak_allocated: report.peak_allocated,
        peak_allocated_op,
        peak_reserved: report.peak_reserved,
        peak_reserved_op,
        fragmentation_bytes,
        fragmentation_percent,
        fragmentation_op: peak_allocated_op,
        ooms: report.ooms,
        first_oom: report.first_oom.as_ref().map(|o| FirstOom {
            op: o.op,
            bytes: o.bytes,
            site: rec.sites.site(o.id).to_string(),
        }),
        sites_live_at_peak: sites.len() as u64,
    }
}

/// The live bytes by site of `a` and `b` compared: every site's change,
/// sorted by its absolute size, largest first (then by name). No site is
/// matched across a move: see [`site_deltas_moved`].
pub fn site_deltas(a: &SiteBytes, b: &SiteBytes) -> Vec<SiteDelta> {
    site_deltas_moved(a, &SiteKeys::new(), b, &SiteKeys::new())
}

/// [`site_deltas`], a site live at one peak only matched to one live at
/// the other's only when their keys ([`moved_key`]: `ka` of A's sites, `kb`
/// of B's) are equal, the nearest lines first.
pub fn site_deltas_moved(
    a: &SiteBytes,
    ka: &SiteKeys,
    b: &SiteBytes,
    kb: &SiteKeys,
) -> Vec<SiteDelta> {
    // A's sites gone from B, by key, to match B's new ones.
    let mut gone: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
    for site in a.keys().filter(|s| !b.contains_key(*s)) {
        if let Some(k) = ka.get(site) {
            gone.entry(k.as_str()).or_default().push(site);
        }
    }
    let mut moved: BTreeMap<&String, &String> = BTreeMap::new();
    for site in b.keys().filter(|s| !a.contains_key(*s)) {
        let Some(cands) = kb.get(site).and_then(|k| gone.get_mut(k.as_str())) else {
            continue;
        };
        let line = site_line(site);
        if let Some(i) = (0..cands.len()).min_by_key(|&i| (site_line(cands[i]).abs_diff(line), i)) {
            moved.insert(site, cands.remove(i));
        }
    }
    let matched: BTreeSet<&String> = moved.values().copied().collect();
    let names: BTreeSet<&String> = a
        .keys()
        .filter(|s| !matched.contains(s))
        .chain(b.keys())
        .collect();
    let mut out: Vec<SiteDelta> = names
        .into_iter()
        .map(|site| {
            let a_site = moved.get(site).copied();
            let a_name = a_site.unwrap_or(site);
            let (a_bytes, a_count) = a.get(a_name).copied().unwrap_or_default();
            let (b_bytes, b_count) = b.get(site).copied().unwrap_or_default();
            let change = match (a.contains_key(a_name), b.contains_key(site)) {
                (false, _) => Change::New,
                (_, false) => Change::Gone,
                _ if b_bytes > a_bytes => Change::Grew,
                _ if b_bytes < a_bytes => Change::Shrank,
                _ => Change::Same,
            };
            SiteDelta {
                site: site.clone(),
                change,
                a_bytes,
                b_bytes,
                delta: Delta::new(a_bytes, b_bytes).delta,
                a_count,
                b_count,
                a_site: a_site.cloned(),
            }
        })
        .collect();
    out.sort_by(|x, y| {
        y.delta
            .unsigned_abs()
            .cmp(&x.delta.unsigned_abs())
            .then_with(|| x.site.cmp(&y.site))
    });
    out
}

/// `a` and `b` compared, the `top` sites of largest change listed.
pub fn compare(a: Measured, b: Measured, top: usize) -> Diff {
    let all = site_deltas_moved(&a.sites, &a.keys, &b.sites, &b.keys);
    let mut changes = ChangeCounts::default();
    for s in &all {
        changes.moved += u64::from(s.a_site.is_some());
        *match s.change {
            Change::Grew => &mut changes.grew,
            Change::Shrank => &mut changes.shrank,
            Change::New => &mut changes.new,
            Change::Gone => &mut changes.gone,
            Change::Same => &mut changes.same,
        } += 1;
    }
    let sites_total = all.len() as u64;
    let mut sites = all;
    sites.truncate(top);
    let (a, b) = (a.side, b.side);
    Diff {
        peak_allocated: Delta::new(a.peak_allocated, b.peak_allocated),
        peak_reserved: Delta::new(a.peak_reserved, b.peak_reserved),
        fragmentation: Delta::new(a.fragmentation_bytes, b.fragmentation_bytes),
        ooms: Delta::new(a.ooms, b.ooms),
        a,
        b,
        sites,
        sites_total,
        changes,
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sites(v: &[(&str, u64, u64)]) -> SiteBytes {
        v.iter().map(|&(s, b, n)| (s.to_string(), (b, n))).collect()
    }

    #[test]
    fn sites_are_classed_and_sorted_by_absolute_change() {
        let a = sites(&[
            ("grow", 100, 1),
            ("shrink", 500, 5),
            ("gone", 50, 1),
            ("same", 7, 1),
        ]);
        let b = sites(&[
            ("grow", 400, 2),
            ("shrink", 100, 1),
            ("new", 300, 3),
            ("same", 7, 1),
        ]);
        let d = site_deltas(&a, &b);
        let got: Vec<(&str, Change, i64)> = d
            .iter()
            .map(|s| (s.site.as_str(), s.change, s.delta))
            .collect();
        assert_eq!(
            got,
            [
                ("shrink", Change::Shrank, -400),
                ("grow", Change::Grew, 300),
                ("new", Change::New, 300),
                ("gone", Change::Gone, -50),
                ("same", Change::Same, 0),
            ]
        );
        assert_eq!((d[2].a_count, d[2].b_count), (0, 3));
    }

    #[test]
    fn a_site_that_moved_a_few_lines_is_one_site() {
        // Issue 41 item 5: "model.py:40:forward" in A is "model.py:42:forward"
        // in B (two lines added above it): one site that grew, not a gone
        // and a new one. Matched by call path; the nearest line first.
        let a = sites(&[
            ("model.py:40:forward", 100, 1),
            ("model.py:90:forward", 5, 1),
            ("x.py:1:f", 9, 1),
        ]);
        let b = sites(&[
            ("model.py:42:forward", 300, 2),
            ("model.py:93:forward", 5, 1),
            ("y.py:1:g", 9, 1),
        ]);
        let key = |s: &SiteBytes| -> SiteKeys {
            s.keys()
                .map(|k| (k.clone(), moved_key(k, "").unwrap()))
                .collect()
        };
        let d = site_deltas_moved(&a, &key(&a), &b, &key(&b));
        let got: Vec<(&str, Option<&str>, Change, i64)> = d
            .iter()
            .map(|s| (s.site.as_str(), s.a_site.as_deref(), s.change, s.delta))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "model.py:42:forward",
                    Some("model.py:40:forward"),
                    Change::Grew,
                    200
                ),
                ("x.py:1:f", None, Change::Gone, -9),
                ("y.py:1:g", None, Change::New, 9),
                (
                    "model.py:93:forward",
                    Some("model.py:90:forward"),
                    Change::Same,
                    0
                ),
            ]
        );
        // A recorded call path wins over file and function; placeholders
        // never match.
        assert_eq!(
            moved_key("m.py:3:f", "m.py:f < t.py:main").as_deref(),
            Some("m.py:f < t.py:main")
        );
        assert_eq!(moved_key("(no stack recorded)", ""), None);
        // Without keys nothing moves.
        assert_eq!(
            site_deltas(&a, &b)
                .iter()
                .filter(|s| s.a_site.is_some())
                .count(),
            0
        );
    }

    #[test]
    fn deltas_in_bytes_and_percent() {
        let d = Delta::new(200, 300);
        assert_eq!((d.delta, d.percent), (100, Some(50.0)));
        assert_eq!(Delta::new(0, 5).percent, None);
        assert_eq!(Delta::new(u64::MAX, 0).delta, i64::MIN);
    }
}
