//! Compiles `tests/c/test_capi.c` with `cc` against the `cdylib` cargo built
//! for this test run, runs it, and checks its summary line.
//!
//! By hand, from the workspace root:
//!
//! ```sh
//! cargo test -p reservoir-capi --no-run
//! cc -std=c11 -D_DEFAULT_SOURCE -Wall -Wextra -Werror -Icrates/reservoir-capi/include \
//!    crates/reservoir-capi/tests/c/test_capi.c target/debug/deps/libreservoir_capi.so \
//!    -Wl,-rpath,$PWD/target/debug/deps -lpthread -lm -o /tmp/test_capi
//! /tmp/test_capi /tmp
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding this test binary and the crate's library builds.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().expect("deps directory").to_path_buf()
}

/// Compile `tests/c/test_capi.c` against the crate's `cdylib` into the
/// scratch directory as `name`.
fn build_c_program(name: &str) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deps = deps_dir();
    let lib = deps.join("libreservoir_capi.so");
    assert!(
        lib.exists(),
        "{} missing: cargo builds it with the tests",
        lib.display()
    );
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-c");
    std::fs::create_dir_all(&scratch).expect("scratch directory");
    let exe = scratch.join(name);
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args([
            "-std=c11",
            "-D_DEFAULT_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
        ])
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(manifest.join("tests/c/test_capi.c"))
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", deps.display()))
        .args(["-lpthread", "-lm", "-o"])
        .arg(&exe)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc failed on tests/c/test_capi.c");
    exe
}

#[test]
fn c_program_passes() {
    let exe = build_c_program("test_capi");
    let scratch = exe.parent().expect("scratch").to_path_buf();
    let out = Command::new(&exe)
        .arg(&scratch)
        .output()
        .expect("run test_capi");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("capi-c: ") && l.contains(" checks, "))
        .unwrap_or_else(|| panic!("no summary line from test_capi ({})", out.status));
    let checks: u32 = summary["capi-c: ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("check count");
    assert!(summary.ends_with(" 0 failed"), "{summary}\n{stderr}");
    assert!(checks >= 150, "only {checks} checks ran: {summary}");
    assert!(out.status.success(), "test_capi exited with {}", out.status);
}

/// The last-error section of the C program under valgrind (when installed):
/// reading a message after the calls that follow it must not touch freed
/// memory (issue 29).
#[test]
fn last_error_pointers_stay_valid_under_valgrind() {
    let valgrind = Command::new("valgrind").arg("--version").output();
    if !valgrind.is_ok_and(|o| o.status.success()) {
        println!("SKIPPED-BACKEND: valgrind is not installed");
        return;
    }
    let exe = build_c_program("test_capi_vg");
    let scratch = exe.parent().expect("scratch").to_path_buf();
    let out = Command::new("valgrind")
        .args(["--error-exitcode=99", "--leak-check=no", "-q"])
        .arg(&exe)
        .arg(&scratch)
        .arg("last-error")
        .output()
        .expect("run valgrind");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        !stderr.contains("Invalid read"),
        "valgrind found an invalid read:\n{stderr}"
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}\n{stderr}");
    assert!(out.status.success(), "valgrind exited with {}", out.status);
}
