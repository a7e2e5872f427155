//! Issue 29: `reservoir_allocator_create(SIM, 0, UINT64_MAX, NULL, &h)` and
//! the same on host memory. A device of nearly 2^64 bytes overflowed the
//! size of an expandable segment's address range on the first growth, a
//! panic that the C ABI caught (`RESERVOIR_ERR_PANIC`, the handle poisoned).
//! Now every call answers a typed status, no panic, and the handle stays
//! usable: without expandable segments the device serves, with them a
//! growth is `RESERVOIR_ERR_BACKEND` (the address range cannot be reserved,
//! as PyTorch's `cuMemAddressReserve` failure is a driver error) or served
//! by the `reservoir` policy's own segments; everything goes back.

use std::ffi::{c_void, CStr, CString};

use reservoir_capi::{
    reservoir_allocator_alloc, reservoir_allocator_create, reservoir_allocator_destroy,
    reservoir_allocator_empty_cache, reservoir_allocator_free, reservoir_allocator_stat,
    reservoir_last_error, ReservoirAllocator, ReservoirBackend, ReservoirStatus,
};

const MIB: u64 = 1 << 20;

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by the library, read before
    // this thread's next call.
    unsafe { CStr::from_ptr(reservoir_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn stat(h: *mut ReservoirAllocator, key: &str) -> i64 {
    let key = CString::new(key).unwrap();
    let mut v = -1;
    // SAFETY: live handle, NUL-terminated key, `v` a live local.
    let s = unsafe { reservoir_allocator_stat(h, key.as_ptr(), &mut v) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    v
}

#[test]
fn a_device_of_absurd_capacity_answers_typed_statuses() {
    let backends = [
        ReservoirBackend::RESERVOIR_BACKEND_SIM,
        ReservoirBackend::RESERVOIR_BACKEND_HOST,
    ];
    for backend in backends {
        for capacity in [u64::MAX, u64::MAX / 2] {
            for conf in [
                None,
                Some("expandable_segments:True"),
                Some("policy:reservoir"),
            ] {
                let what = format!("{backend:?} of {capacity} B, {conf:?}");
                let conf = conf.map(|c| CString::new(c).unwrap());
                let mut h: *mut ReservoirAllocator = std::ptr::null_mut();
                // SAFETY: null or NUL-terminated config, `h` a live local.
                let s = unsafe {
                    reservoir_allocator_create(
                        backend as u32,
                        0,
                        capacity,
                        conf.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                        &mut h,
                    )
                };
                assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{what}: {}", last_error());
                let mut live = Vec::new();
                for size in [512, 3 * MIB, 30 * MIB] {
                    let mut p: *mut c_void = std::ptr::null_mut();
                    // SAFETY: live handle, default stream, `p` a live local.
                    let s = unsafe { reservoir_allocator_alloc(h, size, 0, &mut p) };
                    match s {
                        ReservoirStatus::RESERVOIR_OK => live.push(p),
                        ReservoirStatus::RESERVOIR_ERR_BACKEND if conf.is_some() => {
                            assert!(p.is_null(), "{what}");
                        }
                        s => panic!("{what}: alloc {size}: {s:?}: {}", last_error()),
                    }
                }
                if conf.is_none() {
                    assert_eq!(live.len(), 3, "{what}");
                }
                assert_eq!(stat(h, "num_ooms"), 0, "{what}");
                for p in live {
                    assert_eq!(
                        reservoir_allocator_free(h, p),
                        ReservoirStatus::RESERVOIR_OK,
                        "{what}: {}",
                        last_error()
                    );
                }
                assert_eq!(
                    reservoir_allocator_empty_cache(h),
                    ReservoirStatus::RESERVOIR_OK,
                    "{what}: {}",
                    last_error()
                );
                assert_eq!(stat(h, "reserved_bytes.all.current"), 0, "{what}");
                assert_eq!(
                    reservoir_allocator_destroy(h),
                    ReservoirStatus::RESERVOIR_OK,
                    "{what}"
                );
            }
        }
    }
}
