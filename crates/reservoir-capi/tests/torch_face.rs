//! The C entry points of the C++ face for torch (`reservoir_torch_*`,
//! `src/torch_face.rs`, `src/torch_state.rs`) on the fake CUDA driver of `../shared/oracle`
//! (`../shared/oracle/with-fake-driver cargo test -p reservoir-capi --test torch_face`).
//! Without a driver the test prints a line starting with `SKIPPED-BACKEND`.
//!
//! One test function: the entry points keep process-wide allocators. After
//! every call the allocator's invariants are checked; every refused call is
//! checked to leave the statistics as they were.

use std::ffi::{c_void, CStr};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

use reservoir_capi::*;

const MIB: usize = 1 << 20;

fn last_error() -> String {
    // SAFETY: NUL-terminated, copied at once.
    unsafe { CStr::from_ptr(reservoir_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn invariants() {
    with_torch_allocator("test", 0, |a| {
        a.check_invariants()
            .map_err(|v| Failure::from(reservoir::AllocError::InvalidState(v.to_string())))
    })
    .expect("invariants hold");
}

fn stats() -> Vec<i64> {
    let mut v = vec![0i64; RESERVOIR_TORCH_DEVICE_STATS_LEN];
    // SAFETY: `v` holds LEN values.
    let s = unsafe { reservoir_torch_device_stats(0, v.as_mut_ptr(), v.len()) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    v
}

/// `reservoir_torch_private_pool_stats` of device 0: the values of every
/// private pool, checking the count-only and too-short calls on the way.
fn private_pool_stats() -> Vec<i64> {
    let mut count = usize::MAX;
    // SAFETY: null `out`; `count` is a live local.
    let s = unsafe { reservoir_torch_private_pool_stats(0, std::ptr::null_mut(), 0, &mut count) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    let n = count * RESERVOIR_TORCH_PRIVATE_POOL_STATS_LEN;
    if n > 0 {
        let mut short = vec![7i64; n - 1];
        // SAFETY: `short` holds n - 1 values.
        let s = unsafe {
            reservoir_torch_private_pool_stats(0, short.as_mut_ptr(), short.len(), &mut count)
        };
        assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT);
        assert!(
            last_error().contains(&format!("len {}", n - 1)),
            "{}",
            last_error()
        );
        assert!(
            short.iter().all(|&x| x == 7),
            "a refused call writes nothing"
        );
    }
    let mut v = vec![0i64; n];
    // SAFETY: `v` holds n values; null count.
    let s = unsafe {
        reservoir_torch_private_pool_stats(0, v.as_mut_ptr(), v.len(), std::ptr::null_mut())
    };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    v
}

fn malloc(size: usize) -> (ReservoirStatus, *mut c_void, String) {
    let mut out = std::ptr::null_mut();
    let mut msg = vec![0u8; 4096];
    let mut oom = ReservoirTorchOom {
        alloc_size: 0,
        device_total: 0,
        device_free: 0,
        message: msg.as_mut_ptr().cast(),
        capacity: msg.len(),
        length: 0,
    };
    // SAFETY: default stream; `out`, `oom` and its buffer are live locals.
    let s = unsafe { reservoir_torch_malloc(size, 0, std::ptr::null_mut(), &mut out, &mut oom) };
    let text = CStr::from_bytes_until_nul(&msg)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    if s == ReservoirStatus::RESERVOIR_ERR_OUT_OF_MEMORY {
        assert_eq!(oom.length, text.len());
        assert!(oom.alloc_size > 0 && oom.device_total > 0);
    }
    invariants();
    (s, out, text)
}

fn snapshot_text() -> String {
    let mut buf = std::ptr::null_mut();
    let mut len = 0;
    // SAFETY: live locals.
    let s = unsafe { reservoir_torch_snapshot(0, 0, true, &mut buf, &mut len) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    // SAFETY: `len` bytes at `buf`, from the call above.
    let t = String::from_utf8(unsafe { std::slice::from_raw_parts(buf, len) }.to_vec()).unwrap();
    // SAFETY: exactly what the call returned.
    unsafe { reservoir_torch_buffer_free(buf, len) };
    t
}

#[test]
fn torch_face_entry_points_on_the_cuda_driver() {
    if let Err(e) = reservoir_cuda::CudaDevice::new(0) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "\nSKIPPED-BACKEND cuda (reservoir-capi torch_face): {e}"
        );
        let mut p = std::ptr::null_mut();
        // SAFETY: null stream and a live `out`.
        let s = unsafe {
            reservoir_torch_malloc(MIB, 0, std::ptr::null_mut(), &mut p, std::ptr::null_mut())
        };
        assert_ne!(s, ReservoirStatus::RESERVOIR_OK);
        assert!(p.is_null());
        return;
    }

    // Allocation and the flat statistics agree with torch's flat keys.
    let (s, a, _) = malloc(3 * MIB);
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    assert!(!a.is_null());
    let v = stats();
    let keys = with_torch_allocator("test", 0, |a| Ok(a.memory_stats())).unwrap();
    // allocation.all.current is v[0]; allocated_bytes.all.current is v[4 * 12].
    assert_eq!(v[0], keys["allocation.all.current"]);
    assert_eq!(v[4 * 12], keys["allocated_bytes.all.current"]);
    assert_eq!(v[5 * 12], keys["reserved_bytes.all.current"]);
    assert_eq!(v[8 * 12], keys["requested_bytes.all.current"]);
    assert_eq!(v[109], keys["num_ooms"]);
    assert_eq!(v[122], keys["max_split_size"]);

    // Bad arguments: typed errors, nothing changed.
    let before = stats();
    // SAFETY: null out-pointers are what is tested.
    unsafe {
        assert_eq!(
            reservoir_torch_malloc(
                MIB,
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut()
            ),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            reservoir_torch_device_stats(0, std::ptr::null_mut(), 200),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        let mut short = [0i64; 10];
        assert_eq!(
            reservoir_torch_device_stats(0, short.as_mut_ptr(), short.len()),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        assert!(last_error().contains("len 10"), "{}", last_error());
    }
    // A foreign pointer and a double free: INVALID_POINTER, nothing changed.
    let foreign = 0xdead_0000usize as *mut c_void;
    assert_eq!(
        reservoir_torch_delete(foreign),
        ReservoirStatus::RESERVOIR_ERR_INVALID_POINTER
    );
    assert!(last_error().contains("0xdead0000"), "{}", last_error());
    assert_eq!(
        reservoir_torch_delete(std::ptr::null_mut()),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(stats(), before);
    invariants();

    // getBaseAllocation: the segment of a live block; a foreign one refused.
    let (mut base, mut size) = (std::ptr::null_mut(), 0u64);
    // SAFETY: live locals.
    unsafe {
        assert_eq!(
            reservoir_torch_base_allocation(a, &mut base, &mut size),
            ReservoirStatus::RESERVOIR_OK
        );
        assert!(size >= 3 * MIB as u64 && (base as usize) <= a as usize);
        assert_eq!(
            reservoir_torch_base_allocation(foreign, &mut base, &mut size),
            ReservoirStatus::RESERVOIR_ERR_INVALID_POINTER
        );
    }

    // The snapshot text: one segment with its blocks, the settings.
    let t = snapshot_text();
    assert!(t.lines().any(|l| l.starts_with("S 0 ")), "{t}");
    assert!(
        t.lines().any(|l| l.starts_with("B 3145728 3145728 2 ")),
        "{t}"
    );
    assert!(t.lines().any(|l| l.starts_with("C ")), "{t}");

    // Free, then a double free is refused and changes nothing.
    assert_eq!(
        reservoir_torch_delete(a),
        ReservoirStatus::RESERVOIR_OK,
        "{}",
        last_error()
    );
    invariants();
    let after_free = stats();
    assert_eq!(
        reservoir_torch_delete(a),
        ReservoirStatus::RESERVOIR_ERR_INVALID_POINTER
    );
    assert_eq!(stats(), after_free);

    // Out of memory: PyTorch's text, the observers' numbers, nothing else
    // changed than what PyTorch's retry chain changes (num_ooms).
    let (s, p, text) = malloc(1 << 50);
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_OUT_OF_MEMORY);
    assert!(p.is_null());
    assert!(
        text.starts_with("CUDA out of memory. Tried to allocate "),
        "{text}"
    );
    assert_eq!(stats()[109], after_free[109] + 1);

    // Memory fraction: set, read back; out of range refused, unchanged.
    let mut f = 0.0;
    assert_eq!(
        reservoir_torch_set_memory_fraction(0, 0.5),
        ReservoirStatus::RESERVOIR_OK
    );
    // SAFETY: live local.
    unsafe {
        assert_eq!(
            reservoir_torch_memory_fraction(0, &mut f),
            ReservoirStatus::RESERVOIR_OK
        )
    };
    assert_eq!(f, 0.5);
    assert_ne!(
        reservoir_torch_set_memory_fraction(0, 1.5),
        ReservoirStatus::RESERVOIR_OK
    );
    assert!(last_error().contains("1.5"), "{}", last_error());
    // SAFETY: live local.
    unsafe {
        assert_eq!(
            reservoir_torch_memory_fraction(0, &mut f),
            ReservoirStatus::RESERVOIR_OK
        )
    };
    assert_eq!(f, 0.5);
    assert_eq!(
        reservoir_torch_set_memory_fraction(0, 1.0),
        ReservoirStatus::RESERVOIR_OK
    );

    // cacheInfo.
    let mut largest = 0u64;
    // SAFETY: live local, then null.
    unsafe {
        assert_eq!(
            reservoir_torch_cache_info(0, &mut largest),
            ReservoirStatus::RESERVOIR_OK
        );
        assert!(largest > 0);
        assert_eq!(
            reservoir_torch_cache_info(0, std::ptr::null_mut()),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
    }

    // Pools: the default pool is refused; a private pool routes the calling
    // thread's allocations (null filter), counts uses, checks live blocks.
    let mut uses = 9u32;
    // SAFETY: null filter, live locals.
    unsafe {
        assert_eq!(
            reservoir_torch_begin_allocate_to_pool(0, 0, 0, None, std::ptr::null_mut(), None),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            reservoir_torch_pool_use_count(0, 7, 7, &mut uses),
            ReservoirStatus::RESERVOIR_OK
        );
        assert_eq!(uses, 0, "an unknown pool has no uses");
        assert_eq!(
            reservoir_torch_begin_allocate_to_pool(0, 1, 2, None, std::ptr::null_mut(), None),
            ReservoirStatus::RESERVOIR_OK,
            "{}",
            last_error()
        );
    }
    invariants();
    let (s, in_pool, _) = malloc(MIB);
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK);
    assert_eq!(
        reservoir_torch_end_allocate_to_pool(0, 1, 2),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_create_or_incref_pool(0, 1, 2),
        ReservoirStatus::RESERVOIR_OK
    );
    // setNoSplit (MemPool(no_split=True)): a known pool, or an error naming
    // the unknown one that changes nothing.
    assert_eq!(
        reservoir_torch_set_no_split(0, 1, 2),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_set_no_split(0, 7, 7),
        ReservoirStatus::RESERVOIR_ERR_INVALID_STATE
    );
    assert!(
        last_error().contains("unknown private pool"),
        "{}",
        last_error()
    );
    invariants();
    // SAFETY: live locals.
    unsafe {
        assert_eq!(
            reservoir_torch_pool_use_count(0, 1, 2, &mut uses),
            ReservoirStatus::RESERVOIR_OK
        );
        assert_eq!(uses, 2);
        let live = [in_pool as u64];
        let mut ok = false;
        assert_eq!(
            reservoir_torch_check_pool_live_allocations(0, 1, 2, live.as_ptr(), 1, &mut ok),
            ReservoirStatus::RESERVOIR_OK
        );
        assert!(ok);
        assert_eq!(
            reservoir_torch_check_pool_live_allocations(0, 1, 2, std::ptr::null(), 0, &mut ok),
            ReservoirStatus::RESERVOIR_OK
        );
        assert!(!ok, "a live block not expected");
        assert_eq!(
            reservoir_torch_check_pool_live_allocations(0, 1, 2, std::ptr::null(), 3, &mut ok),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
    }
    let t = snapshot_text();
    assert!(
        t.lines()
            .any(|l| l.starts_with("S ") && l.contains(" 1 2 ")),
        "{t}"
    );
    // torch 2.13+'s reserved_bytes_by_private_pools (spec 1.12): pool (1, 2)
    // holds one 2 MiB small-pool segment.
    const TWO: i64 = 2 << 20;
    assert_eq!(
        private_pool_stats(),
        [1, 2, TWO, TWO, TWO, 0, TWO, TWO, TWO, 0, 0, 0, 0, 0]
    );
    // Releasing an unknown pool is refused, changing nothing.
    let before = stats();
    assert_ne!(
        reservoir_torch_release_pool(0, 5, 5),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(stats(), before);
    assert_eq!(
        reservoir_torch_delete(in_pool),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_release_pool(0, 1, 2),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_release_pool(0, 1, 2),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_empty_cache_pool(0, 0),
        ReservoirStatus::RESERVOIR_OK
    );
    invariants();
    // The released pool keeps its entry: current 0, peak and totals kept.
    assert_eq!(
        private_pool_stats(),
        [1, 2, 0, TWO, TWO, TWO, 0, TWO, TWO, TWO, 0, 0, 0, 0]
    );

    // A trace tracker sees every entry, history off.
    static SEEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    unsafe extern "C" fn tracker(
        _: *mut c_void,
        device: i32,
        action: i32,
        _: u64,
        size: u64,
        _: *mut c_void,
        _: u64,
        _: u64,
        _: i64,
    ) {
        if device == 0 && action == 0 && size == 12345 {
            SEEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    // SAFETY: `tracker` may be called from any thread.
    unsafe {
        assert_eq!(
            reservoir_torch_attach_trace_tracker(None, std::ptr::null_mut()),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            reservoir_torch_attach_trace_tracker(Some(tracker), std::ptr::null_mut()),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    let (_, t, _) = malloc(12345);
    assert_eq!(reservoir_torch_delete(t), ReservoirStatus::RESERVOIR_OK);
    assert_eq!(SEEN.load(std::sync::atomic::Ordering::Relaxed), 1);

    // Expandable segment sizes: none without expandable segments.
    let mut n = 9usize;
    // SAFETY: null buffer with capacity 0; live local.
    unsafe {
        assert_eq!(
            reservoir_torch_expandable_segment_sizes(0, std::ptr::null_mut(), 0, &mut n),
            ReservoirStatus::RESERVOIR_OK
        );
        assert_eq!(n, 0);
        assert_eq!(
            reservoir_torch_expandable_segment_sizes(0, std::ptr::null_mut(), 4, &mut n),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
    }

    // History: on with a context recorder, the ids come back in the trace;
    // a bad `when` and max_entries 0 are refused.
    unsafe extern "C" fn recorder() -> u64 {
        42
    }
    let mut on = false;
    // SAFETY: `recorder` may be called from any thread; live locals.
    unsafe {
        assert_eq!(
            reservoir_torch_record_history(true, true, Some(recorder), 100, 9, false),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            reservoir_torch_record_history(true, true, Some(recorder), 0, 3, false),
            ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            reservoir_torch_is_history_enabled(&mut on),
            ReservoirStatus::RESERVOIR_OK
        );
        assert!(!on);
        assert_eq!(
            reservoir_torch_record_history(true, true, Some(recorder), 100, 3, false),
            ReservoirStatus::RESERVOIR_OK
        );
        assert_eq!(
            reservoir_torch_is_history_enabled(&mut on),
            ReservoirStatus::RESERVOIR_OK
        );
        assert!(on);
    }
    let (_, b, _) = malloc(MIB);
    assert_eq!(reservoir_torch_delete(b), ReservoirStatus::RESERVOIR_OK);
    let t = snapshot_text();
    assert!(
        t.lines()
            .any(|l| l.starts_with("T 0 0 ") && l.ends_with(" 42")),
        "an alloc trace entry with context 42: {t}"
    );
    // SAFETY: no recorder.
    unsafe {
        assert_eq!(
            reservoir_torch_record_history(false, false, None, 1, 0, true),
            ReservoirStatus::RESERVOIR_OK
        );
        assert_eq!(
            reservoir_torch_is_history_enabled(&mut on),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    assert!(!on);
    assert_eq!(
        reservoir_torch_reset_peak_stats(0),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_reset_accumulated_stats(0),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(stats()[2], 0, "allocation.all.allocated reset");
    invariants();
    use_on_oom_and_pool_allocators();
    filter_contexts_are_dropped_once();
}

static POOL_ALLOCS: AtomicUsize = AtomicUsize::new(0);
static POOL_FREES: AtomicUsize = AtomicUsize::new(0);
static POOL_DROPS: AtomicUsize = AtomicUsize::new(0);

fn pool_layout(size: u64) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(size as usize, 512).expect("a layout")
}

/// A `MemPool(allocator=...)` allocator of host memory (Reservoir never
/// touches a segment's bytes).
unsafe extern "C" fn pool_alloc(
    _ctx: *mut c_void,
    size: u64,
    _dev: i32,
    _s: *mut c_void,
) -> *mut c_void {
    POOL_ALLOCS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: a nonzero size (a segment).
    unsafe { std::alloc::alloc(pool_layout(size)).cast() }
}

unsafe extern "C" fn pool_free(
    _ctx: *mut c_void,
    ptr: *mut c_void,
    size: u64,
    _dev: i32,
    _s: *mut c_void,
) {
    POOL_FREES.fetch_add(1, Ordering::SeqCst);
    // SAFETY: allocated by pool_alloc with this size.
    unsafe { std::alloc::dealloc(ptr.cast(), pool_layout(size)) }
}

unsafe extern "C" fn pool_drop(_ctx: *mut c_void) {
    POOL_DROPS.fetch_add(1, Ordering::SeqCst);
}

/// setUseOnOOM and createOrIncrefPool with another allocator
/// (`MemPool(use_on_oom=True)`, `MemPool(allocator=...)`).
fn use_on_oom_and_pool_allocators() {
    // setUseOnOOM: a known pool, an unknown one (refused, changes nothing,
    // named), unmarking any pool (what ~MemPool does). Pool (5, 6) is a
    // plain MemPool.
    assert_eq!(
        reservoir_torch_create_or_incref_pool(0, 5, 6),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(
        reservoir_torch_set_use_on_oom(0, 5, 6, 1),
        ReservoirStatus::RESERVOIR_OK,
        "{}",
        last_error()
    );
    let before = stats();
    assert_eq!(
        reservoir_torch_set_use_on_oom(0, 7, 7, 1),
        ReservoirStatus::RESERVOIR_ERR_INVALID_STATE
    );
    assert!(
        last_error().contains("unknown private pool"),
        "{}",
        last_error()
    );
    assert_eq!(stats(), before);
    for (p0, p1) in [(7, 7), (5, 6)] {
        assert_eq!(
            reservoir_torch_set_use_on_oom(0, p0, p1, 0),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    assert_eq!(
        reservoir_torch_set_use_on_oom(0, 0, 0, 1),
        ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
    );
    invariants();

    let create = |p0: u64, p1: u64, alloc: ReservoirPoolAlloc, free: ReservoirPoolFree| {
        // SAFETY: the functions above, callable from any thread; no context.
        unsafe {
            reservoir_torch_create_or_incref_pool_with_allocator(
                0,
                p0,
                p1,
                alloc,
                free,
                std::ptr::null_mut(),
                Some(pool_drop),
            )
        }
    };
    // Refused, the context dropped at once: a null function, the default
    // pool, an existing pool without an allocator.
    let drops = POOL_DROPS.load(Ordering::SeqCst);
    assert_eq!(
        create(3, 4, None, Some(pool_free)),
        ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        create(0, 0, Some(pool_alloc), Some(pool_free)),
        ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT
    );
    assert_eq!(
        create(5, 6, Some(pool_alloc), Some(pool_free)),
        ReservoirStatus::RESERVOIR_ERR_INVALID_STATE
    );
    assert!(
        last_error().contains("without an allocator"),
        "{}",
        last_error()
    );
    assert_eq!(POOL_DROPS.load(Ordering::SeqCst), drops + 3);
    // The pool's segments come from its allocator; blocks are cached.
    assert_eq!(
        create(3, 4, Some(pool_alloc), Some(pool_free)),
        ReservoirStatus::RESERVOIR_OK,
        "{}",
        last_error()
    );
    // SAFETY: no filter, no context.
    let s = unsafe {
        reservoir_torch_begin_allocate_to_pool(0, 3, 4, None, std::ptr::null_mut(), None)
    };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK);
    let allocs = POOL_ALLOCS.load(Ordering::SeqCst);
    let (s, x, _) = malloc(MIB);
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    let (s, y, _) = malloc(MIB / 2);
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    assert_eq!(
        POOL_ALLOCS.load(Ordering::SeqCst),
        allocs + 1,
        "one 2 MiB segment"
    );
    assert_eq!(
        reservoir_torch_end_allocate_to_pool(0, 3, 4),
        ReservoirStatus::RESERVOIR_OK
    );
    invariants();
    // Released (use_mem_pool's use, then the MemPool's) and emptied: the
    // segment goes back to the allocator, whose context is dropped.
    assert_eq!(reservoir_torch_delete(x), ReservoirStatus::RESERVOIR_OK);
    assert_eq!(reservoir_torch_delete(y), ReservoirStatus::RESERVOIR_OK);
    for _ in 0..2 {
        assert_eq!(
            reservoir_torch_release_pool(0, 3, 4),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    let (frees, drops) = (
        POOL_FREES.load(Ordering::SeqCst),
        POOL_DROPS.load(Ordering::SeqCst),
    );
    assert_eq!(
        reservoir_torch_empty_cache_pool(0, 0),
        ReservoirStatus::RESERVOIR_OK,
        "{}",
        last_error()
    );
    assert_eq!(POOL_FREES.load(Ordering::SeqCst), frees + 1);
    assert_eq!(POOL_DROPS.load(Ordering::SeqCst), drops + 1);
    invariants();
}

unsafe extern "C" fn accept_every_stream(_ctx: *mut c_void, _s: *mut c_void) -> bool {
    true
}

/// beginAllocateToPool's filter context: dropped exactly once, at once when
/// there is no filter or the call fails, else when the filter goes.
fn filter_contexts_are_dropped_once() {
    let drops = || POOL_DROPS.load(Ordering::SeqCst);
    let before = drops();
    // SAFETY: pool_drop and accept_every_stream take any context, from any thread.
    let begin = |p1, filter| unsafe {
        reservoir_torch_begin_allocate_to_pool(
            0,
            5,
            p1,
            filter,
            std::ptr::null_mut(),
            Some(pool_drop),
        )
    };
    // No filter: nothing keeps the context.
    assert_eq!(
        begin(6, None),
        ReservoirStatus::RESERVOIR_OK,
        "{}",
        last_error()
    );
    assert_eq!(drops(), before + 1);
    assert_eq!(
        reservoir_torch_end_allocate_to_pool(0, 5, 6),
        ReservoirStatus::RESERVOIR_OK
    );
    // A filter keeps it until the pool stops taking allocations.
    let filter: ReservoirStreamFilter = Some(accept_every_stream);
    assert_eq!(
        begin(7, filter),
        ReservoirStatus::RESERVOIR_OK,
        "{}",
        last_error()
    );
    assert_eq!(drops(), before + 1);
    assert_eq!(
        reservoir_torch_end_allocate_to_pool(0, 5, 7),
        ReservoirStatus::RESERVOIR_OK
    );
    for p1 in [6, 7] {
        assert_eq!(
            reservoir_torch_release_pool(0, 5, p1),
            ReservoirStatus::RESERVOIR_OK
        );
    }
    assert_eq!(drops(), before + 2);
    // A refused call (the default pool) drops it too.
    // SAFETY: as above.
    let s = unsafe {
        reservoir_torch_begin_allocate_to_pool(
            0,
            0,
            0,
            filter,
            std::ptr::null_mut(),
            Some(pool_drop),
        )
    };
    assert_ne!(s, ReservoirStatus::RESERVOIR_OK);
    assert_eq!(drops(), before + 3);
    invariants();
}
