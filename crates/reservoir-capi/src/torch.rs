//! PyTorch's `CUDAPluggableAllocator` entry points (spec section 3):
//! `reservoir_alloc` / `reservoir_free`, Reservoir's caching allocator over
//! the CUDA driver, one per device, built on first use and configured by
//! the `RESERVOIR_ALLOC_CONF` environment variable
//! (`PYTORCH_CUDA_ALLOC_CONF` syntax).
//!
//! ```python
//! alloc = torch.cuda.memory.CUDAPluggableAllocator(
//!     "libreservoir_capi.so", "reservoir_alloc", "reservoir_free")
//! pool = torch.cuda.MemPool(allocator=alloc.allocator())
//! with torch.cuda.use_mem_pool(pool):
//!     x = torch.empty(n, device="cuda")
//! ```
//!
//! Torch cannot see an error code here: a failure returns null or does
//! nothing, and its message goes to
//! [`reservoir_last_error`](crate::reservoir_last_error) and to a `tracing`
//! error event. Through a `MemPool` (above) torch turns a null into
//! `torch.OutOfMemoryError`. Not through
//! `torch.cuda.memory.change_current_allocator(alloc)`: there torch (2.15)
//! raises nothing and hands out a tensor at address 0, which crashes the
//! process when read, so that route is not offered. To make Reservoir
//! torch's allocator, use `reservoir.torch.enable()` (the Python wheel): its
//! C++ face, on the `reservoir_torch_*` entry points, raises
//! `torch.OutOfMemoryError` with PyTorch's text. A panic poisons every device's allocator (later
//! calls fail with `RESERVOIR_ERR_POISONED`). Torch's `memory_stats()` is unavailable with a
//! pluggable allocator; [`reservoir_torch_stat`] reads ours.
//!
//! A program that loads this library itself (the `reservoir.torch` Python
//! package) configures the allocators with [`torch_configure`] /
//! [`reservoir_torch_configure`] instead of the environment, before the
//! first allocation, and reaches them with [`with_torch_allocator`].

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use reservoir::{CachingAllocator, DevicePtr};
use reservoir_cuda::CudaDevice;

use crate::api::parse_config;
use crate::error::{
    guard, Failure, ReservoirStatus, RESERVOIR_ERR_BACKEND_UNAVAILABLE,
    RESERVOIR_ERR_INVALID_STATE, RESERVOIR_ERR_PANIC, RESERVOIR_ERR_POISONED,
};

/// The environment variable configuring the PyTorch entry points.
pub const RESERVOIR_ALLOC_CONF: &str = "RESERVOIR_ALLOC_CONF";

/// One device's allocator behind the PyTorch entry points.
pub type TorchAllocator = Arc<CachingAllocator<CudaDevice>>;

/// The per-device allocators, indexed by device ordinal, built lazily.
static DEVICES: RwLock<Vec<Option<TorchAllocator>>> = parking_lot::const_rwlock(Vec::new());

/// The configuration set by [`torch_configure`] (it wins over
/// `RESERVOIR_ALLOC_CONF`); only written under the `DEVICES` write lock.
static CONFIGURED: parking_lot::Mutex<Option<String>> = parking_lot::const_mutex(None);

/// Configure the PyTorch allocators with `conf` (`PYTORCH_CUDA_ALLOC_CONF`
/// syntax; `None` or `""`: defaults), instead of `RESERVOIR_ALLOC_CONF`.
/// Only before the first allocator is built (the first allocation or
/// statistic): afterwards it is `RESERVOIR_ERR_INVALID_STATE` and nothing
/// changes; a bad string is `RESERVOIR_ERR_INVALID_CONFIG`.
pub fn torch_configure(conf: Option<&str>) -> Result<(), Failure> {
    let conf = conf.unwrap_or("");
    parse_config(Some(conf))?;
    let devices = DEVICES.write();
    if let Some(device) = devices.iter().position(Option::is_some) {
        return Err(Failure::new(
            RESERVOIR_ERR_INVALID_STATE,
            format!(
                "cannot apply config {conf:?}: device {device}'s allocator is already built \
                 (configure before the first CUDA allocation)"
            ),
        ));
    }
    *CONFIGURED.lock() = Some(conf.to_owned());
    drop(devices);
    Ok(())
}

/// Run `f` on device `device`'s allocator (built on first use), as the C
/// entry points do: refused once poisoned, a panic poisons every device and
/// is returned as `RESERVOIR_ERR_PANIC`; a failure is also this thread's
/// [`reservoir_last_error`](crate::reservoir_last_error), prefixed by `name`.
pub fn with_torch_allocator<T>(
    name: &str,
    device: i32,
    f: impl FnOnce(&CachingAllocator<CudaDevice>) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let mut out = None;
    let status = torch_guard(name, || {
        let a = allocator(device)?;
        out = Some(f(&a)?);
        Ok(())
    });
    out.ok_or_else(|| Failure::new(status, crate::error::last_error_string()))
}

/// Device `device`'s allocator, built on first use.
pub(crate) fn allocator(device: i32) -> Result<TorchAllocator, Failure> {
    let index = usize::try_from(device)
        .ok()
        .filter(|_| i8::try_from(device).is_ok())
        .ok_or_else(|| Failure::invalid(format!("device {device} is not in 0..=127")))?;
    if let Some(Some(a)) = DEVICES.read().get(index) {
        return Ok(a.clone());
    }
    let mut devices = DEVICES.write();
    if let Some(Some(a)) = devices.get(index) {
        return Ok(a.clone());
    }
    let (config, conf) = new_device_config(&RUNTIME_SETTINGS.lock())?;
    let dev = CudaDevice::new(device).map_err(|e| {
        Failure::new(
            RESERVOIR_ERR_BACKEND_UNAVAILABLE,
            format!("CUDA device {device} is unavailable: {e}"),
        )
    })?;
    let a = Arc::new(CachingAllocator::with_device(dev, config, device as i8));
    if devices.len() <= index {
        devices.resize(index + 1, None);
    }
    if let Some(h) = HISTORY.lock().clone() {
        a.record_memory_history(h);
    }
    for t in TRACKERS.lock().iter() {
        a.attach_trace_tracker(tracker_for(t.clone(), device));
    }
    devices[index] = Some(a.clone());
    tracing::info!(target: "reservoir::capi", device, conf = conf.as_deref(), "Reservoir allocator built");
    Ok(a)
}

/// The settings a device built now starts with: [`torch_configure`]'s
/// string (else `RESERVOIR_ALLOC_CONF`), then the run-time strings given
/// so far (`runtime`, from [`RUNTIME_SETTINGS`]), as torch's settings are
/// process-wide. Also the string it was read from, for the log.
fn new_device_config(
    runtime: &[String],
) -> Result<(reservoir::config::AllocatorConfig, Option<String>), Failure> {
    let (conf, source) = match CONFIGURED.lock().clone() {
        Some(c) => (Some(c), "torch_configure"),
        None => (
            std::env::var(RESERVOIR_ALLOC_CONF).ok(),
            RESERVOIR_ALLOC_CONF,
        ),
    };
    let mut config = parse_config(conf.as_deref())
        .map_err(|f| Failure::new(f.status, format!("{source}: {}", f.message)))?;
    for s in runtime {
        config
            .apply_runtime(s)
            .map_err(|e| runtime_settings_failure(s, &e))?;
    }
    Ok((config, conf))
}

/// The strings of [`torch_set_allocator_settings`] applied so far, in
/// order: a device built later applies them after its configuration.
static RUNTIME_SETTINGS: parking_lot::Mutex<Vec<String>> = parking_lot::const_mutex(Vec::new());

fn runtime_settings_failure(s: &str, e: &reservoir::config::ConfigError) -> Failure {
    let quoted = reservoir::config::quote_window(s, e.offset().unwrap_or(0));
    Failure::new(
        crate::error::RESERVOIR_ERR_INVALID_CONFIG,
        format!("_set_allocator_settings({quoted:?}): {e}; no setting was changed"),
    )
}

/// torch's `_set_allocator_settings(s)` (spec 1.17, run-time changes):
/// every device's settings take `s` by PyTorch's run-time rules
/// ([`reservoir::config::AllocatorConfig::apply_runtime`]: some keys reset
/// to their defaults first, the rest keep their values), and so does every
/// device built later. All or nothing: a string any device refuses is
/// `RESERVOIR_ERR_INVALID_CONFIG` naming it, and changes nothing.
pub fn torch_set_allocator_settings(s: &str) -> Result<(), Failure> {
    let devices = DEVICES.write();
    let mut runtime = RUNTIME_SETTINGS.lock();
    let mut next = Vec::new();
    for a in devices.iter().flatten() {
        let mut c = a.config();
        c.apply_runtime(s)
            .map_err(|e| runtime_settings_failure(s, &e))?;
        next.push((a, c));
    }
    if next.is_empty() {
        // Checked now, not when the first device is built.
        new_device_config(&runtime)?
            .0
            .apply_runtime(s)
            .map_err(|e| runtime_settings_failure(s, &e))?;
    }
    for (a, c) in next {
        a.set_config(c);
    }
    runtime.push(s.to_owned());
    Ok(())
}

/// [`torch_set_allocator_settings`] from C (the C++ face calls it from
/// torch's settings hook): `settings` is a NUL-terminated UTF-8 string.
///
/// # Safety
/// `settings` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_set_allocator_settings(
    settings: *const c_char,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_set_allocator_settings", || {
        if settings.is_null() {
            return Err(Failure::invalid("settings is null"));
        }
        // SAFETY: non-null and NUL-terminated (caller's contract).
        let s = unsafe { CStr::from_ptr(settings) }
            .to_str()
            .map_err(|e| Failure::invalid(format!("settings are not UTF-8: {e}")))?;
        torch_set_allocator_settings(s)
    })
}

/// The history setting of `reservoir_torch_record_history`, given to
/// devices built after it (`None`: never set).
pub(crate) static HISTORY: parking_lot::Mutex<Option<reservoir::caching::HistoryConfig>> =
    parking_lot::const_mutex(None);

/// Apply `config` to every device built so far and to those built later
/// (without clearing their history, which they have not got). Takes the
/// `DEVICES` lock before `HISTORY`, as building a device does.
pub(crate) fn set_history(config: reservoir::caching::HistoryConfig) {
    let devices = DEVICES.write();
    for a in devices.iter().flatten() {
        a.record_memory_history(config.clone());
    }
    *HISTORY.lock() = Some(reservoir::caching::HistoryConfig {
        clear_history: false,
        ..config
    });
}

/// A trace tracker of every device: called with the device index and the entry.
pub(crate) type DeviceTracker = Arc<dyn Fn(i32, &reservoir::TraceEntry) + Send + Sync>;

/// The trackers of `reservoir_torch_attach_trace_tracker`, given to devices
/// built after them.
static TRACKERS: parking_lot::Mutex<Vec<DeviceTracker>> = parking_lot::const_mutex(Vec::new());

fn tracker_for(t: DeviceTracker, device: i32) -> reservoir::caching::TraceTracker {
    Arc::new(move |e: &reservoir::TraceEntry| t(device, e))
}

/// Attach `t` to every device built so far and to those built later (the
/// `DEVICES` lock before `TRACKERS`, as building a device takes them).
pub(crate) fn attach_tracker(t: DeviceTracker) {
    let devices = DEVICES.write();
    for (i, a) in devices.iter().enumerate() {
        if let Some(a) = a {
            a.attach_trace_tracker(tracker_for(t.clone(), i as i32));
        }
    }
    TRACKERS.lock().push(t);
}

/// Every allocator built so far, in device order.
pub(crate) fn built_allocators() -> Vec<TorchAllocator> {
    DEVICES.read().iter().flatten().cloned().collect()
}

/// The stream id of a `cudaStream_t` on `a`'s device (null: the default
/// stream).
///
/// # Safety
/// `stream` is null or a live CUDA stream of `a`'s device.
pub(crate) unsafe fn stream_of(
    a: &CachingAllocator<CudaDevice>,
    stream: *mut c_void,
) -> reservoir::StreamId {
    if stream.is_null() {
        reservoir::StreamId::DEFAULT
    } else {
        // SAFETY: a live stream of the device (caller's contract).
        unsafe { a.backend().adopt_stream(stream.cast()) }
    }
}

/// Set when a PyTorch entry point panicked: the allocators may be half
/// updated, so every later call answers `RESERVOIR_ERR_POISONED`.
static POISONED: AtomicBool = AtomicBool::new(false);

/// [`guard`] for the PyTorch entry points: refuses work once poisoned,
/// poisons on a panic, and logs every failure as a `tracing` error.
pub(crate) fn torch_guard(name: &str, f: impl FnOnce() -> Result<(), Failure>) -> ReservoirStatus {
    let status = guard(name, || {
        if POISONED.load(Ordering::Acquire) {
            return Err(Failure::new(
                RESERVOIR_ERR_POISONED,
                "the PyTorch allocators are poisoned by an earlier panic",
            ));
        }
        f()
    });
    if status == RESERVOIR_ERR_PANIC {
        POISONED.store(true, Ordering::Release);
    }
    if status != ReservoirStatus::RESERVOIR_OK {
        let msg = crate::error::last_error_string();
        tracing::error!(target: "reservoir::capi", ?status, "{msg}");
    }
    status
}

/// PyTorch's pluggable `alloc(size, device, stream)`: `size` bytes on CUDA
/// device `device` for `stream` (a `cudaStream_t`; null is the default
/// stream). Returns null on error (message in `reservoir_last_error`) and
/// for size 0 (as the caching allocator does).
///
/// For a `torch.cuda.MemPool(allocator=...)`, where torch raises
/// `torch.OutOfMemoryError` on null; not for `change_current_allocator`,
/// where torch 2.15 turns null into a tensor at address 0 (use
/// `reservoir.torch.enable()` there).
///
/// # Safety
/// `stream` is null or a live CUDA stream of device `device`.
#[no_mangle]
pub unsafe extern "C" fn reservoir_alloc(
    size: isize,
    device: i32,
    stream: *mut c_void,
) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    torch_guard("reservoir_alloc", || {
        let size = u64::try_from(size)
            .map_err(|_| Failure::invalid(format!("size {size} is negative")))?;
        if size == 0 {
            return Ok(());
        }
        let a = allocator(device)?;
        let s = if stream.is_null() {
            reservoir::StreamId::DEFAULT
        } else {
            // SAFETY: a live stream of `device` (caller's contract).
            unsafe { a.backend().adopt_stream(stream.cast()) }
        };
        let p = a
            .raw_alloc(size, s)
            .map_err(|e| Failure::context(e, format_args!("size {size} on device {device}")))?;
        out = p.0 as usize as *mut c_void;
        Ok(())
    });
    out
}

/// PyTorch's pluggable `free(ptr, size, device, stream)`: return `ptr`
/// (from [`reservoir_alloc`] on `device`) to the cache. Null does nothing;
/// a pointer not allocated here is logged and changes nothing.
///
/// Torch has forgotten `ptr` when this returns, so a free that fails
/// because the driver cannot record an event on a stream that used the
/// block (`record_stream`; the library's `FreeFailed`, which frees
/// nothing) is not left there: the device is synchronised (every stream's
/// work completes, so no stream still uses the block) and the block freed
/// without recording events (`CachingAllocator::free_after_sync`; a
/// `tracing` warning says so). Only if that fails too (the synchronisation
/// itself fails) does the block stay allocated, leaked: the error is the
/// thread's last error and is logged. Never panics.
#[no_mangle]
pub extern "C" fn reservoir_free(ptr: *mut c_void, size: isize, device: i32, stream: *mut c_void) {
    torch_guard("reservoir_free", || {
        if ptr.is_null() {
            return Ok(());
        }
        let a = allocator(device)?;
        let p = DevicePtr(ptr as usize as u64);
        let what = || format!("ptr {ptr:p} (size {size}, device {device}, stream {stream:p})");
        match a.raw_free(p) {
            Ok(()) => Ok(()),
            Err(reservoir::AllocError::FreeFailed { source, .. }) => {
                tracing::warn!(
                    target: "reservoir::capi",
                    "reservoir_free: {}: {source}; synchronising the device to free it without events",
                    what()
                );
                a.free_after_sync(p).map_err(|e| {
                    Failure::context(
                        e,
                        format_args!(
                            "{}: the free failed ({source}), then so did freeing it after synchronising the device; the block stays allocated, leaked",
                            what()
                        ),
                    )
                })
            }
            Err(e) => Err(Failure::context(e, format_args!("{}", what()))),
        }
    });
}

/// The value of the statistic `key` (a flat torch key such as
/// `"allocated_bytes.all.current"`) of device `device`'s allocator, built
/// if needed.
///
/// # Safety
/// `key` is null or a NUL-terminated string; `value` is null or valid for
/// a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_stat(
    device: i32,
    key: *const c_char,
    value: *mut i64,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_stat", || {
        if key.is_null() || value.is_null() {
            return Err(Failure::invalid("key or value is null"));
        }
        // SAFETY: non-null and NUL-terminated (caller's contract).
        let key = unsafe { CStr::from_ptr(key) }.to_string_lossy();
        let v = allocator(device)?
            .memory_stats()
            .get(key.as_ref())
            .copied()
            .ok_or_else(|| Failure::invalid(format!("no statistic is named {key:?}")))?;
        // SAFETY: non-null and writable (caller's contract).
        unsafe { value.write(v) };
        Ok(())
    })
}

/// Release device `device`'s cached segments (PyTorch's `reset_fn` /
/// `emptyCache` hook).
#[no_mangle]
pub extern "C" fn reservoir_torch_empty_cache(device: i32) -> ReservoirStatus {
    torch_guard("reservoir_torch_empty_cache", || {
        Ok(allocator(device)?.empty_cache()?)
    })
}

/// [`torch_configure`] from C: `conf` is null or a NUL-terminated
/// `PYTORCH_CUDA_ALLOC_CONF`-style string.
///
/// # Safety
/// `conf` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_configure(conf: *const c_char) -> ReservoirStatus {
    torch_guard("reservoir_torch_configure", || {
        let conf = if conf.is_null() {
            None
        } else {
            // SAFETY: non-null and NUL-terminated (caller's contract).
            Some(
                unsafe { CStr::from_ptr(conf) }
                    .to_str()
                    .map_err(|e| Failure::invalid(format!("config is not UTF-8: {e}")))?,
            )
        };
        torch_configure(conf)
    })
}

/// PyTorch's pluggable `record_stream(ptr, stream)` hook
/// (`CUDAPluggableAllocator::set_record_stream_fn`): the block at `ptr`,
/// handed out by [`reservoir_alloc`] on any device, is also used by
/// `stream`; when freed it is not reused before `stream`'s work so far is
/// done. A pointer not handed out here is `RESERVOIR_ERR_INVALID_POINTER`
/// and changes nothing.
///
/// # Safety
/// `stream` is null or a live CUDA stream of the device owning `ptr`.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_record_stream(
    ptr: *mut c_void,
    stream: *mut c_void,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_record_stream", || {
        let p = DevicePtr(ptr as usize as u64);
        let owner = DEVICES
            .read()
            .iter()
            .flatten()
            .find(|a| a.is_allocated(p))
            .cloned()
            .ok_or_else(|| {
                Failure::new(
                    crate::error::RESERVOIR_ERR_INVALID_POINTER,
                    format!("ptr {ptr:p} was not handed out by reservoir_alloc"),
                )
            })?;
        let s = if stream.is_null() {
            reservoir::StreamId::DEFAULT
        } else {
            // SAFETY: a live stream of the owning device (caller's contract).
            unsafe { owner.backend().adopt_stream(stream.cast()) }
        };
        owner
            .record_stream(p, s)
            .map_err(|e| Failure::context(e, format_args!("ptr {ptr:p}")))
    })
}
