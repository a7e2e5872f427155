//! Allocations per second through the torch face's entry points
//! (`reservoir_torch_malloc` / `reservoir_torch_delete`) from 1 thread on one
//! stream, then 2 threads on two streams at once, as torch's autograd device
//! thread and the main thread do. Run on the fake driver:
//!
//! ```sh
//! ../shared/oracle/with-fake-driver cargo run --release -p reservoir-capi --example face_threads
//! ```
//!
//! Each iteration allocates 8 blocks of mixed sizes (512 B to 4 MiB) on the
//! thread's stream and frees them: cached blocks after the first iteration,
//! so this measures the allocator, not the driver.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::sys;
use reservoir_capi::{reservoir_torch_delete, reservoir_torch_malloc, ReservoirStatus};

const SIZES: [usize; 8] = [512, 4096, 65536, 1 << 20, 3 << 20, 4 << 20, 1536, 200_000];

/// `iters` rounds of 8 allocations and frees on `stream`; allocations done.
fn work(stream: usize, iters: usize) -> usize {
    let mut ptrs = [std::ptr::null_mut(); SIZES.len()];
    for _ in 0..iters {
        for (p, &n) in ptrs.iter_mut().zip(&SIZES) {
            // SAFETY: a live stream of device 0; `p` a live local.
            let s = unsafe {
                reservoir_torch_malloc(n, 0, stream as *mut c_void, p, std::ptr::null_mut())
            };
            assert_eq!(s, ReservoirStatus::RESERVOIR_OK);
        }
        for p in ptrs {
            assert_eq!(reservoir_torch_delete(p), ReservoirStatus::RESERVOIR_OK);
        }
    }
    iters * SIZES.len()
}

fn main() {
    // The first call builds device 0's allocator and makes its context current.
    let _ = work(0, 1);
    let mut streams = [std::ptr::null_mut(); 2];
    for s in &mut streams {
        // SAFETY: the context is current on this thread; `s` a live local.
        let r = unsafe { sys::cuStreamCreate(s, 0) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS, "cuStreamCreate");
    }
    let [a, b] = streams.map(|s| s as usize);
    let iters = 200_000;
    let _ = work(a, 1000);
    let _ = work(b, 1000);

    let t = Instant::now();
    let n = work(a, iters);
    let one = n as f64 / t.elapsed().as_secs_f64();

    let t = Instant::now();
    let n: usize = std::thread::scope(|sc| {
        let h = [a, b].map(|s| sc.spawn(move || work(s, iters)));
        h.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let two = n as f64 / t.elapsed().as_secs_f64();
    println!(
        "face_threads: 1 thread, 1 stream: {:.2} M allocations/s; 2 threads, 2 streams: {:.2} M allocations/s in all ({:.2}x)",
        one / 1e6,
        two / 1e6,
        two / one
    );
}
