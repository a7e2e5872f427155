//! The stream-safety scenarios of `reservoir_testkit::conformance` on the CUDA
//! backend (every use of that module by these tests is in this file), in
//! the fake's default mode and with `FAKECUDA_ASYNC=1 FAKECUDA_SANITIZE=1`,
//! where nothing completes by itself and the fake reports every access to
//! bytes that pending work of another stream (not waited for) still uses.
//!
//! The fake moves data when a call is made, so a missing `record_stream`
//! cannot show up as corrupt bytes there (as it does on PoCL); it shows up
//! as a block handed out while the held stream's work on it is pending,
//! and as sanitizer reports.

use reservoir::config::heap::HeapSettings;
use reservoir::heap::HeapAllocator;
use reservoir::{AllocatorConfig, Backend, CachingAllocator, StreamId};
use reservoir_cuda::{CudaDevice, DeviceWork};
use reservoir_testkit::conformance::{held_stream_reuse, integrity_run, IntegrityConfig};

use super::{device, hooks, report, Mode, Turn, MIB};

const S0: StreamId = StreamId::DEFAULT;

fn allocator(mode: Mode, config: AllocatorConfig) -> Option<(Turn, CachingAllocator<CudaDevice>)> {
    let (turn, dev) = device(1 << 30, mode)?;
    Some((turn, CachingAllocator::new(dev, config)))
}

fn held_reuse(mode: Mode) {
    let Some((_turn, a)) = allocator(mode, AllocatorConfig::default()) else {
        return;
    };
    let busy = a.backend().create_stream().unwrap();
    for size in [4096, 3 * MIB] {
        let out = held_stream_reuse(&a, S0, busy, size).unwrap();
        assert_ne!(out.while_busy, out.freed, "size {size}: reused while busy");
        assert_eq!(out.after, out.freed, "size {size}: not reused after");
        assert_eq!(out.data_intact, Some(true), "size {size}");
    }
    a.check_invariants().unwrap();
    let h = hooks(a.backend());
    assert_eq!(h.sanitizer_violations(), 0, "{}", h.sanitizer_last());
}

#[test]
fn block_of_a_held_stream_is_not_reused_until_the_stream_completes() {
    held_reuse(Mode::Default);
}

#[test]
fn block_of_a_held_stream_is_not_reused_async_sanitized() {
    held_reuse(Mode::AsyncSanitized);
}

fn integrity(mode: Mode, config: AllocatorConfig, label: &str) {
    let Some((_turn, a)) = allocator(mode, config) else {
        return;
    };
    let cfg = IntegrityConfig::backend_run();
    let rep = integrity_run(&a, &cfg).unwrap();
    a.check_invariants().unwrap();
    let h = hooks(a.backend());
    let reports = h.sanitizer_violations();
    report(&format!(
        "cuda integrity{label}: {} ops, {} streams, {} corruptions, {reports} sanitizer reports \
         ({} read-backs, {} copies, {} frees, {} empty_cache, peak reserved {} bytes, \
         {} cross-stream reuses, {} segment allocations, {} forced syncs)",
        rep.ops,
        rep.streams,
        rep.corruptions.len(),
        rep.verified,
        rep.copies,
        rep.frees,
        rep.empty_caches,
        rep.peak_reserved,
        a.cross_stream_reuses(),
        a.stats().num_device_alloc,
        h.stat("forced_syncs").unwrap_or(0),
    ));
    assert!(rep.corruptions.is_empty(), "{:?}", rep.corruptions);
    assert_eq!(reports, 0, "{}", h.sanitizer_last());
    assert!(rep.verified > 1000 && rep.copies > 500, "{rep:?}");
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
}

#[test]
fn randomized_multi_stream_integrity() {
    integrity(Mode::Default, AllocatorConfig::default(), "");
}

#[test]
fn randomized_multi_stream_integrity_async_sanitized() {
    integrity(
        Mode::AsyncSanitized,
        AllocatorConfig::default(),
        " (async, sanitizer)",
    );
}

#[test]
fn randomized_multi_stream_integrity_expandable_async_sanitized() {
    let mut c = AllocatorConfig::default();
    c.expandable_segments = true;
    integrity(
        Mode::AsyncSanitized,
        c,
        " (expandable segments, async, sanitizer)",
    );
}

#[test]
fn randomized_multi_stream_integrity_cross_stream_reuse_async_sanitized() {
    // The Reservoir-only policy: blocks are reused across streams at once,
    // ordered with cuStreamWaitEvent instead of waiting on the host.
    let mut c = AllocatorConfig::default();
    c.policy = reservoir::config::ReservoirPolicy::CrossStreamReuse;
    integrity(
        Mode::AsyncSanitized,
        c,
        " (cross-stream reuse, async, sanitizer)",
    );
}

#[test]
fn randomized_multi_stream_integrity_reservoir_policy_async_sanitized() {
    // The Reservoir-only `reservoir` policy: expandable segments in 2 MiB
    // pages whose free pages are unmapped (after a stream sync) before the
    // cache grows past its target.
    integrity(
        Mode::AsyncSanitized,
        AllocatorConfig::parse_with_policy("policy:reservoir").unwrap(),
        " (reservoir policy, async, sanitizer)",
    );
}

/// The negative control: the proof scenario without `record_stream`. The
/// block is handed out again while the held stream's write to it is still
/// pending, and the new owner's write is a cross-stream hazard.
fn missing_record_stream(mode: Mode) -> Option<u64> {
    let (_turn, a) = allocator(mode, AllocatorConfig::default())?;
    let dev = a.backend();
    let busy = dev.create_stream().unwrap();
    let p = a.raw_alloc(MIB, S0).unwrap();
    let ready = dev.record_event(S0).unwrap();
    dev.hold(busy).unwrap();
    dev.stream_wait_event(busy, ready).unwrap();
    dev.destroy_event(ready).unwrap();
    dev.fill(p, MIB, 0x5a, busy).unwrap();
    a.raw_free(p).unwrap(); // missing: a.record_stream(p, busy)
    let q = a.raw_alloc(MIB, S0).unwrap();
    assert_eq!(q, p, "handed out again while the stream is busy");
    assert!(dev.pending(busy).unwrap() >= 1, "the busy write is pending");
    dev.fill(q, MIB, 0x22, S0).unwrap();
    dev.release(busy).unwrap();
    a.raw_free(q).unwrap();
    let h = hooks(dev);
    let reports = h.sanitizer_violations();
    if reports > 0 {
        report(&format!(
            "cuda sanitizer negative control: {reports} report(s) without record_stream; \
             last: {}",
            h.sanitizer_last().trim()
        ));
    }
    Some(reports)
}

#[test]
fn without_record_stream_the_block_is_reused_while_busy() {
    missing_record_stream(Mode::Default);
}

#[test]
fn without_record_stream_the_sanitizer_reports_the_hazard() {
    if let Some(reports) = missing_record_stream(Mode::AsyncSanitized) {
        assert!(reports > 0, "the sanitizer missed the hazard");
    }
}

#[test]
fn randomized_multi_stream_integrity_of_the_mps_heap_async_sanitized() {
    // The MPS heap allocator on the CUDA backend, where nothing completes
    // by itself: every piece of work is recorded on its buffers
    // (record_use; several streams, so the pending-free path), and the sanitizer sees no access to a buffer while
    // another stream's work on it is pending.
    let Some((_turn, dev)) = device(1 << 30, Mode::AsyncSanitized) else {
        return;
    };
    let mut settings = HeapSettings::new(false);
    settings.free_waits_for_events = true;
    let a = HeapAllocator::new(dev, settings).unwrap();
    let cfg = IntegrityConfig::backend_run();
    let rep = integrity_run(&a, &cfg).unwrap();
    a.check_invariants().unwrap();
    let h = hooks(a.backend());
    let reports = h.sanitizer_violations();
    report(&format!(
        "cuda integrity (mps heap, async, sanitizer): {} ops, {} streams, {} corruptions, \
         {reports} sanitizer reports ({} read-backs, {} copies, {} frees, {} empty_cache, \
         peak reserved {} bytes, {} heap allocations)",
        rep.ops,
        rep.streams,
        rep.corruptions.len(),
        rep.verified,
        rep.copies,
        rep.frees,
        rep.empty_caches,
        rep.peak_reserved,
        a.stats().num_device_alloc,
    ));
    assert!(rep.corruptions.is_empty(), "{:?}", rep.corruptions);
    assert_eq!(reports, 0, "{}", h.sanitizer_last());
    assert!(rep.verified > 1000 && rep.copies > 500, "{rep:?}");
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
}
