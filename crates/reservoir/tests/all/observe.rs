//! History recording, snapshots, expandable segment sizes, allocator
//! callbacks and debug output (spec 2.1 to 2.5, 1.9 OOM, 1.11, 1.14, 4.5).
//!
//! The expected key orders and values come from torch 2.15.0 run on the
//! fake CUDA device (`../shared/oracle`) with the same sequence of calls;
//! the script is `tests/data/oracle_snapshot_format.py`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use reservoir::caching::{ContextRecorder, HistoryConfig, HistoryMode, PoolFilter};
use reservoir::observe::callbacks::{AllocatorEvent, CallbackError, EventType};
use reservoir::observe::debug::{DebugVerbosity, VerbosityError};
use reservoir::observe::pickle::Value;
use reservoir::observe::snapshot::{BlockState, Snapshot};
use reservoir::observe::trace::{Frame, RecordContext, TraceAction, TraceEntry};
use reservoir::MempoolId;
use reservoir::{AllocError, Backend, DevicePtr, StreamId};

use crate::common::*;

/// A recorder returning a new one-frame stack per call, named `ctx<N>`.
fn counting_recorder() -> ContextRecorder {
    let n = Arc::new(AtomicU64::new(0));
    ContextRecorder::Custom(Arc::new(move || {
        let i = n.fetch_add(1, Ordering::Relaxed);
        Arc::from(vec![Frame {
            name: format!("ctx{i}"),
            filename: "test.py".into(),
            line: i as i64,
        }])
    }))
}

fn record(c: &Checked, enabled: HistoryMode, context: RecordContext) {
    c.a.record_memory_history(HistoryConfig {
        enabled,
        context,
        max_entries: 1000,
        recorder: counting_recorder(),
        clear_history: true,
    });
}

fn names(frames: &[Frame]) -> Vec<String> {
    frames.iter().map(|f| f.name.clone()).collect()
}

/// torch 2.15's sequence: 3 MiB, 20 MiB, 500 B (freed), then two snapshots.
fn torch_sequence(c: &Checked) -> (Snapshot, Snapshot) {
    let _a = c.alloc(3 * MIB);
    let _b = c.alloc(20 * MIB);
    let p = c.alloc(500);
    c.free(p);
    let s1 = c.a.snapshot(None);
    let s2 = c.a.snapshot(None);
    c.check();
    (s1, s2)
}

#[test]
fn snapshot_matches_torch_segments_blocks_and_trace() {
    // spec 2.2-2.4; oracle run "all/all" of the format script.
    let c = Checked::default_device();
    record(&c, HistoryMode::All, RecordContext::All);
    let (s1, s2) = torch_sequence(&c);
    s2.check_consistency().unwrap();
    // (total, allocated, active, requested, segment frames?, blocks as
    // (size, state, requested, has frames)), in torch's address order
    // sorted by size here since addresses differ.
    let mut segs: Vec<_> = s2
        .segments
        .iter()
        .map(|s| {
            (
                s.total_size,
                s.allocated_size,
                s.active_size,
                s.requested_size.unwrap(),
                !s.frames.as_ref().unwrap().is_empty(),
                s.blocks
                    .iter()
                    .map(|b| {
                        (
                            b.size,
                            b.state,
                            b.requested_size.unwrap(),
                            !b.frames.as_ref().unwrap().is_empty(),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    segs.sort_by_key(|s| (s.0, s.4));
    use BlockState::*;
    assert_eq!(
        segs,
        vec![
            (
                2 * MIB,
                0,
                0,
                0,
                false,
                vec![(2 * MIB, Inactive, 500, false)]
            ),
            (
                20 * MIB,
                3 * MIB,
                3 * MIB,
                3 * MIB,
                false,
                vec![
                    (3 * MIB, ActiveAllocated, 3 * MIB, true),
                    (17 * MIB, Inactive, 0, false)
                ]
            ),
            (
                20 * MIB,
                20 * MIB,
                20 * MIB,
                20 * MIB,
                true,
                vec![(20 * MIB, ActiveAllocated, 20 * MIB, true)]
            ),
        ]
    );
    for s in &s2.segments {
        assert_eq!(s.segment_pool_id, Some((0, 0)));
        assert_eq!(s.is_expandable, Some(false));
        assert_eq!(s.stream, StreamId(0));
    }
    let t: Vec<_> = s2.device_traces[0]
        .iter()
        .map(|e| (e.action.as_str(), e.size, !e.frames.is_empty()))
        .collect();
    assert_eq!(
        t,
        [
            ("segment_alloc", 20 * MIB, true),
            ("alloc", 3 * MIB, true),
            ("segment_alloc", 20 * MIB, true),
            ("alloc", 20 * MIB, true),
            ("segment_alloc", 2 * MIB, true),
            ("alloc", 500, true),
            ("free_requested", 500, true),
            ("free_completed", 500, true),
            // s1's entry: active bytes, no stack; s2's own is not included.
            ("snapshot", 23 * MIB, false),
        ]
    );
    assert_eq!(s1.device_traces[0].len(), 8);
    let snap_entry = &s2.device_traces[0][8];
    assert_eq!((snap_entry.addr, snap_entry.stream), (0, StreamId(0)));
    for e in &s2.device_traces[0] {
        assert_eq!(e.pool_id, Some((0, 0)));
        assert_eq!(e.compile_context.as_deref(), Some("N/A"));
        assert_eq!(e.user_metadata.as_deref(), Some(""));
        assert!(
            e.time_us.unwrap() > 1_600_000_000_000_000,
            "epoch microseconds"
        );
    }
    // The segment allocated whole keeps the segment's stack; the split one
    // lost it to the remainder block, as in torch.
    let settings = s2.allocator_settings.as_ref().unwrap();
    assert_eq!(settings.max_split_size, Some(-1));
    assert_eq!(settings.max_round_threshold, Some(-1));
    assert_eq!(
        settings.roundup_power2_divisions.as_ref().unwrap().len(),
        16
    );
}

fn dict_keys(v: &Value) -> Vec<String> {
    match v {
        Value::Dict(pairs) => pairs
            .iter()
            .map(|(k, _)| match k {
                Value::Str(s) => s.to_string(),
                other => panic!("non-string key {other:?}"),
            })
            .collect(),
        other => panic!("not a dict: {other:?}"),
    }
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    match v {
        Value::Dict(pairs) => {
            &pairs
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if &**s == key))
                .unwrap_or_else(|| panic!("no key {key}"))
                .1
        }
        other => panic!("not a dict: {other:?}"),
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::List(a) => a,
        other => panic!("not a list: {other:?}"),
    }
}

const SEGMENT_KEYS: [&str; 12] = [
    "device",
    "address",
    "total_size",
    "allocated_size",
    "active_size",
    "requested_size",
    "stream",
    "segment_type",
    "segment_pool_id",
    "is_expandable",
    "frames",
    "blocks",
];

#[test]
fn pickle_key_order_is_torch_2_15() {
    // Key lists printed by torch 2.15 (`list(d.keys())`) for the same run.
    let c = Checked::default_device();
    record(&c, HistoryMode::All, RecordContext::All);
    let (_, s2) = torch_sequence(&c);
    let v = s2.to_value();
    assert_eq!(
        dict_keys(&v),
        [
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations",
            "host_segments",
            "host_traces"
        ]
    );
    for seg in items(get(&v, "segments")) {
        let with_stack = !items(get(seg, "frames")).is_empty();
        let mut expect: Vec<&str> = SEGMENT_KEYS.to_vec();
        if with_stack {
            // torch adds a gathered stack after `blocks`.
            expect.retain(|k| *k != "frames");
            expect.push("frames");
        }
        assert_eq!(dict_keys(seg), expect);
        for b in items(get(seg, "blocks")) {
            assert_eq!(
                dict_keys(b),
                ["address", "size", "requested_size", "state", "frames"]
            );
        }
    }
    let entry_keys = [
        "action",
        "addr",
        "size",
        "stream",
        "time_us",
        "compile_context",
        "user_metadata",
        "pool_id",
        "frames",
    ];
    let traces = items(get(&v, "device_traces"));
    assert_eq!(traces.len(), 1);
    for e in items(&traces[0]) {
        let keys = dict_keys(e);
        if matches!(get(e, "action"), Value::Str(s) if &**s == "snapshot") {
            assert_eq!(keys, entry_keys[..8]);
        } else {
            assert_eq!(keys, entry_keys);
        }
    }
    assert_eq!(
        dict_keys(get(&v, "allocator_settings")),
        [
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size",
            "garbage_collection_threshold",
            "expandable_segments",
            "pinned_num_register_threads",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "graph_capture_record_stream_reuse",
            "max_round_threshold",
            "max_cached_size",
            "roundup_power2_divisions"
        ]
    );
    let divisions = dict_keys(get(
        get(&v, "allocator_settings"),
        "roundup_power2_divisions",
    ));
    assert_eq!(divisions.first().map(String::as_str), Some("1"));
    assert_eq!(divisions.last().map(String::as_str), Some("32768"));
}

#[test]
fn context_levels_decide_which_stacks_are_kept() {
    // PyTorch's RecordContext: malloc gathers at State, free at All; trace
    // entries keep stacks from Alloc up; frees reuse the allocation's stack
    // below All.
    let run = |enabled, level| {
        let c = Checked::default_device();
        record(&c, enabled, level);
        let p = c.alloc(MIB);
        let q = c.alloc(MIB);
        c.free(q);
        let trace: Vec<(TraceAction, Vec<String>)> =
            c.a.history()
                .iter()
                .map(|e| (e.action, names(&e.frames)))
                .collect();
        let snap = c.a.snapshot(None);
        let block = &snap.segments[0].blocks[0];
        let block_frames = names(block.frames.as_ref().unwrap());
        c.free(p);
        (block_frames, trace)
    };
    use TraceAction::*;
    let none: Vec<String> = vec![];
    let s = |x: &str| vec![x.to_string()];

    let (block, trace) = run(HistoryMode::All, RecordContext::Never);
    assert_eq!(block, none);
    assert!(trace.iter().all(|(_, f)| f.is_empty()));
    assert_eq!(trace.len(), 5);

    let (block, trace) = run(HistoryMode::All, RecordContext::State);
    assert_eq!(block, s("ctx0"), "live blocks keep the stack");
    assert!(trace.iter().all(|(_, f)| f.is_empty()), "entries do not");

    let (block, trace) = run(HistoryMode::All, RecordContext::Alloc);
    assert_eq!(block, s("ctx0"));
    assert_eq!(
        trace,
        [
            (SegmentAlloc, s("ctx0")),
            (Alloc, s("ctx0")),
            (Alloc, s("ctx1")),
            (FreeRequested, s("ctx1")), // the allocation's stack
            (FreeCompleted, s("ctx1")),
        ]
    );

    let (_, trace) = run(HistoryMode::All, RecordContext::All);
    assert_eq!(trace[3], (FreeRequested, s("ctx2")), "free gathers its own");
    assert_eq!(trace[4], (FreeCompleted, s("ctx2")));

    // enabled="state": one entry kept (the newest).
    let (block, trace) = run(HistoryMode::State, RecordContext::State);
    assert_eq!(block, s("ctx0"));
    assert_eq!(trace.len(), 1);
    assert_eq!(trace[0].0, FreeCompleted);
}

#[test]
fn free_completed_and_release_without_own_stack_reuse_the_recorded_ones() {
    let c = Checked::default_device();
    record(&c, HistoryMode::All, RecordContext::Alloc);
    let p = c.alloc(30 * MIB); // segment and block share ctx0
    c.free(p);
    c.empty_cache(); // no stack at Alloc: segment_free reuses the segment's
    let trace = c.a.history();
    let last = trace.last().unwrap();
    assert_eq!(last.action, TraceAction::SegmentFree);
    assert_eq!(names(&last.frames), ["ctx0"]);
    // Snapshot: the freed block kept no stack.
    let p = c.alloc(MIB);
    let q = c.alloc(MIB);
    c.free(p);
    let snap = c.a.snapshot(None);
    let blocks = &snap.segments[0].blocks;
    assert_eq!(blocks[0].state, BlockState::Inactive);
    assert!(blocks[0].frames.as_ref().unwrap().is_empty());
    assert_eq!(names(blocks[1].frames.as_ref().unwrap()), ["ctx2"]);
    c.free(q);
}

#[test]
fn ring_buffer_max_entries_disable_and_clear() {
    let c = Checked::default_device();
    c.a.record_memory_history(HistoryConfig {
        max_entries: 3,
        ..HistoryConfig::events_only(3)
    });
    let p = c.alloc(MIB); // segment_alloc, alloc
    c.free(p); // free_requested, free_completed
    let h: Vec<TraceAction> = c.a.history().iter().map(|e| e.action).collect();
    assert_eq!(
        h,
        [
            TraceAction::Alloc,
            TraceAction::FreeRequested,
            TraceAction::FreeCompleted
        ],
        "oldest dropped"
    );
    assert!(c.a.is_history_enabled());
    c.a.clear_history();
    assert!(c.a.history().is_empty());
    c.alloc(MIB);
    assert_eq!(c.a.history().len(), 1);
    c.a.record_memory_history(HistoryConfig::off());
    assert!(!c.a.is_history_enabled());
    assert!(c.a.history().is_empty(), "disabling clears");
    c.alloc(MIB);
    assert!(c.a.history().is_empty());
    // Snapshot without traces: empty device_traces, as torch.
    assert!(c.a.snapshot_with(None, false).device_traces.is_empty());
}

#[test]
fn backtrace_recorder_and_caller_frames() {
    let c = Checked::default_device();
    c.a.record_memory_history(HistoryConfig {
        context: RecordContext::All,
        ..HistoryConfig::default()
    });
    let p = c.alloc(MIB);
    let frames: Arc<[Frame]> = Arc::from(vec![Frame {
        name: "forward".into(),
        filename: "model.py".into(),
        line: 12,
    }]);
    let q =
        c.a.seeder()
            .raw_alloc_with_frames(MIB, S0, frames.clone())
            .unwrap();
    c.a.seeder()
        .raw_free_with_frames(q, frames.clone())
        .unwrap();
    let h = c.a.history();
    assert!(
        h[1].frames.len() > 1,
        "a captured backtrace has frames: {:?}",
        h[1].frames
    );
    assert!(h[1]
        .frames
        .iter()
        .any(|f| f.name.contains("backtrace_recorder")));
    assert_eq!(h[2].frames, frames);
    assert_eq!(
        h[3].frames, frames,
        "free_requested with the caller's frames"
    );
    c.free(p);
    c.check();
}

#[test]
fn trace_trackers_see_entries_with_history_off() {
    let c = Checked::default_device();
    c.a.record_memory_history(HistoryConfig::off());
    let seen: Arc<Mutex<Vec<TraceEntry>>> = Arc::default();
    let s = seen.clone();
    c.a.attach_trace_tracker(Arc::new(move |e: &TraceEntry| {
        s.lock().unwrap().push(e.clone())
    }));
    let p = c.alloc(4096);
    c.free(p);
    let got: Vec<(TraceAction, u64)> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|e| (e.action, e.size))
        .collect();
    assert_eq!(
        got,
        [
            (TraceAction::SegmentAlloc, 2 * MIB),
            (TraceAction::Alloc, 4096),
            (TraceAction::FreeRequested, 4096),
            (TraceAction::FreeCompleted, 4096)
        ]
    );
    assert!(c.a.history().is_empty());
}

#[test]
fn pool_snapshot_lists_only_the_pool_and_records_its_active_bytes() {
    // spec 1.14 snapshot(mempool_id); oracle: pool (0, 1) segments only,
    // whole trace, snapshot entry size = the pool's active bytes, pool_id.
    let c = Checked::default_device();
    record(&c, HistoryMode::All, RecordContext::Never);
    let x = c.alloc(1000);
    let pool = MempoolId(0, 1);
    c.a.begin_allocate_to_pool(pool, PoolFilter::Stream(S0))
        .unwrap();
    let y = c.alloc(3 * MIB);
    let z = c.alloc(700);
    c.a.end_allocate_to_pool(pool).unwrap();
    let snap = c.a.snapshot(Some(pool));
    let mut segs: Vec<_> = snap
        .segments
        .iter()
        .map(|s| {
            (
                s.total_size,
                s.allocated_size,
                s.requested_size,
                s.segment_pool_id,
            )
        })
        .collect();
    segs.sort();
    assert_eq!(
        segs,
        [
            (2 * MIB, 1024, Some(700), Some((0, 1))),
            (20 * MIB, 3 * MIB, Some(3 * MIB), Some((0, 1)))
        ]
    );
    let pools: Vec<_> = snap.device_traces[0]
        .iter()
        .map(|e| e.pool_id.unwrap())
        .collect();
    assert_eq!(pools, [(0, 0), (0, 0), (0, 1), (0, 1), (0, 1), (0, 1)]);
    let all = c.a.snapshot(None);
    assert_eq!(all.segments.len(), 3);
    let last = all.device_traces[0].last().unwrap();
    assert_eq!(
        (last.action, last.size, last.pool_id),
        (TraceAction::Snapshot, 3 * MIB + 1024, Some((0, 1)))
    );
    // Some(default) is the whole device, as torch's (0, 0).
    assert_eq!(c.a.snapshot(Some(MempoolId::DEFAULT)).segments.len(), 3);
    c.free(x);
    c.free(y);
    c.free(z);
}

#[test]
fn pending_free_blocks_are_active_pending_free_with_their_stack() {
    let c = Checked::default_device();
    record(&c, HistoryMode::All, RecordContext::State);
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = c.alloc(2 * MIB);
    c.a.record_stream(p, s1).unwrap();
    dev.hold_stream(s1).unwrap();
    c.free(p);
    let snap = c.a.snapshot(None);
    snap.check_consistency().unwrap();
    let seg = &snap.segments[0];
    assert_eq!(seg.blocks[0].state, BlockState::ActivePendingFree);
    assert_eq!(names(seg.blocks[0].frames.as_ref().unwrap()), ["ctx0"]);
    assert_eq!((seg.allocated_size, seg.active_size), (0, 2 * MIB));
    dev.release_stream(s1).unwrap();
    c.empty_cache();
}

#[test]
fn expandable_segments_are_one_segment_per_mapped_run() {
    // spec 1.11: each contiguous mapped run is its own segment; the
    // unmapped tail is not reported.
    let c = Checked::new("expandable_segments:True", 8 * GIB);
    record(&c, HistoryMode::All, RecordContext::Alloc);
    let a = c.alloc(30 * MIB); // maps [0, 40) MiB
    let b = c.alloc(40 * MIB); // [30, 70), maps [40, 80)
    let d = c.alloc(20 * MIB); // [70, 90), maps [80, 100)
    c.free(b);
    c.empty_cache(); // unmaps [40, 60): the mapped runs are [0, 40) and [60, 100)
    let snap = c.a.snapshot(None);
    snap.check_consistency().unwrap();
    let large: Vec<_> = snap
        .segments
        .iter()
        .filter(|s| s.segment_type == reservoir::observe::snapshot::SegmentType::Large)
        .collect();
    // torch 2.15 (oracle, same calls, context="alloc"): runs at offsets 0
    // and 60 MiB, blocks as below, no segment stacks (split heads).
    let base = large[0].address;
    type Run = (u64, u64, bool, Vec<(u64, BlockState, bool)>);
    let runs: Vec<Run> = large
        .iter()
        .map(|s| {
            (
                (s.address - base) / MIB,
                s.total_size / MIB,
                s.frames.as_ref().unwrap().is_empty(),
                s.blocks
                    .iter()
                    .map(|b| (b.size / MIB, b.state, b.frames.as_ref().unwrap().is_empty()))
                    .collect(),
            )
        })
        .collect();
    use BlockState::*;
    assert_eq!(
        runs,
        [
            (
                0,
                40,
                true,
                vec![(30, ActiveAllocated, false), (10, Inactive, true)]
            ),
            (
                60,
                40,
                true,
                vec![
                    (10, Inactive, true),
                    (20, ActiveAllocated, false),
                    (10, Inactive, true)
                ]
            ),
        ]
    );
    let trace: Vec<(TraceAction, u64, u64, bool)> = snap.device_traces[0]
        .iter()
        .map(|e| {
            (
                e.action,
                (e.addr - base) / MIB,
                e.size / MIB,
                !e.frames.is_empty(),
            )
        })
        .collect();
    use TraceAction::*;
    assert_eq!(
        trace,
        [
            (SegmentMap, 0, 40, true),
            (Alloc, 0, 30, true),
            (SegmentMap, 40, 40, true),
            (Alloc, 30, 40, true),
            (SegmentMap, 80, 20, true),
            (Alloc, 70, 20, true),
            (FreeRequested, 30, 40, true),
            (FreeCompleted, 30, 40, true),
            (SegmentUnmap, 40, 20, false),
        ]
    );
    for s in &large {
        assert_eq!(s.is_expandable, Some(true));
        assert_eq!(s.total_size % (20 * MIB), 0, "whole pages");
    }
    let mapped: u64 = large.iter().map(|s| s.total_size).sum();
    assert_eq!(mapped as i64, c.reserved());
    let unmaps =
        c.a.history()
            .iter()
            .filter(|e| e.action == TraceAction::SegmentUnmap)
            .count();
    assert!(unmaps >= 1);
    c.free(a);
    c.free(d);
}

#[test]
fn expandable_segment_sizes_per_stream() {
    // getExpandableSegmentSizes: (stream, is_small_pool, mapped bytes) in
    // creation order; default-stream segments are skipped as in torch.
    let c = Checked::new("expandable_segments:True", 8 * GIB);
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let _d = c.alloc(30 * MIB);
    assert!(
        c.a.expandable_segment_sizes().is_empty(),
        "stream 0 is skipped"
    );
    let a = c.alloc_on(30 * MIB, s1);
    let _b = c.alloc_on(100, s1);
    let _e = c.alloc_on(50 * MIB, s2);
    let sizes: Vec<_> =
        c.a.expandable_segment_sizes()
            .into_iter()
            .map(|s| (s.stream, s.is_small_pool, s.total_size))
            .collect();
    assert_eq!(
        sizes,
        [
            (s1, false, 40 * MIB),
            (s1, true, 2 * MIB),
            (s2, false, 60 * MIB)
        ]
    );
    c.free(a);
    c.empty_cache();
    let sizes: Vec<_> =
        c.a.expandable_segment_sizes()
            .into_iter()
            .map(|s| (s.stream, s.is_small_pool, s.total_size))
            .collect();
    assert_eq!(sizes, [(s1, true, 2 * MIB), (s2, false, 60 * MIB)]);
}

#[test]
fn oom_entry_observer_and_allocation_failed_callback() {
    // spec 1.9: trace "oom" (device_free, rounded size), observers get
    // (device, alloc_size, allowed or total, free); then ALLOCATION_FAILED.
    let c = Checked::new("", GIB);
    record(&c, HistoryMode::All, RecordContext::Never);
    let order: Arc<Mutex<Vec<String>>> = Arc::default();
    let o = order.clone();
    c.a.attach_oom_observer(Arc::new(move |dev, size, allowed, free| {
        o.lock()
            .unwrap()
            .push(format!("observer {dev} {size} {allowed} {free}"));
    }));
    let o = order.clone();
    c.a.callbacks()
        .register(
            "oom",
            Arc::new(move |e: &AllocatorEvent| {
                o.lock()
                    .unwrap()
                    .push(format!("{} {} {}", e.event, e.size, e.ptr.is_null()));
            }),
        )
        .unwrap();
    let r = c.try_alloc(2 * GIB + 1);
    assert!(matches!(r, Err(AllocError::OutOfMemory(_))));
    let rounded = 2 * GIB + 512;
    let h = c.a.history();
    let oom = h.last().unwrap();
    assert_eq!((oom.action, oom.size), (TraceAction::Oom, rounded));
    assert_eq!(oom.addr, GIB, "device_free");
    let alloc_size = (2 * GIB + 1).div_ceil(2 * MIB) * 2 * MIB;
    assert_eq!(
        *order.lock().unwrap(),
        [
            format!("observer 0 {alloc_size} {GIB} {GIB}"),
            format!("ALLOCATION_FAILED {} true", 2 * GIB + 1)
        ]
    );
    let v = c.a.snapshot(None).to_value();
    let trace = items(&items(get(&v, "device_traces"))[0]).to_vec();
    let oom = trace
        .iter()
        .find(|e| matches!(get(e, "action"), Value::Str(s) if &**s == "oom"))
        .unwrap();
    assert_eq!(
        dict_keys(oom),
        [
            "action",
            "device_free",
            "size",
            "stream",
            "time_us",
            "compile_context",
            "user_metadata",
            "pool_id"
        ]
    );
}

#[test]
fn callbacks_fire_for_each_event() {
    let c = Checked::default_device();
    let seen: Arc<Mutex<Vec<(EventType, u64)>>> = Arc::default();
    let s = seen.clone();
    let reg = c.a.callbacks();
    reg.register(
        "all",
        Arc::new(move |e: &AllocatorEvent| s.lock().unwrap().push((e.event, e.size))),
    )
    .unwrap();
    let take = || std::mem::take(&mut *seen.lock().unwrap());
    let p = c.alloc(MIB);
    assert_eq!(take(), [(EventType::Allocated, MIB)], "new segment");
    c.free(p);
    assert_eq!(take(), [(EventType::Freed, MIB)]);
    let p = c.alloc(MIB);
    assert_eq!(take(), [(EventType::Recycled, MIB)], "cache hit");
    let q = c.alloc(100);
    assert_eq!(
        take(),
        [(EventType::Recycled, 512)],
        "split of a cached block"
    );
    c.free(p);
    c.free(q);
    take();
    c.empty_cache();
    assert_eq!(take(), [(EventType::Released, 2 * MIB)]);
    // Expandable pages: Allocated, then Released by unmap.
    let e = Checked::new("expandable_segments:True", 8 * GIB);
    let s = seen.clone();
    e.a.callbacks()
        .register(
            "all",
            Arc::new(move |e: &AllocatorEvent| s.lock().unwrap().push((e.event, e.size))),
        )
        .unwrap();
    let p = e.alloc(30 * MIB);
    e.free(p);
    e.empty_cache();
    assert_eq!(
        take(),
        [
            (EventType::Allocated, 30 * MIB),
            (EventType::Freed, 30 * MIB),
            (EventType::Released, 40 * MIB)
        ]
    );
    // Allocation failure: see oom_entry_observer_and_allocation_failed_callback.
}

#[test]
fn callback_registry_names_and_errors() {
    let c = Checked::default_device();
    let reg = c.a.callbacks();
    assert!(!reg.is_active());
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    let cb = Arc::new(move |_: &AllocatorEvent| {
        h.fetch_add(1, Ordering::Relaxed);
    });
    reg.register("a", cb.clone()).unwrap();
    reg.register("b", cb.clone()).unwrap();
    assert_eq!(
        reg.register("a", cb.clone()),
        Err(CallbackError::AlreadyRegistered("a".into()))
    );
    assert_eq!(reg.names(), ["a", "b"]);
    c.alloc(512);
    assert_eq!(hits.load(Ordering::Relaxed), 2, "both fired");
    reg.unregister("a").unwrap();
    assert_eq!(
        reg.unregister("a"),
        Err(CallbackError::NotRegistered("a".into()))
    );
    assert!(reg.contains("b") && !reg.contains("a"));
    reg.unregister("b").unwrap();
    assert!(!reg.is_active());
    c.alloc(512);
    assert_eq!(hits.load(Ordering::Relaxed), 2, "none left");
    assert_eq!(
        CallbackError::NotRegistered("x".into()).to_string(),
        "no allocator callback named \"x\" is registered"
    );
}

#[test]
fn verbosity_parsing() {
    let p = DebugVerbosity::parse;
    assert_eq!(p("").unwrap(), DebugVerbosity::OFF);
    assert_eq!(p("0").unwrap(), DebugVerbosity::OFF);
    assert_eq!(
        p("10").unwrap(),
        DebugVerbosity::ALLOCATIONS | DebugVerbosity::RELEASES
    );
    assert_eq!(p("0x1f").unwrap().bits(), 31);
    assert_eq!(p("0b100").unwrap(), DebugVerbosity::RECYCLES);
    assert_eq!(
        p("profiling|Large_Only").unwrap(),
        DebugVerbosity::PROFILING | DebugVerbosity::LARGE_ONLY
    );
    assert_eq!(p("recycles, releases").unwrap().bits(), 12);
    let e: VerbosityError = p("32").unwrap_err();
    assert_eq!(e.value, "32");
    assert!(
        e.to_string()
            .starts_with("invalid RESERVOIR_DEBUG_VERBOSITY value \"32\": unknown bits 0x20"),
        "{e}"
    );
    let e = p("allocs").unwrap_err();
    assert!(
        e.to_string().contains("\"allocs\"") && e.to_string().contains("unknown level"),
        "{e}"
    );
    let e = p("0xzz").unwrap_err();
    assert!(e.to_string().contains("\"0xzz\": not a number"), "{e}");
    assert_eq!(
        (DebugVerbosity::ALLOCATIONS | DebugVerbosity::RELEASES).to_string(),
        "ALLOCATIONS|RELEASES"
    );
}

/// A subscriber keeping the messages of `reservoir::observe::debug` events.
pub(crate) struct Collect(pub(crate) Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for Collect {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == reservoir::observe::debug::TARGET
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        struct V(String);
        impl tracing::field::Visit for V {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "message" {
                    self.0 = format!("{v:?}");
                }
            }
        }
        let mut v = V(String::new());
        e.record(&mut v);
        self.0.lock().unwrap().push(v.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn logged(verbosity: DebugVerbosity, f: impl FnOnce(&Checked)) -> Vec<String> {
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let c = Checked::default_device();
    c.a.set_debug_verbosity(verbosity);
    assert_eq!(c.a.debug_verbosity(), verbosity);
    tracing::subscriber::with_default(Collect(out.clone()), || f(&c));
    let v = out.lock().unwrap().clone();
    v
}

fn workload(c: &Checked) {
    let small = c.alloc(4096);
    let large = c.alloc(3 * MIB);
    c.free(small);
    c.free(large);
    let again = c.alloc(3 * MIB);
    c.free(again);
    c.empty_cache();
}

#[test]
fn verbosity_levels_emit_tracing_events() {
    assert!(logged(DebugVerbosity::OFF, workload).is_empty());
    let starts = |v: &[String], prefix: &str| v.iter().filter(|m| m.starts_with(prefix)).count();
    let a = logged(DebugVerbosity::ALLOCATIONS, workload);
    assert_eq!(starts(&a, "Allocated small segment"), 1, "{a:#?}");
    assert_eq!(starts(&a, "Allocated large segment"), 1);
    assert_eq!(starts(&a, "Allocated small block of size 4.00 KiB"), 1);
    assert_eq!(a.len(), 4, "{a:#?}");
    let r = logged(DebugVerbosity::RECYCLES, workload);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert!(
        r[0].starts_with("Reusing large block of size 3.00 MiB"),
        "{r:#?}"
    );
    let rel = logged(DebugVerbosity::RELEASES, workload);
    assert_eq!(
        starts(&rel, "Released small segment of size 2.00 MiB"),
        1,
        "{rel:#?}"
    );
    assert_eq!(starts(&rel, "Released large segment of size 20.00 MiB"), 1);
    assert_eq!(starts(&rel, "Returned"), 3);
    let large_only = logged(
        DebugVerbosity::RELEASES | DebugVerbosity::LARGE_ONLY,
        workload,
    );
    assert!(
        large_only.iter().all(|m| m.contains("large")),
        "{large_only:#?}"
    );
    assert_eq!(large_only.len(), 3);
    let prof = logged(DebugVerbosity::PROFILING, workload);
    assert_eq!(prof.len(), 1);
    assert!(
        prof[0].starts_with("Attempting to release cached blocks"),
        "{prof:#?}"
    );
}

#[test]
fn snapshot_pickle_loads_in_python_and_passes_memory_viz_checks() {
    // No torch needed: plain pickle and the consistency rules _memory_viz.py
    // and MemoryViz.js rely on.
    let Ok(out) = std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .output()
    else {
        panic!("python3 is required for this test");
    };
    assert!(out.status.success());
    let c = Checked::new("expandable_segments:True", 8 * GIB);
    record(&c, HistoryMode::All, RecordContext::All);
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let a = c.alloc(30 * MIB);
    let b = c.alloc(700);
    let d = c.alloc_on(5 * MIB, s1);
    c.a.record_stream(b, s1).unwrap();
    dev.hold_stream(s1).unwrap();
    c.free(b);
    c.free(a);
    c.empty_cache();
    let _e = c.alloc(MIB);
    let snap = c.a.snapshot(None);
    snap.check_consistency().unwrap();
    let path =
        std::env::temp_dir().join(format!("reservoir-observe-{}.pickle", std::process::id()));
    std::fs::write(&path, snap.to_pickle().unwrap()).unwrap();
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(PY_CHECK)
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ok"),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dev.release_stream(s1).unwrap();
    c.free(d);
}

const PY_CHECK: &str = r#"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
assert list(s) == ["segments", "device_traces", "allocator_settings", "external_annotations", "host_segments", "host_traces"], list(s)
states = {"active_allocated", "active_pending_free", "inactive"}
for seg in s["segments"]:
    addr = seg["address"]
    total = alloc = active = req = 0
    for b in seg["blocks"]:
        assert b["state"] in states, b["state"]
        assert b["address"] == addr, (b["address"], addr)
        addr += b["size"]
        total += b["size"]
        if b["state"] == "active_allocated":
            alloc += b["size"]
        if b["state"] != "inactive":
            active += b["size"]
            req += b["requested_size"]
            assert b["requested_size"] <= b["size"]
        else:
            assert b["frames"] == []
        for f in b["frames"]:
            assert set(f) == {"name", "filename", "line"}
    assert seg["total_size"] == total and seg["allocated_size"] == alloc
    assert seg["active_size"] == active and seg["requested_size"] == req
    assert seg["segment_type"] in ("small", "large")
    assert isinstance(seg["segment_pool_id"], tuple) and isinstance(seg["is_expandable"], bool)
# _memory_viz segsum: allocated requested + internal + external free == total
for seg in s["segments"]:
    requested = sum(b["requested_size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    internal = sum(b["size"] - b["requested_size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    free = sum(b["size"] for b in seg["blocks"] if b["state"] != "active_allocated")
    assert requested + internal + free == seg["total_size"]
segs = sorted(s["segments"], key=lambda x: x["address"])
for a, b in zip(segs, segs[1:]):
    assert a["address"] + a["total_size"] <= b["address"]
actions = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"}
for e in s["device_traces"][0]:
    assert e["action"] in actions
    assert ("device_free" in e) == (e["action"] == "oom")
    assert isinstance(e["time_us"], int) and isinstance(e["stream"], int)
print("ok", len(s["segments"]), len(s["device_traces"][0]))
"#;

#[test]
fn recording_toggles_keep_invariants_and_drop_stacks_on_free() {
    let c = Checked::default_device();
    record(&c, HistoryMode::All, RecordContext::State);
    let p = c.alloc(MIB);
    c.a.record_memory_history(HistoryConfig::off());
    // The live block keeps its stack (as torch), and loses it when freed.
    let snap = c.a.snapshot(None);
    assert_eq!(
        names(snap.segments[0].blocks[0].frames.as_ref().unwrap()),
        ["ctx0"]
    );
    c.free(p);
    let q = c.alloc(MIB);
    assert_eq!(q, p);
    let snap = c.a.snapshot(None);
    assert!(snap.segments[0].blocks[0]
        .frames
        .as_ref()
        .unwrap()
        .is_empty());
    c.free(q);
    let _ = DevicePtr::NULL;
}

#[test]
fn verbosity_is_read_from_the_environment_at_creation() {
    // Other tests set their level explicitly, so changing the variable here
    // cannot disturb them.
    std::env::set_var(reservoir::observe::debug::ENV_VAR, "allocations|releases");
    let c = Checked::default_device();
    assert_eq!(
        c.a.debug_verbosity(),
        DebugVerbosity::ALLOCATIONS | DebugVerbosity::RELEASES
    );
    std::env::set_var(reservoir::observe::debug::ENV_VAR, "bogus");
    let out: Arc<Mutex<Vec<String>>> = Arc::default();
    let c = tracing::subscriber::with_default(Collect(out.clone()), Checked::default_device);
    std::env::remove_var(reservoir::observe::debug::ENV_VAR);
    assert_eq!(c.a.debug_verbosity(), DebugVerbosity::OFF);
    let msgs = out.lock().unwrap().clone();
    assert_eq!(msgs.len(), 1, "{msgs:#?}");
    assert!(
        msgs[0].starts_with("invalid RESERVOIR_DEBUG_VERBOSITY value \"bogus\": unknown level"),
        "{msgs:#?}"
    );
}

mod random {
    //! Random sequences with recording levels switched on and off: the
    //! invariant checker (stacks only on active blocks) after every
    //! operation, and every snapshot consistent and equal to `segments()`.

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Alloc { size: u64, stream: u64 },
        Free { pick: usize },
        RecordStream { pick: usize, stream: u64 },
        Hold { stream: u64 },
        Release { stream: u64 },
        EmptyCache,
        Record { mode: u8, level: u8 },
        Snapshot,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (prop_oneof![1u64..=MIB, (MIB + 1)..60 * MIB], 0u64..3)
                .prop_map(|(size, stream)| Op::Alloc { size, stream }),
            5 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            1 => (any::<usize>(), 0u64..3).prop_map(|(pick, stream)| Op::RecordStream { pick, stream }),
            1 => (1u64..3).prop_map(|stream| Op::Hold { stream }),
            1 => (1u64..3).prop_map(|stream| Op::Release { stream }),
            1 => Just(Op::EmptyCache),
            1 => (0u8..3, 0u8..4).prop_map(|(mode, level)| Op::Record { mode, level }),
            1 => Just(Op::Snapshot),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn recording_toggles_keep_every_invariant(
            expandable in any::<bool>(),
            ops in proptest::collection::vec(op(), 20..120),
        ) {
            let c = Checked::new(if expandable { "expandable_segments:True" } else { "" }, 2 * GIB);
            let dev = c.a.backend();
            let streams = [S0, dev.create_stream().unwrap(), dev.create_stream().unwrap()];
            let mut live: Vec<DevicePtr> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc { size, stream } => {
                        if let Ok(p) = c.a.raw_alloc(size, streams[stream as usize]) {
                            live.push(p);
                        }
                    }
                    Op::Free { pick } if !live.is_empty() => {
                        let p = live.swap_remove(pick % live.len());
                        c.a.raw_free(p).unwrap();
                    }
                    Op::RecordStream { pick, stream } if !live.is_empty() => {
                        c.a.record_stream(live[pick % live.len()], streams[stream as usize]).unwrap();
                    }
                    Op::Hold { stream } => dev.hold_stream(streams[stream as usize]).unwrap(),
                    Op::Release { stream } => dev.release_stream(streams[stream as usize]).unwrap(),
                    Op::EmptyCache => c.a.empty_cache().unwrap(),
                    Op::Record { mode, level } => {
                        let enabled = [HistoryMode::Off, HistoryMode::State, HistoryMode::All][mode as usize];
                        let context = [RecordContext::Never, RecordContext::State, RecordContext::Alloc, RecordContext::All][level as usize];
                        c.a.record_memory_history(HistoryConfig {
                            enabled,
                            context,
                            max_entries: 64,
                            recorder: counting_recorder(),
                            clear_history: false,
                        });
                    }
                    Op::Snapshot => {
                        let snap = c.a.snapshot(None);
                        prop_assert!(snap.check_consistency().is_ok(), "{:?}", snap.check_consistency());
                        let ours: Vec<(u64, u64, usize)> = c.segments().iter()
                            .map(|s| (s.address, s.total_size, s.blocks.len())).collect();
                        let theirs: Vec<(u64, u64, usize)> = snap.segments.iter()
                            .map(|s| (s.address, s.total_size, s.blocks.len())).collect();
                        prop_assert_eq!(ours, theirs);
                        let active: u64 = snap.segments.iter().map(|s| s.active_size).sum();
                        prop_assert_eq!(active as i64, c.stats().active_bytes.all().current);
                        for s in &snap.segments {
                            for b in &s.blocks {
                                if b.state == BlockState::Inactive {
                                    prop_assert!(b.frames.as_ref().unwrap().is_empty());
                                }
                            }
                        }
                    }
                    _ => {}
                }
                c.check();
            }
            for &s in &streams[1..] {
                dev.release_stream(s).unwrap();
            }
            for p in live {
                c.a.raw_free(p).unwrap();
            }
            c.empty_cache();
        }
    }
}

/// Issue 29: `Snapshot::write_pickle` streams the very bytes of
/// `to_pickle` (several frames, several batches of 1,000 entries, shared
/// stacks memoized), and a failing sink is an error, not a panic.
#[test]
fn a_streamed_snapshot_pickle_is_the_same_bytes() {
    use reservoir::observe::pickle::{to_vec_with, to_writer_with, WriteError, WriteOptions};
    let c = Checked::default_device();
    c.a.record_memory_history(HistoryConfig {
        context: RecordContext::All,
        max_entries: usize::MAX,
        ..HistoryConfig::default()
    });
    let stacks: Vec<Arc<[Frame]>> = (0..7)
        .map(|i| {
            Arc::from(vec![Frame {
                name: format!("layer{i}"),
                filename: "model.py".into(),
                line: i,
            }])
        })
        .collect();
    let mut live = Vec::new();
    for i in 0..2600u64 {
        let f = stacks[(i % 7) as usize].clone();
        live.push(
            c.a.seeder()
                .raw_alloc_with_frames(512 + i * 4096, S0, f)
                .unwrap(),
        );
        if i % 3 == 0 {
            let p = live.swap_remove(0);
            c.a.seeder()
                .raw_free_with_frames(p, stacks[(i % 5) as usize].clone())
                .unwrap();
        }
    }
    let snap = c.a.snapshot(None);
    assert!(snap.device_traces[0].len() > 3000);
    let whole = snap.to_pickle().unwrap();
    assert!(
        whole.len() > 3 * 65536,
        "{} bytes: several frames",
        whole.len()
    );
    let mut streamed = Vec::new();
    snap.write_pickle(&mut streamed).unwrap();
    assert!(
        streamed == whole,
        "{} vs {} bytes",
        streamed.len(),
        whole.len()
    );

    // The generic writer, every protocol, into a sink.
    let value = snap.to_value();
    for protocol in [2, 3, 4] {
        let opts = WriteOptions {
            protocol,
            ..WriteOptions::default()
        };
        let mut out = Vec::new();
        to_writer_with(&value, &opts, &mut out).unwrap();
        assert!(
            out == to_vec_with(&value, &opts).unwrap(),
            "protocol {protocol}"
        );
    }

    struct Full(usize);
    impl std::io::Write for Full {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.0 < b.len() {
                return Err(std::io::Error::other("disk full"));
            }
            self.0 -= b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let e = snap.write_pickle(&mut Full(100_000)).unwrap_err();
    assert!(
        matches!(&e, WriteError::Io(m) if m.contains("disk full")),
        "{e}"
    );
    for live in live {
        c.free(live);
    }
}
