//! The identifiers every layer shares: device addresses, streams, events,
//! memory pools and device indices.
//!
//! They live here, below every other module, so the backend contract, the
//! allocators and the observability layer can all name them without
//! importing each other.

use std::fmt;

/// A device index (`c10::DeviceIndex`).
pub type DeviceIndex = i8;

/// The kind of device an allocator serves: it decides the words of the
/// allocator's messages (PyTorch's out-of-memory message names CUDA and
/// "GPU n"; an MPS, OpenCL or host device says its own name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeviceKind {
    /// A CUDA GPU, or a device standing in for one (PyTorch's words).
    #[default]
    Cuda,
    /// An Apple GPU through Metal (PyTorch's MPS backend).
    Mps,
    /// An OpenCL device.
    OpenCl,
    /// Host memory.
    Host,
}

impl DeviceKind {
    /// The name messages give the backend ("CUDA", "MPS", "OpenCL", "Host").
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cuda => "CUDA",
            DeviceKind::Mps => "MPS",
            DeviceKind::OpenCl => "OpenCL",
            DeviceKind::Host => "Host",
        }
    }

    /// The word messages put before a device index ("GPU 0", "Device 0").
    pub fn device_noun(self) -> &'static str {
        match self {
            DeviceKind::Cuda | DeviceKind::Mps => "GPU",
            DeviceKind::OpenCl | DeviceKind::Host => "Device",
        }
    }
}

/// A device address. Addresses are plain integers to the allocator: policy
/// code never dereferences device memory.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
#[serde(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null pointer, returned for zero-byte allocations (as PyTorch does).
    pub const NULL: DevicePtr = DevicePtr(0);

    /// True for the null pointer.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

impl fmt::Debug for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A stream: an ordered queue of device work.
///
/// The value is the backend's handle (for CUDA, the `cudaStream_t` pointer
/// value). Free blocks are ordered by it, exactly as PyTorch orders them by
/// the stream pointer, so replays that map recorded stream values one to one
/// reproduce PyTorch's tie-breaking. `StreamId(0)` is the default stream.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
#[serde(transparent)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (legacy) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Debug for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {}", self.0)
    }
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// An event recorded on a stream: complete when the work before it is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct EventId(pub u64);

/// Identifies a memory pool (`c10::MempoolId_t`): `(0, 0)` is the default
/// pool; private pools (CUDA-graph style) have a non-zero half.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct MempoolId(pub u64, pub u64);

impl MempoolId {
    /// The default pool.
    pub const DEFAULT: MempoolId = MempoolId(0, 0);

    /// True for the default pool.
    pub fn is_default(self) -> bool {
        self == MempoolId::DEFAULT
    }
}
