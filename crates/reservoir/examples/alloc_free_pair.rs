//! A 1 KiB `raw_alloc`/`raw_free` pair in a loop, for instruction counts
//! of the hot path under callgrind: run it with two iteration counts and
//! divide the difference in instructions by the difference in pairs.
//!
//! ```text
//! cargo build --release -p reservoir --example alloc_free_pair
//! valgrind --tool=callgrind target/release/examples/alloc_free_pair 100000
//! ```

use reservoir::sim::SimDevice;
use reservoir::{AllocatorConfig, CachingAllocator, StreamId};

fn main() {
    let pairs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let alloc = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
    // Warm the cache: one segment, then every pair is served from it.
    let warm = alloc.raw_alloc(1024, StreamId::DEFAULT).unwrap();
    alloc.raw_free(warm).unwrap();
    for _ in 0..pairs {
        let p = alloc
            .raw_alloc(std::hint::black_box(1024), StreamId::DEFAULT)
            .unwrap();
        alloc.raw_free(std::hint::black_box(p)).unwrap();
    }
    println!("{pairs} pairs");
}
