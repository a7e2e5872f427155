//! Unit tests of the host device: real memory, budget, errors, virtual
//! memory, copies, streams, drop.

use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;
use reservoir::backend::{Backend, BackendError, DevicePtr, StreamId, VirtualMemory};

use crate::{checksum_bytes, HostConfig, HostConfigError, HostDevice, LeakReport};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn device(capacity: u64) -> HostDevice {
    HostDevice::with_capacity(capacity).unwrap()
}

fn zeros(len: u64) -> u64 {
    checksum_bytes(&vec![0; len as usize])
}

fn filled(len: u64, byte: u8) -> u64 {
    checksum_bytes(&vec![byte; len as usize])
}

fn is_invalid_naming(e: &BackendError, addr: DevicePtr) -> bool {
    matches!(e, BackendError::InvalidValue(m) if m.contains(&addr.to_string()))
}

#[test]
fn host_device_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<HostDevice>();
}

#[test]
fn allocations_are_real_zeroed_writable_memory() {
    let dev = device(64 * MIB);
    let p = dev.allocate(10_000, S0).unwrap();
    assert!(!p.is_null());
    assert_eq!(dev.allocation_size(p), Some(10_000));
    assert!(dev.is_live(p, 10_000));
    assert!(!dev.is_live(p, 10_001), "the requested size bounds access");
    assert_eq!(dev.checksum(p, 10_000).unwrap(), zeros(10_000));

    // Write through the raw pointer, as a program using the memory would.
    let raw = p.0 as usize as *mut u8;
    for i in 0..10_000usize {
        // SAFETY: `[p, p + 10_000)` is a live allocation of this device (checked
        // above) and nothing else touches it while the test runs.
        unsafe { raw.add(i).write((i % 251) as u8) };
    }
    let expected: Vec<u8> = (0..10_000usize).map(|i| (i % 251) as u8).collect();
    assert_eq!(dev.checksum(p, 10_000).unwrap(), checksum_bytes(&expected));
    let mut back = vec![0u8; 100];
    dev.copy_to_host(p.offset(5_000), &mut back).unwrap();
    assert_eq!(back, expected[5_000..5_100]);

    dev.fill(p.offset(100), 50, 0xee).unwrap();
    dev.copy_to_host(p.offset(99), &mut back[..52]).unwrap();
    assert_eq!(back[0], expected[99]);
    assert!(back[1..51].iter().all(|&b| b == 0xee));
    assert_eq!(back[51], expected[150]);

    dev.copy_from_host(p.offset(9_996), &[1, 2, 3, 4]).unwrap();
    dev.copy_to_host(p.offset(9_996), &mut back[..4]).unwrap();
    assert_eq!(back[..4], [1, 2, 3, 4]);

    dev.free(p, 10_000).unwrap();
    assert!(!dev.is_live(p, 1));
    assert!(dev.fill(p, 1, 0).is_err());
    let c = dev.counters();
    assert_eq!(
        (c.allocs, c.frees, c.live_allocs, c.bytes_in_use),
        (1, 1, 0, 0)
    );
    assert!(dev.leak_report().is_empty());
}

#[test]
fn accessors_refuse_ranges_outside_live_memory() {
    let dev = device(64 * MIB);
    let p = dev.allocate(4096, S0).unwrap();
    dev.fill(p, 4096, 7).unwrap();
    let e = dev.fill(p.offset(4000), 200, 0).unwrap_err();
    assert!(
        matches!(e, BackendError::InvalidValue(ref m) if m.contains("past the end")),
        "{e}"
    );
    assert!(dev.checksum(DevicePtr(8), 1).is_err());
    assert!(dev.copy_from_host(p.offset(4095), &[0, 0]).is_err());
    assert!(dev.checksum(DevicePtr(u64::MAX - 1), 8).is_err());
    // Nothing was written by the refused calls.
    assert_eq!(dev.checksum(p, 4096).unwrap(), filled(4096, 7));
    // Empty ranges are no-ops, even at dead addresses.
    dev.fill(DevicePtr(8), 0, 1).unwrap();
    assert_eq!(dev.checksum(DevicePtr(8), 0).unwrap(), checksum_bytes(&[]));
    dev.free(p, 4096).unwrap();
}

#[test]
fn budget_is_enforced_and_reported() {
    let dev = device(8 * MIB);
    let page = dev.page_size();
    assert_eq!(dev.mem_info().unwrap().total, 8 * MIB);
    let a = dev.allocate(1, S0).unwrap();
    assert_eq!(
        dev.mem_info().unwrap().free,
        8 * MIB - page,
        "1 byte counts a page"
    );
    let b = dev.allocate(6 * MIB, S0).unwrap();
    let e = dev.allocate(2 * MIB, S0).unwrap_err();
    assert!(e.is_retryable());
    assert_eq!(
        e,
        BackendError::OutOfMemory {
            requested: 2 * MIB,
            free: 2 * MIB - page
        }
    );
    assert_eq!(dev.counters().failed_allocs, 1);
    assert_eq!(dev.counters().live_allocs, 2);
    dev.free(b, 6 * MIB).unwrap();
    let c = dev.allocate(2 * MIB, S0).unwrap();
    assert_eq!(dev.counters().peak_bytes, 6 * MIB + page);

    // Lowering the budget below the use refuses everything until memory
    // comes back.
    dev.set_capacity(MIB);
    assert_eq!(dev.mem_info().unwrap().free, 0);
    assert!(dev.allocate(1, S0).unwrap_err().is_retryable());
    dev.free(c, 2 * MIB).unwrap();
    dev.free(a, 1).unwrap();
    dev.allocate(MIB, S0)
        .map(|p| dev.free(p, MIB))
        .unwrap()
        .unwrap();
}

#[test]
fn invalid_frees_are_typed_errors_naming_the_address() {
    let dev = device(64 * MIB);
    let p = dev.allocate(3 * MIB, S0).unwrap();
    dev.fill(p, 3 * MIB, 0x5a).unwrap();

    let wrong_size = dev.free(p, MIB).unwrap_err();
    assert!(is_invalid_naming(&wrong_size, p), "{wrong_size}");
    let interior = dev.free(p.offset(4096), MIB).unwrap_err();
    assert!(is_invalid_naming(&interior, p.offset(4096)), "{interior}");
    let foreign = DevicePtr(0x1234_5000);
    assert!(is_invalid_naming(
        &dev.free(foreign, 4096).unwrap_err(),
        foreign
    ));
    assert!(!dev.free(foreign, 4096).unwrap_err().is_retryable());
    // The refused frees changed nothing.
    assert_eq!(dev.checksum(p, 3 * MIB).unwrap(), filled(3 * MIB, 0x5a));

    dev.free(p, 3 * MIB).unwrap();
    let double = dev.free(p, 3 * MIB).unwrap_err();
    assert!(is_invalid_naming(&double, p), "{double}");
    assert!(matches!(
        dev.allocate(0, S0),
        Err(BackendError::InvalidValue(_))
    ));
    assert_eq!(dev.counters().frees, 1);
    assert_eq!(dev.counters().bytes_in_use, 0);
}

#[test]
fn reserve_map_write_unmap_remap_release() {
    let dev = device(64 * MIB);
    let g = dev.granularity();
    assert_eq!(g, 2 * MIB);
    let r = dev.reserve(8 * g).unwrap();
    assert_eq!(r.base.0 % g, 0, "the base is granularity-aligned");
    assert_eq!(r.size, 8 * g);
    assert!(
        !dev.is_live(r.base, 1),
        "reserved address space is not accessible"
    );
    assert_eq!(
        dev.mem_info().unwrap().free,
        64 * MIB,
        "reservations cost no budget"
    );

    dev.map(r, g, 2 * g).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 64 * MIB - 2 * g);
    assert!(dev.is_live(r.base.offset(g), 2 * g));
    assert!(!dev.is_live(r.base.offset(g - 1), 2));
    assert_eq!(dev.checksum(r.base.offset(g), 2 * g).unwrap(), zeros(2 * g));
    dev.fill(r.base.offset(g), 2 * g, 0x11).unwrap();

    // Adjacent maps merge into one accessible run.
    dev.map(r, 3 * g, g).unwrap();
    assert_eq!(dev.mapped_runs(r).unwrap(), vec![(g, 3 * g)]);
    dev.fill(r.base.offset(3 * g - 10), 20, 0x22).unwrap();

    // Unmapping the middle page returns its budget and makes it inaccessible.
    dev.unmap(r, 2 * g, g).unwrap();
    assert_eq!(dev.mapped_runs(r).unwrap(), vec![(g, g), (3 * g, g)]);
    assert_eq!(dev.mem_info().unwrap().free, 64 * MIB - 2 * g);
    assert!(!dev.is_live(r.base.offset(2 * g), 1));
    assert!(dev.fill(r.base.offset(g), 2 * g, 0).is_err());
    // The neighbours kept their data.
    assert_eq!(
        dev.checksum(r.base.offset(g), g - 10).unwrap(),
        filled(g - 10, 0x11)
    );

    // Mapped again, the page reads zero.
    dev.map(r, 2 * g, g).unwrap();
    assert_eq!(dev.checksum(r.base.offset(2 * g), g).unwrap(), zeros(g));
    assert_eq!(
        dev.checksum(r.base.offset(g), g - 10).unwrap(),
        filled(g - 10, 0x11)
    );

    let busy = dev.release(r).unwrap_err();
    assert!(
        matches!(busy, BackendError::InvalidValue(ref m) if m.contains("still mapped")),
        "{busy}"
    );
    dev.unmap(r, g, 3 * g).unwrap();
    assert_eq!(dev.counters().mapped_bytes, 0);
    assert_eq!(dev.counters().bytes_in_use, 0);
    dev.release(r).unwrap();
    assert!(matches!(dev.release(r), Err(BackendError::InvalidValue(_))));
    let c = dev.counters();
    assert_eq!((c.reserves, c.releases, c.maps, c.unmaps), (1, 1, 3, 2));
    assert!(dev.leak_report().is_empty());
}

#[test]
fn vm_ranges_are_validated() {
    let dev = device(64 * MIB);
    let g = dev.granularity();
    assert!(matches!(
        dev.reserve(g + 4096),
        Err(BackendError::InvalidValue(_))
    ));
    assert!(matches!(dev.reserve(0), Err(BackendError::InvalidValue(_))));
    let r = dev.reserve(4 * g).unwrap();
    let bad = |res: Result<(), BackendError>| matches!(res, Err(BackendError::InvalidValue(_)));
    assert!(bad(dev.map(r, 4096, g)), "misaligned offset");
    assert!(bad(dev.map(r, 0, g + 4096)), "misaligned length");
    assert!(bad(dev.map(r, 0, 0)), "empty");
    assert!(bad(dev.map(r, 3 * g, 2 * g)), "past the end");
    assert!(bad(dev.map(r, u64::MAX - g + 1, g)), "overflow");
    let mut wrong = r;
    wrong.size = 2 * g;
    assert!(bad(dev.map(wrong, 0, g)), "wrong reservation size");
    wrong = r;
    wrong.base = r.base.offset(g);
    assert!(bad(dev.map(wrong, 0, g)), "not a reservation base");

    dev.map(r, g, 2 * g).unwrap();
    assert!(bad(dev.map(r, 0, 2 * g)), "overlaps a mapped range");
    assert!(bad(dev.map(r, 2 * g, g)), "already mapped");
    assert!(bad(dev.unmap(r, 0, 2 * g)), "partly unmapped");
    assert!(bad(dev.unmap(r, 3 * g, g)), "not mapped");
    assert!(bad(dev.release(wrong)));
    // The refused calls changed nothing.
    assert_eq!(dev.mapped_runs(r).unwrap(), vec![(g, 2 * g)]);
    assert_eq!(dev.counters().mapped_bytes, 2 * g);
    dev.unmap(r, g, 2 * g).unwrap();
    dev.release(r).unwrap();
}

#[test]
fn map_over_budget_is_out_of_memory_and_maps_nothing() {
    let dev = device(4 * MIB);
    let g = dev.granularity();
    let r = dev.reserve(8 * g).unwrap();
    dev.map(r, 0, g).unwrap();
    let e = dev.map(r, g, 2 * g).unwrap_err();
    assert_eq!(
        e,
        BackendError::OutOfMemory {
            requested: 2 * g,
            free: 4 * MIB - g
        }
    );
    assert!(!dev.is_live(r.base.offset(g), 1));
    assert_eq!(dev.counters().failed_maps, 1);
    assert_eq!(dev.mapped_runs(r).unwrap(), vec![(0, g)]);
    dev.map(r, g, g).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 0);
    dev.unmap(r, 0, 2 * g).unwrap();
    dev.release(r).unwrap();
}

#[test]
fn memcpy_between_allocations_and_mapped_ranges() {
    let dev = device(64 * MIB);
    let cp = dev.as_memcpy().expect("host device copies");
    let g = dev.granularity();
    let a = dev.allocate(100_000, S0).unwrap();
    let r = dev.reserve(4 * g).unwrap();
    dev.map(r, 0, 2 * g).unwrap();
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 256) as u8).collect();
    dev.copy_from_host(a, &data).unwrap();

    // Allocation -> mapped pages, across the boundary between two pages.
    let dst = r.base.offset(g - 50_000);
    cp.copy(dst, a, 100_000, S0).unwrap();
    assert_eq!(dev.checksum(dst, 100_000).unwrap(), checksum_bytes(&data));
    // Overlapping copy inside one allocation behaves like memmove.
    cp.copy(a.offset(10), a, 1000, S0).unwrap();
    let mut back = vec![0u8; 1010];
    dev.copy_to_host(a, &mut back).unwrap();
    assert_eq!(back[10..], data[..1000]);

    // Ranges that are not all live memory are refused; nothing is copied.
    let before = dev.checksum(a, 100_000).unwrap();
    let bad = |res: Result<(), BackendError>| matches!(res, Err(BackendError::InvalidValue(_)));
    assert!(
        bad(cp.copy(a, r.base.offset(2 * g - 10), 100, S0)),
        "source runs into unmapped pages"
    );
    assert!(
        bad(cp.copy(a.offset(99_990), dst, 100, S0)),
        "destination past the allocation"
    );
    assert!(bad(cp.copy(a, DevicePtr(4096), 10, S0)), "foreign source");
    assert!(bad(cp.copy(a, dst, 10, StreamId(777))), "unknown stream");
    assert_eq!(dev.checksum(a, 100_000).unwrap(), before);
    cp.copy(a, dst, 0, S0).unwrap();
    assert_eq!(dev.counters().copies, 2);

    dev.unmap(r, 0, 2 * g).unwrap();
    dev.release(r).unwrap();
    dev.free(a, 100_000).unwrap();
}

#[test]
fn streams_and_events_are_synchronous() {
    let dev = device(MIB);
    assert!(dev.as_virtual_memory().is_some() && dev.as_memcpy().is_some());
    assert!(dev.as_device_work().is_none());
    assert_eq!(dev.name(), "host");
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    assert!(s1 != s2 && s1 != S0 && s2 != S0);
    let e = dev.record_event(s1).unwrap();
    assert!(dev.query_event(e).unwrap(), "complete when recorded");
    dev.synchronize_event(e).unwrap();
    dev.synchronize_stream(s2).unwrap();
    dev.synchronize_device().unwrap();
    assert_eq!(dev.counters().live_events, 1);
    dev.destroy_event(e).unwrap();
    assert!(matches!(
        dev.query_event(e),
        Err(BackendError::InvalidValue(_))
    ));
    assert!(dev.destroy_event(e).is_err());
    assert!(dev.record_event(StreamId(99)).is_err());
    assert!(dev.synchronize_stream(StreamId(99)).is_err());
    dev.register_stream(StreamId(99));
    dev.record_event(StreamId(99)).unwrap();
    assert_eq!(dev.streams(), vec![S0, s1, s2, StreamId(99)]);
    assert_eq!(dev.create_stream().unwrap(), StreamId(3));
}

#[test]
fn config_is_validated() {
    assert_eq!(
        HostDevice::new(HostConfig {
            capacity: 0,
            ..HostConfig::default()
        })
        .unwrap_err(),
        HostConfigError::ZeroCapacity
    );
    for g in [0, 3 << 20, 100] {
        let e = HostDevice::new(HostConfig {
            vm_granularity: g,
            ..HostConfig::default()
        })
        .unwrap_err();
        assert!(matches!(e, HostConfigError::Granularity { value, .. } if value == g));
        assert!(e.to_string().contains("vm_granularity"));
    }
    let d = HostConfig::default();
    assert!(d.capacity > 0 && d.capacity <= crate::physical_memory().unwrap_or(u64::MAX));
    let dev = HostDevice::new(HostConfig {
        vm_granularity: crate::os_page_size(),
        ..HostConfig::with_capacity(MIB)
    })
    .unwrap();
    assert_eq!(dev.granularity(), crate::os_page_size());
}

#[test]
fn checksum_sees_every_byte() {
    let base = vec![0x3cu8; 301];
    let h = checksum_bytes(&base);
    for i in 0..base.len() {
        let mut v = base.clone();
        v[i] ^= 1;
        assert_ne!(checksum_bytes(&v), h, "byte {i}");
    }
    assert_ne!(checksum_bytes(&base[..300]), h);
    assert_ne!(checksum_bytes(&[0; 64]), checksum_bytes(&[0; 65]));
}

#[test]
fn threads_share_one_device() {
    let dev = Arc::new(device(256 * MIB));
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let dev = Arc::clone(&dev);
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let size = 4096 * (1 + (i * 7 + u64::from(t)) % 64);
                    let p = dev.allocate(size, S0).unwrap();
                    dev.fill(p, size, t + 1).unwrap();
                    assert_eq!(dev.checksum(p, size).unwrap(), filled(size, t + 1));
                    dev.free(p, size).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(dev.counters().allocs, 200);
    assert_eq!(dev.counters().bytes_in_use, 0);
}

/// A `tracing` subscriber that keeps the warnings it sees.
struct Capture(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Capture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                self.0 += &format!("{}={:?} ", f.name(), v);
            }
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            self.0.lock().push(fields.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn dropping_a_device_with_live_memory_unmaps_it_and_reports_the_leak() {
    let dev = device(64 * MIB);
    let g = dev.granularity();
    let a = dev.allocate(5000, S0).unwrap();
    dev.allocate(3 * MIB, S0).unwrap();
    dev.fill(a, 5000, 1).unwrap();
    let r = dev.reserve(4 * g).unwrap();
    dev.map(r, 0, g).unwrap();
    assert_eq!(
        dev.leak_report(),
        LeakReport {
            allocations: 2,
            allocation_bytes: 5000 + 3 * MIB,
            reservations: 1,
            reserved_bytes: 4 * g,
            mapped_bytes: g,
        }
    );
    let warnings = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::with_default(Capture(Arc::clone(&warnings)), || drop(dev));
    let warnings = warnings.lock();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let w = &warnings[0];
    assert!(w.contains("allocations=2"), "{w}");
    assert!(
        w.contains(&format!("allocation_bytes={}", 5000 + 3 * MIB)),
        "{w}"
    );
    assert!(w.contains("reservations=1"), "{w}");

    // A clean device drops silently.
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let dev = device(MIB);
    dev.allocate(1, S0)
        .map(|p| dev.free(p, 1))
        .unwrap()
        .unwrap();
    tracing::subscriber::with_default(Capture(Arc::clone(&warnings)), || drop(dev));
    assert!(warnings.lock().is_empty());
}

/// One step of the virtual-memory model test.
#[derive(Clone, Debug)]
enum VmOp {
    Map { page: u64, pages: u64 },
    Unmap { page: u64, pages: u64 },
    Fill { page: u64, byte: u8 },
}

fn vm_op(pages: u64) -> impl Strategy<Value = VmOp> {
    prop_oneof![
        (0..pages, 1..=4u64).prop_map(|(page, pages)| VmOp::Map { page, pages }),
        (0..pages, 1..=4u64).prop_map(|(page, pages)| VmOp::Unmap { page, pages }),
        (0..pages, 1..=255u8).prop_map(|(page, byte)| VmOp::Fill { page, byte }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Map, unmap and write pages at random; a shadow model of the pages
    /// predicts every result, the budget, and the contents of every page
    /// (data survives while mapped, a page mapped again reads zero).
    #[test]
    fn vm_matches_a_shadow_model(ops in proptest::collection::vec(vm_op(16), 1..60)) {
        const PAGES: u64 = 16;
        let page_size = crate::os_page_size();
        let capacity = 10 * page_size;
        let dev = HostDevice::new(HostConfig {
            capacity,
            vm_granularity: page_size,
            shareable: false,
            ..HostConfig::default()
        })
        .unwrap();
        let r = dev.reserve(PAGES * page_size).unwrap();
        // None: unmapped; Some(b): mapped, every byte b.
        let mut shadow: Vec<Option<u8>> = vec![None; PAGES as usize];
        for op in ops {
            match op {
                VmOp::Map { page, pages } | VmOp::Unmap { page, pages }
                    if page + pages > PAGES =>
                {
                    let res = if matches!(op, VmOp::Map { .. }) {
                        dev.map(r, page * page_size, pages * page_size)
                    } else {
                        dev.unmap(r, page * page_size, pages * page_size)
                    };
                    prop_assert!(matches!(res, Err(BackendError::InvalidValue(_))));
                }
                VmOp::Map { page, pages } => {
                    let range = page as usize..(page + pages) as usize;
                    let res = dev.map(r, page * page_size, pages * page_size);
                    let used = shadow.iter().filter(|p| p.is_some()).count() as u64;
                    if shadow[range.clone()].iter().any(Option::is_some) {
                        prop_assert!(matches!(res, Err(BackendError::InvalidValue(_))));
                    } else if (used + pages) * page_size > capacity {
                        let oom = matches!(res, Err(BackendError::OutOfMemory { .. }));
                        prop_assert!(oom, "expected out of memory: {:?}", res);
                    } else {
                        prop_assert!(res.is_ok());
                        shadow[range].iter_mut().for_each(|p| *p = Some(0));
                    }
                }
                VmOp::Unmap { page, pages } => {
                    let range = page as usize..(page + pages) as usize;
                    let res = dev.unmap(r, page * page_size, pages * page_size);
                    if shadow[range.clone()].iter().all(Option::is_some) {
                        prop_assert!(res.is_ok());
                        shadow[range].iter_mut().for_each(|p| *p = None);
                    } else {
                        prop_assert!(matches!(res, Err(BackendError::InvalidValue(_))));
                    }
                }
                VmOp::Fill { page, byte } => {
                    let res = dev.fill(r.base.offset(page * page_size), page_size, byte);
                    match &mut shadow[page as usize] {
                        Some(b) => {
                            prop_assert!(res.is_ok());
                            *b = byte;
                        }
                        None => prop_assert!(res.is_err()),
                    }
                }
            }
            let mapped = shadow.iter().filter(|p| p.is_some()).count() as u64 * page_size;
            prop_assert_eq!(dev.counters().mapped_bytes, mapped);
            prop_assert_eq!(dev.mem_info().unwrap().free, capacity - mapped);
            for (i, p) in shadow.iter().enumerate() {
                let addr = r.base.offset(i as u64 * page_size);
                match p {
                    Some(b) => prop_assert_eq!(
                        dev.checksum(addr, page_size).unwrap(),
                        filled(page_size, *b)
                    ),
                    None => prop_assert!(!dev.is_live(addr, 1)),
                }
            }
        }
        for (i, p) in shadow.iter().enumerate() {
            if p.is_some() {
                dev.unmap(r, i as u64 * page_size, page_size).unwrap();
            }
        }
        dev.release(r).unwrap();
        prop_assert!(dev.leak_report().is_empty());
    }
}

/// Issue 29: the host device knows its streams (an unknown one is refused
/// by the caching allocator, changing nothing) and holds at most
/// `max_streams` of them.
#[test]
fn streams_are_checked_and_bounded() {
    use reservoir::{AllocError, AllocatorConfig, CachingAllocator};
    let dev = HostDevice::new(HostConfig {
        capacity: 64 << 20,
        max_streams: 3,
        ..HostConfig::default()
    })
    .unwrap();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let e = dev.create_stream().unwrap_err();
    assert!(e.to_string().contains("HostConfig::max_streams = 3"), "{e}");
    assert!(dev.check_stream(StreamId(12345)).is_err());
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let p = a.raw_alloc(4096, s1).unwrap();
    let before = a.memory_stats();
    let e = a.raw_alloc(4096, StreamId(12345)).unwrap_err();
    assert!(
        matches!(
            e,
            AllocError::UnknownStream {
                stream: StreamId(12345),
                ..
            }
        ),
        "{e:?}"
    );
    let e = a.record_stream(p, StreamId(999)).unwrap_err();
    assert!(
        e.to_string()
            .contains("unknown stream 999 on the host device"),
        "{e}"
    );
    assert_eq!(a.memory_stats(), before);
    a.record_stream(p, s2).unwrap();
    a.raw_free(p).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_stats()["reserved_bytes.all.current"], 0);
}
