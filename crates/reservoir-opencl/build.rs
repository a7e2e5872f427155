//! Finds out whether `libOpenCL.so` can be linked. Without it the crate
//! still builds (the library itself links nothing), but the test binary is
//! compiled as a single test that prints a `SKIPPED-BACKEND` line naming the
//! packages to install, so `cargo test --workspace` works on a fresh machine
//! and CI (which installs them) fails on the skip.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(reservoir_no_libopencl)");
    println!("cargo::rerun-if-env-changed=LIBRARY_PATH");
    let mut dirs: Vec<PathBuf> = std::env::var_os("LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let multiarch = format!(
        "/usr/lib/{}-linux-gnu",
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default()
    );
    for d in [
        multiarch.as_str(),
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/lib64",
        "/lib",
    ] {
        dirs.push(PathBuf::from(d));
    }
    let names = ["libOpenCL.so", "libOpenCL.dylib", "OpenCL.lib"];
    let found = dirs
        .iter()
        .any(|d| names.iter().any(|n| Path::new(d).join(n).exists()));
    // Rerun when the library appears: watch the library directories an
    // install writes to (not all of /usr/lib, which cargo would scan).
    let watched = dirs
        .iter()
        .filter(|d| !matches!(d.to_str(), Some("/usr/lib" | "/lib")));
    for d in watched.filter(|d| d.is_dir()) {
        println!("cargo::rerun-if-changed={}", d.display());
    }
    if !found {
        println!("cargo::rustc-cfg=reservoir_no_libopencl");
        println!(
            "cargo::warning=libOpenCL.so not found: the reservoir-opencl tests will print \
             SKIPPED-BACKEND (Debian: apt-get install ocl-icd-opencl-dev pocl-opencl-icd)"
        );
    }
}
