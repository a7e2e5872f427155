//! The heuristic placement: greedy by size over an interval tree of
//! lifetimes.

use std::collections::BTreeSet;

use super::{height, Buffer};

/// The buffers already placed, by lifetime: a centred interval tree over
/// the compressed times. Each buffer sits in the highest node whose middle
/// time it spans, in two sets ordered by start and by end, so that the
/// buffers live at some time of a query's range are found in O(log n + k).
struct LifetimeTree {
    /// The distinct times, sorted (times are looked up by rank).
    times: Vec<u64>,
    /// Per node (heap order, root 1), once a buffer is stored there: the
    /// placed buffers by (start rank, index) and by (end rank, index).
    nodes: Vec<Option<Box<Stored>>>,
    /// Per node: buffers stored in its subtree (empty subtrees are skipped).
    count: Vec<u32>,
}

/// The buffers stored in a node of a [`LifetimeTree`].
#[derive(Default)]
struct Stored {
    by_start: BTreeSet<(usize, usize)>,
    by_end: BTreeSet<(usize, usize)>,
}

impl LifetimeTree {
    fn new(buffers: &[Buffer]) -> Self {
        let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.start, b.end]).collect();
        times.sort_unstable();
        times.dedup();
        let nodes = 4 * times.len().max(1);
        LifetimeTree {
            times,
            nodes: std::iter::repeat_with(|| None).take(nodes).collect(),
            count: vec![0; nodes],
        }
    }

    fn rank(&self, t: u64) -> usize {
        self.times.partition_point(|&x| x < t)
    }

    /// The ranks a buffer lives at: `[s, e)`.
    fn span(&self, b: &Buffer) -> (usize, usize) {
        (self.rank(b.start), self.rank(b.end))
    }

    fn insert(&mut self, i: usize, b: &Buffer) {
        let (s, e) = self.span(b);
        let (mut node, mut lo, mut hi) = (1usize, 0usize, self.times.len());
        loop {
            self.count[node] += 1;
            let mid = (lo + hi) / 2;
            if e <= mid && hi - lo > 1 {
                node *= 2;
                hi = mid;
            } else if s > mid && hi - lo > 1 {
                node = node * 2 + 1;
                lo = mid;
            } else {
                let stored = self.nodes[node].get_or_insert_with(Box::default);
                stored.by_start.insert((s, i));
                stored.by_end.insert((e, i));
                return;
            }
        }
    }

    /// Every placed buffer live at some time of `b`'s lifetime.
    fn overlapping(&self, b: &Buffer, out: &mut Vec<usize>) {
        let (s, e) = self.span(b);
        let mut stack = vec![(1usize, 0usize, self.times.len())];
        while let Some((node, lo, hi)) = stack.pop() {
            if node >= self.nodes.len() || self.count[node] == 0 {
                continue;
            }
            let mid = (lo + hi) / 2;
            let empty = Stored::default();
            let stored = self.nodes[node].as_deref().unwrap_or(&empty);
            // Buffers stored here span rank `mid`: [bs, be) with bs <= mid < be.
            if e <= mid {
                // The query ends at or before mid: overlap iff bs < e.
                out.extend(stored.by_start.range(..(e, 0)).map(|&(_, i)| i));
            } else if s > mid {
                // The query starts after mid: overlap iff be > s.
                out.extend(stored.by_end.range((s + 1, 0)..).map(|&(_, i)| i));
            } else {
                out.extend(stored.by_start.iter().map(|&(_, i)| i));
            }
            if hi - lo > 1 {
                if s < mid {
                    stack.push((node * 2, lo, mid));
                }
                if e > mid {
                    stack.push((node * 2 + 1, mid, hi));
                }
            }
        }
    }
}

/// Where a buffer goes among the taken address ranges.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// The lowest free address.
    First,
    /// The smallest free gap that holds it (the top if none does).
    Best,
}

/// The lowest (`First`) or tightest (`Best`) offset at which `size` bytes
/// fit among `taken` (address ranges, sorted here).
fn fit_among(taken: &mut [(u64, u64)], size: u64, fit: Fit) -> u64 {
    taken.sort_unstable();
    let mut cur = 0u64;
    let mut best: Option<(u64, u64)> = None; // (gap, offset)
    for &(lo, hi) in taken.iter() {
        if lo >= cur + size {
            let gap = lo - cur;
            if fit == Fit::First {
                return cur;
            }
            if best.map_or(true, |(g, _)| gap < g) {
                best = Some((gap, cur));
            }
        }
        cur = cur.max(hi);
    }
    best.map_or(cur, |(_, o)| o)
}

/// The lowest offset at which `size` bytes fit among `taken` (sorted
/// here).
pub(crate) fn first_fit(taken: &mut [(u64, u64)], size: u64) -> u64 {
    fit_among(taken, size, Fit::First)
}

/// Place the buffers in `order`, each at its `fit` among the placed ones
/// live at the same time.
fn greedy(buffers: &[Buffer], order: &[usize], fit: Fit) -> Vec<u64> {
    let mut tree = LifetimeTree::new(buffers);
    let mut offsets = vec![0u64; buffers.len()];
    let mut near = Vec::new();
    let mut taken = Vec::new();
    for &i in order {
        let b = &buffers[i];
        near.clear();
        tree.overlapping(b, &mut near);
        taken.clear();
        taken.extend(
            near.iter()
                .map(|&j| (offsets[j], offsets[j] + buffers[j].size)),
        );
        offsets[i] = fit_among(&mut taken, b.size, fit);
        tree.insert(i, b);
    }
    offsets
}

/// The pairs of buffers live at the same time (one counted where the
/// other starts), in O(n log n): what a greedy placement by size scans.
pub(crate) fn meeting_pairs(buffers: &[Buffer]) -> u64 {
    let mut starts: Vec<u64> = buffers.iter().map(|b| b.start).collect();
    let mut ends: Vec<u64> = buffers.iter().map(|b| b.end).collect();
    starts.sort_unstable();
    ends.sort_unstable();
    // Each buffer with those started before it and not ended when it
    // starts...
    let before: u64 = buffers
        .iter()
        .map(|b| {
            let started = starts.partition_point(|&s| s < b.start) as u64;
            let ended = ends.partition_point(|&e| e <= b.start) as u64;
            started - ended
        })
        .sum();
    // ... and the pairs that start together.
    let together: u64 = starts
        .chunk_by(|a, b| a == b)
        .map(|g| g.len() as u64 * (g.len() as u64 - 1) / 2)
        .sum();
    before + together
}

/// The meeting pairs (`meeting_pairs`) the greedy orders of
/// [`heuristic`] may scan in all: as many orders run as fit (at least
/// one).
pub const HEURISTIC_PAIRS: u64 = 1_500_000;

/// Above this many meeting pairs, [`heuristic`] places in order of time
/// only (`by_time`, O(n log n)).
pub const ONE_ORDER_PAIRS: u64 = 16_000_000;

/// Place the buffers in order of time as an ideal allocator that knows no
/// future would: each at the smallest free gap that holds it (the lowest
/// such, then the top), with freed ranges merged with their neighbours.
pub(crate) fn by_time(buffers: &[Buffer]) -> Vec<u64> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(buffers.len() * 2);
    for (i, b) in buffers.iter().enumerate() {
        events.push((b.start, true, i));
        events.push((b.end, false, i));
    }
    // At one time, frees (false) first.
    events.sort_unstable();
    let mut offsets = vec![0u64; buffers.len()];
    // Free ranges below the top: by offset (-> size) and by (size, offset).
    let mut by_off: BTreeMap<u64, u64> = BTreeMap::new();
    let mut by_size: BTreeSet<(u64, u64)> = BTreeSet::new();
    let mut top = 0u64;
    for (_, starts, i) in events {
        let size = buffers[i].size;
        if starts {
            if let Some(&(len, off)) = by_size.range((size, 0)..).next() {
                by_size.remove(&(len, off));
                by_off.remove(&off);
                if len > size {
                    by_off.insert(off + size, len - size);
                    by_size.insert((len - size, off + size));
                }
                offsets[i] = off;
            } else {
                offsets[i] = top;
                top += size;
            }
            continue;
        }
        let (mut off, mut len) = (offsets[i], size);
        if let Some((&o, &l)) = by_off.range(..off).next_back() {
            if o + l == off {
                by_off.remove(&o);
                by_size.remove(&(l, o));
                off = o;
                len += l;
            }
        }
        if let Some(&l) = by_off.get(&(off + len)) {
            by_off.remove(&(off + len));
            by_size.remove(&(l, off + len));
            len += l;
        }
        if off + len == top {
            top = off;
        } else {
            by_off.insert(off, len);
            by_size.insert((len, off));
        }
    }
    offsets
}

/// A placement of `buffers` (every one of size > 0 with a non-empty
/// lifetime): the lowest of the placement in order of time (`by_time`)
/// and greedy placements by decreasing size (first fit, then best fit), by
/// decreasing size x lifetime and by decreasing lifetime (first fit), then
/// up to [`RANDOM_ORDERS`] orders by size perturbed at random (seeded: the
/// answer is deterministic): as many of these orders as keep the pairs
/// scanned within [`HEURISTIC_PAIRS`], at least the first. Above
/// [`ONE_ORDER_PAIRS`] meeting pairs, the placement in order of time only.
pub fn heuristic(buffers: &[Buffer]) -> Vec<u64> {
    let pairs = meeting_pairs(buffers);
    if pairs > ONE_ORDER_PAIRS {
        return by_time(buffers);
    }
    let n = buffers.len();
    let order_by = |key: &dyn Fn(&Buffer) -> (u128, u64, u64)| {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(key(&buffers[i])), i));
        order
    };
    let mut best = by_time(buffers);
    let mut best_h = height(buffers, &best);
    let mut runs = (HEURISTIC_PAIRS / pairs.max(1)).max(1);
    let mut keep = |order: &[usize], fit: Fit| {
        if runs == 0 {
            return;
        }
        runs -= 1;
        let offsets = greedy(buffers, order, fit);
        let h = height(buffers, &offsets);
        if h < best_h {
            best = offsets;
            best_h = h;
        }
    };
    // Decreasing size, then longer lives, then later starts last.
    let by_size = order_by(&|b| (u128::from(b.size), b.end - b.start, u64::MAX - b.start));
    keep(&by_size, Fit::First);
    keep(&by_size, Fit::Best);
    let by_area = order_by(&|b| {
        (
            u128::from(b.size) * u128::from(b.end - b.start),
            u64::MAX - b.start,
            0,
        )
    });
    keep(&by_area, Fit::First);
    let by_life = order_by(&|b| (u128::from(b.end - b.start), b.size, u64::MAX - b.start));
    keep(&by_life, Fit::First);
    // Orders by size perturbed at random (up to x1.5).
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..RANDOM_ORDERS {
        let keys: Vec<u128> = buffers
            .iter()
            .map(|b| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                u128::from(b.size) * u128::from(1024 + seed % 512)
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(keys[i]), i));
        keep(&order, Fit::First);
    }
    best
}

/// The most randomly perturbed orders [`heuristic`] tries.
pub const RANDOM_ORDERS: u64 = 16;
