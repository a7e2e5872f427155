//! "Free X" (see [`diagnose`](super)): the live allocations at the failure
//! grouped by the code that asked for them, and the fewest, lightest groups
//! whose dropping from the trace lets it run without an OOM, proven by
//! replay within what is left of [`MAX_REPLAYS`].

use rustc_hash::{FxHashMap, FxHashSet};

use super::{drop_allocations, peak_without_oom, DiagnoseInput, FixKind, ProvenFix, MAX_REPLAYS};
use crate::oracle_trace::{AllocId, Op};
use crate::replay::sites::{SiteUsage, Sites, BEFORE_TRACE, NO_STACK, NO_USER_FRAME, TOP_SITES};
use reservoir::format::format_size;
use reservoir::observe::snapshot::BlockState;

/// How live allocations are grouped for "free X": by site, or by site and
/// requested size when the live ones fall in fewer than two sites.
struct Groups<'a> {
    sites: &'a Sites,
    by_size: bool,
    /// Requested bytes of each allocation id (its latest `a` before the failure,
    /// or its start-state block).
    bytes: FxHashMap<AllocId, u64>,
}

impl Groups<'_> {
    fn key(&self, id: AllocId, bytes: u64) -> String {
        let site = self.sites.site(id);
        if self.by_size {
            format!("{site}, requests of {}", format_size(bytes))
        } else {
            site.to_string()
        }
    }
}

/// Is `site` a placeholder rather than code?
fn placeholder(site: &str) -> bool {
    [NO_STACK, NO_USER_FRAME, BEFORE_TRACE].contains(&site)
}

/// The live allocations at the failure in groups (by site, or by site and
/// request size when fewer than two real sites hold them), the largest
/// [`TOP_SITES`] first.
fn live_groups<'a>(input: &DiagnoseInput<'a, '_>) -> (Groups<'a>, Vec<SiteUsage>) {
    let r = input.at_failure;
    let mut bytes: FxHashMap<AllocId, u64> = FxHashMap::default();
    if let Some(st) = input.start {
        for (_, _, b, id) in st.live_blocks() {
            bytes.insert(id, b.requested_size);
        }
    }
    for op in input.trace.ops.iter().take(input.op as usize + 1) {
        if let Op::Alloc { id, bytes: n, .. } = op {
            bytes.insert(*id, *n);
        }
    }
    let mut size_at: FxHashMap<u64, u64> = FxHashMap::default();
    for seg in r.alloc.segments() {
        for (addr, b) in seg.blocks_with_addresses() {
            if b.state != BlockState::Inactive {
                size_at.insert(addr, b.size);
            }
        }
    }
    let live: Vec<(AllocId, u64)> = r
        .live
        .live()
        .map(|(id, p)| (id, size_at.get(&p.0).copied().unwrap_or(0)))
        .collect();
    let distinct: FxHashSet<&str> = live
        .iter()
        .map(|(id, _)| input.sites.site(*id))
        .filter(|s| !placeholder(s))
        .collect();
    let groups = Groups {
        sites: input.sites,
        by_size: distinct.len() < 2,
        bytes,
    };
    let mut by: FxHashMap<String, (u64, u64)> = FxHashMap::default();
    for (id, size) in &live {
        let n = groups.bytes.get(id).copied().unwrap_or(*size);
        let e = by.entry(groups.key(*id, n)).or_default();
        e.0 += size;
        e.1 += 1;
    }
    let mut top: Vec<SiteUsage> = by
        .into_iter()
        .map(|(site, (bytes, count))| SiteUsage { site, bytes, count })
        .collect();
    top.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.site.cmp(&b.site)));
    top.truncate(TOP_SITES);
    (groups, top)
}

/// "Free X" (module documentation), within what is left of the budget.
pub(super) fn free_sites(
    input: &DiagnoseInput<'_, '_>,
    short: u64,
    replays: &mut u64,
    tried: &mut Vec<String>,
) -> Option<ProvenFix> {
    let (groups, top) = live_groups(input);
    if top.is_empty() {
        return None;
    }
    let mut try_set = |set: &[usize], replays: &mut u64| -> Option<u64> {
        if *replays as usize >= MAX_REPLAYS {
            return None;
        }
        *replays += 1;
        let keys: FxHashSet<&str> = set.iter().map(|&i| top[i].site.as_str()).collect();
        let drop = |id: AllocId, n: u64| keys.contains(groups.key(id, n).as_str());
        let (t, st) = drop_allocations(input.trace, input.start, &drop);
        tried.push(format!(
            "free {}",
            set.iter()
                .map(|&i| top[i].site.as_str())
                .collect::<Vec<_>>()
                .join(" + ")
        ));
        peak_without_oom(&t, st.as_ref(), input.setting, input.options)
    };
    let all: Vec<usize> = (0..top.len()).collect();
    let mut best = (all.clone(), try_set(&all, replays)?);
    // The fewest largest groups whose bytes cover the shortfall, then one more at a time.
    let mut k = 1;
    let mut covered = top[0].bytes;
    while k < top.len() && covered < short {
        covered += top[k].bytes;
        k += 1;
    }
    while k < best.0.len() {
        let set: Vec<usize> = (0..k).collect();
        match try_set(&set, replays) {
            Some(peak) => {
                best = (set, peak);
                break;
            }
            None if *replays as usize >= MAX_REPLAYS => break,
            None => k += 1,
        }
    }
    // Shrink: drop members, largest first, while it still fits.
    let mut i = 0;
    while best.0.len() > 1 && i < best.0.len() && (*replays as usize) < MAX_REPLAYS {
        let mut set = best.0.clone();
        set.remove(i);
        match try_set(&set, replays) {
            Some(peak) => best = (set, peak),
            None => i += 1,
        }
    }
    // Lighten: swap each member, largest first, for the smallest group
    // outside the set that still covers the shortfall with the others.
    let mut m = 0;
    while m < best.0.len() && (*replays as usize) < MAX_REPLAYS {
        let member = best.0[m];
        let others: u64 = best
            .0
            .iter()
            .filter(|&&i| i != member)
            .map(|&i| top[i].bytes)
            .sum();
        let need = short.saturating_sub(others);
        let lighter = (0..top.len())
            .rev()
            .filter(|i| !best.0.contains(i) && top[*i].bytes < top[member].bytes)
            .find(|&i| top[i].bytes >= need);
        match lighter {
            Some(l) => {
                let mut set = best.0.clone();
                set[m] = l;
                match try_set(&set, replays) {
                    Some(peak) => best = (set, peak),
                    None => m += 1,
                }
            }
            None => m += 1,
        }
    }
    let sites: Vec<SiteUsage> = best.0.iter().map(|&i| top[i].clone()).collect();
    let keys: FxHashSet<&str> = sites.iter().map(|s| s.site.as_str()).collect();
    let dropped = dropped_count(input, &|id, n| keys.contains(groups.key(id, n).as_str()));
    Some(free_fix(sites, dropped, best.1))
}

/// How many allocations of the whole trace (and of its start state) `drop`
/// selects: what the proving replay ran without.
fn dropped_count(input: &DiagnoseInput<'_, '_>, drop: &dyn Fn(AllocId, u64) -> bool) -> u64 {
    let mut ids: FxHashSet<AllocId> = FxHashSet::default();
    if let Some(st) = input.start {
        for (_, _, b, id) in st.live_blocks() {
            if drop(id, b.requested_size) {
                ids.insert(id);
            }
        }
    }
    for op in &input.trace.ops {
        if let Op::Alloc { id, bytes, .. } = op {
            if drop(*id, *bytes) {
                ids.insert(*id);
            }
        }
    }
    ids.len() as u64
}

/// The proven "free X" fix: the trace without the `dropped` allocations of
/// `sites` (those live at the failure and every other the same code makes)
/// runs with no OOM, peaking at `peak_reserved`. The sentence says what
/// was replayed: all of the sites' allocations, not only the live ones.
fn free_fix(sites: Vec<SiteUsage>, dropped: u64, peak_reserved: u64) -> ProvenFix {
    let freed: u64 = sites.iter().map(|s| s.bytes).sum();
    let live: u64 = sites.iter().map(|s| s.count).sum();
    let plural = |n: u64| if n == 1 { "" } else { "s" };
    let replayed = if dropped > live {
        format!(
            "proven by replaying the trace without all {dropped} allocations these sites make \
             (the {live} live at the failure and {} earlier or later one{})",
            dropped - live,
            plural(dropped - live)
        )
    } else {
        format!(
            "proven by replaying the trace without {} allocation{}",
            if live == 1 { "this" } else { "these" },
            plural(live)
        )
    };
    let names = sites
        .iter()
        .map(|s| {
            format!(
                "{} ({} live, {} allocation{})",
                s.site,
                format_size(s.bytes),
                s.count,
                if s.count == 1 { "" } else { "s" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    ProvenFix {
        kind: FixKind::FreeSites,
        change: format!(
            "free {}",
            sites
                .iter()
                .map(|s| s.site.as_str())
                .collect::<Vec<_>>()
                .join(" + ")
        ),
        peak_reserved,
        sentence: format!(
            "free {} at the failure: {names}; {replayed}: no OOM, peak reserved {}",
            format_size(freed),
            format_size(peak_reserved)
        ),
        sites,
        dropped_allocations: dropped,
        config: None,
    }
}
