//! Out of memory (spec 1.9): the error and its message, rendered for the
//! device kind, and the observers run after the lock is released.

use super::request::{AllocParams, MallocError, OomReport};
use super::state::DeviceState;
use crate::backend::Backend;
use crate::config::ExpandableOomAdvice;
use crate::error::{AllocError, OutOfMemoryError};
use crate::format::format_size;
use crate::ids::{DeviceKind, StreamId};
use crate::observe::trace::TraceAction;

impl DeviceState {
    /// spec 1.5: a request of 1 EB or more fails before anything is tried.
    #[cold]
    pub(super) fn too_large(
        &self,
        kind: DeviceKind,
        orig_size: u64,
        stream: StreamId,
    ) -> MallocError {
        MallocError::Other(AllocError::OutOfMemory(Box::new(OutOfMemoryError {
            message: format!(
                "{} out of memory. Tried to allocate more than 1EB memory.",
                kind.name()
            ),
            device: self.device,
            requested: orig_size,
            alloc_size: orig_size,
            stream,
            device_free: 0,
            device_total: 0,
            allowed: self.acct.allowed_memory_maximum(),
        })))
    }

    /// spec 1.9: build the out-of-memory error after every attempt failed.
    pub(super) fn out_of_memory<B: Backend + ?Sized>(
        &mut self,
        backend: &B,
        p: &AllocParams,
        orig_size: u64,
    ) -> Result<OomReport, MallocError> {
        let info = backend.mem_info()?;
        self.record_trace(TraceAction::Oom, info.free, p.size, p.stream, p.pool, None);
        self.acct.oom();

        let allocated = self.acct.allocated_bytes();
        let reserved = self.acct.reserved_bytes();
        let alloc_size = p.alloc_size(&self.config);
        // Free cached blocks of private pools (none until private pools exist).
        let in_private_pools: u64 = self.pools[2..]
            .iter()
            .flat_map(|pool| pool.iter())
            .map(|k| k.size)
            .sum();
        let message = render_message(
            backend.device_kind(),
            &OomFacts {
                alloc_size,
                device: self.device,
                total: info.total,
                free: info.free,
                allowed: self.acct.allowed_memory_maximum(),
                allocated,
                reserved,
                in_private_pools,
                expandable_segments: self.config.expandable_segments,
                advice: self.config.torch_release.rules().expandable_oom_advice,
            },
        );
        Ok(OomReport {
            error: OutOfMemoryError {
                message,
                device: self.device,
                requested: orig_size,
                alloc_size,
                stream: p.stream,
                device_free: info.free,
                device_total: info.total,
                allowed: self.acct.allowed_memory_maximum(),
            },
            observers: self.obs.oom_observers(),
        })
    }
}

/// What the out-of-memory message reports.
struct OomFacts {
    /// Bytes the failed driver allocation asked for.
    alloc_size: u64,
    device: i8,
    /// Device memory, total and free.
    total: u64,
    free: u64,
    /// The per-process limit, if any.
    allowed: Option<u64>,
    /// `allocated_bytes` and `reserved_bytes`, all pools, now.
    allocated: u64,
    reserved: u64,
    /// Free cached bytes of private pools.
    in_private_pools: u64,
    expandable_segments: bool,
    /// The advice of the release when expandable segments are on.
    advice: ExpandableOomAdvice,
}

/// PyTorch's out-of-memory message (torch 2.15), in the words of the
/// device kind: for [`DeviceKind::Cuda`] it is PyTorch's text byte for byte.
fn render_message(kind: DeviceKind, f: &OomFacts) -> String {
    let allowed_info = match f.allowed {
        Some(a) => format!("{} allowed; ", format_size(a)),
        None => String::new(),
    };
    let private_msg = if f.in_private_pools > 0 {
        format!(
            "with {} allocated in private pools (e.g., CUDA Graphs), ",
            format_size(f.in_private_pools)
        )
    } else {
        String::new()
    };
    // The advice depends on whether expandable segments are on, and with
    // them on on the release (ReleaseRules::expandable_oom_advice).
    let advice = if f.expandable_segments && f.advice == ExpandableOomAdvice::Nothing {
        ""
    } else if f.expandable_segments && f.advice == ExpandableOomAdvice::VirtualAddressSpace {
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
    format!(
        "{} out of memory. Tried to allocate {}. {} {} has a total capacity of {} of which {} \
         is free. {}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by \
         PyTorch but unallocated.{advice}",
        kind.name(),
        format_size(f.alloc_size),
        kind.device_noun(),
        f.device,
        format_size(f.total),
        format_size(f.free),
        allowed_info,
        format_size(f.allocated + f.in_private_pools),
        private_msg,
        format_size(f.reserved.saturating_sub(f.allocated + f.in_private_pools)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> OomFacts {
        OomFacts {
            alloc_size: 2 << 20,
            device: 1,
            total: 8 << 30,
            free: 1 << 20,
            allowed: None,
            allocated: 6 << 30,
            reserved: 7 << 30,
            in_private_pools: 0,
            expandable_segments: false,
            advice: ExpandableOomAdvice::VirtualAddressSpace,
        }
    }

    #[test]
    fn the_message_names_the_device_kind() {
        let cuda = render_message(DeviceKind::Cuda, &facts());
        assert!(cuda.starts_with("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 1 has"));
        let opencl = render_message(DeviceKind::OpenCl, &facts());
        assert!(
            opencl.starts_with("OpenCL out of memory. Tried to allocate 2.00 MiB. Device 1 has")
        );
        assert_eq!(
            cuda.split_once(" has ").unwrap().1,
            opencl.split_once(" has ").unwrap().1
        );
    }
}
