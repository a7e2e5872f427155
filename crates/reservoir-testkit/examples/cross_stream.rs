//! Peak reserved memory of PyTorch mode versus Reservoir's cross-stream
//! reuse on multi-stream workloads, on the asynchronous simulated device
//! with the race sanitizer on.
//!
//! ```text
//! cargo run --release -p reservoir-testkit --example cross_stream
//! ```

use reservoir::sim::{AsyncSimDevice, SimConfig};
use reservoir::{AllocatorConfig, Backend, CachingAllocator, StreamId};
use reservoir_testkit::conformance::{integrity_run, IntegrityConfig};

const MIB: u64 = 1 << 20;

fn allocator(cross_stream: bool) -> CachingAllocator<AsyncSimDevice> {
    let mut config = AllocatorConfig::default();
    if cross_stream {
        config.policy = reservoir::config::ReservoirPolicy::CrossStreamReuse;
    }
    let dev = AsyncSimDevice::new(SimConfig {
        capacity: 64 << 30,
        ..SimConfig::default()
    });
    CachingAllocator::new(dev, config)
}

/// Streams take turns: each builds a working set of `blocks` tensors of
/// mixed sizes, works on it, frees it; the next stream then does the same.
fn phases(a: &CachingAllocator<AsyncSimDevice>, streams: usize, rounds: usize) -> i64 {
    let dev = a.backend();
    let ids: Vec<StreamId> = (0..streams).map(|_| dev.create_stream().unwrap()).collect();
    let sizes = [3 * MIB, 12 * MIB, 40 * MIB, 700 * 1024, 96 * MIB];
    for r in 0..rounds {
        for (k, &s) in ids.iter().enumerate() {
            let ptrs: Vec<_> = (0..24)
                .map(|i| {
                    let size = sizes[(i + k + r) % sizes.len()];
                    let p = a.raw_alloc(size, s).unwrap();
                    reservoir::backend::DeviceWork::fill(dev, p, size, 1, s).unwrap();
                    p
                })
                .collect();
            for p in ptrs {
                a.raw_free(p).unwrap();
            }
            dev.advance(20_000);
        }
    }
    a.stats().reserved_bytes.all().peak
}

fn main() {
    println!(
        "| workload | PyTorch mode peak reserved | cross-stream reuse | saved | reuses | races |"
    );
    println!("|---|---|---|---|---|---|");
    for streams in [2, 4, 8] {
        let base = allocator(false);
        let pb = phases(&base, streams, 3);
        let cross = allocator(true);
        let pc = phases(&cross, streams, 3);
        row(
            &format!("phases, {streams} streams x 3 rounds"),
            pb,
            pc,
            &cross,
        );
    }
    for seed in [1, 2, 3] {
        let cfg = IntegrityConfig {
            seed,
            streams: 4,
            ..IntegrityConfig::default()
        };
        let base = allocator(false);
        let pb = integrity_run(&base, &cfg).unwrap().peak_reserved;
        let cross = allocator(true);
        let pc = integrity_run(&cross, &cfg).unwrap().peak_reserved;
        row(
            &format!("random 10k ops, 5 streams, seed {seed}"),
            pb,
            pc,
            &cross,
        );
    }
}

fn row(name: &str, base: i64, cross: i64, a: &CachingAllocator<AsyncSimDevice>) {
    let mib = |b: i64| b as f64 / MIB as f64;
    println!(
        "| {name} | {:.1} MiB | {:.1} MiB | {:.0}% | {} | {} |",
        mib(base),
        mib(cross),
        100.0 * (base - cross) as f64 / base as f64,
        a.cross_stream_reuses(),
        a.backend().races().len()
    );
}
