//! Stream safety on the asynchronous simulated device, with the race
//! sanitizer on (spec 1.10), and the Reservoir-only cross-stream reuse policy.

use reservoir::backend::DeviceWork;
use reservoir::sim::{Access, AsyncSimDevice, RaceKind, SimConfig};
use reservoir::{AllocatorConfig, Backend, CachingAllocator, StreamId};

use crate::common::*;

fn allocator(config: AllocatorConfig) -> CachingAllocator<AsyncSimDevice> {
    let dev = AsyncSimDevice::new(SimConfig {
        capacity: 8 * GIB,
        ..SimConfig::default()
    });
    CachingAllocator::new(dev, config)
}

fn cross_stream() -> AllocatorConfig {
    let mut c = AllocatorConfig::default();
    c.policy = reservoir::config::ReservoirPolicy::CrossStreamReuse;
    c
}

#[test]
fn sanitizer_catches_a_free_without_record_stream() {
    // The classic bug: a block used on another stream is freed without
    // record_stream, so the allocator hands it out again at once while the
    // other stream's work on it is still running.
    let a = allocator(AllocatorConfig::default());
    let dev = a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = a.raw_alloc(MIB, S0).unwrap();
    dev.fill(p, MIB, 1, S0).unwrap();
    let e = dev.record_event(S0).unwrap();
    dev.stream_wait_event(s1, e).unwrap();
    dev.enqueue(s1, 50_000, &[Access::write(p, MIB)]).unwrap();
    a.raw_free(p).unwrap(); // missing: a.record_stream(p, s1)
    let q = a.raw_alloc(MIB, S0).unwrap();
    assert_eq!(q, p, "reused at once");
    let races = dev.take_races();
    assert_eq!(races.len(), 1, "{races:?}");
    assert_eq!(races[0].kind, RaceKind::HandedOutWhileInUse);
    assert_eq!((races[0].stream, races[0].other_stream), (S0, s1));
    // The first write of the new owner races with s1's write too.
    dev.fill(q, 16, 2, S0).unwrap();
    assert_eq!(dev.take_races()[0].kind, RaceKind::DataRace);

    // The same sequence with record_stream: no report.
    let r = a.raw_alloc(2 * MIB, S0).unwrap();
    let e = dev.record_event(S0).unwrap();
    dev.stream_wait_event(s1, e).unwrap();
    dev.enqueue(s1, 50_000, &[Access::write(r, 2 * MIB)])
        .unwrap();
    a.record_stream(r, s1).unwrap();
    a.raw_free(r).unwrap();
    let t = a.raw_alloc(2 * MIB, S0).unwrap();
    assert_ne!(t, r);
    dev.assert_no_races();
}

#[test]
fn sanitizer_catches_a_driver_free_under_running_work() {
    // empty_cache without the synchronisation PyTorch does would free a
    // segment another stream still writes: the device reports it.
    let dev = AsyncSimDevice::default();
    let s1 = dev.create_stream().unwrap();
    let p = dev.allocate(2 * MIB, S0).unwrap();
    dev.enqueue(s1, 10_000, &[Access::write(p, 64)]).unwrap();
    dev.free(p, 2 * MIB).unwrap();
    assert_eq!(dev.races()[0].kind, RaceKind::DriverFreeWhileInUse);
    // The allocator's empty_cache synchronises the events first: no report.
    let a = allocator(AllocatorConfig::default());
    let s1 = a.backend().create_stream().unwrap();
    let q = a.raw_alloc(30 * MIB, S0).unwrap();
    a.backend()
        .enqueue(s1, 10_000, &[Access::write(q, 64)])
        .unwrap();
    a.record_stream(q, s1).unwrap();
    a.raw_free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().num_sync_all_streams, 1);
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
    a.backend().assert_no_races();
}

#[test]
fn events_are_reaped_per_stream_as_the_clock_passes_them() {
    // spec 1.10: process_events at every malloc, no head-of-line blocking.
    let a = allocator(AllocatorConfig::default());
    let dev = a.backend();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let p = a.raw_alloc(30 * MIB, S0).unwrap();
    let q = a.raw_alloc(40 * MIB, S0).unwrap();
    dev.enqueue(s1, 1_000_000, &[Access::read(p, 8)]).unwrap();
    dev.enqueue(s2, 1_000, &[Access::read(q, 8)]).unwrap();
    a.record_stream(p, s1).unwrap();
    a.record_stream(q, s2).unwrap();
    a.raw_free(p).unwrap();
    a.raw_free(q).unwrap();
    dev.advance(1_000);
    assert_eq!(a.raw_alloc(40 * MIB, S0).unwrap(), q, "s2's event is done");
    assert_ne!(a.raw_alloc(30 * MIB, S0).unwrap(), p, "s1 still running");
    dev.run_until_idle();
    assert_eq!(a.raw_alloc(30 * MIB, S0).unwrap(), p);
    dev.assert_no_races();
    a.check_invariants().unwrap();
}

#[test]
fn cross_stream_reuse_is_off_and_invisible_in_pytorch_mode() {
    let on = cross_stream();
    assert_eq!(
        on.to_settings_string(),
        AllocatorConfig::default().to_settings_string()
    );
    assert!(
        AllocatorConfig::default().policy != reservoir::config::ReservoirPolicy::CrossStreamReuse
    );
    // PyTorch mode: a block cached on s1 never serves s2.
    let a = allocator(AllocatorConfig::default());
    let dev = a.backend();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let p = a.raw_alloc(4 * MIB, s1).unwrap();
    a.raw_free(p).unwrap();
    assert_ne!(a.raw_alloc(4 * MIB, s2).unwrap(), p);
    assert_eq!(a.cross_stream_reuses(), 0);
}

#[test]
fn cross_stream_reuse_moves_a_whole_segment_after_a_wait() {
    let a = allocator(cross_stream());
    let dev = a.backend();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let p = a.raw_alloc(4 * MIB, s1).unwrap();
    dev.fill(p, 4 * MIB, 1, s1).unwrap(); // still running on s1
    a.raw_free(p).unwrap();
    let q = a.raw_alloc(4 * MIB, s2).unwrap();
    assert_eq!(q, p, "borrowed from s1's cache");
    assert_eq!(a.cross_stream_reuses(), 1);
    assert_eq!(a.segments()[0].stream, s2, "the whole segment moved to s2");
    dev.fill(q, 4 * MIB, 2, s2).unwrap();
    assert!(dev.stream_finish(s2).unwrap() > dev.stream_finish(s1).unwrap());
    a.raw_free(q).unwrap();
    assert_eq!(a.raw_alloc(4 * MIB, s2).unwrap(), p, "now s2's own block");
    assert_eq!(a.cross_stream_reuses(), 1);
    dev.assert_no_races();
    a.check_invariants().unwrap();
}

#[test]
fn cross_stream_reuse_lends_a_piece_of_a_split_segment() {
    let a = allocator(cross_stream());
    let dev = a.backend();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let p = a.raw_alloc(4 * MIB, s1).unwrap();
    let keep = a.raw_alloc(4 * MIB, s1).unwrap(); // the segment stays split
    dev.fill(p, 4 * MIB, 1, s1).unwrap();
    a.raw_free(p).unwrap();
    let q = a.raw_alloc(4 * MIB, s2).unwrap();
    assert_eq!(q, p, "the free piece is borrowed");
    assert_eq!(a.segments()[0].stream, s1, "a piece cannot move alone");
    dev.fill(q, 4 * MIB, 2, s2).unwrap();
    dev.assert_no_races();
    // s2 is a user of the piece: freeing it waits for s2's work.
    a.raw_free(q).unwrap();
    let x = a.raw_alloc(4 * MIB, s1).unwrap();
    assert_ne!(x, p, "s2's work is still running");
    dev.run_until_idle();
    a.raw_free(x).unwrap();
    assert_eq!(a.raw_alloc(4 * MIB, s1).unwrap(), p);
    a.raw_free(keep).unwrap();
    dev.assert_no_races();
    a.check_invariants().unwrap();
}

#[test]
fn phase_shifted_streams_share_one_cache_with_cross_stream_reuse() {
    // Stream s1 builds and frees a working set, then s2 builds the same one:
    // PyTorch mode reserves both, cross-stream reuse one.
    for (config, expected_segments) in [(AllocatorConfig::default(), 16), (cross_stream(), 8)] {
        let a = allocator(config);
        let dev = a.backend();
        let streams: Vec<StreamId> = (0..2).map(|_| dev.create_stream().unwrap()).collect();
        for &s in &streams {
            let ptrs: Vec<_> = (0..8).map(|_| a.raw_alloc(15 * MIB, s).unwrap()).collect();
            for &p in &ptrs {
                dev.fill(p, 15 * MIB, 3, s).unwrap();
            }
            for p in ptrs {
                a.raw_free(p).unwrap();
            }
        }
        assert_eq!(a.stats().segment.all().current, expected_segments);
        dev.assert_no_races();
    }
}

/// A simulated device without `stream_wait_event` (the trait's default).
struct NoWait(reservoir::sim::SimDevice);

impl Backend for NoWait {
    fn name(&self) -> &'static str {
        "no-wait"
    }
    fn allocate(
        &self,
        size: u64,
        s: StreamId,
    ) -> Result<reservoir::DevicePtr, reservoir::BackendError> {
        self.0.allocate(size, s)
    }
    fn free(&self, p: reservoir::DevicePtr, size: u64) -> Result<(), reservoir::BackendError> {
        self.0.free(p, size)
    }
    fn mem_info(&self) -> Result<reservoir::MemInfo, reservoir::BackendError> {
        self.0.mem_info()
    }
    fn create_stream(&self) -> Result<StreamId, reservoir::BackendError> {
        self.0.create_stream()
    }
    fn check_stream(&self, s: StreamId) -> Result<(), reservoir::BackendError> {
        self.0.check_stream(s)
    }
    fn record_event(&self, s: StreamId) -> Result<reservoir::EventId, reservoir::BackendError> {
        self.0.record_event(s)
    }
    fn query_event(&self, e: reservoir::EventId) -> Result<bool, reservoir::BackendError> {
        self.0.query_event(e)
    }
    fn synchronize_event(&self, e: reservoir::EventId) -> Result<(), reservoir::BackendError> {
        self.0.synchronize_event(e)
    }
    fn destroy_event(&self, e: reservoir::EventId) -> Result<(), reservoir::BackendError> {
        self.0.destroy_event(e)
    }
    fn synchronize_stream(&self, s: StreamId) -> Result<(), reservoir::BackendError> {
        Backend::synchronize_stream(&self.0, s)
    }
    fn synchronize_device(&self) -> Result<(), reservoir::BackendError> {
        self.0.synchronize_device()
    }
}

#[test]
fn cross_stream_reuse_needs_stream_wait_event() {
    // Without stream_wait_event the policy does nothing; on the (synchronous)
    // simulated device, which has it, it borrows.
    let no_wait =
        CachingAllocator::new(NoWait(reservoir::sim::SimDevice::default()), cross_stream());
    let sim = CachingAllocator::new(reservoir::sim::SimDevice::default(), cross_stream());
    let s1 = no_wait.backend().create_stream().unwrap();
    let s2 = no_wait.backend().create_stream().unwrap();
    let t1 = sim.backend().create_stream().unwrap();
    let t2 = sim.backend().create_stream().unwrap();
    let p = no_wait.raw_alloc(4 * MIB, s1).unwrap();
    no_wait.raw_free(p).unwrap();
    assert_ne!(no_wait.raw_alloc(4 * MIB, s2).unwrap(), p);
    assert_eq!(no_wait.cross_stream_reuses(), 0);
    no_wait.check_invariants().unwrap();
    let q = sim.raw_alloc(4 * MIB, t1).unwrap();
    sim.raw_free(q).unwrap();
    assert_eq!(sim.raw_alloc(4 * MIB, t2).unwrap(), q);
    assert_eq!(sim.cross_stream_reuses(), 1);
    sim.check_invariants().unwrap();
}
