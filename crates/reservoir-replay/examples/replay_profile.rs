//! Replays the largest trace in `../shared/traces` N times (default 20), for
//! profiling `replay_recorded` with callgrind or perf (see BENCHMARKS.md):
//! `cargo run --release -p reservoir-replay --example replay_profile -- 20`.

use std::time::Instant;

use reservoir_replay::replay::recorded::replay_recorded;
use reservoir_replay::replay::ReplayOptions;

#[path = "../benches/support/largest_trace.rs"]
mod largest_trace;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let Some(largest_trace::LargestTrace {
        dev, setting, rec, ..
    }) = largest_trace::load()
    else {
        return;
    };
    let options = ReplayOptions::default();
    let t = Instant::now();
    let mut peak = 0;
    for _ in 0..n {
        let (r, f) = replay_recorded(&rec, &setting, &options, true, &mut |_| {}).unwrap();
        assert!(f.unwrap().segment_events_exact);
        peak = r.peak_reserved;
    }
    let el = t.elapsed();
    let per = el.as_secs_f64() / n as f64;
    println!(
        "{n} replays of {} entries: {:.3} ms each = {:.2} M entries/s (peak reserved {peak})",
        dev.events.len(),
        per * 1e3,
        dev.events.len() as f64 / per / 1e6
    );
}
