//! Stream-safety scenarios any asynchronous backend can run.
//!
//! A backend that can fill and read back memory on its streams (the
//! [`DeviceWork`] capability) and copy it ([`Memcpy`]) can run them: the
//! scenarios drive a [`CachingAllocator`] over it and report what they saw:
//!
//! * [`held_stream_reuse`]: a block used by a held (busy) stream and freed
//!   after `record_stream` is not handed out again until that stream has
//!   finished, and is handed out again afterwards (spec 1.10);
//! * [`integrity_run`]: a seeded random mix of multi-stream allocations,
//!   fills, cross-stream copies (ordered with events and `record_stream`),
//!   frees, `empty_cache` calls and read-backs; every read-back is compared
//!   with what the program wrote. It drives any [`ScenarioAllocator`]: the
//!   caching allocator, or the MPS heap allocator ([`HeapAllocator`]), which
//!   is told of every piece of work on a buffer after it is enqueued
//!   ([`HeapAllocator::record_use`]) because its buffers have no stream.
//!
//! The OpenCL backend runs them on a real device API (PoCL), the
//! [`AsyncSimDevice`](reservoir::sim::AsyncSimDevice) with its race sanitizer.

use std::collections::BTreeSet;

use reservoir::backend::{Backend, BackendError, DevicePtr, DeviceWork, Memcpy, StreamId};
use reservoir::caching::CachingAllocator;
use reservoir::checksum::checksum_of_fill;
use reservoir::error::AllocError;
use reservoir::heap::{HeapAllocator, UsageFlags};
use reservoir::rng::SplitMix64;

/// An allocator the [`integrity_run`] can drive: PyTorch's calls, and how
/// it learns that a stream used a block.
pub trait ScenarioAllocator {
    /// The backend.
    type Device: Backend;

    /// The backend it allocates from.
    fn device(&self) -> &Self::Device;

    /// Allocate `size` bytes for use on `stream`.
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError>;

    /// Free a block.
    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError>;

    /// Stream `stream` is about to enqueue work on the block at `ptr`,
    /// which was allocated for `home`.
    fn before_use(
        &self,
        ptr: DevicePtr,
        stream: StreamId,
        home: StreamId,
    ) -> Result<(), AllocError>;

    /// Stream `stream` has just enqueued work on the blocks at `ptrs`.
    fn after_use(&self, ptrs: &[DevicePtr], stream: StreamId) -> Result<(), AllocError>;

    /// Release cached memory.
    fn empty_cache(&self) -> Result<(), AllocError>;

    /// Peak reserved bytes.
    fn peak_reserved(&self) -> i64;
}

/// The caching allocator: `record_stream` for a stream other than the
/// block's own, as PyTorch programs do (the free records the events).
impl<B: Backend> ScenarioAllocator for CachingAllocator<B> {
    type Device = B;

    fn device(&self) -> &B {
        self.backend()
    }

    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.raw_alloc(size, stream)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.raw_free(ptr)
    }

    fn before_use(
        &self,
        ptr: DevicePtr,
        stream: StreamId,
        home: StreamId,
    ) -> Result<(), AllocError> {
        if stream != home {
            self.record_stream(ptr, stream)?;
        }
        Ok(())
    }

    fn after_use(&self, _ptrs: &[DevicePtr], _stream: StreamId) -> Result<(), AllocError> {
        Ok(())
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        CachingAllocator::empty_cache(self)
    }

    fn peak_reserved(&self) -> i64 {
        self.stats().reserved_bytes.all().peak
    }
}

/// The MPS heap allocator: private buffers (the stream does not choose
/// one); every piece of work is recorded on its buffers once enqueued
/// ([`HeapAllocator::record_use`]: their retain counts stay above 1 until it
/// completes). On a backend with several queues, build it with
/// `HeapSettings::free_waits_for_events` (the later MPS redesign's pending
/// set): the seed's 2.x free path hands a busy buffer out again at once,
/// which Metal's single serial queue orders but several queues do not.
impl<B: Backend> ScenarioAllocator for HeapAllocator<B> {
    type Device = B;

    fn device(&self) -> &B {
        self.backend()
    }

    fn alloc(&self, size: u64, _stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.malloc(size, UsageFlags::PRIVATE)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        HeapAllocator::free(self, ptr)
    }

    fn before_use(
        &self,
        _ptr: DevicePtr,
        _stream: StreamId,
        _home: StreamId,
    ) -> Result<(), AllocError> {
        Ok(())
    }

    fn after_use(&self, ptrs: &[DevicePtr], stream: StreamId) -> Result<(), AllocError> {
        self.record_use(ptrs, stream)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        HeapAllocator::empty_cache(self)
    }

    fn peak_reserved(&self) -> i64 {
        self.stats().reserved_bytes.all().peak
    }
}

/// A scenario failed to run (not a finding: the device or allocator erred).
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The allocator refused a call.
    #[error("allocator error during {during}: {source}")]
    Alloc {
        /// The scenario step.
        during: &'static str,
        /// The allocator's error.
        source: AllocError,
    },
    /// The backend failed.
    #[error("backend error during {during}: {source}")]
    Backend {
        /// The scenario step.
        during: &'static str,
        /// The backend's error.
        source: BackendError,
    },
}

fn alloc_err(during: &'static str) -> impl FnOnce(AllocError) -> ScenarioError {
    move |source| ScenarioError::Alloc { during, source }
}

fn dev_err(during: &'static str) -> impl FnOnce(BackendError) -> ScenarioError {
    move |source| ScenarioError::Backend { during, source }
}

/// The backend's [`DeviceWork`] capability, or the error that it lacks it.
fn device_work<B: Backend>(dev: &B) -> Result<&dyn DeviceWork, ScenarioError> {
    dev.as_device_work().ok_or(ScenarioError::Backend {
        during: "starting the scenario",
        source: BackendError::Unsupported {
            backend: dev.name(),
            what: "device work (fill, read back, hold)",
        },
    })
}

/// The backend's [`Memcpy`] capability, or the error that it lacks it.
fn memcpy<B: Backend>(dev: &B) -> Result<&dyn Memcpy, ScenarioError> {
    dev.as_memcpy().ok_or(ScenarioError::Backend {
        during: "starting the scenario",
        source: BackendError::Unsupported {
            backend: dev.name(),
            what: "memcpy",
        },
    })
}

/// What [`held_stream_reuse`] observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldReuseOutcome {
    /// The block that the held stream used.
    pub freed: DevicePtr,
    /// What an allocation of the same size got while the stream was busy.
    pub while_busy: DevicePtr,
    /// What it got after the stream finished.
    pub after: DevicePtr,
    /// Were the bytes the held stream wrote intact when read back on the
    /// allocation stream after the release (`None`: the device holds no data)?
    pub data_intact: Option<bool>,
}

/// spec 1.10 on a device: allocate `size` bytes on `home`, hold `busy`,
/// fill the block on `busy`, `record_stream(busy)`, free it, allocate the
/// same size on `home` (must be another block), release `busy`, allocate
/// again on `home` (must be the freed block).
pub fn held_stream_reuse<B: Backend>(
    a: &CachingAllocator<B>,
    home: StreamId,
    busy: StreamId,
    size: u64,
) -> Result<HeldReuseOutcome, ScenarioError> {
    let dev = a.backend();
    let work = device_work(dev)?;
    let p = a.raw_alloc(size, home).map_err(alloc_err("first alloc"))?;
    work.fill(p, size, 0x11, home)
        .map_err(dev_err("fill on home"))?;
    let ready = dev.record_event(home).map_err(dev_err("record"))?;
    work.hold(busy).map_err(dev_err("hold"))?;
    dev.stream_wait_event(busy, ready)
        .map_err(dev_err("wait on home"))?;
    dev.destroy_event(ready).map_err(dev_err("destroy event"))?;
    work.fill(p, size, 0x5a, busy)
        .map_err(dev_err("fill on held stream"))?;
    a.record_stream(p, busy)
        .map_err(alloc_err("record_stream"))?;
    a.raw_free(p).map_err(alloc_err("free"))?;
    let q = a
        .raw_alloc(size, home)
        .map_err(alloc_err("alloc while busy"))?;
    work.fill(q, size, 0x22, home)
        .map_err(dev_err("fill other block"))?;
    work.release(busy).map_err(dev_err("release"))?;
    let r = a.raw_alloc(size, home).map_err(alloc_err("alloc after"))?;
    let data_intact = if r == p {
        work.read_checksum(r, size, home)
            .map_err(dev_err("read back"))?
            .map(|c| c == checksum_of_fill(0x5a, size))
    } else {
        Some(false)
    };
    a.raw_free(q).map_err(alloc_err("free"))?;
    a.raw_free(r).map_err(alloc_err("free"))?;
    Ok(HeldReuseOutcome {
        freed: p,
        while_busy: q,
        after: r,
        data_intact,
    })
}

/// Settings of an [`integrity_run`].
#[derive(Clone, Debug)]
pub struct IntegrityConfig {
    /// Operations to run.
    pub ops: u64,
    /// Streams besides the default stream.
    pub streams: usize,
    /// Seed of the operation mix.
    pub seed: u64,
    /// Request sizes to draw from. Copies only pair blocks of equal size.
    pub sizes: Vec<u64>,
    /// Blocks alive at most at once.
    pub max_live: usize,
}

impl IntegrityConfig {
    /// The run each real backend's integrity test reports (the `opencl
    /// integrity` and `cuda integrity` lines CI looks for): the defaults,
    /// 10,000 operations on 4 streams, with seed 42, so the lines of
    /// different backends and allocators describe the same operations.
    pub fn backend_run() -> Self {
        IntegrityConfig {
            seed: 42,
            ..IntegrityConfig::default()
        }
    }
}

impl Default for IntegrityConfig {
    fn default() -> Self {
        IntegrityConfig {
            ops: 10_000,
            streams: 4,
            seed: 1,
            sizes: vec![512, 4096, 65_536, 300_000, 1_500_000, 3 << 20],
            max_live: 48,
        }
    }
}

/// What an [`integrity_run`] observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntegrityReport {
    /// Operations run.
    pub ops: u64,
    /// Streams used, the default stream included.
    pub streams: usize,
    /// Read-backs compared with the expected contents.
    pub verified: u64,
    /// Read-backs that differed, as (address, size, expected byte).
    pub corruptions: Vec<(DevicePtr, u64, u8)>,
    /// Allocations, fills, copies, frees and `empty_cache` calls.
    pub allocs: u64,
    /// Fills.
    pub fills: u64,
    /// Cross-stream copies.
    pub copies: u64,
    /// Frees.
    pub frees: u64,
    /// `empty_cache` calls.
    pub empty_caches: u64,
    /// Peak reserved bytes of the allocator.
    pub peak_reserved: i64,
}

struct Live {
    ptr: DevicePtr,
    size: u64,
    home: StreamId,
    byte: u8,
    /// Streams that enqueued work on the block since the last ordering point.
    users: BTreeSet<StreamId>,
}

/// Order stream `s` after all work of the block's users, then note `s` as
/// a user (and tell the allocator, so a free waits for `s`).
fn use_on<A: ScenarioAllocator>(a: &A, b: &mut Live, s: StreamId) -> Result<(), ScenarioError> {
    let dev = a.device();
    for &u in b.users.iter().filter(|&&u| u != s) {
        let e = dev.record_event(u).map_err(dev_err("record"))?;
        dev.stream_wait_event(s, e).map_err(dev_err("wait"))?;
        dev.destroy_event(e).map_err(dev_err("destroy event"))?;
    }
    b.users.insert(s);
    a.before_use(b.ptr, s, b.home)
        .map_err(alloc_err("record_stream"))
}

/// Stream `s` has enqueued work on `ptrs`: tell the allocator.
fn used<A: ScenarioAllocator>(a: &A, ptrs: &[DevicePtr], s: StreamId) -> Result<(), ScenarioError> {
    a.after_use(ptrs, s).map_err(alloc_err("record_use"))
}

/// Run the random multi-stream workload described in the
/// [module documentation](self) and report every corrupted read-back.
pub fn integrity_run<A: ScenarioAllocator>(
    a: &A,
    cfg: &IntegrityConfig,
) -> Result<IntegrityReport, ScenarioError> {
    let dev = a.device();
    let work = device_work(dev)?;
    let copier = memcpy(dev)?;
    let mut streams = vec![StreamId::DEFAULT];
    for _ in 0..cfg.streams {
        streams.push(dev.create_stream().map_err(dev_err("create stream"))?);
    }
    let mut rng = SplitMix64::new(cfg.seed);
    let mut live: Vec<Live> = Vec::new();
    let mut rep = IntegrityReport {
        ops: cfg.ops,
        streams: streams.len(),
        ..IntegrityReport::default()
    };
    let pick = |rng: &mut SplitMix64, v: &[StreamId]| v[rng.below_modulo(v.len() as u64) as usize];
    for _ in 0..cfg.ops {
        work.let_time_pass(rng.below_modulo(2_000));
        let roll = rng.below_modulo(100);
        if (roll < 30 && live.len() < cfg.max_live) || live.is_empty() {
            let size = cfg.sizes[rng.below_modulo(cfg.sizes.len() as u64) as usize];
            let home = pick(&mut rng, &streams);
            let ptr = a.alloc(size, home).map_err(alloc_err("alloc"))?;
            let byte = (rng.next_u64() as u8) | 1;
            work.fill(ptr, size, byte, home).map_err(dev_err("fill"))?;
            used(a, &[ptr], home)?;
            live.push(Live {
                ptr,
                size,
                home,
                byte,
                users: BTreeSet::from([home]),
            });
            rep.allocs += 1;
            rep.fills += 1;
        } else if roll < 45 {
            let i = rng.below_modulo(live.len() as u64) as usize;
            let s = pick(&mut rng, &streams);
            let byte = (rng.next_u64() as u8) | 1;
            use_on(a, &mut live[i], s)?;
            let b = &mut live[i];
            work.fill(b.ptr, b.size, byte, s)
                .map_err(dev_err("refill"))?;
            b.byte = byte;
            used(a, &[b.ptr], s)?;
            rep.fills += 1;
        } else if roll < 65 {
            let i = rng.below_modulo(live.len() as u64) as usize;
            let size = live[i].size;
            let Some(j) = (0..live.len()).find(|&j| j != i && live[j].size == size) else {
                continue;
            };
            let s = pick(&mut rng, &streams);
            use_on(a, &mut live[i], s)?;
            use_on(a, &mut live[j], s)?;
            copier
                .copy(live[j].ptr, live[i].ptr, size, s)
                .map_err(dev_err("copy"))?;
            used(a, &[live[i].ptr, live[j].ptr], s)?;
            live[j].byte = live[i].byte;
            rep.copies += 1;
        } else if roll < 85 {
            let i = rng.below_modulo(live.len() as u64) as usize;
            let b = live.swap_remove(i);
            a.free(b.ptr).map_err(alloc_err("free"))?;
            rep.frees += 1;
        } else if roll < 99 {
            let i = rng.below_modulo(live.len() as u64) as usize;
            let s = live[i].home;
            use_on(a, &mut live[i], s)?;
            let b = &live[i];
            rep.verified += 1;
            let got = work
                .read_checksum(b.ptr, b.size, s)
                .map_err(dev_err("read back"))?;
            if got.is_some_and(|c| c != checksum_of_fill(b.byte, b.size)) {
                rep.corruptions.push((b.ptr, b.size, b.byte));
            }
        } else {
            a.empty_cache().map_err(alloc_err("empty_cache"))?;
            rep.empty_caches += 1;
        }
    }
    for mut b in live.drain(..) {
        let s = b.home;
        use_on(a, &mut b, s)?;
        rep.verified += 1;
        let got = work
            .read_checksum(b.ptr, b.size, s)
            .map_err(dev_err("read back"))?;
        if got.is_some_and(|c| c != checksum_of_fill(b.byte, b.size)) {
            rep.corruptions.push((b.ptr, b.size, b.byte));
        }
        a.free(b.ptr).map_err(alloc_err("free"))?;
        rep.frees += 1;
    }
    rep.peak_reserved = a.peak_reserved();
    Ok(rep)
}
