//! Issue 44, item 2 (the torch face): the `reservoir_torch_*` entry points
//! (and `reservoir_alloc` / `reservoir_free`), through the C ABI, with the
//! CUDA backend failing at its N-th fallible call, for every N the
//! workload reaches (`reservoir_cuda::faults`, the `fault-injection`
//! feature this crate's tests turn on; the PyTorch entry points build
//! their `CachingAllocator<CudaDevice>` themselves, so the testkit's
//! `FaultyBackend` cannot wrap them).
//!
//! After every call: the allocator's invariant checker, and no status is
//! `RESERVOIR_ERR_PANIC` / `RESERVOIR_ERR_POISONED`. After every run, with
//! the fault cleared: everything the workload still holds is freed, the
//! cache emptied, and nothing is left allocated or reserved, on the
//! allocator's counters and on the fake driver's `used` counter (a leak
//! otherwise). The summary line, written past libtest's capture:
//!
//! `fault injection (torch face, CONFIG): E entry points x N=1..K: R runs, F faults injected, 0 violations, 0 leaks`,
//! once with the default settings and once (in a child process) with
//! `expandable_segments:True`.
//!
//! Runs on the fake CUDA driver
//! (`LD_LIBRARY_PATH=$HOME/.cache/pytorch-oracle/lib`); without a driver,
//! or on a real one (its `used` counter is the fake's), it prints a
//! `SKIPPED-BACKEND` line and passes.

use std::collections::BTreeSet;
use std::ffi::{c_void, CStr};
use std::io::Write;

use reservoir_capi::*;
use reservoir_cuda::faults;

const MIB: usize = 1 << 20;

fn last_error() -> String {
    // SAFETY: NUL-terminated, owned by the library, copied at once.
    unsafe { CStr::from_ptr(reservoir_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Writes `line` to stderr past libtest's output capture.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "\n{line}");
}

/// One run's state: the pointers the workload holds, what it saw.
#[derive(Default)]
struct Run {
    live: Vec<*mut c_void>,
    violations: Vec<String>,
    entry_points: BTreeSet<&'static str>,
}

impl Run {
    /// Record the answer of `name` and check the allocator after it.
    fn after(&mut self, name: &'static str, s: ReservoirStatus) -> bool {
        self.entry_points.insert(name);
        if matches!(
            s,
            ReservoirStatus::RESERVOIR_ERR_PANIC | ReservoirStatus::RESERVOIR_ERR_POISONED
        ) {
            self.violations
                .push(format!("{name} answered {s:?}: {}", last_error()));
        }
        self.check(name);
        s == ReservoirStatus::RESERVOIR_OK
    }

    /// The invariant checker of device 0's allocator.
    fn check(&mut self, name: &str) {
        let r = with_torch_allocator("torch_faults", 0, |a| Ok(a.check_invariants()));
        match r {
            Ok(Ok(())) => {}
            Ok(Err(v)) => self.violations.push(format!("after {name}: {v}")),
            Err(e) => self
                .violations
                .push(format!("after {name}: no allocator: {e}")),
        }
    }

    fn malloc(&mut self, size: usize) {
        self.malloc_on(size, std::ptr::null_mut());
    }

    fn malloc_on(&mut self, size: usize, stream: *mut c_void) {
        let mut p = std::ptr::null_mut();
        // SAFETY: `stream` is null or a live stream of device 0; `p` a live
        // local; no OOM report.
        let s = unsafe { reservoir_torch_malloc(size, 0, stream, &mut p, std::ptr::null_mut()) };
        if self.after("reservoir_torch_malloc", s) && !p.is_null() {
            self.live.push(p);
        }
    }

    /// Free the `i`-th live pointer (from the end when `i` is past it).
    fn delete(&mut self, i: usize) {
        if self.live.is_empty() {
            return;
        }
        let i = i.min(self.live.len() - 1);
        let p = self.live[i];
        let s = reservoir_torch_delete(p);
        if self.after("reservoir_torch_delete", s) {
            self.live.remove(i);
        }
    }
}

/// The workload: one call per step, the fault armed throughout.
fn workload(run: &mut Run, pool: (u64, u64), stream: *mut c_void) {
    run.malloc(MIB);
    run.malloc(3 * MIB);
    run.malloc(512);
    // SAFETY: default stream.
    let p = unsafe { reservoir_alloc(25 * MIB as isize, 0, std::ptr::null_mut()) };
    run.after("reservoir_alloc", ReservoirStatus::RESERVOIR_OK);
    if !p.is_null() {
        run.live.push(p);
    }
    run.delete(1);
    // A second stream: record_stream, so frees record events that later
    // allocations query (record_event, query_event, destroy_event).
    run.malloc_on(5 * MIB, stream);
    if let Some(&p) = run.live.first() {
        // SAFETY: `p` is live, `stream` a live stream of device 0.
        let s = unsafe { reservoir_torch_record_stream(p, stream) };
        run.after("reservoir_torch_record_stream", s);
        run.delete(0);
    }
    run.malloc(2 * MIB);
    run.malloc_on(MIB / 2, stream);
    // SAFETY: null filter and context (the calling thread's allocations).
    let s = unsafe {
        reservoir_torch_begin_allocate_to_pool(0, pool.0, pool.1, None, std::ptr::null_mut(), None)
    };
    let begun = run.after("reservoir_torch_begin_allocate_to_pool", s);
    run.malloc(4 * MIB);
    run.malloc(700);
    if begun {
        let s = reservoir_torch_end_allocate_to_pool(0, pool.0, pool.1);
        run.after("reservoir_torch_end_allocate_to_pool", s);
    }
    let mut ckpt = std::ptr::null_mut();
    // SAFETY: `ckpt` a live local.
    let s = unsafe { reservoir_torch_checkpoint_pool(0, pool.0, pool.1, &mut ckpt) };
    run.after("reservoir_torch_checkpoint_pool", s);
    // SAFETY: null or from the call above.
    unsafe { reservoir_torch_checkpoint_free(ckpt) };
    run.delete(usize::MAX);
    run.delete(usize::MAX);
    if begun {
        let s = reservoir_torch_release_pool(0, pool.0, pool.1);
        run.after("reservoir_torch_release_pool", s);
    }
    let s = reservoir_torch_empty_cache_pool(pool.0, pool.1);
    run.after("reservoir_torch_empty_cache_pool", s);
    let mut largest = 0u64;
    // SAFETY: a live local.
    let s = unsafe { reservoir_torch_cache_info(0, &mut largest) };
    run.after("reservoir_torch_cache_info", s);
    let mut stats = vec![0i64; RESERVOIR_TORCH_DEVICE_STATS_LEN];
    // SAFETY: `stats` holds LEN values.
    let s = unsafe { reservoir_torch_device_stats(0, stats.as_mut_ptr(), stats.len()) };
    run.after("reservoir_torch_device_stats", s);
    let s = reservoir_torch_reset_peak_stats(0);
    run.after("reservoir_torch_reset_peak_stats", s);
    if let Some(&p) = run.live.first() {
        let (mut base, mut size) = (std::ptr::null_mut(), 0u64);
        // SAFETY: live locals.
        let s = unsafe { reservoir_torch_base_allocation(p, &mut base, &mut size) };
        run.after("reservoir_torch_base_allocation", s);
    }
    // Out of memory: the retry chain (cache flush, mem_info) under faults.
    run.malloc(1 << 42);
    let s = reservoir_torch_set_memory_fraction(0, 0.5);
    run.after("reservoir_torch_set_memory_fraction", s);
    run.malloc(1 << 40);
    let s = reservoir_torch_set_memory_fraction(0, 1.0);
    run.after("reservoir_torch_set_memory_fraction", s);
    if let Some(p) = run.live.pop() {
        reservoir_free(p, 0, 0, std::ptr::null_mut());
        run.after("reservoir_free", ReservoirStatus::RESERVOIR_OK);
        if !last_error().is_empty() {
            // Still allocated (the free failed and said so): keep it.
            run.live.push(p);
        }
    }
    run.malloc(6 * MIB);
    let s = reservoir_torch_empty_cache(0);
    run.after("reservoir_torch_empty_cache", s);
    let (mut buf, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: live locals; the buffer is freed below.
    let s = unsafe { reservoir_torch_snapshot(0, 0, true, &mut buf, &mut len) };
    if run.after("reservoir_torch_snapshot", s) {
        // SAFETY: what the call returned.
        unsafe { reservoir_torch_buffer_free(buf, len) };
    }
    let mut v = 0i64;
    // SAFETY: a NUL-terminated key and a live local.
    let s = unsafe { reservoir_torch_stat(0, c"reserved_bytes.all.current".as_ptr(), &mut v) };
    run.after("reservoir_torch_stat", s);
    let mut count = 0usize;
    // SAFETY: null `out` with capacity 0, a live `count`.
    let s =
        unsafe { reservoir_torch_expandable_segment_sizes(0, std::ptr::null_mut(), 0, &mut count) };
    run.after("reservoir_torch_expandable_segment_sizes", s);
    run.delete(0);
}

/// With the fault cleared: free what the run holds, empty the cache;
/// `None` when nothing is left, else what leaked.
fn clean_up(run: &mut Run, used_before: u64, used: &dyn Fn() -> u64) -> Option<String> {
    faults::clear();
    let mut leaks = Vec::new();
    for p in std::mem::take(&mut run.live) {
        let s = reservoir_torch_delete(p);
        if s != ReservoirStatus::RESERVOIR_OK {
            leaks.push(format!("delete {p:p}: {s:?}: {}", last_error()));
        }
    }
    let s = reservoir_torch_empty_cache_pool(0, 0);
    if s != ReservoirStatus::RESERVOIR_OK {
        leaks.push(format!("empty_cache_pool: {s:?}: {}", last_error()));
    }
    run.check("the clean-up");
    let keys = with_torch_allocator("torch_faults", 0, |a| Ok(a.memory_stats())).unwrap();
    for k in ["allocated_bytes.all.current", "reserved_bytes.all.current"] {
        if keys[k] != 0 {
            leaks.push(format!("{k} is {}", keys[k]));
        }
    }
    let now = used();
    if now != used_before {
        leaks.push(format!(
            "the driver's used bytes are {now}, {used_before} before"
        ));
    }
    (!leaks.is_empty()).then(|| leaks.join("; "))
}

/// The child's configuration (see [`torch_face_under_backend_faults`]).
const CONF_ENV: &str = "RESERVOIR_TORCH_FAULTS_CONF";

/// The sweep on device 0, configured by `conf`; its summary line.
fn sweep(conf: &str, fake: &reservoir_cuda::FakeDriver) -> String {
    torch_configure(Some(conf)).expect("configure before the first allocation");
    let used = || fake.stat("used").expect("the fake's used counter");
    // Build device 0's allocator and the second stream, then take the
    // baseline.
    let mut warm = Run::default();
    warm.malloc(MIB);
    let _ = clean_up(&mut warm, used(), &used);
    use cudarc::driver::sys;
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: the entry points loaded the driver and made device 0's
    // primary context current on this thread; `raw` is a live local.
    let r = unsafe { sys::cuStreamCreate(&mut raw, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let stream = raw.cast::<c_void>();
    let base = used();

    // The fault-free run: how many backend calls the workload makes.
    let mut run = Run::default();
    let c0 = faults::calls();
    workload(&mut run, (1, 7), stream);
    let k = faults::calls() - c0;
    if let Some(l) = clean_up(&mut run, base, &used) {
        panic!("{conf:?}: the fault-free run leaks: {l}");
    }
    assert!(run.violations.is_empty(), "{:?}", run.violations);
    assert!(k > 10, "the workload made only {k} backend calls");
    let entry_points = run.entry_points.len();

    let (mut runs, mut violations, mut leaks) = (1u64, Vec::new(), Vec::new());
    let injected_before = faults::injected();
    for n in 1..=k {
        let mut run = Run::default();
        faults::fail_nth(n);
        workload(&mut run, (n + 1, 7), stream);
        faults::clear();
        if let Some(l) = clean_up(&mut run, base, &used) {
            leaks.push(format!("N={n}: {l}"));
        }
        violations.extend(run.violations.into_iter().map(|v| format!("N={n}: {v}")));
        runs += 1;
    }
    let injected = faults::injected() - injected_before;
    let conf_shown = if conf.is_empty() { "defaults" } else { conf };
    let line = format!(
        "fault injection (torch face, {conf_shown}): {entry_points} entry points x N=1..{k}: \
         {runs} runs, {injected} faults injected, {} violations, {} leaks",
        violations.len(),
        leaks.len()
    );
    report(&line);
    assert!(
        violations.is_empty(),
        "{conf:?}: violations:\n{}",
        violations.join("\n")
    );
    assert!(leaks.is_empty(), "{conf:?}: leaks:\n{}", leaks.join("\n"));
    assert!(
        injected * 2 >= k,
        "{conf:?}: only {injected} of {k} faults were injected (the workload's calls changed)"
    );
    // SAFETY: `raw` is a live stream; its work is done (clean-up synced).
    let r = unsafe { sys::cuStreamDestroy_v2(raw) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    line
}

/// The sweep with the default settings here, and with expandable segments
/// (the driver's virtual-memory calls) in a child process: the PyTorch
/// allocators are configured once per process.
#[test]
fn torch_face_under_backend_faults() {
    let probe = match reservoir_cuda::CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            report(&format!(
                "SKIPPED-BACKEND cuda (reservoir-capi torch_faults): {e}"
            ));
            return;
        }
    };
    let Some(fake) = probe.fake() else {
        report(
            "SKIPPED-BACKEND cuda (reservoir-capi torch_faults): not the fake driver \
             (needs its used counter)",
        );
        return;
    };
    if let Ok(conf) = std::env::var(CONF_ENV) {
        sweep(&conf, fake);
        return;
    }
    sweep("", fake);
    let conf = "expandable_segments:True";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "torch_face_under_backend_faults",
            "--test-threads=1",
        ])
        .env(CONF_ENV, conf)
        .output()
        .expect("run the child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("fault injection (torch face"))
        .unwrap_or_else(|| {
            panic!(
                "no summary from the {conf} child ({}):\n{stderr}",
                out.status
            )
        });
    report(line);
    assert!(
        out.status.success(),
        "the {conf} child failed:\n{}\n{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
}
