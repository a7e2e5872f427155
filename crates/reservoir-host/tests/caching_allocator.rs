//! The caching allocator over real host memory.
//!
//! Every live block is filled with a byte no other live block uses, and
//! after every operation every live block is checksummed: a block that
//! overlapped another live block, or whose pages were unmapped or handed
//! out twice, would fail the check (or be refused as not live memory).
//! The allocator's own invariant checker runs after every operation too.

use reservoir::{AllocError, AllocatorConfig, CachingAllocator, DevicePtr, StreamId};
use reservoir_host::{checksum_bytes, Backend, HostConfig, HostCounters, HostDevice};

const MIB: u64 = 1 << 20;
/// A budget that keeps the tests light; an expandable segment reserves
/// 1.125 times it of address space (no memory).
const BUDGET: u64 = 256 * MIB;
/// The random workloads' budget: small enough that they sometimes run out
/// and the allocator frees its cache (real munmap / unmap) and retries.
const SMALL_BUDGET: u64 = 128 * MIB;

/// SplitMix64: a small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn percent(&mut self) -> u64 {
        self.next() % 100
    }
}

struct Live {
    ptr: DevicePtr,
    size: u64,
    byte: u8,
    expected: u64,
}

fn allocator(expandable: bool) -> CachingAllocator<HostDevice> {
    allocator_with_budget(expandable, BUDGET)
}

fn allocator_with_budget(expandable: bool, budget: u64) -> CachingAllocator<HostDevice> {
    let dev = HostDevice::new(HostConfig {
        capacity: budget,
        ..HostConfig::default()
    })
    .unwrap();
    let mut config = AllocatorConfig::default();
    config.expandable_segments = expandable;
    CachingAllocator::new(dev, config)
}

/// A request size: mostly small-pool sizes, some large-pool sizes, a few
/// that get segments of their own (or several expandable pages).
fn request_size(rng: &mut Rng) -> u64 {
    match rng.percent() {
        0..=59 => rng.range(1, 64 << 10),
        60..=79 => rng.range(64 << 10, MIB),
        80..=96 => rng.range(MIB, 4 * MIB),
        _ => rng.range(12 * MIB, 32 * MIB),
    }
}

/// The checksum of `size` bytes equal to `byte`, computed on the host in a
/// reused buffer (so no fresh pages are faulted in for every block).
fn constant_checksum(scratch: &mut Vec<u8>, size: u64, byte: u8) -> u64 {
    scratch.clear();
    scratch.resize(size as usize, byte);
    checksum_bytes(scratch)
}

fn verify(alloc: &CachingAllocator<HostDevice>, live: &[Live], step: usize) {
    alloc
        .check_invariants()
        .unwrap_or_else(|e| panic!("step {step}: {e:?}"));
    let dev = alloc.backend();
    for b in live {
        let sum = dev
            .checksum(b.ptr, b.size)
            .unwrap_or_else(|e| panic!("step {step}: block {} is not live memory: {e}", b.ptr));
        assert_eq!(
            sum, b.expected,
            "step {step}: block {} ({} bytes, byte {:#x}) was overwritten",
            b.ptr, b.size, b.byte
        );
    }
}

/// Drive `ops` random operations; return the device counters seen at the
/// end (before the final cleanup) and the number of out-of-memory errors.
fn drive(alloc: &CachingAllocator<HostDevice>, seed: u64, ops: usize) -> (HostCounters, u64) {
    let dev = alloc.backend();
    let streams = [
        StreamId::DEFAULT,
        dev.create_stream().unwrap(),
        dev.create_stream().unwrap(),
    ];
    let mut rng = Rng(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut ooms = 0;
    let mut scratch = Vec::new();
    for step in 0..ops {
        let r = rng.percent();
        if live.is_empty() || (live.len() < 14 && r < 55) {
            let size = request_size(&mut rng);
            let stream = streams[rng.range(0, 2) as usize];
            match alloc.raw_alloc(size, stream) {
                Ok(ptr) => {
                    let byte = (1..=255u8)
                        .find(|b| live.iter().all(|l| l.byte != *b))
                        .expect("fewer than 255 live blocks");
                    dev.fill(ptr, size, byte).unwrap_or_else(|e| {
                        panic!(
                            "step {step}: new block {ptr} of {size} bytes is not live memory: {e}"
                        )
                    });
                    let expected = constant_checksum(&mut scratch, size, byte);
                    live.push(Live {
                        ptr,
                        size,
                        byte,
                        expected,
                    });
                    if rng.percent() < 15 {
                        let other = streams[rng.range(0, 2) as usize];
                        alloc.record_stream(ptr, other).unwrap();
                    }
                }
                Err(AllocError::OutOfMemory(e)) => {
                    ooms += 1;
                    assert!(e.message.contains("out of memory"), "{}", e.message);
                }
                Err(e) => panic!("step {step}: allocation of {size} bytes failed: {e}"),
            }
        } else if r < 97 {
            let i = rng.range(0, live.len() as u64 - 1) as usize;
            let b = live.swap_remove(i);
            alloc.raw_free(b.ptr).unwrap();
        } else {
            alloc.empty_cache().unwrap();
        }
        verify(alloc, &live, step);
    }
    let counters = dev.counters();
    for b in live.drain(..) {
        alloc.raw_free(b.ptr).unwrap();
    }
    alloc.empty_cache().unwrap();
    alloc.check_invariants().unwrap();
    (counters, ooms)
}

fn assert_all_given_back(alloc: &CachingAllocator<HostDevice>) {
    assert_eq!(alloc.stats().reserved_bytes.all().current, 0);
    let c = alloc.backend().counters();
    assert_eq!(c.bytes_in_use, 0, "{c:?}");
    assert_eq!(c.live_allocs, 0, "{c:?}");
    assert_eq!(c.mapped_bytes, 0, "{c:?}");
    assert!(alloc.backend().leak_report().allocations == 0);
}

#[test]
fn random_workload_over_real_memory() {
    let alloc = allocator_with_budget(false, SMALL_BUDGET);
    let (c, ooms) = drive(&alloc, 0x5eed_0001, 500);
    assert!(c.allocs > 10 && c.frees > 0, "{c:?}");
    assert_eq!(c.maps, 0, "no virtual memory without expandable segments");
    assert!(c.peak_bytes <= SMALL_BUDGET);
    assert_all_given_back(&alloc);
    assert_eq!(alloc.backend().counters().live_reservations, 0);
    eprintln!("plain segments: {c:?}, {ooms} out-of-memory errors");
}

#[test]
fn random_workload_over_real_memory_with_expandable_segments() {
    let alloc = allocator_with_budget(true, SMALL_BUDGET);
    assert!(
        alloc.config().expandable_segments,
        "the host device has virtual memory"
    );
    let (c, ooms) = drive(&alloc, 0x5eed_0002, 500);
    // Every block lived in pages mapped into reservations: no plain
    // allocation was made, and pages were mapped and unmapped for real.
    assert_eq!(c.allocs, 0, "{c:?}");
    assert!(c.reserves > 0 && c.maps > 0, "{c:?}");
    assert!(c.peak_bytes <= SMALL_BUDGET);
    let after = alloc.backend().counters();
    assert!(after.unmaps > 0, "{after:?}");
    assert_all_given_back(&alloc);
    eprintln!("expandable segments: {c:?}, {ooms} out-of-memory errors");
}

#[test]
fn more_seeds() {
    for seed in 10..13 {
        for expandable in [false, true] {
            let alloc = allocator_with_budget(expandable, SMALL_BUDGET);
            drive(&alloc, seed, 120);
            assert_all_given_back(&alloc);
        }
    }
}

/// Over budget, the allocator frees its cached segments (real munmap or
/// unmap) and retries; past that it reports out of memory and nothing
/// breaks.
#[test]
fn out_of_memory_frees_the_cache_and_retries() {
    for expandable in [false, true] {
        let alloc = allocator(expandable);
        let dev = alloc.backend();
        let a = alloc.raw_alloc(150 * MIB, StreamId::DEFAULT).unwrap();
        dev.fill(a, 150 * MIB, 1).unwrap();
        alloc.raw_free(a).unwrap();
        assert!(alloc.stats().reserved_bytes.all().current >= 150 << 20);
        // Does not fit next to the cached 150 MiB: the cache goes first.
        let b = alloc.raw_alloc(200 * MIB, StreamId::DEFAULT).unwrap();
        dev.fill(b, 200 * MIB, 2).unwrap();
        assert_eq!(
            dev.checksum(b, 200 * MIB).unwrap(),
            checksum_bytes(&vec![2; 200 << 20])
        );
        let e = alloc.raw_alloc(100 * MIB, StreamId::DEFAULT).unwrap_err();
        let oom = e.as_oom().expect("out of memory");
        assert!(oom.message.contains("out of memory"), "{}", oom.message);
        alloc.check_invariants().unwrap();
        alloc.raw_free(b).unwrap();
        alloc.empty_cache().unwrap();
        assert_all_given_back(&alloc);
        let c = dev.counters();
        assert!(c.failed_allocs + c.failed_maps > 0, "{c:?}");
    }
}

/// The owning handle frees on drop, and its memory is real.
#[test]
fn owning_handles_hold_real_memory() {
    let alloc = allocator(true);
    let dev = alloc.backend();
    {
        let h = alloc.alloc(3 * MIB, StreamId::DEFAULT).unwrap();
        dev.copy_from_host(h.ptr(), b"reservoir").unwrap();
        let mut back = [0u8; 9];
        dev.copy_to_host(h.ptr(), &mut back).unwrap();
        assert_eq!(&back, b"reservoir");
        assert_eq!(dev.mem_info().unwrap().total, BUDGET);
    }
    assert_eq!(alloc.stats().allocated_bytes.all().current, 0);
    alloc.empty_cache().unwrap();
    assert_all_given_back(&alloc);
}

/// Teardown (issue 15, `caching/teardown.rs`): dropping the allocator gives
/// every segment back to the host device, plain and expandable, cached or
/// still holding a live block: the device's leak report is empty after.
#[test]
fn dropping_the_allocator_returns_every_segment_to_the_host_device() {
    for expandable in [false, true] {
        let dev = std::sync::Arc::new(
            HostDevice::new(HostConfig {
                capacity: BUDGET,
                ..HostConfig::default()
            })
            .unwrap(),
        );
        let mut config = AllocatorConfig::default();
        config.expandable_segments = expandable;
        let a = CachingAllocator::new(dev.clone(), config);
        let s = StreamId(0);
        let kept = a.raw_alloc(3 * MIB, s).unwrap();
        for size in [512, 70_000, 5 * MIB, 40 * MIB] {
            let p = a.raw_alloc(size, s).unwrap();
            dev.fill(p, size, 0xab).unwrap();
            a.raw_free(p).unwrap();
        }
        dev.fill(kept, 3 * MIB, 0x5a).unwrap();
        a.check_invariants().unwrap();
        assert!(!dev.leak_report().is_empty());
        let report = a.close();
        assert_eq!(report.live_blocks, 1, "expandable={expandable}");
        assert_eq!(report.live_addresses, vec![kept]);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert!(
            dev.leak_report().is_empty(),
            "expandable={expandable}: {}",
            dev.leak_report()
        );
        let c: HostCounters = dev.counters();
        assert_eq!((c.bytes_in_use, c.live_events), (0, 0), "{c:?}");
        assert!(!dev.is_live(kept, 1), "the live block's memory is unmapped");
    }
}
