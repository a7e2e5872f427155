//! IPC on the host device (spec 1.16, issue 15 deliverable 7): a block of a
//! memfd-backed (shareable) host device is shared as its segment's handle
//! plus offset, and opened in ANOTHER PROCESS, which maps the same memory.
//!
//! The other process is this test binary run again with `--exact
//! child_process` and the handle in the environment (`child_process` does
//! nothing in a normal run, as the CUDA tests' `child_process_entry`).

use std::process::Command;

use reservoir::backend::BackendError;
use reservoir::sim::SimDevice;
use reservoir::{AllocError, AllocatorConfig, CachingAllocator, DevicePtr, StreamId};
use reservoir_host::{HostConfig, HostDevice, HostIpcHandle, HANDLE_LEN};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);
const LEN: usize = 1_500_000;

fn host(shareable: bool) -> HostDevice {
    HostDevice::new(HostConfig {
        capacity: 256 * MIB,
        shareable,
        ..HostConfig::default()
    })
    .unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Run this binary's `child_process` with `mode` and the handle.
fn run_child(mode: &str, handle: &[u8], offset: u64) -> std::process::Output {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process", "--nocapture"])
        .env("RESERVOIR_IPC_MODE", mode)
        .env("RESERVOIR_IPC_HANDLE", hex(handle))
        .env("RESERVOIR_IPC_OFFSET", offset.to_string())
        .env("RESERVOIR_IPC_PARENT", std::process::id().to_string())
        .output()
        .unwrap();
    eprintln!(
        "child {mode}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn a_block_shared_by_handle_is_read_and_written_by_another_process() {
    let a = CachingAllocator::new(host(true), AllocatorConfig::default());
    // Two blocks of one large-pool segment: the shared one is at an offset.
    let first = a.raw_alloc(MIB + 4096, S0).unwrap();
    let shared = a.raw_alloc(LEN as u64, S0).unwrap();
    a.backend().fill(first, MIB + 4096, 0x11).unwrap();
    a.backend().copy_from_host(shared, &pattern(7)).unwrap();
    let share = a.share_ipc_handle(shared).unwrap();
    let (base, seg_size) = a.base_allocation(shared).unwrap();
    assert_eq!(base, first, "both blocks are in the first segment");
    assert_eq!(share.offset, shared.0 - base.0);
    assert!(share.offset > 0);
    assert_eq!(share.segment_size, seg_size);
    assert_eq!(share.handle.len(), HANDLE_LEN);
    // Any block of the segment shares the same handle.
    assert_eq!(a.share_ipc_handle(first).unwrap().handle, share.handle);

    let out = run_child("read-write", &share.handle, share.offset);
    assert!(out.status.success(), "child failed: {out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));

    // The child wrote the pattern with seed 99 back over the block.
    let mut back = vec![0u8; LEN];
    a.backend().copy_to_host(shared, &mut back).unwrap();
    assert!(back == pattern(99), "the child's writes are visible here");
    let mut head = vec![0u8; 16];
    a.backend().copy_to_host(first, &mut head).unwrap();
    assert_eq!(head, [0x11; 16], "the rest of the segment is untouched");

    // Once the segment is freed, its handle no longer opens anywhere.
    a.raw_free(first).unwrap();
    a.raw_free(shared).unwrap();
    a.empty_cache().unwrap();
    let out = run_child("gone", &share.handle, share.offset);
    assert!(out.status.success(), "child failed: {out:?}");
    a.check_invariants().unwrap();
}

/// Does nothing in a normal run. In a child process started by
/// [`run_child`] it is the other process's side of the test above.
#[test]
fn child_process() {
    let Ok(mode) = std::env::var("RESERVOIR_IPC_MODE") else {
        return;
    };
    let handle = unhex(&std::env::var("RESERVOIR_IPC_HANDLE").unwrap());
    let offset: u64 = std::env::var("RESERVOIR_IPC_OFFSET")
        .unwrap()
        .parse()
        .unwrap();
    let parent: u32 = std::env::var("RESERVOIR_IPC_PARENT")
        .unwrap()
        .parse()
        .unwrap();
    let a = CachingAllocator::new(host(false), AllocatorConfig::default());
    match mode.as_str() {
        "read-write" => {
            let base = a.open_ipc_handle(&handle).unwrap();
            let p = DevicePtr(base.0 + offset);
            let mut got = vec![0u8; LEN];
            a.backend().copy_to_host(p, &mut got).unwrap();
            assert!(got == pattern(7), "the parent's pattern is visible here");
            // A second open maps once and counts a user.
            assert_eq!(a.open_ipc_handle(&handle).unwrap(), base);
            a.backend().copy_from_host(p, &pattern(99)).unwrap();
            a.close_ipc_handle(&handle).unwrap();
            assert_eq!(a.backend().counters().live_ipc_mappings, 1);
            a.close_ipc_handle(&handle).unwrap();
            assert_eq!(a.backend().counters().live_ipc_mappings, 0);
            assert!(matches!(
                a.close_ipc_handle(&handle),
                Err(AllocError::InvalidArgument(_))
            ));
            assert!(!a.backend().is_live(p, 1), "closed: unmapped");
            // A handle naming another descriptor of the parent (its stdin)
            // or the right descriptor with the wrong serial is refused.
            let h = HostIpcHandle::from_bytes(&handle).unwrap();
            assert_eq!(h.pid, parent);
            for bad in [
                HostIpcHandle { fd: 0, ..h },
                HostIpcHandle {
                    serial: h.serial + 1000,
                    ..h
                },
            ] {
                let e = a.open_ipc_handle(&bad.to_bytes()).unwrap_err();
                assert!(
                    matches!(&e, AllocError::Backend(BackendError::InvalidValue(m))
                        if m.contains("not the shared allocation") || m.contains("cannot open")),
                    "{e}"
                );
            }
            assert_eq!(a.backend().counters().live_ipc_mappings, 0);
            // Dropping an allocator closes the handles it still has open.
            let dev = std::sync::Arc::new(host(false));
            let b = CachingAllocator::new(dev.clone(), AllocatorConfig::default());
            b.open_ipc_handle(&handle).unwrap();
            assert_eq!(dev.counters().live_ipc_mappings, 1);
            let report = b.close();
            assert!(report.is_clean(), "{report:?}");
            assert_eq!(dev.counters().live_ipc_mappings, 0);
        }
        "gone" => {
            let e = a.open_ipc_handle(&handle).unwrap_err();
            assert!(
                matches!(&e, AllocError::Backend(BackendError::InvalidValue(m))
                    if m.contains("cannot open") || m.contains("not the shared allocation")),
                "{e}"
            );
            assert_eq!(a.backend().counters().ipc_opens, 0);
        }
        other => panic!("unknown mode {other}"),
    }
}

#[test]
fn malformed_handles_are_typed_errors_naming_the_bad_field() {
    let dev = host(false);
    let good = HostIpcHandle {
        pid: 1,
        fd: 3,
        serial: 0,
        size: 4096,
    }
    .to_bytes();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..31].to_vec(), "31 bytes"),
        ([b"XXXX", &good[4..]].concat(), "magic"),
        ([&good[..4], &[9], &good[5..]].concat(), "version 9"),
        (
            HostIpcHandle {
                size: 0,
                ..HostIpcHandle::from_bytes(&good).unwrap()
            }
            .to_bytes()
            .to_vec(),
            "size 0",
        ),
        (
            HostIpcHandle {
                fd: -1,
                ..HostIpcHandle::from_bytes(&good).unwrap()
            }
            .to_bytes()
            .to_vec(),
            "fd -1",
        ),
    ];
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    for (bytes, says) in cases {
        let e = a.open_ipc_handle(&bytes).unwrap_err();
        assert!(
            matches!(&e, AllocError::Backend(BackendError::InvalidValue(m)) if m.contains(says)),
            "{says}: {e}"
        );
    }
    // A process that does not exist (pid_max is at most 2^22).
    let nobody = HostIpcHandle {
        pid: 0x7fff_fff0,
        fd: 3,
        serial: 0,
        size: 4096,
    };
    let e = a.open_ipc_handle(&nobody.to_bytes()).unwrap_err();
    assert!(
        e.to_string().contains("cannot open /proc/2147483632/fd/3"),
        "{e}"
    );
    assert_eq!(a.backend().counters().ipc_opens, 0, "nothing was mapped");
}

#[test]
fn own_process_and_unshareable_blocks_are_refused() {
    let a = CachingAllocator::new(host(true), AllocatorConfig::default());
    let p = a.raw_alloc(4096, S0).unwrap();
    let share = a.share_ipc_handle(p).unwrap();
    let e = a.open_ipc_handle(&share.handle).unwrap_err();
    assert!(e.to_string().contains("exported by this process"), "{e}");
    // Not a pointer of the allocator.
    let e = a.share_ipc_handle(DevicePtr(p.0 + 8)).unwrap_err();
    assert!(matches!(e, AllocError::InvalidPointer { .. }), "{e}");
    a.raw_free(p).unwrap();

    // A device that is not shareable: the error says how to make it so.
    let plain = CachingAllocator::new(host(false), AllocatorConfig::default());
    let q = plain.raw_alloc(4096, S0).unwrap();
    let e = plain.share_ipc_handle(q).unwrap_err();
    assert!(e.to_string().contains("HostConfig.shareable"), "{e}");
    plain.raw_free(q).unwrap();

    // Expandable segments cannot be shared (PyTorch's message).
    let mut config = AllocatorConfig::default();
    config.expandable_segments = true;
    let exp = CachingAllocator::new(host(true), config);
    let r = exp.raw_alloc(4096, S0).unwrap();
    let e = exp.share_ipc_handle(r).unwrap_err();
    assert!(
        e.to_string()
            .contains("expandable_segments:True cannot be shared"),
        "{e}"
    );
    exp.raw_free(r).unwrap();

    // A backend without the capability.
    let sim = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
    let s = sim.raw_alloc(4096, S0).unwrap();
    let e = sim.share_ipc_handle(s).unwrap_err();
    assert!(
        matches!(e, AllocError::Backend(BackendError::Unsupported { .. })),
        "{e}"
    );
}

#[test]
fn the_device_level_calls_check_their_pointers() {
    use reservoir::Backend;
    let dev = host(true);
    let p = dev.allocate(3 * 4096, S0).unwrap();
    let h = dev.ipc_get_handle(p).unwrap();
    assert_eq!((h.pid, h.size), (std::process::id(), 3 * 4096));
    assert_eq!(HostIpcHandle::from_bytes(&h.to_bytes()).unwrap(), h);
    // Inside the allocation but not its start: refused, naming the pointer.
    let inner = DevicePtr(p.0 + 4096);
    let e = dev.ipc_get_handle(inner).unwrap_err();
    assert!(
        matches!(&e, BackendError::InvalidValue(m) if m.contains(&inner.to_string())),
        "{e}"
    );
    // Closing what was never opened here.
    let e = dev.ipc_close(p).unwrap_err();
    assert!(
        e.to_string().contains("not a shared allocation opened"),
        "{e}"
    );
    // Each allocation has its own memfd (serials differ).
    let q = dev.allocate(4096, S0).unwrap();
    assert_ne!(dev.ipc_get_handle(q).unwrap().serial, h.serial);
    dev.free(p, 3 * 4096).unwrap();
    dev.free(q, 4096).unwrap();
    let e = dev.ipc_get_handle(p).unwrap_err();
    assert!(
        e.to_string().contains("not the start of a live allocation"),
        "{e}"
    );
    assert!(dev.leak_report().is_empty());
}
