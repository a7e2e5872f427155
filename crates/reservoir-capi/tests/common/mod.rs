//! Helpers shared by the torch entry points' test binaries.

use std::ffi::CStr;

use reservoir_capi::{reservoir_last_error, reservoir_torch_stat, ReservoirStatus};

/// This thread's last Reservoir error, copied.
pub fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string valid until this
    // thread's next Reservoir call; it is copied at once.
    unsafe { CStr::from_ptr(reservoir_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Device 0's statistic `key` (a flat torch key); the call must succeed.
pub fn stat(key: &CStr) -> i64 {
    let mut v = -1;
    // SAFETY: `key` is NUL-terminated and `v` a live local.
    let s = unsafe { reservoir_torch_stat(0, key.as_ptr(), &mut v) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    v
}
