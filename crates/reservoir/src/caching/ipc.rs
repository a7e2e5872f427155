//! Sharing blocks with other processes (spec 1.16): PyTorch's
//! `shareIpcHandle` on the sending side, `getIpcDevPtr` on the receiving
//! side, over the backend's [`Ipc`](crate::backend::Ipc) capability.
//!
//! A block is shared as the handle of its whole segment plus the block's
//! offset in it (PyTorch's `'c'` handles: the `cudaIpcMemHandle` of the
//! segment base and `offset = ptr - base`). Blocks of expandable segments
//! cannot be shared (PyTorch's `'e'` handles pass one file descriptor per
//! page; not implemented here): the error is PyTorch's message.
//!
//! The receiver keeps the segments it opened keyed by the handle bytes, as
//! PyTorch's `ipcMemHandle_to_devptr` does: a handle opened twice maps once
//! (a driver opens a handle only once per process) and is closed when the
//! last user closes it. Dropping the allocator closes what is still open.

use std::collections::HashMap;

use super::CachingAllocator;
use crate::backend::{Backend, BackendError, DevicePtr, Ipc};
use crate::error::AllocError;

/// What another process needs to reach a block: its segment's handle and
/// its offset in the segment (PyTorch's `(offset, handle)` pair).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IpcShare {
    /// The backend's handle of the block's segment (opaque bytes).
    pub handle: Vec<u8>,
    /// The block's offset from the segment's base.
    pub offset: u64,
    /// The segment's size in bytes.
    pub segment_size: u64,
}

/// Segments this allocator opened from other processes' handles.
#[derive(Default)]
pub(super) struct OpenedSegments {
    /// Handle bytes -> (base in this process, users).
    by_handle: HashMap<Vec<u8>, (DevicePtr, u32)>,
}

fn ipc_of<B: Backend>(backend: &B) -> Result<&dyn Ipc, AllocError> {
    backend.as_ipc().ok_or_else(|| {
        AllocError::Backend(BackendError::Unsupported {
            backend: backend.name(),
            what: "inter-process memory handles (IPC)",
        })
    })
}

/// Sharing blocks with other processes (spec 1.16): exporting a block's
/// segment handle, and opening and closing other processes' handles.
impl<B: Backend> CachingAllocator<B> {
    /// The handle another process opens to reach the allocated block at
    /// `ptr`: its segment's handle and offset (PyTorch's `shareIpcHandle`).
    /// The block must stay allocated while it is shared. A pointer this
    /// allocator did not hand out is [`AllocError::InvalidPointer`]; a block
    /// of an expandable segment is [`AllocError::InvalidState`] with
    /// PyTorch's message; a backend without the capability is
    /// [`BackendError::Unsupported`].
    pub fn share_ipc_handle(&self, ptr: DevicePtr) -> Result<IpcShare, AllocError> {
        // Under the lock: the segment cannot be released (and its address
        // reused by a new one) between the lookup and the export.
        let state = self.state.lock();
        let Some(&id) = state.allocated.get(&ptr.0) else {
            return Err(AllocError::InvalidPointer { ptr });
        };
        let (base, size) = state.base_allocation(id)?;
        let handle = ipc_of(&self.backend)?.export_segment(DevicePtr(base))?;
        drop(state);
        Ok(IpcShare {
            handle,
            offset: ptr.0 - base,
            segment_size: size,
        })
    }

    /// Map the segment behind a handle from another process and return its
    /// base address here (PyTorch's `getIpcDevPtr`); add the
    /// [`IpcShare::offset`] to reach the block. Opening the same handle
    /// again returns the same address and counts one more user. The memory
    /// is not this allocator's: it never hands it out, and its statistics
    /// do not count it.
    pub fn open_ipc_handle(&self, handle: &[u8]) -> Result<DevicePtr, AllocError> {
        let mut opened = self.ipc_opened.lock();
        if let Some((base, users)) = opened.by_handle.get_mut(handle) {
            *users += 1;
            return Ok(*base);
        }
        let (base, _) = ipc_of(&self.backend)?.open_segment(handle)?;
        opened.by_handle.insert(handle.to_vec(), (base, 1));
        Ok(base)
    }

    /// Drop one user of a handle opened with
    /// [`open_ipc_handle`](Self::open_ipc_handle); the last one unmaps the
    /// segment. A handle not open here is [`AllocError::InvalidArgument`].
    pub fn close_ipc_handle(&self, handle: &[u8]) -> Result<(), AllocError> {
        let mut opened = self.ipc_opened.lock();
        let Some((base, users)) = opened.by_handle.get_mut(handle) else {
            return Err(AllocError::InvalidArgument(format!(
                "IPC handle of {} bytes is not open in this allocator",
                handle.len()
            )));
        };
        if *users > 1 {
            *users -= 1;
            return Ok(());
        }
        let base = *base;
        ipc_of(&self.backend)?.close_segment(base)?;
        opened.by_handle.remove(handle);
        Ok(())
    }

    /// Close every segment still opened from another process (teardown).
    pub(super) fn close_opened_segments(&mut self) -> Vec<BackendError> {
        let opened = std::mem::take(&mut self.ipc_opened.get_mut().by_handle);
        let Some(ipc) = self.backend.as_ipc() else {
            return Vec::new();
        };
        opened
            .into_values()
            .filter_map(|(base, _)| ipc.close_segment(base).err())
            .collect()
    }
}
