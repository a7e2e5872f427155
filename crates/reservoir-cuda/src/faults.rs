//! Fault injection into the CUDA backend, for tests of the code above it
//! that cannot wrap the backend (the PyTorch entry points of
//! `reservoir-capi` build their `CachingAllocator<CudaDevice>` themselves).
//! Only with the `fault-injection` feature; inert until armed.
//!
//! [`fail_nth`] arms a process-wide counter of the backend's fallible calls
//! (every [`Backend`](reservoir::Backend) method that returns a `Result`,
//! and the [`VirtualMemory`](reservoir::backend::VirtualMemory) ones, on
//! every [`CudaDevice`](crate::CudaDevice)): the `n`-th call from then on
//! answers a non-retryable [`BackendError::Driver`] without reaching the
//! driver, so nothing happens on the device, as the testkit's
//! `FaultyBackend` does for backends it can wrap.

use std::sync::atomic::{AtomicU64, Ordering};

use reservoir::BackendError;

/// Calls counted since the process started.
static CALLS: AtomicU64 = AtomicU64::new(0);
/// The call number that fails (0: none).
static ARMED: AtomicU64 = AtomicU64::new(0);
/// Faults injected so far.
static INJECTED: AtomicU64 = AtomicU64::new(0);

/// Fail the `n`-th fallible backend call from now (`n` >= 1; 0 disarms).
pub fn fail_nth(n: u64) {
    let at = if n == 0 {
        0
    } else {
        CALLS.load(Ordering::SeqCst) + n
    };
    ARMED.store(at, Ordering::SeqCst);
}

/// Disarm a fault not injected yet.
pub fn clear() {
    ARMED.store(0, Ordering::SeqCst);
}

/// The fallible backend calls counted so far (all devices).
pub fn calls() -> u64 {
    CALLS.load(Ordering::SeqCst)
}

/// The faults injected so far.
pub fn injected() -> u64 {
    INJECTED.load(Ordering::SeqCst)
}

/// Count a call of `what`; the injected error if it is the armed one.
pub(crate) fn gate(what: &'static str) -> Result<(), BackendError> {
    let n = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
    if ARMED.load(Ordering::SeqCst) == n
        && ARMED
            .compare_exchange(n, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    {
        INJECTED.fetch_add(1, Ordering::SeqCst);
        return Err(BackendError::Driver(format!(
            "injected fault: call {n} ({what})"
        )));
    }
    Ok(())
}
