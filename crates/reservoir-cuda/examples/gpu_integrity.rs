//! The CUDA backend's integrity runs as one program, for a real GPU (run by
//! `tools/gpu-check.sh`, built by `tools/gpu-pack.sh`; no Rust is needed
//! where it runs). The tests in `tests/cuda/` need the fake driver's hooks;
//! this program needs none of them, so it runs on a real driver, and on the
//! fake driver of `../shared/oracle` for the dry run (where it also reads
//! the fake's sanitizer counter when `FAKECUDA_SANITIZE=1`).
//!
//! Checks (each prints `gpu-integrity: NAME: ok ...` or `... FAILED: why`):
//! * `device`: the driver, the device's name and memory;
//! * `integrity ...`: `reservoir_testkit::conformance::integrity_run`
//!   (10,000 seeded multi-stream operations, every read-back compared) with
//!   PyTorch's policy on plain segments (`cuMemAlloc`), on expandable
//!   segments (`cuMemCreate` + `cuMemMap`), the cross-stream-reuse and
//!   `reservoir` policies, and the MPS heap allocator;
//! * `virtual memory`: a reservation mapped page by page, written, read
//!   back, unmapped and released directly;
//! * `events`: an event recorded after a large fill on a second stream,
//!   waited for by the default stream, queried, and the event pool reused;
//! * `ipc`: a block shared through the caching allocator with a second
//!   process (this program run again), which checks the parent's bytes and
//!   writes its own, which the parent then sees.
//!
//! Ends with `gpu-integrity: N passed, M failed`; the exit status is 1 when
//! a check failed. `--ops N` (default 10,000, the tests' run) and
//! `--event-mib N` (default 256) make a shorter run (the dry run on the fake
//! driver, whose memsets are host memsets, uses 800 and 16).
//!
//! ```sh
//! ../shared/oracle/with-fake-driver cargo run -p reservoir-cuda --example gpu_integrity
//! ```

use std::process::Command;
use std::time::Instant;

use reservoir::config::heap::HeapSettings;
use reservoir::heap::HeapAllocator;
use reservoir::{AllocatorConfig, Backend, CachingAllocator, DevicePtr, StreamId};
use reservoir_cuda::{checksum_of_fill, CudaDevice, DeviceWork};
use reservoir_testkit::conformance::{integrity_run, IntegrityConfig, IntegrityReport};

const S0: StreamId = StreamId::DEFAULT;
const MIB: u64 = 1 << 20;
/// The block shared with the child process (large pool, after a first
/// block in the same segment, so its offset is not 0).
const IPC_LEN: u64 = 1_500_000;
/// What the child writes over the shared block.
const CHILD_BYTE: u8 = 0x77;

type Check = Result<String, String>;

/// Settings from the command line.
#[derive(Clone, Copy)]
struct Opts {
    /// Operations of each integrity run.
    ops: u64,
    /// Bytes of the buffer the events check fills.
    event_bytes: u64,
}

fn opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        ops: IntegrityConfig::backend_run().ops,
        event_bytes: 256 * MIB,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || -> Result<u64, String> {
            let v = it.next().ok_or(format!("{a} needs a value"))?;
            v.parse().map_err(|e| format!("{a} {v:?}: {e}"))
        };
        match a.as_str() {
            "--ops" => o.ops = val()?,
            "--event-mib" => o.event_bytes = val()? * MIB,
            _ => {
                return Err(format!(
                    "unknown argument {a:?} (known: --ops N, --event-mib N)"
                ))
            }
        }
    }
    Ok(o)
}

/// The integrity run's settings: the tests' run, with `ops` operations.
fn run_config(o: Opts) -> IntegrityConfig {
    IntegrityConfig {
        ops: o.ops,
        ..IntegrityConfig::backend_run()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("ipc-child") {
        match ipc_child(&args[2..]) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                println!("child: FAILED: {e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let o = match opts(&args[1..]) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("gpu-integrity: {e}");
            std::process::exit(2);
        }
    };
    let mut passed = 0;
    let mut failed = 0;
    let mut run = |name: &str, f: &dyn Fn() -> Check| {
        let t = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&*p))));
        let secs = t.elapsed().as_secs_f64();
        match r {
            Ok(what) => {
                passed += 1;
                println!("gpu-integrity: {name}: ok ({secs:.2} s) {what}");
            }
            Err(why) => {
                failed += 1;
                println!("gpu-integrity: {name}: FAILED ({secs:.2} s): {why}");
            }
        }
    };
    run("device", &check_device);
    run("integrity (pytorch policy, plain segments)", &|| {
        caching_integrity(AllocatorConfig::default(), o)
    });
    run("integrity (pytorch policy, expandable segments)", &|| {
        let mut c = AllocatorConfig::default();
        c.expandable_segments = true;
        caching_integrity(c, o)
    });
    run("integrity (cross-stream reuse)", &|| {
        let mut c = AllocatorConfig::default();
        c.policy = reservoir::config::ReservoirPolicy::CrossStreamReuse;
        caching_integrity(c, o)
    });
    run("integrity (reservoir policy)", &|| {
        caching_integrity(
            AllocatorConfig::parse_with_policy("policy:reservoir").map_err(|e| e.to_string())?,
            o,
        )
    });
    run("integrity (mps heap)", &|| heap_integrity(o));
    run("virtual memory", &check_virtual_memory);
    run("events", &|| check_events(o));
    run("ipc", &check_ipc);
    println!("gpu-integrity: {passed} passed, {failed} failed");
    if failed > 0 {
        std::process::exit(1);
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn device() -> Result<CudaDevice, String> {
    CudaDevice::new(0).map_err(|e| format!("CudaDevice::new(0): {e}"))
}

/// Sanitizer reports so far (the fake driver with `FAKECUDA_SANITIZE=1`);
/// `None` on a real driver.
fn sanitizer(dev: &CudaDevice) -> Option<u64> {
    dev.fake().map(|f| f.sanitizer_violations())
}

fn check_device() -> Check {
    let dev = device()?;
    let info = dev.mem_info().map_err(|e| e.to_string())?;
    let vm = dev
        .as_virtual_memory()
        .map(|v| format!("virtual memory, granularity {} bytes", v.granularity()))
        .unwrap_or_else(|| "no virtual memory".into());
    Ok(format!(
        "{} ({} driver), {} of {} bytes free, {vm}, IPC {}",
        dev.name(),
        if dev.fake().is_some() { "fake" } else { "real" },
        info.free,
        info.total,
        if dev.supports_ipc() { "yes" } else { "no" },
    ))
}

/// Judge an integrity run: no corruption, enough read-backs and copies,
/// no sanitizer report, nothing left allocated.
fn judge(rep: &IntegrityReport, reports: Option<u64>, allocated: i64, extra: String) -> Check {
    let summary = format!(
        "{} ops, {} streams, {} corruptions, {} sanitizer reports ({} read-backs, {} copies, \
         {} frees, {} empty_cache, peak reserved {} bytes{extra})",
        rep.ops,
        rep.streams,
        rep.corruptions.len(),
        reports.map_or("n/a (real driver)".to_string(), |r| r.to_string()),
        rep.verified,
        rep.copies,
        rep.frees,
        rep.empty_caches,
        rep.peak_reserved,
    );
    if !rep.corruptions.is_empty() {
        return Err(format!(
            "{summary}; first corruptions: {:?}",
            &rep.corruptions[..rep.corruptions.len().min(5)]
        ));
    }
    if reports.unwrap_or(0) != 0 {
        return Err(format!("{summary}: sanitizer reports"));
    }
    // The tests' thresholds (1,000 read-backs and 500 copies in 10,000
    // operations), scaled to the run's length.
    if rep.verified * 10 <= rep.ops || rep.copies * 20 <= rep.ops {
        return Err(format!("{summary}: too few read-backs or copies"));
    }
    if allocated != 0 {
        return Err(format!("{summary}: {allocated} bytes still allocated"));
    }
    Ok(summary)
}

fn caching_integrity(config: AllocatorConfig, o: Opts) -> Check {
    let dev = device()?;
    let before = sanitizer(&dev);
    let a = CachingAllocator::new(dev, config);
    let rep = integrity_run(&a, &run_config(o)).map_err(|e| e.to_string())?;
    a.check_invariants()
        .map_err(|e| format!("invariants: {e}"))?;
    let reports = sanitizer(a.backend()).map(|n| n - before.unwrap_or(0));
    let extra = format!(
        ", {} cross-stream reuses, {} segment allocations",
        a.cross_stream_reuses(),
        a.stats().num_device_alloc
    );
    let allocated = a.stats().allocated_bytes.all().current;
    judge(&rep, reports, allocated, extra)
}

fn heap_integrity(o: Opts) -> Check {
    let dev = device()?;
    let before = sanitizer(&dev);
    let mut settings = HeapSettings::new(false);
    settings.free_waits_for_events = true;
    let a = HeapAllocator::new(dev, settings).map_err(|e| e.to_string())?;
    let rep = integrity_run(&a, &run_config(o)).map_err(|e| e.to_string())?;
    a.check_invariants()
        .map_err(|e| format!("invariants: {e}"))?;
    let reports = sanitizer(a.backend()).map(|n| n - before.unwrap_or(0));
    let extra = format!(", {} heap allocations", a.stats().num_device_alloc);
    judge(
        &rep,
        reports,
        a.stats().allocated_bytes.all().current,
        extra,
    )
}

fn check_virtual_memory() -> Check {
    let dev = device()?;
    let vm = dev
        .as_virtual_memory()
        .ok_or("the device reports no virtual memory management")?;
    let g = vm.granularity();
    let r = vm.reserve(64 * g).map_err(|e| format!("reserve: {e}"))?;
    let base = DevicePtr(r.base.0);
    // Map pages 3..7, write pages 3..7 with two values, read back, unmap
    // page 4 and map it again: its new contents are written and read again.
    vm.map(r, 3 * g, 4 * g).map_err(|e| format!("map: {e}"))?;
    let p3 = DevicePtr(base.0 + 3 * g);
    let p5 = DevicePtr(base.0 + 5 * g);
    dev.fill(p3, 2 * g, 0x31, S0).map_err(|e| e.to_string())?;
    dev.fill(p5, 2 * g, 0x53, S0).map_err(|e| e.to_string())?;
    let c3 = dev.checksum(p3, 2 * g, S0).map_err(|e| e.to_string())?;
    let c5 = dev.checksum(p5, 2 * g, S0).map_err(|e| e.to_string())?;
    if c3 != checksum_of_fill(0x31, 2 * g) || c5 != checksum_of_fill(0x53, 2 * g) {
        return Err("mapped pages read back other bytes than written".into());
    }
    vm.unmap(r, 4 * g, g).map_err(|e| format!("unmap: {e}"))?;
    if dev.fill(DevicePtr(base.0 + 4 * g), g, 1, S0).is_ok() {
        return Err("a fill of an unmapped page was accepted".into());
    }
    vm.map(r, 4 * g, g).map_err(|e| format!("map again: {e}"))?;
    dev.fill(DevicePtr(base.0 + 4 * g), g, 0x44, S0)
        .map_err(|e| e.to_string())?;
    let c4 = dev
        .checksum(DevicePtr(base.0 + 4 * g), g, S0)
        .map_err(|e| e.to_string())?;
    let c6 = dev
        .checksum(DevicePtr(base.0 + 6 * g), g, S0)
        .map_err(|e| e.to_string())?;
    if c4 != checksum_of_fill(0x44, g) || c6 != checksum_of_fill(0x53, g) {
        return Err("a remapped page or its neighbour read back other bytes".into());
    }
    vm.unmap(r, 3 * g, 4 * g)
        .map_err(|e| format!("unmap: {e}"))?;
    vm.release(r).map_err(|e| format!("release: {e}"))?;
    let (live, bytes) = dev.live();
    if live != 0 {
        return Err(format!("{live} allocations ({bytes} bytes) left live"));
    }
    Ok(format!(
        "reserved {} bytes, mapped/unmapped/remapped pages of {g} bytes, contents intact",
        64 * g
    ))
}

fn check_events(o: Opts) -> Check {
    let dev = device()?;
    let e = |what: &str| {
        let what = what.to_string();
        move |err: reservoir::BackendError| format!("{what}: {err}")
    };
    let s1 = dev.create_stream().map_err(e("create_stream"))?;
    let len = o.event_bytes;
    let big = dev.allocate(len, s1).map_err(e("allocate"))?;
    let t = Instant::now();
    for i in 0..8u8 {
        dev.fill(big, len, 0x10 + i, s1).map_err(e("fill"))?;
    }
    let ev = dev.record_event(s1).map_err(e("record_event"))?;
    let pending_right_after = !dev.query_event(ev).map_err(e("query_event"))?;
    dev.stream_wait_event(S0, ev)
        .map_err(e("stream_wait_event"))?;
    // The default stream reads after the wait: it sees the last fill.
    let sum = dev.checksum(big, len, S0).map_err(e("read"))?;
    if sum != checksum_of_fill(0x17, len) {
        return Err("the default stream read before the waited-for event".into());
    }
    if !dev.query_event(ev).map_err(e("query_event"))? {
        return Err("the event is not complete after the stream waited for it".into());
    }
    let elapsed = t.elapsed().as_micros();
    dev.synchronize_event(ev).map_err(e("synchronize_event"))?;
    dev.destroy_event(ev).map_err(e("destroy_event"))?;
    // The pool hands the destroyed event out again.
    let ev2 = dev.record_event(S0).map_err(e("record_event"))?;
    dev.synchronize_event(ev2).map_err(e("synchronize_event"))?;
    let (pooled, in_use) = dev.event_counts();
    dev.destroy_event(ev2).map_err(e("destroy_event"))?;
    dev.free(big, len).map_err(e("free"))?;
    Ok(format!(
        "8 fills of {len} bytes on a second stream, event pending right after: \
         {pending_right_after}, the default stream waited and read them in {elapsed} us; \
         event pool: {pooled} pooled, {in_use} in use"
    ))
}

fn check_ipc() -> Check {
    let dev = device()?;
    if !dev.supports_ipc() {
        return Err("the driver exports no cuIpc* entry points".into());
    }
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let err = |what: &'static str| move |e: reservoir::AllocError| format!("{what}: {e}");
    let first = a.raw_alloc(MIB + 4096, S0).map_err(err("alloc"))?;
    let shared = a.raw_alloc(IPC_LEN, S0).map_err(err("alloc"))?;
    let dev = a.backend();
    dev.fill(first, MIB + 4096, 0x11, S0)
        .map_err(|e| e.to_string())?;
    dev.fill(shared, IPC_LEN, 0x3d, S0)
        .map_err(|e| e.to_string())?;
    dev.synchronize_stream(S0).map_err(|e| e.to_string())?;
    let share = a
        .share_ipc_handle(shared)
        .map_err(err("share_ipc_handle"))?;
    if share.offset != shared.0 - first.0 {
        return Err(format!(
            "offset {} is not the block's offset in its segment",
            share.offset
        ));
    }
    let hex: String = share.handle.iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args([
            "ipc-child".to_string(),
            hex,
            share.offset.to_string(),
            IPC_LEN.to_string(),
            checksum_of_fill(0x3d, IPC_LEN).to_string(),
            CHILD_BYTE.to_string(),
        ])
        .output()
        .map_err(|e| format!("starting the child: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(format!("child failed: {}", text.trim()));
    }
    let got = dev
        .checksum(shared, IPC_LEN, S0)
        .map_err(|e| e.to_string())?;
    if got != checksum_of_fill(CHILD_BYTE, IPC_LEN) {
        return Err("the child's writes are not visible in the parent".into());
    }
    let rest = dev
        .checksum(first, MIB + 4096, S0)
        .map_err(|e| e.to_string())?;
    if rest != checksum_of_fill(0x11, MIB + 4096) {
        return Err("the rest of the shared segment changed".into());
    }
    a.raw_free(first).map_err(err("free"))?;
    a.raw_free(shared).map_err(err("free"))?;
    a.check_invariants()
        .map_err(|e| format!("invariants: {e}"))?;
    let report = a.close();
    if !report.is_clean() {
        return Err(format!("close: {report:?}"));
    }
    Ok(format!(
        "parent shared {IPC_LEN} bytes at offset {} of a segment; {}; the parent sees the \
         child's bytes",
        share.offset,
        text.trim()
    ))
}

/// The child's side of [`check_ipc`]: `<hex handle> <offset> <len>
/// <checksum> <byte>`.
fn ipc_child(args: &[String]) -> Result<String, String> {
    let [hex, offset, len, sum, byte] = args else {
        return Err(format!("expected 5 arguments, got {args:?}"));
    };
    let num = |s: &String| s.parse::<u64>().map_err(|e| format!("{s:?}: {e}"));
    let (offset, len, sum, byte) = (num(offset)?, num(len)?, num(sum)?, num(byte)? as u8);
    let handle = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("?"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|e| format!("handle {hex:?}: {e}"))?;
    let a = CachingAllocator::new(device()?, AllocatorConfig::default());
    let base = a
        .open_ipc_handle(&handle)
        .map_err(|e| format!("open: {e}"))?;
    let p = DevicePtr(base.0 + offset);
    let got = a
        .backend()
        .checksum(p, len, S0)
        .map_err(|e| e.to_string())?;
    if got != sum {
        return Err("the imported bytes differ from the parent's".into());
    }
    a.backend()
        .fill(p, len, byte, S0)
        .map_err(|e| e.to_string())?;
    a.backend()
        .synchronize_stream(S0)
        .map_err(|e| e.to_string())?;
    a.close_ipc_handle(&handle)
        .map_err(|e| format!("close: {e}"))?;
    Ok(format!(
        "child: opened the segment, read and wrote {len} bytes at offset {offset}"
    ))
}
