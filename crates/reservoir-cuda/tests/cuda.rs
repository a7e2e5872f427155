//! The CUDA backend against a CUDA driver: the fake driver of
//! `../shared/oracle` (run with `../shared/oracle/with-fake-driver cargo
//! test -p reservoir-cuda`).
//!
//! The fake's settings (capacity, stream mode, sanitizer) are process-wide,
//! so the tests take turns ([`Fake::setup`]) and each sets what it needs.
//! Without a driver on the library path (or with a real driver, which has
//! no test hooks) the first test prints a line starting with `SKIPPED-BACKEND`
//! (which fails CI) and passes.

use std::io::Write;
use std::sync::{Mutex, MutexGuard};

use reservoir_cuda::{CudaDevice, FakeDriver};

#[path = "cuda/conformance.rs"]
mod conformance;
#[path = "cuda/contract.rs"]
mod contract;

const MIB: u64 = 1 << 20;

/// Reports why the tests are skipped, once per test binary.
fn skip(reason: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| report(&format!("SKIPPED-BACKEND cuda: {reason}")));
}

/// Writes `line` to stderr past libtest's output capture (which only takes
/// the print macros), on a line of its own, so that CI sees the skip marker
/// and the integrity counts in a plain `cargo test --workspace` log.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "\n{line}");
}

/// How the fake driver runs a test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Work completes at once, except on held streams.
    Default,
    /// `FAKECUDA_ASYNC=1 FAKECUDA_SANITIZE=1`: work stays pending until
    /// synchronised, and cross-stream hazards are reported.
    AsyncSanitized,
}

/// A test's turn with the fake driver (the tests take turns: the fake's
/// settings are process-wide).
type Turn = MutexGuard<'static, ()>;

/// A device, with the fake set to a known state for this test: `capacity`
/// bytes, `mode`, all work completed, the sanitizer counter cleared.
fn device(capacity: u64, mode: Mode) -> Option<(Turn, CudaDevice)> {
    static TURN: Mutex<()> = Mutex::new(());
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dev = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            skip(&e.to_string());
            return None;
        }
    };
    let Some(fake) = dev.fake() else {
        skip(&format!(
            "{} is not the fake driver of ../shared/oracle (these tests need its hooks)",
            dev.name()
        ));
        return None;
    };
    fake.complete_all();
    fake.set_total_mem(capacity);
    let on = mode == Mode::AsyncSanitized;
    fake.set_async(on);
    fake.set_sanitize(i32::from(on));
    fake.sanitizer_reset();
    Some((turn, dev))
}

/// The fake's hooks of a device made by [`device`].
fn hooks(dev: &CudaDevice) -> &FakeDriver {
    dev.fake().expect("checked by device()")
}
