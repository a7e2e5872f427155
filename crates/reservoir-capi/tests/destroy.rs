//! `reservoir_allocator_destroy` gives the device memory back: cached
//! segments and the segments of blocks still allocated (the caching
//! allocator's teardown, `reservoir::caching` `TeardownReport`). Checked on
//! the fake CUDA driver of `../shared/oracle`, whose `used` counter is the
//! driver's own view (`../shared/oracle/with-fake-driver cargo test -p
//! reservoir-capi --test destroy`). Without a driver the test prints a line
//! starting with `SKIPPED-BACKEND` and passes.

use std::ffi::c_void;
use std::io::Write;

use reservoir_capi::{
    reservoir_allocator_alloc, reservoir_allocator_create, reservoir_allocator_destroy,
    reservoir_allocator_free, ReservoirAllocator, ReservoirBackend, ReservoirStatus,
};

const MIB: u64 = 1 << 20;

#[test]
fn destroy_returns_every_segment_to_the_cuda_driver() {
    let probe = match reservoir_cuda::CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "\nSKIPPED-BACKEND cuda (reservoir-capi destroy): {e}"
            );
            return;
        }
    };
    let Some(fake) = probe.fake() else {
        let _ = writeln!(
            std::io::stderr().lock(),
            "\nSKIPPED-BACKEND cuda (reservoir-capi destroy): not the fake driver (needs its \
             counters)"
        );
        return;
    };
    let used = || fake.stat("used").expect("the fake's used counter");
    let before = used();
    let mut h: *mut ReservoirAllocator = std::ptr::null_mut();
    // SAFETY: null config, `h` a live local.
    let s = unsafe {
        reservoir_allocator_create(
            ReservoirBackend::RESERVOIR_BACKEND_CUDA as u32,
            0,
            0,
            std::ptr::null(),
            &mut h,
        )
    };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK);
    let mut ptrs = Vec::new();
    for size in [512, 3 * MIB, 30 * MIB, 100 * MIB] {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: live handle, default stream, `p` a live local.
        let s = unsafe { reservoir_allocator_alloc(h, size, 0, &mut p) };
        assert_eq!(s, ReservoirStatus::RESERVOIR_OK);
        ptrs.push(p);
    }
    // Two freed (cached), two still allocated.
    for &p in &ptrs[..2] {
        assert_eq!(
            reservoir_allocator_free(h, p),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    assert!(used() >= before + 130 * MIB, "segments are allocated");
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(used(), before, "destroy gave every segment back");
    assert_eq!(
        reservoir_allocator_destroy(h),
        ReservoirStatus::RESERVOIR_ERR_INVALID_HANDLE
    );
}
