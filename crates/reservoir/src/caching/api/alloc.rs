//! [`CachingAllocator`]'s allocating and freeing methods.

use std::sync::atomic::Ordering;

use super::super::request::MallocError;
use super::super::{level_u8, Allocation, CachingAllocator};
use crate::backend::{Backend, DevicePtr, StreamId};
use crate::error::AllocError;
use crate::observe::callbacks::{AllocatorEvent, EventType};
use crate::observe::trace::{Context, RecordContext};

/// Allocating and freeing: PyTorch's `raw_alloc_with_stream` /
/// `raw_delete`, an owning [`Allocation`], and `recordStream` for blocks
/// used on more than their allocation stream. A failed call changes
/// nothing (see [`AllocError`]).
impl<B: Backend> CachingAllocator<B> {
    /// Allocate `size` bytes for use on `stream` (PyTorch's
    /// `raw_alloc_with_stream`). A zero-byte request returns
    /// [`DevicePtr::NULL`] and allocates nothing.
    #[inline]
    pub fn raw_alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if size == 0 {
            return Ok(DevicePtr::NULL);
        }
        if self.record_level.load(Ordering::Relaxed) != 0 {
            let ctx = self.gather(RecordContext::State);
            return self.malloc_with(size, stream, ctx);
        }
        let mut state = self.state.lock();
        match state.malloc(&self.backend, size, stream) {
            Ok(id) => Ok(DevicePtr(state.store.block(id).addr())),
            Err(e) => {
                drop(state);
                self.malloc_failed(e)
            }
        }
    }

    pub(in crate::caching) fn malloc_with(
        &self,
        size: u64,
        stream: StreamId,
        ctx: Option<Context>,
    ) -> Result<DevicePtr, AllocError> {
        let mut state = self.state.lock();
        let had = ctx.is_some();
        if had {
            state.obs.set_current_context(ctx);
        }
        let r = state.malloc(&self.backend, size, stream);
        if had {
            state.obs.set_current_context(None);
        }
        match r {
            Ok(id) => Ok(DevicePtr(state.store.block(id).addr())),
            Err(e) => {
                drop(state);
                self.malloc_failed(e)
            }
        }
    }

    /// [`raw_alloc`](Self::raw_alloc) that returns `Ok(None)` instead of
    /// reporting an out-of-memory failure (nothing is counted, recorded or
    /// observed for it), for [`StreamShards`] to reclaim other shards'
    /// caches first.
    pub(crate) fn raw_alloc_or_would_oom(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<Option<DevicePtr>, AllocError> {
        if size == 0 {
            return Ok(Some(DevicePtr::NULL));
        }
        let ctx = self.gather(RecordContext::State);
        let r = self.with_context(ctx, |state| {
            state
                .malloc_or_would_oom(&self.backend, size, stream)
                .map(|id| DevicePtr(state.store.block(id).addr()))
        });
        match r {
            Ok(ptr) => Ok(Some(ptr)),
            Err(MallocError::WouldOom) => Ok(None),
            Err(e) => self.malloc_failed(e).map(Some),
        }
    }

    /// A failed malloc, after the lock is released: out-of-memory
    /// observers, then `AllocationFailed` callbacks.
    #[cold]
    fn malloc_failed(&self, e: MallocError) -> Result<DevicePtr, AllocError> {
        match e {
            MallocError::Other(e) => Err(e),
            MallocError::WouldOom => Err(e.into()),
            MallocError::Oom(report) => {
                let e = report.error;
                let limit = e.allowed.unwrap_or(e.device_total);
                for obs in &report.observers {
                    obs(e.device, e.alloc_size, limit, e.device_free);
                }
                self.callbacks.fire(&AllocatorEvent {
                    event: EventType::AllocationFailed,
                    device: e.device,
                    ptr: DevicePtr::NULL,
                    size: e.requested,
                    stream: e.stream,
                });
                Err(AllocError::OutOfMemory(Box::new(e)))
            }
        }
    }

    /// Free a pointer returned by [`raw_alloc`](Self::raw_alloc). Freeing
    /// null is a no-op; a pointer this allocator did not hand out (or already
    /// freed) is an [`AllocError::InvalidPointer`] and changes nothing.
    #[inline]
    pub fn raw_free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        if self.record_level.load(Ordering::Relaxed) >= level_u8(RecordContext::All) {
            let ctx = self.gather(RecordContext::All);
            return self.with_context(ctx, |state| state.free_ptr(&self.backend, ptr));
        }
        self.state.lock().free_ptr(&self.backend, ptr)
    }

    /// Free `ptr` after synchronising the device, for a caller that cannot
    /// keep the pointer when [`raw_free`](Self::raw_free) fails with
    /// [`AllocError::FreeFailed`] (the device could not record an event on
    /// a stream that used the block, `record_stream`): once every stream's
    /// work is done no stream uses the block, and it is freed without
    /// recording any event. The synchronisation (`synchronize_device`, with
    /// the allocator's lock not held) waits for all the device's work: a
    /// slow path, for that failure only. Null is a no-op; a pointer this
    /// allocator did not hand out (or already freed) is
    /// [`AllocError::InvalidPointer`], checked before synchronising; a
    /// failed synchronisation is [`AllocError::Backend`] and frees nothing.
    #[cold]
    pub fn free_after_sync(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        if self.state.lock().allocated.get(&ptr.0).is_none() {
            return Err(AllocError::InvalidPointer { ptr });
        }
        self.backend.synchronize_device()?;
        let ctx = self.gather(RecordContext::All);
        self.with_context(ctx, |state| state.free_ptr_after_sync(&self.backend, ptr))
    }

    /// Allocate and return an owning handle that frees on drop.
    pub fn alloc(&self, size: u64, stream: StreamId) -> Result<Allocation<'_, B>, AllocError> {
        let ptr = self.raw_alloc(size, stream)?;
        Ok(Allocation {
            allocator: self,
            ptr,
            size,
        })
    }

    /// Mark the block at `ptr` as used by `stream` (PyTorch's
    /// `recordStream`): when freed, it is not reused until the work enqueued
    /// on `stream` so far has completed. Ignored for the allocation stream.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        state.check_stream(&self.backend, stream)?;
        state.record_stream(id, stream);
        Ok(())
    }
}
