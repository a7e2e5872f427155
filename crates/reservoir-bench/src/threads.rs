//! `--threads`: allocators shared by threads that each allocate and free on
//! their own stream (random sizes, 64 live blocks each), as issue 16's
//! threads measurement: total operations per second with 1, 2 and 4
//! threads, for one `CachingAllocator` (one lock per device, as PyTorch) and
//! for `StreamShards` (one lock per stream).

use std::sync::Barrier;
use std::time::Instant;

use reservoir::caching::StreamShards;
use reservoir::rng::SplitMix64;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocError, AllocatorConfig, Backend, CachingAllocator, DevicePtr, StreamId};

/// Operations (allocations + frees) each thread makes per measurement.
const OPS_PER_THREAD: usize = 400_000;
const LIVE: usize = 64;

/// Which allocator the threads share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    /// One `CachingAllocator`: every call takes the device's one lock.
    DeviceLock,
    /// `StreamShards`: each stream's calls take that stream's lock.
    StreamShards,
    /// No sharing: each thread its own `CachingAllocator` and device, the
    /// machine's own limit for this loop (what perfect scaling reaches here).
    Unshared,
}

impl Shared {
    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Shared::DeviceLock => "CachingAllocator (one lock per device)",
            Shared::StreamShards => "StreamShards (one lock per stream)",
            Shared::Unshared => "unshared (an allocator per thread: the machine's limit)",
        }
    }
}

/// The two calls the threads make.
trait ThreadedAlloc: Sync {
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError>;
    /// Free `ptr`, allocated on `stream` (only `PerThread` needs to know).
    fn free(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError>;
}

impl ThreadedAlloc for CachingAllocator<SimDevice> {
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.raw_alloc(size, stream)
    }
    fn free(&self, ptr: DevicePtr, _stream: StreamId) -> Result<(), AllocError> {
        self.raw_free(ptr)
    }
}

impl ThreadedAlloc for StreamShards<SimDevice> {
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.raw_alloc(size, stream)
    }
    fn free(&self, ptr: DevicePtr, _stream: StreamId) -> Result<(), AllocError> {
        self.raw_free(ptr)
    }
}

/// One allocator and device per stream, stream `n` on the `n`-th: nothing
/// is shared between the threads.
struct PerThread(Vec<CachingAllocator<SimDevice>>);

impl PerThread {
    fn new(threads: usize) -> PerThread {
        PerThread(
            (0..threads)
                .map(|_| {
                    CachingAllocator::new(
                        SimDevice::new(SimConfig::like_fake_driver()),
                        AllocatorConfig::default(),
                    )
                })
                .collect(),
        )
    }
}

impl PerThread {
    /// The allocator of `stream` (numbered from 1 by `create_stream`).
    fn of(&self, stream: StreamId) -> &CachingAllocator<SimDevice> {
        &self.0[stream.0 as usize - 1]
    }
}

impl ThreadedAlloc for PerThread {
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.of(stream).raw_alloc(size, StreamId::DEFAULT)
    }
    fn free(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.of(stream).raw_free(ptr)
    }
}

/// Millions of operations per second with `threads` threads sharing one
/// `shared` allocator: the median and the best of `reps` runs. On a machine
/// shared with other work the best run is the one least disturbed by it
/// (all threads had a core), the median what a run typically gets.
pub fn ops_per_second(shared: Shared, threads: usize, reps: usize) -> Rate {
    let (mut rates, mut projected) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let dev = SimDevice::new(SimConfig::like_fake_driver());
        let streams: Vec<StreamId> = (0..threads)
            .map(|_| {
                dev.create_stream()
                    .expect("the simulated device creates streams")
            })
            .collect();
        let timing = match shared {
            Shared::DeviceLock => measure(
                &CachingAllocator::new(dev, AllocatorConfig::default()),
                &streams,
            ),
            Shared::StreamShards => measure(
                &StreamShards::new(dev, AllocatorConfig::default())
                    .expect("the default settings are supported"),
                &streams,
            ),
            Shared::Unshared => measure(&PerThread::new(threads), &streams),
        };
        let ops = (threads * OPS_PER_THREAD) as f64;
        rates.push(ops / timing.wall / 1e6);
        if let Some(cpu) = timing.busiest_thread_cpu {
            projected.push(ops / cpu / 1e6);
        }
    }
    let best = rates.iter().copied().fold(0.0, f64::max);
    Rate {
        median: crate::run::median(rates),
        best,
        core_per_thread: (projected.len() == reps).then(|| crate::run::median(projected)),
    }
}

/// Millions of operations per second over repeated runs.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    /// The median run.
    pub median: f64,
    /// The fastest run.
    pub best: f64,
    /// With a core for each thread (median): the operations over the CPU
    /// time of the busiest thread. What the threads reach on an otherwise
    /// idle machine when they never wait for each other (true without a
    /// shared lock; a thread parked on a lock uses no CPU, so for one lock
    /// per device it says nothing). `None` without per-thread CPU times.
    pub core_per_thread: Option<f64>,
}

/// Seconds for one thread per stream to make `OPS_PER_THREAD` operations,
/// all starting together after a warm-up.
fn measure(alloc: &impl ThreadedAlloc, streams: &[StreamId]) -> Timing {
    let barrier = Barrier::new(streams.len() + 1);
    std::thread::scope(|s| {
        let threads: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(i, &stream)| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut rng = SplitMix64::new(i as u64 + 1);
                    // Warm the thread's cache, then measure from the barrier.
                    churn(alloc, stream, &mut rng, OPS_PER_THREAD / 4);
                    barrier.wait();
                    let cpu = thread_cpu_ns();
                    churn(alloc, stream, &mut rng, OPS_PER_THREAD);
                    let cpu = thread_cpu_ns().zip(cpu).map(|(end, start)| end - start);
                    barrier.wait();
                    cpu
                })
            })
            .collect();
        barrier.wait();
        let t = Instant::now();
        barrier.wait();
        let wall = t.elapsed().as_secs_f64();
        let cpu: Option<Vec<u64>> = threads
            .into_iter()
            .map(|t| t.join().expect("a measuring thread"))
            .collect();
        Timing {
            wall,
            busiest_thread_cpu: cpu
                .and_then(|c| c.into_iter().max())
                .map(|ns| ns as f64 / 1e9),
        }
    })
}

/// One measurement: wall seconds, and the CPU seconds of the busiest thread.
struct Timing {
    wall: f64,
    busiest_thread_cpu: Option<f64>,
}

/// Nanoseconds the calling thread has run on a CPU (Linux's
/// `/proc/thread-self/schedstat`), or `None` where that is not available.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// `ops` operations on `stream`: allocate sizes log-uniform from 512 B to
/// 4 MiB, freeing a random live block first once `LIVE` are live; all are
/// freed at the end.
fn churn(alloc: &impl ThreadedAlloc, stream: StreamId, rng: &mut SplitMix64, ops: usize) {
    let mut live: Vec<DevicePtr> = Vec::with_capacity(LIVE);
    let mut done = 0;
    while done < ops {
        if live.len() >= LIVE {
            let at = (rng.next_u64() % LIVE as u64) as usize;
            alloc
                .free(live.swap_remove(at), stream)
                .expect("a live pointer");
            done += 1;
        }
        let bits = 9 + rng.next_u64() % 13;
        let size = (1u64 << bits) + rng.next_u64() % (1u64 << bits);
        live.push(alloc.alloc(size, stream).expect("the device has room"));
        done += 1;
    }
    for p in live {
        alloc.free(p, stream).expect("a live pointer");
    }
}
