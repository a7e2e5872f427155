//! Allocator event callbacks: PyTorch's MPS allocator callback registry
//! (`IMpsAllocatorCallback`, `MPSAllocatorCallbacksRegistry` in
//! `aten/src/ATen/mps/MPSAllocatorInterface.h`), for any allocator.
//!
//! A [`CallbackRegistry`] holds named callbacks; an allocator fires an
//! [`AllocatorEvent`] at fixed moments and every registered callback sees
//! it. The registry is its own thread-safe type, shareable through an
//! [`Arc`], so a heap allocator (MPS-style) can fire the same registry as
//! the caching allocator.
//!
//! When [`CachingAllocator`](crate::caching::CachingAllocator) fires each
//! [`EventType`]:
//!
//! | event | moment | `ptr` / `size` |
//! |---|---|---|
//! | `Allocated` | a request was served by memory obtained from the device for it (a new segment, or newly mapped pages of an expandable segment) | block address / block size |
//! | `Recycled` | a request was served by a cached block (no device call) | block address / block size |
//! | `Freed` | a block went back to the cache (PyTorch's `free_completed`: at `free`, or once the streams it was used on are done) | block address / block size |
//! | `Released` | memory went back to the device (`segment_free`, or `segment_unmap` of expandable pages) | segment or unmapped range / bytes |
//! | `AllocationFailed` | a request failed after the whole retry chain, just before the out-of-memory error is returned (after the OOM observers) | null / bytes requested |
//!
//! PyTorch 2.x's MPS allocator fires only `ALLOCATION_FAILED`, and does so
//! inside its retry chain so that a callback can free memory before one more
//! search; the caching allocator has
//! [`FreeMemoryCallback`](crate::caching::FreeMemoryCallback)s for that, and
//! fires `AllocationFailed` once the failure is final.
//!
//! The first four fire while the allocator's lock is held: a callback must
//! not call back into the same allocator (it would deadlock) and should be
//! quick. `AllocationFailed` fires after the lock is released. With no
//! callback registered, the allocator pays one branch per event.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use reservoir::observe::callbacks::{AllocatorEvent, EventType};
//! use reservoir::{AllocatorConfig, CachingAllocator, StreamId};
//! use reservoir::sim::SimDevice;
//!
//! let alloc = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
//! let seen = Arc::new(Mutex::new(Vec::new()));
//! let log = seen.clone();
//! alloc
//!     .callbacks()
//!     .register("log", Arc::new(move |e: &AllocatorEvent| log.lock().unwrap().push(e.event)))
//!     .unwrap();
//! let p = alloc.raw_alloc(1 << 20, StreamId::DEFAULT).unwrap();
//! alloc.raw_free(p).unwrap();
//! let q = alloc.raw_alloc(1 << 20, StreamId::DEFAULT).unwrap();
//! alloc.raw_free(q).unwrap();
//! alloc.empty_cache().unwrap();
//! assert_eq!(
//!     *seen.lock().unwrap(),
//!     [EventType::Allocated, EventType::Freed, EventType::Recycled, EventType::Freed, EventType::Released]
//! );
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::backend::{DevicePtr, StreamId};

/// What happened (PyTorch's `IMpsAllocatorCallback::EventType`). See the
/// [module documentation](self) for when each fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// A request was served by memory newly obtained from the device.
    Allocated,
    /// A request was served by a cached block.
    Recycled,
    /// A block went back to the cache.
    Freed,
    /// Memory went back to the device.
    Released,
    /// A request failed for good (out of memory).
    AllocationFailed,
}

impl EventType {
    /// PyTorch's enumerator name (`"ALLOCATED"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Allocated => "ALLOCATED",
            EventType::Recycled => "RECYCLED",
            EventType::Freed => "FREED",
            EventType::Released => "RELEASED",
            EventType::AllocationFailed => "ALLOCATION_FAILED",
        }
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event, as callbacks see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatorEvent {
    /// What happened.
    pub event: EventType,
    /// Device index of the allocator.
    pub device: i8,
    /// The block or range (null for `AllocationFailed`, as in PyTorch).
    pub ptr: DevicePtr,
    /// Bytes (see the table in the [module documentation](self)).
    pub size: u64,
    /// The stream of the block or segment (the request's for `AllocationFailed`).
    pub stream: StreamId,
}

/// A registered callback (PyTorch's `executeMPSAllocatorCallback`).
pub type AllocatorCallback = Arc<dyn Fn(&AllocatorEvent) + Send + Sync>;

/// Why a registry call was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallbackError {
    /// A callback of that name is already registered.
    #[error("an allocator callback named {0:?} is already registered")]
    AlreadyRegistered(String),
    /// No callback of that name is registered.
    #[error("no allocator callback named {0:?} is registered")]
    NotRegistered(String),
}

/// Named callbacks fired on allocator events, in registration order.
#[derive(Default)]
pub struct CallbackRegistry {
    callbacks: RwLock<Vec<(String, AllocatorCallback)>>,
    /// Some callback is registered (read without the lock on the hot path).
    active: AtomicBool,
}

impl CallbackRegistry {
    /// An empty registry.
    pub fn new() -> CallbackRegistry {
        CallbackRegistry::default()
    }

    /// Register `callback` under `name` (names are unique).
    pub fn register(
        &self,
        name: impl Into<String>,
        callback: AllocatorCallback,
    ) -> Result<(), CallbackError> {
        let name = name.into();
        let mut cbs = self.callbacks.write();
        if cbs.iter().any(|(n, _)| *n == name) {
            return Err(CallbackError::AlreadyRegistered(name));
        }
        cbs.push((name, callback));
        self.active.store(true, Ordering::Release);
        Ok(())
    }

    /// Remove the callback registered under `name`.
    pub fn unregister(&self, name: &str) -> Result<(), CallbackError> {
        let mut cbs = self.callbacks.write();
        let Some(i) = cbs.iter().position(|(n, _)| n == name) else {
            return Err(CallbackError::NotRegistered(name.to_string()));
        };
        cbs.remove(i);
        self.active.store(!cbs.is_empty(), Ordering::Release);
        Ok(())
    }

    /// The registered names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.callbacks
            .read()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// True when a callback of that name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.callbacks.read().iter().any(|(n, _)| n == name)
    }

    /// True when at least one callback is registered (one atomic load).
    #[inline]
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Call every registered callback with `event`, in registration order.
    pub fn fire(&self, event: &AllocatorEvent) {
        if !self.is_active() {
            return;
        }
        // Clone the list so a callback may (un)register without deadlocking.
        let cbs: Vec<AllocatorCallback> = self
            .callbacks
            .read()
            .iter()
            .map(|(_, c)| c.clone())
            .collect();
        for cb in cbs {
            cb(event);
        }
    }
}

impl fmt::Debug for CallbackRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackRegistry")
            .field("names", &self.names())
            .finish()
    }
}
