//! The trace ids the replay knows: live ones with their pointers, and those
//! whose allocation ran out of memory (a later `f` or `r` of them is
//! ignored, as the oracle ignores it).
//!
//! Recorded and generated traces number their allocations 1, 2, 3, ..., so
//! ids below a bound (the ops of the trace plus the seeded blocks) index a
//! `Vec` directly: one bounds check and one load per op instead of hashing.
//! Any other id (a hand-written trace may use any `u64`) goes to a hash map,
//! with the same behaviour.

use rustc_hash::FxHashMap;

use crate::oracle_trace::AllocId;
use reservoir::backend::DevicePtr;

/// What the replay knows of one trace id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IdState {
    /// Allocated, at this pointer (null for a zero-byte allocation).
    Live(DevicePtr),
    /// Its last allocation ran out of memory.
    Failed,
}

/// The ids that are live or failed; every other id is unknown.
#[derive(Debug, Default)]
pub(crate) struct LiveIds {
    /// State of the ids below `dense_limit` (grown on demand).
    dense: Vec<Option<IdState>>,
    /// Ids at or above this live in `sparse`.
    dense_limit: u64,
    sparse: FxHashMap<AllocId, IdState>,
}

impl LiveIds {
    /// A table that indexes ids below `dense_limit` directly (room for
    /// them is reserved now, so growing never copies).
    pub(crate) fn with_dense_limit(dense_limit: u64) -> Self {
        LiveIds {
            dense: Vec::with_capacity(dense_limit as usize),
            dense_limit,
            sparse: FxHashMap::default(),
        }
    }

    /// The state of `id` (`None`: neither live nor failed).
    #[inline]
    pub(crate) fn get(&self, id: AllocId) -> Option<IdState> {
        if id < self.dense_limit {
            self.dense.get(id as usize).copied().flatten()
        } else {
            self.sparse.get(&id).copied()
        }
    }

    /// The pointer of `id` if it is live.
    #[inline]
    pub(crate) fn pointer(&self, id: AllocId) -> Option<DevicePtr> {
        match self.get(id) {
            Some(IdState::Live(ptr)) => Some(ptr),
            _ => None,
        }
    }

    /// Set the state of `id`.
    #[inline]
    pub(crate) fn set(&mut self, id: AllocId, state: IdState) {
        if id < self.dense_limit {
            let i = id as usize;
            if i >= self.dense.len() {
                self.grow_to(i);
            }
            self.dense[i] = Some(state);
        } else {
            self.sparse.insert(id, state);
        }
    }

    /// Forget `id`, returning what it was.
    #[inline]
    pub(crate) fn take(&mut self, id: AllocId) -> Option<IdState> {
        if id < self.dense_limit {
            self.dense.get_mut(id as usize).and_then(Option::take)
        } else {
            self.sparse.remove(&id)
        }
    }

    /// Make room for index `i` (at least doubling, at most to the limit).
    #[cold]
    #[inline(never)]
    fn grow_to(&mut self, i: usize) {
        let want = (i + 1)
            .max(2 * self.dense.len())
            .max(1024)
            .min(self.dense_limit as usize);
        self.dense.resize(want, None);
    }

    /// Every live id with its pointer, in no particular order.
    pub(crate) fn live(&self) -> impl Iterator<Item = (AllocId, DevicePtr)> + '_ {
        let dense = self.dense.iter().enumerate().filter_map(|(id, s)| match s {
            Some(IdState::Live(ptr)) => Some((id as AllocId, *ptr)),
            _ => None,
        });
        let sparse = self.sparse.iter().filter_map(|(&id, s)| match s {
            IdState::Live(ptr) => Some((id, *ptr)),
            IdState::Failed => None,
        });
        dense.chain(sparse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dense and sparse ids behave the same: set, get, take, live.
    #[test]
    fn dense_and_sparse_ids_agree() {
        let mut t = LiveIds::with_dense_limit(10);
        for id in [0u64, 3, 9, 10, 11, u64::MAX] {
            assert_eq!(t.get(id), None, "{id}");
            assert_eq!(t.take(id), None, "{id}");
            t.set(id, IdState::Live(DevicePtr(id.wrapping_mul(512))));
            assert_eq!(t.pointer(id), Some(DevicePtr(id.wrapping_mul(512))));
            t.set(id, IdState::Failed);
            assert_eq!(t.get(id), Some(IdState::Failed));
            assert_eq!(t.pointer(id), None);
            assert_eq!(t.take(id), Some(IdState::Failed));
            assert_eq!(t.get(id), None);
            t.set(id, IdState::Live(DevicePtr(7)));
        }
        t.set(3, IdState::Failed);
        let mut live: Vec<AllocId> = t.live().map(|(id, _)| id).collect();
        live.sort_unstable();
        assert_eq!(live, vec![0, 9, 10, 11, u64::MAX]);
        assert!(t.dense.len() <= 10);
    }
}
