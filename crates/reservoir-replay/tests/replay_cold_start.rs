//! `--start cold` (issue 17 part 1): a recorded trace replayed from an empty
//! allocator. The blocks live at the first entry are allocated first, in
//! address order, asking for their requested bytes on their stream; no
//! recorded segment is inherited; peak live (`requested_bytes.all.peak`) is
//! the same whatever the policy. The invariant checker runs after every op.

use reservoir::observe::snapshot::{Block, BlockState, Segment, SegmentType};
use reservoir::observe::trace::{TraceAction, TraceEntry};
use reservoir::sim::SimDevice;
use reservoir::{AllocatorConfig, CachingAllocator, StreamId};
use reservoir_replay::input::{self, AddressKind, DeviceEvents};
use reservoir_replay::oracle_trace::{Op, Trace};
use reservoir_replay::replay::recorded::{
    convert, recorded_setting, RecordedTrace, StartMode, UnknownStartMode,
};
use reservoir_replay::replay::{Replay, ReplayOptions, ReplayReport, ReplaySetting};
use reservoir_testkit::traces::shared_trace;

const MIB: u64 = 1 << 20;
const BASE: u64 = 0x7f00_0000_0000;

fn block(size: u64, requested: u64, state: BlockState) -> Block {
    Block {
        size,
        requested_size: Some(requested),
        state,
        ..Block::default()
    }
}

/// Two recorded segments (the higher one first in the list, on another
/// stream), three blocks live at the first entry (one freed during the
/// trace), and a trace that frees one and allocates 6 MiB.
fn recorded() -> RecordedTrace {
    use BlockState::*;
    let segments = vec![
        Segment {
            address: BASE + 64 * MIB,
            total_size: 20 * MIB,
            stream: StreamId(7),
            segment_type: SegmentType::Large,
            blocks: vec![
                block(3 * MIB, 3 * MIB - 100, ActiveAllocated),
                block(17 * MIB, 17 * MIB, Inactive),
            ],
            ..Segment::default()
        },
        Segment {
            address: BASE,
            total_size: 20 * MIB,
            segment_type: SegmentType::Large,
            blocks: vec![
                block(6 * MIB, 6 * MIB, Inactive),
                block(5 * MIB, 5 * MIB - 512, ActiveAllocated),
                block(6 * MIB, 6 * MIB, ActiveAllocated),
                block(3 * MIB, 3 * MIB, Inactive),
            ],
            ..Segment::default()
        },
    ];
    let entry = |action, addr, size| TraceEntry::new(action, addr, size, StreamId::DEFAULT);
    let events = vec![
        entry(TraceAction::FreeRequested, BASE, 4 * MIB),
        entry(TraceAction::FreeCompleted, BASE, 4 * MIB),
        entry(TraceAction::Alloc, BASE + 11 * MIB, 6 * MIB),
    ];
    let dev = DeviceEvents {
        device: 0,
        events,
        initially_allocated: None,
        final_segments: Some(segments),
    };
    convert(&dev, &AllocatorConfig::default(), false).unwrap()
}

/// Replay `rec` with `setting`, checking the allocator's invariants after
/// every op.
fn replay_checked(rec: &RecordedTrace, setting: &ReplaySetting, capacity: u64) -> ReplayReport {
    let options = ReplayOptions {
        capacity,
        ..ReplayOptions::default()
    };
    let mut r: Replay<'_, CachingAllocator<SimDevice>> =
        Replay::build(&rec.trace, Some(&rec.start), setting, &options).unwrap();
    while r.step().unwrap() {
        r.allocator()
            .check_invariants()
            .unwrap_or_else(|e| panic!("{} at op {}: {e}", setting.name, r.position()));
    }
    r.report()
}

/// The peak of the bytes held by callers, computed from the ops alone.
fn peak_requested(trace: &Trace) -> u64 {
    let mut held = std::collections::HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for op in &trace.ops {
        match op {
            Op::Alloc { id, bytes, .. } => {
                held.insert(*id, *bytes);
                now += bytes;
                peak = peak.max(now);
            }
            Op::Free { id } => now -= held.remove(id).unwrap_or(0),
            _ => {}
        }
    }
    peak
}

#[test]
fn start_mode_parses_and_names_a_bad_value() {
    assert_eq!("cold".parse::<StartMode>().unwrap(), StartMode::Cold);
    assert_eq!(
        "recorded".parse::<StartMode>().unwrap(),
        StartMode::Recorded
    );
    assert_eq!(StartMode::default(), StartMode::Recorded);
    let e: UnknownStartMode = "warm".parse::<StartMode>().unwrap_err();
    assert!(e.to_string().contains("\"warm\""), "{e}");
    assert_eq!(serde_json::to_string(&StartMode::Cold).unwrap(), "\"cold\"");
}

#[test]
fn recorded_start_is_the_trace_unchanged() {
    let rec = recorded();
    let same = rec.clone().with_start(StartMode::Recorded);
    assert_eq!(same.trace.ops, rec.trace.ops);
    assert_eq!(same.start, rec.start);
}

#[test]
fn cold_start_allocates_the_live_blocks_first_in_address_order() {
    let rec = recorded();
    assert_eq!(rec.start.segments.len(), 2);
    assert_eq!(rec.live_at_start_count(), 3);
    let cold = rec.clone().with_start(StartMode::Cold);
    // No recorded segment is inherited, no address scripted, no fidelity.
    assert!(cold.start.segments.is_empty() && cold.start.expandable.is_empty());
    assert!(cold.start.scripted_addresses.is_empty());
    assert!(cold.segment_events.is_empty() && !cold.segments_known);
    assert!(cold.start.literal_streams);
    // The three live blocks first: address order, requested bytes, their
    // segment's stream.
    let first: Vec<(u64, String)> = cold.trace.ops[..3]
        .iter()
        .map(|op| match op {
            Op::Alloc {
                bytes,
                stream: Some(s),
                ..
            } => (*bytes, s.as_str().to_string()),
            other => panic!("expected an allocation on a stream, got {other:?}"),
        })
        .collect();
    assert_eq!(
        first,
        vec![
            (4 * MIB, "0".to_string()),
            (5 * MIB - 512, "0".to_string()),
            (3 * MIB - 100, "7".to_string()),
        ]
    );
    // Then the recorded trace, unchanged, with its entry numbers.
    assert_eq!(cold.trace.ops[3..], rec.trace.ops[..]);
    assert_eq!(cold.trace.lines[3..], rec.trace.lines[..]);
    assert_eq!(cold.trace.ops.len(), cold.trace.lines.len());
}

#[test]
fn cold_start_builds_its_own_segments_and_peak_live_is_policy_independent() {
    let cold = recorded().with_start(StartMode::Cold);
    let want_live = peak_requested(&cold.trace);
    // The three live blocks, less the 4 MiB one, plus 6 MiB.
    assert_eq!(want_live, 5 * MIB - 512 + 3 * MIB - 100 + 6 * MIB);
    let mut peaks = Vec::new();
    for setting in [
        ReplaySetting::new("pytorch", ""),
        ReplaySetting::new("expandable", "expandable_segments:True"),
        ReplaySetting::new("roundup-4", "roundup_power2_divisions:4"),
    ] {
        let r = replay_checked(&cold, &setting, 80 << 30);
        assert_eq!(r.peak_live, want_live, "{}", setting.name);
        assert!(r.peak_reserved >= r.peak_live, "{}", setting.name);
        assert!(
            r.driver_allocs >= 1,
            "{}: no segment was built",
            setting.name
        );
        assert_eq!(r.ooms, 0);
        peaks.push(r.peak_reserved);
    }
    // PyTorch mode from cold (spec 1.7): blocks under 10 MiB share 20 MiB
    // large segments, one per stream: stream 0's 4 + 5 + 6 MiB fit one,
    // stream 7's 3 MiB gets another.
    assert_eq!(peaks[0], 40 * MIB);
}

#[test]
fn cold_start_of_real_traces_has_the_same_peak_live_under_every_policy() {
    for rel in [
        "tomi-mlp/91c77ee1_snapshot.pickle",
        "octree-nca/55ff68f5_cuda_single_step.pickle",
        "zdevito-blog-oldviz/031e31d6_assets_trace.alloc_data.json",
    ] {
        let Some(path) = shared_trace(rel) else {
            eprintln!("skipped {rel}: ../shared/traces not found");
            continue;
        };
        let loaded = input::load(&path).unwrap();
        let input = loaded.to_trace_input();
        let recorded = recorded_setting(input.allocator_settings.as_ref());
        let config = recorded.allocator_config().unwrap();
        let dev = input.devices.iter().find(|d| !d.events.is_empty()).unwrap();
        let rec = convert(dev, &config, input.addresses == AddressKind::Synthetic).unwrap();
        let live = rec.live_at_start_count();
        let cold = rec.with_start(StartMode::Cold);
        assert!(cold.start.segments.is_empty(), "{rel}");
        let want = peak_requested(&cold.trace);
        let base = ReplaySetting::new("pytorch", recorded.config.clone());
        let expandable = ReplaySetting::new("expandable", "expandable_segments:True");
        for setting in [base, expandable] {
            let r = replay_checked(&cold, &setting, 80 << 30);
            assert_eq!(r.ooms, 0, "{rel}");
            assert_eq!(r.peak_live, want, "{rel} {}", setting.name);
            assert!(r.peak_reserved >= r.peak_live, "{rel}");
            assert_eq!(r.alloc_ops as usize, rec_allocs(&cold.trace), "{rel}");
            assert!(rec_allocs(&cold.trace) >= live, "{rel}");
        }
    }
}

fn rec_allocs(trace: &Trace) -> usize {
    trace
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Alloc { .. }))
        .count()
}
