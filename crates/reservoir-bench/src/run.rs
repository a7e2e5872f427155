//! Running one sequence through one implementation: the measured loops
//! (`run_*`, `#[inline(never)]` so callgrind's `--toggle-collect` counts
//! only them) mirror allocbench's `run_replay` call for call.

use std::time::Instant;

use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocatorConfig, CachingAllocator, StreamId};
use reservoir::{Backend, DevicePtr};

use crate::fastest::fastest_config;
use crate::offset;
use crate::ops::{BenchOp, Ops};

/// The implementations measured in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// `CachingAllocator<SimDevice>` in PyTorch mode (default settings).
    Reservoir,
    /// `CachingAllocator<SimDevice>` in its fastest configuration
    /// ([`fastest_config`]).
    Fastest,
    /// The `offset-allocator` crate over one arena (no streams, no cache).
    Offset,
    /// No cache: every allocation is a device allocation (`SimDevice`).
    NoCache,
    /// CubeCL's memory management over a counting storage (feature
    /// `cubecl`).
    #[cfg(feature = "cubecl")]
    Cubecl,
}

impl Impl {
    /// Every implementation measured in this process, in table order.
    #[cfg(not(feature = "cubecl"))]
    pub const ALL: &'static [Impl] = &[Impl::Reservoir, Impl::Fastest, Impl::Offset, Impl::NoCache];
    /// Every implementation measured in this process, in table order.
    #[cfg(feature = "cubecl")]
    pub const ALL: &'static [Impl] = &[
        Impl::Reservoir,
        Impl::Fastest,
        Impl::Offset,
        Impl::Cubecl,
        Impl::NoCache,
    ];

    /// Name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            Impl::Reservoir => "reservoir",
            Impl::Fastest => "fastest",
            Impl::Offset => "offset-allocator",
            Impl::NoCache => "no-cache",
            #[cfg(feature = "cubecl")]
            Impl::Cubecl => "cubecl",
        }
    }

    /// The measured loop, for callgrind's `--toggle-collect`.
    pub fn loop_symbol(self) -> &'static str {
        match self {
            Impl::Reservoir | Impl::Fastest => "reservoir_bench::run::run_reservoir*",
            Impl::Offset => "reservoir_bench::offset::run_offset*",
            Impl::NoCache => "reservoir_bench::run::run_no_cache*",
            #[cfg(feature = "cubecl")]
            Impl::Cubecl => "reservoir_bench::cubecl::run_cubecl*",
        }
    }

    /// The implementation called `name`.
    pub fn parse(name: &str) -> Option<Impl> {
        Impl::ALL.iter().copied().find(|i| i.name() == name)
    }
}

/// Run `ops` `reps` times on one fresh instance of `imp` (warm after the
/// first repetition, as allocbench). Returns the nanoseconds per op of each
/// repetition and the number of allocator calls made.
pub fn run(imp: Impl, ops: &Ops, reps: usize) -> (Vec<f64>, usize) {
    let dev = SimDevice::new(SimConfig::like_fake_driver());
    let mut streams = vec![StreamId::DEFAULT];
    for _ in 1..ops.streams {
        streams.push(
            dev.create_stream()
                .expect("the simulated device creates streams"),
        );
    }
    let n = ops.ops.len();
    match imp {
        Impl::Reservoir | Impl::Fastest => {
            let config = if imp == Impl::Fastest {
                fastest_config()
            } else {
                AllocatorConfig::default()
            };
            let alloc = CachingAllocator::new(dev, config);
            let mut ptr = vec![None; ops.ids];
            timed(reps, n, || {
                run_reservoir(&alloc, &ops.ops, &streams, &mut ptr)
            })
        }
        Impl::Offset => {
            let mut arena = offset::arena(reservoir::sim::FAKE_DRIVER_CAPACITY);
            let mut live = vec![None; ops.ids];
            timed(reps, n, || {
                offset::run_offset(&mut arena, &ops.ops, &mut live)
            })
        }
        #[cfg(feature = "cubecl")]
        Impl::Cubecl => {
            let mut pools = crate::cubecl::CubeclPools::new(ops.streams as usize);
            let mut live = vec![None; ops.ids];
            timed(reps, n, || {
                crate::cubecl::run_cubecl(&mut pools, &ops.ops, &mut live)
            })
        }
        Impl::NoCache => {
            let mut ptr = vec![None; ops.ids];
            timed(reps, n, || run_no_cache(&dev, &ops.ops, &streams, &mut ptr))
        }
    }
}

/// Call `replay` `reps` times: the nanoseconds per op (of `ops` ops) of
/// each call, and the allocator calls they made in total.
fn timed(reps: usize, ops: usize, mut replay: impl FnMut() -> usize) -> (Vec<f64>, usize) {
    let mut times = Vec::with_capacity(reps);
    let mut calls = 0;
    for _ in 0..reps {
        let t = Instant::now();
        calls += replay();
        times.push(t.elapsed().as_nanos() as f64 / ops as f64);
    }
    (times, calls)
}

/// allocbench's `run_replay` over Reservoir: an allocation whose name is
/// live frees it first; a failed allocation leaves the name empty; the
/// leftovers are freed at the end. Returns the allocator calls made.
#[inline(never)]
pub fn run_reservoir(
    alloc: &CachingAllocator<SimDevice>,
    ops: &[BenchOp],
    streams: &[StreamId],
    ptr: &mut [Option<DevicePtr>],
) -> usize {
    let mut calls = 0;
    for op in ops {
        match *op {
            BenchOp::Alloc { id, bytes, stream } => {
                let slot = &mut ptr[id as usize];
                if let Some(p) = slot.take() {
                    let _ = alloc.raw_free(p);
                    calls += 1;
                }
                *slot = alloc.raw_alloc(bytes, streams[stream as usize]).ok();
                calls += 1;
            }
            BenchOp::Free { id } => {
                if let Some(p) = ptr[id as usize].take() {
                    let _ = alloc.raw_free(p);
                    calls += 1;
                }
            }
            BenchOp::EmptyCache => {
                let _ = alloc.empty_cache();
                calls += 1;
            }
        }
    }
    for slot in ptr.iter_mut() {
        if let Some(p) = slot.take() {
            let _ = alloc.raw_free(p);
            calls += 1;
        }
    }
    calls
}

/// The same calls straight to the device: `cudaMalloc`/`cudaFree` of the
/// size rounded to 512 bytes, no cache.
#[inline(never)]
pub fn run_no_cache(
    dev: &SimDevice,
    ops: &[BenchOp],
    streams: &[StreamId],
    ptr: &mut [Option<(DevicePtr, u64)>],
) -> usize {
    let mut calls = 0;
    for op in ops {
        match *op {
            BenchOp::Alloc { id, bytes, stream } => {
                let slot = &mut ptr[id as usize];
                if let Some((p, size)) = slot.take() {
                    let _ = dev.free(p, size);
                    calls += 1;
                }
                let size = bytes.max(1).div_ceil(512) * 512;
                *slot = dev
                    .allocate(size, streams[stream as usize])
                    .ok()
                    .map(|p| (p, size));
                calls += 1;
            }
            BenchOp::Free { id } => {
                if let Some((p, size)) = ptr[id as usize].take() {
                    let _ = dev.free(p, size);
                    calls += 1;
                }
            }
            BenchOp::EmptyCache => calls += 1,
        }
    }
    for slot in ptr.iter_mut() {
        if let Some((p, size)) = slot.take() {
            let _ = dev.free(p, size);
            calls += 1;
        }
    }
    calls
}

/// The median of `v` (upper median for an even count, as allocbench).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
