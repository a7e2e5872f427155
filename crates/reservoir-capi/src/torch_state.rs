//! The entry points of Reservoir's C++ face for torch that read the
//! allocator's state or set it back (beside `torch_face.rs`: allocation,
//! statistics and pools): `recordHistory` with a C context recorder, the
//! memory snapshot as a pickle-ready buffer, `attachAllocatorTraceTracker`,
//! `getExpandableSegmentSizes`, and a private pool's checkpoint and its
//! restore (`getCheckpointState`, `setCheckpointPoolState`).
//!
//! Every function answers a [`ReservoirStatus`] and sets
//! [`reservoir_last_error`](crate::reservoir_last_error) on failure; a failed
//! call changes nothing.

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::Arc;

use reservoir::caching::{ContextRecorder, HistoryConfig, HistoryMode};
use reservoir::observe::snapshot::{BlockState, SegmentType};
use reservoir::observe::trace::{Frame, RecordContext, TraceAction};

use crate::error::{Failure, ReservoirStatus};
use crate::torch::{
    allocator, attach_tracker, built_allocators, set_history, torch_guard, HISTORY,
};
#[cfg(doc)]
use crate::torch_face::reservoir_torch_delete;
use crate::torch_face::{pool, private_pool};

/// A C function returning a context id for the current call's stack (0:
/// none), the recorder of [`reservoir_torch_record_history`] (nullable).
pub type ReservoirContextRecorder = Option<unsafe extern "C" fn() -> u64>;

/// The frame name that carries a context id recorded by a
/// [`ReservoirContextRecorder`] (the snapshot gives the id back).
const CTX_FRAME: &str = "reservoir-context";

/// torch's `recordHistory(enabled, context_recorder, max_entries, when,
/// clearHistory)` on every device, those built later included.
/// `when` is `RecordContext` (0 never, 1 state, 2 alloc, 3 all); `enabled`
/// false turns recording off (`when` must then be 0). `recorder` (may be
/// null: no stacks) is called under the allocator's lock when a stack is
/// wanted; the id it returns comes back in [`reservoir_torch_snapshot`].
/// `trace_all` records the trace ring (torch's `enabled="all"`), else only
/// the state (`"state"`). `max_entries` 0 is refused.
///
/// # Safety
/// `recorder`, when non-null, may be called from any thread.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_record_history(
    enabled: bool,
    trace_all: bool,
    recorder: ReservoirContextRecorder,
    max_entries: usize,
    when: i32,
    clear_history: bool,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_record_history", || {
        let context = match when {
            0 => RecordContext::Never,
            1 => RecordContext::State,
            2 => RecordContext::Alloc,
            3 => RecordContext::All,
            w => {
                return Err(Failure::invalid(format!(
                    "when {w} is not a RecordContext (0 never, 1 state, 2 alloc, 3 all)"
                )))
            }
        };
        if max_entries == 0 {
            return Err(Failure::invalid("max_entries 0 (it must be at least 1)"));
        }
        let mut config = HistoryConfig {
            enabled: match (enabled, trace_all) {
                (false, _) => HistoryMode::Off,
                (true, true) => HistoryMode::All,
                (true, false) => HistoryMode::State,
            },
            context: if enabled {
                context
            } else {
                RecordContext::Never
            },
            max_entries,
            clear_history,
            ..HistoryConfig::default()
        };
        config.recorder = match recorder {
            None => ContextRecorder::Custom(Arc::new(|| Arc::from(Vec::new()))),
            Some(r) => ContextRecorder::Custom(Arc::new(move || {
                // SAFETY: callable from any thread (caller's contract).
                let id = unsafe { r() };
                if id == 0 {
                    return Arc::from(Vec::new());
                }
                Arc::from(vec![Frame {
                    name: CTX_FRAME.to_owned(),
                    filename: String::new(),
                    line: id as i64,
                }])
            })),
        };
        set_history(config);
        Ok(())
    })
}

/// torch's `isHistoryEnabled()` into `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_is_history_enabled(out: *mut bool) -> ReservoirStatus {
    torch_guard("reservoir_torch_is_history_enabled", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        let on = HISTORY
            .lock()
            .as_ref()
            .is_some_and(|h| h.enabled != HistoryMode::Off);
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(on) };
        Ok(())
    })
}

/// The context id a stack carries (0: none).
fn ctx_id(frames: Option<&Arc<[Frame]>>) -> u64 {
    frames
        .and_then(|f| f.first())
        .filter(|f| f.name == CTX_FRAME)
        .map_or(0, |f| f.line as u64)
}

/// torch's `snapshot(mempool_id, include_traces)` over every device
/// Reservoir has built, as text the C++ face turns into `SnapshotInfo`
/// (`(0, 0)`: every pool). One record a line, fields separated by one space:
///
/// * `S device address total_size allocated_size active_size requested_size
///   stream is_large is_expandable pool0 pool1 context nblocks`: a segment,
///   followed by its `nblocks` blocks;
/// * `B size requested_size state context` (state 0 free, 1 active pending
///   free, 2 allocated): a block, in address order;
/// * `T device action addr size stream pool0 pool1 time_us context`: a
///   trace entry (`action` in `c10::CachingDeviceAllocator::TraceEntry::Action`
///   order, `time_us` microseconds since the Unix epoch);
/// * `C max_split_size garbage_collection_threshold expandable_segments
///   pinned_num_register_threads release_lock_on_cudamalloc
///   pinned_use_cuda_host_register graph_capture_record_stream_reuse
///   max_round_threshold max_cached_size n d1 .. dn`: the settings of the
///   first device (`n` divisions, index i for `2^i` MiB);
/// * `L text`: the last `PYTORCH_CUDA_ALLOC_CONF` string applied.
///
/// `context` is the id a [`ReservoirContextRecorder`] returned (0: none).
/// The text (not NUL-terminated) is `*len` bytes at `*buf`, owned by the
/// caller until [`reservoir_torch_buffer_free`].
///
/// # Safety
/// `buf` and `len` are null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_snapshot(
    p0: u64,
    p1: u64,
    include_traces: bool,
    buf: *mut *mut u8,
    len: *mut usize,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_snapshot", || {
        if buf.is_null() || len.is_null() {
            return Err(Failure::invalid("buf or len is null"));
        }
        let id = pool(p0, p1);
        let mempool = (!id.is_default()).then_some(id);
        let mut text = String::new();
        let mut settings_done = false;
        for a in built_allocators() {
            let snap = a.snapshot_with(mempool, include_traces);
            write_snapshot(&mut text, &snap, a.device(), !settings_done);
            settings_done = true;
        }
        let boxed = text.into_bytes().into_boxed_slice();
        let n = boxed.len();
        let p = Box::into_raw(boxed).cast::<u8>();
        // SAFETY: non-null and writable (caller's contract).
        unsafe {
            buf.write(p);
            len.write(n);
        }
        Ok(())
    })
}

/// One device's snapshot in [`reservoir_torch_snapshot`]'s text form.
fn write_snapshot(
    t: &mut String,
    snap: &reservoir::observe::snapshot::Snapshot,
    device: i8,
    settings: bool,
) {
    for s in &snap.segments {
        let (p0, p1) = s.pool_id();
        let _ = writeln!(
            t,
            "S {} {} {} {} {} {} {} {} {} {} {} {} {}",
            s.device,
            s.address,
            s.total_size,
            s.allocated_size,
            s.active_size,
            s.requested_size.unwrap_or(0),
            s.stream.0,
            u8::from(s.segment_type == SegmentType::Large),
            u8::from(s.is_expandable.unwrap_or(false)),
            p0 as u64,
            p1 as u64,
            ctx_id(s.frames.as_ref()),
            s.blocks.len()
        );
        for b in &s.blocks {
            let state = match b.state {
                BlockState::Inactive => 0,
                BlockState::ActivePendingFree => 1,
                BlockState::ActiveAllocated => 2,
            };
            let _ = writeln!(
                t,
                "B {} {} {} {}",
                b.size,
                b.requested_size.unwrap_or(0),
                state,
                ctx_id(b.frames.as_ref())
            );
        }
    }
    for (dev, entries) in snap.device_traces.iter().enumerate() {
        for e in entries {
            let action = TraceAction::ALL
                .iter()
                .position(|a| *a == e.action)
                .unwrap_or(0);
            let (p0, p1) = e.pool_id.unwrap_or((0, 0));
            let _ = writeln!(
                t,
                "T {} {} {} {} {} {} {} {} {}",
                if snap.device_traces.len() == 1 {
                    device as usize
                } else {
                    dev
                },
                action,
                e.addr,
                e.size,
                e.stream.0,
                p0 as u64,
                p1 as u64,
                e.time_us.unwrap_or(0),
                ctx_id(Some(&e.frames))
            );
        }
    }
    if settings {
        if let Some(c) = &snap.allocator_settings {
            let mut div = [0u64; 64];
            let mut n = 0;
            for &(start_mib, d) in c.roundup_power2_divisions.iter().flatten() {
                if start_mib > 0 {
                    let i = start_mib.trailing_zeros() as usize;
                    if i < div.len() {
                        div[i] = d;
                        n = n.max(i + 1);
                    }
                }
            }
            let _ = write!(
                t,
                "C {} {} {} {} {} {} {} {} {} {}",
                c.max_split_size.unwrap_or(-1),
                c.garbage_collection_threshold.unwrap_or(0.0),
                u8::from(c.expandable_segments.unwrap_or(false)),
                c.pinned_num_register_threads.unwrap_or(1),
                u8::from(c.release_lock_on_cudamalloc.unwrap_or(false)),
                u8::from(c.pinned_use_cuda_host_register.unwrap_or(false)),
                u8::from(c.graph_capture_record_stream_reuse.unwrap_or(false)),
                c.max_round_threshold.unwrap_or(-1),
                c.max_cached_size.unwrap_or(-1),
                n
            );
            for d in &div[..n] {
                let _ = write!(t, " {d}");
            }
            t.push('\n');
            let _ = writeln!(
                t,
                "L {}",
                c.pytorch_cuda_alloc_conf
                    .as_deref()
                    .unwrap_or("")
                    .replace('\n', " ")
            );
        }
    }
}

/// Free a buffer returned by [`reservoir_torch_snapshot`]. Null does nothing.
///
/// # Safety
/// `buf` and `len` are exactly what one [`reservoir_torch_snapshot`] call
/// returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_buffer_free(buf: *mut u8, len: usize) {
    if buf.is_null() {
        return;
    }
    // SAFETY: from Box::into_raw of a boxed slice of `len` bytes (caller's contract).
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(buf, len)) });
}

/// A C trace tracker (torch's `AllocatorTraceTracker`), called under the
/// allocator's lock with each trace entry: `device`, `action` (in
/// `TraceEntry::Action` order), `addr`, `size`, `stream`, the pool's halves
/// and `time_us` (microseconds since the Unix epoch). Nullable in the type;
/// [`reservoir_torch_attach_trace_tracker`] refuses null.
pub type ReservoirTraceTracker = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        device: i32,
        action: i32,
        addr: u64,
        size: u64,
        stream: *mut c_void,
        p0: u64,
        p1: u64,
        time_us: i64,
    ),
>;

/// A C tracker (never null: checked when attached) and its context, shared
/// by every device.
struct CTracker {
    f: ReservoirTraceTracker,
    ctx: *mut c_void,
}

// SAFETY: the caller of reservoir_torch_attach_trace_tracker promises the
// tracker may be called with its context from any thread, at once.
unsafe impl Send for CTracker {}
// SAFETY: as above.
unsafe impl Sync for CTracker {}

/// torch's `attachAllocatorTraceTracker`: call `tracker(ctx, ...)` with every
/// trace entry of every device from now on (devices built later included),
/// even with history off. It runs under the allocator's lock and must not
/// call Reservoir. `ctx` lives as long as the process (never dropped).
///
/// # Safety
/// `tracker` may be called with `ctx` from any thread, several at once.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_attach_trace_tracker(
    tracker: ReservoirTraceTracker,
    ctx: *mut c_void,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_attach_trace_tracker", || {
        if tracker.is_none() {
            return Err(Failure::invalid("tracker is null"));
        }
        let c = Arc::new(CTracker { f: tracker, ctx });
        attach_tracker(Arc::new(move |device, e: &reservoir::TraceEntry| {
            let action = TraceAction::ALL
                .iter()
                .position(|a| *a == e.action)
                .unwrap_or(0);
            let (p0, p1) = e.pool_id.unwrap_or((0, 0));
            let Some(f) = c.f else { return };
            // SAFETY: callable from any thread (caller's contract).
            unsafe {
                f(
                    c.ctx,
                    device,
                    action as i32,
                    e.addr,
                    e.size,
                    e.stream.0 as usize as *mut c_void,
                    p0 as u64,
                    p1 as u64,
                    e.time_us.unwrap_or(0),
                )
            }
        }));
        Ok(())
    })
}

/// One stream's expandable segment (torch's `StreamSegmentSize`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReservoirStreamSegmentSize {
    /// The stream (`cudaStream_t`).
    pub stream: u64,
    /// A small-pool segment?
    pub is_small_pool: bool,
    /// Bytes currently mapped.
    pub total_size: u64,
}

/// torch's `getExpandableSegmentSizes(device)`: writes up to `capacity`
/// entries to `out` and their full count to `*count` (call again with a
/// larger buffer when `*count > capacity`).
///
/// # Safety
/// `out` is null (with `capacity` 0) or valid for `capacity` writes; `count`
/// is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_expandable_segment_sizes(
    device: i32,
    out: *mut ReservoirStreamSegmentSize,
    capacity: usize,
    count: *mut usize,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_expandable_segment_sizes", || {
        if count.is_null() || (out.is_null() && capacity > 0) {
            return Err(Failure::invalid(
                "count is null, or out is null with capacity > 0",
            ));
        }
        let v = allocator(device)?.expandable_segment_sizes();
        for (i, s) in v.iter().take(capacity).enumerate() {
            // SAFETY: i < capacity writable entries (caller's contract).
            unsafe {
                out.add(i).write(ReservoirStreamSegmentSize {
                    stream: s.stream.0,
                    is_small_pool: s.is_small_pool,
                    total_size: s.total_size,
                })
            };
        }
        // SAFETY: non-null and writable (caller's contract).
        unsafe { count.write(v.len()) };
        Ok(())
    })
}

/// An opaque private-pool checkpoint (torch's `AllocatorState`), from
/// [`reservoir_torch_checkpoint_pool`], freed with
/// [`reservoir_torch_checkpoint_free`].
pub struct ReservoirPoolCheckpoint {
    device: i32,
    state: reservoir::caching::PoolCheckpoint,
}

/// torch's `getCheckpointState(device, mempool_id)`: the state of private
/// pool `(p0, p1)` into `*out` (the caller owns it).
///
/// # Safety
/// `out` is null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_checkpoint_pool(
    device: i32,
    p0: u64,
    p1: u64,
    out: *mut *mut ReservoirPoolCheckpoint,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_checkpoint_pool", || {
        if out.is_null() {
            return Err(Failure::invalid("out is null"));
        }
        let id = private_pool(p0, p1)?;
        let state = allocator(device)?.checkpoint_pool(id)?;
        let b = Box::new(ReservoirPoolCheckpoint { device, state });
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(Box::into_raw(b)) };
        Ok(())
    })
}

/// Free a checkpoint of [`reservoir_torch_checkpoint_pool`]. Null does nothing.
///
/// # Safety
/// `ckpt` is null or from [`reservoir_torch_checkpoint_pool`], not freed before.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_checkpoint_free(ckpt: *mut ReservoirPoolCheckpoint) {
    if !ckpt.is_null() {
        // SAFETY: from Box::into_raw, freed once (caller's contract).
        drop(unsafe { Box::from_raw(ckpt) });
    }
}

/// Move a vector of pointers to C: `(buffer, len)`, freed by
/// [`reservoir_torch_u64s_free`].
fn into_c(v: Vec<u64>) -> (*mut u64, usize) {
    let b = v.into_boxed_slice();
    let n = b.len();
    (Box::into_raw(b).cast::<u64>(), n)
}

/// torch's `setCheckpointPoolState(device, state)`: set the checkpoint's pool
/// back to it. `*freed` / `*freed_len`: the allocations the restore freed
/// (the caller's handles to them are dead); `*created` / `*created_len`:
/// those it made anew (the caller owns them; free with
/// [`reservoir_torch_delete`]). Both buffers are freed with
/// [`reservoir_torch_u64s_free`]. A checkpoint that does not match the pool
/// is refused before anything changes.
///
/// # Safety
/// `ckpt` is from [`reservoir_torch_checkpoint_pool`] and live; the four
/// out-pointers are null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_restore_checkpoint(
    ckpt: *const ReservoirPoolCheckpoint,
    freed: *mut *mut u64,
    freed_len: *mut usize,
    created: *mut *mut u64,
    created_len: *mut usize,
) -> ReservoirStatus {
    torch_guard("reservoir_torch_restore_checkpoint", || {
        if ckpt.is_null()
            || freed.is_null()
            || freed_len.is_null()
            || created.is_null()
            || created_len.is_null()
        {
            return Err(Failure::invalid("a checkpoint or out-pointer is null"));
        }
        // SAFETY: live (caller's contract).
        let c = unsafe { &*ckpt };
        let r = allocator(c.device)?.restore_pool_checkpoint(&c.state)?;
        let (f, fl) = into_c(r.allocations_freed.iter().map(|p| p.0).collect());
        let (a, al) = into_c(r.allocations_created.iter().map(|p| p.0).collect());
        // SAFETY: non-null and writable (caller's contract).
        unsafe {
            freed.write(f);
            freed_len.write(fl);
            created.write(a);
            created_len.write(al);
        }
        Ok(())
    })
}

/// Free a buffer of [`reservoir_torch_restore_checkpoint`]. Null does nothing.
///
/// # Safety
/// `buf` and `len` are one buffer that call returned, not freed before.
#[no_mangle]
pub unsafe extern "C" fn reservoir_torch_u64s_free(buf: *mut u64, len: usize) {
    if !buf.is_null() {
        // SAFETY: from Box::into_raw of a boxed slice of `len` values (caller's contract).
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(buf, len)) });
    }
}
