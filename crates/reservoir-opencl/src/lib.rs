//! # reservoir-opencl: an OpenCL device for Reservoir
//!
//! [`OpenClDevice`] is a [`reservoir::Backend`] over a real device API,
//! written and tested on PoCL (the portable OpenCL implementation that runs
//! on the CPU), so the caching allocator's stream safety is exercised by a
//! real asynchronous runtime in CI.
//!
//! ## The model
//!
//! * **Memory** is shared virtual memory: [`Backend::allocate`] is
//!   `clSVMAlloc` (coarse-grained buffers by default, fine-grained when
//!   [`OpenClConfig::fine_grained`] is set and the device has them). SVM
//!   pointers are plain addresses, so the allocator splits segments by
//!   pointer arithmetic and every [`DevicePtr`] is usable in
//!   `clEnqueueSVM*` calls and kernels.
//! * **Budget.** PoCL never reports out of memory (it allocates host memory
//!   lazily), so the device keeps its own [`OpenClConfig::capacity`]: an
//!   allocation over it fails with the retryable
//!   [`BackendError::OutOfMemory`], and [`Backend::mem_info`] reports it as
//!   the total. A null `clSVMAlloc` is reported the same way.
//! * **Streams** are in-order command queues, one per stream; stream 0 is
//!   the device's default queue.
//! * **Events** are markers (`clEnqueueMarkerWithWaitList`); a query reads
//!   the marker's status without blocking (the queue is flushed when the
//!   marker is enqueued so that it makes progress).
//!   [`Backend::stream_wait_event`] enqueues a barrier waiting for the
//!   marker.
//! * **Frees** wait for every queue first (`clFinish`), as `cudaFree`
//!   synchronises the device, because `clSVMFree` does not wait for
//!   commands still using the memory. While a stream is held, a free (and a
//!   device synchronisation) is refused with [`BackendError::InvalidValue`]
//!   instead of waiting forever.
//! * **Work for tests** (the [`DeviceWork`] and [`Memcpy`] capabilities,
//!   [`DeviceWork::fill`], [`Memcpy::copy`], and
//!   [`OpenClDevice::checksum`]):
//!   `clEnqueueSVMMemFill`, `clEnqueueSVMMemcpy` (device to device, or a
//!   blocking copy to host memory for checksums). Every range is checked to
//!   lie inside one live allocation before anything is enqueued.
//!   [`DeviceWork::hold`] keeps a queue busy behind a user event until
//!   [`DeviceWork::release`].
//! * **Host access** ([`HostWrite`], [`HostMapping`]): SVM pointers are host
//!   addresses, so the MPS heap allocator's shared buffer pointers and
//!   scalar buffers with a value work here ([`OpenClDevice::write`]).
//!
//! PoCL runs its CPU device on a thread pool as large as the machine; set
//! `POCL_MAX_PTHREAD_COUNT` before the first OpenCL call to limit it
//! ([`limit_pocl_threads`] does that for tests and benchmarks).
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Once;

use opencl3::command_queue::CommandQueue;
use opencl3::context::Context;
use opencl3::device::{
    Device, CL_DEVICE_SVM_COARSE_GRAIN_BUFFER, CL_DEVICE_SVM_FINE_GRAIN_BUFFER, CL_DEVICE_TYPE_ALL,
};
use opencl3::event::{Event, CL_COMPLETE};
use opencl3::memory::{CL_MEM_READ_WRITE, CL_MEM_SVM_FINE_GRAIN_BUFFER};
use opencl3::types::{cl_event, CL_BLOCKING, CL_NON_BLOCKING};
use parking_lot::Mutex;

pub use reservoir::backend::{
    Backend, BackendError, DevicePtr, DeviceWork, EventId, HostMapping, HostWrite, MemInfo, Memcpy,
    StreamId,
};
use reservoir::checksum::checksum;

/// The backend's name in messages.
pub const NAME: &str = "opencl";

/// Default budget: 1 GiB, or half the device's global memory if smaller.
pub const DEFAULT_CAPACITY: u64 = 1 << 30;

/// Set `POCL_MAX_PTHREAD_COUNT` to `threads` (unless already set) before the
/// first OpenCL call of the process. Only the first call has an effect.
/// Call it before creating any thread that reads the environment.
pub fn limit_pocl_threads(threads: u32) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("POCL_MAX_PTHREAD_COUNT").is_none() {
            std::env::set_var("POCL_MAX_PTHREAD_COUNT", threads.to_string());
        }
    });
}

/// Settings of an [`OpenClDevice`]. The default: the first device with
/// coarse-grained SVM, the default budget.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpenClConfig {
    /// The budget in bytes; 0 means [`DEFAULT_CAPACITY`] capped at half the
    /// device's global memory.
    pub capacity: u64,
    /// Use fine-grained SVM buffers (the device must support them).
    pub fine_grained: bool,
    /// Use the first device whose platform name contains this text
    /// (case-insensitive); empty: the first device with SVM.
    pub platform: String,
}

/// Why an [`OpenClDevice`] could not be created.
#[derive(Debug, thiserror::Error)]
pub enum OpenClError {
    /// No OpenCL platform or device could be found (no ICD loader, no
    /// driver installed, or no device of the requested platform).
    #[error("no OpenCL device available: {0}")]
    Unavailable(String),
    /// The device lacks the shared virtual memory this backend needs.
    #[error("OpenCL device {device:?} has no {what} shared virtual memory")]
    NoSvm {
        /// The device's name.
        device: String,
        /// "coarse-grained buffer" or "fine-grained buffer".
        what: &'static str,
    },
    /// An OpenCL call failed.
    #[error("{call} failed: {error}")]
    Call {
        /// The API call.
        call: &'static str,
        /// The OpenCL error text.
        error: String,
    },
}

fn cl_err(call: &'static str) -> impl Fn(opencl3::error_codes::ClError) -> BackendError {
    move |e| BackendError::Driver(format!("{call} failed: {e}"))
}

/// An event (marker) owned by the device. OpenCL objects may be used from
/// any thread (OpenCL 1.1+ API thread safety), but `opencl3::event::Event`
/// does not say so.
struct Marker(Event);

// SAFETY: every OpenCL API call used on an event (status query, wait,
// release on drop) is thread-safe per the OpenCL specification (all API
// functions except clSetKernelArg/clCloneKernel are); the handle is never
// dereferenced by Rust code.
unsafe impl Send for Marker {}

/// A user event keeping a queue busy.
struct Hold(cl_event);

// SAFETY: as for `Marker`: the handle is only passed to thread-safe OpenCL
// API calls (set status, release).
unsafe impl Send for Hold {}

struct State {
    queues: BTreeMap<u64, CommandQueue>,
    next_stream: u64,
    events: BTreeMap<u64, Marker>,
    next_event: u64,
    /// Live SVM allocations: address -> size.
    allocs: BTreeMap<u64, u64>,
    used: u64,
    holds: BTreeMap<u64, Hold>,
}

impl State {
    fn queue(&self, s: StreamId) -> Result<&CommandQueue, BackendError> {
        self.queues
            .get(&s.0)
            .ok_or_else(|| BackendError::InvalidValue(format!("unknown stream {s} on OpenCL")))
    }

    /// Check that `[ptr, ptr + len)` lies inside one live allocation.
    fn check_range(&self, ptr: DevicePtr, len: u64) -> Result<(), BackendError> {
        let inside = self
            .allocs
            .range(..=ptr.0)
            .next_back()
            .is_some_and(|(&a, &size)| ptr.0 + len <= a + size && len > 0);
        if inside {
            Ok(())
        } else {
            Err(BackendError::InvalidValue(format!(
                "range [{ptr}, +{len}) is not inside a live OpenCL SVM allocation"
            )))
        }
    }

    /// Refuse to wait for a held stream: it would never finish.
    fn not_held(&self, what: &str) -> Result<(), BackendError> {
        match self.holds.keys().next() {
            Some(s) => Err(BackendError::InvalidValue(format!(
                "{what} would wait forever: OpenCL stream {s} is held (release it first)"
            ))),
            None => Ok(()),
        }
    }

    fn finish_all(&self) -> Result<(), BackendError> {
        for q in self.queues.values() {
            q.finish().map_err(cl_err("clFinish"))?;
        }
        Ok(())
    }
}

/// An OpenCL device as a Reservoir backend. See the [crate documentation](crate).
pub struct OpenClDevice {
    context: Context,
    fine_grained: bool,
    capacity: u64,
    device_name: String,
    state: Mutex<State>,
}

impl std::fmt::Debug for OpenClDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenClDevice")
            .field("device", &self.device_name)
            .field("capacity", &self.capacity)
            .field("fine_grained", &self.fine_grained)
            .finish_non_exhaustive()
    }
}

impl OpenClDevice {
    /// Open the first OpenCL device matching `config`.
    pub fn new(config: OpenClConfig) -> Result<Self, OpenClError> {
        let platforms = opencl3::platform::get_platforms()
            .map_err(|e| OpenClError::Unavailable(format!("clGetPlatformIDs: {e}")))?;
        let wanted = config.platform.to_lowercase();
        let mut found = None;
        for p in &platforms {
            let name = p.name().unwrap_or_default();
            if !name.to_lowercase().contains(&wanted) {
                continue;
            }
            if let Some(&id) = p
                .get_devices(CL_DEVICE_TYPE_ALL)
                .unwrap_or_default()
                .first()
            {
                found = Some(id);
                break;
            }
        }
        let Some(id) = found else {
            return Err(OpenClError::Unavailable(format!(
                "{} platform(s), none with a device{}",
                platforms.len(),
                if wanted.is_empty() {
                    String::new()
                } else {
                    format!(" whose name contains {:?}", config.platform)
                }
            )));
        };
        let device = Device::new(id);
        let device_name = device.name().unwrap_or_default();
        let svm = device.svm_mem_capability();
        let (bit, what) = if config.fine_grained {
            (CL_DEVICE_SVM_FINE_GRAIN_BUFFER, "fine-grained buffer")
        } else {
            (CL_DEVICE_SVM_COARSE_GRAIN_BUFFER, "coarse-grained buffer")
        };
        if svm & bit == 0 {
            return Err(OpenClError::NoSvm {
                device: device_name,
                what,
            });
        }
        let global = device.global_mem_size().unwrap_or(0);
        let capacity = if config.capacity > 0 {
            config.capacity
        } else {
            DEFAULT_CAPACITY.min(global / 2).max(1 << 20)
        };
        let context = Context::from_device(&device).map_err(|e| OpenClError::Call {
            call: "clCreateContext",
            error: e.to_string(),
        })?;
        let default_queue =
            CommandQueue::create_default_with_properties(&context, 0, 0).map_err(|e| {
                OpenClError::Call {
                    call: "clCreateCommandQueueWithProperties",
                    error: e.to_string(),
                }
            })?;
        Ok(OpenClDevice {
            context,
            fine_grained: config.fine_grained,
            capacity,
            device_name,
            state: Mutex::new(State {
                queues: BTreeMap::from([(0, default_queue)]),
                next_stream: 1,
                events: BTreeMap::new(),
                next_event: 1,
                allocs: BTreeMap::new(),
                used: 0,
                holds: BTreeMap::new(),
            }),
        })
    }

    /// The device's name as OpenCL reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The budget in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Live allocations and the bytes they hold.
    pub fn live(&self) -> (usize, u64) {
        let st = self.state.lock();
        (st.allocs.len(), st.used)
    }

    /// Copy `len` bytes at `ptr` to host memory after the work enqueued on
    /// `stream` so far, waiting for it. Blocks forever on a held stream.
    pub fn read(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Vec<u8>, BackendError> {
        let st = self.state.lock();
        st.check_range(ptr, len)?;
        let q = st.queue(stream)?;
        let mut host = vec![0u8; len as usize];
        // SAFETY: the source lies inside a live SVM allocation (checked);
        // the destination is `host`, `len` writable bytes that outlive the
        // blocking copy, which has completed when the call returns.
        let ev = unsafe {
            q.enqueue_svm_mem_cpy(
                CL_BLOCKING,
                host.as_mut_ptr().cast::<c_void>(),
                ptr.0 as *const c_void,
                len as usize,
                &[],
            )
        }
        .map_err(cl_err("clEnqueueSVMMemcpy"))?;
        drop(ev);
        Ok(host)
    }

    /// Copy `data` from host memory to `ptr` after the work enqueued on
    /// `stream` so far, waiting for the copy. Blocks forever on a held
    /// stream.
    pub fn write(&self, ptr: DevicePtr, data: &[u8], stream: StreamId) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.check_range(ptr, data.len() as u64)?;
        let q = st.queue(stream)?;
        // SAFETY: the destination lies inside a live SVM allocation
        // (checked); the source is `data`, readable for its length and
        // borrowed until the blocking copy has completed, when the call
        // returns.
        let ev = unsafe {
            q.enqueue_svm_mem_cpy(
                CL_BLOCKING,
                ptr.0 as *mut c_void,
                data.as_ptr().cast::<c_void>(),
                data.len(),
                &[],
            )
        }
        .map_err(cl_err("clEnqueueSVMMemcpy"))?;
        drop(ev);
        Ok(())
    }

    /// The [`checksum`] of `len` bytes at `ptr`, read on `stream`.
    pub fn checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<u64, BackendError> {
        Ok(checksum(&self.read(ptr, len, stream)?))
    }

    /// Is `stream` held?
    pub fn is_held(&self, stream: StreamId) -> bool {
        self.state.lock().holds.contains_key(&stream.0)
    }
}

/// Complete and release a user event.
fn release_user_event(h: &Hold) {
    // Completing a user event cannot fail for a valid, not yet completed
    // user event; if it did, the queue behind it would stay blocked and the
    // next `finish` report it.
    let _ = opencl3::event::set_user_event_status(h.0, CL_COMPLETE);
    // SAFETY: `h.0` was returned by clCreateUserEvent and this is the only
    // release of the reference it holds (each Hold is released once, when
    // removed from the map or when the device drops).
    let _ = unsafe { opencl3::event::release_event(h.0) };
}

impl Drop for OpenClDevice {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        for (_, h) in std::mem::take(&mut st.holds) {
            release_user_event(&h);
        }
        let _ = st.finish_all();
        st.events.clear();
        let leaked = std::mem::take(&mut st.allocs);
        if !leaked.is_empty() {
            tracing::warn!(
                allocations = leaked.len(),
                "OpenCL device dropped with live allocations; freeing them"
            );
        }
        for (addr, _) in leaked {
            // SAFETY: `addr` came from clSVMAlloc on this context and is
            // freed once; every queue has finished, so no command uses it.
            unsafe { opencl3::memory::svm_free(self.context.get(), addr as *mut c_void) };
        }
    }
}

impl Backend for OpenClDevice {
    fn name(&self) -> &'static str {
        NAME
    }

    fn allocate(&self, size: u64, _stream: StreamId) -> Result<DevicePtr, BackendError> {
        let mut st = self.state.lock();
        let free = self.capacity - st.used;
        if size == 0 || size > free {
            if size == 0 {
                return Err(BackendError::InvalidValue(
                    "zero-byte OpenCL allocation".into(),
                ));
            }
            return Err(BackendError::OutOfMemory {
                requested: size,
                free,
            });
        }
        let flags = CL_MEM_READ_WRITE
            | if self.fine_grained {
                CL_MEM_SVM_FINE_GRAIN_BUFFER
            } else {
                0
            };
        // SAFETY: the context is live; a null result is handled below.
        let ptr =
            unsafe { opencl3::memory::svm_alloc(self.context.get(), flags, size as usize, 0) };
        let Ok(ptr) = ptr else {
            return Err(BackendError::OutOfMemory {
                requested: size,
                free,
            });
        };
        st.allocs.insert(ptr as u64, size);
        st.used += size;
        Ok(DevicePtr(ptr as u64))
    }

    /// Waits for every queue, then `clSVMFree`.
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        match st.allocs.get(&ptr.0) {
            Some(&s) if s == size => {}
            Some(&s) => {
                return Err(BackendError::InvalidValue(format!(
                    "OpenCL free of {ptr} with size {size}, but it was allocated with {s}"
                )))
            }
            None => {
                return Err(BackendError::InvalidValue(format!(
                    "OpenCL free of {ptr}, which is not a live allocation"
                )))
            }
        }
        st.not_held("freeing a segment")?;
        st.finish_all()?;
        st.allocs.remove(&ptr.0);
        st.used -= size;
        // SAFETY: `ptr` is a live allocation of this context (checked) freed
        // once (removed from the map); every queue has finished, so no
        // enqueued command still uses it.
        unsafe { opencl3::memory::svm_free(self.context.get(), ptr.0 as *mut c_void) };
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let st = self.state.lock();
        Ok(MemInfo {
            free: self.capacity - st.used,
            total: self.capacity,
        })
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        let q = CommandQueue::create_default_with_properties(&self.context, 0, 0)
            .map_err(cl_err("clCreateCommandQueueWithProperties"))?;
        let mut st = self.state.lock();
        let id = st.next_stream;
        st.next_stream += 1;
        st.queues.insert(id, q);
        Ok(StreamId(id))
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().queue(stream).map(|_| ())
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        let mut st = self.state.lock();
        let q = st.queue(stream)?;
        // SAFETY: an empty wait list; the marker event is owned by `Event`.
        let ev = unsafe { q.enqueue_marker_with_wait_list(&[]) }
            .map_err(cl_err("clEnqueueMarkerWithWaitList"))?;
        q.flush().map_err(cl_err("clFlush"))?;
        let id = st.next_event;
        st.next_event += 1;
        st.events.insert(id, Marker(ev));
        Ok(EventId(id))
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        let st = self.state.lock();
        let ev = st
            .events
            .get(&event.0)
            .ok_or_else(|| unknown_event(event))?;
        let status =
            ev.0.command_execution_status()
                .map_err(cl_err("clGetEventInfo"))?;
        if status.0 < 0 {
            return Err(BackendError::Driver(format!(
                "OpenCL event {} failed with status {}",
                event.0, status.0
            )));
        }
        Ok(status.0 == CL_COMPLETE)
    }

    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        let st = self.state.lock();
        let ev = st
            .events
            .get(&event.0)
            .ok_or_else(|| unknown_event(event))?;
        ev.0.wait().map_err(cl_err("clWaitForEvents"))
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        self.state
            .lock()
            .events
            .remove(&event.0)
            .map(drop)
            .ok_or_else(|| unknown_event(event))
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.queue(stream)?.finish().map_err(cl_err("clFinish"))
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.not_held("synchronizing the device")?;
        st.finish_all()
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        let st = self.state.lock();
        let ev = st
            .events
            .get(&event.0)
            .ok_or_else(|| unknown_event(event))?;
        let q = st.queue(stream)?;
        // SAFETY: the marker is a live event of this context; the barrier
        // keeps its own reference, so destroying the marker later is fine.
        let barrier = unsafe { q.enqueue_barrier_with_wait_list(&[ev.0.get()]) }
            .map_err(cl_err("clEnqueueBarrierWithWaitList"))?;
        drop(barrier);
        q.flush().map_err(cl_err("clFlush"))
    }

    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        Some(self)
    }

    fn as_device_work(&self) -> Option<&dyn DeviceWork> {
        Some(self)
    }

    fn as_host_write(&self) -> Option<&dyn HostWrite> {
        Some(self)
    }

    fn as_host_mapping(&self) -> Option<&dyn HostMapping> {
        Some(self)
    }
}

/// A blocking copy on the default stream ([`OpenClDevice::write`]).
impl HostWrite for OpenClDevice {
    fn write_host(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), BackendError> {
        self.write(ptr, data, StreamId::DEFAULT)
    }
}

/// An SVM pointer is a host virtual address. With fine-grained SVM the
/// host may use it at any time; with coarse-grained SVM (the default) only
/// between `clEnqueueSVMMap` and `clEnqueueSVMUnmap`, or through the
/// device's copies ([`OpenClDevice::read`], [`OpenClDevice::write`]).
impl HostMapping for OpenClDevice {
    fn host_address(&self, ptr: DevicePtr, len: u64) -> Result<u64, BackendError> {
        self.state.lock().check_range(ptr, len.max(1))?;
        Ok(ptr.0)
    }
}

fn unknown_event(e: EventId) -> BackendError {
    BackendError::InvalidValue(format!("unknown event {} on OpenCL", e.0))
}

impl Memcpy for OpenClDevice {
    /// Copy `len` bytes from `src` to `dst` on `stream` (asynchronous). The
    /// ranges must not overlap.
    fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.check_range(dst, len)?;
        st.check_range(src, len)?;
        if dst.0 < src.0 + len && src.0 < dst.0 + len {
            return Err(BackendError::InvalidValue(format!(
                "overlapping copy from [{src}, +{len}) to [{dst}, +{len})"
            )));
        }
        let q = st.queue(stream)?;
        // SAFETY: both ranges lie inside live SVM allocations and do not
        // overlap (checked above); they stay allocated until the command
        // has run because `free` finishes every queue first.
        let ev = unsafe {
            q.enqueue_svm_mem_cpy(
                CL_NON_BLOCKING,
                dst.0 as *mut c_void,
                src.0 as *const c_void,
                len as usize,
                &[],
            )
        }
        .map_err(cl_err("clEnqueueSVMMemcpy"))?;
        drop(ev);
        q.flush().map_err(cl_err("clFlush"))
    }
}

impl DeviceWork for OpenClDevice {
    /// Set `len` bytes at `ptr` to `byte` on `stream` (asynchronous).
    fn fill(
        &self,
        ptr: DevicePtr,
        len: u64,
        byte: u8,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        let st = self.state.lock();
        st.check_range(ptr, len)?;
        let q = st.queue(stream)?;
        // SAFETY: the range lies inside a live SVM allocation of this
        // context (checked above); it stays allocated until the command has
        // run because `free` finishes every queue before `clSVMFree`. The
        // pattern is copied by OpenCL before the call returns.
        let ev =
            unsafe { q.enqueue_svm_mem_fill(ptr.0 as *mut c_void, &[byte], len as usize, &[]) }
                .map_err(cl_err("clEnqueueSVMMemFill"))?;
        drop(ev);
        q.flush().map_err(cl_err("clFlush"))
    }

    fn read_checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError> {
        self.checksum(ptr, len, stream).map(Some)
    }

    /// Keep `stream` busy: a barrier waiting for a user event is enqueued,
    /// so later work on the stream waits until [`release`](DeviceWork::release).
    /// Holding a held stream is a no-op.
    fn hold(&self, stream: StreamId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        if st.holds.contains_key(&stream.0) {
            return Ok(());
        }
        let user = opencl3::event::create_user_event(self.context.get())
            .map_err(|e| BackendError::Driver(format!("clCreateUserEvent failed: {e}")))?;
        let hold = Hold(user);
        let q = st.queue(stream)?;
        // SAFETY: `user` is a live user event of this queue's context; the
        // barrier keeps its own reference.
        let ev = unsafe { q.enqueue_barrier_with_wait_list(&[hold.0]) };
        match ev {
            Ok(ev) => drop(ev),
            Err(e) => {
                release_user_event(&hold);
                return Err(cl_err("clEnqueueBarrierWithWaitList")(e));
            }
        }
        q.flush().map_err(cl_err("clFlush"))?;
        st.holds.insert(stream.0, hold);
        Ok(())
    }

    /// End a [`hold`](DeviceWork::hold) and wait for the stream's work.
    fn release(&self, stream: StreamId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        if let Some(h) = st.holds.remove(&stream.0) {
            release_user_event(&h);
        }
        st.queue(stream)?.finish().map_err(cl_err("clFinish"))
    }
}
