//! Snapshots recorded inside a `torch.cuda.MemPool` (or a CUDA graph's
//! pool) replay exactly in PyTorch mode: the recorded pool ids (a trace
//! entry's `pool_id`, torch 2.15+; a segment's `segment_pool_id`) are kept
//! on conversion, and the allocations of a private pool replay in a private
//! pool of their own (issue 41 item 5).
//!
//! * A genuine snapshot: `tools/gpu/record.py mempool` (the scenario of
//!   `tools/gpu-check.sh --dry-run`) run by PyTorch 2.15 on the oracle's
//!   fake device, written into a temporary folder. Without the oracle's
//!   torch venv it prints `SKIPPED-BACKEND` and passes (it fails in CI).
//! * Hand-built snapshots: a start state with a private pool's segment and
//!   allocations routed by the segment they lie in (no per-entry `pool_id`,
//!   as torch before 2.15 wrote them); a private pool released and emptied
//!   (`~MemPool`'s `emptyCache(pool)`) while the default pool keeps a free
//!   cached segment.
//!
//! The fidelity of a CUDA-graph pool snapshot is not tested here: the fake
//! device cannot capture CUDA graphs (`cudaStreamBeginCapture` answers
//! NOT_SUPPORTED), so none can be recorded without a GPU.

use std::path::{Path, PathBuf};
use std::process::Command;

use reservoir::backend::StreamId;
use reservoir::observe::snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use reservoir::observe::trace::{TraceAction, TraceEntry};
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::oracle_trace::Op;
use reservoir_replay::replay::recorded::{
    convert, recorded_setting, replay_recorded, Fidelity, RecordedTrace, StartMode,
};
use reservoir_replay::replay::{ReplayOptions, ReplayReport};
use reservoir_testkit::traces::torch_oracle;

const MIB: u64 = 1 << 20;

/// Load `path`, convert its first device, replay it in PyTorch mode.
fn replay_file(path: &Path) -> (RecordedTrace, ReplayReport, Fidelity) {
    let input = input::load(path).unwrap().to_trace_input();
    let setting = recorded_setting(input.allocator_settings.as_ref());
    let config = setting.allocator_config().unwrap();
    let dev = &input.devices[0];
    let rec = convert(dev, &config, input.addresses == AddressKind::Synthetic).unwrap();
    let options = ReplayOptions {
        capacity: rec.capacity.unwrap_or(DEFAULT_CAPACITY),
        ..ReplayOptions::default()
    };
    let (report, fid) = replay_recorded(&rec, &setting, &options, true, &mut |_| {}).unwrap();
    (rec, report, fid.expect("snapshots record segments"))
}

fn assert_exact(name: &str, report: &ReplayReport, fid: &Fidelity) {
    assert!(
        fid.is_exact(report),
        "{name}: segment events {}/{} (replayed {}, first mismatch {:?}), placements {}/{}, \
         peak reserved {} vs {}",
        fid.segment_events_matched,
        fid.segment_events_total,
        fid.segment_events_replayed,
        fid.first_segment_mismatch,
        fid.placements_matched,
        fid.placements_total,
        report.peak_reserved,
        fid.recorded_peak_reserved,
    );
}

fn pool_ops(rec: &RecordedTrace) -> Vec<String> {
    rec.trace
        .ops
        .iter()
        .filter(|op| {
            matches!(
                op,
                Op::UsePool { .. } | Op::ReleasePool { .. } | Op::EmptyPool { .. }
            )
        })
        .map(|op| op.to_string())
        .collect()
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("private_pools");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_genuine_mempool_snapshot_replays_exactly() {
    let Some(oracle) = torch_oracle("the torch oracle (MemPool snapshot)") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tmp("genuine");
    let o = Command::new(oracle.join("oracle-python"))
        .arg(root.join("tools/gpu/record.py"))
        .arg("mempool")
        .arg(&out)
        .output()
        .expect("oracle-python runs");
    assert!(
        o.status.success(),
        "record.py mempool failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let (rec, report, fid) = replay_file(&out.join("mempool.pickle"));
    // The pool's allocations, back in the default pool, the pool released
    // and emptied by `del pool` (`~MemPool`).
    let ops = pool_ops(&rec);
    assert!(ops.len() >= 4, "{ops:?}");
    assert!(ops.iter().any(|o| o.starts_with("x ")), "{ops:?}");
    assert_eq!(fid.placements_total, 9);
    assert_exact("mempool", &report, &fid);
}

fn entry(action: TraceAction, addr: u64, size: u64, pool: Option<(i64, i64)>) -> TraceEntry {
    let mut e = TraceEntry::new(action, addr, size, StreamId(0));
    e.pool_id = pool;
    e
}

fn free(addr: u64, size: u64, pool: Option<(i64, i64)>) -> [TraceEntry; 2] {
    [
        entry(TraceAction::FreeRequested, addr, size, pool),
        entry(TraceAction::FreeCompleted, addr, size, pool),
    ]
}

/// A large segment at dump time, tiled by `blocks` (offset, size,
/// allocated), in pool `pool`.
fn segment(address: u64, pool: (i64, i64), blocks: &[(u64, u64, bool)]) -> Segment {
    let allocated: u64 = blocks.iter().filter(|b| b.2).map(|b| b.1).sum();
    Segment {
        address,
        total_size: 20 * MIB,
        allocated_size: allocated,
        active_size: allocated,
        requested_size: Some(allocated),
        stream: StreamId(0),
        segment_type: SegmentType::Large,
        segment_pool_id: Some(pool),
        is_expandable: Some(false),
        blocks: blocks
            .iter()
            .map(|&(offset, size, live)| Block {
                address: Some(address + offset),
                size,
                requested_size: Some(size),
                state: if live {
                    BlockState::ActiveAllocated
                } else {
                    BlockState::Inactive
                },
                ..Block::default()
            })
            .collect(),
        ..Segment::default()
    }
}

fn write(name: &str, segments: Vec<Segment>, trace: Vec<TraceEntry>) -> PathBuf {
    let snap = Snapshot {
        segments,
        device_traces: vec![trace],
        ..Snapshot::default()
    };
    let path = tmp(name);
    std::fs::write(&path, snap.to_pickle().unwrap()).unwrap();
    path
}

/// A MemPool's segment alive before the trace: seeded into its pool, and
/// an allocation routed there by the segment it lies in (no `pool_id` on
/// the entries). The default pool's 8 MiB needs a segment of its own,
/// although the pool's segment has 16 MiB free.
#[test]
fn a_start_state_private_segment_keeps_its_pool() {
    let (a, b) = (0x7f00_0000_0000u64, 0x7f00_1000_0000u64);
    let trace = vec![
        entry(TraceAction::SegmentAlloc, b, 20 * MIB, None),
        entry(TraceAction::Alloc, b, 8 * MIB, None),
        entry(TraceAction::Alloc, a + 4 * MIB, 2 * MIB, None),
    ];
    let segments = vec![
        segment(
            a,
            (0, 1),
            &[
                (0, 4 * MIB, true),
                (4 * MIB, 2 * MIB, true),
                (6 * MIB, 14 * MIB, false),
            ],
        ),
        segment(b, (0, 0), &[(0, 8 * MIB, true), (8 * MIB, 12 * MIB, false)]),
    ];
    let path = write("start_state.pickle", segments, trace);
    let (rec, report, fid) = replay_file(&path);
    assert_eq!(
        rec.start.segment_pools.values().collect::<Vec<_>>(),
        [&(0, 1)]
    );
    assert_eq!(pool_ops(&rec), ["p 0 1"]);
    assert_eq!(fid.segment_events_total, 1);
    assert_exact("start_state", &report, &fid);
}

/// A MemPool used, then destroyed (`releasePool`, `emptyCache(pool)`):
/// only its segment is freed; the default pool's free cached segment stays.
#[test]
fn a_released_pool_is_emptied_alone() {
    let (e, c) = (0x7f00_3000_0000u64, 0x7f00_2000_0000u64);
    let (default, pool) = (Some((0, 0)), Some((0, 2)));
    let mut trace = vec![
        entry(TraceAction::SegmentAlloc, e, 20 * MIB, default),
        entry(TraceAction::Alloc, e, 4 * MIB, default),
    ];
    trace.extend(free(e, 4 * MIB, default));
    trace.push(entry(TraceAction::SegmentAlloc, c, 20 * MIB, pool));
    trace.push(entry(TraceAction::Alloc, c, 4 * MIB, pool));
    trace.extend(free(c, 4 * MIB, pool));
    trace.push(entry(TraceAction::SegmentFree, c, 20 * MIB, pool));
    let segments = vec![segment(e, (0, 0), &[(0, 20 * MIB, false)])];
    let path = write("released.pickle", segments, trace);
    let (rec, report, fid) = replay_file(&path);
    assert_eq!(pool_ops(&rec), ["p 0 2", "x 0 2", "e 0 2"]);
    assert_eq!(rec.empty_caches, 1);
    assert_exact("released", &report, &fid);
}

/// A MemPool's segment alive and free at the first entry, then the pool
/// destroyed: from the recorded start (seeded into its pool) and from a
/// cold start (the pool made before the trace) the release finds the pool.
#[test]
fn a_start_state_pool_released_from_either_start() {
    let (a, b) = (0x7f00_0000_0000u64, 0x7f00_1000_0000u64);
    let pool = Some((0, 3));
    let trace = vec![
        entry(TraceAction::Alloc, b, 2 * MIB, Some((0, 0))),
        entry(TraceAction::SegmentFree, a, 20 * MIB, pool),
    ];
    let segments = vec![segment(
        b,
        (0, 0),
        &[(0, 2 * MIB, true), (2 * MIB, 18 * MIB, false)],
    )];
    let path = write("start_released.pickle", segments, trace);
    let (rec, report, fid) = replay_file(&path);
    assert_eq!(
        rec.start.segment_pools.values().collect::<Vec<_>>(),
        [&(0, 3)]
    );
    assert_eq!(pool_ops(&rec), ["x 0 3", "e 0 3"]);
    assert_exact("start_released", &report, &fid);

    let cold = rec.with_start(StartMode::Cold);
    let setting = recorded_setting(None);
    let (report, _) = replay_recorded(
        &cold,
        &setting,
        &ReplayOptions::default(),
        false,
        &mut |_| {},
    )
    .expect("a cold start makes the pool it releases");
    assert_eq!(report.ooms, 0);
}
