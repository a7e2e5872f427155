//! Checked opaque handles: a registry of live allocators keyed by a token
//! that is never dereferenced.
//!
//! A `ReservoirAllocator*` is not an address: it is a token,
//! `generation << 16 | MAGIC`, with a generation that is never reused.
//! Every call looks the token up in the registry, so a foreign pointer
//! (wrong magic, or a generation never handed out) and a destroyed handle
//! (generation removed) are errors, never undefined behaviour.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use reservoir::sim::SimDevice;
use reservoir::CachingAllocator;
use reservoir_cuda::CudaDevice;
use reservoir_host::HostDevice;

use crate::error::{
    panic_text, Failure, RESERVOIR_ERR_INVALID_HANDLE, RESERVOIR_ERR_NULL_HANDLE,
    RESERVOIR_ERR_PANIC, RESERVOIR_ERR_POISONED,
};

/// An allocator handle as C sees it: an opaque token, never dereferenced
/// (it is not an address; every call checks it).
pub struct ReservoirAllocator {
    _private: [u8; 0],
}

/// The low 16 bits of every handle.
const MAGIC: u64 = 0x5e5e;

/// The caching allocator of one handle, over the backend chosen at creation.
// One per handle, inside an `Arc`: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AnyAllocator {
    /// The simulated device.
    Sim(CachingAllocator<SimDevice>),
    /// Host memory.
    Host(CachingAllocator<HostDevice>),
    /// A CUDA device.
    Cuda(CachingAllocator<CudaDevice>),
}

/// Evaluates `$body` with `$a` bound to the [`CachingAllocator`] inside an
/// [`AnyAllocator`], whatever its backend.
macro_rules! each_backend {
    ($any:expr, $a:ident => $body:expr) => {
        match $any {
            $crate::handle::AnyAllocator::Sim($a) => $body,
            $crate::handle::AnyAllocator::Host($a) => $body,
            $crate::handle::AnyAllocator::Cuda($a) => $body,
        }
    };
}
pub(crate) use each_backend;

/// A live handle's allocator and its poisoned flag.
pub(crate) struct Handle {
    pub(crate) alloc: AnyAllocator,
    poisoned: AtomicBool,
}

static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);
static REGISTRY: RwLock<BTreeMap<u64, Arc<Handle>>> = parking_lot::const_rwlock(BTreeMap::new());

/// Register `alloc` and return its new handle.
pub(crate) fn register(alloc: AnyAllocator) -> *mut ReservoirAllocator {
    let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
    let token = generation << 16 | MAGIC;
    let handle = Arc::new(Handle {
        alloc,
        poisoned: AtomicBool::new(false),
    });
    REGISTRY.write().insert(token, handle);
    token as usize as *mut ReservoirAllocator
}

/// The live handle behind `h`.
fn lookup(h: *const ReservoirAllocator) -> Result<Arc<Handle>, Failure> {
    if h.is_null() {
        return Err(Failure::new(
            RESERVOIR_ERR_NULL_HANDLE,
            "the allocator handle is null",
        ));
    }
    let token = h as usize as u64;
    if token & 0xffff != MAGIC {
        return Err(Failure::new(
            RESERVOIR_ERR_INVALID_HANDLE,
            format!("{h:p} is not a Reservoir allocator handle"),
        ));
    }
    REGISTRY.read().get(&token).cloned().ok_or_else(|| {
        Failure::new(
            RESERVOIR_ERR_INVALID_HANDLE,
            format!("allocator handle {h:p} was destroyed or never created"),
        )
    })
}

/// Remove `h` from the registry: later calls with it are
/// `RESERVOIR_ERR_INVALID_HANDLE`. The allocator is dropped when the last
/// call still using it returns.
pub(crate) fn unregister(h: *const ReservoirAllocator) -> Result<Arc<Handle>, Failure> {
    lookup(h)?;
    REGISTRY
        .write()
        .remove(&(h as usize as u64))
        .ok_or_else(|| {
            Failure::new(
                RESERVOIR_ERR_INVALID_HANDLE,
                format!("allocator handle {h:p} was destroyed by another thread"),
            )
        })
}

/// Run `f` on the live, unpoisoned allocator behind `h`. A panic in `f`
/// poisons the allocator (its state may be half updated) and answers
/// `RESERVOIR_ERR_PANIC`; every later call answers `RESERVOIR_ERR_POISONED`.
pub(crate) fn with_handle<R>(
    h: *const ReservoirAllocator,
    f: impl FnOnce(&AnyAllocator) -> Result<R, Failure>,
) -> Result<R, Failure> {
    let handle = lookup(h)?;
    if handle.poisoned.load(Ordering::Acquire) {
        return Err(Failure::new(
            RESERVOIR_ERR_POISONED,
            format!("allocator {h:p} is poisoned by an earlier panic; only destroy it"),
        ));
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&handle.alloc))).unwrap_or_else(
        |payload| {
            handle.poisoned.store(true, Ordering::Release);
            Err(Failure::new(
                RESERVOIR_ERR_PANIC,
                format!(
                    "panicked: {}; allocator {h:p} is now poisoned",
                    panic_text(payload.as_ref())
                ),
            ))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir::AllocatorConfig;

    #[test]
    fn a_panic_poisons_the_handle() {
        let h = register(AnyAllocator::Sim(CachingAllocator::new(
            SimDevice::default(),
            AllocatorConfig::default(),
        )));
        let r: Result<(), _> = with_handle(h, |_| panic!("boom"));
        let e = r.unwrap_err();
        assert_eq!(e.status, RESERVOIR_ERR_PANIC);
        assert!(e.message.contains("boom"), "{}", e.message);
        let e = with_handle(h, |_| Ok(())).unwrap_err();
        assert_eq!(e.status, RESERVOIR_ERR_POISONED);
        unregister(h).unwrap();
        let e = with_handle(h, |_| Ok(())).unwrap_err();
        assert_eq!(e.status, RESERVOIR_ERR_INVALID_HANDLE);
    }
}
