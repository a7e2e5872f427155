//! The `reservoir` command and the engine of the Python API: the functions
//! of `reservoir._native` that `reservoir.__main__` (the console script) and
//! `reservoir._api` (`reservoir.replay`, `reservoir.compare`) call. Both run
//! reservoir-cli's own code ([`reservoir_cli::run`],
//! [`reservoir_cli::run_captured`]), so the Python package and the Rust
//! command never drift.

use std::ffi::OsString;
use std::sync::mpsc::RecvTimeoutError;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::ReservoirError;

/// Run the `reservoir` command line `argv` (the program name first) as the
/// Rust binary does: output on the process's standard output and error,
/// and return its exit status (0, 1 after `error: ...`, 2 for a usage
/// error, 141 when standard output was closed early). The GIL is released
/// while it runs.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<OsString>) -> i32 {
    py.detach(|| reservoir_cli::run(argv))
}

/// Run the `reservoir` command line `argv` (the program name first) with
/// its standard output and its `--html` page kept in memory: returns
/// `(stdout: bytes, html: str | None)`. A failure raises `ReservoirError`
/// with the message the command prints after `error: `; nothing is printed
/// but the command's warnings.
///
/// The command runs on a thread of its own while this one waits without
/// the GIL and checks for signals every 50 ms: Ctrl-C in a notebook or a
/// script raises `KeyboardInterrupt` at once (the abandoned run finishes in
/// the background and its result is dropped).
#[pyfunction]
fn run_captured(py: Python<'_>, argv: Vec<OsString>) -> PyResult<(Py<PyBytes>, Option<String>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("reservoir-run".into())
        .spawn(move || {
            // The receiver is gone when the caller was interrupted.
            let _ = tx.send(reservoir_cli::run_captured(argv));
        })
        .map_err(|e| ReservoirError::new_err(format!("cannot start the run's thread: {e}")))?;
    let mut rx = rx;
    let result =
        loop {
            // The receiver travels into the GIL-free closure and back (it is
            // Send, not Sync).
            let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(50)), rx));
            rx = back;
            match got {
                Ok(result) => break result,
                Err(RecvTimeoutError::Timeout) => py.check_signals()?,
                Err(RecvTimeoutError::Disconnected) => return Err(ReservoirError::new_err(
                    "the run's thread ended without a result (a panic: a bug, please report it)",
                )),
            }
        };
    let captured = result.map_err(|e| ReservoirError::new_err(e.message))?;
    Ok((PyBytes::new(py, &captured.stdout).unbind(), captured.html))
}

/// Add this module's functions to `reservoir._native`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(run_captured, m)?)?;
    Ok(())
}
