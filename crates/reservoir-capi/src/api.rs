//! The handle API: `reservoir_allocator_*`, one caching allocator per
//! handle on a chosen backend.

use std::ffi::{c_char, c_void, CStr};

use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocatorConfig, CachingAllocator, DevicePtr, StreamId};
use reservoir_cuda::CudaDevice;
use reservoir_host::HostDevice;

use crate::error::{
    guard, Failure, ReservoirStatus, RESERVOIR_ERR_BACKEND_UNAVAILABLE,
    RESERVOIR_ERR_BUFFER_TOO_SMALL, RESERVOIR_ERR_INVALID_CONFIG, RESERVOIR_ERR_INVALID_POINTER,
    RESERVOIR_ERR_IO,
};
use crate::handle::{each_backend, register, unregister, with_handle, AnyAllocator};
use crate::ReservoirAllocator;

/// The device an allocator manages (the `backend` argument of
/// [`reservoir_allocator_create`]).
#[repr(C)]
#[allow(non_camel_case_types)] // the C names
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservoirBackend {
    /// A simulated device (`reservoir::sim::SimDevice`): addresses are
    /// numbers, never memory; `capacity` bytes (0: 80 GiB).
    RESERVOIR_BACKEND_SIM = 0,
    /// Host memory (`reservoir_host::HostDevice`, mmap): real, writable
    /// pointers; `capacity` bytes (0: the host default).
    RESERVOIR_BACKEND_HOST = 1,
    /// A CUDA device through the driver API (`reservoir_cuda::CudaDevice`),
    /// `device` is the ordinal; `capacity` must be 0.
    RESERVOIR_BACKEND_CUDA = 2,
}

/// The largest request accepted: sizes above `isize::MAX` cannot be
/// objects in C or Rust.
const MAX_SIZE: u64 = isize::MAX as u64;

/// Write `value` to the caller's out-pointer `out` (named `what`).
///
/// # Safety
/// `out` is null or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is null")));
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// The caller's NUL-terminated string `s` (named `what`), or `None` for null.
///
/// # Safety
/// `s` is null or a NUL-terminated string that outlives the call.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if s.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    c.to_str().map(Some).map_err(|e| {
        // A window of a long string, not all of it.
        let b = c.to_bytes();
        let shown = String::from_utf8_lossy(&b[..b.len().min(80)]);
        let more = if b.len() > 80 { "…" } else { "" };
        Failure::invalid(format!("{what} {shown:?}{more} is not UTF-8: {e}"))
    })
}

/// The bits of a simulated or host stream value that name its handle: a
/// stream value is `handle generation << 32 | the device's stream id`, so a
/// stream of another handle (or a number never handed out) is refused
/// instead of naming some stream of this device.
const STREAM_HANDLE_SHIFT: u32 = 32;

/// The handle bits of `h`'s stream values (its generation, see `handle.rs`).
fn stream_tag(h: *const ReservoirAllocator) -> u64 {
    ((h as usize as u64) >> 16) & 0xffff_ffff
}

/// The stream value C sees for `h`'s device stream `s`.
fn stream_value(
    h: *const ReservoirAllocator,
    a: &AnyAllocator,
    s: StreamId,
) -> Result<u64, Failure> {
    if matches!(a, AnyAllocator::Cuda(_)) || s == StreamId::DEFAULT {
        return Ok(s.0);
    }
    if s.0 >> STREAM_HANDLE_SHIFT != 0 {
        return Err(Failure::new(
            crate::error::RESERVOIR_ERR_BACKEND,
            format!("the device made stream id {} (beyond 2^32)", s.0),
        ));
    }
    Ok(stream_tag(h) << STREAM_HANDLE_SHIFT | s.0)
}

/// The stream the C value `stream` names on `h`'s allocator `a`: the
/// default stream for 0; on the simulated and host devices, a stream of
/// this handle (else `RESERVOIR_ERR_INVALID_ARGUMENT`; whether the device
/// knows it is checked by the allocator); on CUDA, the adopted `CUstream`.
fn stream_arg(
    h: *const ReservoirAllocator,
    a: &AnyAllocator,
    stream: u64,
) -> Result<StreamId, Failure> {
    if stream == 0 {
        return Ok(StreamId::DEFAULT);
    }
    if let AnyAllocator::Cuda(a) = a {
        // SAFETY: the caller promises (see the entry points' docs) that a
        // non-zero stream of a CUDA allocator is a live `CUstream` of
        // its device.
        return Ok(unsafe { a.backend().adopt_stream(stream as usize as _) });
    }
    if stream >> STREAM_HANDLE_SHIFT != stream_tag(h) {
        return Err(unknown_stream(h, stream));
    }
    Ok(StreamId(stream & ((1 << STREAM_HANDLE_SHIFT) - 1)))
}

fn unknown_stream(h: *const ReservoirAllocator, stream: u64) -> Failure {
    Failure::invalid(format!(
        "stream {stream} is not a stream of allocator {h:p} (streams come from \
         reservoir_allocator_create_stream on the same handle; 0 is the default stream); \
         nothing was changed"
    ))
}

/// `e`, with an unknown stream named by its C value `stream`.
fn stream_failure(h: *const ReservoirAllocator, stream: u64, e: reservoir::AllocError) -> Failure {
    match e {
        reservoir::AllocError::UnknownStream { .. } => unknown_stream(h, stream),
        e => Failure::from(e),
    }
}

fn build(
    backend: u32,
    device: i32,
    capacity: u64,
    config: AllocatorConfig,
) -> Result<AnyAllocator, Failure> {
    let index = i8::try_from(device)
        .ok()
        .filter(|d| *d >= 0)
        .ok_or_else(|| Failure::invalid(format!("device {device} is not in 0..=127")))?;
    Ok(match backend {
        b if b == ReservoirBackend::RESERVOIR_BACKEND_SIM as u32 => {
            let mut sim = SimConfig::default();
            if capacity != 0 {
                sim.capacity = capacity;
            }
            AnyAllocator::Sim(CachingAllocator::with_device(
                SimDevice::new(sim),
                config,
                index,
            ))
        }
        b if b == ReservoirBackend::RESERVOIR_BACKEND_HOST as u32 => {
            let host = if capacity == 0 {
                HostDevice::new(Default::default())
            } else {
                HostDevice::with_capacity(capacity)
            }
            .map_err(|e| Failure::invalid(format!("host capacity {capacity}: {e}")))?;
            AnyAllocator::Host(CachingAllocator::with_device(host, config, index))
        }
        b if b == ReservoirBackend::RESERVOIR_BACKEND_CUDA as u32 => {
            if capacity != 0 {
                return Err(Failure::invalid(format!(
                    "capacity {capacity}: a CUDA device has its own capacity, pass 0"
                )));
            }
            let dev = CudaDevice::new(device).map_err(|e| {
                Failure::new(
                    RESERVOIR_ERR_BACKEND_UNAVAILABLE,
                    format!("CUDA device {device} is unavailable: {e}"),
                )
            })?;
            AnyAllocator::Cuda(CachingAllocator::with_device(dev, config, index))
        }
        b => {
            return Err(Failure::invalid(format!(
                "backend {b} is not a ReservoirBackend"
            )))
        }
    })
}

/// Parse a `PYTORCH_CUDA_ALLOC_CONF`-style string, plus Reservoir's
/// `policy:NAME` entries ([`AllocatorConfig::parse_with_policy`]; null or
/// empty: defaults).
pub(crate) fn parse_config(config: Option<&str>) -> Result<AllocatorConfig, Failure> {
    match config {
        None => Ok(AllocatorConfig::default()),
        // The message quotes a window of a long string (80 characters around
        // the error), never the whole of it.
        Some(s) => AllocatorConfig::parse_with_policy(s).map_err(|e| {
            let quoted = reservoir::config::quote_window(s, e.offset().unwrap_or(0));
            Failure::new(
                RESERVOIR_ERR_INVALID_CONFIG,
                format!("config {quoted:?}: {e}"),
            )
        }),
    }
}

/// Create an allocator on `backend` (a [`ReservoirBackend`] value) for
/// device `device` (0..=127; the CUDA ordinal), with `capacity` bytes for
/// the simulated and host devices (0: their default), configured by
/// `config` in `PYTORCH_CUDA_ALLOC_CONF` syntax, plus Reservoir's
/// `policy:NAME` entries such as `policy:reservoir` (null or `""`: defaults).
/// On success `*out` is the new handle; on failure it is null.
///
/// # Safety
/// `config` is null or a NUL-terminated string; `out` is null or valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_create(
    backend: u32,
    device: i32,
    capacity: u64,
    config: *const c_char,
    out: *mut *mut ReservoirAllocator,
) -> ReservoirStatus {
    guard("reservoir_allocator_create", || {
        // SAFETY: `out` is null or writable (caller's contract).
        unsafe { put(out, std::ptr::null_mut(), "out") }?;
        // SAFETY: `config` is null or NUL-terminated (caller's contract).
        let config = parse_config(unsafe { text(config, "config") }?)?;
        let alloc = build(backend, device, capacity, config)?;
        // SAFETY: checked writable above.
        unsafe { put(out, register(alloc), "out") }
    })
}

/// Destroy an allocator: pending cross-stream frees are synchronised and
/// every segment goes back to the device, those of blocks still allocated
/// included (a warning names them; their pointers dangle). The handle is
/// invalid afterwards (`RESERVOIR_ERR_INVALID_HANDLE`). Works on a poisoned
/// allocator. If another thread is still inside a call on the handle, the
/// memory goes back when that call returns.
#[no_mangle]
pub extern "C" fn reservoir_allocator_destroy(h: *mut ReservoirAllocator) -> ReservoirStatus {
    guard("reservoir_allocator_destroy", || {
        let handle = unregister(h)?;
        // The caching allocator's `Drop` tears it down (`TeardownReport`).
        drop(handle);
        Ok(())
    })
}

/// Allocate `size` bytes (1..=`PTRDIFF_MAX`) for use on `stream` and write
/// the pointer to `*out` (null on failure). Streams: 0 is the default
/// stream; the simulated and host devices take ids from
/// [`reservoir_allocator_create_stream`] on the same handle (any other
/// value is `RESERVOIR_ERR_INVALID_ARGUMENT` and changes nothing); a CUDA
/// allocator takes a `cudaStream_t` of its device cast to an integer.
///
/// # Safety
/// `out` is null or valid for a write; a non-zero `stream` of a CUDA
/// allocator is a live stream of its device.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_alloc(
    h: *mut ReservoirAllocator,
    size: u64,
    stream: u64,
    out: *mut *mut c_void,
) -> ReservoirStatus {
    guard("reservoir_allocator_alloc", || {
        // SAFETY: `out` is null or writable (caller's contract).
        unsafe { put(out, std::ptr::null_mut(), "out") }?;
        if size == 0 || size > MAX_SIZE {
            return Err(Failure::invalid(format!(
                "size {size} is not in 1..={MAX_SIZE}"
            )));
        }
        let p = with_handle(h, |a| {
            let s = stream_arg(h, a, stream)?;
            each_backend!(a, a => a.raw_alloc(size, s)).map_err(|e| match e {
                e @ reservoir::AllocError::UnknownStream { .. } => stream_failure(h, stream, e),
                e => Failure::context(e, format_args!("size {size}")),
            })
        })?;
        // SAFETY: checked writable above.
        unsafe { put(out, p.0 as usize as *mut c_void, "out") }
    })
}

/// Free a pointer returned by [`reservoir_allocator_alloc`]. A null,
/// foreign, interior or already freed pointer is
/// `RESERVOIR_ERR_INVALID_POINTER` and changes nothing.
#[no_mangle]
pub extern "C" fn reservoir_allocator_free(
    h: *mut ReservoirAllocator,
    ptr: *mut c_void,
) -> ReservoirStatus {
    guard("reservoir_allocator_free", || {
        with_handle(h, |a| {
            if ptr.is_null() {
                return Err(Failure::new(
                    RESERVOIR_ERR_INVALID_POINTER,
                    "pointer is null",
                ));
            }
            let p = DevicePtr(ptr as usize as u64);
            Ok(each_backend!(a, a => a.raw_free(p))?)
        })
    })
}

/// Mark `ptr` as used on `stream` too (`recordStream`): its block is reused
/// only after the work queued on `stream` when it is freed has completed.
/// `stream` as for [`reservoir_allocator_alloc`]: an unknown one is
/// `RESERVOIR_ERR_INVALID_ARGUMENT` and changes nothing.
///
/// # Safety
/// A non-zero `stream` of a CUDA allocator is a live stream of its device.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_record_stream(
    h: *mut ReservoirAllocator,
    ptr: *mut c_void,
    stream: u64,
) -> ReservoirStatus {
    guard("reservoir_allocator_record_stream", || {
        with_handle(h, |a| {
            let s = stream_arg(h, a, stream)?;
            let p = DevicePtr(ptr as usize as u64);
            each_backend!(a, a => a.record_stream(p, s)).map_err(|e| stream_failure(h, stream, e))
        })
    })
}

/// Make a stream on the allocator's device and write its id to `*out`.
/// On the simulated and host devices the id is an opaque value of this
/// handle only (another handle's id, or any other number, is refused by
/// the calls that name it), and a device holds at most 65,536 streams,
/// the default stream included: streams cannot be destroyed, so past that
/// this answers `RESERVOIR_ERR_BACKEND`. A CUDA allocator answers a
/// `CUstream` the device owns.
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_create_stream(
    h: *mut ReservoirAllocator,
    out: *mut u64,
) -> ReservoirStatus {
    guard("reservoir_allocator_create_stream", || {
        // A null `out` is refused before the stream is made: a failed call
        // creates nothing.
        if out.is_null() {
            return Err(Failure::invalid("out is null".to_string()));
        }
        let s = with_handle(h, |a| {
            let s = each_backend!(a, a => reservoir::Backend::create_stream(a.backend()))
                .map_err(|e| Failure::from(reservoir::AllocError::from(e)))?;
            stream_value(h, a, s)
        })?;
        // SAFETY: `out` is null or writable (caller's contract).
        unsafe { put(out, s, "out") }
    })
}

/// Release every cached segment that is entirely free
/// (`torch.cuda.empty_cache`).
#[no_mangle]
pub extern "C" fn reservoir_allocator_empty_cache(h: *mut ReservoirAllocator) -> ReservoirStatus {
    guard("reservoir_allocator_empty_cache", || {
        with_handle(h, |a| Ok(each_backend!(a, a => a.empty_cache())?))
    })
}

/// Limit the allocator to `fraction` (in [0, 1]) of the device
/// (`torch.cuda.set_per_process_memory_fraction`).
#[no_mangle]
pub extern "C" fn reservoir_allocator_set_memory_fraction(
    h: *mut ReservoirAllocator,
    fraction: f64,
) -> ReservoirStatus {
    guard("reservoir_allocator_set_memory_fraction", || {
        with_handle(h, |a| {
            Ok(each_backend!(a, a => a.set_memory_fraction(fraction))?)
        })
    })
}

/// Write the allocator's memory fraction (1.0 when unlimited) to `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_memory_fraction(
    h: *mut ReservoirAllocator,
    out: *mut f64,
) -> ReservoirStatus {
    guard("reservoir_allocator_memory_fraction", || {
        let f = with_handle(h, |a| Ok(each_backend!(a, a => a.memory_fraction())?))?;
        // SAFETY: `out` is null or writable (caller's contract).
        unsafe { put(out, f, "out") }
    })
}

/// Turn history recording on (keeping the newest `max_entries` trace
/// entries, without stacks) or off (which clears it); the history goes into
/// [`reservoir_allocator_snapshot`] files.
#[no_mangle]
pub extern "C" fn reservoir_allocator_record_history(
    h: *mut ReservoirAllocator,
    enabled: bool,
    max_entries: usize,
) -> ReservoirStatus {
    guard("reservoir_allocator_record_history", || {
        with_handle(h, |a| {
            each_backend!(a, a => a.record_history(enabled.then_some(max_entries)));
            Ok(())
        })
    })
}

/// The caller's NUL-terminated path `s`: any bytes on Unix (Linux paths
/// need not be UTF-8), UTF-8 elsewhere.
///
/// # Safety
/// `s` is null or a NUL-terminated string that outlives the call.
unsafe fn path_arg<'a>(s: *const c_char, what: &str) -> Result<&'a std::path::Path, Failure> {
    if s.is_null() {
        return Err(Failure::invalid(format!("{what} is null")));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let c = unsafe { CStr::from_ptr(s) };
    if c.is_empty() {
        return Err(Failure::invalid(format!("{what} is empty")));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(std::path::Path::new(std::ffi::OsStr::from_bytes(
            c.to_bytes(),
        )))
    }
    #[cfg(not(unix))]
    {
        c.to_str()
            .map(std::path::Path::new)
            .map_err(|e| Failure::invalid(format!("{what} {c:?} is not UTF-8: {e}")))
    }
}

/// Write the allocator's memory snapshot (segments, blocks, history) to
/// the file `path` as a pickle, exactly as `torch.cuda.memory._snapshot()`
/// is pickled (loads in pytorch.org/memory_viz). On Unix `path` is any
/// bytes, as the system takes them. The pickle is streamed (its size in
/// memory is the history's, not the file's) to a temporary file in the
/// same folder, renamed over `path` only once whole: on failure
/// (`RESERVOIR_ERR_IO`) the previous file at `path` is left as it was and
/// the temporary file is removed. A symbolic link is followed (the link
/// stays, its target is replaced). A `path` that names a device or a FIFO
/// (`/dev/stdout`) is written straight and never removed or replaced; a
/// directory is refused (`reservoir::outfile`, docs/limits.md).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_snapshot(
    h: *mut ReservoirAllocator,
    path: *const c_char,
) -> ReservoirStatus {
    guard("reservoir_allocator_snapshot", || {
        // SAFETY: `path` is null or NUL-terminated (caller's contract).
        let path = unsafe { path_arg(path, "path") }?;
        let snapshot = with_handle(h, |a| Ok(each_backend!(a, a => a.snapshot(None))))?;
        // Issue 44, G1: never `remove_file(path)`: a failed write removed
        // whatever `path` named (a device node, a FIFO, a link, the
        // previous snapshot).
        reservoir::outfile::write_file(path, |w| {
            snapshot
                .write_pickle(w)
                .map_err(|e| std::io::Error::other(e.to_string()))
        })
        .map_err(|e| Failure::new(RESERVOIR_ERR_IO, e.to_string()))
    })
}

/// Write the number of statistics (`torch.cuda.memory_stats()` keys) to
/// `*out`. The key set is fixed: index `i` names the same key on every call.
/// It is the key set of the configured PyTorch release (`policy:pytorch-2.11`
/// has no `num_oom_rejections`; docs/replay-fidelity.md, "PyTorch releases").
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_stats_count(
    h: *mut ReservoirAllocator,
    out: *mut usize,
) -> ReservoirStatus {
    guard("reservoir_allocator_stats_count", || {
        let n = with_handle(h, |a| Ok(each_backend!(a, a => a.memory_stats()).len()))?;
        // SAFETY: `out` is null or writable (caller's contract).
        unsafe { put(out, n, "out") }
    })
}

/// Statistic number `index` (in key order): its flat torch key (for
/// example `"allocated_bytes.all.current"`) is written NUL-terminated to
/// `key` (`key_capacity` bytes), its length without the NUL to `*key_len`,
/// its value to `*value`. A buffer too small is
/// `RESERVOIR_ERR_BUFFER_TOO_SMALL`, with `*key_len` set.
///
/// # Safety
/// `key` is null or valid for `key_capacity` byte writes; `key_len` and
/// `value` are null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_stat_at(
    h: *mut ReservoirAllocator,
    index: usize,
    key: *mut c_char,
    key_capacity: usize,
    key_len: *mut usize,
    value: *mut i64,
) -> ReservoirStatus {
    guard("reservoir_allocator_stat_at", || {
        let (k, v) = with_handle(h, |a| {
            let stats = each_backend!(a, a => a.memory_stats());
            let n = stats.len();
            stats.into_iter().nth(index).ok_or_else(|| {
                Failure::invalid(format!("index {index} is not below the {n} statistics"))
            })
        })?;
        // SAFETY: null or writable (caller's contract).
        unsafe { put(key_len, k.len(), "key_len") }?;
        if key.is_null() || key_capacity <= k.len() {
            return Err(Failure::new(
                RESERVOIR_ERR_BUFFER_TOO_SMALL,
                format!(
                    "key {k:?} needs {} bytes, the buffer has {key_capacity}",
                    k.len() + 1
                ),
            ));
        }
        // SAFETY: `key` holds `key_capacity > k.len()` writable bytes
        // (caller's contract), and the two buffers cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(k.as_ptr(), key.cast::<u8>(), k.len());
            key.add(k.len()).write(0);
        }
        // SAFETY: null or writable (caller's contract).
        unsafe { put(value, v, "value") }
    })
}

/// The value of the statistic named `key` (a flat torch key such as
/// `"reserved_bytes.all.peak"`), written to `*value`.
///
/// # Safety
/// `key` is null or a NUL-terminated string; `value` is null or valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_allocator_stat(
    h: *mut ReservoirAllocator,
    key: *const c_char,
    value: *mut i64,
) -> ReservoirStatus {
    guard("reservoir_allocator_stat", || {
        // SAFETY: `key` is null or NUL-terminated (caller's contract).
        let key = unsafe { text(key, "key") }?.ok_or_else(|| Failure::invalid("key is null"))?;
        let v = with_handle(h, |a| {
            each_backend!(a, a => a.memory_stats())
                .get(key)
                .copied()
                .ok_or_else(|| Failure::invalid(format!("no statistic is named {key:?}")))
        })?;
        // SAFETY: `value` is null or writable (caller's contract).
        unsafe { put(value, v, "value") }
    })
}
