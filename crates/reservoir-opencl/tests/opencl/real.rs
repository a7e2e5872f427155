//! The tests proper, built when `libOpenCL.so` is there (see `../opencl.rs`).

use reservoir::checksum::checksum_of_fill;
use reservoir::config::heap::HeapSettings;
use reservoir::heap::HeapAllocator;
use reservoir::{AllocatorConfig, Backend, CachingAllocator, DevicePtr, StreamId};
use reservoir_opencl::{BackendError, DeviceWork, Memcpy, OpenClConfig, OpenClDevice};
use reservoir_testkit::conformance::{held_stream_reuse, integrity_run, IntegrityConfig};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

/// PoCL's platform and device set-up is not safe to run from several test
/// threads at once (it crashed here): the tests take turns.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn device(config: OpenClConfig) -> Option<OpenClDevice> {
    reservoir_opencl::limit_pocl_threads(1);
    match OpenClDevice::new(config) {
        Ok(d) => Some(d),
        Err(e) => {
            super::report(&format!("SKIPPED-BACKEND opencl: {e}"));
            None
        }
    }
}

fn default_device() -> Option<OpenClDevice> {
    device(OpenClConfig {
        capacity: 512 * MIB,
        ..OpenClConfig::default()
    })
}

#[test]
fn fill_copy_and_checksum_move_real_bytes() {
    let _serial = serial();
    let Some(dev) = default_device() else { return };
    let s1 = dev.create_stream().unwrap();
    let a = dev.allocate(MIB, S0).unwrap();
    let b = dev.allocate(MIB, s1).unwrap();
    dev.fill(a, MIB, 0x42, S0).unwrap();
    dev.fill(a.offset(4096), 100, 0x7, S0).unwrap(); // an inner pointer
    let e = dev.record_event(S0).unwrap();
    dev.stream_wait_event(s1, e).unwrap();
    dev.copy(b, a, MIB, s1).unwrap();
    let bytes = dev.read(b, MIB, s1).unwrap();
    assert_eq!(bytes[4095], 0x42);
    assert_eq!(&bytes[4096..4196], &[7u8; 100][..]);
    assert_eq!(bytes[4196], 0x42);
    assert!(dev.query_event(e).unwrap());
    dev.destroy_event(e).unwrap();
    let err = dev.fill(a, MIB + 1, 0, S0).unwrap_err();
    assert!(err.to_string().contains("not inside a live"), "{err}");
    dev.free(a, MIB).unwrap();
    dev.free(b, MIB).unwrap();
    assert_eq!(dev.live(), (0, 0));
}

#[test]
fn budget_and_bad_frees_are_typed_errors() {
    let _serial = serial();
    let Some(dev) = device(OpenClConfig {
        capacity: 4 * MIB,
        ..OpenClConfig::default()
    }) else {
        return;
    };
    let a = dev.allocate(3 * MIB, S0).unwrap();
    let e = dev.allocate(2 * MIB, S0).unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert_eq!(
        e,
        BackendError::OutOfMemory {
            requested: 2 * MIB,
            free: MIB
        }
    );
    assert_eq!(dev.mem_info().unwrap().total, 4 * MIB);
    let e = dev.free(a, MIB).unwrap_err();
    assert!(e.to_string().contains("allocated with 3145728"), "{e}");
    dev.free(a, 3 * MIB).unwrap();
    let e = dev.free(a, 3 * MIB).unwrap_err();
    assert!(e.to_string().contains("not a live allocation"), "{e}");
}

#[test]
fn a_held_queue_keeps_its_markers_pending() {
    let _serial = serial();
    let Some(dev) = default_device() else { return };
    let s1 = dev.create_stream().unwrap();
    let a = dev.allocate(MIB, S0).unwrap();
    dev.hold(s1).unwrap();
    dev.fill(a, MIB, 9, s1).unwrap();
    let e = dev.record_event(s1).unwrap();
    let other = dev.record_event(S0).unwrap();
    dev.synchronize_event(other).unwrap();
    assert!(!dev.query_event(e).unwrap(), "held behind the user event");
    let refused = dev.free(a, MIB).unwrap_err();
    assert!(refused.to_string().contains("is held"), "{refused}");
    dev.release(s1).unwrap();
    assert!(dev.query_event(e).unwrap());
    assert_eq!(dev.checksum(a, MIB, S0).unwrap(), checksum_of_fill(9, MIB));
    dev.free(a, MIB).unwrap();
}

#[test]
fn block_of_a_busy_queue_is_not_reused_until_the_queue_completes() {
    let _serial = serial();
    // spec 1.10 on a real device: the freed block is not handed out while
    // the held queue may still write it, and is handed out afterwards; the
    // held queue's bytes are intact when read after the release.
    let Some(dev) = default_device() else { return };
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let busy = a.backend().create_stream().unwrap();
    for size in [4096, 3 * MIB] {
        let out = held_stream_reuse(&a, S0, busy, size).unwrap();
        assert_ne!(out.while_busy, out.freed, "size {size}: reused while busy");
        assert_eq!(out.after, out.freed, "size {size}: not reused after");
        assert_eq!(out.data_intact, Some(true), "size {size}");
    }
    a.check_invariants().unwrap();
}

fn integrity(config: AllocatorConfig, label: &str) {
    let Some(dev) = default_device() else { return };
    let a = CachingAllocator::new(dev, config);
    let cfg = IntegrityConfig::backend_run();
    let rep = integrity_run(&a, &cfg).unwrap();
    a.check_invariants().unwrap();
    super::report(&format!(
        "opencl integrity{label}: {} ops, {} streams, {} corruptions ({} read-backs, {} copies, \
         {} frees, {} empty_cache, peak reserved {} bytes, {} cross-stream reuses)",
        rep.ops,
        rep.streams,
        rep.corruptions.len(),
        rep.verified,
        rep.copies,
        rep.frees,
        rep.empty_caches,
        rep.peak_reserved,
        a.cross_stream_reuses()
    ));
    assert!(rep.corruptions.is_empty(), "{:?}", rep.corruptions);
    assert!(rep.verified > 1000 && rep.copies > 500, "{rep:?}");
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
}

#[test]
fn randomized_multi_stream_integrity() {
    let _serial = serial();
    integrity(AllocatorConfig::default(), "");
}

#[test]
fn randomized_multi_stream_integrity_with_cross_stream_reuse() {
    let _serial = serial();
    let mut c = AllocatorConfig::default();
    c.policy = reservoir::config::ReservoirPolicy::CrossStreamReuse;
    integrity(c, " (cross-stream reuse)");
}

#[test]
fn fine_grained_svm_serves_the_allocator_too() {
    let _serial = serial();
    let Some(dev) = device(OpenClConfig {
        capacity: 64 * MIB,
        fine_grained: true,
        ..OpenClConfig::default()
    }) else {
        return;
    };
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let p = a.raw_alloc(3 * MIB, S0).unwrap();
    let q = a.raw_alloc(5 * MIB, S0).unwrap(); // same 20 MiB segment, split
    assert_eq!(q.0, p.0 + 3 * MIB);
    a.backend().fill(p, 3 * MIB, 0xa5, S0).unwrap();
    a.backend().fill(q, 5 * MIB, 0x3c, S0).unwrap();
    assert_eq!(
        a.backend().checksum(p, 3 * MIB, S0).unwrap(),
        checksum_of_fill(0xa5, 3 * MIB)
    );
    assert_eq!(
        a.backend().checksum(q, 5 * MIB, S0).unwrap(),
        checksum_of_fill(0x3c, 5 * MIB)
    );
    a.raw_free(p).unwrap();
    a.raw_free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.backend().live(), (0, 0));
}

#[test]
fn without_record_stream_the_busy_queue_corrupts_the_next_owner() {
    let _serial = serial();
    // The negative control: the same sequence as the proof test but without
    // record_stream. The block is handed out again at once, and the held
    // queue's late write lands in the new owner's data, which the checksum
    // shows. This is the bug record_stream exists to prevent.
    let Some(dev) = default_device() else { return };
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let dev = a.backend();
    let busy = dev.create_stream().unwrap();
    let p = a.raw_alloc(MIB, S0).unwrap();
    dev.hold(busy).unwrap();
    dev.fill(p, MIB, 0x5a, busy).unwrap();
    a.raw_free(p).unwrap(); // missing: a.record_stream(p, busy)
    let q = a.raw_alloc(MIB, S0).unwrap();
    assert_eq!(q, p, "handed out again while the queue is busy");
    dev.fill(q, MIB, 0x22, S0).unwrap();
    assert_eq!(
        dev.checksum(q, MIB, S0).unwrap(),
        checksum_of_fill(0x22, MIB)
    );
    dev.release(busy).unwrap();
    assert_eq!(
        dev.checksum(q, MIB, S0).unwrap(),
        checksum_of_fill(0x5a, MIB),
        "the busy queue's late write overwrote the new owner's data"
    );
    a.raw_free(q).unwrap();
}

#[test]
fn heap_shared_buffer_pointer_is_svm() {
    let _serial = serial();
    // getSharedBufferPtr on OpenCL: the SVM address, whose bytes the host
    // reads back; allocScalarBufferWithValue writes real bytes.
    let Some(dev) = default_device() else { return };
    let a = HeapAllocator::new(dev, HeapSettings::new(true)).unwrap();
    let shared = a.shared_allocator().unwrap();
    let s = shared.allocate(3 * MIB).unwrap();
    let (host, retain) = a.shared_buffer_ptr(s).unwrap();
    assert_eq!((host, retain), (s.0, 1));
    a.backend().fill(s, 3 * MIB, 0x3c, S0).unwrap();
    let bytes = a.backend().read(DevicePtr(host), 3 * MIB, S0).unwrap();
    assert!(bytes.iter().all(|&b| b == 0x3c));
    let value = 42u64.to_le_bytes();
    let v = a.alloc_scalar_buffer_with_value(&value).unwrap();
    assert_eq!(a.backend().read(v, 8, S0).unwrap(), value);
    a.free(v).unwrap();
    shared.delete(s).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.backend().live(), (0, 0));
}

#[test]
fn randomized_multi_stream_integrity_of_the_mps_heap() {
    let _serial = serial();
    // The heap allocator over real OpenCL queues: every piece of work is
    // recorded on its buffers (record_use), a buffer freed while work runs
    // waits in the pending set (free_waits_for_events: several queues),
    // real fills and checksums.
    let Some(dev) = default_device() else { return };
    let mut settings = HeapSettings::new(true);
    settings.free_waits_for_events = true;
    let a = HeapAllocator::new(dev, settings).unwrap();
    let cfg = IntegrityConfig::backend_run();
    let rep = integrity_run(&a, &cfg).unwrap();
    a.check_invariants().unwrap();
    super::report(&format!(
        "opencl integrity (mps heap): {} ops, {} streams, {} corruptions ({} read-backs, {} copies, \
         {} frees, {} empty_cache, peak reserved {} bytes)",
        rep.ops,
        rep.streams,
        rep.corruptions.len(),
        rep.verified,
        rep.copies,
        rep.frees,
        rep.empty_caches,
        rep.peak_reserved,
    ));
    assert!(rep.corruptions.is_empty(), "{:?}", rep.corruptions);
    assert!(rep.verified > 1000 && rep.copies > 500, "{rep:?}");
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
}
