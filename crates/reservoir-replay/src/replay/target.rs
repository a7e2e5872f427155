//! What the replay engine drives: a [`ReplayTarget`], an allocator over the
//! simulated device.
//!
//! The engine ([`Replay`](super::Replay)), the recorded-snapshot replay and
//! its fidelity report, `reservoir replay`, its `--json` output and HTML
//! report reach the allocator only through this trait, so a second allocator
//! (or a new policy) plugs into all of them with one `impl`. The caching
//! allocator's implementation is below; it is the only place that calls the
//! allocator's seeding methods, which exist for replay alone. The MPS heap
//! allocator's follows it: it places buffers itself, so a recorded start
//! state is rebuilt by allocating its live blocks
//! ([`ReplayTarget::seed_segment_blocks`]). [`StreamShards`] (one lock
//! per stream) seeds each segment into its stream's shard.

use reservoir::backend::{DevicePtr, StreamId};
use reservoir::caching::{
    CachingAllocator, PoolFilter, SeedError, SeededExpandable, SeededSegment, StreamShards,
};
use reservoir::config::heap::HeapSettings;
use reservoir::config::AllocatorConfig;
use reservoir::error::AllocError;
use reservoir::heap::{HeapAllocator, UsageFlags};
use reservoir::ids::MempoolId;
use reservoir::observe::snapshot::{LayoutSummary, Segment};
use reservoir::sim::SimDevice;
use reservoir::stats::DeviceStats;

/// An allocator the replay engine can drive on a [`SimDevice`]: PyTorch's
/// allocator calls, the numbers the reports read, and seeding a recorded
/// start state.
pub trait ReplayTarget {
    /// A fresh allocator with `config` over `device`.
    fn on_device(device: SimDevice, config: AllocatorConfig) -> Self
    where
        Self: Sized;

    /// A fresh allocator with `config` over `device`, serving device index
    /// `index` (the `n` of "GPU n" in its messages). By default
    /// [`on_device`](Self::on_device), whose index is 0.
    fn on_device_index(device: SimDevice, config: AllocatorConfig, index: i8) -> Self
    where
        Self: Sized,
    {
        let _ = index;
        Self::on_device(device, config)
    }

    /// The simulated device it allocates from (the trace's stream ops run on
    /// it, and the reports read its counters).
    fn device(&self) -> &SimDevice;

    /// Allocate `size` bytes for use on `stream` (`raw_alloc`).
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError>;

    /// Free an allocation (`raw_free`).
    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError>;

    /// Release cached memory to the device (`empty_cache`).
    fn empty_cache(&self) -> Result<(), AllocError>;

    /// Mark an allocation as used on `stream` (`record_stream`).
    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError>;

    /// Route every allocation from now on to the private pool `pool`,
    /// creating it or adding a use (`beginAllocateToPool`). An allocator
    /// without private pools (the default) allocates to its one pool.
    fn begin_allocate_to_pool(&self, _pool: MempoolId) -> Result<(), AllocError> {
        Ok(())
    }

    /// Stop routing allocations to `pool` (`endAllocateToPool`).
    fn end_allocate_to_pool(&self, _pool: MempoolId) -> Result<(), AllocError> {
        Ok(())
    }

    /// Drop one use of `pool` (`releasePool`).
    fn release_pool(&self, _pool: MempoolId) -> Result<(), AllocError> {
        Ok(())
    }

    /// Release the cached memory of the released private pool `pool`
    /// (`emptyCache(pool)`); an allocator without private pools empties its
    /// whole cache.
    fn empty_cache_pool(&self, _pool: MempoolId) -> Result<(), AllocError> {
        self.empty_cache()
    }

    /// [`seed_segment_blocks`](Self::seed_segment_blocks) into the private
    /// pool `pool` (created with one use when new); an allocator without
    /// private pools seeds it into its one pool.
    fn seed_segment_blocks_in_pool(
        &self,
        seg: &SeededSegment,
        _pool: MempoolId,
    ) -> Result<Vec<DevicePtr>, SeedError> {
        self.seed_segment_blocks(seg)
    }

    /// The statistics (`memory_stats`).
    fn stats(&self) -> DeviceStats;

    /// Bytes allocated and reserved now; called after every op, so cheap.
    fn allocated_and_reserved(&self) -> (u64, u64);

    /// Every segment with its blocks, in address order.
    fn segments(&self) -> Vec<Segment>;

    /// The counts of [`segments`](Self::segments), scanned at every new
    /// peak of reserved memory; a target can answer without building the
    /// list.
    fn layout_summary(&self) -> LayoutSummary {
        LayoutSummary::of(&self.segments())
    }

    /// Reset the accumulated statistics (after seeding).
    fn reset_accumulated_stats(&self);

    /// Reset the peak statistics (after seeding).
    fn reset_peak_stats(&self);

    /// Rank segments by address rather than by allocation order where the
    /// allocator's choice depends on it (a recorded trace's start state).
    fn rank_segments_by_address(&self, on: bool);

    /// Seed a recorded segment with its allocated blocks; returns its base.
    fn seed_segment(&self, seg: &SeededSegment) -> Result<DevicePtr, SeedError>;

    /// Seed a recorded expandable segment; returns its base.
    fn seed_expandable(&self, seg: &SeededExpandable) -> Result<DevicePtr, SeedError>;

    /// Seed a recorded segment; returns the pointer of each of its blocks,
    /// in order. The default places them at their recorded offsets from
    /// [`seed_segment`](Self::seed_segment)'s base.
    fn seed_segment_blocks(&self, seg: &SeededSegment) -> Result<Vec<DevicePtr>, SeedError> {
        let base = self.seed_segment(seg)?;
        Ok(at_offsets(base, &seg.blocks))
    }

    /// Seed a recorded expandable segment; returns the pointer of each of
    /// its blocks, in order (by default at their recorded offsets).
    fn seed_expandable_blocks(&self, seg: &SeededExpandable) -> Result<Vec<DevicePtr>, SeedError> {
        let base = self.seed_expandable(seg)?;
        Ok(at_offsets(base, &seg.blocks))
    }
}

/// The blocks' pointers at their offsets from `base`.
fn at_offsets(base: DevicePtr, blocks: &[reservoir::caching::SeededBlock]) -> Vec<DevicePtr> {
    blocks
        .iter()
        .map(|b| DevicePtr(base.0 + b.offset))
        .collect()
}

impl ReplayTarget for CachingAllocator<SimDevice> {
    fn on_device(device: SimDevice, config: AllocatorConfig) -> Self {
        CachingAllocator::new(device, config)
    }

    fn on_device_index(device: SimDevice, config: AllocatorConfig, index: i8) -> Self {
        CachingAllocator::with_device(device, config, index)
    }

    #[inline]
    fn device(&self) -> &SimDevice {
        self.backend()
    }

    #[inline]
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.raw_alloc(size, stream)
    }

    #[inline]
    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.raw_free(ptr)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        CachingAllocator::empty_cache(self)
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        CachingAllocator::record_stream(self, ptr, stream)
    }

    /// Every allocation goes to the pool (a replay runs on one thread).
    fn begin_allocate_to_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        let all = PoolFilter::Custom(std::sync::Arc::new(|_| true));
        CachingAllocator::begin_allocate_to_pool(self, pool, all)
    }

    fn end_allocate_to_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        CachingAllocator::end_allocate_to_pool(self, pool)
    }

    fn release_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        CachingAllocator::release_pool(self, pool)
    }

    fn empty_cache_pool(&self, pool: MempoolId) -> Result<(), AllocError> {
        CachingAllocator::empty_cache_pool(self, pool)
    }

    fn seed_segment_blocks_in_pool(
        &self,
        seg: &SeededSegment,
        pool: MempoolId,
    ) -> Result<Vec<DevicePtr>, SeedError> {
        let base = self.seeder().seed_segment_in_pool(seg, pool)?;
        Ok(at_offsets(base, &seg.blocks))
    }

    fn stats(&self) -> DeviceStats {
        CachingAllocator::stats(self)
    }

    #[inline]
    fn allocated_and_reserved(&self) -> (u64, u64) {
        self.seeder().allocated_and_reserved()
    }

    fn segments(&self) -> Vec<Segment> {
        CachingAllocator::segments(self)
    }

    fn layout_summary(&self) -> LayoutSummary {
        self.seeder().layout_summary()
    }

    fn reset_accumulated_stats(&self) {
        CachingAllocator::reset_accumulated_stats(self)
    }

    fn reset_peak_stats(&self) {
        CachingAllocator::reset_peak_stats(self)
    }

    fn rank_segments_by_address(&self, on: bool) {
        self.seeder().rank_segments_by_address(on)
    }

    fn seed_segment(&self, seg: &SeededSegment) -> Result<DevicePtr, SeedError> {
        self.seeder().seed_segment(seg)
    }

    fn seed_expandable(&self, seg: &SeededExpandable) -> Result<DevicePtr, SeedError> {
        self.seeder().seed_expandable(seg)
    }
}

/// One lock per stream ([`StreamShards`]): each stream's shard is PyTorch
/// mode for that stream. Seeded segments go to their stream's shard.
impl ReplayTarget for StreamShards<SimDevice> {
    /// Panics on a per-process memory fraction below 1, which
    /// [`StreamShards`] refuses.
    fn on_device(device: SimDevice, config: AllocatorConfig) -> Self {
        StreamShards::new(device, config)
            .expect("recorded settings have no per-process memory fraction below 1")
    }

    fn device(&self) -> &SimDevice {
        self.backend()
    }

    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.raw_alloc(size, stream)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.raw_free(ptr)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        StreamShards::empty_cache(self)
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        StreamShards::record_stream(self, ptr, stream)
    }

    fn stats(&self) -> DeviceStats {
        StreamShards::stats(self)
    }

    fn allocated_and_reserved(&self) -> (u64, u64) {
        self.seeder().allocated_and_reserved()
    }

    fn segments(&self) -> Vec<Segment> {
        StreamShards::segments(self)
    }

    fn reset_accumulated_stats(&self) {
        StreamShards::reset_accumulated_stats(self)
    }

    fn reset_peak_stats(&self) {
        StreamShards::reset_peak_stats(self)
    }

    fn rank_segments_by_address(&self, on: bool) {
        self.seeder().rank_segments_by_address(on)
    }

    fn seed_segment(&self, seg: &SeededSegment) -> Result<DevicePtr, SeedError> {
        self.seeder()
            .with_shard(seg.stream, |a| a.seeder().seed_segment(seg))
            .map_err(|e| SeedError::Layout(e.to_string()))?
    }

    fn seed_expandable(&self, seg: &SeededExpandable) -> Result<DevicePtr, SeedError> {
        self.seeder()
            .with_shard(seg.stream, |a| a.seeder().seed_expandable(seg))
            .map_err(|e| SeedError::Layout(e.to_string()))?
    }
}

/// PyTorch's MPS heap allocator (`--policy mps-heap`) on unified memory, the
/// recommended max memory being the device's capacity, with the default
/// settings: the seed's 2.7-era `MPSAllocator.mm`. The trace's streams run
/// on the device; `record_stream` (which MPS does not have) is taken as the
/// stream's work using the buffer ([`HeapAllocator::record_use`]: its retain
/// count stays above 1 until that work completes); a freed buffer goes back
/// to its pool at once, as 2.x's `free` does. The `AllocatorConfig` (CUDA
/// settings) does not apply.
impl ReplayTarget for HeapAllocator<SimDevice> {
    fn on_device(device: SimDevice, _config: AllocatorConfig) -> Self {
        HeapAllocator::new(device, HeapSettings::new(true))
            .expect("the simulated device reports its memory and the default settings are valid")
    }

    fn device(&self) -> &SimDevice {
        self.backend()
    }

    /// The private front end: null for 0 bytes; the stream does not matter
    /// (MPS has one serial queue).
    fn alloc(&self, size: u64, _stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.private_allocator().allocate(size)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.private_allocator().delete(ptr)
    }

    fn empty_cache(&self) -> Result<(), AllocError> {
        HeapAllocator::empty_cache(self)
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.record_use(&[ptr], stream)
    }

    fn stats(&self) -> DeviceStats {
        HeapAllocator::stats(self)
    }

    fn allocated_and_reserved(&self) -> (u64, u64) {
        HeapAllocator::allocated_and_reserved(self)
    }

    fn segments(&self) -> Vec<Segment> {
        self.snapshot().segments
    }

    fn reset_accumulated_stats(&self) {
        HeapAllocator::reset_accumulated_stats(self)
    }

    fn reset_peak_stats(&self) {
        HeapAllocator::reset_peak_stats(self)
    }

    /// Heaps are chosen by available size, not by rank: nothing to do.
    fn rank_segments_by_address(&self, _on: bool) {}

    /// The heap allocator cannot adopt a CUDA segment: see
    /// [`seed_segment_blocks`](ReplayTarget::seed_segment_blocks).
    fn seed_segment(&self, seg: &SeededSegment) -> Result<DevicePtr, SeedError> {
        Err(not_adoptable(seg.size))
    }

    /// As [`seed_segment`](ReplayTarget::seed_segment).
    fn seed_expandable(&self, seg: &SeededExpandable) -> Result<DevicePtr, SeedError> {
        Err(not_adoptable(seg.mapped.iter().map(|m| m.1).sum()))
    }

    /// Allocate each recorded block (its requested size) as a buffer.
    fn seed_segment_blocks(&self, seg: &SeededSegment) -> Result<Vec<DevicePtr>, SeedError> {
        seed_buffers(self, &seg.blocks)
    }

    fn seed_expandable_blocks(&self, seg: &SeededExpandable) -> Result<Vec<DevicePtr>, SeedError> {
        seed_buffers(self, &seg.blocks)
    }
}

fn not_adoptable(size: u64) -> SeedError {
    SeedError::Layout(format!(
        "the MPS heap allocator cannot adopt a recorded segment of {size} bytes \
         (it rebuilds a start state by allocating the segment's blocks)"
    ))
}

/// The live blocks of a recorded segment allocated as private buffers.
fn seed_buffers(
    heap: &HeapAllocator<SimDevice>,
    blocks: &[reservoir::caching::SeededBlock],
) -> Result<Vec<DevicePtr>, SeedError> {
    blocks
        .iter()
        .map(|b| {
            let size = b.requested_size.max(1);
            heap.malloc(size, UsageFlags::PRIVATE).map_err(|e| {
                SeedError::Layout(format!(
                    "the MPS heap allocator could not allocate a recorded block of {size} bytes: {e}"
                ))
            })
        })
        .collect()
}
