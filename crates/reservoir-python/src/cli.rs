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
use pyo3::types::{PyBytes, PyString};

use crate::ReservoirError;

/// The command line `argv`, each element a `str`, `bytes` or `os.PathLike`
/// encoded as `os.fsencode` encodes it: a `str` is the file-system encoding
/// of its text, its surrogate-escaped bytes (`\udc80`-`\udcff`, as Python
/// decodes undecodable file names and command-line bytes) the bytes they
/// stand for. An element with no such encoding (a lone surrogate outside
/// that range) raises `ReservoirError` naming it, as does any other type;
/// nothing panics (pyo3's own `OsString` extraction panics on such a
/// string).
fn argv_of(argv: &Bound<'_, PyAny>) -> PyResult<Vec<OsString>> {
    let py = argv.py();
    let fsencode = py.import("os")?.getattr("fsencode")?;
    if argv.is_instance_of::<PyString>() || argv.is_instance_of::<PyBytes>() {
        return Err(ReservoirError::new_err(
            "argv: expected a list of arguments, got one string",
        ));
    }
    let items = argv.try_iter().map_err(|e| {
        ReservoirError::new_err(format!("argv: expected a list of arguments ({e})"))
    })?;
    let mut out = Vec::new();
    for (i, item) in items.enumerate() {
        let item = item?;
        let encoded = fsencode.call1((&item,)).map_err(|e| {
            let what = item
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "?".into());
            ReservoirError::new_err(format!(
                "argv[{i}]={what}: not a command-line argument ({e})"
            ))
        })?;
        let bytes = encoded.cast::<PyBytes>()?.as_bytes().to_vec();
        out.push(os_string(i, bytes)?);
    }
    Ok(out)
}

/// The bytes of argument `i` as an `OsString`.
#[cfg(unix)]
fn os_string(_i: usize, bytes: Vec<u8>) -> PyResult<OsString> {
    use std::os::unix::ffi::OsStringExt;
    Ok(OsString::from_vec(bytes))
}

/// The bytes of argument `i` as an `OsString` (UTF-8 off Unix).
#[cfg(not(unix))]
fn os_string(i: usize, bytes: Vec<u8>) -> PyResult<OsString> {
    String::from_utf8(bytes)
        .map(OsString::from)
        .map_err(|e| ReservoirError::new_err(format!("argv[{i}]: not UTF-8 ({e})")))
}

/// Run the `reservoir` command line `argv` (the program name first) as the
/// Rust binary does: output on the process's standard output and error,
/// and return its exit status (0, 1 after `error: ...`, 2 for a usage
/// error, 141 when standard output was closed early). The GIL is released
/// while it runs.
#[pyfunction]
fn run(py: Python<'_>, argv: &Bound<'_, PyAny>) -> PyResult<i32> {
    let argv = argv_of(argv)?;
    Ok(py.detach(|| reservoir_cli::run(argv)))
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
fn run_captured(
    py: Python<'_>,
    argv: &Bound<'_, PyAny>,
) -> PyResult<(Py<PyBytes>, Option<String>)> {
    let argv = argv_of(argv)?;
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
