//! PyTorch on Reservoir: the functions of `reservoir._native` that
//! `reservoir.torch` (`python/reservoir/torch/__init__.py`) calls, all on the
//! allocators behind the PyTorch entry points of reservoir-capi.
//!
//! Spec: `../shared/spec/pytorch-allocator.md` section 3 (pluggable).

use std::collections::BTreeMap;

use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use reservoir::caching::{HistoryConfig, HistoryMode};
use reservoir::observe::trace::RecordContext;
use reservoir::CachingAllocator;
use reservoir_capi::{torch_configure, with_torch_allocator, Failure};
use reservoir_cuda::CudaDevice;

// The C entry points of the C++ face (`python/reservoir/torch/csrc/`), which
// finds them in this library with `dlsym`.
pub use reservoir_capi::{
    reservoir_torch_attach_trace_tracker, reservoir_torch_base_allocation,
    reservoir_torch_begin_allocate_to_pool, reservoir_torch_buffer_free,
    reservoir_torch_cache_info, reservoir_torch_check_pool_live_allocations,
    reservoir_torch_checkpoint_free, reservoir_torch_checkpoint_pool,
    reservoir_torch_create_or_incref_pool, reservoir_torch_delete, reservoir_torch_device_stats,
    reservoir_torch_empty_cache_pool, reservoir_torch_end_allocate_to_pool,
    reservoir_torch_expandable_segment_sizes, reservoir_torch_is_history_enabled,
    reservoir_torch_malloc, reservoir_torch_memory_fraction, reservoir_torch_pool_use_count,
    reservoir_torch_record_history, reservoir_torch_release_pool,
    reservoir_torch_reset_accumulated_stats, reservoir_torch_reset_peak_stats,
    reservoir_torch_restore_checkpoint, reservoir_torch_set_memory_fraction,
    reservoir_torch_snapshot, reservoir_torch_u64s_free,
};

create_exception!(
    reservoir,
    ReservoirError,
    PyRuntimeError,
    "A Reservoir call failed; the message starts with the status name (RESERVOIR_ERR_...)."
);

/// A failure as a Python `ReservoirError` whose message starts with the
/// status name.
fn to_py(f: Failure) -> PyErr {
    ReservoirError::new_err(format!("{:?}: {}", f.status, f.message))
}

/// A bad argument as a Python `ReservoirError`.
fn invalid(message: String) -> PyErr {
    to_py(Failure::new(
        reservoir_capi::ReservoirStatus::RESERVOIR_ERR_INVALID_ARGUMENT,
        message,
    ))
}

/// The text of the string argument `name`: a `ReservoirError` naming it
/// (`RESERVOIR_ERR_INVALID_ARGUMENT`) when it is not valid Unicode (a lone
/// surrogate has no UTF-8 form), where pyo3's `&str` would raise a
/// `UnicodeEncodeError` that names no argument.
fn text(name: &str, value: Option<&Bound<'_, PyString>>) -> PyResult<Option<String>> {
    value
        .map(|v| {
            v.to_cow().map(|t| t.into_owned()).map_err(|e| {
                let shown = v.repr().map(|r| r.to_string()).unwrap_or_default();
                invalid(format!("{name}={shown} is not valid text ({e})"))
            })
        })
        .transpose()
}

/// `f` on device `device`'s allocator, failures as `ReservoirError`.
fn on<T>(
    name: &str,
    device: i32,
    f: impl FnOnce(&CachingAllocator<CudaDevice>) -> Result<T, reservoir::AllocError>,
) -> PyResult<T> {
    with_torch_allocator(name, device, |a| {
        f(a).map_err(|e| {
            let f = Failure::from(e);
            Failure {
                message: format!("device {device}: {}", f.message),
                ..f
            }
        })
    })
    .map_err(to_py)
}

/// Configure the allocators (`PYTORCH_CUDA_ALLOC_CONF` syntax, `None` for
/// defaults) before the first allocation.
#[pyfunction]
#[pyo3(signature = (conf=None))]
fn configure(conf: Option<Bound<'_, PyString>>) -> PyResult<()> {
    let conf = text("conf", conf.as_ref())?;
    torch_configure(conf.as_deref()).map_err(to_py)
}

/// `torch.cuda.memory_stats(device)`'s flat keys and values, from Reservoir.
#[pyfunction]
fn memory_stats(device: i32) -> PyResult<BTreeMap<String, i64>> {
    on("memory_stats", device, |a| Ok(a.memory_stats()))
}

/// The memory snapshot pickled as `torch.cuda.memory._snapshot()` is.
#[pyfunction]
fn snapshot_pickle(py: Python<'_>, device: i32) -> PyResult<Py<PyBytes>> {
    let bytes = with_torch_allocator("snapshot_pickle", device, |a| {
        a.snapshot(None).to_pickle().map_err(|e| {
            Failure::new(
                reservoir_capi::ReservoirStatus::RESERVOIR_ERR_IO,
                format!("encoding the snapshot: {e}"),
            )
        })
    })
    .map_err(to_py)?;
    Ok(PyBytes::new(py, &bytes).unbind())
}

/// `torch.cuda.memory._record_memory_history(enabled, context, stacks,
/// max_entries, clear_history)` on Reservoir. Stacks are the native frames
/// of the allocating thread (Reservoir cannot walk the Python stack from
/// inside the allocator), whatever `stacks` says.
#[pyfunction]
#[pyo3(signature = (device, enabled, context, max_entries, clear_history))]
fn record_memory_history(
    device: i32,
    enabled: Option<Bound<'_, PyString>>,
    context: Option<Bound<'_, PyString>>,
    max_entries: usize,
    clear_history: bool,
) -> PyResult<()> {
    let enabled = text("enabled", enabled.as_ref())?;
    let context = text("context", context.as_ref())?;
    let enabled = match enabled.as_deref() {
        None => HistoryMode::Off,
        Some("state") => HistoryMode::State,
        Some("all") => HistoryMode::All,
        Some(e) => {
            return Err(invalid(format!(
                "enabled={e:?} is not None, 'state' or 'all'"
            )))
        }
    };
    let context = match context.as_deref() {
        None => RecordContext::Never,
        Some(c) => RecordContext::parse(c).ok_or_else(|| {
            invalid(format!(
                "context={c:?} is not None, 'state', 'alloc' or 'all'"
            ))
        })?,
    };
    if max_entries == 0 {
        return Err(invalid("max_entries=0 (it must be at least 1)".into()));
    }
    let config = HistoryConfig {
        enabled,
        context,
        max_entries,
        clear_history,
        ..HistoryConfig::default()
    };
    on("record_memory_history", device, |a| {
        a.record_memory_history(config);
        Ok(())
    })
}

/// Release the cached segments that are entirely free.
#[pyfunction]
fn empty_cache(device: i32) -> PyResult<()> {
    on("empty_cache", device, |a| a.empty_cache())
}

/// Cap the allocator at `fraction` of the device's memory.
#[pyfunction]
fn set_memory_fraction(device: i32, fraction: f64) -> PyResult<()> {
    on("set_memory_fraction", device, |a| {
        a.set_memory_fraction(fraction)
    })
}

/// The current memory fraction.
#[pyfunction]
fn memory_fraction(device: i32) -> PyResult<f64> {
    on("memory_fraction", device, |a| a.memory_fraction())
}

/// Reset the peak statistics.
#[pyfunction]
fn reset_peak_memory_stats(device: i32) -> PyResult<()> {
    on("reset_peak_memory_stats", device, |a| {
        a.reset_peak_stats();
        Ok(())
    })
}

/// Reset the accumulated (count) statistics.
#[pyfunction]
fn reset_accumulated_memory_stats(device: i32) -> PyResult<()> {
    on("reset_accumulated_memory_stats", device, |a| {
        a.reset_accumulated_stats();
        Ok(())
    })
}

/// Check every allocator invariant; raises naming the first violated one.
#[pyfunction]
fn check_invariants(device: i32) -> PyResult<()> {
    on("check_invariants", device, |a| {
        a.check_invariants()
            .map_err(|v| reservoir::AllocError::InvalidState(v.to_string()))
    })
}

/// Adds this module's functions to `reservoir._native`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(snapshot_pickle, m)?)?;
    m.add_function(wrap_pyfunction!(record_memory_history, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(set_memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(memory_fraction, m)?)?;
    m.add_function(wrap_pyfunction!(reset_peak_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(reset_accumulated_memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(check_invariants, m)?)?;
    Ok(())
}
