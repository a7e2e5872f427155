//! A slab of values addressed by typed ids ([`BlockId`](super::BlockId),
//! [`SegmentId`](super::SegmentId)), reusing freed slots.

use std::marker::PhantomData;

use super::block::{Placeholder, SlabId};

/// Values addressed by ids of type `I`. Invariant: slot 0 of `items` holds
/// a dead placeholder that no id names (so an id is its slot number, never
/// 0, and `Option` of an id costs nothing); every id in `free` names a slot
/// of `items` whose value its owner marked dead; no id is in `free` twice.
/// Slots are reused last freed first, so ids stay dense and no insert
/// allocates once the slab is warm.
#[derive(Clone, Debug)]
pub(crate) struct Slab<T, I> {
    /// Every slot, live or dead (the owner's `live` flag tells which), the
    /// placeholder first.
    pub items: Vec<T>,
    /// Dead slots, reused last in first out.
    free: Vec<I>,
    /// The id type.
    id: PhantomData<I>,
}

impl<T: Placeholder, I> Default for Slab<T, I> {
    fn default() -> Self {
        Slab {
            items: vec![T::placeholder()],
            free: Vec::new(),
            id: PhantomData,
        }
    }
}

impl<T, I: SlabId> Slab<T, I> {
    /// The id the next [`insert`](Self::insert) returns.
    #[inline]
    pub fn next_id(&self) -> I {
        match self.free.last() {
            Some(&id) => id,
            None => I::from_slot(self.items.len() as u32),
        }
    }

    /// Store `value`, returning its id.
    #[inline]
    pub fn insert(&mut self, value: T) -> I {
        match self.free.pop() {
            Some(id) => {
                self.items[id.slot()] = value;
                id
            }
            None => {
                self.items.push(value);
                I::from_slot((self.items.len() - 1) as u32)
            }
        }
    }

    /// Mark `id` reusable. The caller clears the value's `live` flag.
    #[inline]
    pub fn remove(&mut self, id: I) {
        self.free.push(id);
    }

    /// Number of live values.
    pub fn len(&self) -> usize {
        self.items.len() - 1 - self.free.len()
    }

    /// The value in slot `id`, if the slab has that slot (live or dead).
    #[inline]
    pub fn get(&self, id: I) -> Option<&T> {
        self.items.get(id.slot())
    }

    /// Every slot but the placeholder with its id, live or dead.
    pub fn iter(&self) -> impl Iterator<Item = (I, &T)> + '_ {
        (self.items.iter().enumerate().skip(1)).map(|(i, v)| (I::from_slot(i as u32), v))
    }
}

impl<T, I: SlabId> std::ops::Index<I> for Slab<T, I> {
    type Output = T;
    #[inline]
    fn index(&self, id: I) -> &T {
        &self.items[id.slot()]
    }
}

impl<T, I: SlabId> std::ops::IndexMut<I> for Slab<T, I> {
    #[inline]
    fn index_mut(&mut self, id: I) -> &mut T {
        &mut self.items[id.slot()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::BlockId;

    impl Placeholder for u8 {
        fn placeholder() -> u8 {
            0
        }
    }

    /// Ids name slots, order as their slots, print as their slot index;
    /// `next_id` is what the next insert returns, a freed slot first.
    #[test]
    fn ids_name_slots_and_freed_slots_come_back_first() {
        let mut s: Slab<u8, BlockId> = Slab::default();
        let a = s.insert(1);
        let b = s.insert(2);
        assert!(a < b && a == BlockId::FIRST);
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(format!("{b} {b:?}"), "1 BlockId(1)");
        assert_eq!(s.next_id(), s.insert(3));
        s.remove(a);
        assert_eq!(s.next_id(), a);
        assert_eq!(s.insert(4), a);
        assert_eq!((s[a], s[b], s.len()), (4, 2, 3));
    }
}
