//! Replay speed on the largest real trace in `../shared/traces`
//! (cs336-wedsonlin 61dcd14d, 22 332 entries) in PyTorch mode: trace
//! entries per second.
//!
//! * `replay_trace/replay`: seed the start state, replay every op, measure
//!   the fidelity (the file already loaded and converted).
//! * `replay_trace/convert+replay`: the same plus rebuilding the start state
//!   by walking the trace backwards and converting it.
//!
//! Run: `cargo bench -p reservoir --bench replay_trace`. Skipped when the
//! traces are absent. See BENCHMARKS.md.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use reservoir::replay::snapshot::{convert, recorded_setting, replay_recorded};
use reservoir::replay::ReplayOptions;
use reservoir::snapshot;

const FILE: &str = "cs336-wedsonlin/61dcd14d_medium_512_training_memory_snapshot.pickle";

fn bench(c: &mut Criterion) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = [
        root.join("../../../shared/traces").join(FILE),
        root.join("../../../../shared/traces").join(FILE),
    ]
    .into_iter()
    .find(|p| p.is_file());
    let Some(path) = path else {
        eprintln!("skipped: {FILE} not found beside the repository");
        return;
    };
    let input = snapshot::load(&path).unwrap().to_trace_input();
    let setting = recorded_setting(input.allocator_settings.as_ref());
    let config = setting.allocator_config().unwrap();
    let dev = &input.devices[0];
    let rec = convert(dev, &config, false).unwrap();
    let options = ReplayOptions::default();
    let mut g = c.benchmark_group("replay_trace");
    g.throughput(Throughput::Elements(dev.events.len() as u64));
    g.sample_size(30);
    g.bench_function("replay", |b| {
        b.iter(|| {
            let (r, f) = replay_recorded(&rec, &setting, &options, true, &mut |_| {}).unwrap();
            assert!(f.unwrap().segment_events_exact);
            r.peak_reserved
        })
    });
    g.bench_function("convert+replay", |b| {
        b.iter(|| {
            let rec = convert(dev, &config, false).unwrap();
            let (r, _) = replay_recorded(&rec, &setting, &options, true, &mut |_| {}).unwrap();
            r.peak_reserved
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
