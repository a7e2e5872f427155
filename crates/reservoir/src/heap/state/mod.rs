//! The heap allocator's state (`MPSHeapAllocatorImpl`'s fields) and the
//! allocation path of spec 4.2 (`alloc_buffer_block`, `get_free_buffer`,
//! `alloc_buffer`, `get_free_heap`, `HeapBlock::createHeapBlock`); the
//! release paths of spec 4.3 are in `release.rs`, the checker in
//! `check.rs`, the reads and events the allocator's face (`heap/mod.rs`)
//! uses in `face.rs`.
//!
//! Heaps and buffers live in a [`BlockStore`]: a heap is a segment (one
//! [`Backend::allocate`]), tiled by blocks that are either buffers
//! (`allocated`) or free space inside the heap. Metal places buffers in an
//! automatic heap itself; Reservoir places them first-fit at the lowest
//! aligned free offset, and a heap's available size
//! (`maxAvailableSizeWithAlignment`) is its largest free range. That keeps
//! PyTorch's assumption that a heap with `available >= size` can always
//! hold the buffer (its `TORCH_INTERNAL_ASSERT(buffer)`).
//!
//! # Sealed
//!
//! [`State`]'s fields, and those of its records ([`Buffer`], [`Heap`],
//! [`Pool`]), are private to this module and its children: the face reads
//! them and changes them only through the named methods of `face.rs` and
//! the events here and in `release.rs` (allocate a buffer, hand it out,
//! free it, release it or its heap, collect garbage, poll completions).
//! The limits follow the watermark ratios: they change only with them
//! ([`State::set_high_ratio`], [`State::set_low_ratio`]).
//!
//! # Invariants
//!
//! What [`State::check`] (`check.rs`) checks, each under its number, and
//! nothing else:
//!
//! 1. **Heaps.** The store's segments are tiled by their blocks (the
//!    store's own checker); every segment is live and has a [`Heap`]
//!    record, and every record is a segment.
//! 2. **Buffers.** A block has a [`Buffer`] record exactly when it is
//!    allocated in the store; free space has none. A buffer's size and its
//!    offset in its heap are multiples of `alignment`.
//! 3. **Pointers.** `ptrs` holds exactly the buffers that are not zombies,
//!    each under its address; `bufs` holds those and the zombies.
//! 4. **Waiting sets.** `pending` holds exactly the
//!    [`BufState::PendingFree`] buffers, `zombies` exactly the
//!    [`BufState::Zombie`] ones.
//! 5. **A heap's counts.** `n_buffers` counts its buffers that are not
//!    zombies; `available` is its largest free range.
//! 6. **A heap's pool.** An attached heap is in its pool's `heaps` under
//!    (available, address, id), and in the pool's `heaps_pending_update`
//!    exactly when it holds a zombie; a detached heap holds a zombie (its
//!    memory goes back once they complete) and is in no pool set.
//! 7. **A pool's buffers.** `buffers` holds exactly the pool's
//!    [`BufState::Available`] buffers under (size, address, id);
//!    `available_size` is their bytes; `allocated_size` and `n_buffers` are
//!    the bytes and count of the pool's buffers that are not zombies.
//! 8. **Totals.** `total_allocated` is the bytes of the attached heaps;
//!    `current_allocated` the bytes of the buffers in use or pending free.
//! 9. **Statistics.** Every current statistic equals its recount: segments
//!    and reserved bytes from the attached heaps; allocations and
//!    allocated bytes from the buffers in use; active, active bytes and
//!    requested bytes from the buffers in use or pending free.

mod check;
mod face;
mod release;

use std::collections::BTreeSet;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::types::*;
use crate::backend::{Backend, BackendError, DevicePtr, EventId, StreamId};
use crate::config::heap::HeapSettings;
use crate::error::AllocError;
use crate::observe::callbacks::{AllocatorEvent, CallbackRegistry, EventType};
use crate::observe::debug::{DebugVerbosity, TARGET};
use crate::observe::trace::{RingBuffer, TraceAction, TraceEntry};
use crate::stats::{DeviceStats, StatType};
use crate::store::{BlockId, BlockStore, FreeList, SegmentId};

/// Where a buffer is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BufState {
    /// Handed out to a caller.
    InUse,
    /// Cached in its pool's `buffers`.
    Available,
    /// Freed while recorded work still uses it (`buffers_pending_free`), or
    /// a freed scalar waiting for its stream (spec 4.3).
    PendingFree,
    /// Released from its heap while work still used it: its range stays
    /// occupied until the work completes (`heaps_pending_update`).
    Zombie,
}

/// A buffer (`BufferBlock`); its address and size are its block's.
#[derive(Clone, Debug)]
pub(crate) struct Buffer {
    id: u64,
    state: BufState,
    requested: u64,
    use_count: u64,
    gc_count: u64,
    shape: Vec<i64>,
    /// Events recorded for work using the buffer; the retain count is one
    /// plus the number not yet complete.
    events: Vec<EventId>,
    /// The buffer's `MPSEvent` (`recordEvents`, shared buffers only),
    /// dropped when the buffer is freed back to its pool.
    event: Option<EventId>,
    /// A freed scalar whose completion handler waits for the default
    /// stream's current command buffer to be committed.
    awaiting_commit: bool,
    /// A freed scalar's completion handler once committed: the buffer goes
    /// back to its pool when this event completes, whatever else uses it.
    handler: Option<EventId>,
}

/// A heap (`HeapBlock`); its address and size are its segment's.
#[derive(Clone, Debug)]
pub(crate) struct Heap {
    id: u64,
    /// False for single-buffer heaps ("not split", spec 4.2 step 7).
    is_split: bool,
    /// Live buffers (not zombies) in the heap.
    n_buffers: u32,
    /// The largest free range (`size.available`).
    available: u64,
    /// Still owned by its pool (false: released while zombies remain; the
    /// backend memory goes back once they complete).
    attached: bool,
}

/// One `BufferPool`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    /// Available buffers by (size, address).
    buffers: FreeList<(u64, u64, BlockId)>,
    /// Attached heaps by (available, address).
    heaps: FreeList<(u64, u64, SegmentId)>,
    available_size: u64,
    allocated_size: u64,
    n_buffers: u32,
    /// Heaps holding zombies.
    heaps_pending_update: BTreeSet<SegmentId>,
}

/// One allocation request (`AllocParams`).
pub(crate) struct Params {
    pub size: u64,
    pub requested: u64,
    pub pool: PoolKind,
    pub pressure: bool,
    pub found: Option<BlockId>,
}

/// Everything under the allocator's lock.
pub(crate) struct State {
    store: BlockStore,
    bufs: FxHashMap<BlockId, Buffer>,
    heaps: FxHashMap<SegmentId, Heap>,
    /// `m_allocated_buffers`: every live buffer by address.
    ptrs: FxHashMap<u64, BlockId>,
    pools: [Pool; 5],
    /// `buffers_pending_free`.
    pending: BTreeSet<BlockId>,
    zombies: BTreeSet<BlockId>,
    /// `m_total_allocated_memory`: bytes of attached heaps.
    total_allocated: u64,
    /// `m_current_allocated_memory`: bytes of buffers in use or pending free.
    current_allocated: u64,
    stats: DeviceStats,
    next_buffer_id: u64,
    next_heap_id: u64,
    high_ratio: f64,
    low_ratio: f64,
    /// `m_max_total_allowed_size` (`u64::MAX` when unlimited).
    max_total_allowed: u64,
    /// `m_low_watermark_limit` (`u64::MAX` when disabled).
    low_limit: u64,
    debug: DebugVerbosity,
    unified: bool,
    max_device_size: u64,
    max_buffer_size: u64,
    alignment: u64,
    free_waits_for_events: bool,
    size_format: SizeFormat,
    all_callback_events: bool,
    callbacks: Arc<CallbackRegistry>,
    /// The allocation history when recording (`record_history`).
    history: Option<RingBuffer<TraceEntry>>,
}

pub(crate) fn align_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a) * a
}

impl State {
    pub fn new(
        settings: &HeapSettings,
        total: u64,
        alignment: u64,
        callbacks: Arc<CallbackRegistry>,
    ) -> State {
        let mut s = State {
            store: BlockStore::default(),
            bufs: FxHashMap::default(),
            heaps: FxHashMap::default(),
            ptrs: FxHashMap::default(),
            pools: Default::default(),
            pending: BTreeSet::new(),
            zombies: BTreeSet::new(),
            total_allocated: 0,
            current_allocated: 0,
            stats: DeviceStats::default(),
            next_buffer_id: 0,
            next_heap_id: 0,
            high_ratio: 0.0,
            low_ratio: 0.0,
            max_total_allowed: u64::MAX,
            low_limit: u64::MAX,
            debug: settings.debug,
            unified: settings.unified_memory,
            max_device_size: settings.recommended_max_memory.unwrap_or(total),
            max_buffer_size: settings.max_buffer_length.unwrap_or(total),
            alignment,
            free_waits_for_events: settings.free_waits_for_events,
            size_format: settings.size_format,
            all_callback_events: settings.all_callback_events,
            callbacks,
            history: None,
        };
        s.set_high_ratio(settings.high_watermark_ratio);
        s.set_low_ratio(settings.low_watermark_ratio);
        s
    }

    /// `setHighWatermarkRatio` once checked.
    pub fn set_high_ratio(&mut self, ratio: f64) {
        self.max_total_allowed = self.watermark_limit(ratio, "High");
        self.high_ratio = ratio;
    }

    /// `setLowWatermarkRatio` once checked.
    pub fn set_low_ratio(&mut self, ratio: f64) {
        self.low_limit = self.watermark_limit(ratio, "Low");
        self.low_ratio = ratio;
    }

    /// The byte limit of a watermark `ratio` of the recommended maximum
    /// (`u64::MAX` for 0, which disables it), logged under PROFILING as
    /// PyTorch does ("{which} watermark memory allocation limit: ...").
    fn watermark_limit(&self, ratio: f64, which: &str) -> u64 {
        let limit = if ratio == 0.0 {
            u64::MAX
        } else {
            (ratio * self.max_device_size as f64) as u64
        };
        if self.debug.contains(DebugVerbosity::PROFILING) {
            let shown = if ratio == 0.0 {
                "unlimited".to_string()
            } else {
                self.fs(limit)
            };
            tracing::info!(target: TARGET, "{which} watermark memory allocation limit: {shown}");
        }
        limit
    }

    /// `current_allocated_size()`: `device.currentAllocatedSize`, the bytes
    /// the device has handed out (to this allocator and anyone else), from
    /// the backend's `mem_info` (this allocator's heaps if it fails).
    pub fn device_allocated(&self, dev: &dyn Backend) -> u64 {
        dev.mem_info()
            .map(|m| m.total.saturating_sub(m.free))
            .unwrap_or(self.total_allocated)
    }

    /// `getLowWatermarkValue` (spec 4.4): MiB left below the low limit, 0
    /// once reached, `i64::MAX` when the low watermark is disabled.
    pub fn low_watermark_value(&self, dev: &dyn Backend) -> i64 {
        if self.low_ratio == 0.0 {
            return i64::MAX;
        }
        let left = self.low_limit as i64 - self.device_allocated(dev) as i64;
        (left / (1 << 20)).max(0)
    }

    /// Should a debug message about a buffer of `pool` be logged at `level`
    /// (`LARGE_ONLY` restricts 2/4/8 to the large pools)?
    pub fn logs(&self, level: DebugVerbosity, pool: PoolKind) -> bool {
        self.debug.logs(level, pool.is_small())
    }

    /// Append a history entry when recording (the default stream: heaps
    /// and buffers have no stream).
    pub fn trace(&mut self, action: TraceAction, addr: u64, size: u64) {
        if let Some(h) = self.history.as_mut() {
            let mut e = TraceEntry::new(action, addr, size, StreamId::DEFAULT);
            e.time_us = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .ok()
                .and_then(|d| i64::try_from(d.as_micros()).ok());
            h.push(e);
        }
    }

    /// `format_size` of the PyTorch era in force.
    pub fn fs(&self, size: u64) -> String {
        self.size_format.format(size)
    }

    /// Fire a callback event other than `AllocationFailed` (which the
    /// allocator fires itself): only with `all_callback_events`, the
    /// Reservoir extension (PyTorch 2.x fires none of them).
    pub fn fire(&self, event: EventType, ptr: u64, size: u64) {
        if !self.all_callback_events {
            return;
        }
        self.callbacks.fire(&AllocatorEvent {
            event,
            device: 0,
            ptr: DevicePtr(ptr),
            size,
            stream: StreamId::DEFAULT,
        });
    }

    /// `get_allocation_size`: the size rounded up to the backend's alignment.
    pub fn allocation_size(&self, size: u64) -> u64 {
        align_up(size, self.alignment)
    }

    /// `get_pool` (spec 4.2 step 3).
    pub fn pool_for(&self, requested: u64, alloc_size: u64, usage: UsageFlags) -> PoolKind {
        if usage.contains(UsageFlags::SCALAR) {
            PoolKind::Scalar
        } else if requested <= MAX_SCALAR_ALLOC && self.unified {
            PoolKind::SharedSmall
        } else if alloc_size <= MAX_SMALL_ALLOC {
            if usage.contains(UsageFlags::SHARED) {
                PoolKind::SharedSmall
            } else {
                PoolKind::PrivateSmall
            }
        } else if usage.contains(UsageFlags::SHARED) {
            PoolKind::SharedLarge
        } else {
            PoolKind::PrivateLarge
        }
    }

    pub fn addr(&self, b: BlockId) -> u64 {
        self.store.block(b).addr()
    }

    pub fn size(&self, b: BlockId) -> u64 {
        self.store.block(b).size()
    }

    pub fn heap_of(&self, b: BlockId) -> SegmentId {
        self.store.block(b).segment()
    }

    pub fn pool_of(&self, b: BlockId) -> PoolKind {
        PoolKind::from_pool(self.store.block(b).pool())
    }

    fn buffer_key(&self, b: BlockId) -> (u64, u64, BlockId) {
        (self.size(b), self.addr(b), b)
    }

    pub fn heap_key(&self, h: SegmentId) -> (u64, u64, SegmentId) {
        (self.heaps[&h].available, self.store.segment(h).addr(), h)
    }

    pub fn insert_available(&mut self, b: BlockId) {
        let key = self.buffer_key(b);
        let pool = self.pool_of(b).index();
        self.pools[pool].buffers.insert(key);
    }

    pub fn remove_available(&mut self, b: BlockId) {
        let key = self.buffer_key(b);
        let pool = self.pool_of(b).index();
        self.pools[pool].buffers.remove(&key);
    }

    /// The retain count: 1 plus the buffer's events still pending (completed
    /// events are destroyed and forgotten).
    pub fn retain_count(&mut self, dev: &dyn Backend, b: BlockId) -> Result<u32, BackendError> {
        let buf = self.bufs.get_mut(&b).expect("a buffer");
        let mut err = None;
        buf.events.retain(|&e| match dev.query_event(e) {
            Ok(true) => {
                let _ = dev.destroy_event(e);
                false
            }
            Ok(false) => true,
            Err(x) => {
                err = Some(x);
                true
            }
        });
        match err {
            Some(e) => Err(e),
            None => Ok(1 + buf.events.len() as u32),
        }
    }

    /// The largest free range of a heap, recomputed (`updateAvailableSize`).
    pub fn free_range_max(&self, h: SegmentId) -> u64 {
        self.store
            .segment_blocks(h)
            .filter(|&b| !self.store.block(b).allocated())
            .map(|b| self.size(b))
            .max()
            .unwrap_or(0)
    }

    /// Refresh a heap's available size, keeping its pool's heap set sorted.
    pub fn update_heap(&mut self, h: SegmentId) {
        let attached = self.heaps[&h].attached;
        let pool = self.store.segment(h).pool().index();
        if attached {
            let key = self.heap_key(h);
            self.pools[pool].heaps.remove(&key);
        }
        let available = self.free_range_max(h);
        self.heaps.get_mut(&h).expect("a heap").available = available;
        if attached {
            let key = self.heap_key(h);
            self.pools[pool].heaps.insert(key);
        }
    }

    /// `get_free_buffer` (spec 4.2 step 5).
    pub fn get_free_buffer(
        &mut self,
        dev: &dyn Backend,
        p: &mut Params,
    ) -> Result<bool, AllocError> {
        // (a) the high watermark.
        if self.high_ratio > 0.0 && self.device_allocated(dev) + p.size > self.max_total_allowed {
            return Ok(false);
        }
        let pool = p.pool.index();
        // (b) age every available buffer on large-pool searches.
        if self.low_ratio > 0.0 && !p.pool.is_small() {
            let ids: Vec<BlockId> = self.pools[pool].buffers.iter().map(|k| k.2).collect();
            for b in ids {
                self.bufs.get_mut(&b).expect("a buffer").gc_count += 1;
            }
        }
        // (c) best fit by (size, address).
        let hit = self.pools[pool]
            .buffers
            .range((p.size, 0, BlockId::FIRST)..)
            .next()
            .map(|k| k.2);
        if let Some(b) = hit {
            if self.size(b) <= p.size + LARGE_HEAP {
                p.found = Some(b);
            } else if self.pools[pool]
                .heaps
                .range((p.size, 0, SegmentId::FIRST)..)
                .next()
                .is_some()
            {
                // An existing heap can take the buffer: allocate there.
                p.found = None;
            } else if self.retain_count(dev, b)? <= 1 {
                // Release the oversize buffer, keep its heap, reuse the room.
                self.release_buffer(dev, b, false)?;
                p.pressure = false;
            } else if p.pressure {
                self.release_buffer(dev, b, true)?;
            } else {
                p.found = Some(b);
            }
        }
        let Some(b) = p.found else {
            return Ok(false);
        };
        // The retain count (for the log) before the buffer leaves its free
        // list: a device error must leave it cached (issue 44, G3).
        let retain = self.retain_count(dev, b)?;
        self.remove_available(b);
        let size = self.size(b);
        self.pools[pool].available_size -= size;
        let buf = self.bufs.get_mut(&b).expect("a buffer");
        buf.gc_count = 0;
        let (id, use_no) = (buf.id, buf.use_count + 1);
        if self.logs(DebugVerbosity::RECYCLES, p.pool) {
            tracing::info!(
                target: TARGET,
                "Reusing {}{} buffer #{id} of size {} at {:#x} (requested: {}, use#: {use_no}, retain#: {retain})",
                p.pool.storage_word(),
                p.pool.scalar_word(),
                self.fs(size),
                self.addr(b),
                self.fs(p.requested)
            );
        }
        self.fire(EventType::Recycled, self.addr(b), size);
        Ok(true)
    }

    /// `get_free_heap` (spec 4.2 step 7): the heap with the smallest
    /// available size that fits, taken out of the pool's heap set, or a new
    /// heap (`createHeapBlock`). `None` when the device refused.
    fn get_free_heap(
        &mut self,
        dev: &dyn Backend,
        p: &Params,
    ) -> Result<Option<SegmentId>, AllocError> {
        let pool = p.pool.index();
        if let Some(&key) = self.pools[pool]
            .heaps
            .range((p.size, 0, SegmentId::FIRST)..)
            .next()
        {
            self.pools[pool].heaps.remove(&key);
            return Ok(Some(key.2));
        }
        let xlarge = if self.unified {
            XLARGE_HEAP_UNIFIED
        } else {
            XLARGE_HEAP_DISCRETE
        };
        let (size, is_split) = if p.size <= MAX_SMALL_ALLOC {
            (SMALL_HEAP, true)
        } else if p.size < MIN_LARGE_ALLOC {
            (LARGE_HEAP, true)
        } else if p.size < xlarge / 2 && !p.pressure {
            (xlarge, true)
        } else {
            (align_up(p.size, ROUND_LARGE), false)
        };
        let size = align_up(size, self.alignment);
        let ptr = match dev.allocate(size, StreamId::DEFAULT) {
            Ok(ptr) => ptr,
            Err(BackendError::OutOfMemory { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let (h, _) =
            (self.store).new_segment(ptr.0, size, StreamId::DEFAULT, p.pool.pool_id(), None, true);
        self.next_heap_id += 1;
        self.heaps.insert(
            h,
            Heap {
                id: self.next_heap_id,
                is_split,
                n_buffers: 0,
                available: size,
                attached: true,
            },
        );
        self.total_allocated += size;
        let st = StatType::for_pool(p.pool.is_small());
        self.stats.segment.increase(st, 1);
        self.stats.reserved_bytes.increase(st, size);
        self.stats.num_device_alloc += 1;
        self.trace(TraceAction::SegmentAlloc, ptr.0, size);
        if self.debug.contains(DebugVerbosity::ALLOCATIONS) {
            tracing::info!(
                target: TARGET,
                "Allocated {} heap #{} of size {} (#heaps: {}, current allocated: {})",
                p.pool.storage_word(),
                self.next_heap_id,
                self.fs(size),
                self.pools[pool].heaps.len() + 1,
                self.fs(self.device_allocated(dev))
            );
        }
        Ok(Some(h))
    }

    /// `alloc_buffer` (spec 4.2 step 7): a new buffer in a heap.
    pub fn alloc_buffer(&mut self, dev: &dyn Backend, p: &mut Params) -> Result<bool, AllocError> {
        if self.max_total_allowed != u64::MAX
            && self.device_allocated(dev) + p.size > self.max_total_allowed
        {
            return Ok(false);
        }
        let Some(h) = self.get_free_heap(dev, p)? else {
            return Ok(false);
        };
        // First fit at the lowest free offset (Metal decides on real
        // hardware); the heap's available size guarantees a fit.
        let space = self
            .store
            .segment_blocks(h)
            .find(|&b| !self.store.block(b).allocated() && self.size(b) >= p.size)
            .expect("a heap with enough available space has a free range that fits");
        if self.size(space) > p.size {
            self.store.split_back(space, p.size, true);
        }
        self.store.hand_out(space, p.requested);
        self.next_buffer_id += 1;
        self.bufs.insert(
            space,
            Buffer {
                id: self.next_buffer_id,
                state: BufState::Available,
                requested: p.requested,
                use_count: 0,
                gc_count: 0,
                shape: Vec::new(),
                events: Vec::new(),
                event: None,
                awaiting_commit: false,
                handler: None,
            },
        );
        let addr = self.addr(space);
        self.ptrs.insert(addr, space);
        let heap = self.heaps.get_mut(&h).expect("a heap");
        heap.n_buffers += 1;
        let heap_id = heap.id;
        let available = self.free_range_max(h);
        self.heaps.get_mut(&h).expect("a heap").available = available;
        let key = self.heap_key(h);
        let pool = p.pool.index();
        self.pools[pool].heaps.insert(key);
        self.pools[pool].allocated_size += p.size;
        self.pools[pool].n_buffers += 1;
        p.found = Some(space);
        if self.logs(DebugVerbosity::ALLOCATIONS, p.pool) {
            tracing::info!(
                target: TARGET,
                "Allocated {}{} buffer #{} of size {} at {addr:#x} from heap #{heap_id} (requested: {}, heap: {}, total: {})",
                p.pool.storage_word(),
                p.pool.scalar_word(),
                self.next_buffer_id,
                self.fs(p.size),
                self.fs(p.requested),
                self.fs(available),
                self.fs(self.total_allocated)
            );
        }
        self.fire(EventType::Allocated, addr, p.size);
        Ok(true)
    }

    /// Spec 4.2 step 9: the found buffer is handed out.
    pub fn hand_out(&mut self, b: BlockId, requested: u64) -> DevicePtr {
        let size = self.size(b);
        let st = StatType::for_pool(self.pool_of(b).is_small());
        let buf = self.bufs.get_mut(&b).expect("a buffer");
        buf.state = BufState::InUse;
        buf.use_count += 1;
        buf.requested = requested;
        // Still handed out (a buffer's block stays allocated until freed).
        self.store.hand_out(b, requested);
        self.current_allocated += size;
        self.stats.allocation.increase(st, 1);
        self.stats.allocated_bytes.increase(st, size);
        self.stats.active.increase(st, 1);
        self.stats.active_bytes.increase(st, size);
        self.stats.requested_bytes.increase(st, requested);
        self.trace(TraceAction::Alloc, self.addr(b), requested);
        DevicePtr(self.addr(b))
    }

    /// The spec 4.2 step 8 message.
    pub fn oom_message(&self, dev: &dyn Backend, alloc_size: u64, pool: PoolKind) -> String {
        let mps = self.total_allocated;
        let other = self.device_allocated(dev).saturating_sub(mps);
        if self.high_ratio > 0.0 {
            format!(
                "MPS backend out of memory (MPS allocated: {}, other allocations: {}, max allowed: {}). \
                 Tried to allocate {} on {} pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable \
                 upper limit for memory allocations (may cause system failure).",
                self.fs(mps),
                self.fs(other),
                self.fs(self.max_total_allowed),
                self.fs(alloc_size),
                pool.storage_word()
            )
        } else {
            format!(
                "MPS backend out of memory (MPS allocated: {}, other allocations: {}). \
                 Tried to allocate {} on {} pool.",
                self.fs(mps),
                self.fs(other),
                self.fs(alloc_size),
                pool.storage_word()
            )
        }
    }
}
