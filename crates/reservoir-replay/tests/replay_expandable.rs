//! Snapshots recorded by PyTorch 2.15's real allocator with
//! `expandable_segments:True` (on the oracle's fake device, see
//! `tools/regen-expandable-snapshots.sh`) replay exactly in PyTorch mode:
//! every `segment_map` / `segment_unmap` (action and size, in order) and
//! every block placement matches, and so do the peak reserved bytes and the
//! OOM count.

use std::path::Path;

use reservoir::observe::trace::TraceAction;
use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::replay::recorded::{convert, recorded_setting, replay_recorded};
use reservoir_replay::replay::ReplayOptions;

const SNAPSHOTS: [&str; 5] = [
    "single_stream",
    "streams",
    "oom_flush",
    "recreated",
    "mid_run",
];

#[test]
fn expandable_snapshots_replay_exactly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay_fidelity/expandable");
    let mut failures = Vec::new();
    for name in SNAPSHOTS {
        let path = dir.join(format!("{name}.pickle"));
        let loaded = input::load(&path).unwrap();
        let input = loaded.to_trace_input();
        let setting = recorded_setting(input.allocator_settings.as_ref());
        assert!(
            setting.config.contains("expandable_segments:True"),
            "{name}: {}",
            setting.config
        );
        let config = setting.allocator_config().unwrap();
        let dev = &input.devices[0];
        let rec = convert(dev, &config, input.addresses == AddressKind::Synthetic)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let maps = rec
            .segment_events
            .iter()
            .filter(|e| {
                matches!(
                    e.action,
                    TraceAction::SegmentMap | TraceAction::SegmentUnmap
                )
            })
            .count();
        assert!(maps > 0, "{name}: no segment_map / segment_unmap");
        let options = ReplayOptions {
            capacity: rec.capacity.unwrap_or(DEFAULT_CAPACITY),
            ..ReplayOptions::default()
        };
        let (report, fid) = replay_recorded(&rec, &setting, &options, true, &mut |_| {})
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let fid = fid.expect("snapshots record segments");
        eprintln!(
            "{name}: segment events {}/{} (replayed {}), placements {}/{}, peak reserved {} vs {}, ooms {} vs {}, start: {} expandable segments, {} empty_cache ops",
            fid.segment_events_matched,
            fid.segment_events_total,
            fid.segment_events_replayed,
            fid.placements_matched,
            fid.placements_total,
            report.peak_reserved,
            fid.recorded_peak_reserved,
            report.ooms,
            fid.recorded_ooms,
            rec.start.expandable.len(),
            rec.empty_caches,
        );
        if name == "oom_flush" {
            // 3 flush-and-retry runs and 4 flushes before an OOM are the
            // allocator's; only the final run is the user's empty_cache().
            assert_eq!(rec.empty_caches, 1, "{name}");
        }
        if fid.segment_events_matched != fid.segment_events_total
            || fid.placements_matched != fid.placements_total
            || !fid.is_exact(&report)
        {
            failures.push(format!("{name}: {fid:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
