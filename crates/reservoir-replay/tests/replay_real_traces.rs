//! Replays every trace file in `../shared/traces` in PyTorch mode and fails
//! on any fidelity mismatch not listed (and explained) in
//! `tests/replay_fidelity/KNOWN_MISMATCHES.md`. A listed file that now
//! replays exactly also fails, so the list only shrinks (a ratchet).
//!
//! Skipped (with a message) when `../shared/traces` is absent.

use std::collections::BTreeMap;

use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::replay::recorded::{convert, replay_recorded};
use reservoir_replay::replay::ReplayOptions;
use reservoir_replay::torch_release::recorded_setting_as;
use reservoir_testkit::traces::{shared_traces, trace_files};

/// `file#device` -> the line listing it in KNOWN_MISMATCHES.md.
fn known() -> BTreeMap<String, String> {
    let text = include_str!("replay_fidelity/KNOWN_MISMATCHES.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(k, rest)| (k.to_string(), rest.to_string()))
        .collect()
}

#[test]
fn every_real_trace_replays_exactly_or_is_explained() {
    let Some(dir) = shared_traces() else {
        eprintln!("skipped: ../shared/traces not found (set RESERVOIR_TRACES)");
        return;
    };
    let known = known();
    let mut failures = Vec::new();
    let mut replayed = 0;
    let mut releases: BTreeMap<String, usize> = BTreeMap::new();
    let (mut seg_m, mut seg_t, mut pl_m, mut pl_t) = (0, 0, 0, 0);
    for path in trace_files(&dir) {
        let rel = path.strip_prefix(&dir).unwrap().display().to_string();
        let loaded = match input::load(&path) {
            Ok(l) => l,
            Err(e) => {
                failures.push(format!("{rel}: does not load: {e}"));
                continue;
            }
        };
        let input = loaded.to_trace_input();
        // PyTorch mode of the release the file shows, as `reservoir replay`
        // replays it (docs/replay-fidelity.md, "PyTorch releases").
        let (setting, choice) = recorded_setting_as(&loaded, &input, None);
        *releases.entry(choice.release.to_string()).or_insert(0) += 1;
        let config = setting.allocator_config().unwrap();
        assert_eq!(config.torch_release, choice.release, "{rel}");
        for dev in &input.devices {
            if dev.events.is_empty() {
                continue;
            }
            let key = format!("{rel}#{}", dev.device);
            let rec = match convert(dev, &config, input.addresses == AddressKind::Synthetic) {
                Ok(r) => r,
                Err(e) => {
                    if !known.contains_key(&key) {
                        failures.push(format!("{key}: does not convert: {e}"));
                    }
                    continue;
                }
            };
            let options = ReplayOptions {
                capacity: rec.capacity.unwrap_or(DEFAULT_CAPACITY),
                ..ReplayOptions::default()
            };
            let (report, fid) = match replay_recorded(&rec, &setting, &options, true, &mut |_| {}) {
                Ok(x) => x,
                Err(e) => {
                    if !known.contains_key(&key) {
                        failures.push(format!("{key}: replay failed: {e}"));
                    }
                    continue;
                }
            };
            let Some(fid) = fid else {
                eprintln!("| `{key}` | no recorded segments: nothing to compare |");
                continue;
            };
            replayed += 1;
            seg_m += fid.segment_events_matched;
            seg_t += fid.segment_events_total;
            pl_m += fid.placements_matched;
            pl_t += fid.placements_total;
            let exact = fid.is_exact(&report);
            eprintln!(
                "| `{key}` | {}/{} | {}/{} | ooms {}/{} | peak res {} vs {} | {}",
                fid.segment_events_matched,
                fid.segment_events_total,
                fid.placements_matched,
                fid.placements_total,
                report.ooms,
                fid.recorded_ooms,
                report.peak_reserved,
                fid.recorded_peak_reserved,
                if exact { "exact" } else { "MISMATCH" }
            );
            match (exact, known.contains_key(&key)) {
                (false, false) => failures.push(format!(
                    "{key}: segment events {}/{}, placements {}/{}, ooms {} (recorded {}), \
                     first segment mismatch at {:?}; not in KNOWN_MISMATCHES.md",
                    fid.segment_events_matched,
                    fid.segment_events_total,
                    fid.placements_matched,
                    fid.placements_total,
                    report.ooms,
                    fid.recorded_ooms,
                    fid.first_segment_mismatch
                )),
                (true, true) => failures.push(format!(
                    "{key} now replays exactly: remove it from KNOWN_MISMATCHES.md"
                )),
                _ => {}
            }
        }
    }
    eprintln!("{replayed} device traces; segment events {seg_m}/{seg_t}, placements {pl_m}/{pl_t}");
    eprintln!("files per PyTorch release replayed (detected): {releases:?}");
    assert!(replayed >= 40, "only {replayed} device traces replayed");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
