//! A workspace binary run as a user runs it, in a test.

use std::process::{Command, Output};

/// Runs `exe` (e.g. `env!("CARGO_BIN_EXE_reservoir")`) with `args` and
/// waits for it.
pub fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{exe} does not run: {e}"))
}

/// Its standard output, read lossily.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Its standard error, read lossily.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
