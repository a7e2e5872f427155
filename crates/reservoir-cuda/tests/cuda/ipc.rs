//! IPC through the caching allocator (spec 1.16, issue 15 deliverable 7):
//! a block is shared as its segment's `cudaIpcMemHandle` plus its offset,
//! and ANOTHER PROCESS (this test binary run again, see
//! [`run_child`](super::run_child)) opens it with its own allocator
//! (`cuIpcOpenMemHandle`), checks the parent's data, writes its own and
//! closes it; the parent then sees the child's bytes. Run in the fake's
//! default mode and in `FAKECUDA_ASYNC=1 FAKECUDA_SANITIZE=1` (both
//! processes), with zero sanitizer reports.

use reservoir::backend::Backend;
use reservoir::{AllocError, AllocatorConfig, CachingAllocator, DevicePtr, StreamId};
use reservoir_cuda::{checksum_of_fill, BackendError, CudaDevice, DeviceWork};

use super::{device, hooks, Mode, MIB};

const S0: StreamId = StreamId::DEFAULT;
const GIB: u64 = 1 << 30;
/// The shared block: large pool, in the same segment as a first block.
const LEN: u64 = 1_500_000;
/// What the child writes over the shared block.
const CHILD_BYTE: u8 = 0x77;

fn shares_a_block_with_another_process(mode: Mode) {
    let Some((_turn, dev)) = device(GIB, mode) else {
        return;
    };
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let first = a.raw_alloc(MIB + 4096, S0).unwrap();
    let shared = a.raw_alloc(LEN, S0).unwrap();
    a.backend().fill(first, MIB + 4096, 0x11, S0).unwrap();
    a.backend().fill(shared, LEN, 0x3d, S0).unwrap();
    // The receiver is another process: the writes must be complete first
    // (PyTorch's senders synchronise or share an event).
    a.backend().synchronize_stream(S0).unwrap();
    let share = a.share_ipc_handle(shared).unwrap();
    assert_eq!(a.base_allocation(shared).unwrap().0, first);
    assert_eq!(share.offset, shared.0 - first.0);
    assert!(share.offset > 0 && share.handle.len() == 64);

    // Opening in the exporting process is the driver's INVALID_CONTEXT, and
    // changes nothing.
    let e = a.open_ipc_handle(&share.handle).unwrap_err();
    assert!(e.to_string().contains("CUDA_ERROR_INVALID_CONTEXT"), "{e}");
    // A handle of the wrong length is refused before the driver is called.
    let e = a.open_ipc_handle(&share.handle[..63]).unwrap_err();
    assert!(
        matches!(&e, AllocError::Backend(BackendError::InvalidValue(m)) if m.contains("63 bytes")),
        "{e}"
    );
    // Not a pointer of the allocator.
    let e = a.share_ipc_handle(DevicePtr(shared.0 + 1)).unwrap_err();
    assert!(matches!(e, AllocError::InvalidPointer { .. }), "{e}");

    let hex: String = share.handle.iter().map(|b| format!("{b:02x}")).collect();
    let expected = checksum_of_fill(0x3d, LEN);
    let job = format!(
        "alloc-ipc {hex} {} {LEN} {expected} {CHILD_BYTE}",
        share.offset
    );
    let out = super::run_child(&job, |cmd| {
        if mode == Mode::AsyncSanitized {
            cmd.env("FAKECUDA_ASYNC", "1").env("FAKECUDA_SANITIZE", "1");
        }
    });
    assert!(out.contains("child: allocator opened"), "{out}");
    let child_async = format!("async mode: {}", mode == Mode::AsyncSanitized);
    assert!(out.contains(&child_async), "{out}");

    assert_eq!(
        a.backend().checksum(shared, LEN, S0).unwrap(),
        checksum_of_fill(CHILD_BYTE, LEN),
        "the child's writes are visible in the parent"
    );
    assert_eq!(
        a.backend().checksum(first, MIB + 4096, S0).unwrap(),
        checksum_of_fill(0x11, MIB + 4096),
        "the rest of the segment is untouched"
    );
    a.raw_free(first).unwrap();
    a.raw_free(shared).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(hooks(a.backend()).sanitizer_violations(), 0);
    let report = a.close();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn the_allocator_shares_a_block_with_another_process() {
    shares_a_block_with_another_process(Mode::Default);
}

#[test]
fn the_allocator_shares_a_block_with_another_process_async_sanitized() {
    shares_a_block_with_another_process(Mode::AsyncSanitized);
}

/// The child's side of the tests above (job `alloc-ipc <hex handle>
/// <offset> <len> <checksum> <byte>`): open the handle with a caching
/// allocator, check the block, overwrite it with `byte`, close.
pub(super) fn child_alloc_ipc(mut words: std::str::SplitWhitespace<'_>) {
    let hex = words.next().expect("handle");
    let mut arg = || -> u64 { words.next().expect("argument").parse().unwrap() };
    let (offset, len, sum, byte) = (arg(), arg(), arg(), arg() as u8);
    let handle: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let dev = CudaDevice::new(0).expect("the fake driver in the child");
    let a = CachingAllocator::new(dev, AllocatorConfig::default());
    let base = a.open_ipc_handle(&handle).unwrap();
    // A handle opens once per process: a second open is the same mapping.
    assert_eq!(a.open_ipc_handle(&handle).unwrap(), base);
    let p = DevicePtr(base.0 + offset);
    assert_eq!(
        a.backend().checksum(p, len, S0).unwrap(),
        sum,
        "imported contents"
    );
    a.backend().fill(p, len, byte, S0).unwrap();
    a.backend().synchronize_stream(S0).unwrap();
    a.close_ipc_handle(&handle).unwrap();
    a.close_ipc_handle(&handle).unwrap();
    let e = a.close_ipc_handle(&handle).unwrap_err();
    assert!(matches!(e, AllocError::InvalidArgument(_)), "{e}");
    let sanitizer = a.backend().fake().map_or(0, |f| f.sanitizer_violations());
    assert_eq!(sanitizer, 0, "sanitizer reports in the child");
    let is_async = a.backend().fake().is_some_and(|f| f.is_async());
    println!(
        "child: allocator opened the segment at {base}, read and wrote {len} bytes at offset \
         {offset} (async mode: {is_async})"
    );
}
