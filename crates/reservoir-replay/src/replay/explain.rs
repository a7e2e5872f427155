//! Why a replay peaked where it did and why it ran out of memory
//! ([`explain`]): at the reserved peak and at the first out-of-memory error
//! of a setting, the live allocations grouped by their site (the innermost
//! user frame of the recorded stack, see [`sites`](super::sites)) and by
//! role (parameters, gradients, ..., see [`roles`](super::roles)), the free
//! blocks that could not serve the failed request and why, and the OOM's
//! [`Diagnosis`]: its shortfall, its causes with their bytes, and the
//! cheapest change that avoids it, proven by replay (see
//! [`diagnose`](super::diagnose)).
//!
//! The state is taken by replaying again up to the moment (the replay is
//! deterministic): after the op at which reserved bytes first reached their
//! peak, and after the failed allocation (PyTorch has then already released
//! every cached segment it could, so the free blocks left are those of
//! segments that still hold live blocks).
//!
//! A free block cannot serve a request of `size` bytes (rounded, spec 1.3)
//! on stream `s` because, checked in this order: it belongs to another
//! stream (`wrong_stream`), to the other pool (`wrong_pool`: small blocks
//! serve requests of at most 1 MiB, large blocks the others), it is smaller
//! than the request (`too_small`), or the oversize rules of
//! `max_split_size` forbid it (`split_limit`, spec 1.6).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::levers::{levers, Imbalance, Lever, LeverInput};
use super::roles::{RoleBytes, RoleUsage, Roles};

use super::diagnose::{diagnose, DiagnoseInput, Diagnosis, FixKind, OomState};
use super::sites::Sites;
use super::target::ReplayTarget as _;
use super::{Replay, ReplayError, ReplayOptions, ReplayReport, ReplaySetting, StartState};
use crate::oracle_trace::Trace;
use reservoir::caching::rules;
use reservoir::observe::snapshot::{BlockState, SegmentType};

/// Sites listed per moment, at most, and the live allocations of one
/// site (defined with the sites, where the diagnosis uses them too).
pub use super::sites::{SiteUsage, TOP_SITES};

/// The reserved peak of a setting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PeakExplanation {
    /// The op after which reserved bytes first reached their peak.
    pub op: u64,
    /// Reserved bytes then.
    pub reserved: u64,
    /// Allocated bytes then.
    pub allocated: u64,
    /// The largest sites by bytes (at most [`TOP_SITES`]).
    pub top_sites: Vec<SiteUsage>,
    /// The live bytes by role (role -> bytes, every role listed; see
    /// [`roles`](super::roles)).
    pub roles: BTreeMap<&'static str, u64>,
    /// The same bytes by how sure each role is (role -> `frames`,
    /// `phase_and_lifetime`, `lifetime`).
    pub role_basis: BTreeMap<&'static str, RoleBytes>,
    /// Program levers that cut the peak, each proven by a replay
    /// ([`levers`](super::levers)); empty until
    /// [`add_levers`] fills them, and without an
    /// OOM only.
    pub levers: Vec<Lever>,
}

/// Why a free block could not serve the failed request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unusable {
    /// The block serves another stream.
    WrongStream,
    /// The block is in the other pool (small vs large).
    WrongPool,
    /// The block is smaller than the rounded request.
    TooSmall,
    /// `max_split_size` forbids it (spec 1.6 oversize rules).
    SplitLimit,
}

/// Free blocks that could not serve the failed request for one reason.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UnusableFree {
    /// The reason.
    pub reason: Unusable,
    /// Blocks.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The largest of them.
    pub largest: u64,
}

/// The first out-of-memory error of a setting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OomExplanation {
    /// The failed op.
    pub op: u64,
    /// Bytes requested.
    pub bytes: u64,
    /// The request rounded as the allocator rounds it.
    pub rounded: u64,
    /// The stream's id.
    pub stream: u64,
    /// The site of the failed allocation.
    pub site: String,
    /// Reserved and allocated bytes after the failure.
    pub reserved: u64,
    /// Allocated bytes after the failure.
    pub allocated: u64,
    /// The largest sites of the live allocations by bytes.
    pub top_sites: Vec<SiteUsage>,
    /// The live bytes by role (role -> bytes, every role listed; see
    /// [`roles`](super::roles)).
    pub roles: BTreeMap<&'static str, u64>,
    /// The same bytes by how sure each role is.
    pub role_basis: BTreeMap<&'static str, RoleBytes>,
    /// The free blocks left, by reason they could not serve the request.
    pub unusable_free: Vec<UnusableFree>,
    /// The proven fix's change when it is a settings change or the
    /// `reservoir` policy (see [`Diagnosis::fix`]), else `null`.
    pub avoided_by: Option<String>,
    /// The shortfall, the causes with their bytes and the cheapest change
    /// that avoids the OOM, proven by replay (issue 30).
    pub diagnosis: Diagnosis,
    /// Program levers for the OOM, each proven by a replay with the
    /// diagnosis's settings fix when it found one
    /// ([`levers`](super::levers)); empty until
    /// [`add_levers`] fills them.
    pub levers: Vec<Lever>,
}

/// The peak and first OOM of one setting.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Explanation {
    /// The setting.
    pub setting: String,
    /// The reserved peak (`null` if nothing was reserved).
    pub peak: Option<PeakExplanation>,
    /// The first OOM (`null` if none).
    pub oom: Option<OomExplanation>,
}

/// The block size at each address of a live block of `r`.
fn block_sizes(r: &Replay<'_>) -> FxHashMap<u64, u64> {
    let mut size_at: FxHashMap<u64, u64> = FxHashMap::default();
    for seg in r.alloc.segments() {
        for (addr, b) in seg.blocks_with_addresses() {
            if b.state != BlockState::Inactive {
                size_at.insert(addr, b.size);
            }
        }
    }
    size_at
}

/// The live bytes of `r` by role.
pub fn role_usage(r: &Replay<'_>, roles: &Roles) -> RoleUsage {
    let size_at = block_sizes(r);
    let mut usage = RoleUsage::default();
    for (id, ptr) in r.live.live() {
        let bytes = size_at.get(&ptr.0).copied().unwrap_or(0);
        let (role, basis) = roles.role(id);
        usage.add(role, basis, bytes);
    }
    usage
}

/// The live allocations of `r` grouped by site, largest first.
fn top_sites(r: &Replay<'_>, sites: &Sites) -> Vec<SiteUsage> {
    let size_at = block_sizes(r);
    let mut by_site: FxHashMap<&str, (u64, u64)> = FxHashMap::default();
    for (id, ptr) in r.live.live() {
        let bytes = size_at.get(&ptr.0).copied().unwrap_or(0);
        let e = by_site.entry(sites.site(id)).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    let mut out: Vec<SiteUsage> = by_site
        .into_iter()
        .map(|(site, (bytes, count))| SiteUsage {
            site: site.to_string(),
            bytes,
            count,
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    out.truncate(TOP_SITES);
    out
}

/// A fresh replay run through op `op` (inclusive).
fn replay_through<'t>(
    trace: &'t Trace,
    start: Option<&'t StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    op: u64,
) -> Result<Replay<'t>, ReplayError> {
    let mut r: Replay<'t> = Replay::build(trace, start, setting, options)?;
    r.track_peak = false;
    while r.next as u64 <= op && r.step()? {}
    Ok(r)
}

/// Why each free block of `r` could not serve `rounded` bytes on `stream`.
fn unusable_free(
    r: &Replay<'_>,
    rounded: u64,
    stream: u64,
    setting: &ReplaySetting,
) -> Vec<UnusableFree> {
    let config = setting.allocator_config().unwrap_or_default();
    let small_request = rounded <= rules::SMALL_SIZE;
    let mut by: std::collections::BTreeMap<Unusable, UnusableFree> = Default::default();
    for seg in r.alloc.segments() {
        let small_seg = seg.segment_type == SegmentType::Small;
        for b in seg
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Inactive)
        {
            let reason = if seg.stream.0 != stream {
                Unusable::WrongStream
            } else if small_seg != small_request {
                Unusable::WrongPool
            } else if b.size < rounded {
                Unusable::TooSmall
            } else if rules::oversize_misfit(rounded, b.size, &config) {
                Unusable::SplitLimit
            } else {
                // Fits by every rule yet was not used: cannot happen after a
                // failed allocation; counted as too small to stay visible.
                Unusable::TooSmall
            };
            let e = by.entry(reason).or_insert(UnusableFree {
                reason,
                blocks: 0,
                bytes: 0,
                largest: 0,
            });
            e.blocks += 1;
            e.bytes += b.size;
            e.largest = e.largest.max(b.size);
        }
    }
    by.into_values().collect()
}

/// Explain the reserved peak and the first OOM of `report` (a replay of
/// `trace` from `start` with `setting` on `options`); `candidates` are the
/// general settings changes the [`Diagnosis`] tries after those relevant to
/// the causes. The device is taken to have no memory outside the allocator
/// (see [`explain_on_device`]).
pub fn explain(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    report: &ReplayReport,
    sites: &Sites,
    candidates: &[ReplaySetting],
) -> Result<Explanation, ReplayError> {
    explain_on_device(
        trace, start, setting, options, report, sites, candidates, None,
    )
}

/// [`explain`] on a device of `device_total` bytes in all, of which the
/// allocator was given `options.capacity` (the rest is used outside it).
#[allow(clippy::too_many_arguments)]
pub fn explain_on_device(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    report: &ReplayReport,
    sites: &Sites,
    candidates: &[ReplaySetting],
    device_total: Option<u64>,
) -> Result<Explanation, ReplayError> {
    // Placements and the device-call log are not needed.
    let quiet = start.map(StartState::quiet);
    let start = quiet.as_ref();
    let roles = Roles::classify(trace, sites);
    let peak = match &report.peak {
        Some(p) => {
            let r = replay_through(trace, start, setting, options, p.op)?;
            let usage = role_usage(&r, &roles);
            Some(PeakExplanation {
                op: p.op,
                reserved: p.reserved,
                allocated: p.allocated,
                top_sites: top_sites(&r, sites),
                roles: usage.bytes_by_key(),
                role_basis: usage.basis_by_key(),
                levers: Vec::new(),
            })
        }
        None => None,
    };
    let oom = match &report.first_oom {
        Some(o) => {
            let r = replay_through(trace, start, setting, options, o.op)?;
            let config = setting.allocator_config()?;
            let rounded = rules::round_size(o.bytes.max(1), &config);
            let (allocated, reserved) = r.alloc.allocated_and_reserved();
            let segments = r.alloc.segments();
            let state = OomState {
                segments: &segments,
                bytes: o.bytes,
                rounded,
                stream: o.stream,
                capacity: options.capacity,
                device_total,
                config: &config,
            };
            let input = DiagnoseInput {
                trace,
                start,
                setting,
                options,
                sites,
                general: candidates,
                op: o.op,
                at_failure: &r,
            };
            let diagnosis = diagnose(&input, &state);
            let usage = role_usage(&r, &roles);
            let avoided_by = diagnosis
                .fix
                .as_ref()
                .filter(|f| matches!(f.kind, FixKind::Setting | FixKind::Policy))
                .map(|f| f.change.clone());
            Some(OomExplanation {
                op: o.op,
                bytes: o.bytes,
                rounded,
                stream: o.stream,
                site: sites.site(o.id).to_string(),
                reserved,
                allocated,
                top_sites: top_sites(&r, sites),
                roles: usage.bytes_by_key(),
                role_basis: usage.basis_by_key(),
                unusable_free: unusable_free(&r, rounded, o.stream, setting),
                avoided_by,
                diagnosis,
                levers: Vec::new(),
            })
        }
        None => None,
    };
    Ok(Explanation {
        setting: setting.name.clone(),
        peak,
        oom,
    })
}

/// Fill in the program levers ([`levers`](super::levers)) of explanation `e` of a replay of `trace` from
/// `start` with `setting` on `options`: at its first OOM (replayed with the
/// diagnosis's settings fix when it found one) or, without an OOM, at its
/// reserved peak. `imbalance`: the devices of the input when `trace` is
/// the heaviest of several and imbalanced (the `imbalance` lever).
pub fn add_levers(
    e: &mut Explanation,
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    sites: &Sites,
    imbalance: Option<&Imbalance>,
) -> Result<(), ReplayError> {
    let quiet = start.map(StartState::quiet);
    let start = quiet.as_ref();
    if let Some(o) = &mut e.oom {
        let fixed = o
            .diagnosis
            .fix
            .as_ref()
            .filter(|f| matches!(f.kind, FixKind::Setting | FixKind::Policy))
            .and_then(|f| {
                f.config.as_ref().map(|c| ReplaySetting {
                    name: f.change.clone(),
                    config: c.clone(),
                    allocator: setting.allocator,
                })
            });
        let input = LeverInput {
            trace,
            start,
            setting: fixed.as_ref().unwrap_or(setting),
            options,
            sites,
            moment: o.op,
            ends_at: o.diagnosis.recording_ends_at_failure.then_some(o.op),
            imbalance,
        };
        o.levers = levers(&input)?;
    } else if let Some(p) = &mut e.peak {
        let input = LeverInput {
            trace,
            start,
            setting,
            options,
            sites,
            moment: trace.ops.len().saturating_sub(1) as u64,
            ends_at: None,
            imbalance,
        };
        p.levers = levers(&input)?;
    }
    Ok(())
}
