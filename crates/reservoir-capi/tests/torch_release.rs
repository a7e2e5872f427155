//! Issue 33 through the C ABI: the config string names the PyTorch release
//! of PyTorch mode (`policy:pytorch-2.11` ... `policy:pytorch-2.15`,
//! docs/replay-fidelity.md "PyTorch releases"). The statistics follow the
//! release (rule `stat_num_oom_rejections`: torch 2.11 has no
//! `num_oom_rejections`), and an unsupported release is a typed error
//! naming the value, with no handle made.

use std::ffi::{CStr, CString};

use reservoir_capi::{
    reservoir_allocator_create, reservoir_allocator_destroy, reservoir_allocator_stat,
    reservoir_allocator_stat_at, reservoir_allocator_stats_count, reservoir_last_error,
    ReservoirAllocator, ReservoirBackend, ReservoirStatus,
};

fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by the library, read before
    // this thread's next call.
    unsafe { CStr::from_ptr(reservoir_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn create(conf: &str) -> (ReservoirStatus, *mut ReservoirAllocator) {
    let conf = CString::new(conf).unwrap();
    let mut h: *mut ReservoirAllocator = std::ptr::null_mut();
    // SAFETY: NUL-terminated config, `h` a live local.
    let s = unsafe {
        reservoir_allocator_create(
            ReservoirBackend::RESERVOIR_BACKEND_SIM as u32,
            0,
            0,
            conf.as_ptr(),
            &mut h,
        )
    };
    (s, h)
}

/// Every key of the handle's statistics, in index order.
fn keys(h: *mut ReservoirAllocator) -> Vec<String> {
    let mut n = 0usize;
    // SAFETY: live handle, `n` a live local.
    let s = unsafe { reservoir_allocator_stats_count(h, &mut n) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    (0..n)
        .map(|i| {
            let mut buf = [0u8; 128];
            let (mut len, mut value) = (0usize, 0i64);
            // SAFETY: live handle, `buf` holds 128 writable bytes, `len` and
            // `value` live locals.
            let s = unsafe {
                reservoir_allocator_stat_at(
                    h,
                    i,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut len,
                    &mut value,
                )
            };
            assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
            String::from_utf8(buf[..len].to_vec()).unwrap()
        })
        .collect()
}

fn has_stat(h: *mut ReservoirAllocator, key: &str) -> bool {
    let key = CString::new(key).unwrap();
    let mut v = -1;
    // SAFETY: live handle, NUL-terminated key, `v` a live local.
    let s = unsafe { reservoir_allocator_stat(h, key.as_ptr(), &mut v) };
    match s {
        ReservoirStatus::RESERVOIR_OK => true,
        ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT => false,
        s => panic!("{s:?}: {}", last_error()),
    }
}

#[test]
fn the_config_string_names_the_release_and_the_stats_follow_it() {
    let (s, newest) = create("max_split_size_mb:64");
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    let newest_keys = keys(newest);
    assert!(newest_keys.iter().any(|k| k == "num_oom_rejections"));
    for (conf, has_rejections) in [
        ("policy:pytorch-2.11", false),
        ("max_split_size_mb:64,policy:pytorch-2.11", false),
        ("policy:pytorch-2.12", true),
        ("policy:pytorch-2.15", true),
        ("policy:pytorch", true),
    ] {
        let (s, h) = create(conf);
        assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{conf}: {}", last_error());
        assert!(!h.is_null(), "{conf}");
        assert_eq!(has_stat(h, "num_oom_rejections"), has_rejections, "{conf}");
        assert!(has_stat(h, "num_ooms"), "{conf}");
        let k = keys(h);
        let expected: Vec<String> = newest_keys
            .iter()
            .filter(|k| has_rejections || *k != "num_oom_rejections")
            .cloned()
            .collect();
        assert_eq!(k, expected, "{conf}");
        assert_eq!(
            reservoir_allocator_destroy(h),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    assert_eq!(
        reservoir_allocator_destroy(newest),
        ReservoirStatus::RESERVOIR_OK
    );
}

#[test]
fn an_unsupported_release_is_a_typed_error_naming_it() {
    for (conf, named) in [
        ("policy:pytorch-2.99", "pytorch-2.99"),
        ("max_split_size_mb:64,policy:pytorch-2.10", "pytorch-2.10"),
    ] {
        let (s, h) = create(conf);
        assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_INVALID_CONFIG, "{conf}");
        assert!(h.is_null(), "{conf}: no handle on a failed create");
        let e = last_error();
        assert!(e.contains(named), "{conf}: {e}");
        assert!(e.contains("pytorch-2.11 ... pytorch-2.15"), "{conf}: {e}");
    }
    // A key the named release does not have is refused as that release
    // refuses it (rule expandable_segments_reserve_keys).
    let (s, h) = create("policy:pytorch-2.13,expandable_segments_reserve:0.5");
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_INVALID_CONFIG);
    assert!(h.is_null());
    let e = last_error();
    assert!(e.contains("expandable_segments_reserve"), "{e}");
}
