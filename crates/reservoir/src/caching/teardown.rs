//! Tearing an allocator down: every segment goes back to the backend.
//!
//! PyTorch never destroys its process-wide allocator; a Reservoir allocator
//! is an ordinary value (and a C handle that is destroyed), so dropping it
//! must give its memory back. [`DeviceState::teardown`] runs from
//! [`CachingAllocator`](super::CachingAllocator)'s `Drop` and from
//! [`close`](super::CachingAllocator::close):
//!
//! 1. pending cross-stream events are synchronised and destroyed (their
//!    blocks become free);
//! 2. blocks still allocated are reported (`tracing` warning with their
//!    count, bytes and first addresses);
//! 3. the device is synchronised once, so no queued work still touches the
//!    memory;
//! 4. every segment is freed, expandable ones unmapped page run by page run
//!    and their reservation released, **including segments that hold live
//!    blocks**.
//!
//! Why release live blocks rather than leak them: after the allocator is
//! gone nothing can free them any more (a pointer can only be freed through
//! the allocator that handed it out), so leaking would keep the memory
//! until the process ends, and a C caller that destroys a handle expects its
//! memory back. Safe Rust cannot hold an [`Allocation`](super::Allocation)
//! past the allocator it borrows; a raw pointer kept past the drop is a
//! use-after-free on the caller's side, which the warning names.
//!
//! A backend error does not stop the teardown: the remaining segments are
//! still released and the errors are reported. Nothing here runs on the
//! allocation hot path.

use super::state::DeviceState;
use crate::backend::{Backend, BackendError, DevicePtr};
use crate::observe::debug::TARGET;
use crate::store::Expandable;

/// How many live block addresses the warning lists.
const LISTED_LIVE_BLOCKS: usize = 8;

/// What tearing an allocator down found and gave back (see
/// [`CachingAllocator::close`](super::CachingAllocator::close)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TeardownReport {
    /// Segments given back to the backend (expandable segments count once).
    pub segments_released: u64,
    /// Bytes given back: segment sizes, mapped bytes of expandable segments.
    pub bytes_released: u64,
    /// Blocks still allocated by callers when the allocator was torn down;
    /// their segments were released too.
    pub live_blocks: u64,
    /// Bytes of those blocks (rounded block sizes).
    pub live_bytes: u64,
    /// Lowest addresses of the live blocks (at most eight).
    pub live_addresses: Vec<DevicePtr>,
    /// Backend errors met on the way (the teardown went on after each).
    pub errors: Vec<BackendError>,
}

impl TeardownReport {
    /// True when every block had been freed and the backend reported no error.
    pub fn is_clean(&self) -> bool {
        self.live_blocks == 0 && self.errors.is_empty()
    }
}

impl DeviceState {
    /// Give every segment back to `backend` and leave the state empty (a
    /// second call finds nothing). See the module documentation.
    pub(super) fn teardown<B: Backend + ?Sized>(&mut self, backend: &B) -> TeardownReport {
        let mut report = TeardownReport::default();
        if !self.events.is_idle() {
            if let Err(e) = self.synchronize_and_free_events(backend, None) {
                report.errors.push(e);
            }
        }
        self.note_live_blocks(&mut report);
        let live_segments = self.store.segment_count();
        if live_segments > 0 {
            if let Err(e) = backend.synchronize_device() {
                report.errors.push(e);
            }
        }
        for (_, seg) in self.store.live_segments() {
            let released = match seg.expandable() {
                // `MemPool(allocator=...)`: back to the pool's allocator.
                None => match self.pool_allocator(seg.pool()) {
                    Some(a) => a.raw_delete(DevicePtr(seg.addr())).map_err(|e| {
                        BackendError::InvalidValue(format!("{}: {e}", DevicePtr(seg.addr())))
                    }),
                    None => backend.free(DevicePtr(seg.addr()), seg.size()),
                }
                .map(|()| seg.size()),
                Some(e) => release_expandable(backend, e),
            };
            match released {
                Ok(bytes) => {
                    report.segments_released += 1;
                    report.bytes_released += bytes;
                }
                Err(e) => report.errors.push(e),
            }
        }
        let fresh = DeviceState::new(self.device, self.config.clone());
        *self = fresh;
        report
    }

    fn note_live_blocks(&self, report: &mut TeardownReport) {
        let mut addrs: Vec<u64> = self.allocated.keys().copied().collect();
        report.live_blocks = addrs.len() as u64;
        if addrs.len() > LISTED_LIVE_BLOCKS {
            addrs.select_nth_unstable(LISTED_LIVE_BLOCKS);
            addrs.truncate(LISTED_LIVE_BLOCKS);
        }
        addrs.sort_unstable();
        report.live_bytes = self
            .allocated
            .values()
            .map(|&id| self.store.block(id).size())
            .sum();
        report.live_addresses = addrs.into_iter().map(DevicePtr).collect();
    }
}

/// Unmap every mapped run of pages of an expandable segment, then release
/// its reservation. Returns the bytes that were mapped.
fn release_expandable<B: Backend + ?Sized>(
    backend: &B,
    e: &Expandable,
) -> Result<u64, BackendError> {
    let Some(vm) = backend.as_virtual_memory() else {
        return Err(BackendError::Unsupported {
            backend: backend.name(),
            what: "virtual memory (releasing an expandable segment)",
        });
    };
    e.release(vm)
}

/// Log what a teardown found: a warning for live blocks or errors, a
/// debug line otherwise.
pub(super) fn log_teardown(device: i8, backend: &str, report: &TeardownReport) {
    if report.live_blocks > 0 {
        tracing::warn!(
            target: TARGET,
            device,
            live_blocks = report.live_blocks,
            live_bytes = report.live_bytes,
            "caching allocator on device {device} ({backend} backend) dropped while {} blocks \
             ({} bytes) were still allocated, first at {:?}; their segments were released, so \
             any pointer still held is dangling. Free every block before dropping the allocator.",
            report.live_blocks,
            report.live_bytes,
            report.live_addresses,
        );
    }
    for e in &report.errors {
        tracing::warn!(
            target: TARGET,
            device,
            "caching allocator on device {device} ({backend} backend): the backend failed while \
             the allocator was torn down: {e}; the remaining segments were still released"
        );
    }
    tracing::debug!(
        target: TARGET,
        device,
        segments = report.segments_released,
        bytes = report.bytes_released,
        "caching allocator torn down"
    );
}
