//! A slab of values addressed by `u32` ids, reusing freed slots.

/// Values addressed by `u32` ids. Invariant: every id in `free` indexes a
/// slot of `items` whose value its owner marked dead; no id is in `free`
/// twice. Slots are reused last freed first, so ids stay dense and no
/// insert allocates once the slab is warm.
#[derive(Clone, Debug)]
pub(crate) struct Slab<T> {
    /// Every slot, live or dead (the owner's `live` flag tells which).
    pub items: Vec<T>,
    /// Dead slots, reused last in first out.
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Store `value`, returning its id.
    #[inline]
    pub fn insert(&mut self, value: T) -> u32 {
        match self.free.pop() {
            Some(id) => {
                self.items[id as usize] = value;
                id
            }
            None => {
                self.items.push(value);
                (self.items.len() - 1) as u32
            }
        }
    }

    /// Mark `id` reusable. The caller clears the value's `live` flag.
    #[inline]
    pub fn remove(&mut self, id: u32) {
        self.free.push(id);
    }

    /// Number of live values.
    pub fn len(&self) -> usize {
        self.items.len() - self.free.len()
    }
}

impl<T> std::ops::Index<u32> for Slab<T> {
    type Output = T;
    #[inline]
    fn index(&self, id: u32) -> &T {
        &self.items[id as usize]
    }
}

impl<T> std::ops::IndexMut<u32> for Slab<T> {
    #[inline]
    fn index_mut(&mut self, id: u32) -> &mut T {
        &mut self.items[id as usize]
    }
}
