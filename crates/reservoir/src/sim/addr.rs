//! The simulated device's address space: which address ranges are taken and
//! where the next mapping goes.
//!
//! The free address space is a set of *gaps* (half-open `[start, end)` ranges,
//! page-aligned). Two structures describe it:
//!
//! * a `BTreeMap` from gap start to gap end, the source of truth, used for
//!   neighbour lookups (merging freed ranges, carving a given range, bumping);
//! * a [`GapIndex`]: a treap keyed by gap start whose nodes also know the
//!   largest gap length in their subtree. It answers "the highest gap at least
//!   `len` long" in O(log n) expected time, which is what Linux's top-down
//!   `mmap` placement needs (Linux itself keeps the same augmentation on its
//!   VMA tree).
//!
//! The whole 64-bit space (minus the first and last page) is free at the start,
//! cut into three zones at the two *barriers* `low` and `high`: below `low`,
//! the placement window `[low, high)`, and above `high`. Gaps never merge across
//! a barrier, so every gap lies in one zone. Only gaps of the window are in the
//! index: top-down and bump placement stay inside the window, while a scripted
//! (recorded) address may be anywhere that is free.

use std::collections::BTreeMap;

/// Index of "no node" in the treap arena.
const NIL: u32 = u32::MAX;

/// One treap node: a gap starting at `key`, `len` bytes long.
#[derive(Clone, Debug)]
struct Node {
    key: u64,
    len: u64,
    /// Largest `len` in the subtree rooted here.
    max: u64,
    prio: u64,
    left: u32,
    right: u32,
}

/// A treap of gaps keyed by start address, augmented with the largest gap
/// length of each subtree. Nodes live in an arena (`Vec`) and refer to each
/// other by index, so the structure is safe code with no allocation per
/// operation once warmed up. Priorities come from a fixed xorshift sequence:
/// the shape, and so every answer, is deterministic.
#[derive(Clone, Debug)]
pub(crate) struct GapIndex {
    nodes: Vec<Node>,
    free: Vec<u32>,
    root: u32,
    rng: u64,
}

impl GapIndex {
    fn new() -> Self {
        GapIndex {
            nodes: Vec::new(),
            free: Vec::new(),
            root: NIL,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    fn next_prio(&mut self) -> u64 {
        // xorshift64
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    fn max_of(&self, t: u32) -> u64 {
        if t == NIL {
            0
        } else {
            self.nodes[t as usize].max
        }
    }

    fn update(&mut self, t: u32) {
        let n = &self.nodes[t as usize];
        let m = n.len.max(self.max_of(n.left)).max(self.max_of(n.right));
        self.nodes[t as usize].max = m;
    }

    /// Split `t` into (keys < key, keys >= key).
    fn split(&mut self, t: u32, key: u64) -> (u32, u32) {
        if t == NIL {
            return (NIL, NIL);
        }
        if self.nodes[t as usize].key < key {
            let (a, b) = self.split(self.nodes[t as usize].right, key);
            self.nodes[t as usize].right = a;
            self.update(t);
            (t, b)
        } else {
            let (a, b) = self.split(self.nodes[t as usize].left, key);
            self.nodes[t as usize].left = b;
            self.update(t);
            (a, t)
        }
    }

    /// Merge two treaps where every key of `a` is below every key of `b`.
    fn merge(&mut self, a: u32, b: u32) -> u32 {
        if a == NIL {
            return b;
        }
        if b == NIL {
            return a;
        }
        if self.nodes[a as usize].prio > self.nodes[b as usize].prio {
            let r = self.merge(self.nodes[a as usize].right, b);
            self.nodes[a as usize].right = r;
            self.update(a);
            a
        } else {
            let l = self.merge(a, self.nodes[b as usize].left);
            self.nodes[b as usize].left = l;
            self.update(b);
            b
        }
    }

    fn insert(&mut self, key: u64, len: u64) {
        let prio = self.next_prio();
        let node = Node {
            key,
            len,
            max: len,
            prio,
            left: NIL,
            right: NIL,
        };
        let n = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                u32::try_from(self.nodes.len() - 1).expect("gap index overflow")
            }
        };
        let (a, b) = self.split(self.root, key);
        let a = self.merge(a, n);
        self.root = self.merge(a, b);
    }

    /// Give the gap at `key` (present) the start `new_key` and the length
    /// `len` in place: one descent, fixing the subtree maxima on the way
    /// back, instead of a removal and an insertion. No other gap may start
    /// between `key` and `new_key` (the order of the keys stays the same).
    fn reshape(&mut self, key: u64, new_key: u64, len: u64) {
        self.reshape_at(self.root, key, new_key, len);
    }

    fn reshape_at(&mut self, t: u32, key: u64, new_key: u64, len: u64) {
        debug_assert!(t != NIL, "gap index: resizing an absent key {key:#x}");
        if t == NIL {
            return;
        }
        let n = &mut self.nodes[t as usize];
        if key < n.key {
            let l = n.left;
            self.reshape_at(l, key, new_key, len);
        } else if key > n.key {
            let r = n.right;
            self.reshape_at(r, key, new_key, len);
        } else {
            n.key = new_key;
            n.len = len;
        }
        self.update(t);
    }

    fn remove(&mut self, key: u64) {
        let (a, b) = self.split(self.root, key);
        let (m, c) = self.split(b, key.saturating_add(1));
        debug_assert!(m != NIL, "gap index: removing an absent key {key:#x}");
        if m != NIL {
            debug_assert!(
                self.nodes[m as usize].left == NIL && self.nodes[m as usize].right == NIL
            );
            self.free.push(m);
        }
        self.root = self.merge(a, c);
    }

    /// The gap with the highest start among those at least `need` long.
    fn highest_fit(&self, need: u64) -> Option<(u64, u64)> {
        let mut t = self.root;
        if t == NIL || self.max_of(t) < need {
            return None;
        }
        loop {
            let n = &self.nodes[t as usize];
            if self.max_of(n.right) >= need {
                t = n.right;
            } else if n.len >= need {
                return Some((n.key, n.len));
            } else {
                // The subtree maximum is >= need, so the left side has it.
                t = n.left;
            }
        }
    }

    #[cfg(test)]
    fn in_order(&self, t: u32, out: &mut Vec<(u64, u64)>) {
        if t == NIL {
            return;
        }
        let n = &self.nodes[t as usize];
        self.in_order(n.left, out);
        out.push((n.key, n.len));
        self.in_order(n.right, out);
    }

    #[cfg(test)]
    fn check_max(&self, t: u32) -> u64 {
        if t == NIL {
            return 0;
        }
        let n = &self.nodes[t as usize];
        let m = n
            .len
            .max(self.check_max(n.left))
            .max(self.check_max(n.right));
        assert_eq!(m, n.max, "stale subtree maximum");
        m
    }
}

/// Round `x` up to a multiple of `g` (`g` > 0), saturating.
pub(crate) fn round_up(x: u64, g: u64) -> u64 {
    match x % g {
        0 => x,
        r => x.saturating_add(g - r),
    }
}

/// The free/taken state of the simulated device's address space.
#[derive(Clone, Debug)]
pub(crate) struct AddressSpace {
    page: u64,
    low: u64,
    high: u64,
    /// Exclusive end of the usable space.
    end: u64,
    /// Every gap: start -> end.
    gaps: BTreeMap<u64, u64>,
    /// Gaps inside `[low, high)`, for top-down placement.
    index: GapIndex,
    /// Next address of bump-up placement.
    bump: u64,
}

impl AddressSpace {
    /// A fully free space with placement window `[low, high)`. `page` is a power
    /// of two; `low` and `high` are page-aligned with `page <= low < high`.
    pub(crate) fn new(page: u64, low: u64, high: u64) -> Self {
        debug_assert!(page.is_power_of_two());
        let end = !(page - 1); // u64::MAX rounded down to a page
        debug_assert!(page <= low && low < high && high <= end);
        let mut s = AddressSpace {
            page,
            low,
            high,
            end,
            gaps: BTreeMap::new(),
            index: GapIndex::new(),
            bump: low,
        };
        for (a, b) in [(page, low), (low, high), (high, end)] {
            if a < b {
                s.add_gap(a, b);
            }
        }
        s
    }

    /// The page size every range is aligned to.
    pub(crate) fn page(&self) -> u64 {
        self.page
    }

    fn in_window(&self, start: u64) -> bool {
        start >= self.low && start < self.high
    }

    fn is_barrier(&self, x: u64) -> bool {
        x == self.low || x == self.high
    }

    fn add_gap(&mut self, start: u64, end: u64) {
        debug_assert!(start < end);
        self.gaps.insert(start, end);
        if self.in_window(start) {
            self.index.insert(start, end - start);
        }
    }

    fn remove_gap(&mut self, start: u64) -> u64 {
        let end = self.gaps.remove(&start).expect("removing an absent gap");
        if self.in_window(start) {
            self.index.remove(start);
        }
        end
    }

    /// Move the end of the gap starting at `start` (present) to `end`, in
    /// place.
    fn set_gap_end(&mut self, start: u64, end: u64) {
        debug_assert!(start < end);
        *self.gaps.get_mut(&start).expect("resizing an absent gap") = end;
        if self.in_window(start) {
            self.index.reshape(start, start, end - start);
        }
    }

    /// Move the start of the gap `[start, end)` (present) up to `new_start`
    /// (inside it, so it stays in its zone and before the next gap).
    fn set_gap_start(&mut self, start: u64, new_start: u64, end: u64) {
        debug_assert!(start < new_start && new_start < end);
        self.gaps.remove(&start);
        self.gaps.insert(new_start, end);
        if self.in_window(start) {
            self.index.reshape(start, new_start, end - new_start);
        }
    }

    /// Linux-style top-down placement: the highest gap of the window that can
    /// hold `len` bytes (a page multiple), with the range at the top of it.
    pub(crate) fn take_top_down(&mut self, len: u64) -> Option<u64> {
        debug_assert!(len > 0 && len % self.page == 0);
        let (start, glen) = self.index.highest_fit(len)?;
        let end = start + glen;
        let a = end - len;
        if a > start {
            self.set_gap_end(start, a);
        } else {
            self.remove_gap(start);
        }
        Some(a)
    }

    /// Bump-up placement: the lowest free range of `len` bytes at or above the
    /// bump pointer, inside the window. Addresses below the pointer are never
    /// handed out again.
    pub(crate) fn take_bump(&mut self, len: u64) -> Option<u64> {
        debug_assert!(len > 0 && len % self.page == 0);
        let cur = self.bump.max(self.low);
        let mut found = None;
        let first = self
            .gaps
            .range(..=cur)
            .next_back()
            .filter(|&(_, &e)| e > cur)
            .map(|(&s, &e)| (s, e));
        let rest = self
            .gaps
            .range(cur.saturating_add(1)..self.high)
            .map(|(&s, &e)| (s, e));
        for (s, e) in first.into_iter().chain(rest) {
            let a = s.max(cur);
            let e = e.min(self.high);
            if e > a && e - a >= len {
                found = Some(a);
                break;
            }
        }
        let a = found?;
        let taken = self.take_exact(a, a + len);
        debug_assert!(taken);
        self.bump = a + len;
        Some(a)
    }

    /// Take exactly `[a, b)` if all of it is free (it may span gaps of
    /// different zones). Returns false, changing nothing, otherwise.
    pub(crate) fn take_exact(&mut self, a: u64, b: u64) -> bool {
        if a >= b || a < self.page || b > self.end {
            return false;
        }
        let Some((&first_s, &first_e)) = self.gaps.range(..=a).next_back() else {
            return false;
        };
        if first_e <= a {
            return false;
        }
        if b <= first_e {
            // Inside one gap: reshape it in place.
            match (first_s < a, b < first_e) {
                (true, true) => {
                    self.set_gap_end(first_s, a);
                    self.add_gap(b, first_e);
                }
                (true, false) => self.set_gap_end(first_s, a),
                (false, true) => self.set_gap_start(first_s, b, first_e),
                (false, false) => {
                    self.remove_gap(first_s);
                }
            }
            return true;
        }
        // Walk the contiguous gaps that cover [a, b), then remove them.
        let mut covered = first_e;
        while covered < b {
            match self.gaps.get(&covered) {
                Some(&e) => covered = e,
                None => return false,
            }
        }
        let last_e = covered;
        let mut s = first_s;
        while s < last_e {
            s = self.remove_gap(s);
        }
        if first_s < a {
            self.add_gap(first_s, a);
        }
        if b < last_e {
            self.add_gap(b, last_e);
        }
        true
    }

    /// Give `[a, b)` back (it must be taken), merging it with neighbouring
    /// gaps of the same zone.
    pub(crate) fn give(&mut self, a: u64, b: u64) {
        debug_assert!(a < b);
        // Split at barriers so that no gap straddles one.
        for x in [self.low, self.high] {
            if a < x && x < b {
                self.give(a, x);
                self.give(x, b);
                return;
            }
        }
        debug_assert!(
            self.gaps
                .range(..b)
                .next_back()
                .map_or(true, |(_, &e)| e <= a),
            "giving back a range that is partly free"
        );
        let prev = if self.is_barrier(a) {
            None
        } else {
            self.gaps
                .range(..a)
                .next_back()
                .filter(|&(_, &pe)| pe == a)
                .map(|(&ps, _)| ps)
        };
        let mut e = b;
        if !self.is_barrier(b) {
            if let Some(&ne) = self.gaps.get(&b) {
                self.remove_gap(b);
                e = ne;
            }
        }
        match prev {
            // The gap before grows over the range (and the gap after) in place.
            Some(ps) => self.set_gap_end(ps, e),
            None => self.add_gap(a, e),
        }
    }

    /// Check every internal invariant (tests only).
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut prev_end = 0;
        let mut window = Vec::new();
        for (&s, &e) in &self.gaps {
            assert!(s < e, "empty gap");
            assert!(s >= prev_end, "overlapping gaps");
            assert!(
                s > prev_end || prev_end == 0 || self.is_barrier(s),
                "unmerged adjacent gaps at {s:#x}"
            );
            assert_eq!(s % self.page, 0);
            assert_eq!(e % self.page, 0);
            for x in [self.low, self.high] {
                assert!(!(s < x && x < e), "gap straddles a barrier");
            }
            if self.in_window(s) {
                window.push((s, e - s));
            }
            prev_end = e;
        }
        let mut idx = Vec::new();
        self.index.in_order(self.index.root, &mut idx);
        assert_eq!(idx, window, "gap index out of sync");
        self.index.check_max(self.index.root);
    }

    /// Total free bytes (tests only).
    #[cfg(test)]
    pub(crate) fn free_bytes(&self) -> u64 {
        self.gaps.iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 4096;

    #[test]
    fn top_down_and_merge() {
        let mut s = AddressSpace::new(P, 0x10_0000, 0x100_0000);
        let a = s.take_top_down(P).unwrap();
        assert_eq!(a, 0x100_0000 - P);
        let b = s.take_top_down(2 * P).unwrap();
        assert_eq!(b, a - 2 * P);
        let c = s.take_top_down(P).unwrap();
        assert_eq!(c, b - P);
        s.give(b, b + 2 * P);
        s.check();
        // A one-page request goes to the top of the hole.
        assert_eq!(s.take_top_down(P).unwrap(), b + P);
        s.give(b + P, b + 2 * P);
        s.give(a, a + P);
        s.check();
        // The hole and the top merged: a three-page request fits at the top.
        assert_eq!(s.take_top_down(3 * P).unwrap(), 0x100_0000 - 3 * P);
        s.check();
    }

    #[test]
    fn exact_across_barrier_and_back() {
        let mut s = AddressSpace::new(P, 0x10_0000, 0x100_0000);
        let total = s.free_bytes();
        assert!(s.take_exact(0x100_0000 - P, 0x100_0000 + P));
        assert!(!s.take_exact(0x100_0000, 0x100_0000 + P));
        s.check();
        s.give(0x100_0000 - P, 0x100_0000 + P);
        s.check();
        assert_eq!(s.free_bytes(), total);
        assert!(!s.take_exact(0, P));
    }

    #[test]
    fn bump_never_reuses() {
        let mut s = AddressSpace::new(P, 0x10_0000, 0x100_0000);
        let a = s.take_bump(P).unwrap();
        assert_eq!(a, 0x10_0000);
        s.give(a, a + P);
        let b = s.take_bump(P).unwrap();
        assert_eq!(b, a + P);
        // A taken range above the pointer is skipped.
        assert!(s.take_exact(b + P, b + 3 * P));
        assert_eq!(s.take_bump(2 * P).unwrap(), b + 3 * P);
        s.check();
    }

    /// Scripted placements (`take_exact` anywhere, in or out of the window,
    /// inside gaps, at their ends, across a barrier) and returns in any
    /// order keep the gaps, the index and the free bytes consistent.
    #[test]
    fn exact_takes_and_gives_stay_consistent() {
        let (low, high) = (0x10_0000, 0x100_0000);
        let mut s = AddressSpace::new(P, low, high);
        let total = s.free_bytes();
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut rng = crate::rng::SplitMix64::new(0x2545_f491_4f6c_dd1d);
        for i in 0..4000 {
            let x = rng.next_u64();
            if live.is_empty() || x % 3 != 0 {
                let len = (1 + x % 8) * P;
                let a = P * (1 + (x >> 16) % (2 * high / P));
                let free = s.gaps.range(..=a).next_back().is_some_and(|(_, &e)| e > a)
                    && live.iter().all(|&(b, l)| a + len <= b || b + l <= a);
                assert_eq!(s.take_exact(a, a + len), free, "take {a:#x}+{len:#x}");
                if free {
                    live.push((a, len));
                }
            } else {
                let (a, len) = live.swap_remove((x >> 8) as usize % live.len());
                s.give(a, a + len);
            }
            if i % 53 == 0 {
                s.check();
                let taken: u64 = live.iter().map(|l| l.1).sum();
                assert_eq!(s.free_bytes() + taken, total);
            }
        }
        for (a, len) in live.drain(..) {
            s.give(a, a + len);
        }
        s.check();
        assert_eq!(s.free_bytes(), total);
        assert_eq!(s.gaps.len(), 3);
    }

    #[test]
    fn treap_matches_linear_scan() {
        let mut s = AddressSpace::new(P, 0x1000_0000, 0x1_0000_0000);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut x: u64 = 88172645463325252;
        for i in 0..4000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if live.is_empty() || x % 3 != 0 {
                let len = (1 + x % 64) * P;
                // Expected answer by linear scan of window gaps.
                let expect = s
                    .gaps
                    .iter()
                    .filter(|(&st, &e)| s.in_window(st) && e - st >= len)
                    .map(|(_, &e)| e - len)
                    .max();
                let got = s.take_top_down(len);
                assert_eq!(got, expect);
                live.push((got.unwrap(), len));
            } else {
                let (a, len) = live.swap_remove((x >> 8) as usize % live.len());
                s.give(a, a + len);
            }
            if i % 97 == 0 {
                s.check();
            }
        }
        s.check();
    }
}
