//! # reservoir-python: the `reservoir` Python distribution
//!
//! The native half of the `reservoir` Python package (`python/reservoir/` is
//! the other half). Built by maturin into `reservoir/_native.abi3.so`, this one
//! library is both
//!
//! * the Python extension module `reservoir._native`, and
//! * the allocator library torch loads: it re-exports reservoir-capi's C
//!   entry points (`reservoir_alloc`, `reservoir_free`, ...), so torch finds
//!   them in it. The dynamic loader opens a file once, so the allocator torch
//!   calls and the one these functions read are the same.
//!
//! Modules: [`torch`] (the functions behind `reservoir.torch`), [`cli`] (the
//! `reservoir` command and the engine of `reservoir.replay` /
//! `reservoir.compare`).

#![forbid(unsafe_code)]

use pyo3::prelude::*;

pub mod cli;
pub mod torch;

// The C entry points torch's allocator looks up by name.
pub use reservoir_capi::{
    reservoir_alloc, reservoir_free, reservoir_last_error, reservoir_torch_configure,
    reservoir_torch_empty_cache, reservoir_torch_record_stream, reservoir_torch_stat,
};

pub use torch::ReservoirError;

/// The `reservoir._native` module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("ReservoirError", m.py().get_type::<ReservoirError>())?;
    torch::register(m)?;
    cli::register(m)?;
    Ok(())
}
