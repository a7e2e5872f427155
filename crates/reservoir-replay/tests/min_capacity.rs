//! `--min-capacity` (issue 17 part 3): the smallest device capacity, to
//! 2 MiB, on which a trace replays without an out-of-memory error. Each
//! answer is checked directly: the trace fits on it and does not fit 2 MiB
//! below it.

use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::capacity::{min_capacity, CAPACITY_STEP};
use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting};
use reservoir_replay::workload;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn ooms(trace: &Trace, setting: &ReplaySetting, capacity: u64) -> u64 {
    let options = ReplayOptions {
        capacity,
        ..ReplayOptions::default()
    };
    replay(trace, setting, &options).unwrap().ooms
}

fn settings() -> Vec<ReplaySetting> {
    vec![
        ReplaySetting::new("pytorch", ""),
        ReplaySetting::new("expandable", "expandable_segments:True"),
        ReplaySetting::new("max-split-128", "max_split_size_mb:128"),
    ]
}

/// The answer fits, 2 MiB less does not, and it lies between the peak live
/// bytes and the peak reserved bytes of an unconstrained run.
fn check_tight(trace: &Trace, setting: &ReplaySetting) -> u64 {
    let m = min_capacity(trace, None, setting, &mut |lo, hi| assert!(lo < hi))
        .unwrap()
        .min_capacity
        .expect("fits on 16 TiB");
    assert_eq!(m % CAPACITY_STEP, 0);
    assert_eq!(ooms(trace, setting, m), 0, "{} at {m}", setting.name);
    assert!(
        ooms(trace, setting, m - CAPACITY_STEP) > 0,
        "{}: {} also fits",
        setting.name,
        m - CAPACITY_STEP
    );
    let free = replay(trace, setting, &ReplayOptions::default()).unwrap();
    assert!(m >= free.peak_live, "{}", setting.name);
    if free.ooms == 0 {
        assert!(m <= free.peak_reserved.div_ceil(CAPACITY_STEP) * CAPACITY_STEP);
    }
    m
}

#[test]
fn two_streams_need_two_large_segments_in_pytorch_mode() {
    // Spec 1.7: requests of 1 to 10 MiB (here 4 and 3 MiB) get a 20 MiB
    // large segment, one per stream; expandable segments map 20 MiB pages
    // of the large pool, one reservation per stream: the same.
    let trace = Trace::parse("a 1 4194304 0\na 2 3145728 s1\nf 1\nf 2\n").unwrap();
    let py = check_tight(&trace, &settings()[0]);
    assert_eq!(py, 40 * MIB);
    let ex = check_tight(&trace, &settings()[1]);
    assert_eq!(ex, 40 * MIB);
}

#[test]
fn a_trace_that_does_not_fit_on_80_gib_grows_the_search() {
    let trace = Trace::parse("a 1 107374182400\nf 1\n").unwrap();
    let m = check_tight(&trace, &settings()[0]);
    assert_eq!(m, 100 * GIB);
    // Beyond 16 TiB: no answer, no error.
    let huge = Trace::parse("a 1 35184372088832\n").unwrap();
    let r = min_capacity(&huge, None, &settings()[0], &mut |_, _| {}).unwrap();
    assert_eq!(r.min_capacity, None);
}

#[test]
fn workloads_fit_tightly_under_every_policy() {
    for spec in ["gpt-train:layers=2,steps=2", "llm-infer:requests=4"] {
        let trace = workload::generate(spec).unwrap();
        for s in settings() {
            check_tight(&trace, &s);
        }
    }
}
