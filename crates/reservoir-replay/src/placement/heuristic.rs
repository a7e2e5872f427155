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
    /// Per node (heap order, root 1): placed buffers by (start rank, index)
    /// and by (end rank, index).
    by_start: Vec<BTreeSet<(usize, usize)>>,
    by_end: Vec<BTreeSet<(usize, usize)>>,
    /// Per node: buffers stored in its subtree (empty subtrees are skipped).
    count: Vec<u32>,
}

impl LifetimeTree {
    fn new(buffers: &[Buffer]) -> Self {
        let mut times: Vec<u64> = buffers.iter().flat_map(|b| [b.start, b.end]).collect();
        times.sort_unstable();
        times.dedup();
        let nodes = 4 * times.len().max(1);
        LifetimeTree {
            times,
            by_start: vec![BTreeSet::new(); nodes],
            by_end: vec![BTreeSet::new(); nodes],
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
                self.by_start[node].insert((s, i));
                self.by_end[node].insert((e, i));
                return;
            }
        }
    }

    /// Every placed buffer live at some time of `b`'s lifetime.
    fn overlapping(&self, b: &Buffer, out: &mut Vec<usize>) {
        let (s, e) = self.span(b);
        let mut stack = vec![(1usize, 0usize, self.times.len())];
        while let Some((node, lo, hi)) = stack.pop() {
            if node >= self.by_start.len() || self.count[node] == 0 {
                continue;
            }
            let mid = (lo + hi) / 2;
            // Buffers stored here span rank `mid`: [bs, be) with bs <= mid < be.
            if e <= mid {
                // The query ends at or before mid: overlap iff bs < e.
                out.extend(self.by_start[node].range(..(e, 0)).map(|&(_, i)| i));
            } else if s > mid {
                // The query starts after mid: overlap iff be > s.
                out.extend(self.by_end[node].range((s + 1, 0)..).map(|&(_, i)| i));
            } else {
                out.extend(self.by_start[node].iter().map(|&(_, i)| i));
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

/// A placement of `buffers` (every one of size > 0 with a non-empty
/// lifetime): the lowest of greedy placements by decreasing size (first
/// fit and best fit) and by decreasing size x lifetime (first fit).
pub fn heuristic(buffers: &[Buffer]) -> Vec<u64> {
    let n = buffers.len();
    let mut by_size: Vec<usize> = (0..n).collect();
    by_size.sort_by_key(|&i| {
        let b = &buffers[i];
        (
            std::cmp::Reverse(b.size),
            std::cmp::Reverse(b.end - b.start),
            b.start,
            i,
        )
    });
    let mut by_area: Vec<usize> = (0..n).collect();
    by_area.sort_by_key(|&i| {
        let b = &buffers[i];
        (
            std::cmp::Reverse(u128::from(b.size) * u128::from(b.end - b.start)),
            b.start,
            i,
        )
    });
    let candidates = [
        greedy(buffers, &by_size, Fit::First),
        greedy(buffers, &by_size, Fit::Best),
        greedy(buffers, &by_area, Fit::First),
    ];
    candidates
        .into_iter()
        .min_by_key(|o| height(buffers, o))
        .unwrap_or_default()
}
