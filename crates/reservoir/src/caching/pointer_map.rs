//! The pointer map: allocated blocks by address (PyTorch's sharded
//! `allocated_blocks`), looked up by every free.
//!
//! An open-addressing table of `(address, block)` slots with linear probing,
//! made for this one job: keys are block addresses (never [`EMPTY`]), the
//! table is at most half full, and a hand-out inserts an address that is not
//! in the map (the block was free), so an insertion takes the first empty
//! slot of its probe run. Removal shifts the rest of the run back (no
//! tombstones), so a lookup stops at the first empty slot. The hash is a
//! Fibonacci multiply of the address without its low 9 bits (blocks are
//! 512-byte aligned on every device this crate drives); its top bits pick
//! the slot.

use crate::store::BlockId;

/// The address no block has (it is not 512-aligned and a block there
/// would end past the address space): marks an empty slot.
const EMPTY: u64 = u64::MAX;

/// Slots of a table that has never held an entry.
const MIN_SLOTS: usize = 16;

/// Allocated blocks by address.
pub(crate) struct PointerMap {
    /// `(address, block)`, `EMPTY` addresses in free slots; the length is a
    /// power of two, at least [`MIN_SLOTS`]. Invariant: an entry sits in the
    /// run of occupied slots that starts at or before its home slot
    /// (`home`), and `2 * len <= slots.len()`.
    slots: Vec<(u64, BlockId)>,
    /// `64 - log2(slots.len())`: the shift that turns a hash into a slot.
    shift: u32,
    /// Occupied slots.
    len: usize,
}

impl Default for PointerMap {
    fn default() -> Self {
        PointerMap::with_slots(MIN_SLOTS)
    }
}

impl PointerMap {
    fn with_slots(slots: usize) -> PointerMap {
        debug_assert!(slots.is_power_of_two());
        PointerMap {
            slots: vec![(EMPTY, 0); slots],
            shift: 64 - slots.trailing_zeros(),
            len: 0,
        }
    }

    /// The slot where the probe for `addr` starts.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        ((addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `addr`, if it is in the map.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        if addr == EMPTY {
            // A caller's bad pointer: no block is there, and the probe
            // would take an empty slot for it.
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(addr);
        loop {
            let a = self.slots[i].0;
            if a == addr {
                return Some(i);
            }
            if a == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Enter the block `id` handed out at `addr`, which is not in the map.
    #[inline]
    pub(crate) fn insert(&mut self, addr: u64, id: BlockId) {
        debug_assert!(addr != EMPTY, "address {addr:#x} cannot be mapped");
        debug_assert!(self.get(&addr).is_none(), "address {addr:#x} mapped twice");
        if 2 * (self.len + 1) > self.slots.len() {
            self.grow();
        }
        self.len += 1;
        let mask = self.mask();
        let mut i = self.home(addr);
        while self.slots[i].0 != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = (addr, id);
    }

    /// Double the slots and re-enter every entry.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let old = std::mem::replace(self, PointerMap::with_slots(2 * self.slots.len()));
        for (addr, id) in old.slots {
            if addr != EMPTY {
                self.insert(addr, id);
            }
        }
    }

    /// The block allocated at `addr`.
    #[inline]
    pub(crate) fn get(&self, addr: &u64) -> Option<&BlockId> {
        self.find(*addr).map(|i| &self.slots[i].1)
    }

    /// Take the block allocated at `addr` out of the map.
    #[inline]
    pub(crate) fn remove(&mut self, addr: &u64) -> Option<BlockId> {
        let mut hole = self.find(*addr)?;
        let id = self.slots[hole].1;
        self.len -= 1;
        // Backward-shift deletion: move every later entry of the run whose
        // home is not between the hole and it into the hole.
        let mask = self.mask();
        let mut i = hole;
        loop {
            i = (i + 1) & mask;
            let a = self.slots[i].0;
            if a == EMPTY {
                break;
            }
            let home = self.home(a);
            // The entry at `i` may move to `hole` unless its home lies in
            // the cyclic range (hole, i].
            if (i.wrapping_sub(home) & mask) >= (i.wrapping_sub(hole) & mask) {
                self.slots[hole] = self.slots[i];
                hole = i;
            }
        }
        self.slots[hole].0 = EMPTY;
        Some(id)
    }

    /// The addresses, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &u64> + '_ {
        self.slots.iter().map(|(a, _)| a).filter(|&&a| a != EMPTY)
    }

    /// The blocks, in no particular order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &BlockId> + '_ {
        self.slots
            .iter()
            .filter(|(a, _)| *a != EMPTY)
            .map(|(_, id)| id)
    }

    /// How many blocks are allocated.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn insert_get_remove() {
        let mut m = PointerMap::default();
        for i in 0..1000u64 {
            m.insert(i * 512, i as BlockId);
        }
        assert_eq!(m.len(), 1000);
        assert_eq!(m.get(&(7 * 512)), Some(&7));
        assert_eq!(m.get(&1), None);
        assert_eq!(m.get(&EMPTY), None);
        assert_eq!(m.remove(&EMPTY), None);
        assert_eq!(m.remove(&(7 * 512)), Some(7));
        assert_eq!(m.remove(&(7 * 512)), None);
        assert_eq!(m.len(), 999);
        let mut keys: Vec<u64> = m.keys().copied().collect();
        keys.sort_unstable();
        assert_eq!(keys.len(), 999);
        assert!(!keys.contains(&(7 * 512)));
        assert_eq!(m.values().count(), 999);
    }

    /// Addresses that all share one home slot: long runs, wrapping past the
    /// end of the table, and removals from their middle.
    #[test]
    fn colliding_runs_wrap_and_shift_back() {
        let mut m = PointerMap::default();
        let colliding: Vec<u64> = (0..1u64 << 20)
            .map(|i| i * 512)
            .filter(|&a| m.home(a) == MIN_SLOTS - 1)
            .take(7)
            .collect();
        assert_eq!(colliding.len(), 7);
        for (i, &a) in colliding.iter().enumerate() {
            m.insert(a, i as BlockId);
        }
        for &gone in &[colliding[0], colliding[3]] {
            assert!(m.remove(&gone).is_some());
        }
        for (i, &a) in colliding.iter().enumerate() {
            let want = (i != 0 && i != 3).then_some(i as BlockId);
            assert_eq!(m.get(&a).copied(), want, "address {a:#x}");
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u64),
        Remove(u64),
        Get(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct addresses, so removals and lookups hit; some are
        // not 512-aligned, as a caller's bad pointer may be.
        let addr = (0u64..96).prop_map(|i| i * 512 + (i % 5) * 8);
        prop_oneof![
            addr.clone().prop_map(Op::Insert),
            addr.clone().prop_map(Op::Remove),
            addr.prop_map(Op::Get),
            Just(Op::Remove(EMPTY)),
            Just(Op::Get(EMPTY)),
        ]
    }

    proptest! {
        /// Every operation agrees with a `HashMap`.
        #[test]
        fn matches_a_hash_map(ops in proptest::collection::vec(op(), 0..400)) {
            let mut m = PointerMap::default();
            let mut model: HashMap<u64, BlockId> = HashMap::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Insert(a) => {
                        if let std::collections::hash_map::Entry::Vacant(e) = model.entry(a) {
                            e.insert(n as BlockId);
                            m.insert(a, n as BlockId);
                        }
                    }
                    Op::Remove(a) => prop_assert_eq!(m.remove(&a), model.remove(&a)),
                    Op::Get(a) => prop_assert_eq!(m.get(&a), model.get(&a)),
                }
                prop_assert_eq!(m.len(), model.len());
            }
            let mut keys: Vec<u64> = m.keys().copied().collect();
            keys.sort_unstable();
            let mut want: Vec<u64> = model.keys().copied().collect();
            want.sort_unstable();
            prop_assert_eq!(keys, want);
        }
    }
}
