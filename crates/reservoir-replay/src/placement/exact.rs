//! The exact placement: branch and bound over canonical placements.
//!
//! A *canonical* placement puts the buffers one after another, each at the
//! lowest address free among those already placed that live at the same
//! time (first fit). Some order gives an optimal placement: take any
//! optimal one and place its buffers in increasing order of their
//! addresses; by induction each lands at or below its address there (the
//! buffers placed before it that live at the same time ended below its
//! address there, and moved only down), so the height does not grow.
//!
//! The search tries every order, pruned by:
//! * the bound: a partial placement cannot end lower than the highest of
//!   its placed buffers' tops and, for each buffer not placed, its lowest
//!   free address plus its size (it can only go higher); nor lower than
//!   the peak of live bytes;
//! * partial-order reduction: two buffers whose lifetimes do not meet do
//!   not see each other, so placing `a` then `b` gives what `b` then `a`
//!   gives; only the order with the lower index first, when adjacent, is
//!   tried;
//! * the upper bound: the heuristic's height; the search stops as soon as
//!   it meets the lower bound;
//! * a work budget: one unit per placed buffer looked at while finding a
//!   buffer's lowest free address.

use super::heuristic::first_fit;
use super::{height, Buffer};

/// What [`exact`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExactResult {
    /// The best placement found (the heuristic's when none is lower).
    pub offsets: Vec<u64>,
    /// Its height.
    pub height: u64,
    /// The search finished within its budget: `height` is optimal.
    pub complete: bool,
    /// Work spent.
    pub work: u64,
}

struct Search<'a> {
    buffers: &'a [Buffer],
    /// For each buffer, the buffers whose lifetimes meet it.
    near: Vec<Vec<usize>>,
    offsets: Vec<Option<u64>>,
    best: u64,
    best_offsets: Vec<u64>,
    lower: u64,
    work: u64,
    budget: u64,
    out_of_budget: bool,
    taken: Vec<(u64, u64)>,
}

impl Search<'_> {
    /// The lowest free address of unplaced buffer `i` given the placed ones.
    fn lowest(&mut self, i: usize) -> u64 {
        self.taken.clear();
        for &j in &self.near[i] {
            if let Some(o) = self.offsets[j] {
                self.taken.push((o, o + self.buffers[j].size));
            }
        }
        self.work += self.near[i].len() as u64 + 1;
        first_fit(&mut self.taken, self.buffers[i].size)
    }

    /// Whether to stop: the best meets the lower bound, or the budget is
    /// spent.
    fn done(&mut self) -> bool {
        if self.work > self.budget {
            self.out_of_budget = true;
        }
        self.out_of_budget || self.best <= self.lower
    }

    fn dfs(&mut self, placed: usize, top: u64, last: Option<usize>) {
        let n = self.buffers.len();
        if placed == n {
            if top < self.best {
                self.best = top;
                self.best_offsets = self.offsets.iter().map(|o| o.unwrap_or(0)).collect();
            }
            return;
        }
        if self.done() {
            return;
        }
        // Each unplaced buffer's lowest address, and the bound.
        let mut cands: Vec<(u64, usize)> = Vec::with_capacity(n - placed);
        let mut bound = top.max(self.lower);
        for i in 0..n {
            if self.offsets[i].is_none() {
                let o = self.lowest(i);
                bound = bound.max(o + self.buffers[i].size);
                cands.push((o, i));
            }
        }
        if bound >= self.best {
            return;
        }
        // Lowest first, then the largest.
        cands.sort_by_key(|&(o, i)| (o, std::cmp::Reverse(self.buffers[i].size), i));
        for (o, i) in cands {
            if let Some(l) = last {
                if i < l && !self.buffers[i].meets(&self.buffers[l]) {
                    continue;
                }
            }
            let t = top.max(o + self.buffers[i].size);
            if t >= self.best {
                continue;
            }
            self.offsets[i] = Some(o);
            self.dfs(placed + 1, t, Some(i));
            self.offsets[i] = None;
            if self.done() {
                return;
            }
        }
    }
}

/// Search for a placement of `buffers` lower than `start` (a valid
/// placement, e.g. the heuristic's), stopping when one reaches
/// `lower_bound` or after `budget` units of work; see the module
/// documentation.
pub fn exact(buffers: &[Buffer], start: &[u64], lower_bound: u64, budget: u64) -> ExactResult {
    let n = buffers.len();
    let mut near = vec![Vec::new(); n];
    // Pairs whose lifetimes meet, by a sweep in order of start.
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| buffers[i].start);
    let mut active: Vec<usize> = Vec::new();
    let mut work = 0u64;
    for &i in &order {
        active.retain(|&j| buffers[j].end > buffers[i].start);
        work += active.len() as u64 + 1;
        for &j in &active {
            near[i].push(j);
            near[j].push(i);
        }
        active.push(i);
        if work > budget {
            return ExactResult {
                offsets: start.to_vec(),
                height: height(buffers, start),
                complete: false,
                work,
            };
        }
    }
    let mut s = Search {
        buffers,
        near,
        offsets: vec![None; n],
        best: height(buffers, start),
        best_offsets: start.to_vec(),
        lower: lower_bound,
        work,
        budget,
        out_of_budget: false,
        taken: Vec::new(),
    };
    s.dfs(0, 0, None);
    ExactResult {
        height: s.best,
        complete: !s.out_of_budget,
        offsets: s.best_offsets,
        work: s.work,
    }
}
