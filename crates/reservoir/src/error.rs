//! Errors of the allocators.

use crate::backend::{BackendError, DevicePtr, StreamId};

/// PyTorch's out-of-memory error, with the numbers behind its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfMemoryError {
    /// The exact text `torch.OutOfMemoryError` carries.
    pub message: String,
    /// Device index.
    pub device: i8,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// Bytes the allocator tried to obtain from the device (the segment size;
    /// this is what "Tried to allocate" prints).
    pub alloc_size: u64,
    /// Stream of the request.
    pub stream: StreamId,
    /// Free device memory reported when the allocation failed.
    pub device_free: u64,
    /// Device capacity.
    pub device_total: u64,
    /// The per-process limit, when a memory fraction is set.
    pub allowed: Option<u64>,
}

impl OutOfMemoryError {
    /// The PyTorch message text.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Why an allocator call failed. A failed call leaves every block and every
/// counter as it was, except where PyTorch itself changes them on the way to
/// an out-of-memory error (the retry chain releases cached memory and counts
/// the OOM). A free either completes or fails with
/// [`FreeFailed`](AllocError::FreeFailed), having freed nothing; a release
/// (`empty_cache`) releases every segment it can and returns the first
/// device error, what failed staying cached for the next call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// The device cannot hold the allocation even after releasing the cache.
    #[error("{}", .0.message)]
    OutOfMemory(Box<OutOfMemoryError>),
    /// The pointer was not handed out by this allocator, or was already freed.
    #[error(
        "pointer {ptr} was not allocated by this allocator or was already freed \
         (double free or foreign pointer); nothing was changed"
    )]
    InvalidPointer {
        /// The offending pointer.
        ptr: DevicePtr,
    },
    /// A free could not be done (the device failed to record an event for
    /// a stream that used the block): **nothing was freed**. Every block and
    /// every counter is as it was and the pointer is still allocated: free
    /// it again once the device recovers.
    #[error(
        "free of {ptr} failed, nothing was freed (the pointer is still allocated: \
         free it again once the device recovers): {source}"
    )]
    FreeFailed {
        /// The pointer that is still allocated.
        ptr: DevicePtr,
        /// What the device said.
        source: BackendError,
    },
    /// An argument is out of its valid range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device failed in a way releasing memory cannot fix.
    #[error("device error: {0}")]
    Backend(#[from] BackendError),
    /// The operation is refused in the allocator's current state.
    #[error("{0}")]
    InvalidState(String),
    /// The stream is not a stream of the allocator's device: never created
    /// there ([`Backend::create_stream`](crate::Backend::create_stream)),
    /// registered or adopted. Refused by the call that names it, which
    /// changes nothing.
    #[error("{message}; nothing was changed")]
    UnknownStream {
        /// The stream named.
        stream: StreamId,
        /// The device's words, naming the stream.
        message: String,
    },
}

impl AllocError {
    /// The error of a failed [`Backend::check_stream`](crate::Backend::check_stream)
    /// of `stream`: [`AllocError::UnknownStream`] for the backend's
    /// [`BackendError::InvalidValue`], the backend's error otherwise.
    pub(crate) fn from_stream_check(stream: StreamId, e: BackendError) -> AllocError {
        match e {
            BackendError::InvalidValue(message) => AllocError::UnknownStream { stream, message },
            e => AllocError::Backend(e),
        }
    }

    /// The out-of-memory details, if this is an out-of-memory error.
    pub fn as_oom(&self) -> Option<&OutOfMemoryError> {
        match self {
            AllocError::OutOfMemory(e) => Some(e),
            _ => None,
        }
    }
}
