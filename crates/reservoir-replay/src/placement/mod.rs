//! The least memory any allocator that cannot move allocations could have
//! used for a trace: an offline placement (*dynamic storage allocation*)
//! with every lifetime known.
//!
//! Each allocation of the trace becomes a [`Buffer`]: its size and its
//! lifetime. The solver gives every buffer an address (an offset from 0) so
//! that no two buffers live at the same time overlap in address, and
//! minimises the highest address used (the *height*). Nothing that keeps
//! each allocation at one address for its whole life (every caching
//! allocator, PyTorch's included) can serve the trace with fewer bytes.
//!
//! The placement is one contiguous address range. A caching allocator's
//! memory is several driver allocations (segments, or pages mapped under a
//! virtual range with expandable segments) that the driver puts anywhere
//! and that the allocator can release and create again: on the simulated
//! device such a setting can fit below the best placement (only the peak of
//! live bytes bounds it), and `reservoir` says so where it happens.
//!
//! **The unit placed**: the requested bytes rounded up to [`PLACEMENT_UNIT`]
//! (512 bytes), the smallest block any CUDA caching allocator hands out
//! (spec 1.3: PyTorch rounds every request up to a multiple of 512 bytes).
//! A request of 0 bytes takes no space and is left out.
//!
//! **Lifetimes**: an allocation made by op `i` lives from time `i + 1` to
//! the op that frees it (op `j` ends it at time `j + 1`, exclusive); one
//! never freed lives to the end of the trace; a block live in a recorded
//! start state lives from time 0. Allocating an id that is still live ends
//! the old allocation there (as [`live_peak`](crate::compare::live_peak)
//! counts it).
//!
//! Three numbers come out ([`solve`], [`limit`]):
//!
//! * the **lower bound**: the peak over time of the bytes live (rounded to
//!   the unit), which no placement can beat;
//! * a **heuristic** placement ([`heuristic`]): greedy by size, each buffer
//!   at the lowest (first-fit) or tightest (best-fit) free address among
//!   the buffers already placed that live at the same time, found with an
//!   interval tree over lifetimes (O(n log n + k), k the overlapping pairs
//!   met); the best of a few orders, and of the placement in order of time
//!   that an ideal best-fit allocator with no knowledge of the future
//!   makes. Where k would be large (more than [`ONE_ORDER_PAIRS`]), only
//!   the latter runs, in O(n log n), and the answer says it is heuristic;
//! * an **exact** search ([`exact`]): branch and bound in the style of
//!   MiniMalloc (ASPLOS'23) over canonical placements (each buffer at the
//!   lowest address free given those placed before it, which reaches an
//!   optimum for some order), with the heuristic as the first upper bound,
//!   the lower bound to stop early, partial-order reduction (two buffers
//!   whose lifetimes do not meet are placed in one order only) and a work
//!   budget. The trace is first split where nothing is live; each part is
//!   solved alone.
//!
//! The answer is [`Bound::Exact`] when the best placement found is proven
//! optimal (it meets the lower bound, or the search finished within its
//! budget), else [`Bound::Heuristic`] with the best found and the bound.

mod exact;
mod heuristic;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use crate::oracle_trace::{AllocId, Op, Trace};
use crate::replay::StartState;

pub use exact::exact;
pub use heuristic::{heuristic, HEURISTIC_PAIRS, ONE_ORDER_PAIRS, RANDOM_ORDERS};

/// The unit a placement works in: requested bytes are rounded up to a
/// multiple of 512, the smallest block a CUDA caching allocator hands out
/// (spec 1.3).
pub const PLACEMENT_UNIT: u64 = 512;

/// The default work budget of [`solve`]'s exact search: conflict checks
/// (one per already-placed buffer met while finding where a buffer goes),
/// a few milliseconds in a release build.
pub const DEFAULT_WORK_BUDGET: u64 = 1_000_000;

/// The most buffers in one independent part that the exact search tries;
/// larger parts keep the heuristic's answer unless it meets the lower
/// bound.
pub const EXACT_MAX_BUFFERS: usize = 2_000;

/// One allocation to place: its size and lifetime `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buffer {
    /// Bytes it takes (for a trace, the request rounded up to
    /// [`PLACEMENT_UNIT`]).
    pub size: u64,
    /// First time it is live.
    pub start: u64,
    /// First time it is no longer live (`> start`).
    pub end: u64,
}

impl Buffer {
    /// A buffer of `size` bytes live from `start` up to `end` (exclusive).
    pub fn new(size: u64, start: u64, end: u64) -> Buffer {
        Buffer { size, start, end }
    }

    /// Whether the two are live at some same time.
    pub fn meets(&self, other: &Buffer) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// What a placement of a set of buffers achieves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Bound {
    /// The best placement, proven optimal: no placement uses fewer bytes.
    Exact {
        /// Its height in bytes.
        bytes: u64,
    },
    /// The best placement found, and a lower bound on any placement.
    Heuristic {
        /// The height of the best placement found, bytes.
        best: u64,
        /// No placement uses fewer bytes.
        lower_bound: u64,
    },
}

impl Bound {
    /// The height of the best placement found.
    pub fn best(&self) -> u64 {
        match *self {
            Bound::Exact { bytes } => bytes,
            Bound::Heuristic { best, .. } => best,
        }
    }

    /// The most that is known to be needed: the optimum when exact.
    pub fn lower_bound(&self) -> u64 {
        match *self {
            Bound::Exact { bytes } => bytes,
            Bound::Heuristic { lower_bound, .. } => lower_bound,
        }
    }

    /// Whether the best placement is proven optimal.
    pub fn is_exact(&self) -> bool {
        matches!(self, Bound::Exact { .. })
    }
}

/// A placement: an offset per buffer, and what it achieves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The offset of each buffer (parallel to the input).
    pub offsets: Vec<u64>,
    /// Its height and whether it is optimal.
    pub bound: Bound,
    /// The peak of the live bytes ([`peak_live`]).
    pub peak_live: u64,
    /// Conflict checks the exact search spent.
    pub work: u64,
}

/// The highest address a placement uses: the largest `offset + size`
/// (0 for no buffer).
pub fn height(buffers: &[Buffer], offsets: &[u64]) -> u64 {
    buffers
        .iter()
        .zip(offsets)
        .map(|(b, &o)| o + b.size)
        .max()
        .unwrap_or(0)
}

/// The peak over time of the bytes of the buffers live at once: a lower
/// bound on any placement's height. Empty lifetimes count for nothing.
pub fn peak_live(buffers: &[Buffer]) -> u64 {
    let mut events: Vec<(u64, bool, u64)> = Vec::with_capacity(buffers.len() * 2);
    for b in buffers.iter().filter(|b| b.end > b.start) {
        // At one time, ends (false) sort before starts (true).
        events.push((b.start, true, b.size));
        events.push((b.end, false, b.size));
    }
    events.sort_unstable();
    let (mut live, mut peak) = (0u64, 0u64);
    for (_, starts, size) in events {
        if starts {
            live += size;
            peak = peak.max(live);
        } else {
            live -= size;
        }
    }
    peak
}

/// Why a placement is not valid ([`verify`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Not one offset per buffer.
    #[error("{offsets} offsets for {buffers} buffers")]
    Length {
        /// Buffers given.
        buffers: usize,
        /// Offsets given.
        offsets: usize,
    },
    /// Two buffers live at once overlap in address.
    #[error("buffers {a} and {b} are live at once and overlap in address")]
    Overlap {
        /// One buffer's index.
        a: usize,
        /// The other's.
        b: usize,
    },
}

/// Check that no two buffers live at the same time overlap in address, by
/// a sweep over time that keeps the live buffers ordered by address; return
/// the placement's height.
pub fn verify(buffers: &[Buffer], offsets: &[u64]) -> Result<u64, PlacementError> {
    use std::collections::BTreeMap;
    if buffers.len() != offsets.len() {
        return Err(PlacementError::Length {
            buffers: buffers.len(),
            offsets: offsets.len(),
        });
    }
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(buffers.len() * 2);
    for (i, b) in buffers.iter().enumerate() {
        if b.size > 0 && b.end > b.start {
            events.push((b.start, true, i));
            events.push((b.end, false, i));
        }
    }
    events.sort_unstable();
    // Live buffers by (offset, index).
    let mut live: BTreeMap<(u64, usize), u64> = BTreeMap::new();
    for (_, starts, i) in events {
        let (off, end) = (offsets[i], offsets[i] + buffers[i].size);
        if !starts {
            live.remove(&(off, i));
            continue;
        }
        if let Some((&(_, j), &e)) = live.range(..(off, i)).next_back() {
            if e > off {
                return Err(PlacementError::Overlap { a: j, b: i });
            }
        }
        if let Some((&(o, j), _)) = live.range((off, i)..).next() {
            if o < end {
                return Err(PlacementError::Overlap { a: i, b: j });
            }
        }
        live.insert((off, i), end);
    }
    Ok(height(buffers, offsets))
}

/// The independent parts of `buffers`: groups of indices such that no
/// buffer of one group is live at the same time as one of another, in
/// order of time.
pub(crate) fn components(buffers: &[Buffer]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| (buffers[i].start, buffers[i].end));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut reach = 0u64;
    for i in order {
        let b = buffers[i];
        match out.last_mut() {
            Some(last) if b.start < reach => last.push(i),
            _ => out.push(vec![i]),
        }
        reach = reach.max(b.end);
    }
    out
}

/// The best placement of `buffers` found within `work_budget` conflict
/// checks of exact search: see the module documentation. Buffers of size
/// 0 or with an empty lifetime get offset 0 and take no space.
pub fn solve(buffers: &[Buffer], work_budget: u64) -> Placement {
    let mut offsets = vec![0u64; buffers.len()];
    let (mut best, mut lower) = (0u64, 0u64);
    let mut work = 0u64;
    let real: Vec<usize> = (0..buffers.len())
        .filter(|&i| buffers[i].size > 0 && buffers[i].end > buffers[i].start)
        .collect();
    let kept: Vec<Buffer> = real.iter().map(|&i| buffers[i]).collect();
    for part in components(&kept) {
        let bufs: Vec<Buffer> = part.iter().map(|&i| kept[i]).collect();
        let lb = peak_live(&bufs);
        let mut offs = heuristic(&bufs);
        let mut h = height(&bufs, &offs);
        let mut part_lower = lb;
        if h == lb {
            part_lower = h;
        } else if bufs.len() <= EXACT_MAX_BUFFERS && work < work_budget {
            let r = exact(&bufs, &offs, lb, work_budget - work);
            work += r.work;
            if r.height < h {
                offs = r.offsets;
                h = r.height;
            }
            if r.complete {
                part_lower = h;
            }
        }
        for (k, &i) in part.iter().enumerate() {
            offsets[real[i]] = offs[k];
        }
        best = best.max(h);
        lower = lower.max(part_lower);
    }
    debug_assert_eq!(verify(buffers, &offsets), Ok(best));
    let bound = if best == lower {
        Bound::Exact { bytes: best }
    } else {
        Bound::Heuristic {
            best,
            lower_bound: lower,
        }
    };
    Placement {
        offsets,
        bound,
        peak_live: peak_live(buffers),
        work,
    }
}

/// The buffers of a trace started from `start` (when given): each
/// allocation's request rounded up to [`PLACEMENT_UNIT`], with its
/// lifetime (see the module documentation). Requests of 0 bytes are left
/// out.
pub fn buffers(trace: &Trace, start: Option<&StartState>) -> Vec<Buffer> {
    let round = |bytes: u64| {
        bytes
            .div_ceil(PLACEMENT_UNIT)
            .saturating_mul(PLACEMENT_UNIT)
    };
    let end_of_trace = trace.ops.len() as u64 + 1;
    let mut out = Vec::new();
    // Live allocations: (size, start time).
    let mut live: HashMap<AllocId, (u64, u64)> = HashMap::new();
    if let Some(start) = start {
        for (_, _, block, id) in start.live_blocks() {
            if let Some((size, t)) = live.insert(id, (round(block.requested_size), 0)) {
                out.push(Buffer::new(size, t, 1));
            }
        }
    }
    for (i, op) in trace.ops.iter().enumerate() {
        let now = i as u64 + 1;
        match op {
            Op::Alloc { id, bytes, .. } => {
                if let Some((size, t)) = live.insert(*id, (round(*bytes), now)) {
                    out.push(Buffer::new(size, t, now));
                }
            }
            Op::Free { id } => {
                if let Some((size, t)) = live.remove(id) {
                    out.push(Buffer::new(size, t, now));
                }
            }
            _ => {}
        }
    }
    let mut rest: Vec<(AllocId, (u64, u64))> = live.into_iter().collect();
    rest.sort_unstable_by_key(|(id, (_, t))| (*t, *id));
    for (_, (size, t)) in rest {
        out.push(Buffer::new(size, t, end_of_trace));
    }
    out.retain(|b| b.size > 0 && b.end > b.start);
    out
}

/// The limit of a trace: the least memory any allocator that cannot move
/// allocations could use for it (the JSON `limit` of `reservoir replay` and
/// `reservoir compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Limit {
    /// The peak of the requested bytes live at once (not rounded).
    pub peak_live: u64,
    /// The height of the best placement found, bytes (each request rounded
    /// up to [`PLACEMENT_UNIT`]).
    pub best_placement: u64,
    /// Whether `best_placement` is proven optimal.
    pub exact: bool,
    /// No placement uses fewer bytes: `best_placement` when exact, else the
    /// peak of the rounded live bytes.
    pub lower_bound: u64,
    /// `best_placement - lower_bound` (0 when exact).
    pub gap: u64,
    /// The unit requests are rounded up to, bytes ([`PLACEMENT_UNIT`]).
    pub unit: u64,
    /// Allocations placed.
    pub allocations: u64,
}

/// The [`Limit`] of `trace` (from `start`, when given), with an exact
/// search of at most `work_budget` conflict checks.
pub fn limit(trace: &Trace, start: Option<&StartState>, work_budget: u64) -> Limit {
    let bufs = buffers(trace, start);
    let p = solve(&bufs, work_budget);
    let peak_live = crate::compare::live_peak(trace, start).map_or(0, |(b, _)| b);
    Limit {
        peak_live,
        best_placement: p.bound.best(),
        exact: p.bound.is_exact(),
        lower_bound: p.bound.lower_bound(),
        gap: p.bound.best() - p.bound.lower_bound(),
        unit: PLACEMENT_UNIT,
        allocations: bufs.len() as u64,
    }
}
