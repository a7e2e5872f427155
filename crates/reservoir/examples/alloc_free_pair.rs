//! A 1 KiB `raw_alloc`/`raw_free` pair in a loop, for instruction counts
//! of the hot path under callgrind. The measured loop is `loop_pairs`, so
//! `--toggle-collect` counts it without the setup (`tools/icount.sh` does
//! this and divides by the number of pairs):
//!
//! ```text
//! cargo build --release -p reservoir --example alloc_free_pair
//! valgrind --tool=callgrind --toggle-collect='alloc_free_pair::loop_pairs*' \
//!     target/release/examples/alloc_free_pair 100000
//! ```

use reservoir::sim::SimDevice;
use reservoir::{AllocatorConfig, CachingAllocator, StreamId};

/// The measured loop: `pairs` pairs served from the warm cache.
#[inline(never)]
fn loop_pairs(alloc: &CachingAllocator<SimDevice>, pairs: u64) {
    for _ in 0..pairs {
        let p = alloc
            .raw_alloc(std::hint::black_box(1024), StreamId::DEFAULT)
            .unwrap();
        alloc.raw_free(std::hint::black_box(p)).unwrap();
    }
}

fn main() {
    let pairs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let alloc = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
    // Warm the cache: one segment, then every pair is served from it.
    let warm = alloc.raw_alloc(1024, StreamId::DEFAULT).unwrap();
    alloc.raw_free(warm).unwrap();
    loop_pairs(&alloc, pairs);
    println!("{pairs} pairs");
}
