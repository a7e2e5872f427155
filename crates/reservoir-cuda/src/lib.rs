//! # reservoir-cuda: a CUDA device for Reservoir
//!
//! [`CudaDevice`] is a [`reservoir::Backend`] over the CUDA driver API,
//! reached through [cudarc](https://docs.rs/cudarc) with dynamic loading:
//! nothing CUDA is needed to build, `libcuda` is opened at run time, and a
//! machine without a driver gets a typed [`CudaError`] from
//! [`CudaDevice::new`], never a panic.
//!
//! ## The model (what PyTorch's `CUDACachingAllocator` does)
//!
//! * **Context.** The device's primary context
//!   (`cuDevicePrimaryCtxRetain`), the one the CUDA runtime and PyTorch
//!   use. Every call makes it current on the calling thread first
//!   (`cuCtxSetCurrent`, as PyTorch's device guard does).
//! * **Segments** ([`Backend::allocate`] / [`Backend::free`]) are
//!   `cuMemAlloc_v2` / `cuMemFree_v2`: synchronous, like the `cudaMalloc`
//!   / `cudaFree` of PyTorch, not cudarc's stream-ordered pool allocator.
//!   Out of memory is the retryable [`BackendError::OutOfMemory`] (with
//!   `cuMemGetInfo`'s free bytes); other failures are typed by kind
//!   (`InvalidValue`, `DeviceLost`, `Unsupported`, `Driver`) and carry the
//!   call and the driver's error name (`cuMemFree_v2:
//!   CUDA_ERROR_INVALID_VALUE (invalid argument)`). `cudaFree` waits for
//!   the device on a GPU; `free` makes that explicit with
//!   `cuCtxSynchronize` first, so it holds on every driver (the fake one
//!   does not wait by itself). Frees name a live segment with its size, or
//!   are refused before the driver sees them.
//! * **Streams.** A [`StreamId`] is the raw `CUstream` handle value,
//!   because PyTorch orders free blocks by the stream pointer;
//!   `StreamId(0)` is the legacy default stream. [`Backend::create_stream`]
//!   makes a `CU_STREAM_NON_BLOCKING` stream (as PyTorch's stream pool
//!   does), destroyed with the device. A stream made elsewhere (PyTorch's
//!   `cudaStream_t`) is used after [`CudaDevice::adopt_stream`]; unknown
//!   stream ids are refused.
//! * **Events** are `CU_EVENT_DISABLE_TIMING` events, pooled: destroyed
//!   ones go back to a free list and are recorded again.
//!   [`Backend::query_event`] never blocks (`CUDA_ERROR_NOT_READY` is
//!   `false`); [`Backend::stream_wait_event`] is `cuStreamWaitEvent`.
//! * **Virtual memory** ([`VirtualMemory`], for expandable segments):
//!   `cuMemAddressReserve`, then one physical handle per page of
//!   `cuMemGetAllocationGranularity` bytes (`cuMemCreate` + `cuMemMap` +
//!   `cuMemSetAccess`), so any page range can be unmapped again
//!   (`cuMemUnmap` + `cuMemRelease`), as PyTorch's `ExpandableSegment`
//!   does; `cuMemAddressFree` releases the reservation. Offered when the
//!   device reports `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`.
//! * **Copies** ([`Memcpy`]): `cuMemcpyDtoDAsync_v2` on the stream.
//! * **IPC and peers** (inherent methods): [`CudaDevice::ipc_get_handle`],
//!   [`CudaDevice::ipc_open`], [`CudaDevice::ipc_close`]
//!   (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle_v2` /
//!   `cuIpcCloseMemHandle`; an opened mapping's size comes from
//!   `cuMemGetAddressRange_v2`); [`CudaDevice::can_access_peer`] and
//!   [`CudaDevice::enable_peer_access`], which answer
//!   [`BackendError::Unsupported`] where the driver says peer access is
//!   impossible.
//! * **Work for tests** (the [`DeviceWork`] and [`Memcpy`] capabilities,
//!   which the stream-safety scenarios of `reservoir_testkit::conformance`
//!   drive: [`DeviceWork::fill`], [`Memcpy::copy`]; and [`CudaDevice::read`]):
//!   `cuMemsetD8Async`, `cuMemcpyDtoDAsync_v2`, `cuMemcpyDtoHAsync_v2` +
//!   `cuStreamSynchronize`. Every range is checked to lie in one live
//!   segment, one IPC mapping or mapped pages of one reservation before the
//!   driver sees it. [`DeviceWork::hold`] and [`DeviceWork::release`] keep a
//!   stream busy; they need the fake driver's hooks ([`CudaDevice::fake`]).
//!
//! ## Testing without a GPU
//!
//! The tests run against the fake CUDA driver of `../shared/oracle` (a
//! `libcuda.so.1` whose device memory is host memory, with a settable
//! capacity, an asynchronous stream mode and a cross-stream sanitizer):
//!
//! ```sh
//! ../shared/oracle/build-driver.sh          # once; idempotent, about 10 s
//! ../shared/oracle/with-fake-driver cargo test -p reservoir-cuda
//! ```
//!
//! `build-driver.sh` needs `gcc`, `g++`, `nm` and `python3` with `pip` (it
//! downloads two small CUDA header wheels from PyPI once); it builds into
//! `$HOME/.cache/pytorch-oracle/lib`, and `with-fake-driver` puts that on
//! `LD_LIBRARY_PATH`. Without a driver on the library path the tests print
//! a line starting with `SKIPPED-BACKEND` and pass (CI fails on that line).
//!
//! What the tests check (`tests/cuda/`): the backend contract directly
//! (segments and out-of-memory at a capacity set with the fake's
//! [`FakeDriver::set_total_mem`], events pending on a held stream, the
//! event pool, adopted streams, page-by-page mapping, copies, IPC export
//! and a second process importing it, peer access refused, a typed error
//! in a child process without a driver); the caching allocator in PyTorch
//! mode (caching, free-and-retry after out of memory, `empty_cache`,
//! expandable segments, `record_stream` across streams); and the
//! stream-safety scenarios of `reservoir_testkit::conformance` (a held stream's
//! block is not reused until the stream completes, a randomized
//! 10,000-operation multi-stream integrity run, and a negative control
//! without `record_stream`), in the default mode and with the fake's
//! asynchronous streams and sanitizer on ([`FakeDriver::set_async`],
//! [`FakeDriver::set_sanitize`]), where the integrity runs must produce no
//! sanitizer report and the negative control must produce one. The
//! integrity runs print `cuda integrity...` lines to stderr, which CI
//! requires.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

mod device;
mod driver;
mod fake;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod vm;
mod work;

pub use device::{CudaDevice, IpcMemHandle};
pub use fake::FakeDriver;
pub use reservoir::backend::{
    Backend, BackendError, DevicePtr, DeviceWork, EventId, MemInfo, Memcpy, Reservation, StreamId,
    VirtualMemory,
};
pub use reservoir::checksum::{checksum, checksum_of_fill};

/// The raw stream handle type [`CudaDevice::adopt_stream`] takes.
pub use cudarc::driver::sys::CUstream;

/// The backend's name in messages.
pub const NAME: &str = "cuda";

/// Why a [`CudaDevice`] could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library could be loaded (no NVIDIA driver installed,
    /// or the fake driver is not on `LD_LIBRARY_PATH`).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// The driver library lacks an entry point this crate calls (a driver
    /// too old, or an incomplete fake).
    #[error("the CUDA driver {library} lacks {symbol}")]
    MissingSymbol {
        /// The library file that was loaded.
        library: String,
        /// The missing entry point.
        symbol: &'static str,
    },
    /// The driver has no device of this ordinal.
    #[error("no CUDA device {ordinal} ({count} device(s))")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// Devices the driver reports.
        count: i32,
    },
    /// A driver call failed during set-up.
    #[error("CUDA set-up failed: {0}")]
    Setup(#[source] BackendError),
}
