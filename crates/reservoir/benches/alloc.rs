//! Time per allocator operation on the simulated device (criterion).
//!
//! * `pair/<size>`: one raw_alloc + raw_free of a cached block (the hot path:
//!   best-fit lookup, split, merge, stats), comparable with the oracle's
//!   `oracle_bench pairs <size>` for PyTorch's allocator.
//! * `live/<n>`: the same pair with `n` other blocks live, to show the cost
//!   stays flat from 100 to 100,000 live blocks.
//!
//! Run: `cargo bench -p reservoir --bench alloc`. See BENCHMARKS.md.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocatorConfig, CachingAllocator, StreamId};

fn allocator() -> CachingAllocator<SimDevice> {
    let dev = SimDevice::new(SimConfig {
        capacity: 1 << 40,
        ..SimConfig::default()
    });
    CachingAllocator::new(dev, AllocatorConfig::default())
}

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    g.throughput(Throughput::Elements(1));
    for size in [1024u64, 4 << 20, 64 << 20] {
        let a = allocator();
        // warm the cache: the first pair creates the segment
        let p = a.raw_alloc(size, StreamId(0)).unwrap();
        a.raw_free(p).unwrap();
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let p = a.raw_alloc(size, StreamId(0)).unwrap();
                a.raw_free(p).unwrap();
            })
        });
    }
    g.finish();
}

fn live_blocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("live");
    g.throughput(Throughput::Elements(1));
    for n in [100usize, 10_000, 100_000] {
        let a = allocator();
        // n live blocks of mixed sizes, every other one freed to populate the free lists
        let mut live = Vec::with_capacity(n * 2);
        for i in 0..n * 2 {
            let size = 512 * (1 + (i as u64 * 7919) % 4096);
            live.push(a.raw_alloc(size, StreamId(0)).unwrap());
        }
        for p in live.iter().skip(1).step_by(2) {
            a.raw_free(*p).unwrap();
        }
        g.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                let p = a.raw_alloc(300_000, StreamId(0)).unwrap();
                a.raw_free(p).unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pairs, live_blocks);
criterion_main!(benches);
