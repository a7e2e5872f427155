//! Tests of the simulated device.

use std::collections::BTreeMap;

use super::*;
use crate::backend::Reservation;

const D: StreamId = StreamId::DEFAULT;
const HIGH: u64 = DEFAULT_ADDRESS_HIGH;
const KIB: u64 = 1 << 10;
const G2: u64 = 2 << 20;

fn cfg(capacity: u64) -> SimConfig {
    SimConfig {
        capacity,
        ..SimConfig::default()
    }
}

fn is_oom(r: Result<DevicePtr, BackendError>) -> bool {
    matches!(r, Err(BackendError::OutOfMemory { .. }))
}

fn is_invalid<T: std::fmt::Debug>(r: Result<T, BackendError>) -> bool {
    matches!(r, Err(BackendError::InvalidValue(_)))
}

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// Live ranges, checked for overlap on insert.
#[derive(Default)]
struct Live(BTreeMap<u64, u64>);

impl Live {
    fn insert(&mut self, a: u64, size: u64) {
        let end = a + size;
        if let Some((&p, &ps)) = self.0.range(..=a).next_back() {
            assert!(p + ps <= a, "{a:#x}+{size:#x} overlaps {p:#x}+{ps:#x}");
        }
        if let Some((&n, &ns)) = self.0.range(a..).next() {
            assert!(n >= end, "{a:#x}+{size:#x} overlaps {n:#x}+{ns:#x}");
        }
        self.0.insert(a, size);
    }
}

fn random_run(policy: AddressPolicy, seed: u64) {
    let dev = SimDevice::new(SimConfig {
        address_policy: policy.clone(),
        ..cfg(1 << 40)
    });
    let free0 = dev.state.lock().space.free_bytes();
    let mut rng = XorShift(seed);
    let mut live = Live::default();
    let mut order: Vec<(u64, u64)> = Vec::new();
    let mut last = 0;
    for i in 0..3000 {
        if order.is_empty() || rng.next() % 5 < 3 {
            let size = match rng.next() % 3 {
                0 => 1 + rng.next() % (64 * KIB),
                1 => 1 + rng.next() % (64 << 20),
                _ => (1 + rng.next() % 10) * G2,
            };
            let p = dev.allocate(size, D).unwrap();
            if policy == AddressPolicy::BumpUp {
                assert!(p.0 > last, "bump addresses increase");
                last = p.0;
            }
            live.insert(p.0, size);
            order.push((p.0, size));
        } else {
            let (a, size) = order.swap_remove(rng.next() as usize % order.len());
            live.0.remove(&a);
            dev.free(DevicePtr(a), size).unwrap();
        }
        if i % 251 == 0 {
            dev.state.lock().space.check();
        }
    }
    for (a, size) in order {
        dev.free(DevicePtr(a), size).unwrap();
    }
    let st = dev.state.lock();
    st.space.check();
    assert_eq!(st.space.free_bytes(), free0);
    assert_eq!(st.used, 0);
}

#[test]
fn random_alloc_free_never_overlaps() {
    for seed in [1, 0xdead_beef, 0x1234_5678_9abc] {
        random_run(AddressPolicy::LinuxMmap, seed);
        random_run(AddressPolicy::BumpUp, seed);
        // Scripted addresses, many of which collide with each other.
        let mut rng = XorShift(seed ^ 0x5555);
        let script = (0..2000)
            .map(|_| 0x1000_0000_0000 + (rng.next() % 4096) * (1 << 20) + (rng.next() % 3) * 512)
            .collect();
        random_run(AddressPolicy::Scripted(script), seed);
    }
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ops_never_overlap(ops in proptest::collection::vec((any::<bool>(), 1u64..(48 << 20), any::<u16>()), 1..200)) {
            let dev = SimDevice::new(cfg(1 << 40));
            let mut live = Live::default();
            let mut order: Vec<(u64, u64)> = Vec::new();
            for (alloc, size, pick) in ops {
                if alloc || order.is_empty() {
                    let p = dev.allocate(size, D).unwrap();
                    live.insert(p.0, size);
                    order.push((p.0, size));
                } else {
                    let (a, s) = order.swap_remove(pick as usize % order.len());
                    live.0.remove(&a);
                    dev.free(DevicePtr(a), s).unwrap();
                }
            }
            dev.state.lock().space.check();
        }
    }
}

#[test]
fn top_down_placement_and_hole_reuse() {
    let dev = SimDevice::default();
    let a = dev.allocate(1 << 20, D).unwrap();
    assert_eq!(a.0, HIGH - (1 << 20));
    // 3 pages + 1 byte occupy 4 pages.
    let b = dev.allocate(3 * 4096 + 1, D).unwrap();
    assert_eq!(b.0, a.0 - 4 * 4096);
    let c = dev.allocate(1 << 20, D).unwrap();
    assert_eq!(c.0, b.0 - (1 << 20));
    // A hole: a small allocation goes to the top of it.
    dev.free(b, 3 * 4096 + 1).unwrap();
    let d = dev.allocate(4096, D).unwrap();
    assert_eq!(d.0, b.0 + 3 * 4096);
    // Too large for the hole: below everything.
    let e = dev.allocate(5 * 4096, D).unwrap();
    assert_eq!(e.0, c.0 - 5 * 4096);
    // Freed neighbours merge: hole(3 pages) + d + a form one gap at the top.
    dev.free(d, 4096).unwrap();
    dev.free(a, 1 << 20).unwrap();
    let f = dev.allocate((1 << 20) + 4 * 4096, D).unwrap();
    assert_eq!(f.0, b.0);
    dev.state.lock().space.check();
}

#[test]
fn reservations_are_placed_like_the_fake_driver() {
    let dev = SimDevice::default();
    let vm = dev.as_virtual_memory().unwrap();
    let r = vm.reserve(4 << 20).unwrap();
    // mmap(size + 2 MiB) at the top, base rounded up to 2 MiB.
    assert_eq!(r.base.0, HIGH - (6 << 20));
    assert_eq!(r.size, 4 << 20);
    let p = dev.allocate(4096, D).unwrap();
    assert_eq!(p.0, HIGH - (6 << 20) - 4096);
    vm.release(r).unwrap();
    // The whole raw range came back.
    let q = dev.allocate(6 << 20, D).unwrap();
    assert_eq!(q.0, HIGH - (6 << 20));
}

#[test]
fn bump_up_increases_and_never_reuses() {
    let dev = SimDevice::new(SimConfig {
        address_policy: AddressPolicy::BumpUp,
        ..SimConfig::default()
    });
    let a = dev.allocate(100, D).unwrap();
    assert_eq!(a.0, DEFAULT_ADDRESS_LOW);
    let b = dev.allocate(5000, D).unwrap();
    assert_eq!(b.0, DEFAULT_ADDRESS_LOW + 4096);
    dev.free(a, 100).unwrap();
    let c = dev.allocate(100, D).unwrap();
    assert_eq!(c.0, b.0 + 8192);
}

#[test]
fn granularity_accounting_and_oom_exactly_at_capacity() {
    let dev = SimDevice::new(cfg(10 << 20));
    let a = dev.allocate(1, D).unwrap();
    assert_eq!(dev.counters().bytes_in_use, G2);
    let b = dev.allocate(G2 + 1, D).unwrap();
    assert_eq!(dev.counters().bytes_in_use, 3 * G2);
    // Exactly at capacity succeeds.
    let c = dev.allocate(4 << 20, D).unwrap();
    assert_eq!(dev.counters().bytes_in_use, 10 << 20);
    assert_eq!(
        dev.mem_info().unwrap(),
        MemInfo {
            free: 0,
            total: 10 << 20
        }
    );
    // One byte more does not.
    let err = dev.allocate(1, D).unwrap_err();
    assert_eq!(
        err,
        BackendError::OutOfMemory {
            requested: 1,
            free: 0
        }
    );
    assert!(err.is_retryable());
    dev.free(c, 4 << 20).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 4 << 20);
    assert!(is_oom(dev.allocate((4 << 20) + 1, D)));
    let c = dev.allocate(4 << 20, D).unwrap();
    for (p, s) in [(a, 1), (b, G2 + 1), (c, 4 << 20)] {
        dev.free(p, s).unwrap();
    }
    let k = dev.counters();
    assert_eq!((k.allocs, k.frees, k.failed_allocs), (4, 4, 2));
    assert_eq!(
        (k.bytes_in_use, k.peak_bytes, k.live_allocs),
        (0, 10 << 20, 0)
    );
    dev.reset_peak();
    assert_eq!(dev.counters().peak_bytes, 0);
}

#[test]
fn context_reserved_counts_as_used() {
    let dev = SimDevice::new(SimConfig {
        context_reserved: 4 << 20,
        ..cfg(10 << 20)
    });
    assert_eq!(
        dev.mem_info().unwrap(),
        MemInfo {
            free: 6 << 20,
            total: 10 << 20
        }
    );
    let a = dev.allocate(6 << 20, D).unwrap();
    assert!(is_oom(dev.allocate(1, D)));
    assert_eq!(dev.mem_info().unwrap().free, 0);
    dev.free(a, 6 << 20).unwrap();
    // A context larger than the device: free saturates at 0.
    let dev = SimDevice::new(SimConfig {
        context_reserved: 20 << 20,
        ..cfg(10 << 20)
    });
    assert_eq!(dev.mem_info().unwrap().free, 0);
}

#[test]
fn fine_accounting_granularity() {
    let dev = SimDevice::new(SimConfig {
        accounting_granularity: 0, // treated as 1
        ..cfg(1000)
    });
    let a = dev.allocate(999, D).unwrap();
    dev.allocate(1, D).unwrap();
    assert!(is_oom(dev.allocate(1, D)));
    dev.free(a, 999).unwrap();
    assert_eq!(dev.counters().bytes_in_use, 1);
}

#[test]
fn defaults() {
    let dev = SimDevice::default();
    assert_eq!(dev.name(), "sim");
    assert_eq!(
        dev.mem_info().unwrap(),
        MemInfo {
            free: 80 << 30,
            total: 80 << 30
        }
    );
    assert!(dev.as_memcpy().is_none() && dev.as_device_work().is_none());
    assert_eq!(dev.as_virtual_memory().unwrap().granularity(), G2);
    assert_eq!(SimConfig::like_fake_driver().capacity, 85_045_870_592);
    fn send_sync<T: Send + Sync>() {}
    send_sync::<SimDevice>();
}

#[test]
fn free_errors_name_the_address() {
    let dev = SimDevice::default();
    let e = dev.free(DevicePtr(0x1234_5000), 10).unwrap_err();
    assert!(
        matches!(&e, BackendError::InvalidValue(m) if m.contains("0x12345000")),
        "{e}"
    );
    let p = dev.allocate(100, D).unwrap();
    let e = dev.free(p, 99).unwrap_err();
    assert!(
        matches!(&e, BackendError::InvalidValue(m) if m.contains(&format!("{p}"))),
        "{e}"
    );
    dev.free(p, 100).unwrap();
    assert!(is_invalid(dev.free(p, 100)));
    assert!(is_invalid(dev.allocate(0, D)));
    let k = dev.counters();
    assert_eq!((k.allocs, k.frees, k.failed_allocs), (1, 1, 0));
}

#[test]
fn fail_nth_alloc() {
    let dev = SimDevice::default();
    dev.fail_nth_alloc(2);
    dev.allocate(1, D).unwrap();
    assert!(is_oom(dev.allocate(1, D)));
    dev.allocate(1, D).unwrap();
    // Several at once; 0 means the next one.
    dev.fail_nth_alloc(0);
    dev.fail_nth_alloc(3);
    assert!(is_oom(dev.allocate(1, D)));
    dev.allocate(1, D).unwrap();
    assert!(is_oom(dev.allocate(1, D)));
    dev.allocate(1, D).unwrap();
    let k = dev.counters();
    assert_eq!((k.allocs, k.failed_allocs, k.bytes_in_use), (4, 3, 4 * G2));
    // A pending failure is cancelled by clear_faults.
    dev.fail_nth_alloc(1);
    dev.clear_faults();
    dev.allocate(1, D).unwrap();
}

#[test]
fn fail_allocs_above() {
    let dev = SimDevice::default();
    dev.fail_allocs_above(1 << 20);
    dev.allocate(1 << 20, D).unwrap();
    assert_eq!(
        dev.allocate((1 << 20) + 1, D).unwrap_err(),
        BackendError::OutOfMemory {
            requested: (1 << 20) + 1,
            free: (80 << 30) - G2
        }
    );
    // Maps are not affected.
    let vm = dev.as_virtual_memory().unwrap();
    let r = vm.reserve(4 << 20).unwrap();
    vm.map(r, 0, 4 << 20).unwrap();
    dev.clear_faults();
    dev.allocate(8 << 20, D).unwrap();
}

#[test]
fn set_capacity_shrinks_and_grows() {
    let dev = SimDevice::new(cfg(8 << 20));
    let a = dev.allocate(6 << 20, D).unwrap();
    dev.set_capacity(4 << 20);
    assert_eq!(dev.capacity(), 4 << 20);
    assert_eq!(
        dev.mem_info().unwrap(),
        MemInfo {
            free: 0,
            total: 4 << 20
        }
    );
    assert!(is_oom(dev.allocate(1, D)));
    // What is in use stays and can be freed.
    dev.free(a, 6 << 20).unwrap();
    dev.allocate(4 << 20, D).unwrap();
    assert!(is_oom(dev.allocate(1, D)));
    dev.set_capacity(16 << 20);
    dev.allocate(12 << 20, D).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 0);
}

#[test]
fn streams_are_numbered_in_creation_order() {
    let dev = SimDevice::default();
    assert_eq!(dev.create_stream().unwrap(), StreamId(1));
    dev.register_stream(StreamId(3));
    dev.register_stream(StreamId(3));
    assert_eq!(dev.create_stream().unwrap(), StreamId(2));
    assert_eq!(dev.create_stream().unwrap(), StreamId(4));
    assert_eq!(
        dev.streams(),
        vec![
            StreamId(0),
            StreamId(1),
            StreamId(3),
            StreamId(2),
            StreamId(4)
        ]
    );
    assert_eq!(dev.counters().streams_created, 4);
    assert!(is_invalid(dev.record_event(StreamId(9))));
    assert!(is_invalid(dev.hold_stream(StreamId(9))));
    assert!(is_invalid(dev.release_stream(StreamId(9))));
    assert!(is_invalid(dev.enqueue_work(StreamId(9))));
}

#[test]
fn events_complete_at_once_without_holds() {
    let dev = SimDevice::default();
    let s = dev.create_stream().unwrap();
    for st in [D, s] {
        dev.enqueue_work(st).unwrap();
        let e = dev.record_event(st).unwrap();
        assert!(dev.query_event(e).unwrap());
        dev.synchronize_event(e).unwrap();
        dev.destroy_event(e).unwrap();
    }
    let k = dev.counters();
    assert_eq!(
        (k.events_created, k.events_recorded, k.live_events),
        (2, 2, 0)
    );
    assert_eq!((k.forced_syncs, k.pending_ops, k.held_streams), (0, 0, 0));
}

#[test]
fn unknown_and_destroyed_events_are_invalid() {
    let dev = SimDevice::default();
    assert!(is_invalid(dev.query_event(EventId(42))));
    assert!(is_invalid(dev.synchronize_event(EventId(42))));
    assert!(is_invalid(dev.destroy_event(EventId(42))));
    let e = dev.record_event(D).unwrap();
    dev.destroy_event(e).unwrap();
    assert!(is_invalid(dev.query_event(e)));
    assert!(is_invalid(dev.destroy_event(e)));
    assert!(is_invalid(dev.wait_event(D, e)));
}

#[test]
fn hold_keeps_events_pending_until_release() {
    let dev = SimDevice::default();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let before = dev.record_event(s1).unwrap();
    dev.hold_stream(s1).unwrap();
    dev.hold_stream(s1).unwrap(); // idempotent
    assert!(dev.is_stream_held(s1).unwrap());
    assert!(dev.query_event(before).unwrap());
    let e1 = dev.record_event(s1).unwrap();
    let e2 = dev.record_event(s2).unwrap();
    assert!(!dev.query_event(e1).unwrap());
    assert!(dev.query_event(e2).unwrap());
    assert_eq!(dev.stream_pending(s1).unwrap(), 1);
    assert_eq!(dev.counters().held_streams, 1);
    dev.release_stream(s1).unwrap();
    assert!(!dev.is_stream_held(s1).unwrap());
    assert!(dev.query_event(e1).unwrap());
    assert_eq!(dev.counters().forced_syncs, 0);
    // Releasing a stream that is not held is a no-op.
    dev.release_stream(s2).unwrap();
}

#[test]
fn synchronize_on_held_stream_is_a_forced_sync() {
    let dev = SimDevice::default();
    let s = dev.create_stream().unwrap();
    dev.hold_stream(s).unwrap();
    let e = dev.record_event(s).unwrap();
    assert!(!dev.query_event(e).unwrap());
    dev.synchronize_event(e).unwrap();
    assert!(dev.query_event(e).unwrap());
    assert_eq!(dev.counters().forced_syncs, 1);
    // Synchronising a complete event forces nothing.
    dev.synchronize_event(e).unwrap();
    assert_eq!(dev.counters().forced_syncs, 1);
    // The stream is still held: later events are pending again.
    let f = dev.record_event(s).unwrap();
    assert!(!dev.query_event(f).unwrap());
    dev.synchronize_stream(s).unwrap();
    assert!(dev.query_event(f).unwrap());
    assert_eq!(dev.counters().forced_syncs, 2);
    let g = dev.record_event(s).unwrap();
    dev.synchronize_all();
    assert!(dev.query_event(g).unwrap());
    assert_eq!(dev.counters().forced_syncs, 3);
    assert!(dev.is_stream_held(s).unwrap());
}

#[test]
fn enqueued_work_semantics_match_the_fake_driver() {
    let dev = SimDevice::new(SimConfig::like_fake_driver());
    let s = dev.create_stream().unwrap();
    dev.hold_stream(s).unwrap();
    // No work enqueued: the event completes although the stream is held.
    let e0 = dev.record_event(s).unwrap();
    assert!(dev.query_event(e0).unwrap());
    dev.enqueue_work(s).unwrap();
    assert_eq!(dev.stream_pending(s).unwrap(), 1);
    let e1 = dev.record_event(s).unwrap();
    assert!(!dev.query_event(e1).unwrap());
    dev.enqueue_work(s).unwrap();
    let e2 = dev.record_event(s).unwrap();
    assert_eq!(dev.stream_pending(s).unwrap(), 2);
    dev.synchronize_event(e1).unwrap();
    assert!(dev.query_event(e1).unwrap());
    assert!(!dev.query_event(e2).unwrap());
    assert_eq!(dev.stream_pending(s).unwrap(), 1);
    dev.release_stream(s).unwrap();
    assert!(dev.query_event(e2).unwrap());
    assert_eq!(dev.counters().pending_ops, 0);
}

#[test]
fn waits_propagate_holds() {
    let dev = SimDevice::default();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let s3 = dev.create_stream().unwrap();
    dev.hold_stream(s1).unwrap();
    let e1 = dev.record_event(s1).unwrap();
    dev.wait_event(s2, e1).unwrap();
    let e2 = dev.record_event(s2).unwrap();
    assert!(
        !dev.query_event(e2).unwrap(),
        "s2 is blocked behind held s1"
    );
    dev.wait_event(s3, e2).unwrap();
    let e3 = dev.record_event(s3).unwrap();
    assert!(!dev.query_event(e3).unwrap());
    // Waiting on a complete event adds nothing.
    let done = dev.record_event(D).unwrap();
    dev.wait_event(s3, done).unwrap();
    // A stream waiting on its own event does not block itself.
    dev.wait_event(s1, e1).unwrap();
    dev.release_stream(s1).unwrap();
    for e in [e1, e2, e3] {
        assert!(dev.query_event(e).unwrap());
    }
    assert_eq!(dev.counters().pending_ops, 0);

    // Synchronising the last event of the chain forces the held stream.
    dev.hold_stream(s1).unwrap();
    let e1 = dev.record_event(s1).unwrap();
    dev.wait_event(s2, e1).unwrap();
    let e2 = dev.record_event(s2).unwrap();
    dev.synchronize_event(e2).unwrap();
    assert!(dev.query_event(e1).unwrap() && dev.query_event(e2).unwrap());
    assert_eq!(dev.counters().forced_syncs, 1);
    assert!(dev.is_stream_held(s1).unwrap());
}

#[test]
fn virtual_memory_map_unmap_release() {
    let dev = SimDevice::new(cfg(6 << 20));
    let vm = dev.as_virtual_memory().unwrap();
    assert!(is_invalid(vm.reserve(0)));
    assert!(is_invalid(vm.reserve(3 << 20)));
    // Address space costs no capacity.
    let big = vm.reserve(1 << 40).unwrap();
    let r = vm.reserve(8 << 20).unwrap();
    assert_eq!(r.base.0 % G2, 0);
    assert!(big.base.0 + big.size <= r.base.0 || r.base.0 + r.size <= big.base.0);
    assert_eq!(dev.counters().bytes_in_use, 0);

    vm.map(r, 0, G2).unwrap();
    let k = dev.counters();
    assert_eq!((k.bytes_in_use, k.pages_mapped, k.maps), (G2, 1, 1));
    // Already mapped, outside, misaligned, empty, wrong reservation.
    assert!(is_invalid(vm.map(r, 0, 4 << 20)));
    assert!(is_invalid(vm.map(r, 6 << 20, 4 << 20)));
    assert!(is_invalid(vm.map(r, 1 << 20, G2)));
    assert!(is_invalid(vm.map(r, G2, 0)));
    assert!(is_invalid(vm.map(
        Reservation {
            base: r.base,
            size: 4 << 20
        },
        G2,
        G2
    )));
    assert!(is_invalid(vm.map(
        Reservation {
            base: DevicePtr(G2),
            size: G2
        },
        0,
        G2
    )));
    // Over capacity: nothing is mapped.
    vm.map(r, G2, 4 << 20).unwrap();
    assert_eq!(
        vm.map(r, 6 << 20, G2).unwrap_err(),
        BackendError::OutOfMemory {
            requested: G2,
            free: 0
        }
    );
    let k = dev.counters();
    assert_eq!(
        (k.bytes_in_use, k.pages_mapped, k.failed_maps),
        (6 << 20, 3, 1)
    );
    // Mappings and plain allocations share the capacity.
    assert!(is_oom(dev.allocate(1, D)));
    assert!(is_invalid(vm.unmap(r, 6 << 20, G2)), "not mapped");
    assert!(is_invalid(vm.release(r)), "still mapped");
    // One unmap over two map calls.
    vm.unmap(r, 0, 6 << 20).unwrap();
    assert_eq!(dev.counters().bytes_in_use, 0);
    // Partial unmaps of one map call.
    vm.map(r, 0, 6 << 20).unwrap();
    vm.unmap(r, G2, G2).unwrap();
    assert!(is_invalid(vm.unmap(r, 0, 4 << 20)), "hole in the middle");
    vm.unmap(r, 0, G2).unwrap();
    vm.unmap(r, 4 << 20, G2).unwrap();
    let k = dev.counters();
    assert_eq!(
        (k.bytes_in_use, k.pages_mapped, k.maps, k.unmaps),
        (0, 0, 3, 4)
    );
    vm.release(r).unwrap();
    assert!(is_invalid(vm.release(r)));
    assert!(is_invalid(vm.map(r, 0, G2)));
    assert!(is_invalid(vm.release(Reservation {
        base: big.base,
        size: G2
    })));
    vm.release(big).unwrap();
    let k = dev.counters();
    assert_eq!((k.reserves, k.releases), (2, 2));
    dev.state.lock().space.check();
}

#[test]
fn fail_nth_map() {
    let dev = SimDevice::default();
    let vm = dev.as_virtual_memory().unwrap();
    let r = vm.reserve(8 << 20).unwrap();
    dev.fail_nth_map(2);
    vm.map(r, 0, G2).unwrap();
    assert!(matches!(
        vm.map(r, G2, G2),
        Err(BackendError::OutOfMemory { .. })
    ));
    vm.map(r, G2, G2).unwrap();
    assert_eq!(dev.counters().failed_maps, 1);
    // Allocations do not consume map failures.
    dev.fail_nth_map(1);
    dev.allocate(1, D).unwrap();
    assert!(vm.map(r, 4 << 20, G2).is_err());
}

#[test]
fn cost_model_accumulates() {
    let c = CostModel::default();
    assert_eq!(c.alloc(2 << 20), 10_000 + 2 * 90);
    assert_eq!(c.alloc(1 << 30), 10_000 + 1024 * 90);
    assert_eq!(c.free(1), 8_000 + 20);
    assert_eq!(CostModel::ZERO.alloc(1 << 40), 0);

    let dev = SimDevice::new(cfg(8 << 20));
    let p = dev.allocate(3 << 20, D).unwrap();
    let mut t = 10_000 + 3 * 90;
    assert_eq!(dev.counters().driver_time_ns, t);
    assert!(dev.allocate(8 << 20, D).is_err());
    t += 10_000;
    assert_eq!(dev.counters().driver_time_ns, t);
    dev.free(p, 3 << 20).unwrap();
    t += 8_000 + 3 * 20;
    assert_eq!(dev.counters().driver_time_ns, t);
    let vm = dev.as_virtual_memory().unwrap();
    let r = vm.reserve(8 << 20).unwrap();
    vm.map(r, 0, 4 << 20).unwrap();
    vm.unmap(r, 0, G2).unwrap();
    vm.unmap(r, G2, G2).unwrap();
    vm.release(r).unwrap();
    t += 2_000 + (4_000 + 2 * 2_000) + 2 * (3_000 + 1_000) + 2_000;
    assert_eq!(dev.counters().driver_time_ns, t);
    // Invalid calls cost nothing.
    assert!(dev.free(DevicePtr(4096), 1).is_err());
    assert_eq!(dev.counters().driver_time_ns, t);

    let dev = SimDevice::new(SimConfig {
        cost: CostModel::ZERO,
        ..SimConfig::default()
    });
    dev.allocate(1 << 30, D).unwrap();
    assert_eq!(dev.counters().driver_time_ns, 0);
}

#[test]
fn call_log_records_every_device_call() {
    let dev = SimDevice::new(cfg(8 << 20));
    let p = dev.allocate(1, D).unwrap();
    dev.free(p, 1).unwrap();
    assert!(dev.call_log().is_empty(), "off by default");

    dev.set_call_log(true);
    let s = dev.create_stream().unwrap();
    dev.set_call_tag(Some(7));
    let p = dev.allocate(3 << 20, s).unwrap();
    assert!(dev.allocate(6 << 20, D).is_err());
    assert!(dev.free(DevicePtr(4096), 1).is_err()); // invalid: not logged
    dev.set_call_tag(None);
    dev.free(p, 3 << 20).unwrap();
    let vm = dev.as_virtual_memory().unwrap();
    let r = vm.reserve(16 << 20).unwrap();
    vm.map(r, G2, 4 << 20).unwrap();
    assert!(vm.map(r, 6 << 20, 6 << 20).is_err());
    vm.unmap(r, G2, 4 << 20).unwrap();
    vm.release(r).unwrap();

    let call = |kind, size, addr, offset, stream, result, tag| DeviceCall {
        kind,
        size,
        addr: DevicePtr(addr),
        offset,
        stream,
        result,
        tag,
    };
    use CallKind::*;
    use CallResult::{Ok as Fine, OutOfMemory as Oom};
    let b = r.base.0;
    let expect = vec![
        call(Alloc, 3 << 20, p.0, 0, s, Fine, Some(7)),
        call(Alloc, 6 << 20, 0, 0, D, Oom, Some(7)),
        call(Free, 3 << 20, p.0, 0, D, Fine, None),
        call(Reserve, 16 << 20, b, 0, D, Fine, None),
        call(Map, 4 << 20, b, G2, D, Fine, None),
        call(Map, 6 << 20, b, 6 << 20, D, Oom, None),
        call(Unmap, 4 << 20, b, G2, D, Fine, None),
        call(Release, 16 << 20, b, 0, D, Fine, None),
    ];
    assert_eq!(dev.call_log(), expect);
    let names: Vec<_> = expect.iter().map(|c| c.kind.oracle_name()).collect();
    assert_eq!(
        names,
        [
            "alloc",
            "alloc",
            "free",
            "reserve",
            "map",
            "map",
            "unmap",
            "addr_free"
        ]
    );
    assert_eq!(expect[1].result.error_code(), 2);
    assert_eq!(expect[0].result.error_code(), 0);
    assert_eq!(dev.take_call_log().len(), 8);
    assert!(dev.call_log().is_empty());
    dev.set_call_log(false);
    dev.allocate(1, D).unwrap();
    assert!(dev.call_log().is_empty());

    let dev = SimDevice::new(SimConfig {
        call_log: true,
        ..SimConfig::default()
    });
    dev.allocate(1, D).unwrap();
    assert_eq!(dev.call_log().len(), 1);
}

#[test]
fn scripted_addresses_are_used_in_order() {
    let a1 = 0x7fff_0000_0000; // above the placement window: still fine
    let a2 = 0x1000_0000_0100; // not page-aligned
    let a3 = 0x1000_0000_0800; // same page as a2: falls back
    let a4 = 0x2000_0000_0000;
    let dev = SimDevice::with_recorded_addresses(cfg(64 << 20), [a1, a2, a3, a4]);
    // A failed allocation does not consume an address.
    assert!(dev.allocate(128 << 20, D).is_err());
    assert_eq!(dev.recorded_addresses_left(), 4);
    assert_eq!(dev.allocate(G2, D).unwrap().0, a1);
    assert_eq!(dev.allocate(100, D).unwrap().0, a2);
    let p3 = dev.allocate(100, D).unwrap();
    assert_eq!(p3.0, HIGH - 4096, "fell back to LinuxMmap");
    assert_eq!(dev.counters().scripted_fallbacks, 1);
    let vm = dev.as_virtual_memory().unwrap();
    let r = vm.reserve(4 << 20).unwrap();
    assert_eq!(r.base.0, a4, "reservations take scripted addresses too");
    // Exhausted: LinuxMmap.
    let p5 = dev.allocate(4096, D).unwrap();
    assert_eq!(p5.0, HIGH - 2 * 4096);
    dev.free(DevicePtr(a2), 100).unwrap();
    dev.push_recorded_addresses([a2 + 4]);
    assert_eq!(dev.allocate(8, D).unwrap().0, a2 + 4);
    vm.release(r).unwrap();
    dev.state.lock().space.check();
}

#[test]
fn concurrent_use_is_safe() {
    let dev = std::sync::Arc::new(SimDevice::new(cfg(1 << 40)));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                let mut rng = XorShift(t + 1);
                let mut mine = Vec::new();
                for _ in 0..500 {
                    if mine.is_empty() || rng.next() % 3 != 0 {
                        let size = 1 + rng.next() % (8 << 20);
                        mine.push((dev.allocate(size, D).unwrap(), size));
                    } else {
                        let (p, s) = mine.swap_remove(rng.next() as usize % mine.len());
                        dev.free(p, s).unwrap();
                    }
                }
                mine
            })
        })
        .collect();
    let mut live = Live::default();
    for h in handles {
        for (p, s) in h.join().unwrap() {
            live.insert(p.0, s);
        }
    }
    dev.state.lock().space.check();
}

#[test]
fn debug_shows_counters() {
    let dev = SimDevice::default();
    dev.allocate(1, D).unwrap();
    let s = format!("{dev:?}");
    assert!(s.contains("SimDevice") && s.contains("allocs: 1"), "{s}");
}
