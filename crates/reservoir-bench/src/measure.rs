//! Out-of-process measurements: PyTorch's allocator through
//! `../shared/oracle/oracle_bench`, and instruction counts of this binary's
//! own loops under `valgrind --tool=callgrind`.

use std::path::{Path, PathBuf};
use std::process::Command;

use reservoir_testkit::traces::{oracle_home, shared_oracle};

use crate::run::Impl;

/// `oracle_bench` in the oracle folder (`../shared/oracle` beside the
/// repository, see [`shared_oracle`]), when PyTorch's allocator has been set up
/// (`setup-torch.sh` built `allocbench`); `RESERVOIR_ORACLE_BENCH` overrides.
pub fn oracle_bench() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RESERVOIR_ORACLE_BENCH") {
        return Some(PathBuf::from(p));
    }
    let script = shared_oracle()?.join("oracle_bench");
    let home = oracle_home()?;
    (script.is_file() && home.join("bin/allocbench").is_file()).then_some(script)
}

/// The fake driver's capacity for PyTorch's runs, in bytes: the fake
/// driver's default, which `SimConfig::like_fake_driver` gives Reservoir,
/// also under callgrind, where `oracle_bench` would lower it to 16 GiB and
/// the larger sequences would run out of memory (only expandable segments
/// need the lower value, and these runs use none).
fn capacity() -> String {
    reservoir::sim::FAKE_DRIVER_CAPACITY.to_string()
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The number after `before` and before `after` on the first line holding both.
fn number_between(text: &str, before: &str, after: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let start = l.find(before)? + before.len();
        let end = start + l[start..].find(after)?;
        l[start..end].trim().parse().ok()
    })
}

/// PyTorch's median ns per op over `reps` replays of the trace file.
pub fn pytorch_ns(bench: &Path, trace: &Path, reps: usize) -> Result<f64, String> {
    let out = run(Command::new(bench)
        .arg("replay")
        .arg(trace)
        .arg(reps.to_string()))?;
    number_between(&out, "ms =", "ns/op").ok_or_else(|| format!("no median in: {out}"))
}

/// PyTorch's instructions per allocator call over `reps` replays.
pub fn pytorch_instructions(bench: &Path, trace: &Path, reps: usize) -> Result<f64, String> {
    let out = run(Command::new(bench)
        .env("FAKECUDA_TOTAL_MEM", capacity())
        .arg("--callgrind")
        .arg("replay")
        .arg(trace)
        .arg(reps.to_string()))?;
    number_between(&out, "calls:", "instructions per call")
        .ok_or_else(|| format!("no instruction count in: {out}"))
}

/// Instructions per allocator call of `imp` over `reps` replays of the
/// trace file: this binary re-run under callgrind with `--child`, counting
/// only its measured loop.
pub fn own_instructions(imp: Impl, trace: &Path, reps: usize) -> Result<f64, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("reservoir-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let cg = dir.join(format!("{}.cg", imp.name()));
    let out = run(Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", cg.display()))
        .arg(format!("--toggle-collect={}", imp.loop_symbol()))
        .arg(&exe)
        .args(["--child", imp.name()])
        .arg(trace)
        .arg(reps.to_string()))?;
    let calls: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("counted_ops=")?.trim().parse().ok())
        .ok_or_else(|| format!("no call count in: {out}"))?;
    let cgtext = std::fs::read_to_string(&cg).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let total: f64 = cgtext
        .lines()
        .find_map(|l| {
            l.strip_prefix("totals:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .ok_or("no totals in the callgrind output")?;
    Ok(total / calls)
}
