//! Free lists as size-class bitmaps: exact best fit in one bitmap lookup.
//!
//! [`SizeClassList`] keeps the same total order as a sorted set of keys
//! (a [`FreeList`](super::FreeList)) and answers the same queries (lower
//! bound and everything after it, everything strictly before a key), but
//! instead of one ordered tree it splits the keys by *group* (the caching
//! allocator's stream) and, inside a group, by *size class*: 976 classes,
//! 16 per power of two (log-linear, like a float with a 4-bit mantissa), so
//! every size of class `c` is smaller than every size of class `c + 1`.
//! A two-level bitmap per group marks the classes that hold keys; the best
//! fit for `(group, size)` is the first key at or after the lower bound in
//! the size's own class, else the first key of the next non-empty class,
//! found with two `trailing_zeros`. Inside a class the keys stay in their
//! exact order: a sorted `Vec` (binary search; a few dozen keys move on an
//! insert) that becomes a list of short sorted chunks ([`Chunks`]) past
//! [`PROMOTE`] keys, so no insertion moves more than one chunk however many
//! free blocks share a class. Both store their keys in descending order, so
//! the best-fit hit (a class's smallest key) is taken from the end of a
//! `Vec`, where nothing moves.
//!
//! The order seen through [`from`](SizeClassList::from),
//! [`before`](SizeClassList::before) and [`iter`](SizeClassList::iter) is
//! exactly `K`'s `Ord`, which the key's [`SizeClassed`] projection must
//! respect: keys compare by group first, then by size, then by anything.

use super::chunked::{at_or_after_descending, search_descending, ChunkKeys, Chunks};

/// Number of size classes: sizes below 16 have one class each, then 16
/// classes per power of two up to `2^64`.
pub(crate) const CLASSES: usize = 976;
const SUB_BITS: u32 = 4;
const WORDS: usize = CLASSES.div_ceil(64);
/// A class's sorted `Vec` becomes [`Chunks`] above this many keys.
pub(crate) const PROMOTE: usize = 64;
/// A class's [`Chunks`] become a sorted `Vec` again below this many keys.
const DEMOTE: usize = 16;

/// The size class of `size`: monotonic (a larger size never has a smaller
/// class), exact below 16, then 16 classes per power of two.
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    if size < (1 << SUB_BITS) {
        return size as usize;
    }
    let e = 63 - size.leading_zeros();
    let mantissa = (size >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    let c = ((e - SUB_BITS + 1) as usize) * (1 << SUB_BITS) + mantissa as usize;
    // Always true (`u64::MAX` is in the last class); stated so that indexing
    // a group's classes and bitmap words needs no bounds check.
    c.min(CLASSES - 1)
}

/// A key that orders by (group, size, ...).
pub(crate) trait SizeClassed: Ord + Copy {
    /// The key without its group, as the classes store it: ordered as the
    /// keys are among the keys of one group (fewer bytes to move and to
    /// compare than the whole key).
    type Inner: Ord + Copy;
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
    Chunked(Box<Chunks<K>>),
}

impl<K: Ord + Copy> Class<K> {
    #[inline]
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
            Class::Chunked(t) => t.insert(key),
        }
    }

    #[inline]
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
            Class::Chunked(t) => {
                let removed = t.remove(key);
                if t.len() < DEMOTE {
                    self.demote();
                }
                removed
            }
        }
    }

    /// A sorted class past [`PROMOTE`] keys becomes [`Chunks`].
    #[cold]
    #[inline(never)]
    fn promote(&mut self) {
        if let Class::Sorted(v) = self {
            let ascending: Vec<K> = v.iter().rev().copied().collect();
            *self = Class::Chunked(Box::new(Chunks::from_sorted(&ascending)));
        }
    }

    /// A chunked class below [`DEMOTE`] keys becomes a sorted `Vec`.
    #[cold]
    #[inline(never)]
    fn demote(&mut self) {
        if let Class::Chunked(t) = self {
            let mut descending = t.to_sorted();
            descending.reverse();
            *self = Class::Sorted(descending);
        }
    }

    fn contains(&self, key: &K) -> bool {
        match self {
            Class::Sorted(v) => search_descending(v, key).is_ok(),
            Class::Chunked(t) => t.contains(key),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Class::Sorted(v) => v.is_empty(),
            Class::Chunked(t) => t.len() == 0,
        }
    }

    /// The keys at or after `key` (`from`) or strictly before it (`!from`).
    fn part(&self, key: &K, from: bool) -> Keys<'_, K> {
        match self {
            Class::Sorted(v) => {
                let at = at_or_after_descending(v, key);
                Keys::Slice(if from { &v[..at] } else { &v[at..] }.iter())
            }
            Class::Chunked(t) => Keys::Chunks(if from { t.from(key) } else { t.before(key) }),
        }
    }

    fn all(&self) -> Keys<'_, K> {
        match self {
            Class::Sorted(v) => Keys::Slice(v.iter()),
            Class::Chunked(t) => Keys::Chunks(t.all()),
        }
    }
}

/// The keys of a part of one class.
enum Keys<'a, K> {
    Slice(std::slice::Iter<'a, K>),
    Chunks(ChunkKeys<'a, K>),
}

impl<'a, K> Keys<'a, K> {
    #[inline]
    fn step(&mut self, forward: bool) -> Option<&'a K> {
        match (self, forward) {
            // A sorted class descends: forward is from the back.
            (Keys::Slice(s), true) => s.next_back(),
            (Keys::Slice(s), false) => s.next(),
            (Keys::Chunks(t), true) => t.next(),
            (Keys::Chunks(t), false) => t.next_back(),
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
    summary: u32,
    classes: Box<[Class<K>; CLASSES]>,
}

impl<K: Ord + Copy> Group<K> {
    fn new(id: u64) -> Group<K> {
        Group {
            id,
            words: [0; WORDS],
            summary: 0,
            classes: Box::new(std::array::from_fn(|_| Class::Sorted(Vec::new()))),
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
        let s = self.summary & (!0u32).checked_shl(w as u32 + 1).unwrap_or(0);
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
        let s = self.summary & ((1u32 << w) - 1);
        if s == 0 {
            return None;
        }
        let w = 31 - s.leading_zeros() as usize;
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
    #[inline]
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
    #[inline]
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
                        _ => {
                            // The last of the keys at or after `inner` (descending).
                            let n = at_or_after_descending(v, &inner);
                            n.checked_sub(1).map(|at| (v[at], 0, at))
                        }
                    },
                    Class::Chunked(t) => t.first_from(&inner),
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
                    Class::Chunked(t) => t.first_found().expect("a marked class"),
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
        if let Some(g) = self.groups.get_mut(gi) {
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
                Some(class @ Class::Chunked(_)) => {
                    if let Class::Chunked(t) = class {
                        if t.remove_found(slot.chunk as usize, at, &inner) {
                            // A chunked class keeps at least `DEMOTE - 1` keys.
                            if t.len() < DEMOTE {
                                class.demote();
                            }
                            self.len -= 1;
                            return true;
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

    /// Every key, in order.
    pub fn iter(&self) -> Cursor<'_, K> {
        Cursor {
            list: self,
            group: 0,
            class: 0,
            keys: self.groups.first().map(|g| g.classes[0].all()),
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
                    return Some(K::join(g.id, *k));
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
                    self.keys = Some(g.classes[c].all());
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
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    /// (group, size, tie-break).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    struct Key(u64, u64, u32);

    impl SizeClassed for Key {
        type Inner = (u64, u32);
        fn group(&self) -> u64 {
            self.0
        }
        fn size(&self) -> u64 {
            self.1
        }
        fn inner(&self) -> (u64, u32) {
            (self.1, self.2)
        }
        fn join(group: u64, (size, tie): (u64, u32)) -> Key {
            Key(group, size, tie)
        }
    }

    #[test]
    fn classes_are_monotonic_and_cover_u64() {
        for s in 0..100_000u64 {
            assert!(class_of(s) <= class_of(s + 1), "class_of({s})");
        }
        for e in 1..64u32 {
            let p = 1u64 << e;
            assert!(class_of(p - 1) < class_of(p), "2^{e}");
            assert!(class_of(p) <= class_of(p + p / 3), "2^{e}");
        }
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
    }

    #[test]
    fn a_class_switches_to_chunks_and_back_keeping_order() {
        let mut l = SizeClassList::default();
        assert!(l.first_from(&Key(0, 0, 0)).is_none());
        for i in 0..(PROMOTE as u32 * 3) {
            assert!(l.insert(Key(0, 4096, i * 7 % 1000)));
        }
        assert!(matches!(
            l.groups[0].classes[class_of(4096)],
            Class::Chunked(_)
        ));
        let v: Vec<_> = l.iter().collect();
        assert!(v.windows(2).all(|w| w[0] < w[1]));
        for k in v {
            assert!(l.remove(&k));
        }
        assert_eq!(l.len(), 0);
        assert!(matches!(
            l.groups[0].classes[class_of(4096)],
            Class::Sorted(_)
        ));
        assert!(l.iter().next().is_none());
    }

    proptest! {
        /// Every query answers exactly what a `BTreeSet` answers.
        #[test]
        fn same_answers_as_an_ordered_set(
            ops in prop::collection::vec(
                (0u8..5, 0u64..3, prop_oneof![0u64..40, 0u64..5_000_000, any::<u64>()], 0u32..4),
                1..400,
            )
        ) {
            let mut l = SizeClassList::default();
            let mut set = BTreeSet::new();
            for (op, g, size, tie) in ops {
                let k = Key(g, size, tie);
                match op {
                    0 | 1 => prop_assert_eq!(l.insert(k), set.insert(k)),
                    2 => prop_assert_eq!(l.remove(&k), set.remove(&k)),
                    4 => {
                        let found = l.first_from(&k);
                        let expected = set.range(k..).next().copied();
                        prop_assert_eq!(found.map(|f| f.0), expected);
                        if let Some((hit, slot)) = found {
                            prop_assert!(l.remove_at(slot, &hit));
                            set.remove(&hit);
                        }
                    }
                    _ => {
                        prop_assert_eq!(l.contains(&k), set.contains(&k));
                        let a: Vec<_> = l.from(&k).take(5).collect();
                        let b: Vec<_> = set.range(k..).take(5).copied().collect();
                        prop_assert_eq!(a, b);
                        let a: Vec<_> = l.before(&k).take(5).collect();
                        let b: Vec<_> = set.range(..k).rev().take(5).copied().collect();
                        prop_assert_eq!(a, b);
                    }
                }
                prop_assert_eq!(l.len(), set.len());
            }
            let a: Vec<_> = l.iter().collect();
            let b: Vec<_> = set.iter().copied().collect();
            prop_assert_eq!(a, b);
        }

        /// The same in big classes: hundreds of keys in a few classes of
        /// two groups, so classes become [`Chunks`] (with splits and
        /// merges of their chunks) and sorted again; then every key is
        /// taken out by best-fit searches, as `get_free_block` does.
        #[test]
        fn big_classes_answer_as_an_ordered_set(
            ops in prop::collection::vec(
                (0u8..8, 0u64..2, prop_oneof![3 => 4096u64..4352, 1 => 0u64..20_000], 0u32..64),
                300..2000,
            )
        ) {
            let mut l = SizeClassList::default();
            let mut set = BTreeSet::new();
            for (op, g, size, tie) in ops {
                let k = Key(g, size, tie);
                match op {
                    0..=3 => prop_assert_eq!(l.insert(k), set.insert(k)),
                    4 => prop_assert_eq!(l.remove(&k), set.remove(&k)),
                    5 | 6 => {
                        let found = l.first_from(&k);
                        prop_assert_eq!(found.map(|f| f.0), set.range(k..).next().copied());
                        if let Some((hit, slot)) = found {
                            prop_assert!(l.remove_at(slot, &hit));
                            set.remove(&hit);
                        }
                    }
                    _ => {
                        prop_assert_eq!(l.contains(&k), set.contains(&k));
                        let a: Vec<_> = l.from(&k).take(80).collect();
                        let b: Vec<_> = set.range(k..).take(80).copied().collect();
                        prop_assert_eq!(a, b);
                        let a: Vec<_> = l.before(&k).take(80).collect();
                        let b: Vec<_> = set.range(..k).rev().take(80).copied().collect();
                        prop_assert_eq!(a, b);
                    }
                }
                prop_assert_eq!(l.len(), set.len());
            }
            let a: Vec<_> = l.iter().collect();
            let b: Vec<_> = set.iter().copied().collect();
            prop_assert_eq!(a, b);
            while let Some((hit, slot)) = l.first_from(&Key(0, 0, 0)) {
                prop_assert_eq!(Some(hit), set.first().copied());
                prop_assert!(l.remove_at(slot, &hit));
                set.remove(&hit);
            }
            prop_assert!(set.is_empty());
            prop_assert_eq!(l.len(), 0);
        }
    }
}
