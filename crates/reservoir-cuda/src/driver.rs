//! Loading the driver without panicking, and turning its results into
//! [`BackendError`]s.
//!
//! cudarc (with `dynamic-loading`) opens `libcuda` on the first driver call
//! and resolves each entry point on its first use, and it panics when
//! either fails. [`Driver::open`] does both checks first with its own
//! `dlopen` of the same library (cudarc's candidate names, in cudarc's
//! order), so a machine without a driver, or a driver without an entry
//! point this crate calls, gets a typed [`CudaError`] instead.

use cudarc::driver::sys::{self, CUresult};
use reservoir::backend::BackendError;

use crate::{CudaError, NAME};

/// Entry points every device needs. cudarc's wrappers resolve exactly these
/// names (the `_v2` ones are the current ABI of the plain names).
const REQUIRED: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemGetInfo_v2",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuEventDestroy_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async",
];

/// Entry points of the virtual-memory capability (expandable segments).
pub(crate) const VMM: &[&str] = &[
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// Entry points of the IPC capability.
pub(crate) const IPC: &[&str] = &[
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemGetAddressRange_v2",
];

/// Entry points of the peer-access capability.
pub(crate) const PEER: &[&str] = &["cuCtxEnablePeerAccess"];

/// The driver library, opened by this crate to check it before cudarc
/// opens it (the same file: `dlopen` hands out the same handle).
pub(crate) struct Driver {
    lib: libloading::Library,
    /// The file name that loaded.
    pub(crate) file: String,
}

impl Driver {
    /// Open the library cudarc will open and check the required entry
    /// points.
    pub(crate) fn open() -> Result<Driver, CudaError> {
        let candidates = cudarc::get_lib_name_candidates("cuda");
        let mut errors = Vec::new();
        for name in &candidates {
            // SAFETY: loading the CUDA driver runs its initialisers, which
            // have no preconditions; cudarc loads the same library the same
            // way right after.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    let driver = Driver {
                        lib,
                        file: name.clone(),
                    };
                    if let Some(missing) = driver.first_missing(REQUIRED) {
                        return Err(CudaError::MissingSymbol {
                            library: driver.file,
                            symbol: missing,
                        });
                    }
                    return Ok(driver);
                }
                Err(e) => errors.push(match std::error::Error::source(&e) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                }),
            }
        }
        Err(CudaError::NoDriver(format!(
            "libcuda could not be loaded under any of its {} names ({}); the first \
             error: {} (install the NVIDIA driver, or put the fake driver of \
             ../shared/oracle on LD_LIBRARY_PATH with its with-fake-driver script)",
            candidates.len(),
            candidates.join(", "),
            errors.first().map(String::as_str).unwrap_or("none")
        )))
    }

    /// Does the library export every one of `names`?
    pub(crate) fn has_all(&self, names: &[&'static str]) -> bool {
        self.first_missing(names).is_none()
    }

    fn first_missing(&self, names: &[&'static str]) -> Option<&'static str> {
        names.iter().copied().find(|n| !self.has(n))
    }

    fn has(&self, name: &str) -> bool {
        // SAFETY: the symbol is only looked up, never called or read
        // through this pointer type.
        unsafe { self.lib.get::<*const ()>(name.as_bytes()) }.is_ok()
    }
}

/// The driver's name of `r` (`CUDA_ERROR_OUT_OF_MEMORY`) and its
/// description.
pub(crate) fn describe(r: CUresult) -> String {
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: `cuGetErrorString` is a checked required entry point; it
    // writes a pointer to a static string (or fails and leaves null).
    let ok = unsafe { sys::cuGetErrorString(r, &mut text) } == CUresult::CUDA_SUCCESS;
    if ok && !text.is_null() {
        // SAFETY: the driver returned a NUL-terminated static string.
        let s = unsafe { std::ffi::CStr::from_ptr(text) };
        format!("{r:?} ({})", s.to_string_lossy())
    } else {
        format!("{r:?}")
    }
}

/// Map a failed driver call to a [`BackendError`] that says what kind of
/// failure it is, with the call and the driver's error name in the text.
/// Out of memory is mapped by the callers, which know the request size.
pub(crate) fn error(call: &'static str, r: CUresult) -> BackendError {
    use CUresult as R;
    let text = format!("{call}: {}", describe(r));
    match r {
        R::CUDA_ERROR_INVALID_VALUE
        | R::CUDA_ERROR_INVALID_HANDLE
        | R::CUDA_ERROR_INVALID_DEVICE
        | R::CUDA_ERROR_INVALID_CONTEXT
        | R::CUDA_ERROR_NOT_FOUND
        | R::CUDA_ERROR_ALREADY_MAPPED
        | R::CUDA_ERROR_NOT_MAPPED
        | R::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => BackendError::InvalidValue(text),
        R::CUDA_ERROR_NOT_SUPPORTED => BackendError::Unsupported {
            backend: NAME,
            what: call,
        },
        R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => BackendError::Unsupported {
            backend: NAME,
            what: "peer access (CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)",
        },
        R::CUDA_ERROR_DEINITIALIZED
        | R::CUDA_ERROR_NO_DEVICE
        | R::CUDA_ERROR_ILLEGAL_ADDRESS
        | R::CUDA_ERROR_LAUNCH_FAILED
        | R::CUDA_ERROR_ECC_UNCORRECTABLE
        | R::CUDA_ERROR_HARDWARE_STACK_ERROR
        | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
        | R::CUDA_ERROR_MISALIGNED_ADDRESS
        | R::CUDA_ERROR_INVALID_PC
        | R::CUDA_ERROR_CONTEXT_IS_DESTROYED
        | R::CUDA_ERROR_DEVICE_UNAVAILABLE => BackendError::DeviceLost(text),
        _ => BackendError::Driver(text),
    }
}

/// `Ok` on success, else [`error`].
pub(crate) fn check(call: &'static str, r: CUresult) -> Result<(), BackendError> {
    match r {
        CUresult::CUDA_SUCCESS => Ok(()),
        r => Err(error(call, r)),
    }
}
