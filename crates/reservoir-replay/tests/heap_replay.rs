//! The MPS heap allocator (`--policy mps-heap`) in the replay engine: the
//! built-in workloads and the recorded traces of `../shared/traces` run
//! through it, with heaps counted as segments.

use reservoir::heap::HeapAllocator;
use reservoir::sim::{SimDevice, DEFAULT_CAPACITY};
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::replay::recorded::{convert, recorded_setting, replay_recorded};
use reservoir_replay::replay::{
    replay, AllocatorKind, Replay, ReplayOptions, ReplaySetting, ReplayTarget,
};
use reservoir_replay::workload;
use reservoir_testkit::traces::{shared_traces, trace_files};

#[test]
fn a_workload_replays_through_the_heap_allocator() {
    let trace = workload::generate("gpt-train:layers=2,steps=2").unwrap();
    let setting = ReplaySetting::mps_heap();
    assert_eq!(setting.allocator, AllocatorKind::MpsHeap);
    let options = ReplayOptions::default();
    let mut r =
        Replay::<HeapAllocator<SimDevice>>::build(&trace, None, &setting, &options).unwrap();
    r.run().unwrap();
    let heap = r.allocator();
    heap.check_invariants().unwrap();
    let report = r.report();
    assert_eq!(report.setting, "mps-heap");
    assert_eq!(report.ooms, 0);
    assert!(report.peak_allocated > 0);
    assert!(report.peak_reserved >= report.peak_allocated);
    // Heaps are segments: one device allocation each.
    let stats = heap.stats();
    assert_eq!(report.driver_allocs, stats.num_device_alloc as u64);
    assert_eq!(
        stats.segment.all().current as usize,
        ReplayTarget::segments(heap).len()
    );
    assert_eq!(
        stats.reserved_bytes.all().current as u64,
        heap.total_allocated_memory()
    );
    // The same through `replay`, and differently from the caching allocator.
    let again = replay(&trace, &setting, &options).unwrap();
    assert_eq!(again.peak_reserved, report.peak_reserved);
    let caching = replay(&trace, &ReplaySetting::new("pytorch", ""), &options).unwrap();
    // Same ops; buffers are whole 16 KiB-aligned buffers, not 512-byte
    // rounded blocks, so the numbers differ.
    assert_eq!(
        (caching.alloc_ops, caching.free_ops),
        (report.alloc_ops, report.free_ops)
    );
    assert_ne!(caching.driver_allocs, report.driver_allocs);
}

#[test]
fn recorded_traces_replay_through_the_heap_allocator() {
    let Some(dir) = shared_traces() else {
        eprintln!("skipped: ../shared/traces not found (set RESERVOIR_TRACES)");
        return;
    };
    let mut replayed = 0;
    for path in trace_files(&dir) {
        // The small ones: the benchmark (BENCHMARKS.md) runs them all.
        if std::fs::metadata(&path).unwrap().len() > 2 << 20 {
            continue;
        }
        let Ok(loaded) = input::load(&path) else {
            continue;
        };
        let input = loaded.to_trace_input();
        let config = recorded_setting(input.allocator_settings.as_ref())
            .allocator_config()
            .unwrap();
        for dev in input.devices.iter().filter(|d| !d.events.is_empty()) {
            let Ok(rec) = convert(dev, &config, input.addresses == AddressKind::Synthetic) else {
                continue;
            };
            let options = ReplayOptions {
                capacity: rec.capacity.unwrap_or(DEFAULT_CAPACITY),
                ..ReplayOptions::default()
            };
            let (report, fid) = replay_recorded(
                &rec,
                &ReplaySetting::mps_heap(),
                &options,
                true,
                &mut |_| {},
            )
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(fid.is_none());
            assert!(
                report.peak_reserved >= report.peak_allocated,
                "{}",
                path.display()
            );
            replayed += 1;
        }
    }
    assert!(replayed >= 5, "only {replayed} traces replayed");
}

/// `--policy mps-heap` is the seed's 2.7-era allocator (audit #19, #31):
/// a buffer freed while a `record_stream`ed stream still runs goes back to
/// its pool at once and the next request of its size reuses it (2.x's
/// `free`); the stream's use keeps its retain count above 1, so under
/// memory pressure an oversize one is released rather than reused.
#[test]
fn the_replay_heap_allocator_frees_as_the_seed_does() {
    use reservoir::config::AllocatorConfig;
    use reservoir::sim::SimConfig;
    use reservoir::{Backend, StreamId};
    let dev = SimDevice::new(SimConfig {
        capacity: 8 << 30,
        ..SimConfig::default()
    });
    let a = <HeapAllocator<SimDevice> as ReplayTarget>::on_device(dev, AllocatorConfig::default());
    let s1 = a.backend().create_stream().unwrap();
    a.backend().hold_stream(s1).unwrap();
    let p = ReplayTarget::alloc(&a, 4 << 20, StreamId::DEFAULT).unwrap();
    a.backend().enqueue_work(s1).unwrap();
    a.record_stream(p, s1).unwrap();
    ReplayTarget::free(&a, p).unwrap();
    assert_eq!(a.current_allocated_memory(), 0);
    assert_eq!(
        ReplayTarget::alloc(&a, 4 << 20, StreamId::DEFAULT).unwrap(),
        p
    );
    // A pointer the allocator does not know is refused.
    assert!(a.record_stream(reservoir::DevicePtr(0x10), s1).is_err());
    a.backend().release_stream(s1).unwrap();
    a.check_invariants().unwrap();
}
