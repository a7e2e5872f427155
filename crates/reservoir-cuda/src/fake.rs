//! The fake CUDA driver's test hooks (`fakecuda_*` in `src/fakecuda.h` of
//! `../shared/oracle`), found in the driver library this process loaded.
//!
//! A real driver has none of them: [`FakeDriver::load`] answers `None`
//! there. The hooks that name a stream are reached through
//! [`CudaDevice`](crate::CudaDevice) (which checks the stream first:
//! [`DeviceWork::hold`](crate::DeviceWork::hold),
//! [`DeviceWork::release`](crate::DeviceWork::release),
//! [`CudaDevice::pending`](crate::CudaDevice::pending),
//! [`CudaDevice::enqueue`](crate::CudaDevice::enqueue)); the process-wide
//! ones are methods of [`FakeDriver`].

use std::ffi::{c_char, c_int, c_void, CString};

type StreamHook = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The fake driver's hooks. Every setting is process-wide: tests that
/// change the capacity, the stream mode or the sanitizer must not run at
/// the same time as tests that expect other settings.
pub struct FakeDriver {
    _lib: libloading::Library,
    set_total_mem: unsafe extern "C" fn(u64),
    set_async: unsafe extern "C" fn(c_int),
    get_async: unsafe extern "C" fn() -> c_int,
    stream_hold: StreamHook,
    stream_release: StreamHook,
    stream_pending: unsafe extern "C" fn(*mut c_void) -> u64,
    stream_enqueue: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> c_int,
    complete_all: unsafe extern "C" fn() -> c_int,
    set_sanitize: unsafe extern "C" fn(c_int),
    violations: unsafe extern "C" fn() -> u64,
    sanitizer_last: unsafe extern "C" fn(*mut c_char, usize) -> usize,
    sanitizer_reset: unsafe extern "C" fn(),
    stat: unsafe extern "C" fn(*const c_char) -> u64,
}

impl std::fmt::Debug for FakeDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeDriver").finish_non_exhaustive()
    }
}

impl FakeDriver {
    /// The hooks of the driver in `file` (already loaded by this process),
    /// or `None` when it is not the fake (hooks version 2 or later).
    pub(crate) fn load(file: &str) -> Option<FakeDriver> {
        // SAFETY: the library is already loaded (this only takes another
        // reference); the symbols are read with the C signatures declared
        // in the fake's `fakecuda.h`, hooks version 2.
        unsafe {
            let lib = libloading::Library::new(file).ok()?;
            let is_fake: libloading::Symbol<unsafe extern "C" fn() -> c_int> =
                lib.get(b"fakecuda_is_fake").ok()?;
            if is_fake() < 2 {
                return None;
            }
            macro_rules! sym {
                ($n:literal) => {
                    *lib.get($n).ok()?
                };
            }
            Some(FakeDriver {
                set_total_mem: sym!(b"fakecuda_set_total_mem"),
                set_async: sym!(b"fakecuda_set_async"),
                get_async: sym!(b"fakecuda_get_async"),
                stream_hold: sym!(b"fakecuda_stream_hold"),
                stream_release: sym!(b"fakecuda_stream_release"),
                stream_pending: sym!(b"fakecuda_stream_pending"),
                stream_enqueue: sym!(b"fakecuda_stream_enqueue"),
                complete_all: sym!(b"fakecuda_complete_all"),
                set_sanitize: sym!(b"fakecuda_set_sanitize"),
                violations: sym!(b"fakecuda_sanitizer_violations"),
                sanitizer_last: sym!(b"fakecuda_sanitizer_last"),
                sanitizer_reset: sym!(b"fakecuda_sanitizer_reset"),
                stat: sym!(b"fakecuda_stat"),
                _lib: lib,
            })
        }
    }

    /// Change the device's capacity (`FAKECUDA_TOTAL_MEM`).
    pub fn set_total_mem(&self, bytes: u64) {
        // SAFETY: a plain setter of the fake (C ABI, thread-safe).
        unsafe { (self.set_total_mem)(bytes) }
    }

    /// Switch the asynchronous stream mode (`FAKECUDA_ASYNC`): work stays
    /// pending until it is synchronised.
    pub fn set_async(&self, on: bool) {
        // SAFETY: a plain setter of the fake (C ABI, thread-safe).
        unsafe { (self.set_async)(c_int::from(on)) }
    }

    /// Is the asynchronous stream mode on?
    pub fn is_async(&self) -> bool {
        // SAFETY: a plain getter of the fake (C ABI, thread-safe).
        unsafe { (self.get_async)() != 0 }
    }

    /// Complete all pending work, held streams included.
    pub fn complete_all(&self) {
        // SAFETY: a plain call of the fake (C ABI, thread-safe); it fails
        // only without a context, which the fake always has.
        unsafe { (self.complete_all)() };
    }

    /// Set the sanitizer level (`FAKECUDA_SANITIZE`): 0 off, 1 report,
    /// 2 abort on the first report.
    pub fn set_sanitize(&self, level: i32) {
        // SAFETY: a plain setter of the fake (C ABI, thread-safe).
        unsafe { (self.set_sanitize)(level) }
    }

    /// Sanitizer reports since the last [`sanitizer_reset`](Self::sanitizer_reset).
    pub fn sanitizer_violations(&self) -> u64 {
        // SAFETY: a plain getter of the fake (C ABI, thread-safe).
        unsafe { (self.violations)() }
    }

    /// The last sanitizer report (empty when there was none).
    pub fn sanitizer_last(&self) -> String {
        let mut buf = vec![0u8; 1024];
        // SAFETY: the fake writes at most `buf.len()` bytes, NUL-terminated.
        unsafe { (self.sanitizer_last)(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }

    /// Reset the sanitizer's report counter and last message.
    pub fn sanitizer_reset(&self) {
        // SAFETY: a plain call of the fake (C ABI, thread-safe).
        unsafe { (self.sanitizer_reset)() }
    }

    /// One of the fake's counters by name (`"used"`, `"peak"`,
    /// `"malloc_calls"`, `"vmm_map"`, `"forced_syncs"`, ...), `None` for an
    /// unknown name.
    pub fn stat(&self, name: &str) -> Option<u64> {
        let name = CString::new(name).ok()?;
        // SAFETY: `name` is a NUL-terminated string alive during the call.
        let v = unsafe { (self.stat)(name.as_ptr()) };
        (v != u64::MAX).then_some(v)
    }

    /// Hold `stream` (a live stream handle, checked by the caller).
    pub(crate) fn hold(&self, stream: u64) -> c_int {
        // SAFETY: the caller passes a live stream of the fake's context.
        unsafe { (self.stream_hold)(stream as *mut c_void) }
    }

    /// Release `stream` (a live stream handle, checked by the caller).
    pub(crate) fn release(&self, stream: u64) -> c_int {
        // SAFETY: the caller passes a live stream of the fake's context.
        unsafe { (self.stream_release)(stream as *mut c_void) }
    }

    /// Ops pending on `stream` (a live stream handle, checked by the caller).
    pub(crate) fn pending(&self, stream: u64) -> u64 {
        // SAFETY: the caller passes a live stream of the fake's context.
        unsafe { (self.stream_pending)(stream as *mut c_void) }
    }

    /// Enqueue fake work touching a range on `stream` (a live stream
    /// handle, checked by the caller). The fake only records the range.
    pub(crate) fn enqueue(&self, stream: u64, ptr: u64, len: u64, write: bool) -> c_int {
        // SAFETY: the caller passes a live stream; the fake never
        // dereferences the range, it only tracks it for the sanitizer.
        unsafe {
            (self.stream_enqueue)(
                stream as *mut c_void,
                ptr as *const c_void,
                len as usize,
                c_int::from(write),
            )
        }
    }
}
