//! The MPS heap allocator as a fault-injection [`Subject`].

use reservoir::backend::{DevicePtr, StreamId};
use reservoir::config::heap::HeapSettings;
use reservoir::error::AllocError;
use reservoir::heap::{HeapAllocator, UsageFlags};
use reservoir::stats::DeviceStats;

use super::{FaultySim, Subject};

/// A scalar buffer is asked for below this size.
const MAX_SCALAR_REQUEST: u64 = 1 << 20;

/// The MPS heap allocator ([`HeapAllocator`]) as a [`Subject`]. A buffer
/// has no stream: the run's stream number picks its kind (1: shared,
/// private on a discrete device; 2: scalar below 1 MiB; otherwise
/// private). A use is `record_use` or, for about half of them,
/// `recordEvents` (shared buffers only: others are skipped).
/// [`Op::BeginPool`](super::Op::BeginPool) is `commit` (the default
/// stream's command buffer: freed scalars come back once its work
/// completes); [`Op::EndPool`](super::Op::EndPool) is
/// `getSharedBufferPtr` of the newest live buffer when it is shared, then
/// `waitForEvents` on it and `freeInactiveBuffers`. Closing drops the
/// allocator (`~MPSHeapAllocatorImpl`, which empties the cache).
pub struct HeapSubject {
    a: HeapAllocator<FaultySim>,
    unified: bool,
}

impl Subject for HeapSubject {
    type Mode = HeapSettings;
    /// The statistics, the heaps' bytes (`getTotalAllocatedMemory`) and the
    /// bytes of buffers in use or pending (`getCurrentAllocatedMemory`).
    type Counters = (DeviceStats, u64, u64);

    fn new(dev: FaultySim, mode: &HeapSettings) -> Result<HeapSubject, AllocError> {
        Ok(HeapSubject {
            a: HeapAllocator::new(dev, mode.clone())?,
            unified: mode.unified_memory,
        })
    }
    fn describe(s: &HeapSettings) -> String {
        let mut out = format!(
            "mps heap, {} memory",
            if s.unified_memory {
                "unified"
            } else {
                "discrete"
            }
        );
        if s.free_waits_for_events {
            out.push_str(", frees wait for events");
        }
        if let Some(max) = s.recommended_max_memory {
            out.push_str(&format!(
                ", watermarks high {} low {} of {max} bytes",
                s.high_watermark_ratio, s.low_watermark_ratio
            ));
        }
        out
    }
    fn alloc(&mut self, size: u64, _: StreamId, k: usize) -> Result<DevicePtr, AllocError> {
        let usage = match k {
            1 if self.unified => UsageFlags::SHARED,
            2 if size < MAX_SCALAR_REQUEST => UsageFlags::SCALAR,
            _ => UsageFlags::PRIVATE,
        };
        self.a.malloc(size, usage)
    }
    fn free(&mut self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.a.free(ptr)
    }
    fn is_allocated(&self, ptr: DevicePtr) -> bool {
        self.a.unaligned_buffer_size(ptr).is_some()
    }
    fn use_on(&mut self, ptr: DevicePtr, stream: StreamId, pick: u64) -> Result<(), AllocError> {
        // Not the low bits: they picked the buffer.
        if pick >> 63 == 0 {
            self.a.record_use(&[ptr], stream)
        } else {
            self.a.record_events(&[ptr], stream).map(|_| ())
        }
    }
    fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.a.empty_cache()
    }
    fn begin(&mut self, _: StreamId) {
        let _ = self.a.commit();
    }
    fn end(&mut self, live: &[DevicePtr]) {
        if let Some(&p) = live.last() {
            if self.a.is_shared_buffer(p) {
                let _ = self.a.shared_buffer_ptr(p);
            }
            let _ = self.a.wait_for_events(&[p]);
        }
        let _ = self.a.free_inactive_buffers();
    }
    fn settle(&mut self) -> Vec<String> {
        Vec::new()
    }
    fn stats(&self) -> DeviceStats {
        self.a.stats()
    }
    fn counters(&self) -> (DeviceStats, u64, u64) {
        (
            self.a.stats(),
            self.a.total_allocated_memory(),
            self.a.current_allocated_memory(),
        )
    }
    fn check_invariants(&self) -> Result<(), String> {
        self.a.check_invariants()
    }
    /// The heaps that hold no buffer: `emptyCache` never visits them
    /// (PyTorch's behaviour, spec audit item 25); dropping releases them.
    fn kept_after_empty_cache(&self) -> (i64, i64) {
        let snap = self.a.snapshot();
        let empty = snap
            .segments
            .iter()
            .filter(|s| s.blocks.iter().all(|b| b.requested_size.is_none()));
        empty.fold((0, 0), |(bytes, n), s| (bytes + s.total_size as i64, n + 1))
    }
    fn close(self) -> Vec<String> {
        // A failure of the drop's `emptyCache` is only logged: the device's
        // own count (checked by the caller) shows what it left.
        drop(self.a);
        Vec::new()
    }
}
