//! The pointer map: allocated blocks by address (PyTorch's sharded
//! `allocated_blocks`), looked up by every free.
//!
//! A `hashbrown` [`HashTable`] of `(address, block)` with FxHash: a hand-out
//! inserts an address that is not in the map (the block was free), so the
//! insertion skips the search for an existing entry that a `HashMap`'s
//! `insert` makes.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::FxBuildHasher;

use crate::store::BlockId;

/// Allocated blocks by address.
#[derive(Default)]
pub(crate) struct PointerMap {
    table: HashTable<(u64, BlockId)>,
}

#[inline]
fn hash(addr: u64) -> u64 {
    FxBuildHasher.hash_one(addr)
}

impl PointerMap {
    /// Enter the block `id` handed out at `addr`, which is not in the map.
    #[inline]
    pub(crate) fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert!(self.get(&addr).is_none(), "address {addr:#x} mapped twice");
        self.table
            .insert_unique(hash(addr), (addr, id), |&(a, _)| hash(a));
    }

    /// The block allocated at `addr`.
    #[inline]
    pub(crate) fn get(&self, addr: &u64) -> Option<&BlockId> {
        self.table
            .find(hash(*addr), |&(a, _)| a == *addr)
            .map(|(_, id)| id)
    }

    /// Take the block allocated at `addr` out of the map.
    #[inline]
    pub(crate) fn remove(&mut self, addr: &u64) -> Option<BlockId> {
        let entry = self.table.find_entry(hash(*addr), |&(a, _)| a == *addr);
        entry.ok().map(|e| e.remove().0 .1)
    }

    /// The addresses, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &u64> + '_ {
        self.table.iter().map(|(a, _)| a)
    }

    /// The blocks, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &BlockId> + '_ {
        self.table.iter().map(|(_, id)| id)
    }

    /// How many blocks are allocated.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let mut m = PointerMap::default();
        for i in 0..1000u64 {
            m.insert(i * 512, BlockId::for_test(i as u32));
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(&(7 * 512)), Some(&BlockId::for_test(7)));
        assert_eq!(m.get(&1), None);
        assert_eq!(m.remove(&(7 * 512)), Some(BlockId::for_test(7)));
        assert_eq!(m.remove(&(7 * 512)), None);
        assert_eq!(m.len(), 999);
        let mut keys: Vec<u64> = m.keys().copied().collect();
        keys.sort_unstable();
        assert_eq!(keys.len(), 999);
        assert!(!keys.contains(&(7 * 512)));
        assert_eq!(m.values().count(), 999);
    }
}
