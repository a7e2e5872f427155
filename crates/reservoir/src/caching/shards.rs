//! One lock per stream: [`StreamShards`], a caching allocator whose streams
//! do not wait on each other.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::device_reserved::DeviceReserved;
use super::{CachingAllocator, HistoryConfig, InvariantViolation};
use crate::backend::{Backend, DevicePtr, StreamId};
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::observe::snapshot::{Segment, Snapshot};
use crate::observe::trace::TraceEntry;
use crate::stats::DeviceStats;
use crate::sync::{thread_local, Mutex, OnceSlot, SlotRef};

/// Streams a [`StreamShards`] serves unless told otherwise.
pub const DEFAULT_MAX_STREAMS: usize = 64;

/// A [`StreamShards`] that cannot be built from its settings.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StreamShardsError {
    /// `per_process_memory_fraction` below 1.0 is not supported with one
    /// lock per stream.
    #[error(
        "per_process_memory_fraction {0} is not supported by StreamShards (the limit would be \
         shared by every stream's shard); use 1.0, or CachingAllocator for a per-process limit"
    )]
    MemoryFraction(f64),
    /// Room for no stream at all.
    #[error("max_streams is 0: StreamShards needs room for at least one stream")]
    NoStreams,
}

/// One stream's shard: a PyTorch-mode allocator serving only `stream`.
/// Aligned to 128 bytes (two cache lines, what adjacent-line prefetchers
/// pair) so that two shards share no cache line: each call writes its
/// shard's lock and statistics.
#[repr(align(128))]
struct Shard<B: Backend> {
    stream: StreamId,
    alloc: CachingAllocator<Arc<B>>,
}

/// A shard as its slot gives it out.
type ShardRef<'a, B> = SlotRef<'a, Box<Shard<B>>>;

#[cfg(not(feature = "loom"))]
thread_local! {
    /// The slot this thread allocated from last: where its frees look first.
    static LAST_SHARD: Cell<usize> = const { Cell::new(0) };
}

#[cfg(feature = "loom")]
thread_local! {
    /// The slot this thread allocated from last (loom's macro takes no `const`).
    static LAST_SHARD: Cell<usize> = Cell::new(0);
}

/// A caching allocator with one lock per stream: `Send + Sync`, share it
/// between threads behind an `Arc`.
///
///
/// PyTorch's allocator (and [`CachingAllocator`]) serialises every call of a
/// device behind one mutex, although its free pools are already per stream:
/// a segment serves one stream, and a free block is found only in its own
/// stream's pool (spec 1.6, best fit keyed by `(stream, size, address)`).
/// [`StreamShards`] gives each stream its own shard, a whole
/// [`CachingAllocator`] in PyTorch mode over the shared backend, created on
/// the stream's first allocation. Threads that allocate on different streams
/// then take different locks, and each shard does exactly what PyTorch does
/// for its stream's operations.
///
/// Where they differ from one `CachingAllocator` (the price of not
/// sharing a lock):
/// * **Out of memory** (spec 1.5, 1.9): PyTorch's last attempt releases
///   every stream's cached blocks. Here the shard runs its whole retry chain
///   first without reporting a failure; only then are the other shards'
///   caches emptied, one lock at a time (never two locks at once, so no lock
///   order can cycle), and the allocation retried with normal reporting.
///   Such a call counts two `num_alloc_retries` in its shard.
/// * **Statistics**: counters (`current`, `allocated`, `freed`, event
///   counts) are summed exactly over the shards. A device-wide peak of a
///   per-call gauge (allocated, active, requested bytes) would need a
///   shared write on every call, exactly the contention this type removes,
///   so `peak` is the **sum of the shards' peaks**: an upper bound of the
///   device-wide peak, exact with one stream, and exact whenever the
///   streams peak together. Reserved memory changes only on driver calls,
///   so `reserved_bytes` is also kept in one device-wide gauge (one atomic
///   update per driver call, none on cached allocations) and its peaks are
///   exact. [`StreamShards::shard_stats`] gives each shard's
///   own exact numbers. `num_sync_all_streams` counts one per shard for
///   each `empty_cache` (each shard waits for its own events).
/// * **Cross-stream frees** (`record_stream`): a block's shard is the stream
///   it was allocated on; its pending events are polled when that shard
///   allocates (PyTorch polls them on any stream's allocation). The block
///   can only be reused by its own stream, which polls first, so placements
///   are the same; only the moment its `free_completed` history entry is
///   written can be later, and until then the block still counts in
///   `active`, `active_bytes` and `requested_bytes`.
/// * **Per-process memory fraction** is refused at construction
///   ([`StreamShardsError::MemoryFraction`]): a limit shared by shards would
///   need a budget shared on the driver path, not built yet.
///
/// * **Not offered** (use [`ShardsSeeder::with_shard`] for one
///   stream, or [`CachingAllocator`]): private pools and checkpoints, IPC,
///   free-memory callbacks, out-of-memory observers, the callback registry,
///   run-time settings changes. They are device-wide in PyTorch and would
///   have to be handed to every shard.
///
/// Lookups on the hot path write no shared memory: the stream's slot is a
/// `OnceLock` read (one acquire load), and a free first tries the shard the
/// calling thread allocated from last (a thread-local hint) before the
/// others. A pointer no shard owns is [`AllocError::InvalidPointer`] and
/// changes nothing anywhere.
///
/// ```
/// use reservoir::caching::StreamShards;
/// use reservoir::sim::SimDevice;
/// use reservoir::{AllocatorConfig, Backend, StreamId};
///
/// let shards = StreamShards::new(SimDevice::default(), AllocatorConfig::default()).unwrap();
/// let s1 = shards.backend().create_stream().unwrap(); // StreamId(1)
/// let s2 = shards.backend().create_stream().unwrap();
/// let a = shards.raw_alloc(4096, s1).unwrap();
/// let b = shards.raw_alloc(4096, s2).unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| shards.raw_free(a).unwrap()); // a free from another thread
/// });
/// shards.raw_free(b).unwrap();
/// assert_eq!(shards.stats().allocated_bytes.all().current, 0);
/// assert_eq!(shards.streams(), [StreamId(1), StreamId(2)]);
/// shards.check_invariants().unwrap();
/// ```
pub struct StreamShards<B: Backend> {
    backend: Arc<B>,
    config: AllocatorConfig,
    device: i8,
    /// Open addressing by stream id: a stream's shard is in the first slot
    /// from `home_slot(stream)` that holds it, and no empty slot comes
    /// before it (slots are only ever filled, never emptied). Shards are
    /// boxed: an empty slot costs a pointer, not a whole allocator.
    slots: Box<[OnceSlot<Box<Shard<B>>>]>,
    /// What every shard is given, also those created later. Locked only to
    /// change it and to create a shard, until the new shard is published in
    /// its slot (lock order: this, then a shard's own lock).
    settings: Mutex<ShardSettings>,
    /// Reserved bytes of the whole device, exact (updated on driver calls).
    reserved: Arc<DeviceReserved>,
}

/// The run-time settings [`StreamShards`] hands to each shard.
#[derive(Clone)]
struct ShardSettings {
    /// See [`StreamShards::record_memory_history`].
    history: HistoryConfig,
    /// See [`ShardsSeeder::rank_segments_by_address`].
    rank_by_address: bool,
}

impl<B: Backend> StreamShards<B> {
    /// Shards for device 0, with room for [`DEFAULT_MAX_STREAMS`] streams.
    pub fn new(backend: B, config: AllocatorConfig) -> Result<Self, StreamShardsError> {
        Self::with_max_streams(backend, config, 0, DEFAULT_MAX_STREAMS)
    }

    /// Shards for device `device`, with room for `max_streams` streams.
    pub fn with_max_streams(
        backend: B,
        config: AllocatorConfig,
        device: i8,
        max_streams: usize,
    ) -> Result<Self, StreamShardsError> {
        if config.per_process_memory_fraction < 1.0 {
            return Err(StreamShardsError::MemoryFraction(
                config.per_process_memory_fraction,
            ));
        }
        if max_streams == 0 {
            return Err(StreamShardsError::NoStreams);
        }
        Ok(StreamShards {
            backend: Arc::new(backend),
            config,
            device,
            slots: (0..max_streams).map(|_| OnceSlot::new()).collect(),
            reserved: Arc::default(),
            settings: Mutex::new(ShardSettings {
                history: HistoryConfig::off(),
                rank_by_address: false,
            }),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The settings every shard uses.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Allocate `size` bytes for use on `stream`, from `stream`'s shard
    /// (created on first use). A zero-byte request returns
    /// [`DevicePtr::NULL`]. Out of memory empties the other shards' caches
    /// before failing (see [`StreamShards`]).
    pub fn raw_alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        let (slot, shard) = self.shard_for(stream)?;
        LAST_SHARD.with(|last| last.set(slot));
        match shard.alloc.raw_alloc_or_would_oom(size, stream)? {
            Some(ptr) => Ok(ptr),
            None => self.reclaim_and_retry(slot, shard, size, stream),
        }
    }

    /// The shard's chain failed: empty every other shard's cache, one lock
    /// at a time, then try again, reporting an out-of-memory failure.
    #[cold]
    fn reclaim_and_retry(
        &self,
        slot: usize,
        shard: ShardRef<'_, B>,
        size: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, AllocError> {
        self.release_caches(Some(slot))?;
        shard.alloc.raw_alloc(size, stream)
    }

    /// Free a pointer returned by [`raw_alloc`](Self::raw_alloc), from any
    /// thread. Freeing null is a no-op; a pointer no shard handed out (or
    /// already freed) is [`AllocError::InvalidPointer`] and changes nothing.
    pub fn raw_free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.on_owner(ptr, |alloc| alloc.raw_free(ptr))
    }

    /// Mark the block at `ptr` as used by `stream` (PyTorch's `recordStream`,
    /// see [`CachingAllocator::record_stream`]).
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.on_owner(ptr, |alloc| alloc.record_stream(ptr, stream))
    }

    /// Run `f` on the shard that owns `ptr`: the calling thread's last
    /// shard first, then the others in slot order. `f` must return
    /// `InvalidPointer` without changing anything when its shard does not
    /// own `ptr` (as [`CachingAllocator`]'s calls do); each attempt takes
    /// one shard's lock alone.
    fn on_owner<R>(
        &self,
        ptr: DevicePtr,
        f: impl Fn(&CachingAllocator<Arc<B>>) -> Result<R, AllocError>,
    ) -> Result<R, AllocError> {
        let hint = LAST_SHARD.with(Cell::get);
        if let Some(shard) = self.slots.get(hint).and_then(OnceSlot::get) {
            match f(&shard.alloc) {
                Err(AllocError::InvalidPointer { .. }) => {}
                r => return r,
            }
        }
        for (i, slot) in self.slots.iter().enumerate() {
            if i == hint {
                continue;
            }
            if let Some(shard) = slot.get() {
                match f(&shard.alloc) {
                    Err(AllocError::InvalidPointer { .. }) => {}
                    r => return r,
                }
            }
        }
        Err(AllocError::InvalidPointer { ptr })
    }

    /// The slot and shard of `stream`, creating the shard on first use.
    #[inline]
    fn shard_for(&self, stream: StreamId) -> Result<(usize, ShardRef<'_, B>), AllocError> {
        let n = self.slots.len();
        let home = home_slot(stream, n);
        for probe in 0..n {
            let i = if home + probe < n {
                home + probe
            } else {
                home + probe - n
            };
            let slot = &self.slots[i];
            let shard = match slot.get() {
                Some(shard) => shard,
                None => {
                    // An unknown stream gets no shard (and takes no slot).
                    self.backend
                        .check_stream(stream)
                        .map_err(|e| AllocError::from_stream_check(stream, e))?;
                    // Held until the shard is published, so that a concurrent
                    // `record_memory_history` either sees the shard or has
                    // already set what the shard is created with.
                    let settings = self.settings.lock();
                    slot.get_or_init(|| self.new_shard(stream, &settings))
                }
            };
            if shard.stream == stream {
                return Ok((i, shard));
            }
        }
        Err(AllocError::InvalidArgument(format!(
            "{stream:?} would be stream number {} of a StreamShards made for {n} streams; \
             create it with StreamShards::with_max_streams and a larger max_streams",
            n + 1
        )))
    }

    #[cold]
    fn new_shard(&self, stream: StreamId, settings: &ShardSettings) -> Box<Shard<B>> {
        let alloc =
            CachingAllocator::with_device(self.backend.clone(), self.config.clone(), self.device);
        alloc.share_device_reserved(self.reserved.clone());
        alloc.record_memory_history(settings.history.clone());
        if settings.rank_by_address {
            alloc.seeder().rank_segments_by_address(true);
        }
        Box::new(Shard { stream, alloc })
    }

    /// The shards created so far, in slot order.
    fn shards(&self) -> impl Iterator<Item = ShardRef<'_, B>> + '_ {
        self.slots.iter().filter_map(OnceSlot::get)
    }

    /// The streams that have a shard, in increasing order.
    pub fn streams(&self) -> Vec<StreamId> {
        let mut streams: Vec<StreamId> = self.shards().map(|s| s.stream).collect();
        streams.sort_by_key(|s| s.0);
        streams
    }

    /// Release every shard's cached segments that are entirely free, after
    /// waiting for their outstanding events (`torch.cuda.empty_cache`), in
    /// PyTorch's order: large segments of every stream (by stream id), then
    /// small ones. Each shard counts one `num_sync_all_streams`.
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.release_caches(None)
    }

    /// Release the cached segments of every shard but `except`, in
    /// PyTorch's order (spec 1.9 `release_cached_blocks`): the large pool's
    /// segments of every stream in stream order, then the small pool's and
    /// the private pools'. Each step takes one shard's lock alone. A
    /// driver error does not stop it: the first is returned at the end.
    fn release_caches(&self, except: Option<usize>) -> Result<(), AllocError> {
        let mut shards: Vec<_> = self
            .slots
            .iter()
            .enumerate()
            .filter(|&(i, _)| Some(i) != except)
            .filter_map(|(_, slot)| slot.get())
            .collect();
        shards.sort_by_key(|s| s.stream.0);
        // A driver error in one shard does not keep the others' caches:
        // every shard is emptied and the first error returned.
        let mut first = Ok(());
        for large in [true, false] {
            for shard in &shards {
                super::release::keep_first(&mut first, shard.alloc.empty_cache_half(large));
            }
        }
        first
    }

    /// The statistics summed over the shards: every counter exact; the
    /// `reserved_bytes` peaks exact (a device-wide gauge updated on driver
    /// calls); every other `peak` the sum of the shards' peaks (an upper
    /// bound of the device's peak, exact with one stream; see
    /// [`StreamShards`]).
    pub fn stats(&self) -> DeviceStats {
        let mut total = DeviceStats::with_max_split_size(self.config.max_split_size);
        for shard in self.shards() {
            total.add(&shard.alloc.stats());
        }
        self.reserved.set_peaks(&mut total.reserved_bytes);
        total
    }

    /// Each shard's own statistics (exact, peaks included), by stream.
    pub fn shard_stats(&self) -> Vec<(StreamId, DeviceStats)> {
        let mut all: Vec<_> = self.shards().map(|s| (s.stream, s.alloc.stats())).collect();
        all.sort_by_key(|(s, _)| s.0);
        all
    }

    /// [`stats`](Self::stats) as `torch.cuda.memory_stats()` keys: the keys
    /// of the PyTorch release of the configuration
    /// ([`ReleaseRules::missing_stat_keys`](crate::config::ReleaseRules::missing_stat_keys)).
    pub fn memory_stats(&self) -> BTreeMap<String, i64> {
        let release = self.config.torch_release;
        let mut flat = self.stats().to_flat_of(release);
        if release.rules().stat_reserved_bytes_by_private_pools {
            crate::stats::put_private_pool_reserved(&mut flat, &self.private_pool_reserved());
        }
        flat
    }

    /// The reserved bytes of each private pool, summed over the shards
    /// (peaks add up: an upper bound, exact with one stream; see
    /// [`CachingAllocator::private_pool_reserved`](crate::CachingAllocator::private_pool_reserved)).
    pub fn private_pool_reserved(
        &self,
    ) -> BTreeMap<crate::ids::MempoolId, crate::stats::StatArray> {
        let mut total: BTreeMap<crate::ids::MempoolId, crate::stats::StatArray> = BTreeMap::new();
        for shard in self.shards() {
            for (id, array) in shard.alloc.private_pool_reserved() {
                let sum = total.entry(id).or_default();
                for (t, s) in sum.0.iter_mut().zip(&array.0) {
                    t.add(s);
                }
            }
        }
        total
    }

    /// Set every shard's peaks to their current values.
    pub fn reset_peak_stats(&self) {
        for shard in self.shards() {
            shard.alloc.reset_peak_stats();
        }
        self.reserved.reset_peak();
    }

    /// Zero every shard's lifetime totals and event counters.
    pub fn reset_accumulated_stats(&self) {
        for shard in self.shards() {
            shard.alloc.reset_accumulated_stats();
        }
    }

    /// Configure history recording on every shard, and on shards created
    /// later (see [`CachingAllocator::record_memory_history`]).
    pub fn record_memory_history(&self, config: HistoryConfig) {
        let mut settings = self.settings.lock();
        for shard in self.shards() {
            shard.alloc.record_memory_history(config.clone());
        }
        settings.history = config;
    }

    /// The shards' histories merged, oldest first (by time stamp; each
    /// shard's own order is kept among equal stamps).
    pub fn history(&self) -> Vec<TraceEntry> {
        let mut entries: Vec<TraceEntry> = self.shards().flat_map(|s| s.alloc.history()).collect();
        entries.sort_by_key(|e| e.time_us);
        entries
    }

    /// The segments of every shard, in address order.
    pub fn segments(&self) -> Vec<Segment> {
        let mut segments: Vec<Segment> = self.shards().flat_map(|s| s.alloc.segments()).collect();
        segments.sort_by_key(|s| s.address);
        segments
    }

    /// A snapshot of every shard as one device's (see
    /// [`CachingAllocator::snapshot`]): segments in address order, the
    /// histories merged by time. The call's `snapshot` history entry is
    /// recorded once, in the first shard (in slot order).
    pub fn snapshot(&self) -> Snapshot {
        let mut shards = self.shards();
        let Some(first) = shards.next() else {
            return Snapshot::default();
        };
        let mut snap = first.alloc.snapshot(None);
        for shard in shards {
            snap.segments.extend(shard.alloc.segments());
            let d = usize::try_from(self.device).unwrap_or(0);
            if snap.device_traces.len() <= d {
                snap.device_traces.resize_with(d + 1, Vec::new);
            }
            snap.device_traces[d].extend(shard.alloc.history());
        }
        snap.segments.sort_by_key(|s| s.address);
        for trace in &mut snap.device_traces {
            trace.sort_by_key(|e| e.time_us);
        }
        snap
    }

    /// Check the invariants of `stream`'s shard alone (see
    /// [`CachingAllocator::check_invariants`]), taking no other shard's
    /// lock: what a thread can check after each of its own operations
    /// while other threads work. A stream without a shard has nothing to
    /// check.
    pub fn check_stream_invariants(&self, stream: StreamId) -> Result<(), InvariantViolation> {
        for shard in self.shards() {
            if shard.stream == stream {
                return shard.alloc.check_invariants();
            }
        }
        Ok(())
    }

    /// Check every shard's invariants (see
    /// [`CachingAllocator::check_invariants`]), that each shard serves only
    /// its own stream, that no two shards' segments overlap, and that the
    /// device-wide reserved gauge equals the shards' sum. Call it while no
    /// other thread allocates (it reads the shards one after another).
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let mut ranges = Vec::new();
        for shard in self.shards() {
            shard.alloc.check_invariants()?;
            for seg in shard.alloc.segments() {
                if seg.stream != shard.stream {
                    return Err(InvariantViolation(format!(
                        "segment {:#x} of {:?} is in the shard of {:?}",
                        seg.address, seg.stream, shard.stream
                    )));
                }
                ranges.push((seg.address, seg.address + seg.total_size));
            }
        }
        let summed = self.stats().reserved_bytes.0.map(|s| s.current);
        if summed != self.reserved.current() {
            return Err(InvariantViolation(format!(
                "the shards reserve {summed:?} bytes but the device-wide gauge says {:?}",
                self.reserved.current()
            )));
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[1].0 < w[0].1 {
                return Err(InvariantViolation(format!(
                    "segments at {:#x} and {:#x} of two shards overlap",
                    w[0].0, w[1].0
                )));
            }
        }
        Ok(())
    }
}

/// The first slot to look at for `stream`: its id for small ids (streams
/// numbered from 0 get one slot each), a multiplicative hash for large ones
/// (stream handles that are addresses).
#[inline]
fn home_slot(stream: StreamId, slots: usize) -> usize {
    if stream.0 < slots as u64 {
        stream.0 as usize
    } else {
        ((stream.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % slots as u64) as usize
    }
}

/// Replay-only operations on a [`StreamShards`], kept off its own surface
/// as [`Seeder`](super::Seeder) keeps them off [`CachingAllocator`]'s:
/// seeding a stream's shard, ranking segments by address, and the totals a
/// replay reads after each step. Get one with [`StreamShards::seeder`].
pub struct ShardsSeeder<'a, B: Backend> {
    shards: &'a StreamShards<B>,
}

impl<B: Backend> StreamShards<B> {
    /// The replay-only operations on these shards (see [`ShardsSeeder`]).
    pub fn seeder(&self) -> ShardsSeeder<'_, B> {
        ShardsSeeder { shards: self }
    }
}

impl<B: Backend> ShardsSeeder<'_, B> {
    /// Run `f` on `stream`'s shard (created if it has none yet): for what
    /// only a [`CachingAllocator`] offers, such as seeding a recorded
    /// segment of that stream with [`CachingAllocator::seeder`].
    pub fn with_shard<R>(
        &self,
        stream: StreamId,
        f: impl FnOnce(&CachingAllocator<Arc<B>>) -> R,
    ) -> Result<R, AllocError> {
        let (_, shard) = self.shards.shard_for(stream)?;
        Ok(f(&shard.alloc))
    }

    /// Among free blocks of equal size, prefer the lowest address, in every
    /// shard and those created later (see
    /// [`Seeder::rank_segments_by_address`](super::Seeder::rank_segments_by_address);
    /// for replays of recorded traces).
    pub fn rank_segments_by_address(&self, on: bool) {
        let mut settings = self.shards.settings.lock();
        for shard in self.shards.shards() {
            shard.alloc.seeder().rank_segments_by_address(on);
        }
        settings.rank_by_address = on;
    }

    /// Allocated and reserved bytes now, summed over the shards (see
    /// [`Seeder::allocated_and_reserved`](super::Seeder::allocated_and_reserved)).
    pub fn allocated_and_reserved(&self) -> (u64, u64) {
        self.shards
            .shards()
            .map(|s| s.alloc.seeder().allocated_and_reserved())
            .fold((0, 0), |(a, r), (sa, sr)| (a + sa, r + sr))
    }
}
