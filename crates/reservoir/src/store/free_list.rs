//! Free lists ordered by a key the caller chooses.
//!
//! A best-fit allocator keeps its free blocks sorted and searches them with
//! a lower bound: PyTorch's `BlockPool::blocks` is a `std::set` ordered by
//! `BlockComparatorSize` (stream, size, address), its `unmapped` set by
//! `BlockComparatorAddress`; an MPS-style heap orders by (size, address).
//! [`FreeList`] is that sorted set, generic over the key: the key type *is*
//! the ordering, so each caller states its own (the caching allocator's
//! keys are in `caching/pools.rs`). Calls are statically dispatched and
//! allocate only when the tree grows.

use std::collections::btree_set::{Iter, Range};
use std::collections::BTreeSet;
use std::ops::RangeBounds;

/// Free blocks sorted by `K`. Invariant (kept by the caller): a block is in
/// at most one free list, under the key computed from its current fields;
/// a block whose key fields change is removed first and re-inserted after.
#[derive(Clone, Debug)]
pub(crate) struct FreeList<K: Ord> {
    keys: BTreeSet<K>,
}

impl<K: Ord> Default for FreeList<K> {
    fn default() -> Self {
        FreeList {
            keys: BTreeSet::new(),
        }
    }
}

impl<K: Ord> FreeList<K> {
    /// Add a key; false if it was already there.
    #[inline]
    pub fn insert(&mut self, key: K) -> bool {
        self.keys.insert(key)
    }

    /// Remove a key; false if it was not there.
    #[inline]
    pub fn remove(&mut self, key: &K) -> bool {
        self.keys.remove(key)
    }

    /// Is the key present?
    #[inline]
    pub fn contains(&self, key: &K) -> bool {
        self.keys.contains(key)
    }

    /// The keys in `range`, in order (a lower bound is a best-fit search).
    #[inline]
    pub fn range<R: RangeBounds<K>>(&self, range: R) -> Range<'_, K> {
        self.keys.range(range)
    }

    /// Every key, in order.
    #[inline]
    pub fn iter(&self) -> Iter<'_, K> {
        self.keys.iter()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }
}

impl<'a, K: Ord> IntoIterator for &'a FreeList<K> {
    type Item = &'a K;
    type IntoIter = Iter<'a, K>;
    fn into_iter(self) -> Iter<'a, K> {
        self.keys.iter()
    }
}
