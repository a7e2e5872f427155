//! What the replay engine drives: a [`ReplayTarget`], an allocator over the
//! simulated device.
//!
//! The engine ([`Replay`](super::Replay)), the recorded-snapshot replay and
//! its fidelity report, `reservoir replay`, its `--json` output and HTML
//! report reach the allocator only through this trait, so a second allocator
//! (or a new policy) plugs into all of them with one `impl`. The caching
//! allocator's implementation is below; it is the only place that calls the
//! allocator's seeding methods, which exist for replay alone.

use reservoir::backend::{DevicePtr, StreamId};
use reservoir::caching::{CachingAllocator, SeedError, SeededExpandable, SeededSegment};
use reservoir::config::AllocatorConfig;
use reservoir::error::AllocError;
use reservoir::sim::SimDevice;
use reservoir::snapshot::{LayoutSummary, Segment};
use reservoir::stats::DeviceStats;

/// An allocator the replay engine can drive on a [`SimDevice`]: PyTorch's
/// allocator calls, the numbers the reports read, and seeding a recorded
/// start state.
pub trait ReplayTarget {
    /// A fresh allocator with `config` over `device`.
    fn on_device(device: SimDevice, config: AllocatorConfig) -> Self
    where
        Self: Sized;

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
}

impl ReplayTarget for CachingAllocator<SimDevice> {
    fn on_device(device: SimDevice, config: AllocatorConfig) -> Self {
        CachingAllocator::new(device, config)
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
        CachingAllocator::layout_summary(self)
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
