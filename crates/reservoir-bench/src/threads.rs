//! `--threads`: one allocator shared by threads that each allocate and free
//! on their own stream (random sizes, 64 live blocks each), as issue 16's
//! threads measurement: total operations per second with 1, 2 and 4 threads.

use std::sync::Barrier;
use std::time::Instant;

use reservoir::rng::SplitMix64;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocatorConfig, Backend, CachingAllocator, DevicePtr, StreamId};

/// Operations (allocations + frees) each thread makes per measurement.
const OPS_PER_THREAD: usize = 400_000;
const LIVE: usize = 64;

/// Millions of operations per second with `threads` threads, median of `reps`.
pub fn ops_per_second(threads: usize, reps: usize) -> f64 {
    let mut rates = Vec::new();
    for _ in 0..reps {
        let dev = SimDevice::new(SimConfig::like_fake_driver());
        let streams: Vec<StreamId> = (0..threads)
            .map(|_| {
                dev.create_stream()
                    .expect("the simulated device creates streams")
            })
            .collect();
        let alloc = CachingAllocator::new(dev, AllocatorConfig::default());
        let barrier = Barrier::new(threads + 1);
        let elapsed = std::thread::scope(|s| {
            for (i, &stream) in streams.iter().enumerate() {
                let (alloc, barrier) = (&alloc, &barrier);
                s.spawn(move || {
                    let mut rng = SplitMix64::new(i as u64 + 1);
                    // Warm the thread's cache, then measure from the barrier.
                    churn(alloc, stream, &mut rng, OPS_PER_THREAD / 4);
                    barrier.wait();
                    churn(alloc, stream, &mut rng, OPS_PER_THREAD);
                    barrier.wait();
                });
            }
            barrier.wait();
            let t = Instant::now();
            barrier.wait();
            t.elapsed()
        });
        rates.push((threads * OPS_PER_THREAD) as f64 / elapsed.as_secs_f64() / 1e6);
    }
    crate::run::median(rates)
}

/// `ops` operations on `stream`: allocate sizes log-uniform from 512 B to
/// 4 MiB, freeing a random live block first once `LIVE` are live; all are
/// freed at the end.
fn churn(alloc: &CachingAllocator<SimDevice>, stream: StreamId, rng: &mut SplitMix64, ops: usize) {
    let mut live: Vec<DevicePtr> = Vec::with_capacity(LIVE);
    let mut done = 0;
    while done < ops {
        if live.len() >= LIVE {
            let at = (rng.next_u64() % LIVE as u64) as usize;
            alloc
                .raw_free(live.swap_remove(at))
                .expect("a live pointer");
            done += 1;
        }
        let bits = 9 + rng.next_u64() % 13;
        let size = (1u64 << bits) + rng.next_u64() % (1u64 << bits);
        live.push(alloc.raw_alloc(size, stream).expect("the device has room"));
        done += 1;
    }
    for p in live {
        alloc.raw_free(p).expect("a live pointer");
    }
}
