//! Fault injection, the standing check of issue 29: every backend entry
//! point the allocator calls fails, one call at a time, at the N-th call
//! (N = 1..=K, and ten more spread to its last call in the workload), with a
//! non-retryable driver error, in PyTorch mode, with expandable segments and
//! under the `reservoir` policy. A deterministic 4-stream workload runs with
//! the invariant checker after every operation from the fault on; failed
//! frees must say that nothing was freed and change nothing; at the end,
//! with the fault cleared, everything is freed, the cache emptied and
//! nothing may be left reserved (the allocator's counters and the device's
//! own count of live allocations and mapped bytes), and closing gives every
//! reservation back.
//!
//! Prints one line past libtest's capture, which CI's log shows:
//! `fault injection: E entry points (names) x N=1..K (+10 spread) x 3 modes:
//! R runs, F faults injected, V violations, L leaks`.

use std::io::Write as _;

use reservoir::config::AllocatorConfig;
use reservoir_testkit::faults::{run_workload, workload, EntryPoint, RunReport};

const GIB: u64 = 1 << 30;
/// Operations of the workload.
const OPS: usize = 3000;
/// N runs from 1 to this for every entry point (fewer if it is called less).
const K: u64 = 40;
/// More values of N, spread evenly from K to the entry point's last call.
const SPREAD: u64 = 10;
/// Operations checked after the fault fired (then the clean-up runs).
const AFTER_FAULT: usize = 600;
const MODES: [(&str, &str); 3] = [
    ("pytorch", ""),
    ("expandable", "expandable_segments:True"),
    ("reservoir", "policy:reservoir"),
];

/// Writes `line` to stderr past libtest's output capture.
fn report_line(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "\n{line}");
}

fn values_of_n(calls: u64) -> Vec<u64> {
    let mut ns: Vec<u64> = (1..=K.min(calls)).collect();
    if calls > K {
        let span = calls - K;
        ns.extend((1..=SPREAD).map(|i| K + (span * i).div_ceil(SPREAD)));
    }
    ns.dedup();
    ns
}

#[test]
fn every_entry_point_failing_at_the_nth_call() {
    let ops = workload(0x2929, OPS);
    let mut jobs: Vec<(&str, AllocatorConfig, EntryPoint, u64)> = Vec::new();
    let mut faulted = std::collections::BTreeSet::new();
    let mut violations = Vec::new();
    let mut leaks = Vec::new();
    for (name, conf) in MODES {
        let config = AllocatorConfig::parse_with_policy(conf).unwrap();
        let baseline = run_workload(&config, GIB, &ops, None, true, usize::MAX);
        violations.extend(baseline.violations);
        leaks.extend(baseline.leaks);
        for (i, &entry) in EntryPoint::ALL.iter().enumerate() {
            let calls = baseline.calls.get(i).copied().unwrap_or(0);
            if calls > 0 {
                faulted.insert(entry);
            }
            for n in values_of_n(calls) {
                jobs.push((name, config.clone(), entry, n));
            }
        }
    }
    // Every entry point the allocator calls on this device is exercised.
    for must in [
        EntryPoint::Allocate,
        EntryPoint::Free,
        EntryPoint::MemInfo,
        EntryPoint::RecordEvent,
        EntryPoint::QueryEvent,
        EntryPoint::SynchronizeEvent,
        EntryPoint::DestroyEvent,
        EntryPoint::SynchronizeStream,
        EntryPoint::Reserve,
        EntryPoint::Map,
        EntryPoint::Unmap,
        EntryPoint::Release,
    ] {
        assert!(
            faulted.contains(&must),
            "the workload never calls {}",
            must.name()
        );
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(usize, RunReport)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((_, config, entry, n)) = jobs.get(j) else {
                            break;
                        };
                        let r =
                            run_workload(config, GIB, &ops, Some((*entry, *n)), false, AFTER_FAULT);
                        out.push((j, r));
                    }
                    out
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let mut injected = 0;
    let mut silent = Vec::new();
    for (j, r) in &results {
        injected += r.injected;
        if r.injected == 0 {
            let (mode, _, entry, n) = &jobs[*j];
            silent.push(format!("{mode} {} #{n}", entry.name()));
        }
        violations.extend(r.violations.iter().cloned());
        leaks.extend(r.leaks.iter().cloned());
    }
    let names: Vec<&str> = faulted.iter().map(|e| e.name()).collect();
    report_line(&format!(
        "fault injection: {} entry points ({}) x N=1..{K} (+{SPREAD} spread) x {} modes: \
         {} runs, {injected} faults injected, {} violations, {} leaks",
        faulted.len(),
        names.join(", "),
        MODES.len(),
        results.len(),
        violations.len(),
        leaks.len(),
    ));
    assert!(
        violations.is_empty(),
        "violations:\n{}",
        violations.join("\n")
    );
    assert!(leaks.is_empty(), "leaks:\n{}", leaks.join("\n"));
    // The runs are deterministic up to their fault: each one fires.
    assert!(silent.is_empty(), "faults that never fired: {silent:?}");
    assert_eq!(results.len(), jobs.len());
}
