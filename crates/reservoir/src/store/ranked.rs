//! A class of one size indexed by segment rank: the big one-size classes
//! of a [`SizeClassList`](super::SizeClassList), at a cost that does not
//! grow with the class.
//!
//! Among keys of one size the order is (rank, rest): the caching
//! allocator's segment rank, then the address. [`RankRuns`] keeps a
//! three-level bitmap over ranks ([`RankSet`], 64 ranks a word, fixed
//! depth) and, per rank, the run of its keys in order ([`Run`]: a
//! segment holds few free blocks of one size, so a run is short and
//! usually one key, stored inline). Taking the class's first key is three
//! `trailing_zeros` and a hash lookup; an insertion or a removal is a hash
//! lookup, a step in a short run and at most three bit updates. None of
//! it depends on how many keys the class holds, unlike a search in a
//! sorted layout (a binary search and a move per insertion).
//!
//! Ranks index the bitmap directly, so only ranks below [`RANKS`] fit
//! (segment creation numbers in PyTorch mode); a class whose keys do not
//! all fit, or do not all have one size, is kept as [`Chunks`](super::chunked::Chunks)
//! by its owner. Memory: a bit per rank up to the largest rank in the
//! class (at most 32 KiB), plus a hash entry per run.
//!
//! Invariants: every key has size `size` and rank below [`RANKS`]; `runs`
//! holds a run for exactly the ranks set in `ranks`; each run's keys have
//! its rank and ascend; `len` counts the keys.

use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;

/// Ranks a [`RankSet`] can hold: three levels of 64.
pub(crate) const RANKS: u64 = 1 << 18;

/// A key that orders by size, then by rank, then by the rest.
pub(crate) trait RankedKey: Ord + Copy {
    /// The size (compared first).
    fn size(&self) -> u64;
    /// The rank (compared second).
    fn rank(&self) -> u64;
}

/// A set of ranks below [`RANKS`] as a three-level bitmap. Invariants:
/// bit `r % 64` of `leaves[r / 64]` is set iff `r` is in the set; bit `w %
/// 64` of `mid[w / 64]` iff `leaves[w] != 0`; bit `m` of `top` iff
/// `mid[m] != 0`.
#[derive(Clone, Debug, Default)]
pub(crate) struct RankSet {
    top: u64,
    mid: Vec<u64>,
    leaves: Vec<u64>,
}

impl RankSet {
    /// Add rank `r` (below [`RANKS`]).
    #[inline]
    fn insert(&mut self, r: usize) {
        let w = r / 64;
        if w >= self.leaves.len() {
            self.grow(w);
        }
        self.leaves[w] |= 1 << (r % 64);
        self.mid[w / 64] |= 1 << (w % 64);
        self.top |= 1 << (w / 64);
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, w: usize) {
        self.leaves.resize((w + 1).next_power_of_two(), 0);
        self.mid.resize(self.leaves.len().div_ceil(64), 0);
    }

    /// Remove rank `r`, which is in the set.
    #[inline]
    fn remove(&mut self, r: usize) {
        let w = r / 64;
        self.leaves[w] &= !(1 << (r % 64));
        if self.leaves[w] == 0 {
            self.mid[w / 64] &= !(1 << (w % 64));
            if self.mid[w / 64] == 0 {
                self.top &= !(1 << (w / 64));
            }
        }
    }

    /// The smallest rank.
    #[inline]
    fn first(&self) -> Option<usize> {
        if self.top == 0 {
            return None;
        }
        let m = self.top.trailing_zeros() as usize;
        let w = m * 64 + self.mid[m].trailing_zeros() as usize;
        Some(w * 64 + self.leaves[w].trailing_zeros() as usize)
    }

    /// The smallest rank at or after `r`.
    fn first_at_or_after(&self, r: usize) -> Option<usize> {
        let w = r / 64;
        let bits = self.leaves.get(w)? & (!0u64 << (r % 64));
        if bits != 0 {
            return Some(w * 64 + bits.trailing_zeros() as usize);
        }
        // The first non-empty leaf after `w`.
        let m = w / 64;
        let bits = self.mid[m] & (!0u64).checked_shl(w as u32 % 64 + 1).unwrap_or(0);
        let w = if bits != 0 {
            m * 64 + bits.trailing_zeros() as usize
        } else {
            let tops = self.top & (!0u64).checked_shl(m as u32 + 1).unwrap_or(0);
            if tops == 0 {
                return None;
            }
            let m = tops.trailing_zeros() as usize;
            m * 64 + self.mid[m].trailing_zeros() as usize
        };
        Some(w * 64 + self.leaves[w].trailing_zeros() as usize)
    }
}

/// The keys of one rank, ascending: the first inline (most runs hold one
/// key), the others in `rest`.
#[derive(Clone, Debug)]
struct Run<K> {
    first: K,
    rest: Vec<K>,
}

impl<K: Ord + Copy> Run<K> {
    /// The first key at or after `key`.
    fn first_from(&self, key: &K) -> Option<K> {
        if *key <= self.first {
            return Some(self.first);
        }
        self.rest.iter().find(|k| *k >= key).copied()
    }

    /// Add `key`; false if it was there.
    #[inline]
    fn insert(&mut self, key: K) -> bool {
        if key < self.first {
            self.rest.insert(0, self.first);
            self.first = key;
            return true;
        }
        if key == self.first {
            return false;
        }
        match self.rest.binary_search(&key) {
            Ok(_) => false,
            Err(at) => {
                self.rest.insert(at, key);
                true
            }
        }
    }
}

/// The keys of one size whose ranks are below [`RANKS`]; see the module
/// docs.
#[derive(Clone, Debug)]
pub(crate) struct RankRuns<K> {
    size: u64,
    ranks: RankSet,
    runs: HashMap<u64, Run<K>, FxBuildHasher>,
    len: usize,
}

impl<K: RankedKey> RankRuns<K> {
    /// The keys of `ascending` (sorted, distinct), if they all have one
    /// size and a rank below [`RANKS`].
    pub fn from_sorted(ascending: &[K]) -> Option<RankRuns<K>> {
        let first = ascending.first()?;
        let mut r = RankRuns {
            size: first.size(),
            ranks: RankSet::default(),
            runs: HashMap::with_capacity_and_hasher(ascending.len(), FxBuildHasher),
            len: 0,
        };
        for k in ascending {
            if !r.fits(k) {
                return None;
            }
            r.insert(*k);
        }
        Some(r)
    }

    /// Can the class take `key` (its size, a rank below [`RANKS`])?
    #[inline]
    pub fn fits(&self, key: &K) -> bool {
        key.size() == self.size && key.rank() < RANKS
    }

    /// Number of keys.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Add `key`, which [`fits`](Self::fits); false if it was there.
    #[inline]
    pub fn insert(&mut self, key: K) -> bool {
        let rank = key.rank();
        let inserted = match self.runs.entry(rank) {
            hashbrown::hash_map::Entry::Occupied(mut run) => run.get_mut().insert(key),
            hashbrown::hash_map::Entry::Vacant(v) => {
                v.insert(Run {
                    first: key,
                    rest: Vec::new(),
                });
                self.ranks.insert(rank as usize);
                true
            }
        };
        self.len += usize::from(inserted);
        inserted
    }

    /// Remove `key`; false if it was not there.
    #[inline]
    pub fn remove(&mut self, key: &K) -> bool {
        let rank = key.rank();
        let hashbrown::hash_map::Entry::Occupied(mut entry) = self.runs.entry(rank) else {
            return false;
        };
        let run = entry.get_mut();
        if run.first == *key {
            if run.rest.is_empty() {
                // One lookup for the whole removal.
                entry.remove();
                self.ranks.remove(rank as usize);
            } else {
                run.first = run.rest.remove(0);
            }
        } else {
            match run.rest.binary_search(key) {
                Ok(at) => {
                    run.rest.remove(at);
                }
                Err(_) => return false,
            }
        }
        self.len -= 1;
        true
    }

    /// Does the class hold `key`?
    pub fn contains(&self, key: &K) -> bool {
        self.runs
            .get(&key.rank())
            .is_some_and(|run| run.first == *key || run.rest.binary_search(key).is_ok())
    }

    /// The smallest key.
    #[inline]
    pub fn first(&self) -> Option<K> {
        let rank = self.ranks.first()?;
        self.runs.get(&(rank as u64)).map(|run| run.first)
    }

    /// The first key at or after `key`. (It repeats the start of
    /// [`keys_from`](Self::keys_from) on purpose: it is on the best-fit path,
    /// and a helper shared by both, returning where to start, cost 12
    /// instructions per 1 KiB pair in `tools/icount.sh`, measured.)
    #[inline]
    pub fn first_from(&self, key: &K) -> Option<K> {
        if key.size() != self.size {
            // Smaller: every key is after it; larger: every key before.
            return if key.size() < self.size {
                self.first()
            } else {
                None
            };
        }
        let rank = key.rank();
        if rank >= RANKS {
            return None;
        }
        if let Some(k) = self.runs.get(&rank).and_then(|run| run.first_from(key)) {
            return Some(k);
        }
        let next = self.ranks.first_at_or_after(rank as usize + 1)?;
        self.runs.get(&(next as u64)).map(|run| run.first)
    }

    /// Every key, ascending.
    pub fn sorted(&self) -> Vec<K> {
        self.keys_from(None).collect()
    }

    /// The keys at or after `key` (every key for `None`), ascending, walked
    /// one at a time: a cursor that takes a few keys costs a few steps,
    /// not a copy of the class.
    pub fn keys_from(&self, key: Option<&K>) -> RankedKeys<'_, K> {
        let start = |rank: Option<usize>| RankedKeys {
            class: self,
            rank,
            index: 0,
        };
        let Some(key) = key else {
            return start(self.ranks.first());
        };
        if key.size() != self.size {
            // Smaller: every key is after it; larger: every key before.
            return start(if key.size() < self.size {
                self.ranks.first()
            } else {
                None
            });
        }
        let rank = key.rank();
        if rank >= RANKS {
            return start(None);
        }
        if let Some(run) = self.runs.get(&rank) {
            if *key <= run.first {
                return start(Some(rank as usize));
            }
            let at = run.rest.partition_point(|k| k < key);
            if at < run.rest.len() {
                return RankedKeys {
                    index: at + 1,
                    ..start(Some(rank as usize))
                };
            }
        }
        start(self.ranks.first_at_or_after(rank as usize + 1))
    }

    /// Check the invariants (module docs); panics naming the broken one.
    #[cfg(test)]
    pub fn check(&self) {
        let mut len = 0;
        for (&rank, run) in &self.runs {
            assert!(rank < RANKS, "rank {rank} below RANKS");
            let r = rank as usize;
            assert!(
                self.ranks.leaves[r / 64] & (1 << (r % 64)) != 0,
                "rank {rank} is in the bitmap"
            );
            let keys: Vec<K> = std::iter::once(run.first)
                .chain(run.rest.iter().copied())
                .collect();
            assert!(keys.windows(2).all(|w| w[0] < w[1]), "a run ascends");
            for k in &keys {
                assert_eq!((k.size(), k.rank()), (self.size, rank), "a key in its run");
            }
            len += keys.len();
        }
        let set: usize = self
            .ranks
            .leaves
            .iter()
            .map(|w| w.count_ones() as usize)
            .sum();
        assert_eq!(set, self.runs.len(), "a bit per run");
        for (w, leaf) in self.ranks.leaves.iter().enumerate() {
            let m = self.ranks.mid[w / 64] & (1 << (w % 64)) != 0;
            assert_eq!(m, *leaf != 0, "mid bit of leaf {w}");
        }
        for (m, mid) in self.ranks.mid.iter().enumerate() {
            assert_eq!(self.ranks.top & (1 << m) != 0, *mid != 0, "top bit {m}");
        }
        assert_eq!(len, self.len, "len counts the keys");
    }
}

/// The keys of a [`RankRuns`] from a position on, ascending
/// ([`RankRuns::keys_from`]).
#[derive(Clone, Debug)]
pub(crate) struct RankedKeys<'a, K> {
    class: &'a RankRuns<K>,
    /// The rank of the next key; `None` when the walk is over.
    rank: Option<usize>,
    /// The next key's place in its run: 0 for `first`, `i` for `rest[i - 1]`.
    index: usize,
}

impl<K: RankedKey> Iterator for RankedKeys<'_, K> {
    type Item = K;

    #[inline]
    fn next(&mut self) -> Option<K> {
        let rank = self.rank?;
        let run = &self.class.runs[&(rank as u64)];
        let key = match self.index {
            0 => run.first,
            i => run.rest[i - 1],
        };
        if self.index < run.rest.len() {
            self.index += 1;
        } else {
            self.index = 0;
            self.rank = self.class.ranks.first_at_or_after(rank + 1);
        }
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// (size, rank, rest).
    type Key = (u64, u64, u32);

    impl RankedKey for Key {
        fn size(&self) -> u64 {
            self.0
        }
        fn rank(&self) -> u64 {
            self.1
        }
    }

    #[test]
    fn rank_sets_find_the_next_rank_across_all_levels() {
        let mut s = RankSet::default();
        let ranks = [0usize, 63, 64, 4095, 4096, 70_000, (RANKS - 1) as usize];
        for &r in &ranks {
            s.insert(r);
        }
        assert_eq!(s.first(), Some(0));
        for w in ranks.windows(2) {
            assert_eq!(s.first_at_or_after(w[0] + 1), Some(w[1]), "after {}", w[0]);
        }
        assert_eq!(s.first_at_or_after(RANKS as usize), None);
        for &r in &ranks {
            s.remove(r);
        }
        assert_eq!(s.first(), None);
        assert_eq!((s.top, s.mid.iter().sum::<u64>()), (0, 0));
    }

    proptest! {
        /// Every operation answers what a `BTreeSet` answers, and the
        /// invariants hold after each.
        #[test]
        fn same_answers_as_an_ordered_set(
            ops in prop::collection::vec(
                (
                    0u8..6,
                    prop_oneof![4 => 0u64..300, 1 => 0u64..RANKS + 10],
                    0u32..4,
                ),
                1..800,
            ),
        ) {
            const SIZE: u64 = 4096;
            let mut r = RankRuns::from_sorted(&[(SIZE, 7, 0)]).expect("fits");
            let mut set = BTreeSet::from([(SIZE, 7, 0)]);
            for (op, rank, rest) in ops {
                let k = (SIZE, rank, rest);
                match op {
                    0..=2 => {
                        if r.fits(&k) {
                            prop_assert_eq!(r.insert(k), set.insert(k));
                        }
                    }
                    3 => prop_assert_eq!(r.remove(&k), set.remove(&k)),
                    4 => {
                        prop_assert_eq!(r.contains(&k), set.contains(&k));
                        for search in [k, (SIZE - 1, rank, rest), (SIZE + 1, 0, 0)] {
                            prop_assert_eq!(
                                r.first_from(&search),
                                set.range(search..).next().copied()
                            );
                            prop_assert!(r
                                .keys_from(Some(&search))
                                .take(40)
                                .eq(set.range(search..).take(40).copied()));
                        }
                    }
                    _ => {
                        // Take the first key, as a best-fit hit does.
                        let first = r.first();
                        prop_assert_eq!(first, set.first().copied());
                        if let Some(f) = first {
                            prop_assert!(r.remove(&f));
                            set.remove(&f);
                        }
                    }
                }
                r.check();
                prop_assert_eq!(r.len(), set.len());
            }
            prop_assert_eq!(r.sorted(), set.into_iter().collect::<Vec<_>>());
        }
    }
}
