//! Free lists as size-class bitmaps: exact best fit in one bitmap lookup.
//!
//! [`SizeClassList`] keeps the same total order as a sorted set of keys
//! (a [`FreeList`](super::FreeList)) and answers the same queries (lower
//! bound and everything after it, everything strictly before a key), but
//! instead of one ordered tree it splits the keys by *group* (the caching
//! allocator's stream) and, inside a group, by *size class*: one per 512
//! bytes below 1 MiB (block sizes are multiples of 512, so each of these
//! holds one size: every size a small-pool request rounds to), then 16 per
//! power of two (log-linear, like a float with a 4-bit mantissa), so every
//! size of class `c` is smaller than every size of class `c + 1`.
//! A two-level bitmap per group marks the classes that hold keys; the best
//! fit for `(group, size)` is the first key at or after the lower bound in
//! the size's own class, else the first key of the next non-empty class,
//! found with two `trailing_zeros`. Inside a class the keys stay in their
//! exact order: a sorted `Vec` (binary search; a few dozen keys move on an
//! insert) that past [`PROMOTE`] keys becomes, if they all have one size
//! and small segment ranks, [`RankRuns`] (a bitmap over ranks and a short
//! run per rank: no operation depends on the class's size), else a list of
//! short sorted chunks ([`Chunks`]: no insertion moves more than one
//! chunk). Sorted `Vec`s and chunks store their keys in descending order,
//! so the best-fit hit (a class's smallest key) is taken from the end of a
//! `Vec`, where nothing moves.
//!
//! The order seen through [`from`](SizeClassList::from),
//! [`before`](SizeClassList::before) and [`iter`](SizeClassList::iter) is
//! exactly `K`'s `Ord`, which the key's [`SizeClassed`] projection must
//! respect: keys compare by group first, then by size, then by anything.

use super::chunked::{at_or_after_descending, search_descending, ChunkKeys, Chunks};
use super::ranked::{RankRuns, RankedKey, RankedKeys};

/// Sizes below this (1 MiB, PyTorch's `kSmallSize`: every size a
/// small-pool request rounds to) have a class per 512 bytes: the caching
/// allocator rounds every block to 512 bytes (spec 1.4), so each of these
/// classes holds one size, and a class of many keys becomes [`RankRuns`].
/// Measured (docs/benchmarks-history.md, "Exact classes below 1 MiB"): 2 MiB needs a
/// summary of more than 64 words and costs 10-15 instructions per call.
const EXACT_LIMIT: u64 = 1 << 20;
/// Width of a class below [`EXACT_LIMIT`] (512 bytes, `kMinBlockSize`).
const EXACT_SHIFT: u32 = 9;
/// The classes below [`EXACT_LIMIT`].
const EXACT_CLASSES: usize = (EXACT_LIMIT >> EXACT_SHIFT) as usize;
/// Number of size classes: one per 512 bytes below 1 MiB, then 16 per
/// power of two up to `2^64`.
pub(crate) const CLASSES: usize =
    EXACT_CLASSES + (64 - EXACT_LIMIT.trailing_zeros() as usize) * (1 << SUB_BITS);
const SUB_BITS: u32 = 4;
const WORDS: usize = CLASSES.div_ceil(64);
// The summary bitmap has a bit per word.
const _: () = assert!(WORDS <= 64);
/// A class's sorted `Vec` becomes [`RankRuns`] (one size, small ranks) or
/// [`Chunks`] above this many keys.
pub(crate) const PROMOTE: usize = 64;
/// A class's [`RankRuns`] or [`Chunks`] become a sorted `Vec` again below this
/// many keys.
const DEMOTE: usize = 16;

/// The size class of `size`: monotonic (a larger size never has a smaller
/// class), one per 512 bytes below 1 MiB, then 16 per power of two.
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    if size < EXACT_LIMIT {
        return (size >> EXACT_SHIFT) as usize;
    }
    let e = 63 - size.leading_zeros();
    let mantissa = (size >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let c = EXACT_CLASSES
        + ((e - EXACT_LIMIT.trailing_zeros()) as usize) * (1 << SUB_BITS)
        + mantissa as usize;
    // Always true (`u64::MAX` is in the last class); stated so that indexing
    // a group's classes and bitmap words needs no bounds check.
    c.min(CLASSES - 1)
}

/// A key that orders by (group, size, ...).
pub(crate) trait SizeClassed: Ord + Copy {
    /// The key without its group, as the classes store it: ordered as the
    /// keys are among the keys of one group (fewer bytes to move and to
    /// compare than the whole key).
    type Inner: RankedKey;
    /// The group (compared first by `Ord`).
    fn group(&self) -> u64;
    /// The size (compared second by `Ord`).
    fn size(&self) -> u64;
    /// The key without its group.
    fn inner(&self) -> Self::Inner;
    /// The key of `inner` in group `group`: `k == K::join(k.group(), k.inner())`.
    fn join(group: u64, inner: Self::Inner) -> Self;
}

/// The keys of one size class, in order.
#[derive(Clone, Debug)]
enum Class<K: Ord> {
    /// The keys in *descending* order: the smallest (a best-fit hit) is
    /// removed or added at the end, where nothing moves.
    Sorted(Vec<K>),
    /// Past [`PROMOTE`] keys. (One variant for both layouts keeps the test
    /// for a sorted class, on every call, a single compare.)
    Big(Box<Big<K>>),
}

/// The layouts of a class past [`PROMOTE`] keys.
#[derive(Clone, Debug)]
enum Big<K> {
    /// All of one size, with ranks below [`RANKS`](super::ranked::RANKS).
    Ranked(RankRuns<K>),
    /// Of several sizes or large ranks.
    Chunked(Chunks<K>),
}

impl<K: RankedKey> Big<K> {
    /// The layout for `ascending` (sorted, distinct keys).
    fn from_sorted(ascending: &[K]) -> Big<K> {
        match RankRuns::from_sorted(ascending) {
            Some(r) => Big::Ranked(r),
            None => Big::Chunked(Chunks::from_sorted(ascending)),
        }
    }

    #[inline]
    fn insert(&mut self, key: K) -> bool {
        match self {
            Big::Ranked(r) if r.fits(&key) => r.insert(key),
            Big::Ranked(r) => {
                // A key the ranked layout cannot take: chunks from now on.
                *self = Big::Chunked(Chunks::from_sorted(&r.sorted()));
                self.insert(key)
            }
            Big::Chunked(t) => t.insert(key),
        }
    }

    #[inline]
    fn remove(&mut self, key: &K) -> bool {
        match self {
            Big::Ranked(r) => r.remove(key),
            Big::Chunked(t) => t.remove(key),
        }
    }

    #[inline]
    fn len(&self) -> usize {
        match self {
            Big::Ranked(r) => r.len(),
            Big::Chunked(t) => t.len(),
        }
    }

    /// The first key at or after `key`, with its chunk and index (0 and 0
    /// in the ranked layout, where a removal finds a key by its rank).
    #[inline]
    fn first_from(&self, key: &K) -> Option<(K, usize, usize)> {
        match self {
            Big::Ranked(r) => r.first_from(key).map(|k| (k, 0, 0)),
            Big::Chunked(t) => t.first_from(key),
        }
    }

    /// The first key, with its chunk and index (see [`first_from`](Self::first_from)).
    #[inline]
    fn first_found(&self) -> Option<(K, usize, usize)> {
        match self {
            Big::Ranked(r) => r.first().map(|k| (k, 0, 0)),
            Big::Chunked(t) => t.first_found(),
        }
    }

    fn sorted(&self) -> Vec<K> {
        match self {
            Big::Ranked(r) => r.sorted(),
            Big::Chunked(t) => t.to_sorted(),
        }
    }
}

impl<K: RankedKey> Class<K> {
    #[inline(always)]
    fn insert(&mut self, key: K) -> bool {
        match self {
            Class::Sorted(v) if v.is_empty() => {
                v.push(key);
                true
            }
            Class::Sorted(v) => match search_descending(v, &key) {
                Ok(_) => false,
                Err(at) => {
                    v.insert(at, key);
                    if v.len() > PROMOTE {
                        self.promote();
                    }
                    true
                }
            },
            Class::Big(b) => b.insert(key),
        }
    }

    #[inline(always)]
    fn remove(&mut self, key: &K) -> bool {
        match self {
            // The smallest key (often the only one) needs no search and moves nothing.
            Class::Sorted(v) if v.last() == Some(key) => {
                v.pop();
                true
            }
            Class::Sorted(v) => match search_descending(v, key) {
                Ok(at) => {
                    v.remove(at);
                    true
                }
                Err(_) => false,
            },
            Class::Big(b) => {
                let removed = b.remove(key);
                if b.len() < DEMOTE {
                    self.demote();
                }
                removed
            }
        }
    }

    /// A sorted class past [`PROMOTE`] keys becomes [`RankRuns`] if they
    /// take its keys, else [`Chunks`].
    #[cold]
    #[inline(never)]
    fn promote(&mut self) {
        if let Class::Sorted(v) = self {
            let ascending: Vec<K> = v.iter().rev().copied().collect();
            *self = Class::Big(Box::new(Big::from_sorted(&ascending)));
        }
    }

    /// A big class below [`DEMOTE`] keys becomes a sorted `Vec`.
    #[cold]
    #[inline(never)]
    fn demote(&mut self) {
        if let Class::Big(b) = self {
            let mut descending = b.sorted();
            descending.reverse();
            *self = Class::Sorted(descending);
        }
    }

    fn contains(&self, key: &K) -> bool {
        match self {
            Class::Sorted(v) => search_descending(v, key).is_ok(),
            Class::Big(b) => match &**b {
                Big::Ranked(r) => r.contains(key),
                Big::Chunked(t) => t.contains(key),
            },
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Class::Sorted(v) => v.is_empty(),
            Class::Big(b) => b.len() == 0,
        }
    }

    /// The keys at or after `key` (`from`) or strictly before it (`!from`).
    fn part(&self, key: &K, from: bool) -> Keys<'_, K> {
        match self {
            Class::Sorted(v) => {
                let at = at_or_after_descending(v, key);
                Keys::Slice(if from { &v[..at] } else { &v[at..] }.iter())
            }
            Class::Big(b) => match &**b {
                Big::Ranked(r) if from => Keys::Ranked(r.keys_from(Some(key))),
                Big::Ranked(r) => {
                    // A descending walk (release, OOM paths): the keys
                    // before `key`, copied.
                    let mut v = r.sorted();
                    v.truncate(v.partition_point(|k| k < key));
                    Keys::Sorted(v.into_iter())
                }
                Big::Chunked(t) => Keys::Chunks(if from { t.from(key) } else { t.before(key) }),
            },
        }
    }

    /// Every key, for a walk `forward` (ascending) or back.
    fn all(&self, forward: bool) -> Keys<'_, K> {
        match self {
            Class::Sorted(v) => Keys::Slice(v.iter()),
            Class::Big(b) => match &**b {
                Big::Ranked(r) if forward => Keys::Ranked(r.keys_from(None)),
                Big::Ranked(r) => Keys::Sorted(r.sorted().into_iter()),
                Big::Chunked(t) => Keys::Chunks(t.all()),
            },
        }
    }

    /// Check the class's invariants for class number `c`; panics naming
    /// the broken one.
    #[cfg(test)]
    fn check(&self, c: usize) {
        let keys: Vec<K> = match self {
            Class::Sorted(v) => {
                assert!(v.windows(2).all(|w| w[0] > w[1]), "a sorted class descends");
                assert!(v.len() <= PROMOTE, "a sorted class of {} keys", v.len());
                v.clone()
            }
            Class::Big(b) => {
                match &**b {
                    Big::Ranked(r) => r.check(),
                    Big::Chunked(t) => t.check(),
                }
                assert!(b.len() >= DEMOTE - 1, "a big class of {} keys", b.len());
                b.sorted()
            }
        };
        for k in keys {
            assert_eq!(
                class_of(k.size()),
                c,
                "key of size {} in class {c}",
                k.size()
            );
        }
    }
}

/// The keys of a part of one class.
enum Keys<'a, K> {
    Slice(std::slice::Iter<'a, K>),
    /// A ranked class's keys, ascending, walked forward only (made for
    /// forward walks).
    Ranked(RankedKeys<'a, K>),
    /// A ranked class's keys, copied in ascending order for a walk back.
    Sorted(std::vec::IntoIter<K>),
    Chunks(ChunkKeys<'a, K>),
}

impl<K: RankedKey> Keys<'_, K> {
    /// How many keys are left.
    #[cfg(test)]
    fn count_keys(mut self) -> usize {
        std::iter::from_fn(|| self.step(true)).count()
    }

    #[inline]
    fn step(&mut self, forward: bool) -> Option<K> {
        match (self, forward) {
            // A sorted class descends: forward is from the back.
            (Keys::Slice(s), true) => s.next_back().copied(),
            (Keys::Slice(s), false) => s.next().copied(),
            (Keys::Ranked(r), forward) => {
                debug_assert!(forward, "ranked keys are made for forward walks");
                r.next()
            }
            (Keys::Sorted(s), true) => s.next(),
            (Keys::Sorted(s), false) => s.next_back(),
            (Keys::Chunks(t), true) => t.next().copied(),
            (Keys::Chunks(t), false) => t.next_back().copied(),
        }
    }
}

/// The keys of one group: a class per size range and a bitmap of the
/// non-empty ones. Invariant: bit `c` of `words` is set iff `classes[c]` is
/// non-empty; bit `w` of `summary` is set iff `words[w] != 0`.
#[derive(Clone, Debug)]
struct Group<K: Ord> {
    id: u64,
    words: [u64; WORDS],
    summary: u64,
    classes: Box<[Class<K>; CLASSES]>,
}

impl<K: Ord + Copy> Group<K> {
    fn new(id: u64) -> Group<K> {
        Group {
            id,
            words: [0; WORDS],
            summary: 0,
            // Built on the heap: the array is about 66 KiB.
            classes: (0..CLASSES)
                .map(|_| Class::Sorted(Vec::new()))
                .collect::<Box<[Class<K>]>>()
                .try_into()
                .unwrap_or_else(|_| unreachable!("CLASSES classes")),
        }
    }

    #[inline]
    fn mark(&mut self, c: usize, non_empty: bool) {
        let (w, bit) = (c / 64, 1u64 << (c % 64));
        if non_empty {
            self.words[w] |= bit;
            self.summary |= 1 << w;
        } else {
            self.words[w] &= !bit;
            if self.words[w] == 0 {
                self.summary &= !(1 << w);
            }
        }
    }

    /// The first non-empty class at or after `c`.
    #[inline]
    fn first_at_or_after(&self, c: usize) -> Option<usize> {
        if c >= CLASSES {
            return None;
        }
        let w = c / 64;
        let m = self.words[w] & (!0u64 << (c % 64));
        if m != 0 {
            return Some(w * 64 + m.trailing_zeros() as usize);
        }
        let s = self.summary & (!0u64).checked_shl(w as u32 + 1).unwrap_or(0);
        if s == 0 {
            return None;
        }
        let w = s.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// The last non-empty class strictly before `c`.
    #[inline]
    fn last_before(&self, c: usize) -> Option<usize> {
        if c == 0 {
            return None;
        }
        let c = c - 1;
        let w = c / 64;
        let m = self.words[w] & (!0u64 >> (63 - c % 64));
        if m != 0 {
            return Some(w * 64 + 63 - m.leading_zeros() as usize);
        }
        let s = self.summary & ((1u64 << w) - 1);
        if s == 0 {
            return None;
        }
        let w = 63 - s.leading_zeros() as usize;
        Some(w * 64 + 63 - self.words[w].leading_zeros() as usize)
    }
}

/// Where [`SizeClassList::first_from`] found a key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    group: u32,
    class: u32,
    /// The chunk in a chunked class (0 in a sorted one).
    chunk: u32,
    /// Index in the sorted class or in the chunk.
    index: u32,
}

impl Slot {
    fn new(group: usize, class: usize, chunk: usize, index: usize) -> Slot {
        // Groups, classes, chunks and keys per chunk are far below 2^32.
        Slot {
            group: group as u32,
            class: class as u32,
            chunk: chunk as u32,
            index: index as u32,
        }
    }
}

/// Keys of type `K` in `K`'s order, indexed by group and size class; see
/// the module documentation. Invariant: `groups` is sorted by id with
/// distinct ids; `len` is the number of keys in all classes.
#[derive(Clone)]
pub(crate) struct SizeClassList<K: SizeClassed> {
    groups: Vec<Group<K::Inner>>,
    len: usize,
}

impl<K: SizeClassed> Default for SizeClassList<K> {
    fn default() -> Self {
        SizeClassList {
            groups: Vec::new(),
            len: 0,
        }
    }
}

impl<K: SizeClassed + std::fmt::Debug> std::fmt::Debug for SizeClassList<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<K: SizeClassed> SizeClassList<K> {
    #[inline]
    fn group_index(&self, id: u64) -> Result<usize, usize> {
        // Few groups (streams): a linear scan beats a binary search.
        for (i, g) in self.groups.iter().enumerate() {
            if g.id >= id {
                return if g.id == id { Ok(i) } else { Err(i) };
            }
        }
        Err(self.groups.len())
    }

    /// A new empty group `id` at index `i` (a stream's first free block).
    #[cold]
    #[inline(never)]
    fn add_group(&mut self, i: usize, id: u64) -> usize {
        self.groups.insert(i, Group::new(id));
        i
    }

    /// Add a key; false if it was already there.
    #[inline(always)]
    pub fn insert(&mut self, key: K) -> bool {
        let gi = match self.group_index(key.group()) {
            Ok(i) => i,
            Err(i) => self.add_group(i, key.group()),
        };
        let g = &mut self.groups[gi];
        let c = class_of(key.size());
        let inserted = g.classes[c].insert(key.inner());
        if inserted {
            g.mark(c, true);
            self.len += 1;
        }
        inserted
    }

    /// Remove a key; false if it was not there.
    #[inline(always)]
    pub fn remove(&mut self, key: &K) -> bool {
        let Ok(gi) = self.group_index(key.group()) else {
            return false;
        };
        let g = &mut self.groups[gi];
        let c = class_of(key.size());
        let removed = g.classes[c].remove(&key.inner());
        if removed {
            if g.classes[c].is_empty() {
                g.mark(c, false);
            }
            self.len -= 1;
        }
        removed
    }

    /// Is the key present?
    pub fn contains(&self, key: &K) -> bool {
        match self.group_index(key.group()) {
            Ok(gi) => self.groups[gi].classes[class_of(key.size())].contains(&key.inner()),
            Err(_) => false,
        }
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The keys at or after `key`, in order (a best-fit search).
    #[inline]
    pub fn from(&self, key: &K) -> Cursor<'_, K> {
        let (gi, class, keys) = match self.group_index(key.group()) {
            Ok(gi) => {
                let c = class_of(key.size());
                (
                    gi,
                    c,
                    Some(self.groups[gi].classes[c].part(&key.inner(), true)),
                )
            }
            Err(gi) => (gi, 0, None),
        };
        Cursor {
            list: self,
            group: gi,
            class,
            keys,
            forward: true,
        }
    }

    /// The first key at or after `key`, with where it is, for
    /// [`remove_at`](Self::remove_at): a best-fit hit removed without a
    /// second search.
    #[inline]
    pub fn first_from(&self, key: &K) -> Option<(K, Slot)> {
        let (mut gi, mut from) = match self.group_index(key.group()) {
            Ok(gi) => {
                let c = class_of(key.size());
                let inner = key.inner();
                let hit = match &self.groups[gi].classes[c] {
                    // The class's first key fits when the size is the class's
                    // smallest (always in a class of one size): no search.
                    Class::Sorted(v) => match v.last() {
                        Some(first) if inner <= *first => Some((*first, 0, v.len() - 1)),
                        // An empty class (most exact classes): no search.
                        None => None,
                        Some(_) => {
                            // The last of the keys at or after `inner` (descending).
                            let n = at_or_after_descending(v, &inner);
                            n.checked_sub(1).map(|at| (v[at], 0, at))
                        }
                    },
                    Class::Big(b) => b.first_from(&inner),
                };
                if let Some((k, chunk, index)) = hit {
                    let k = K::join(key.group(), k);
                    return Some((k, Slot::new(gi, c, chunk, index)));
                }
                (gi, c + 1)
            }
            Err(gi) => (gi, 0),
        };
        while let Some(g) = self.groups.get(gi) {
            if let Some(c) = g.first_at_or_after(from) {
                let (k, chunk, index) = match &g.classes[c] {
                    Class::Sorted(v) => (v[v.len() - 1], 0, v.len() - 1),
                    Class::Big(b) => b.first_found().expect("a marked class"),
                };
                return Some((K::join(g.id, k), Slot::new(gi, c, chunk, index)));
            }
            gi += 1;
            from = 0;
        }
        None
    }

    /// Remove `key`, found at `slot` by [`first_from`](Self::first_from)
    /// with no change to the list since (else it is searched for as
    /// [`remove`](Self::remove) does); false if it was not there.
    #[inline]
    pub fn remove_at(&mut self, slot: Slot, key: &K) -> bool {
        let (gi, c, at) = (
            slot.group as usize,
            slot.class as usize,
            slot.index as usize,
        );
        let inner = key.inner();
        // The slot's group index is stale if a group was added or removed
        // since the search; classes store keys without their group.
        let group = self.groups.get_mut(gi).filter(|g| g.id == key.group());
        if let Some(g) = group {
            match g.classes.get_mut(c) {
                Some(Class::Sorted(v)) if v.get(at) == Some(&inner) => {
                    if at + 1 == v.len() {
                        v.pop();
                    } else {
                        v.remove(at);
                    }
                    if v.is_empty() {
                        g.mark(c, false);
                    }
                    self.len -= 1;
                    return true;
                }
                Some(class @ Class::Big(_)) => {
                    if let Class::Big(b) = class {
                        if let Big::Chunked(t) = &mut **b {
                            if t.remove_found(slot.chunk as usize, at, &inner) {
                                // A big class keeps at least `DEMOTE - 1` keys.
                                if t.len() < DEMOTE {
                                    class.demote();
                                }
                                self.len -= 1;
                                return true;
                            }
                        }
                    }
                }
                _ => {}
            }
        }
        self.remove(key)
    }

    /// The keys strictly before `key`, in descending order.
    pub fn before(&self, key: &K) -> Cursor<'_, K> {
        let (gi, class, keys) = match self.group_index(key.group()) {
            Ok(gi) => {
                let c = class_of(key.size());
                (
                    gi,
                    c,
                    Some(self.groups[gi].classes[c].part(&key.inner(), false)),
                )
            }
            // Start after the last class of the group before `gi`.
            Err(gi) => (gi.wrapping_sub(1), CLASSES, None),
        };
        Cursor {
            list: self,
            group: gi,
            class,
            keys,
            forward: false,
        }
    }

    /// Check the invariants (the struct's and each class's); panics naming
    /// the broken one.
    #[cfg(test)]
    pub fn check(&self) {
        assert!(
            self.groups.windows(2).all(|w| w[0].id < w[1].id),
            "groups sorted by id"
        );
        let mut len = 0;
        for g in &self.groups {
            for (c, class) in g.classes.iter().enumerate() {
                class.check(c);
                let marked = g.words[c / 64] & (1 << (c % 64)) != 0;
                assert_eq!(marked, !class.is_empty(), "bit of class {c}");
                len += class.all(true).count_keys();
            }
            for (w, word) in g.words.iter().enumerate() {
                assert_eq!(g.summary & (1 << w) != 0, *word != 0, "summary bit {w}");
            }
        }
        assert_eq!(len, self.len, "len counts the keys");
    }

    /// Every key, in order.
    pub fn iter(&self) -> Cursor<'_, K> {
        Cursor {
            list: self,
            group: 0,
            class: 0,
            keys: self.groups.first().map(|g| g.classes[0].all(true)),
            forward: true,
        }
    }
}

impl<'a, K: SizeClassed> IntoIterator for &'a SizeClassList<K> {
    type Item = K;
    type IntoIter = Cursor<'a, K>;
    fn into_iter(self) -> Cursor<'a, K> {
        self.iter()
    }
}

/// An iterator over a [`SizeClassList`] in `K`'s order (forward) or the
/// reverse: the keys left in the current class, then whole classes found
/// by the bitmap, group after group.
pub(crate) struct Cursor<'a, K: SizeClassed> {
    list: &'a SizeClassList<K>,
    /// Current group index (`usize::MAX` before the first when descending).
    group: usize,
    class: usize,
    keys: Option<Keys<'a, K::Inner>>,
    forward: bool,
}

impl<K: SizeClassed> Iterator for Cursor<'_, K> {
    type Item = K;

    #[inline]
    fn next(&mut self) -> Option<K> {
        loop {
            let g = self.list.groups.get(self.group)?;
            if let Some(keys) = &mut self.keys {
                if let Some(k) = keys.step(self.forward) {
                    return Some(K::join(g.id, k));
                }
            }
            let next = if self.forward {
                // `keys` is None when the cursor starts at a group's class 0.
                let from = if self.keys.is_some() {
                    self.class + 1
                } else {
                    self.class
                };
                g.first_at_or_after(from)
            } else {
                g.last_before(self.class)
            };
            match next {
                Some(c) => {
                    self.class = c;
                    self.keys = Some(g.classes[c].all(self.forward));
                }
                None => {
                    if self.forward {
                        self.group += 1;
                        self.class = 0;
                    } else {
                        self.group = self.group.wrapping_sub(1);
                        self.class = CLASSES;
                    }
                    self.keys = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
