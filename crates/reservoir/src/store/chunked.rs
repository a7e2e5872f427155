//! A sorted set as a list of short sorted chunks: the big size classes of a
//! [`SizeClassList`](super::SizeClassList).
//!
//! [`Chunks`] keeps its keys in order in chunks of at most [`CHUNK`] keys,
//! with the last key of every chunk in a separate sorted `Vec` (`lasts`).
//! A lookup is a binary search over `lasts` then one inside a chunk; an
//! insertion or a removal moves at most [`CHUNK`] keys, and a chunk that
//! grows past [`CHUNK`] is split in two halves. So the cost per operation
//! is a few compares and a short move at any size, with no tree nodes to
//! allocate or rebalance (a `BTreeSet` costs about 125 instructions per
//! insertion or removal here, see docs/benchmarks-history.md, "Flat free lists").
//!
//! A chunk stores its keys in descending order, so the removal of its
//! smallest key (the best-fit hit in a class of one size) moves nothing.
//!
//! Invariants: every chunk holds between 1 and [`CHUNK`] keys in strictly
//! descending order; every key of `chunks[i]` is below every key of
//! `chunks[i + 1]`; `lasts[i]` is the largest key of `chunks[i]` (its
//! first); `len` is the number of keys.

use std::slice;

/// Most keys in one chunk; a chunk past it is split in two halves.
pub(crate) const CHUNK: usize = 32;
/// A chunk below this many keys is merged with a neighbour when both fit
/// in one chunk.
const MERGE_BELOW: usize = CHUNK / 4;

/// Keys in order, in chunks of at most [`CHUNK`]; see the module docs.
#[derive(Clone, Debug)]
pub(crate) struct Chunks<K> {
    /// Each chunk holds its keys in *descending* order, so that its
    /// smallest key (a best-fit hit) is removed or added at the end of its
    /// `Vec`, where nothing moves.
    chunks: Vec<Vec<K>>,
    /// The largest key of each chunk (its first), in ascending order.
    lasts: Vec<K>,
    len: usize,
}

impl<K: Ord + Copy> Chunks<K> {
    /// The keys of a sorted, duplicate-free `Vec`, chunked.
    pub fn from_sorted(keys: &[K]) -> Chunks<K> {
        debug_assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let half = CHUNK / 2;
        let chunks: Vec<Vec<K>> = keys.chunks(half).map(new_chunk).collect();
        let lasts = chunks.iter().filter_map(|c| c.first().copied()).collect();
        Chunks {
            chunks,
            lasts,
            len: keys.len(),
        }
    }

    /// Every key, in order.
    pub fn to_sorted(&self) -> Vec<K> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter().rev())
            .copied()
            .collect()
    }

    /// Number of keys.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The chunk that holds `key` or would: the first whose last key is at
    /// or after `key` (`chunks.len()` if every key is before `key`).
    #[inline]
    fn chunk_of(&self, key: &K) -> usize {
        self.lasts.partition_point(|l| l < key)
    }

    /// The first key at or after `key`, with its chunk and index there.
    #[inline]
    pub fn first_from(&self, key: &K) -> Option<(K, usize, usize)> {
        // A key at or before the first needs no search.
        if let Some(first) = self.first_found() {
            if *key <= first.0 {
                return Some(first);
            }
        }
        let ci = self.chunk_of(key);
        let chunk = self.chunks.get(ci)?;
        // `lasts[ci] >= key`, so the chunk has a key at or after `key`: the
        // last of the keys that are (descending order).
        let at = at_or_after_descending(chunk, key).checked_sub(1)?;
        Some((chunk[at], ci, at))
    }

    /// The first key with its chunk and index there (for
    /// [`remove_found`](Self::remove_found)).
    #[inline]
    pub fn first_found(&self) -> Option<(K, usize, usize)> {
        let chunk = self.chunks.first()?;
        chunk.last().map(|k| (*k, 0, chunk.len() - 1))
    }

    /// Add a key; false if it was already there.
    #[inline]
    pub fn insert(&mut self, key: K) -> bool {
        let last = self.chunks.len().saturating_sub(1);
        let ci = self.chunk_of(&key).min(last);
        let Some(chunk) = self.chunks.get_mut(ci) else {
            self.chunks.push(new_chunk(&[key]));
            self.lasts.push(key);
            self.len = 1;
            return true;
        };
        let Err(at) = search_descending(chunk, &key) else {
            return false;
        };
        chunk.insert(at, key);
        if at == 0 {
            self.lasts[ci] = key;
        }
        if chunk.len() > CHUNK {
            self.split(ci);
        }
        self.len += 1;
        true
    }

    /// Chunk `ci`, one key past [`CHUNK`], becomes two halves: its smaller
    /// keys stay at `ci`, its larger ones go to a new chunk after it.
    #[cold]
    #[inline(never)]
    fn split(&mut self, ci: usize) {
        let chunk = &mut self.chunks[ci];
        let mut upper = Vec::with_capacity(CHUNK + 1);
        upper.extend(chunk.drain(..chunk.len() / 2));
        let lower_last = *chunk.first().expect("a split chunk keeps keys");
        self.chunks.insert(ci + 1, upper);
        self.lasts.insert(ci, lower_last);
    }

    /// Remove a key; false if it was not there.
    #[inline]
    pub fn remove(&mut self, key: &K) -> bool {
        let ci = self.chunk_of(key);
        let Some(chunk) = self.chunks.get(ci) else {
            return false;
        };
        let Ok(at) = search_descending(chunk, key) else {
            return false;
        };
        self.remove_at(ci, at);
        true
    }

    /// Remove `key` if it is at index `at` of chunk `ci` (where
    /// [`first_from`](Self::first_from) found it); false, and nothing
    /// changed, if it is not there.
    #[inline]
    pub fn remove_found(&mut self, ci: usize, at: usize, key: &K) -> bool {
        match self.chunks.get(ci) {
            Some(chunk) if chunk.get(at) == Some(key) => {
                self.remove_at(ci, at);
                true
            }
            _ => false,
        }
    }

    /// Remove the key at index `at` of chunk `ci` (both in range).
    #[inline]
    fn remove_at(&mut self, ci: usize, at: usize) {
        let chunk = &mut self.chunks[ci];
        if at + 1 == chunk.len() {
            chunk.pop();
        } else {
            chunk.remove(at);
        }
        self.len -= 1;
        if at == 0 {
            match chunk.first() {
                Some(&last) => self.lasts[ci] = last,
                None => {
                    self.chunks.remove(ci);
                    self.lasts.remove(ci);
                    return;
                }
            }
        }
        if chunk.len() < MERGE_BELOW {
            self.merge_small(ci);
        }
    }

    /// Chunk `ci`, below [`MERGE_BELOW`] keys, is merged with the smaller
    /// of its neighbours if both fit in one chunk.
    #[cold]
    #[inline(never)]
    fn merge_small(&mut self, ci: usize) {
        let len_of = |i: usize| self.chunks.get(i).map_or(usize::MAX, Vec::len);
        let prev = ci.checked_sub(1).map_or(usize::MAX, len_of);
        let next = len_of(ci + 1);
        // Merge chunks `lo` and `lo + 1` into `lo`.
        let lo = if prev <= next { ci.wrapping_sub(1) } else { ci };
        if prev.min(next).saturating_add(len_of(ci)) > CHUNK {
            return;
        }
        // Descending: the larger keys (chunk `lo + 1`) come first.
        let mut merged = self.chunks.remove(lo + 1);
        merged.extend_from_slice(&self.chunks[lo]);
        self.chunks[lo] = merged;
        self.lasts.remove(lo);
    }

    /// Does the set hold `key`?
    pub fn contains(&self, key: &K) -> bool {
        self.chunks
            .get(self.chunk_of(key))
            .is_some_and(|c| search_descending(c, key).is_ok())
    }

    /// The keys at or after `key`.
    pub fn from(&self, key: &K) -> ChunkKeys<'_, K> {
        let ci = self.chunk_of(key);
        match self.chunks.get(ci) {
            Some(chunk) => ChunkKeys {
                head: chunk[..at_or_after_descending(chunk, key)].iter(),
                mid: self.chunks[ci + 1..].iter(),
                tail: [].iter(),
            },
            None => ChunkKeys::default(),
        }
    }

    /// The keys strictly before `key`.
    pub fn before(&self, key: &K) -> ChunkKeys<'_, K> {
        let ci = self.chunk_of(key);
        let tail = match self.chunks.get(ci) {
            Some(chunk) => chunk[at_or_after_descending(chunk, key)..].iter(),
            None => [].iter(),
        };
        ChunkKeys {
            head: [].iter(),
            mid: self.chunks[..ci].iter(),
            tail,
        }
    }

    /// Every key.
    pub fn all(&self) -> ChunkKeys<'_, K> {
        ChunkKeys {
            head: [].iter(),
            mid: self.chunks.iter(),
            tail: [].iter(),
        }
    }

    /// Check the invariants (module docs); panics naming the broken one.
    #[cfg(test)]
    pub fn check(&self) {
        assert_eq!(self.chunks.len(), self.lasts.len(), "a last key per chunk");
        for (c, last) in self.chunks.iter().zip(&self.lasts) {
            assert!((1..=CHUNK).contains(&c.len()), "chunk of {} keys", c.len());
            assert!(c.windows(2).all(|w| w[0] > w[1]), "a chunk descends");
            assert!(
                c.first() == Some(last),
                "lasts holds each chunk's largest key"
            );
        }
        let all = self.to_sorted();
        assert!(
            all.windows(2).all(|w| w[0] < w[1]),
            "keys strictly increase"
        );
        assert_eq!(all.len(), self.len, "len counts the keys");
    }
}

/// Where `key` is in `v`, a strictly descending slice: `Ok(index)`, else
/// `Err(index)` where it would go.
#[inline]
pub(crate) fn search_descending<K: Ord>(v: &[K], key: &K) -> Result<usize, usize> {
    let at = v.partition_point(|k| k > key);
    match v.get(at) {
        Some(k) if k == key => Ok(at),
        _ => Err(at),
    }
}

/// How many keys of `v`, a strictly descending slice, are at or after
/// `key`. They come first; the last of them is the first key at or after
/// `key` in ascending order.
#[inline]
pub(crate) fn at_or_after_descending<K: Ord>(v: &[K], key: &K) -> usize {
    v.partition_point(|k| k >= key)
}

/// A chunk of `keys` (ascending) in descending order, with room for
/// [`CHUNK`] keys and the one a split takes away.
fn new_chunk<K: Copy>(keys: &[K]) -> Vec<K> {
    let mut v = Vec::with_capacity(CHUNK + 1);
    v.extend(keys.iter().rev().copied());
    v
}

/// A part of a [`Chunks`] in order, from either end: the rest of a first
/// chunk (`head`), whole chunks (`mid`), the start of a last one (`tail`).
/// Chunks descend, so going forward takes each from its back.
pub(crate) struct ChunkKeys<'a, K> {
    head: slice::Iter<'a, K>,
    mid: slice::Iter<'a, Vec<K>>,
    tail: slice::Iter<'a, K>,
}

impl<K> Default for ChunkKeys<'_, K> {
    fn default() -> Self {
        ChunkKeys {
            head: [].iter(),
            mid: [].iter(),
            tail: [].iter(),
        }
    }
}

impl<'a, K> Iterator for ChunkKeys<'a, K> {
    type Item = &'a K;

    #[inline]
    fn next(&mut self) -> Option<&'a K> {
        loop {
            if let Some(k) = self.head.next_back() {
                return Some(k);
            }
            match self.mid.next() {
                Some(chunk) => self.head = chunk.iter(),
                None => return self.tail.next_back(),
            }
        }
    }
}

impl<'a, K> DoubleEndedIterator for ChunkKeys<'a, K> {
    #[inline]
    fn next_back(&mut self) -> Option<&'a K> {
        loop {
            if let Some(k) = self.tail.next() {
                return Some(k);
            }
            match self.mid.next_back() {
                Some(chunk) => self.tail = chunk.iter(),
                None => return self.head.next(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every query answers what a `BTreeSet` answers, through splits
        /// and merges, and the invariants hold after every operation.
        #[test]
        fn same_answers_as_an_ordered_set(
            start in prop::collection::btree_set(0u32..2000, 0..300),
            ops in prop::collection::vec((0u8..7, 0u32..2000), 1..600),
        ) {
            let v: Vec<u32> = start.iter().copied().collect();
            let mut c = Chunks::from_sorted(&v);
            let mut set = start;
            c.check();
            for (op, k) in ops {
                match op {
                    0..=2 => prop_assert_eq!(c.insert(k), set.insert(k)),
                    3 => prop_assert_eq!(c.remove(&k), set.remove(&k)),
                    4 => {
                        let found = c.first_from(&k);
                        prop_assert_eq!(found.map(|f| f.0), set.range(k..).next().copied());
                        if let Some((hit, ci, at)) = found {
                            prop_assert!(c.remove_found(ci, at, &hit));
                            set.remove(&hit);
                        }
                    }
                    5 => {
                        // The first key is removed where `first_found` says it is.
                        if let Some((first, ci, at)) = c.first_found() {
                            prop_assert!(c.remove_found(ci, at, &first));
                            prop_assert!(set.remove(&first));
                        }
                    }
                    _ => {
                        prop_assert_eq!(c.contains(&k), set.contains(&k));
                        let a: Vec<_> = c.from(&k).take(70).copied().collect();
                        let b: Vec<_> = set.range(k..).take(70).copied().collect();
                        prop_assert_eq!(a, b);
                        let a: Vec<_> = c.before(&k).rev().take(70).copied().collect();
                        let b: Vec<_> = set.range(..k).rev().take(70).copied().collect();
                        prop_assert_eq!(a, b);
                    }
                }
                c.check();
                prop_assert_eq!(c.len(), set.len());
                prop_assert_eq!(c.first_found().map(|f| f.0), set.first().copied());
            }
            prop_assert_eq!(c.to_sorted(), set.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn removing_every_other_key_merges_chunks() {
        let keys: Vec<u32> = (0..1000).collect();
        let mut c = Chunks::from_sorted(&keys);
        for k in (0..1000).step_by(2) {
            assert!(c.remove(&k));
            c.check();
        }
        for k in (1..1000).step_by(4) {
            assert!(c.remove(&k));
            c.check();
        }
        assert_eq!(c.len(), 250);
        assert!(
            c.chunks.len() <= 250 / MERGE_BELOW + 1,
            "{} chunks",
            c.chunks.len()
        );
    }
}
