//! Out of memory (spec 1.9): the error and its message, rendered for the
//! device kind, and the observers run after the lock is released.

use std::sync::Arc;

use super::malloc::{AllocParams, MallocError};
use super::state::DeviceState;
use crate::backend::Backend;
use crate::error::OutOfMemoryError;
use crate::format::format_size;
use crate::store::NIL;
use crate::trace::TraceAction;

/// Arguments of an out-of-memory observer (PyTorch's `OutOfMemoryObserver`):
/// device, bytes it tried to allocate, bytes allowed (limit or total), free bytes.
pub type OomObserver = Arc<dyn Fn(i8, u64, u64, u64) + Send + Sync>;

/// What a failed malloc hands back to the lock holder, so observers run
/// after the lock is released.
pub(crate) struct OomReport {
    pub error: OutOfMemoryError,
    pub observers: Vec<OomObserver>,
}

impl DeviceState {
    /// spec 1.9: build the out-of-memory error after every attempt failed.
    pub(super) fn out_of_memory<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &AllocParams,
        orig_size: u64,
    ) -> Result<OomReport, MallocError> {
        let info = backend.mem_info()?;
        self.record_trace(TraceAction::Oom, info.free, p.size, p.stream, p.pool, NIL);
        self.stats.num_ooms += 1;

        let allocated = self.stats.allocated_bytes.all().current as u64;
        let reserved = self.stats.reserved_bytes.all().current as u64;
        // Free cached blocks of private pools (none until private pools exist).
        let in_private_pools: u64 = self.pools[2..]
            .iter()
            .flat_map(|pool| pool.blocks.iter())
            .map(|k| k.size)
            .sum();
        let allowed_info = match self.allowed_memory_maximum {
            Some(a) => format!("{} allowed; ", format_size(a)),
            None => String::new(),
        };
        let private_msg = if in_private_pools > 0 {
            format!(
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                format_size(in_private_pools)
            )
        } else {
            String::new()
        };
        // torch 2.15: the advice depends on whether expandable segments are on.
        let advice = if self.config.expandable_segments {
            " expandable_segments is enabled. If instead the process is running out of virtual \
             address space (VSZ), expandable segments may be over-reserving VA (each segment \
             reserves ~9/8 of device memory, times the number of streams); reduce it via \
             PYTORCH_CUDA_ALLOC_CONF expandable_segments_reserve / \
             expandable_segments_reserve_by_class."
        } else {
            " If reserved but unallocated memory is large try setting \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
             documentation for Memory Management  \
             (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
        };
        let message = format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} \
             is free. {}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by \
             PyTorch but unallocated.{advice}",
            format_size(p.alloc_size),
            self.device,
            format_size(info.total),
            format_size(info.free),
            allowed_info,
            format_size(allocated + in_private_pools),
            private_msg,
            format_size(reserved.saturating_sub(allocated + in_private_pools)),
        );
        Ok(OomReport {
            error: OutOfMemoryError {
                message,
                device: self.device,
                requested: orig_size,
                alloc_size: p.alloc_size,
                stream: p.stream,
                device_free: info.free,
                device_total: info.total,
                allowed: self.allowed_memory_maximum,
            },
            observers: self.oom_observers.clone(),
        })
    }
}
