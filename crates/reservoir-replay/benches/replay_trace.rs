//! Replay speed on the largest real trace in `../shared/traces`
//! (cs336-wedsonlin 61dcd14d, 22 332 entries) in PyTorch mode: trace
//! entries per second.
//!
//! * `replay_trace/replay`: seed the start state, replay every op, measure
//!   the fidelity (the file already loaded and converted).
//! * `replay_trace/convert+replay`: the same plus rebuilding the start state
//!   by walking the trace backwards and converting it.
//!
//! Run: `cargo bench -p reservoir-replay --bench replay_trace`. Skipped when the
//! traces are absent. See BENCHMARKS.md.

// criterion_group! generates an undocumented public function.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use reservoir_replay::replay::recorded::{convert, replay_recorded};
use reservoir_replay::replay::ReplayOptions;

#[path = "support/largest_trace.rs"]
mod largest_trace;

fn bench(c: &mut Criterion) {
    let Some(largest_trace::LargestTrace { dev, setting, rec }) = largest_trace::load() else {
        return;
    };
    let (dev, config) = (&dev, setting.allocator_config().unwrap());
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
