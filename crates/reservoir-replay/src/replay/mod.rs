//! The replay engine: run an oracle trace through a [`CachingAllocator`] on
//! a [`SimDevice`] and measure what the allocator did.
//!
//! The engine drives its allocator through [`ReplayTarget`] (the caching
//! allocator is the default target, [`Replay::new`]; any other allocator
//! implementing the trait runs through [`Replay::build`]), so everything
//! built on it, the recorded-snapshot replay, the fidelity report and the
//! reports of `reservoir replay`, works for every target.
//!
//! A [`Trace`] (from a file, or from a built-in [workload](crate::workload))
//! is replayed once per [`ReplaySetting`], a named
//! `PYTORCH_CUDA_ALLOC_CONF`-style string, on a simulated device of a given
//! capacity. Every op of the oracle's format is handled as
//! `../shared/oracle/oracle_replay.py` handles it on the real allocator:
//!
//! | op | engine |
//! |---|---|
//! | `a <id> <bytes> [stream]` | [`CachingAllocator::raw_alloc`] on the stream (or the current one); an out-of-memory error is counted and the replay goes on |
//! | `f <id>` | [`CachingAllocator::raw_free`]; ignored if the allocation of `id` failed |
//! | `e` | [`CachingAllocator::empty_cache`] |
//! | `s <stream>` | the current stream changes |
//! | `r <id> <stream>` | [`CachingAllocator::record_stream`]; ignored if the allocation failed |
//! | `k <stream> [<id>...]` | [`SimDevice::enqueue_work`], once per live id (once if none) |
//! | `h` / `u <stream>` | [`SimDevice::hold_stream`] / [`SimDevice::release_stream`] |
//! | `y [<stream>]` | [`SimDevice::synchronize_stream`] / [`SimDevice::synchronize_all`] |
//! | `w <s1> <s2>` | an event recorded on `s2`, waited for by `s1` (`wait_stream`) |
//!
//! Streams are named in traces; [`StreamTable::resolve`] maps names to
//! [`StreamId`]s: `0`/`default` is [`StreamId::DEFAULT`], other names are
//! numbered 1, 2, ... in the order the replay first uses them (the order in
//! which the oracle creates its streams).
//!
//! Anything else the oracle refuses (freeing or recording an id that is not
//! live and did not fail, allocating an id that is live) stops the replay
//! with a [`ReplayError::Trace`] naming the op and its line.
//!
//! The simulated device follows the fake CUDA driver's completion model
//! ([`HoldSemantics::EnqueuedWork`]) and charges its driver cost model
//! ([`SimCounters::driver_time_ns`](reservoir::sim::SimCounters::driver_time_ns)).
//!
//! The result is a [`ReplayReport`]: peaks, fragmentation, the state at the
//! peak, driver calls, out-of-memory errors, simulated driver time, the
//! allocator's own wall time per call, the final `memory_stats()` and a
//! downsampled time series. Its JSON keys are documented on
//! [`ReplayReport`] and stable.
//!
//! ```
//! use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting};
//! use reservoir_replay::workload;
//!
//! let trace = workload::generate("gpt-train:layers=2,steps=2").unwrap();
//! let setting = ReplaySetting::parse("max-split-128=max_split_size_mb:128").unwrap();
//! let report = replay(&trace, &setting, &ReplayOptions::default()).unwrap();
//! assert_eq!(report.setting, "max-split-128");
//! assert!(report.peak_reserved >= report.peak_allocated);
//! assert_eq!(report.ooms, 0);
//! ```

pub mod capacity;
pub mod explain;
mod live;
mod report;
pub mod sites;
pub mod snapshot;
mod target;

pub use report::{OomRecord, PeakState, ReplayReport, Sample};
pub use target::ReplayTarget;

use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use live::{IdState, LiveIds};
use reservoir::backend::{Backend, BackendError, DevicePtr, StreamId};
use reservoir::caching::{
    CachingAllocator, SeedError, SeededBlock, SeededExpandable, SeededSegment,
};
use reservoir::config::AllocatorConfig;
use reservoir::error::AllocError;
use reservoir::heap::HeapAllocator;
use reservoir::sim::{AddressPolicy, HoldSemantics, SimConfig, SimDevice, DEFAULT_CAPACITY};

/// The allocator a [`ReplaySetting`] replays through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocatorKind {
    /// PyTorch's CUDA caching allocator ([`CachingAllocator`]), with the
    /// setting's settings string.
    #[default]
    Caching,
    /// PyTorch's MPS heap allocator ([`HeapAllocator`]) on unified memory,
    /// its default watermarks; the settings string does not apply.
    MpsHeap,
}

impl AllocatorKind {
    /// `caching` or `mps-heap` (the report's `allocator`).
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Caching => "caching",
            AllocatorKind::MpsHeap => "mps-heap",
        }
    }
}

/// A named allocator setting: a `PYTORCH_CUDA_ALLOC_CONF`-style string, or
/// another allocator ([`AllocatorKind`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplaySetting {
    /// Name shown in reports (`pytorch`, `max-split-128`, ...).
    pub name: String,
    /// The settings string ("" = PyTorch's defaults).
    pub config: String,
    /// The allocator replayed.
    pub allocator: AllocatorKind,
}

impl ReplaySetting {
    /// A setting of the caching allocator with this name and settings string.
    pub fn new(name: impl Into<String>, config: impl Into<String>) -> Self {
        ReplaySetting {
            name: name.into(),
            config: config.into(),
            allocator: AllocatorKind::Caching,
        }
    }

    /// The MPS heap allocator, named `mps-heap`.
    pub fn mps_heap() -> Self {
        ReplaySetting {
            allocator: AllocatorKind::MpsHeap,
            ..ReplaySetting::new("mps-heap", "")
        }
    }

    /// A setting named after its settings string (`pytorch` when empty).
    pub fn from_config(config: &str) -> Self {
        let config = config.trim();
        let name = if config.is_empty() { "pytorch" } else { config };
        ReplaySetting::new(name, config)
    }

    /// Read `NAME=CONF` (or a bare `CONF`, named after itself), checking
    /// that the settings string parses.
    pub fn parse(s: &str) -> Result<Self, ReplayError> {
        let setting = match s.split_once('=') {
            Some((name, conf)) => {
                let name = name.trim();
                if name.is_empty() {
                    return Err(ReplayError::Config {
                        setting: s.to_string(),
                        config: conf.trim().to_string(),
                        message: "the setting has no name (write NAME=CONF)".into(),
                    });
                }
                ReplaySetting::new(name, conf.trim())
            }
            None => ReplaySetting::from_config(s),
        };
        setting.allocator_config()?;
        Ok(setting)
    }

    /// The default comparison: `pytorch` (PyTorch's defaults), `expandable`
    /// (`expandable_segments:True`), `reservoir` (`policy:reservoir`, the
    /// policy that keeps peak reserved near peak live), `max-split-128`
    /// (`max_split_size_mb:128`), `roundup-4` (`roundup_power2_divisions:4`)
    /// and `gc-0.8`
    /// (`garbage_collection_threshold:0.8,per_process_memory_fraction:0.95`):
    /// the same policies `reservoir replay` compares on a recorded trace.
    pub fn defaults() -> Vec<ReplaySetting> {
        vec![
            ReplaySetting::new("pytorch", ""),
            ReplaySetting::new("expandable", "expandable_segments:True"),
            ReplaySetting::new("reservoir", "policy:reservoir"),
            ReplaySetting::new("max-split-128", "max_split_size_mb:128"),
            ReplaySetting::new("roundup-4", "roundup_power2_divisions:4"),
            ReplaySetting::new(
                "gc-0.8",
                "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
            ),
        ]
    }

    /// The typed settings.
    pub fn allocator_config(&self) -> Result<AllocatorConfig, ReplayError> {
        if self.config.trim().is_empty() {
            return Ok(AllocatorConfig::default());
        }
        AllocatorConfig::parse_with_policy(&self.config).map_err(|e| ReplayError::Config {
            setting: self.name.clone(),
            config: self.config.clone(),
            message: e.to_string(),
        })
    }
}

/// How to replay, besides the allocator setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Device capacity in bytes. Default [`DEFAULT_CAPACITY`] (80 GiB).
    pub capacity: u64,
    /// Most points in [`ReplayReport::samples`] (at least 2). Default 2000.
    pub max_samples: usize,
    /// Time one allocator call in this many, chosen at random (a fixed
    /// seed, so which calls are timed is the same in every run); 1 times
    /// every call. Reading the clock costs about as much as a cached
    /// allocation, so timing every call would slow the replay down by
    /// half. Default 8; traces of fewer than 100 000 ops are always timed
    /// in full, except replays from a [`StartState`] (recorded traces,
    /// where replay speed matters more than exact quantiles).
    pub time_one_in: u32,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            capacity: DEFAULT_CAPACITY,
            max_samples: 2000,
            time_one_in: 8,
        }
    }
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The settings string of a setting does not parse.
    #[error("setting {setting:?}: invalid allocator settings {config:?}: {message}")]
    Config {
        /// The setting's name.
        setting: String,
        /// Its settings string.
        config: String,
        /// The parser's complaint.
        message: String,
    },
    /// The trace does something the oracle refuses.
    #[error("op {op} (line {line}): {message}")]
    Trace {
        /// Op index.
        op: usize,
        /// Source line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The allocator failed other than by running out of memory.
    #[error("op {op} (line {line}): allocator error: {source}")]
    Allocator {
        /// Op index.
        op: usize,
        /// Source line.
        line: usize,
        /// The error.
        source: AllocError,
    },
    /// The start state could not be laid into the allocator.
    #[error("seeding segment {segment} of the start state: {source}")]
    Seed {
        /// Index of the segment in [`StartState::segments`] (then
        /// [`StartState::expandable`], numbered on after them).
        segment: usize,
        /// The error.
        source: SeedError,
    },
    /// The device capacity asked for is more than the simulated device
    /// can have ([`capacity::MAX_CAPACITY`], 16 TiB).
    #[error(
        "a device of {capacity} bytes cannot be simulated: at most {} bytes (16 TiB)",
        capacity::MAX_CAPACITY
    )]
    Capacity {
        /// The capacity asked for.
        capacity: u64,
    },
    /// The simulated device refused a stream operation.
    #[error("op {op} (line {line}): device error: {source}")]
    Device {
        /// Op index.
        op: usize,
        /// Source line.
        line: usize,
        /// The error.
        source: BackendError,
    },
}

/// What the allocator holds before the first op of a trace that starts
/// mid-run (a recorded snapshot's trace, see [`snapshot`]), and how the
/// device behaves to reproduce a recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments to seed, in increasing address order: each with the
    /// address the device should give it and the trace id of each of its
    /// allocated blocks (parallel to `SeededSegment::blocks`).
    pub segments: Vec<(u64, SeededSegment, Vec<AllocId>)>,
    /// Expandable segments to seed after `segments`, in increasing address
    /// order: each with the base address its reservation should get and the
    /// trace id of each allocated block (parallel to
    /// `SeededExpandable::blocks`).
    pub expandable: Vec<(u64, SeededExpandable, Vec<AllocId>)>,
    /// Addresses the device hands out for the trace's new segments, in
    /// order, after the seeded ones (see [`AddressPolicy::Scripted`]).
    pub scripted_addresses: Vec<u64>,
    /// Stream names are numbers: use them as the [`StreamId`]s (recorded
    /// `cudaStream_t` values) instead of numbering streams in first-use
    /// order. The order of streams then matches the recording (trap 2 of
    /// the replay-fidelity notes).
    pub literal_streams: bool,
    /// Log the device's calls and each allocation's address, for a fidelity
    /// report ([`Replay::segment_calls`], [`Replay::placements`]).
    pub record_placements: bool,
    /// Break best-fit ties by address, as PyTorch's source does and
    /// recorded traces show (see
    /// [`Seeder::rank_segments_by_address`](reservoir::caching::Seeder::rank_segments_by_address)).
    pub address_order: bool,
}

impl StartState {
    /// Every allocated block it seeds, those of `segments` first, then those
    /// of `expandable`: its segment's base address and stream, the block,
    /// and its trace id.
    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, StreamId, &SeededBlock, AllocId)> {
        let plain = self
            .segments
            .iter()
            .map(|(base, s, ids)| (*base, s.stream, &s.blocks, ids));
        let expandable = self
            .expandable
            .iter()
            .map(|(base, x, ids)| (*base, x.stream, &x.blocks, ids));
        plain
            .chain(expandable)
            .flat_map(|(base, stream, blocks, ids)| {
                blocks
                    .iter()
                    .zip(ids)
                    .map(move |(b, &id)| (base, stream, b, id))
            })
    }
}

/// Stream names to [`StreamId`]s: the one place where that mapping lives.
#[derive(Clone, Debug, Default)]
pub struct StreamTable {
    ids: FxHashMap<String, StreamId>,
    order: Vec<(String, StreamId)>,
    literal: bool,
}

impl StreamTable {
    /// An empty table.
    pub fn new() -> Self {
        StreamTable::default()
    }

    /// An empty table that maps names that are numbers to those numbers
    /// (other names are numbered as [`resolve`](Self::resolve) says, from
    /// `1 << 63` on so they cannot collide).
    pub fn literal() -> Self {
        StreamTable {
            literal: true,
            ..StreamTable::default()
        }
    }

    /// The id of `name`: [`StreamId::DEFAULT`] for `0` and `default`, else the
    /// id given at its first use, numbered 1, 2, ... in first-use order.
    /// The second value is true when `name` was not known before.
    pub fn resolve(&mut self, name: &StreamName) -> (StreamId, bool) {
        if name.is_default() {
            return (StreamId::DEFAULT, false);
        }
        if let Some(&id) = self.ids.get(name.as_str()) {
            return (id, false);
        }
        let id = match name.as_str().parse::<u64>() {
            Ok(v) if self.literal => StreamId(v),
            _ if self.literal => StreamId((1 << 63) + self.order.len() as u64 + 1),
            _ => StreamId(self.order.len() as u64 + 1),
        };
        self.ids.insert(name.as_str().to_string(), id);
        self.order.push((name.as_str().to_string(), id));
        (id, true)
    }

    /// The id of a known name (`None` if it was never resolved; the default
    /// stream is always known).
    pub fn get(&self, name: &StreamName) -> Option<StreamId> {
        if name.is_default() {
            return Some(StreamId::DEFAULT);
        }
        self.ids.get(name.as_str()).copied()
    }

    /// The named streams in first-use order, with their ids.
    pub fn streams(&self) -> &[(String, StreamId)] {
        &self.order
    }
}

/// Block visits the peak scans may spend before any op has run.
const SCAN_BUDGET_START: u64 = 1 << 20;

/// Block visits the peak scans earn per op that changed the allocator.
const SCAN_CREDIT_PER_OP: u64 = 64;

/// Downsamples (op, allocated, reserved) points: per bucket of ops, the
/// points of lowest and highest allocated bytes, in op order (the earliest
/// of equal points).
#[derive(Debug)]
struct Sampler {
    bucket: usize,
    /// The first op past the open bucket (0 before the first point, so the
    /// first point opens a bucket).
    end: usize,
    /// The open bucket's lowest and highest points (meaningful when `open`).
    lo: Sample,
    hi: Sample,
    open: bool,
    out: Vec<Sample>,
}

impl Sampler {
    fn new(ops: usize, max_samples: usize) -> Self {
        let buckets = (max_samples / 2).max(1);
        let bucket = ops.div_ceil(buckets).max(1);
        let none = Sample {
            op: 0,
            allocated: 0,
            reserved: 0,
        };
        Sampler {
            bucket,
            end: 0,
            lo: none,
            hi: none,
            open: false,
            out: Vec::with_capacity(max_samples.min(2 * ops + 2)),
        }
    }

    /// Called after every op that may change the bytes: two comparisons
    /// unless `s` opens a new bucket.
    #[inline]
    fn push(&mut self, s: Sample) {
        if s.op as usize >= self.end {
            self.open_bucket(s);
            return;
        }
        if s.allocated < self.lo.allocated {
            self.lo = s;
        }
        if s.allocated > self.hi.allocated {
            self.hi = s;
        }
    }

    /// Close the open bucket and open the one of `s`, with `s` as its only
    /// point.
    #[cold]
    #[inline(never)]
    fn open_bucket(&mut self, s: Sample) {
        self.flush();
        self.end = (s.op as usize / self.bucket + 1) * self.bucket;
        self.lo = s;
        self.hi = s;
        self.open = true;
    }

    /// The two extremes of the open bucket, in op order.
    fn pending(&self) -> impl Iterator<Item = Sample> {
        let (a, b) = match (self.open, self.lo, self.hi) {
            (false, _, _) => (None, None),
            (true, a, b) if a.op == b.op => (Some(a), None),
            (true, a, b) if b.op < a.op => (Some(b), Some(a)),
            (true, a, b) => (Some(a), Some(b)),
        };
        a.into_iter().chain(b)
    }

    fn flush(&mut self) {
        let (a, b) = {
            let mut p = self.pending();
            (p.next(), p.next())
        };
        self.out.extend(a.into_iter().chain(b));
        self.open = false;
    }

    /// Every point so far, the open bucket included.
    fn snapshot(&self) -> Vec<Sample> {
        let mut v = Vec::with_capacity(self.out.len() + 2);
        v.extend_from_slice(&self.out);
        v.extend(self.pending());
        v
    }
}

/// Wall time of allocator calls: a random subset of the calls is timed into
/// a log-linear histogram (8 sub-buckets per power of two, so quantiles are
/// within 12.5 %). The gap to the next timed call is drawn at random (1 to
/// `2 * one_in - 1` calls, so one call in `one_in` on average, from a fixed
/// seed), so an untimed call costs a decrement.
#[derive(Debug)]
struct CallTimer {
    one_in: u64,
    rng: u64,
    /// Calls left up to and including the next timed one.
    until_timed: u64,
    calls: u64,
    timed: u64,
    total: Duration,
    histogram: Vec<u64>,
}

impl CallTimer {
    const BUCKETS: usize = 16 + 60 * 8;

    fn new(one_in: u32) -> Self {
        let mut t = CallTimer {
            one_in: u64::from(one_in.max(1)),
            rng: 0x9e37_79b9_7f4a_7c15,
            until_timed: 0,
            calls: 0,
            timed: 0,
            total: Duration::ZERO,
            histogram: vec![0; Self::BUCKETS],
        };
        t.until_timed = t.next_gap();
        t
    }

    /// Calls from one timed call to the next: uniform in
    /// `1..=2 * one_in - 1` (always 1 when every call is timed).
    fn next_gap(&mut self) -> u64 {
        if self.one_in == 1 {
            return 1;
        }
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        1 + self.rng % (2 * self.one_in - 1)
    }

    /// Start a call: the clock reading if this call is timed.
    #[inline]
    fn start(&mut self) -> Option<Instant> {
        self.calls += 1;
        self.until_timed -= 1;
        if self.until_timed != 0 {
            return None;
        }
        self.until_timed = self.next_gap();
        Some(Instant::now())
    }

    #[inline]
    fn stop(&mut self, start: Option<Instant>) {
        if let Some(t0) = start {
            let d = t0.elapsed();
            self.timed += 1;
            self.total += d;
            let ns = d.as_nanos().min(u64::MAX as u128) as u64;
            self.histogram[Self::bucket(ns)] += 1;
        }
    }

    fn bucket(ns: u64) -> usize {
        if ns < 16 {
            return ns as usize;
        }
        let e = 63 - ns.leading_zeros() as usize; // >= 4
        let sub = ((ns >> (e - 3)) & 7) as usize;
        (16 + (e - 4) * 8 + sub).min(Self::BUCKETS - 1)
    }

    /// The middle of bucket `i`.
    fn bucket_value(i: usize) -> f64 {
        if i < 16 {
            return i as f64;
        }
        let e = (i - 16) / 8 + 4;
        let sub = ((i - 16) % 8) as u64;
        let lo = (8 + sub) << (e - 3);
        let width = 1u64 << (e - 3);
        lo as f64 + width as f64 / 2.0
    }

    fn quantile(&self, q: f64) -> f64 {
        if self.timed == 0 {
            return 0.0;
        }
        let rank = ((self.timed as f64 * q).ceil() as u64).clamp(1, self.timed);
        let mut seen = 0;
        for (i, &c) in self.histogram.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::bucket_value(i);
            }
        }
        0.0
    }

    fn mean_ns(&self) -> f64 {
        if self.timed == 0 {
            0.0
        } else {
            self.total.as_nanos() as f64 / self.timed as f64
        }
    }
}

/// A replay in progress: the allocator, the device and the measurements.
///
/// [`replay`] runs one to the end; use this type to step through a trace or
/// to inspect the allocator afterwards.
pub struct Replay<'t, T: ReplayTarget = CachingAllocator<SimDevice>> {
    trace: &'t Trace,
    start: Option<&'t StartState>,
    /// Driver time spent seeding, not reported.
    seed_driver_time_ns: u64,
    /// Address returned by each allocation op (0 when it failed), when
    /// [`StartState::record_placements`] is set.
    placements: Option<Vec<u64>>,
    setting: ReplaySetting,
    capacity: u64,
    alloc: T,
    streams: StreamTable,
    current: StreamId,
    live: LiveIds,
    next: usize,
    alloc_ops: u64,
    free_ops: u64,
    timer: CallTimer,
    ooms: u64,
    first_oom: Option<OomRecord>,
    options: ReplayOptions,
    peak_reserved_seen: u64,
    /// The state at the latest peak, if it was scanned.
    peak: Option<PeakState>,
    /// The latest peak (op, allocated, reserved) when it was not scanned.
    peak_pending: Option<(usize, u64, u64)>,
    /// Whether to look at peaks at all (not in a re-run).
    track_peak: bool,
    /// Block visits the peak scans may still spend (see `observe`).
    scan_budget: u64,
    scan_credit_per_op: u64,
    last_scan_cost: u64,
    sampler: Sampler,
}

impl<T: ReplayTarget> std::fmt::Debug for Replay<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("setting", &self.setting)
            .field("capacity", &self.capacity)
            .field("next_op", &self.next)
            .field("ops", &self.trace.ops.len())
            .finish_non_exhaustive()
    }
}

/// The id of a stream name in `streams`; a new name becomes a stream of the
/// simulated device.
fn device_stream(
    streams: &mut StreamTable,
    alloc: &impl ReplayTarget,
    name: &StreamName,
) -> StreamId {
    let (id, new) = streams.resolve(name);
    if new {
        alloc.device().register_stream(id);
    }
    id
}

impl<'t> Replay<'t> {
    /// Prepare to replay `trace` with `setting` on a fresh simulated device.
    pub fn new(
        trace: &'t Trace,
        setting: &ReplaySetting,
        options: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
        Self::build(trace, None, setting, options)
    }

    /// Prepare to replay `trace` from `start`: the device hands out the
    /// scripted addresses, the start state's segments are seeded (and not
    /// counted: stats, peaks and driver counters start from the seeded
    /// state), then the trace's ops run as usual.
    pub fn with_start(
        trace: &'t Trace,
        start: &'t StartState,
        setting: &ReplaySetting,
        options: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
        Self::build(trace, Some(start), setting, options)
    }
}

impl<'t, T: ReplayTarget> Replay<'t, T> {
    /// Prepare to replay `trace` through the target `T` (a fresh one on a
    /// fresh simulated device), from `start` when given (see
    /// [`Replay::with_start`]).
    pub fn build(
        trace: &'t Trace,
        start: Option<&'t StartState>,
        setting: &ReplaySetting,
        options: &ReplayOptions,
    ) -> Result<Self, ReplayError> {
        if options.capacity > capacity::MAX_CAPACITY {
            return Err(ReplayError::Capacity {
                capacity: options.capacity,
            });
        }
        let config = setting.allocator_config()?;
        let address_policy = match start {
            Some(st) => AddressPolicy::Scripted(
                st.segments
                    .iter()
                    .map(|s| s.0)
                    .chain(st.expandable.iter().map(|s| s.0))
                    .chain(st.scripted_addresses.iter().copied())
                    .collect(),
            ),
            None => AddressPolicy::default(),
        };
        let device = SimDevice::new(SimConfig {
            capacity: options.capacity,
            hold_semantics: HoldSemantics::EnqueuedWork,
            address_policy,
            ..SimConfig::default()
        });
        let alloc = T::on_device(device, config);
        let seeded = start.map_or(0, |st| {
            let ids = |v: &[AllocId]| v.len() as u64;
            st.segments.iter().map(|s| ids(&s.2)).sum::<u64>()
                + st.expandable.iter().map(|s| ids(&s.2)).sum::<u64>()
        });
        let mut live = LiveIds::with_dense_limit(trace.ops.len() as u64 + seeded + 1);
        let mut streams = if start.is_some_and(|s| s.literal_streams) {
            StreamTable::literal()
        } else {
            StreamTable::new()
        };
        let mut seed_driver_time_ns = 0;
        if let Some(st) = start {
            alloc.rank_segments_by_address(st.address_order);
            // Name each segment's stream once per run of segments on it.
            let mut named = None;
            let mut name_stream = |streams: &mut StreamTable, stream: StreamId| {
                if named != Some(stream) {
                    device_stream(streams, &alloc, &StreamName::new(stream.0.to_string()));
                    named = Some(stream);
                }
            };
            for (k, (_, seg, ids)) in st.segments.iter().enumerate() {
                name_stream(&mut streams, seg.stream);
                let ptrs = alloc
                    .seed_segment_blocks(seg)
                    .map_err(|source| ReplayError::Seed { segment: k, source })?;
                for (&id, ptr) in ids.iter().zip(ptrs) {
                    live.set(id, IdState::Live(ptr));
                }
            }
            for (k, (_, seg, ids)) in st.expandable.iter().enumerate() {
                name_stream(&mut streams, seg.stream);
                let ptrs =
                    alloc
                        .seed_expandable_blocks(seg)
                        .map_err(|source| ReplayError::Seed {
                            segment: st.segments.len() + k,
                            source,
                        })?;
                for (&id, ptr) in ids.iter().zip(ptrs) {
                    live.set(id, IdState::Live(ptr));
                }
            }
            alloc.reset_accumulated_stats();
            alloc.reset_peak_stats();
            seed_driver_time_ns = alloc.device().counters().driver_time_ns;
            if st.record_placements {
                alloc.device().set_call_log(true);
            }
        }
        Ok(Replay {
            trace,
            start,
            seed_driver_time_ns,
            placements: start
                .filter(|s| s.record_placements)
                .map(|_| Vec::with_capacity(trace.ops.len())),
            setting: setting.clone(),
            capacity: options.capacity,
            alloc,
            streams,
            current: StreamId::DEFAULT,
            live,
            next: 0,
            alloc_ops: 0,
            free_ops: 0,
            timer: CallTimer::new(if trace.ops.len() < 100_000 && start.is_none() {
                1
            } else {
                options.time_one_in
            }),
            ooms: 0,
            first_oom: None,
            options: options.clone(),
            peak_reserved_seen: 0,
            peak: None,
            peak_pending: None,
            track_peak: true,
            scan_budget: SCAN_BUDGET_START,
            scan_credit_per_op: SCAN_CREDIT_PER_OP,
            last_scan_cost: 0,
            sampler: Sampler::new(trace.ops.len(), options.max_samples.max(2)),
        })
    }

    /// The allocator being driven.
    pub fn allocator(&self) -> &T {
        &self.alloc
    }

    /// The simulated device.
    pub fn device(&self) -> &SimDevice {
        self.alloc.device()
    }

    /// The address each allocation op returned so far (0 for a failed one),
    /// when the start state asked for it.
    pub fn placements(&self) -> Option<&[u64]> {
        self.placements.as_deref()
    }

    /// The device calls made since seeding (allocations, frees, maps and
    /// unmaps), when the start state asked for them.
    pub fn segment_calls(&self) -> Vec<reservoir::sim::DeviceCall> {
        self.alloc.device().call_log()
    }

    /// The stream names seen so far and their ids.
    pub fn streams(&self) -> &StreamTable {
        &self.streams
    }

    /// Index of the next op to run (the trace's length when finished).
    pub fn position(&self) -> usize {
        self.next
    }

    /// True when every op has run.
    pub fn is_done(&self) -> bool {
        self.next >= self.trace.ops.len()
    }

    /// The device pointer of a live trace id (null for a zero-byte one).
    pub fn pointer(&self, id: AllocId) -> Option<DevicePtr> {
        self.live.pointer(id)
    }

    /// Run every remaining op.
    pub fn run(&mut self) -> Result<(), ReplayError> {
        self.run_with_progress(&mut |_| {})
    }

    /// Run every remaining op, calling `progress` with the number of ops done
    /// every 65 536 ops and at the end.
    pub fn run_with_progress(
        &mut self,
        progress: &mut dyn FnMut(usize),
    ) -> Result<(), ReplayError> {
        const CHUNK: usize = 1 << 16;
        while !self.is_done() {
            let end = (self.next + CHUNK).min(self.trace.ops.len());
            while self.next < end {
                self.step_inner()?;
            }
            progress(self.next);
        }
        Ok(())
    }

    /// Run the next op. Returns false when there was none.
    pub fn step(&mut self) -> Result<bool, ReplayError> {
        if self.is_done() {
            return Ok(false);
        }
        self.step_inner()?;
        Ok(true)
    }

    fn line(&self, op: usize) -> usize {
        self.trace.lines.get(op).copied().unwrap_or(op + 1)
    }

    fn trace_error(&self, op: usize, message: String) -> ReplayError {
        ReplayError::Trace {
            op,
            line: self.line(op),
            message,
        }
    }

    fn alloc_error(&self, op: usize, source: AllocError) -> ReplayError {
        ReplayError::Allocator {
            op,
            line: self.line(op),
            source,
        }
    }

    fn device_error(&self, op: usize, source: BackendError) -> ReplayError {
        ReplayError::Device {
            op,
            line: self.line(op),
            source,
        }
    }

    /// The id of a stream name; a new name becomes a stream of the device.
    fn stream(&mut self, name: &StreamName) -> StreamId {
        device_stream(&mut self.streams, &self.alloc, name)
    }

    #[inline(always)]
    fn step_inner(&mut self) -> Result<(), ReplayError> {
        let i = self.next;
        let trace = self.trace;
        let op = &trace.ops[i];
        self.next += 1;
        match op {
            Op::Alloc { id, bytes, stream } => {
                if let Some(IdState::Live(_)) = self.live.get(*id) {
                    return Err(self.trace_error(i, format!("id {id} is already live")));
                }
                let s = match stream {
                    Some(name) => self.stream(name),
                    None => self.current,
                };
                self.alloc_ops += 1;
                let t0 = self.timer.start();
                let r = self.alloc.alloc(*bytes, s);
                self.timer.stop(t0);
                if let Some(p) = self.placements.as_mut() {
                    p.push(r.as_ref().map_or(0, |ptr| ptr.0));
                }
                match r {
                    Ok(ptr) => self.live.set(*id, IdState::Live(ptr)),
                    Err(AllocError::OutOfMemory(e)) => self.note_oom(i, *id, *bytes, s, e.message),
                    // The device ran out of memory where PyTorch, and so the
                    // allocator, does not turn that into its own
                    // out-of-memory error: the address range of a new
                    // expandable segment cannot be reserved (pages of
                    // `large_segment_size_mb:1000000000` are larger than
                    // the address space; PyTorch checks
                    // `cuMemAddressReserve` with `C10_CUDA_DRIVER_CHECK`, a
                    // "CUDA driver error: out of memory"). A page the device
                    // cannot map is the allocator's own OOM above. The
                    // program cannot run under this setting all the same,
                    // which its report says (with the device's words),
                    // rather than failing the replay of every setting.
                    Err(AllocError::Backend(e)) if e.is_retryable() => {
                        self.note_oom(i, *id, *bytes, s, format!("device error: {e}"))
                    }
                    Err(e) => return Err(self.alloc_error(i, e)),
                }
                self.observe(i);
            }
            Op::Free { id } => match self.live.take(*id) {
                Some(IdState::Live(ptr)) => {
                    self.free_ops += 1;
                    let t0 = self.timer.start();
                    let r = self.alloc.free(ptr);
                    self.timer.stop(t0);
                    r.map_err(|e| self.alloc_error(i, e))?;
                    self.observe(i);
                }
                Some(IdState::Failed) => {}
                None => {
                    return Err(self.trace_error(i, format!("free of id {id}, which is not live")));
                }
            },
            Op::EmptyCache => {
                let t0 = self.timer.start();
                let r = self.alloc.empty_cache();
                self.timer.stop(t0);
                r.map_err(|e| self.alloc_error(i, e))?;
                self.observe(i);
            }
            Op::SetStream { stream } => {
                self.current = self.stream(stream);
            }
            Op::RecordStream { id, stream } => match self.live.get(*id) {
                Some(IdState::Live(ptr)) => {
                    let s = self.stream(stream);
                    let t0 = self.timer.start();
                    let r = self.alloc.record_stream(ptr, s);
                    self.timer.stop(t0);
                    r.map_err(|e| self.alloc_error(i, e))?;
                }
                Some(IdState::Failed) => {}
                None => {
                    return Err(
                        self.trace_error(i, format!("record_stream of id {id}, which is not live"))
                    );
                }
            },
            Op::Kernel { stream, ids } => {
                let s = self.stream(stream);
                let n = ids
                    .iter()
                    .filter(|&&x| self.live.pointer(x).is_some())
                    .count()
                    .max(1);
                for _ in 0..n {
                    self.device()
                        .enqueue_work(s)
                        .map_err(|e| self.device_error(i, e))?;
                }
            }
            Op::Hold { stream } => {
                let s = self.stream(stream);
                self.device()
                    .hold_stream(s)
                    .map_err(|e| self.device_error(i, e))?;
            }
            Op::Release { stream } => {
                let s = self.stream(stream);
                self.device()
                    .release_stream(s)
                    .map_err(|e| self.device_error(i, e))?;
            }
            Op::Sync { stream: None } => self.device().synchronize_all(),
            Op::Sync {
                stream: Some(stream),
            } => {
                let s = self.stream(stream);
                self.device()
                    .synchronize_stream(s)
                    .map_err(|e| self.device_error(i, e))?;
            }
            Op::Wait { waiter, waited } => {
                let a = self.stream(waiter);
                let b = self.stream(waited);
                let dev = self.alloc.device();
                let r = dev.record_event(b).and_then(|ev| {
                    let w = dev.wait_event(a, ev);
                    let d = dev.destroy_event(ev);
                    w.and(d)
                });
                r.map_err(|e| self.device_error(i, e))?;
            }
        }
        Ok(())
    }

    /// Allocation op `i` of `id` (`bytes` on `stream`) ran out of memory:
    /// count it, remember the first, and ignore later frees of `id`.
    #[cold]
    fn note_oom(&mut self, i: usize, id: AllocId, bytes: u64, stream: StreamId, message: String) {
        self.ooms += 1;
        self.live.set(id, IdState::Failed);
        if self.first_oom.is_none() {
            self.first_oom = Some(OomRecord {
                op: i as u64,
                line: self.line(i) as u64,
                id,
                bytes,
                stream: stream.0,
                message,
            });
        }
    }

    /// Note the state after op `i`, which may have changed the allocator's
    /// bytes.
    ///
    /// Each new peak of reserved bytes is scanned (segments and blocks) for
    /// the state at the peak. Scans cost as much as the allocator has
    /// blocks, and a growing trace makes a new peak with every segment, so
    /// they draw on a budget that grows with the ops replayed: when it runs
    /// short, the peak is only noted, and [`report`](Self::report) replays
    /// the trace again up to the last unscanned peak to scan it there (the
    /// replay is deterministic). The numbers are exact either way; the cost
    /// stays linear in the trace.
    #[inline(always)]
    fn observe(&mut self, i: usize) {
        let (allocated, reserved) = self.alloc.allocated_and_reserved();
        self.scan_budget = self.scan_budget.saturating_add(self.scan_credit_per_op);
        if reserved > self.peak_reserved_seen && self.track_peak {
            self.peak_reserved_seen = reserved;
            if self.scan_budget >= self.last_scan_cost {
                let (state, cost) = self.peak_state(i, allocated, reserved);
                self.scan_budget -= cost.min(self.scan_budget);
                self.last_scan_cost = cost;
                self.peak = Some(state);
                self.peak_pending = None;
            } else {
                self.peak_pending = Some((i, allocated, reserved));
            }
        }
        self.sampler.push(Sample {
            op: i as u64,
            allocated,
            reserved,
        });
    }

    /// The state now (after op `op`), and what the scan cost (segments plus
    /// blocks visited).
    fn peak_state(&self, op: usize, allocated: u64, reserved: u64) -> (PeakState, u64) {
        let sum = self.alloc.layout_summary();
        let state = PeakState {
            op: op as u64,
            allocated,
            reserved,
            segments: sum.segments,
            free_blocks: sum.free_blocks,
            largest_free_block: sum.largest_free_block,
        };
        (state, sum.segments + sum.blocks)
    }

    /// The state at the last peak, replaying again up to it if it was not
    /// scanned.
    fn peak_report(&self) -> Option<PeakState> {
        let Some((op, allocated, reserved)) = self.peak_pending else {
            return self.peak.clone();
        };
        let rerun = || -> Result<PeakState, ReplayError> {
            let mut r = Self::build(self.trace, self.start, &self.setting, &self.options)?;
            r.track_peak = false;
            r.placements = None;
            r.alloc.device().set_call_log(false);
            while r.next <= op {
                r.step_inner()?;
            }
            Ok(r.peak_state(op, allocated, reserved).0)
        };
        match rerun() {
            Ok(state) => Some(state),
            Err(e) => {
                // Cannot happen: the same ops already ran without error.
                tracing::warn!("replaying again up to the peak failed: {e}");
                Some(PeakState {
                    op: op as u64,
                    allocated,
                    reserved,
                    segments: 0,
                    free_blocks: 0,
                    largest_free_block: 0,
                })
            }
        }
    }

    /// The report of what has run so far.
    pub fn report(&self) -> ReplayReport {
        let stats = self.alloc.stats();
        let peak_allocated = stats.allocated_bytes.all().peak.max(0) as u64;
        let peak_reserved = stats.reserved_bytes.all().peak.max(0) as u64;
        let fragmentation =
            (peak_allocated > 0).then(|| peak_reserved as f64 / peak_allocated as f64);
        let peak = self.peak_report();
        let counters = self.alloc.device().counters();
        let mean = self.timer.mean_ns();
        ReplayReport {
            setting: self.setting.name.clone(),
            config: self.setting.config.clone(),
            allocator: self.setting.allocator.name().into(),
            capacity: self.capacity,
            ops: self.next as u64,
            alloc_ops: self.alloc_ops,
            free_ops: self.free_ops,
            peak_allocated,
            peak_reserved,
            peak_live: stats.requested_bytes.all().peak.max(0) as u64,
            fragmentation,
            reserved_unallocated_at_peak: peak.as_ref().map_or(0, |p| p.reserved - p.allocated),
            largest_free_block_at_peak: peak.as_ref().map_or(0, |p| p.largest_free_block),
            peak,
            driver_allocs: stats.num_device_alloc.max(0) as u64,
            driver_frees: stats.num_device_free.max(0) as u64,
            ooms: self.ooms,
            first_oom: self.first_oom.clone(),
            driver_time_ns: counters
                .driver_time_ns
                .saturating_sub(self.seed_driver_time_ns),
            allocator_calls: self.timer.calls,
            allocator_timed_calls: self.timer.timed,
            allocator_time_ns: (mean * self.timer.calls as f64) as u64,
            allocator_ns_per_op: mean,
            allocator_ns_p50: self.timer.quantile(0.5),
            allocator_ns_p99: self.timer.quantile(0.99),
            streams: self
                .streams
                .streams()
                .iter()
                .map(|(n, id)| (n.clone(), id.0))
                .collect(),
            memory_stats: stats.to_flat(),
            samples: self.sampler.snapshot(),
        }
    }
}

/// Replay `trace` with one setting, to the end.
pub fn replay(
    trace: &Trace,
    setting: &ReplaySetting,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    run_setting(trace, None, setting, options, &mut |_| {})
}

/// Replay `trace` (from `start` when given) through the allocator of
/// `setting`, to the end; `progress` gets the number of ops done.
pub fn run_setting(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    fn run<T: ReplayTarget>(
        mut r: Replay<'_, T>,
        progress: &mut dyn FnMut(usize),
    ) -> Result<ReplayReport, ReplayError> {
        r.run_with_progress(progress)?;
        Ok(r.report())
    }
    match setting.allocator {
        AllocatorKind::Caching => run(
            Replay::<CachingAllocator<SimDevice>>::build(trace, start, setting, options)?,
            progress,
        ),
        AllocatorKind::MpsHeap => run(
            Replay::<HeapAllocator<SimDevice>>::build(trace, start, setting, options)?,
            progress,
        ),
    }
}

/// The segments of the allocator of `setting` after replaying `trace` (from
/// `start` when given) up to op `op` included (to the end when `None`):
/// the segment map at a peak.
pub fn segments_at(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    op: Option<u64>,
) -> Result<Vec<reservoir::observe::snapshot::Segment>, ReplayError> {
    fn run<T: ReplayTarget>(
        mut r: Replay<'_, T>,
        op: Option<u64>,
    ) -> Result<Vec<reservoir::observe::snapshot::Segment>, ReplayError> {
        while !matches!(op, Some(op) if r.position() as u64 > op) && r.step()? {}
        Ok(r.allocator().segments())
    }
    match setting.allocator {
        AllocatorKind::Caching => run(
            Replay::<CachingAllocator<SimDevice>>::build(trace, start, setting, options)?,
            op,
        ),
        AllocatorKind::MpsHeap => run(
            Replay::<HeapAllocator<SimDevice>>::build(trace, start, setting, options)?,
            op,
        ),
    }
}

/// Replay `trace` with each setting in turn; `progress` gets the number of
/// ops done over all settings so far (out of `trace.ops.len() * settings.len()`).
pub fn replay_all(
    trace: &Trace,
    settings: &[ReplaySetting],
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Vec<ReplayReport>, ReplayError> {
    let mut out = Vec::with_capacity(settings.len());
    for (k, s) in settings.iter().enumerate() {
        let base = k * trace.ops.len();
        out.push(run_setting(trace, None, s, options, &mut |n| {
            progress(base + n)
        })?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampler_keeps_extremes_and_bounds() {
        let mut s = Sampler::new(100_000, 100);
        for i in 0..100_000u64 {
            let allocated = if i == 31_337 { 1_000_000 } else { i % 97 };
            s.push(Sample {
                op: i,
                allocated,
                reserved: 0,
            });
        }
        let out = s.snapshot();
        assert!(out.len() <= 100, "{}", out.len());
        assert!(out.iter().any(|p| p.allocated == 1_000_000));
        assert!(out.windows(2).all(|w| w[0].op < w[1].op));
    }

    #[test]
    fn call_timer_histogram() {
        for ns in [0u64, 5, 15, 16, 17, 100, 1000, 123_456, u64::MAX / 2] {
            let b = CallTimer::bucket(ns);
            let mid = CallTimer::bucket_value(b);
            assert!(
                (mid - ns as f64).abs() <= ns as f64 / 8.0 + 1.0,
                "{ns} -> {b} -> {mid}"
            );
        }
        let mut t = CallTimer::new(1);
        for ns in 1..=100u64 {
            t.histogram[CallTimer::bucket(ns * 10)] += 1;
            t.timed += 1;
        }
        let p50 = t.quantile(0.5);
        assert!((450.0..=560.0).contains(&p50), "{p50}");
        let p99 = t.quantile(0.99);
        assert!((900.0..=1050.0).contains(&p99), "{p99}");
        // one in 8, at random
        let mut s = CallTimer::new(8);
        let timed = (0..80_000).filter(|_| s.start().is_some()).count();
        assert!((9_000..11_000).contains(&timed), "{timed}");
    }

    #[test]
    fn peaks_found_by_a_second_replay_are_the_same() {
        let trace = crate::workload::generate("gpt-train:steps=2").unwrap();
        for setting in ReplaySetting::defaults() {
            let options = ReplayOptions::default();
            let mut scanned = Replay::new(&trace, &setting, &options).unwrap();
            scanned.run().unwrap();
            assert!(scanned.peak_pending.is_none());
            let mut starved = Replay::new(&trace, &setting, &options).unwrap();
            starved.scan_budget = 0;
            starved.scan_credit_per_op = 0;
            starved.last_scan_cost = 1;
            starved.run().unwrap();
            assert!(starved.peak.is_none() && starved.peak_pending.is_some());
            let (a, b) = (scanned.report(), starved.report());
            assert_eq!(a.peak, b.peak, "{}", setting.name);
            assert!(a.largest_free_block_at_peak > 0);
        }
    }

    #[test]
    fn stream_table_numbers_in_first_use_order() {
        let mut t = StreamTable::new();
        assert_eq!(
            t.resolve(&StreamName::new("default")),
            (StreamId::DEFAULT, false)
        );
        assert_eq!(t.resolve(&StreamName::new("b")), (StreamId(1), true));
        assert_eq!(t.resolve(&StreamName::new("a")), (StreamId(2), true));
        assert_eq!(t.resolve(&StreamName::new("b")), (StreamId(1), false));
        assert_eq!(t.resolve(&StreamName::new("0")), (StreamId::DEFAULT, false));
        assert_eq!(t.get(&StreamName::new("a")), Some(StreamId(2)));
        assert_eq!(t.get(&StreamName::new("c")), None);
    }
}
