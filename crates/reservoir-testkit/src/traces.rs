//! The one locator of the real traces in `../shared/traces`, for every test,
//! benchmark and example of the workspace.

use std::path::{Path, PathBuf};

/// The real-traces folder: `$RESERVOIR_TRACES` when set (`None` if it is not
/// a folder), else `../shared/traces` beside the repository, or beside the
/// folder holding it (a git worktree one level deeper). `None` when absent:
/// callers skip with a message.
pub fn shared_traces() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RESERVOIR_TRACES") {
        let p = PathBuf::from(p);
        return p.is_dir().then_some(p);
    }
    // This crate sits at `<repository>/crates/reservoir-testkit`.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        repo.join("../shared/traces"),
        repo.join("../../shared/traces"),
    ]
    .into_iter()
    .find(|p| p.is_dir())
}

/// The oracle folder (`../shared/oracle`, the real PyTorch allocator on a
/// fake CUDA device): `$RESERVOIR_ORACLE` when set, else beside the
/// repository or beside the folder holding it (as [`shared_traces`]).
/// `None` when it has no `oracle_replay.py`.
pub fn shared_oracle() -> Option<PathBuf> {
    let has_script = |p: &PathBuf| p.join("oracle_replay.py").is_file();
    if let Some(p) = std::env::var_os("RESERVOIR_ORACLE") {
        return Some(PathBuf::from(p)).filter(has_script);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        repo.join("../shared/oracle"),
        repo.join("../../shared/oracle"),
    ]
    .into_iter()
    .find(has_script)
}

/// Where `../shared/oracle/setup-torch.sh` puts the oracle's torch venv
/// and built libraries: `$PYTORCH_ORACLE_HOME`, else
/// `$HOME/.cache/pytorch-oracle` (`None` without either variable; the
/// folder may not exist yet).
pub fn oracle_home() -> Option<PathBuf> {
    std::env::var_os("PYTORCH_ORACLE_HOME")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pytorch-oracle"))
        })
}

/// The file `rel` of the real-traces folder ([`shared_traces`]), if present.
pub fn shared_trace(rel: &str) -> Option<PathBuf> {
    shared_traces().map(|d| d.join(rel)).filter(|p| p.is_file())
}

/// Every trace file under `dir`, recursively, in path order (the `.md`
/// notes, such as `SOURCES.md`, are not traces).
pub fn trace_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if !matches!(p.extension(), Some(x) if x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The oracle folder ([`shared_oracle`]) when its torch venv is set up
/// (`../shared/oracle/setup-torch.sh`); otherwise the test is skipped
/// ([`skip_backend`], `what` naming it): `None`, or a panic in CI.
pub fn torch_oracle(what: &str) -> Option<PathBuf> {
    let Some(oracle) = shared_oracle() else {
        skip_backend(what, "../shared/oracle not found (set RESERVOIR_ORACLE)");
        return None;
    };
    let venv = oracle_home().unwrap_or_default().join("venv");
    if !venv.is_dir() {
        let why = format!(
            "no torch venv at {} (run ../shared/oracle/setup-torch.sh)",
            venv.display()
        );
        skip_backend(what, &why);
        return None;
    }
    Some(oracle)
}

/// Skips a test whose backend is missing: a line starting with
/// `SKIPPED-BACKEND` on standard error, except in CI (`CI=true`), where
/// the test fails instead (CI installs every backend).
pub fn skip_backend(what: &str, why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI needs {what} for this test: {why}");
    }
    eprintln!("\nSKIPPED-BACKEND {what}: {why}");
}
