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
#[path = "cuda/ipc.rs"]
mod ipc;

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

/// The variable that makes [`child_process_entry`] do something: the job of
/// a child process started by [`run_child`].
const CHILD_ENV: &str = "RESERVOIR_CUDA_TEST_CHILD";

/// Run this test binary again as a child process running only
/// [`child_process_entry`] with `job`, with `env` changes; returns its
/// output, after asserting that it succeeded.
fn run_child(job: &str, configure: impl FnOnce(&mut std::process::Command)) -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = std::process::Command::new(exe);
    cmd.args([
        "--exact",
        "child_process_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD_ENV, job);
    configure(&mut cmd);
    let out = cmd.output().expect("the child process starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {job:?} failed:\n{text}");
    text
}

/// Does nothing in a normal run. In a child process started by
/// [`run_child`] it runs the job named by [`CHILD_ENV`]:
/// * `no-driver`: the library path has no driver; `CudaDevice::new` must
///   answer `CudaError::NoDriver` (not panic);
/// * `ipc <hex handle> <len> <checksum>`: open an allocation exported by
///   the parent process and check its contents;
/// * `alloc-ipc ...`: the same through a caching allocator, writing back
///   (see `ipc::child_alloc_ipc`).
#[test]
fn child_process_entry() {
    let Ok(job) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut words = job.split_whitespace();
    match words.next() {
        Some("no-driver") => match CudaDevice::new(0) {
            Err(reservoir_cuda::CudaError::NoDriver(e)) => println!("child: no driver: {e}"),
            Ok(d) => println!(
                "child: a driver installed on the system loaded: {}",
                d.name()
            ),
            Err(e) => println!("child: a driver installed on the system failed: {e}"),
        },
        Some("ipc") => {
            let hex = words.next().expect("handle");
            let len: u64 = words.next().expect("len").parse().unwrap();
            let sum: u64 = words.next().expect("checksum").parse().unwrap();
            let mut bytes = [0u8; 64];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
            }
            let dev = CudaDevice::new(0).expect("the fake driver in the child");
            let p = dev.ipc_open(&reservoir_cuda::IpcMemHandle(bytes)).unwrap();
            let got = dev.read(p, len, reservoir::StreamId::DEFAULT).unwrap();
            assert_eq!(reservoir_cuda::checksum(&got), sum, "imported contents");
            dev.ipc_close(p).unwrap();
            println!("child: imported {len} bytes at {p}, contents match");
        }
        Some("alloc-ipc") => ipc::child_alloc_ipc(words),
        other => panic!("unknown child job {other:?}"),
    }
}
