//! Replays the largest trace in `../shared/traces` N times (default 20), for
//! profiling `replay_recorded` with callgrind or perf (see BENCHMARKS.md):
//! `cargo run --release -p reservoir --example replay_profile -- 20`.

use std::path::Path;
use std::time::Instant;

use reservoir::replay::snapshot::{convert, recorded_setting, replay_recorded};
use reservoir::replay::ReplayOptions;
use reservoir::snapshot;

const FILE: &str = "cs336-wedsonlin/61dcd14d_medium_512_training_memory_snapshot.pickle";

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20);
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(path) = [
        root.join("../../../shared/traces").join(FILE),
        root.join("../../../../shared/traces").join(FILE),
    ]
    .into_iter()
    .find(|p| p.is_file()) else {
        eprintln!("skipped: {FILE} not found beside the repository");
        return;
    };
    let input = snapshot::load(&path).unwrap().to_trace_input();
    let setting = recorded_setting(input.allocator_settings.as_ref());
    let config = setting.allocator_config().unwrap();
    let dev = &input.devices[0];
    let rec = convert(dev, &config, false).unwrap();
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
