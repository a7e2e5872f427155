//! Error codes, the thread-local last-error string, and the guard every
//! entry point runs in (no panic crosses the C boundary).

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
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
            AllocError::InvalidArgument(_) => RESERVOIR_ERR_INVALID_ARGUMENT,
            AllocError::InvalidState(_) => RESERVOIR_ERR_INVALID_STATE,
            _ => RESERVOIR_ERR_BACKEND,
        };
        Failure::new(status, e.to_string())
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Store `message` as this thread's last error (and log it).
pub(crate) fn set_last_error(status: ReservoirStatus, message: String) {
    tracing::debug!(target: "reservoir::capi", ?status, "{message}");
    // An interior NUL cannot be shown by C: cut the message there.
    let bytes: Vec<u8> = message
        .into_bytes()
        .into_iter()
        .take_while(|&b| b != 0)
        .collect();
    let c = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = Some(c));
}

fn clear_last_error() {
    LAST_ERROR.with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = None;
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

/// This thread's last error message: empty after a successful call. The
/// string is owned by the library and valid until this thread's next
/// Reservoir call.
#[no_mangle]
pub extern "C" fn reservoir_last_error() -> *const c_char {
    const EMPTY: &CStr = c"";
    catch_unwind(|| {
        LAST_ERROR.with(|l| match l.try_borrow() {
            Ok(l) => l.as_ref().map_or(EMPTY.as_ptr(), |c| c.as_ptr()),
            Err(_) => EMPTY.as_ptr(),
        })
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

/// This thread's last error message, as Rust text (for logging).
pub(crate) fn last_error_string() -> String {
    LAST_ERROR.with(|l| {
        l.try_borrow()
            .ok()
            .and_then(|l| l.as_ref().map(|c| c.to_string_lossy().into_owned()))
            .unwrap_or_default()
    })
}
