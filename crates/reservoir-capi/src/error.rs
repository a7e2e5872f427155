//! Error codes, the thread-local last-error string, and the guard every
//! entry point runs in (no panic crosses the C boundary).

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use reservoir::AllocError;

/// What an entry point answers. `RESERVOIR_OK` is 0; every other value is
/// an error, and [`reservoir_last_error`] then holds a message naming the
/// function and the bad value.
#[repr(C)]
#[allow(non_camel_case_types)] // the C names
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReservoirStatus {
    /// Success.
    RESERVOIR_OK = 0,
    /// The allocator handle was null.
    RESERVOIR_ERR_NULL_HANDLE = 1,
    /// The handle is not a live Reservoir handle: never created by this
    /// library, or already destroyed.
    RESERVOIR_ERR_INVALID_HANDLE = 2,
    /// An argument is out of range (size 0 or too large, null out-pointer,
    /// bad fraction, bad device index, unknown statistic, ...).
    RESERVOIR_ERR_INVALID_ARGUMENT = 3,
    /// The configuration string does not parse (PyTorch's
    /// `PYTORCH_CUDA_ALLOC_CONF` syntax).
    RESERVOIR_ERR_INVALID_CONFIG = 4,
    /// The pointer was not handed out by this allocator, is interior to a
    /// block, or was already freed.
    RESERVOIR_ERR_INVALID_POINTER = 5,
    /// The device cannot hold the allocation, even after the retry chain
    /// (PyTorch's out-of-memory message).
    RESERVOIR_ERR_OUT_OF_MEMORY = 6,
    /// The device failed.
    RESERVOIR_ERR_BACKEND = 7,
    /// The requested backend cannot be used here (no CUDA driver loads).
    RESERVOIR_ERR_BACKEND_UNAVAILABLE = 8,
    /// The operation is refused in the allocator's current state.
    RESERVOIR_ERR_INVALID_STATE = 9,
    /// Writing a file failed.
    RESERVOIR_ERR_IO = 10,
    /// The caller's buffer is too small (the needed length is reported).
    RESERVOIR_ERR_BUFFER_TOO_SMALL = 11,
    /// This call panicked inside Reservoir; the allocator is now poisoned.
    RESERVOIR_ERR_PANIC = 12,
    /// An earlier call panicked on this allocator: only destroy works.
    RESERVOIR_ERR_POISONED = 13,
}

pub(crate) use ReservoirStatus::*;

/// A failure: the status code and the message naming the bad value. Entry
/// points turn it into their status and last error (prefixed by the
/// function name); the Rust accessors of the PyTorch allocators
/// ([`with_torch_allocator`](crate::with_torch_allocator)) return it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The status code a C caller would see.
    pub status: ReservoirStatus,
    /// What went wrong, naming the bad value.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// A failure with `status` and `message`.
    pub fn new(status: ReservoirStatus, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(RESERVOIR_ERR_INVALID_ARGUMENT, message)
    }

    /// An allocator error as a failure, its message prefixed with what the
    /// call was about (`"size 1024: ..."`).
    pub(crate) fn context(e: AllocError, about: impl std::fmt::Display) -> Failure {
        let f = Failure::from(e);
        Failure::new(f.status, format!("{about}: {}", f.message))
    }
}

impl From<AllocError> for Failure {
    fn from(e: AllocError) -> Failure {
        let status = match &e {
            AllocError::OutOfMemory(_) => RESERVOIR_ERR_OUT_OF_MEMORY,
            AllocError::InvalidPointer { .. } => RESERVOIR_ERR_INVALID_POINTER,
            AllocError::InvalidArgument(_) | AllocError::UnknownStream { .. } => {
                RESERVOIR_ERR_INVALID_ARGUMENT
            }
            AllocError::InvalidState(_) => RESERVOIR_ERR_INVALID_STATE,
            _ => RESERVOIR_ERR_BACKEND,
        };
        Failure::new(status, e.to_string())
    }
}

/// The size of each thread's last-error buffer, its closing NUL included:
/// a longer message is cut at a character boundary and ends in `"…"`.
/// Messages name one bad value each (configuration strings are quoted by a
/// window, paths are bounded by the system), so this is never reached in
/// practice; it keeps the buffer's address fixed.
pub const RESERVOIR_LAST_ERROR_CAPACITY: usize = 16 * 1024;

/// One thread's last error: a buffer allocated at the thread's first error
/// and never freed, moved or grown while the thread lives, so a pointer
/// [`reservoir_last_error`] returned stays readable; only a later error
/// overwrites its text in place.
struct LastError {
    /// `RESERVOIR_LAST_ERROR_CAPACITY` bytes holding a NUL-terminated
    /// message, from `Box::into_raw` (freed by `Drop` at thread exit); every
    /// read and write goes through this one raw pointer, so a pointer handed
    /// to C stays valid across later writes.
    buf: *mut u8,
    /// Did the thread's last call fail? (A success leaves `buf` as it is
    /// and makes [`reservoir_last_error`] answer `""`.)
    current: bool,
}

impl LastError {
    /// The buffer, allocated on first use.
    fn buffer(&mut self) -> *mut u8 {
        if self.buf.is_null() {
            let b = vec![0u8; RESERVOIR_LAST_ERROR_CAPACITY].into_boxed_slice();
            self.buf = Box::into_raw(b).cast::<u8>();
        }
        self.buf
    }
}

impl Drop for LastError {
    fn drop(&mut self) {
        if !self.buf.is_null() {
            let slice = std::ptr::slice_from_raw_parts_mut(self.buf, RESERVOIR_LAST_ERROR_CAPACITY);
            // SAFETY: `buf` came from `Box::into_raw` of a boxed slice of
            // this length and is freed only here, once.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<LastError> = const {
        RefCell::new(LastError { buf: std::ptr::null_mut(), current: false })
    };
}

/// `message` cut to fit `capacity - 1` bytes (the NUL) at a character
/// boundary, ending in `"…"` when cut, and at its first interior NUL (C
/// cannot show what follows).
fn fit(message: &str, capacity: usize) -> &str {
    let message = message.split('\0').next().unwrap_or_default();
    if message.len() < capacity {
        return message;
    }
    let mut end = capacity - 1 - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

/// Store `message` as this thread's last error (and log it).
pub(crate) fn set_last_error(status: ReservoirStatus, message: String) {
    tracing::debug!(target: "reservoir::capi", ?status, "{message}");
    let text = fit(&message, RESERVOIR_LAST_ERROR_CAPACITY);
    let cut = text.len() < message.split('\0').next().unwrap_or_default().len();
    let _ = LAST_ERROR.try_with(|l| {
        let Ok(mut l) = l.try_borrow_mut() else {
            return;
        };
        let buf = l.buffer();
        let ellipsis = if cut { "…" } else { "" };
        let n = text.len() + ellipsis.len();
        debug_assert!(n < RESERVOIR_LAST_ERROR_CAPACITY);
        // SAFETY: `buf` holds RESERVOIR_LAST_ERROR_CAPACITY bytes and `fit`
        // left room for the ellipsis and the NUL; Rust strings do not
        // overlap the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf, text.len());
            std::ptr::copy_nonoverlapping(ellipsis.as_ptr(), buf.add(text.len()), ellipsis.len());
            buf.add(n).write(0);
        }
        l.current = true;
    });
}

fn clear_last_error() {
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.current = false;
        }
    });
}

/// The text of a panic payload.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// Run entry point `name`'s body: a panic becomes `RESERVOIR_ERR_PANIC`, a
/// failure sets the last error to `"{name}: {message}"`, success clears it.
pub(crate) fn guard(name: &str, f: impl FnOnce() -> Result<(), Failure>) -> ReservoirStatus {
    let outcome = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        Err(Failure::new(
            RESERVOIR_ERR_PANIC,
            format!("panicked: {}", panic_text(payload.as_ref())),
        ))
    });
    match outcome {
        Ok(()) => {
            clear_last_error();
            RESERVOIR_OK
        }
        Err(f) => {
            set_last_error(f.status, format!("{name}: {}", f.message));
            f.status
        }
    }
}

/// This thread's last error message, NUL-terminated: empty (`""`) when the
/// thread's last Reservoir call succeeded.
///
/// The text lives in a per-thread buffer owned by the library, of
/// `RESERVOIR_LAST_ERROR_CAPACITY` (16 KiB) bytes, allocated at the thread's
/// first error and never freed, moved or shrunk until the thread exits. So a
/// returned pointer stays valid for the life of the thread, whatever is
/// called next: a successful call leaves the text as it is (only this
/// function answers `""` afterwards), and a later error overwrites it in
/// place with the new message. Copy the text to keep it past the thread's
/// next error. A message longer than the buffer is cut and ends in `"…"`.
#[no_mangle]
pub extern "C" fn reservoir_last_error() -> *const c_char {
    const EMPTY: &CStr = c"";
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|l| match l.try_borrow() {
                Ok(l) if l.current && !l.buf.is_null() => l.buf.cast_const().cast::<c_char>(),
                _ => EMPTY.as_ptr(),
            })
            .unwrap_or(EMPTY.as_ptr())
    })
    .unwrap_or(EMPTY.as_ptr())
}

/// The name of a status code (`"RESERVOIR_ERR_POISONED"`), a static
/// string; `"RESERVOIR_UNKNOWN_STATUS"` for a value that is no status.
#[no_mangle]
pub extern "C" fn reservoir_status_name(status: i32) -> *const c_char {
    const NAMES: [&CStr; 14] = [
        c"RESERVOIR_OK",
        c"RESERVOIR_ERR_NULL_HANDLE",
        c"RESERVOIR_ERR_INVALID_HANDLE",
        c"RESERVOIR_ERR_INVALID_ARGUMENT",
        c"RESERVOIR_ERR_INVALID_CONFIG",
        c"RESERVOIR_ERR_INVALID_POINTER",
        c"RESERVOIR_ERR_OUT_OF_MEMORY",
        c"RESERVOIR_ERR_BACKEND",
        c"RESERVOIR_ERR_BACKEND_UNAVAILABLE",
        c"RESERVOIR_ERR_INVALID_STATE",
        c"RESERVOIR_ERR_IO",
        c"RESERVOIR_ERR_BUFFER_TOO_SMALL",
        c"RESERVOIR_ERR_PANIC",
        c"RESERVOIR_ERR_POISONED",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"RESERVOIR_UNKNOWN_STATUS".as_ptr(), |n| n.as_ptr())
}

/// This thread's last error message, as Rust text (for logging): empty
/// after a successful call.
pub(crate) fn last_error_string() -> String {
    let p = reservoir_last_error();
    // SAFETY: `reservoir_last_error` returns a NUL-terminated string that
    // stays valid for the life of this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_boundary() {
        let long = "é".repeat(RESERVOIR_LAST_ERROR_CAPACITY);
        set_last_error(RESERVOIR_ERR_INVALID_CONFIG, long);
        let text = last_error_string();
        assert!(text.len() < RESERVOIR_LAST_ERROR_CAPACITY, "{}", text.len());
        assert!(text.ends_with('…'), "{}", &text[text.len() - 8..]);
        assert!(text.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_pointer_outlives_the_next_calls() {
        set_last_error(RESERVOIR_ERR_INVALID_ARGUMENT, "first\0hidden".into());
        let p = reservoir_last_error();
        // SAFETY: valid for the life of the thread.
        assert_eq!(unsafe { CStr::from_ptr(p) }, c"first");
        clear_last_error();
        assert_eq!(last_error_string(), "");
        // SAFETY: as above: a success keeps the text.
        assert_eq!(unsafe { CStr::from_ptr(p) }, c"first");
        set_last_error(RESERVOIR_ERR_INVALID_ARGUMENT, "second".into());
        assert_eq!(reservoir_last_error(), p, "overwritten in place");
        // SAFETY: as above.
        assert_eq!(unsafe { CStr::from_ptr(p) }, c"second");
    }
}
