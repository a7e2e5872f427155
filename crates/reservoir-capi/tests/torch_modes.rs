//! The torch entry points' pointer lookups and run-time settings in every mode a user can turn
//! on: PyTorch mode, `expandable_segments:True` and `policy:reservoir`
//! (issue 40). `record_stream` used to find a pointer's owner through
//! `base_allocation`, which refuses every expandable-segment block, so
//! every `Tensor.record_stream` failed under the two modes that map
//! expandable segments.
//!
//! The allocators are process-wide and configured once, so the parent test
//! runs one child process per mode (this same binary, filtered to
//! `child_one_mode`, with the mode in `RESERVOIR_TEST_TORCH_MODE`). On the
//! fake CUDA driver of `../shared/oracle`; without a driver it prints
//! `SKIPPED-BACKEND` and passes.

mod common;
use common::{last_error, stat};
use std::ffi::c_void;
use std::io::Write;
use std::process::Command;

use reservoir_capi::{
    reservoir_alloc, reservoir_free, reservoir_torch_base_allocation, reservoir_torch_empty_cache,
    reservoir_torch_record_stream, reservoir_torch_set_allocator_settings, torch_configure,
    torch_set_allocator_settings, with_torch_allocator, ReservoirStatus,
};

const MODE_VAR: &str = "RESERVOIR_TEST_TORCH_MODE";
const MODES: [&str; 3] = ["", "expandable_segments:True", "policy:reservoir"];
const MIB: isize = 1 << 20;

fn invariants_hold() {
    let r = with_torch_allocator("test", 0, |a| {
        Ok(a.check_invariants().map_err(|e| e.to_string()))
    });
    assert_eq!(r, Ok(Ok(())));
}

#[test]
fn record_stream_and_base_allocation_in_every_mode() {
    if std::env::var_os(MODE_VAR).is_some() {
        return; // the child runs `child_one_mode` only
    }
    if let Err(e) = reservoir_cuda::CudaDevice::new(0) {
        let _ = writeln!(
            std::io::stderr().lock(),
            "\nSKIPPED-BACKEND cuda (reservoir-capi torch_modes): {e}"
        );
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for mode in MODES {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "child_one_mode",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(MODE_VAR, mode)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "mode {mode:?} failed:\n{text}");
        assert!(
            text.contains(&format!("torch modes ok: {mode:?}")),
            "mode {mode:?} did not run:\n{text}"
        );
    }
}

#[test]
fn child_one_mode() {
    let Ok(mode) = std::env::var(MODE_VAR) else {
        return; // run by the parent test only
    };
    torch_configure(Some(&mode)).unwrap();
    use cudarc::driver::sys;
    // The first allocation builds the allocator (loads the driver and makes
    // device 0's primary context current on this thread).
    // SAFETY: the null stream is the default stream.
    let warm = unsafe { reservoir_alloc(512, 0, std::ptr::null_mut()) };
    assert!(!warm.is_null(), "{}", last_error());
    let mut raw: sys::CUstream = std::ptr::null_mut();
    // SAFETY: the driver is loaded and a context current; `raw` is a local.
    let r = unsafe { sys::cuStreamCreate(&mut raw, 0) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    let side = raw.cast::<c_void>();

    // Small, large and huge blocks, on the default stream and on the side
    // stream, each used by the other stream (torch's Tensor.record_stream;
    // autograd does the same when a gradient crosses streams).
    let mut live = Vec::new();
    for size in [512, MIB, 30 * MIB, 200 * MIB] {
        for (alloc_on, use_on) in [(std::ptr::null_mut(), side), (side, std::ptr::null_mut())] {
            // SAFETY: `alloc_on` is null or the live stream above.
            let p = unsafe { reservoir_alloc(size, 0, alloc_on) };
            assert!(!p.is_null(), "mode {mode:?} size {size}: {}", last_error());
            // SAFETY: `p` is live and `use_on` null or a live stream.
            let s = unsafe { reservoir_torch_record_stream(p, use_on) };
            assert_eq!(
                s,
                ReservoirStatus::RESERVOIR_OK,
                "mode {mode:?}: record_stream of a {size}-byte block: {}",
                last_error()
            );
            invariants_hold();
            live.push((p, size, alloc_on));
        }
    }

    // getBaseAllocation: the segment of a plain block; PyTorch's own
    // refusal for an expandable segment's (not "not handed out").
    let (p, _, _) = live[4]; // 30 MiB
    let in_expandable = with_torch_allocator("test", 0, |a| {
        Ok(a.segments().iter().any(|seg| {
            seg.is_expandable == Some(true)
                && (seg.address..seg.address + seg.total_size).contains(&(p as u64))
        }))
    })
    .unwrap();
    // Expandable segments map every block there; the `reservoir` policy
    // decides per size class.
    assert!(in_expandable || !mode.contains("expandable"), "{mode:?}");
    let (mut base, mut size) = (std::ptr::null_mut(), 0u64);
    // SAFETY: `p` is live; `base` and `size` are locals.
    let s = unsafe { reservoir_torch_base_allocation(p, &mut base, &mut size) };
    if in_expandable {
        assert_eq!(
            s,
            ReservoirStatus::RESERVOIR_ERR_INVALID_STATE,
            "{}",
            last_error()
        );
        assert!(
            last_error().contains("cannot be shared between processes"),
            "{}",
            last_error()
        );
    } else {
        assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
        assert!(base as usize <= p as usize && size >= 30 << 20);
    }

    // A foreign pointer is still an error naming it, and changes nothing.
    let before = stat(c"allocated_bytes.all.current");
    // SAFETY: the pointer is only looked up.
    let s = unsafe { reservoir_torch_record_stream(0x5678 as *mut c_void, side) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_ERR_INVALID_POINTER);
    assert!(last_error().contains("0x5678"), "{}", last_error());
    assert_eq!(stat(c"allocated_bytes.all.current"), before);

    // Freed blocks wait for the streams that used them; once those are
    // done the cache empties completely.
    for (p, size, stream) in live {
        reservoir_free(p, size, 0, stream);
        assert!(last_error().is_empty(), "{}", last_error());
        invariants_hold();
    }
    reservoir_free(warm, 512, 0, std::ptr::null_mut());
    // SAFETY: `raw` is live.
    let r = unsafe { sys::cuCtxSynchronize() };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(
        reservoir_torch_empty_cache(0),
        ReservoirStatus::RESERVOIR_OK
    );
    assert_eq!(stat(c"allocated_bytes.all.current"), 0);
    assert_eq!(stat(c"reserved_bytes.all.current"), 0);
    invariants_hold();
    // torch's `_set_allocator_settings` at run time (spec 1.17): applied,
    // not ignored. An 84 MiB request is a block of 84 MiB by default and of
    // 96 MiB with 4 power-of-2 divisions; a bad string changes nothing.
    let block_of = |size: isize| {
        // SAFETY: the null stream is the default stream.
        let p = unsafe { reservoir_alloc(size, 0, std::ptr::null_mut()) };
        assert!(!p.is_null(), "{}", last_error());
        let b = stat(c"allocated_bytes.all.current");
        reservoir_free(p, size, 0, std::ptr::null_mut());
        b
    };
    assert_eq!(block_of(84 * MIB), 84 << 20, "mode {mode:?}");
    torch_set_allocator_settings("roundup_power2_divisions:4").unwrap();
    assert_eq!(block_of(84 * MIB), 96 << 20, "mode {mode:?}");
    let e = torch_set_allocator_settings("roundup_power2_divisions:3").unwrap_err();
    assert_eq!(
        e.status,
        ReservoirStatus::RESERVOIR_ERR_INVALID_CONFIG,
        "{e}"
    );
    assert!(e.message.contains("no setting was changed"), "{e}");
    assert_eq!(block_of(84 * MIB), 96 << 20, "mode {mode:?}");
    // SAFETY: a NUL-terminated literal.
    let s =
        unsafe { reservoir_torch_set_allocator_settings(c"roundup_power2_divisions:1".as_ptr()) };
    assert_eq!(s, ReservoirStatus::RESERVOIR_OK, "{}", last_error());
    assert_eq!(block_of(84 * MIB), 84 << 20, "mode {mode:?}");
    invariants_hold();
    assert_eq!(
        reservoir_torch_empty_cache(0),
        ReservoirStatus::RESERVOIR_OK
    );

    // SAFETY: `raw` is a live stream with no pending work, used no more.
    let r = unsafe { sys::cuStreamDestroy_v2(raw) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    println!("torch modes ok: {mode:?}");
}
