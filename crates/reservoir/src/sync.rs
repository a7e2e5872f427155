//! The locks, once-cells and thread-locals of the caching allocator and its
//! stream shards, as `parking_lot`/`std` normally and as `loom`'s models
//! under the `loom` feature (loom sees only its own primitives, so the models in
//! `tests/loom.rs` explore every interleaving of these hand-off points).
//!
//! The API is the subset the allocator uses: `Mutex::lock`/`get_mut`,
//! `RwLock::read`/`write`, [`OnceSlot::get`]/[`OnceSlot::get_or_init`] and
//! `thread_local!`.

#[cfg(not(feature = "loom"))]
pub(crate) use parking_lot::{Mutex, RwLock};
#[cfg(not(feature = "loom"))]
pub(crate) use std::thread_local;

#[cfg(feature = "loom")]
pub(crate) use loom::thread_local;
#[cfg(feature = "loom")]
pub(crate) use loom_shim::{Mutex, RwLock};

/// A cell written once and then read without a lock: `std`'s `OnceLock`
/// (one acquire load per read, no shared write); under loom a loom mutex
/// around the value, so the models see the publication as a hand-off.
pub(crate) struct OnceSlot<T> {
    #[cfg(not(feature = "loom"))]
    cell: std::sync::OnceLock<T>,
    #[cfg(feature = "loom")]
    cell: loom::sync::Mutex<Option<std::sync::Arc<T>>>,
}

/// What [`OnceSlot::get`] returns: a reference, or under loom a shared handle.
#[cfg(not(feature = "loom"))]
pub(crate) type SlotRef<'a, T> = &'a T;
/// What [`OnceSlot::get`] returns: a reference, or under loom a shared handle.
#[cfg(feature = "loom")]
pub(crate) type SlotRef<'a, T> = std::sync::Arc<T>;

impl<T> OnceSlot<T> {
    /// An empty slot.
    pub(crate) fn new() -> Self {
        OnceSlot {
            #[cfg(not(feature = "loom"))]
            cell: std::sync::OnceLock::new(),
            #[cfg(feature = "loom")]
            cell: loom::sync::Mutex::new(None),
        }
    }

    /// The value, once set.
    #[cfg(not(feature = "loom"))]
    #[inline]
    pub(crate) fn get(&self) -> Option<SlotRef<'_, T>> {
        self.cell.get()
    }

    /// The value, setting it with `init` if the slot is empty (one caller
    /// initialises; the others wait and see its value).
    #[cfg(not(feature = "loom"))]
    pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> SlotRef<'_, T> {
        self.cell.get_or_init(init)
    }

    /// The value, once set.
    #[cfg(feature = "loom")]
    pub(crate) fn get(&self) -> Option<SlotRef<'_, T>> {
        self.cell.lock().unwrap().clone()
    }

    /// The value, setting it with `init` if the slot is empty. `init` runs
    /// outside the slot's lock (as `OnceLock`'s `get` never waits for an
    /// initialiser); of racing initialisers the first to finish wins.
    #[cfg(feature = "loom")]
    pub(crate) fn get_or_init(&self, init: impl FnOnce() -> T) -> SlotRef<'_, T> {
        if let Some(value) = self.get() {
            return value;
        }
        let value = std::sync::Arc::new(init());
        let mut cell = self.cell.lock().unwrap();
        cell.get_or_insert(value).clone()
    }
}

#[cfg(feature = "loom")]
mod loom_shim {
    /// loom's mutex with `parking_lot`'s API (no poisoning).
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            self.0.lock().unwrap()
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap()
        }
    }

    /// loom's reader-writer lock with `parking_lot`'s API (no poisoning).
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap()
        }

        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap()
        }
    }
}
