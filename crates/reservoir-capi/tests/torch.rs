//! PyTorch's pluggable-allocator entry points (`reservoir_alloc`,
//! `reservoir_free`) on a CUDA driver: the fake driver of `../shared/oracle`
//! (`../shared/oracle/with-fake-driver cargo test -p reservoir-capi`).
//! Without a driver the test prints a line starting with `SKIPPED-BACKEND`
//! and passes.
//!
//! One test function: the entry points keep process-wide allocators and
//! read `RESERVOIR_ALLOC_CONF`, so the steps run in order.

mod common;
use common::{last_error, stat};
use std::ffi::c_void;
use std::io::Write;

use reservoir_capi::{
    reservoir_alloc, reservoir_free, reservoir_torch_configure, reservoir_torch_empty_cache,
    reservoir_torch_record_stream, torch_configure, with_torch_allocator, ReservoirStatus,
    RESERVOIR_ALLOC_CONF,
};

const MIB: isize = 1 << 20;

fn alloc(size: isize, device: i32, stream: *mut c_void) -> *mut c_void {
    // SAFETY: `stream` is null or a live stream of device 0 (made below).
    unsafe { reservoir_alloc(size, device, stream) }
}

#[test]
fn pytorch_entry_points_on_the_cuda_driver() {
    if let Err(e) = reservoir_cuda::CudaDevice::new(0) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "\nSKIPPED-BACKEND cuda (reservoir-capi): {e}"
        );
        // Without a driver the entry points fail cleanly.
        assert!(alloc(MIB, 0, std::ptr::null_mut()).is_null());
        assert!(
            last_error().contains("CUDA device 0 is unavailable"),
            "{}",
            last_error()
        );
        return;
    }

    // A bad configuration string is refused before anything is built and
    // leaves the environment in charge (spec section 3: the settings syntax).
    // SAFETY: a NUL-terminated literal.
    let s = unsafe { reservoir_torch_configure(c"expandable_segments:maybe".as_ptr()) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_INVALID_CONFIG);
    assert!(
        last_error().contains("expandable_segments"),
        "{}",
        last_error()
    );

    // A bad RESERVOIR_ALLOC_CONF: null, and the message names the variable
    // and the bad key; nothing is built, so a good value works afterwards.
    std::env::set_var(RESERVOIR_ALLOC_CONF, "no_such_key:1");
    assert!(alloc(MIB, 0, std::ptr::null_mut()).is_null());
    let e = last_error();
    assert!(
        e.contains(RESERVOIR_ALLOC_CONF) && e.contains("no_such_key"),
        "{e}"
    );
    std::env::set_var(RESERVOIR_ALLOC_CONF, "max_split_size_mb:40");

    // Normal use on the default stream: PyTorch's rounding and caching.
    let p = alloc(MIB, 0, std::ptr::null_mut());
    assert!(!p.is_null(), "{}", last_error());
    assert!(last_error().is_empty());
    assert_eq!(
        stat(c"max_split_size"),
        40 << 20,
        "RESERVOIR_ALLOC_CONF is applied"
    );
    assert_eq!(stat(c"allocated_bytes.all.current"), MIB as i64);
    assert_eq!(stat(c"reserved_bytes.all.current"), 2 * MIB as i64);
    reservoir_free(p, MIB, 0, std::ptr::null_mut());
    assert!(last_error().is_empty(), "{}", last_error());
    assert_eq!(stat(c"allocated_bytes.all.current"), 0);
    assert_eq!(
        stat(c"reserved_bytes.all.current"),
        2 * MIB as i64,
        "cached"
    );
    // A cached block is reused.
    let q = alloc(MIB, 0, std::ptr::null_mut());
    assert_eq!(q, p);
    reservoir_free(q, MIB, 0, std::ptr::null_mut());

    // A stream made outside Reservoir, as torch passes its cudaStream_t.
    use cudarc::driver::sys;
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: the entry points loaded the driver and made device 0's
    // primary context current on this thread; `raw` is a live local.
    let r = unsafe { sys::cuStreamCreate(&mut raw, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let stream = raw.cast::<c_void>();
    let big: Vec<_> = (0..4).map(|_| alloc(30 * MIB, 0, stream)).collect();
    assert!(big.iter().all(|p| !p.is_null()), "{}", last_error());
    assert_eq!(stat(c"allocated_bytes.all.current"), 4 * 30 * MIB as i64);
    for p in big {
        reservoir_free(p, 30 * MIB, 0, stream);
    }
    assert_eq!(stat(c"allocated_bytes.all.current"), 0);

    // Bad inputs: null / nothing, the message names the value, the
    // statistics stay as they were.
    let before = stat(c"reserved_bytes.all.current");
    assert!(alloc(-5, 0, std::ptr::null_mut()).is_null());
    assert!(last_error().contains("size -5"), "{}", last_error());
    assert!(alloc(MIB, 200, std::ptr::null_mut()).is_null());
    assert!(last_error().contains("device 200"), "{}", last_error());
    assert!(alloc(0, 0, std::ptr::null_mut()).is_null());
    reservoir_free(0x1234 as *mut c_void, 8, 0, std::ptr::null_mut());
    assert!(last_error().contains("0x1234"), "{}", last_error());
    reservoir_free(std::ptr::null_mut(), 8, 0, std::ptr::null_mut());
    assert_eq!(stat(c"allocated_bytes.all.current"), 0);
    assert_eq!(stat(c"reserved_bytes.all.current"), before);

    // record_stream (torch's `set_record_stream_fn` hook): a live block is
    // marked, a foreign pointer is an error naming it and changes nothing.
    let p = alloc(MIB, 0, std::ptr::null_mut());
    // SAFETY: `p` is live and `stream` a live stream of device 0.
    let s = unsafe { reservoir_torch_record_stream(p, stream) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    // SAFETY: as above; the pointer is only looked up.
    let s = unsafe { reservoir_torch_record_stream(0x5678 as *mut c_void, stream) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_INVALID_POINTER);
    assert!(last_error().contains("0x5678"), "{}", last_error());
    reservoir_free(p, MIB, 0, std::ptr::null_mut());
    // SAFETY: `raw` is live; completing its (empty) work lets the block go.
    let r = unsafe { sys::cuStreamSynchronize(raw) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);

    // The Rust accessor sees the same allocator; configuring now is refused
    // and changes nothing.
    let inv = with_torch_allocator("test", 0, |a| Ok(a.check_invariants().is_ok()));
    assert_eq!(inv, Ok(true));
    let e = torch_configure(Some("max_split_size_mb:80")).unwrap_err();
    assert_eq!(e.status, ReservoirStatus::RESERVOIR_ERR_INVALID_STATE);
    assert!(e.message.contains("already built"), "{e}");
    assert_eq!(stat(c"max_split_size"), 40 << 20);
    let e = with_torch_allocator("test", -1, |_| Ok(())).unwrap_err();
    assert!(e.message.contains("device -1"), "{e}");

    assert_eq!(
        reservoir_torch_empty_cache(0),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(stat(c"reserved_bytes.all.current"), 0);
    // SAFETY: `raw` is a live stream with no pending work, used no more.
    let r = unsafe { sys::cuStreamDestroy_v2(raw) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
}
