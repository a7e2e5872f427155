//! The backend contract directly, and the caching allocator over it in
//! PyTorch mode.

use reservoir::{AllocatorConfig, Backend, CachingAllocator, StreamId};
use reservoir_cuda::{checksum_of_fill, BackendError, DeviceWork, Memcpy};

use super::{device, hooks, Mode, MIB};

const S0: StreamId = StreamId::DEFAULT;
const GIB: u64 = 1 << 30;

#[test]
fn segments_are_cu_mem_alloc_with_typed_errors_and_retryable_oom() {
    let Some((_turn, dev)) = device(64 * MIB, Mode::Default) else {
        return;
    };
    let used0 = hooks(&dev).stat("used").unwrap();
    let calls0 = hooks(&dev).stat("malloc_calls").unwrap();
    let info = dev.mem_info().unwrap();
    assert_eq!(info.total, 64 * MIB);
    let a = dev.allocate(32 * MIB, S0).unwrap();
    assert_eq!(hooks(&dev).stat("used").unwrap(), used0 + 32 * MIB);
    assert_eq!(hooks(&dev).stat("malloc_calls").unwrap(), calls0 + 1);
    let e = dev.allocate(40 * MIB, S0).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert_eq!(
        e,
        BackendError::OutOfMemory {
            requested: 40 * MIB,
            free: 32 * MIB - used0
        }
    );
    let e = dev.free(a, MIB).unwrap_err();
    assert!(e.to_string().contains("allocated with 33554432"), "{e}");
    let e = dev.allocate(0, S0).unwrap_err();
    assert!(matches!(e, BackendError::InvalidValue(_)), "{e}");
    dev.free(a, 32 * MIB).unwrap();
    let e = dev.free(a, 32 * MIB).unwrap_err();
    assert!(e.to_string().contains("not a live segment"), "{e}");
    assert_eq!(dev.live(), (0, 0));
    assert_eq!(hooks(&dev).stat("used").unwrap(), used0);
    assert!(dev.as_virtual_memory().is_some() && dev.as_memcpy().is_some());
    assert!(dev.as_device_work().is_some() && dev.supports_ipc());
    assert!(!dev.has_peers(), "the fake has one device");
}

#[test]
fn events_stay_pending_on_a_held_stream_and_are_pooled() {
    let Some((_turn, dev)) = device(GIB, Mode::Default) else {
        return;
    };
    let s1 = dev.create_stream().unwrap();
    assert_ne!(s1, S0);
    let a = dev.allocate(MIB, S0).unwrap();
    dev.hold(s1).unwrap();
    dev.fill(a, MIB, 9, s1).unwrap();
    assert!(dev.pending(s1).unwrap() >= 1);
    let e = dev.record_event(s1).unwrap();
    assert!(!dev.query_event(e).unwrap(), "NOT_READY is false");
    let other = dev.record_event(S0).unwrap();
    assert!(
        dev.query_event(other).unwrap(),
        "the default stream is idle"
    );
    // S0 now waits for the held stream's event.
    dev.stream_wait_event(S0, e).unwrap();
    let after = dev.record_event(S0).unwrap();
    assert!(!dev.query_event(after).unwrap(), "S0 waits for s1");
    dev.release(s1).unwrap();
    assert!(dev.query_event(e).unwrap());
    dev.synchronize_event(after).unwrap();
    assert!(dev.query_event(after).unwrap());
    for ev in [e, other, after] {
        dev.destroy_event(ev).unwrap();
    }
    assert_eq!(dev.event_counts(), (0, 3));
    let again = dev.record_event(s1).unwrap();
    assert!(
        [e, other, after].contains(&again),
        "a pooled event is reused"
    );
    assert_eq!(dev.event_counts(), (1, 2));
    let e = dev.destroy_event(e).unwrap_err();
    assert!(matches!(e, BackendError::InvalidValue(_)), "{e}");
    dev.destroy_event(again).unwrap();
    dev.synchronize_stream(s1).unwrap();
    dev.synchronize_device().unwrap();
    assert_eq!(dev.checksum(a, MIB, S0).unwrap(), checksum_of_fill(9, MIB));
    dev.free(a, MIB).unwrap();
}

#[test]
fn a_foreign_stream_is_adopted_by_its_handle() {
    let Some((_turn, dev)) = device(GIB, Mode::Default) else {
        return;
    };
    use cudarc::driver::sys;
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: the device's constructor loaded and initialised the driver
    // and made its primary context current on this thread; `raw` is a live
    // local.
    let r = unsafe { sys::cuStreamCreate(&mut raw, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let unknown = StreamId(raw as u64);
    let e = dev.record_event(unknown).unwrap_err();
    assert!(e.to_string().contains("unknown stream"), "{e}");
    // SAFETY: `raw` is a live stream of the primary context, destroyed
    // below only after it is forgotten.
    let s = unsafe { dev.adopt_stream(raw) };
    assert_eq!(s.0, raw as u64, "the StreamId is the handle value");
    let a = dev.allocate(MIB, s).unwrap();
    dev.fill(a, MIB, 3, s).unwrap();
    let e = dev.record_event(s).unwrap();
    dev.synchronize_event(e).unwrap();
    dev.destroy_event(e).unwrap();
    assert_eq!(dev.checksum(a, MIB, s).unwrap(), checksum_of_fill(3, MIB));
    dev.free(a, MIB).unwrap();
    dev.forget_stream(s).unwrap();
    assert!(dev.forget_stream(s).is_err());
    assert!(dev.forget_stream(S0).is_err());
    // SAFETY: the stream is live and no longer known to the device.
    let r = unsafe { sys::cuStreamDestroy_v2(raw) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
}

/// Issue 29: the caching allocator refuses a stream the device does not
/// know, and again once an adopted stream is forgotten (`stream_epoch`).
#[test]
fn the_caching_allocator_refuses_unknown_and_forgotten_streams() {
    let Some((_turn, dev)) = device(GIB, Mode::Default) else {
        return;
    };
    use cudarc::driver::sys;
    let dev = std::sync::Arc::new(dev);
    let a = CachingAllocator::new(dev.clone(), AllocatorConfig::default());
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: the device's constructor made its primary context current on
    // this thread; `raw` is a live local.
    let r = unsafe { sys::cuStreamCreate(&mut raw, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let e = a.raw_alloc(MIB, StreamId(raw as u64)).unwrap_err();
    assert!(
        matches!(e, reservoir::AllocError::UnknownStream { .. }),
        "{e:?}"
    );
    // SAFETY: a live stream of the primary context, destroyed below only
    // after it is forgotten.
    let s = unsafe { dev.adopt_stream(raw) };
    let p = a.raw_alloc(MIB, s).unwrap();
    a.raw_free(p).unwrap();
    let epoch = dev.stream_epoch();
    dev.forget_stream(s).unwrap();
    assert_ne!(dev.stream_epoch(), epoch);
    let e = a.raw_alloc(MIB, s).unwrap_err();
    assert!(
        matches!(e, reservoir::AllocError::UnknownStream { .. }),
        "a forgotten stream: {e:?}"
    );
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    drop(a);
    // SAFETY: the stream is live and no longer known to the device.
    let r = unsafe { sys::cuStreamDestroy_v2(raw) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
}

#[test]
fn virtual_memory_maps_one_handle_per_page() {
    let Some((_turn, dev)) = device(16 * MIB, Mode::Default) else {
        return;
    };
    let vm = dev.as_virtual_memory().expect("the fake has VMM");
    let g = vm.granularity();
    assert_eq!(g, 2 * MIB);
    let h = hooks(&dev);
    let (creates0, used0) = (h.stat("vmm_create").unwrap(), h.stat("used").unwrap());
    let r = vm.reserve(16 * g).unwrap();
    assert!(vm.reserve(g + 1).is_err());
    vm.map(r, 2 * g, 4 * g).unwrap();
    assert_eq!(
        h.stat("vmm_create").unwrap(),
        creates0 + 4,
        "one handle per page"
    );
    assert_eq!(h.stat("used").unwrap(), used0 + 4 * g);
    assert_eq!(dev.mapped_runs(r).unwrap(), vec![(2 * g, 4 * g)]);
    dev.fill(r.base.offset(2 * g), 4 * g, 7, S0).unwrap();
    let e = dev.fill(r.base.offset(g), 2 * g, 7, S0).unwrap_err();
    assert!(e.to_string().contains("not inside live"), "{e}");
    let e = vm.map(r, 4 * g, 4 * g).unwrap_err();
    assert!(e.to_string().contains("already mapped"), "{e}");
    // Any page can go back: the middle one.
    vm.unmap(r, 3 * g, g).unwrap();
    assert_eq!(
        dev.mapped_runs(r).unwrap(),
        vec![(2 * g, g), (4 * g, 2 * g)]
    );
    assert_eq!(h.stat("used").unwrap(), used0 + 3 * g);
    let e = vm.unmap(r, 2 * g, 2 * g).unwrap_err();
    assert!(e.to_string().contains("not every page"), "{e}");
    assert_eq!(
        dev.checksum(r.base.offset(4 * g), 2 * g, S0).unwrap(),
        checksum_of_fill(7, 2 * g)
    );
    // Out of memory: 16 MiB capacity, 6 MiB mapped; 6 more pages do not
    // fit and nothing stays mapped.
    let e = vm.map(r, 8 * g, 6 * g).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert_eq!(h.stat("used").unwrap(), used0 + 3 * g);
    assert_eq!(dev.mapped_runs(r).unwrap().len(), 2);
    let e = vm.release(r).unwrap_err();
    assert!(e.to_string().contains("still mapped"), "{e}");
    vm.unmap(r, 2 * g, g).unwrap();
    vm.unmap(r, 4 * g, 2 * g).unwrap();
    vm.release(r).unwrap();
    assert!(vm.release(r).is_err());
    assert_eq!(h.stat("used").unwrap(), used0);
}

#[test]
fn memcpy_copies_on_the_stream() {
    let Some((_turn, dev)) = device(GIB, Mode::Default) else {
        return;
    };
    let s1 = dev.create_stream().unwrap();
    let a = dev.allocate(MIB, S0).unwrap();
    let b = dev.allocate(MIB, s1).unwrap();
    dev.fill(a, MIB, 0x42, S0).unwrap();
    dev.fill(a.offset(4096), 100, 0x7, S0).unwrap();
    let e = dev.record_event(S0).unwrap();
    dev.stream_wait_event(s1, e).unwrap();
    dev.destroy_event(e).unwrap();
    dev.as_memcpy().unwrap().copy(b, a, MIB, s1).unwrap();
    let bytes = dev.read(b, MIB, s1).unwrap();
    assert_eq!(bytes[4095], 0x42);
    assert_eq!(&bytes[4096..4196], &[7u8; 100][..]);
    assert_eq!(bytes[4196], 0x42);
    let e = dev.copy(b, b.offset(1), 100, s1).unwrap_err();
    assert!(e.to_string().contains("overlapping"), "{e}");
    let e = dev.fill(a, MIB + 1, 0, S0).unwrap_err();
    assert!(e.to_string().contains("not inside live"), "{e}");
    dev.free(a, MIB).unwrap();
    dev.free(b, MIB).unwrap();
}

#[test]
fn ipc_export_works_and_peer_access_is_unsupported() {
    let Some((_turn, dev)) = device(GIB, Mode::Default) else {
        return;
    };
    let a = dev.allocate(4 * MIB, S0).unwrap();
    dev.fill(a, 4 * MIB, 0x5c, S0).unwrap();
    let h = dev.ipc_get_handle(a).unwrap();
    assert_ne!(h.0, [0; 64]);
    assert!(dev.ipc_get_handle(a.offset(4096)).is_err());
    // Opening in the exporting process is the driver's INVALID_CONTEXT.
    let e = dev.ipc_open(&h).unwrap_err();
    assert!(matches!(e, BackendError::InvalidValue(_)), "{e}");
    assert!(e.to_string().contains("CUDA_ERROR_INVALID_CONTEXT"), "{e}");
    assert!(dev.ipc_close(a).is_err(), "not opened here");
    // Exporting keeps the contents.
    assert_eq!(
        dev.checksum(a, 4 * MIB, S0).unwrap(),
        checksum_of_fill(0x5c, 4 * MIB)
    );
    dev.free(a, 4 * MIB).unwrap();

    assert!(!dev.can_access_peer(0).unwrap(), "not its own peer");
    let e = dev.can_access_peer(1).unwrap_err();
    assert!(e.to_string().contains("CUDA_ERROR_INVALID_DEVICE"), "{e}");
    let e = dev.enable_peer_access(0).unwrap_err();
    assert!(matches!(e, BackendError::Unsupported { .. }), "{e}");
}

#[test]
fn a_bad_ordinal_is_a_typed_error() {
    let Some((_turn, _dev)) = device(GIB, Mode::Default) else {
        return;
    };
    let e = reservoir_cuda::CudaDevice::new(1).unwrap_err();
    assert!(
        matches!(
            e,
            reservoir_cuda::CudaError::NoDevice {
                ordinal: 1,
                count: 1
            }
        ),
        "{e}"
    );
}

fn pytorch_allocator(
    capacity: u64,
    expandable: bool,
) -> Option<(super::Turn, CachingAllocator<reservoir_cuda::CudaDevice>)> {
    let (turn, dev) = device(capacity, Mode::Default)?;
    let mut config = AllocatorConfig::default();
    config.expandable_segments = expandable;
    Some((turn, CachingAllocator::new(dev, config)))
}

#[test]
fn caching_allocator_caches_frees_and_retries_after_oom() {
    let Some((_turn, a)) = pytorch_allocator(64 * MIB, false) else {
        return;
    };
    let calls0 = hooks(a.backend()).stat("malloc_calls").unwrap();
    let p = a.raw_alloc(3 * MIB, S0).unwrap();
    let q = a.raw_alloc(5 * MIB, S0).unwrap(); // same 20 MiB segment, split
    assert_eq!(q.0, p.0 + 3 * MIB);
    a.backend().fill(p, 3 * MIB, 0xa5, S0).unwrap();
    a.backend().fill(q, 5 * MIB, 0x3c, S0).unwrap();
    assert_eq!(
        a.backend().checksum(q, 5 * MIB, S0).unwrap(),
        checksum_of_fill(0x3c, 5 * MIB)
    );
    a.raw_free(p).unwrap();
    a.raw_free(q).unwrap();
    assert_eq!(a.backend().live(), (1, 20 * MIB), "cached, not freed");
    let big = a.raw_alloc(30 * MIB, S0).unwrap();
    // 20 cached + 30 fits in 64 MiB; 40 more does not until the cache is
    // released: the allocator frees it and retries.
    let bigger = a.raw_alloc(30 * MIB, S0).unwrap();
    assert_eq!(a.backend().live(), (2, 60 * MIB));
    assert_eq!(a.stats().num_alloc_retries, 1);
    let e = a.raw_alloc(30 * MIB, S0).unwrap_err();
    assert!(
        e.to_string().to_lowercase().contains("out of memory"),
        "{e}"
    );
    a.raw_free(big).unwrap();
    a.raw_free(bigger).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.backend().live(), (0, 0));
    assert!(hooks(a.backend()).stat("malloc_calls").unwrap() >= calls0 + 3);
    a.check_invariants().unwrap();
}

#[test]
fn caching_allocator_with_expandable_segments_maps_pages() {
    let Some((_turn, a)) = pytorch_allocator(GIB, true) else {
        return;
    };
    let h = hooks(a.backend());
    let (used0, maps0) = (h.stat("used").unwrap(), h.stat("vmm_map").unwrap());
    let mut live = Vec::new();
    for (i, size) in [3 * MIB, 30 * MIB, 4096, 700 * 1024, 45 * MIB]
        .into_iter()
        .enumerate()
    {
        let p = a.raw_alloc(size, S0).unwrap();
        a.backend().fill(p, size, i as u8 + 1, S0).unwrap();
        live.push((p, size, i as u8 + 1));
    }
    assert_eq!(a.backend().live(), (0, 0), "no cuMemAlloc segments");
    assert!(h.stat("vmm_map").unwrap() > maps0);
    for &(p, size, byte) in &live {
        assert_eq!(
            a.backend().checksum(p, size, S0).unwrap(),
            checksum_of_fill(byte, size)
        );
    }
    for (p, _, _) in live {
        a.raw_free(p).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(
        h.stat("used").unwrap(),
        used0,
        "every page unmapped and released"
    );
    a.check_invariants().unwrap();
}

#[test]
fn caching_allocator_honours_record_stream_across_streams() {
    let Some((_turn, a)) = pytorch_allocator(GIB, false) else {
        return;
    };
    let dev = a.backend();
    let busy = dev.create_stream().unwrap();
    let p = a.raw_alloc(MIB, S0).unwrap();
    dev.hold(busy).unwrap();
    dev.fill(p, MIB, 0x5a, busy).unwrap();
    a.record_stream(p, busy).unwrap();
    a.raw_free(p).unwrap();
    let q = a.raw_alloc(MIB, S0).unwrap();
    assert_ne!(q, p, "not reused while the stream is busy");
    dev.release(busy).unwrap();
    let r = a.raw_alloc(MIB, S0).unwrap();
    assert_eq!(r, p, "reused once the stream finished");
    assert_eq!(
        dev.checksum(r, MIB, S0).unwrap(),
        checksum_of_fill(0x5a, MIB)
    );
    a.raw_free(q).unwrap();
    a.raw_free(r).unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn in_async_mode_work_stays_pending_until_synchronized() {
    let Some((_turn, dev)) = device(GIB, Mode::AsyncSanitized) else {
        return;
    };
    assert!(hooks(&dev).is_async());
    let s1 = dev.create_stream().unwrap();
    let a = dev.allocate(MIB, s1).unwrap();
    dev.fill(a, MIB, 1, s1).unwrap();
    let e = dev.record_event(s1).unwrap();
    assert!(!dev.query_event(e).unwrap(), "nothing completes by itself");
    assert!(dev.pending(s1).unwrap() >= 1);
    dev.synchronize_stream(s1).unwrap();
    assert!(dev.query_event(e).unwrap());
    dev.destroy_event(e).unwrap();
    dev.free(a, MIB).unwrap();
    assert_eq!(hooks(&dev).sanitizer_violations(), 0);
}

#[test]
fn without_a_driver_the_constructor_is_a_typed_error() {
    let out = super::run_child("no-driver", |cmd| {
        cmd.env_remove("LD_LIBRARY_PATH");
    });
    assert!(out.contains("child: "), "{out}");
}

#[test]
fn another_process_opens_an_exported_segment() {
    let Some((_turn, dev)) = device(GIB, Mode::Default) else {
        return;
    };
    let a = dev.allocate(4 * MIB, S0).unwrap();
    dev.fill(a, 4 * MIB, 0x3d, S0).unwrap();
    dev.fill(a.offset(MIB), 1000, 0x11, S0).unwrap();
    let expected = dev.checksum(a, 4 * MIB, S0).unwrap();
    let h = dev.ipc_get_handle(a).unwrap();
    let hex: String = h.0.iter().map(|b| format!("{b:02x}")).collect();
    let out = super::run_child(&format!("ipc {hex} {} {expected}", 4 * MIB), |_| {});
    assert!(out.contains("contents match"), "{out}");
    dev.free(a, 4 * MIB).unwrap();
}
