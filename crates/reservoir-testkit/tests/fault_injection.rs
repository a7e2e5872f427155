//! Fault injection, the standing check of issue 29: every backend entry
//! point the allocator calls fails, one call at a time, at the N-th call
//! (N = 1..=K, and ten more spread to its last call in the workload), with a
//! non-retryable driver error, in PyTorch mode, with expandable segments and
//! under the `reservoir` policy. A deterministic 4-stream workload runs with
//! the invariant checker after every operation from the fault on; failed
//! allocations must leave the in-use counters as they were; failed frees
//! must say that nothing was freed and change nothing; at the end, with the
//! fault cleared, everything is freed, the cache emptied and nothing may be
//! left reserved (the allocator's counters and the device's own count of
//! live allocations and mapped bytes), and closing gives every reservation
//! back. (`heap_fault_injection.rs` is the same sweep for the MPS heap
//! allocator.)
//!
//! Prints one line past libtest's capture, which CI's log shows:
//! `fault injection: E entry points (names) x N=1..K (+10 spread) x 3 modes:
//! R runs, F faults injected, V violations, L leaks`.

use reservoir::config::AllocatorConfig;
use reservoir_testkit::faults::{sweep, Caching, EntryPoint, Sweep};

const SWEEP: Sweep = Sweep {
    name: "",
    seed: 0x2929,
    ops: 3000,
    k: 40,
    spread: 10,
    after_fault: 600,
    capacity: 1 << 30,
};

#[test]
fn every_entry_point_failing_at_the_nth_call() {
    let modes: Vec<(&str, AllocatorConfig)> = [
        ("pytorch", ""),
        ("expandable", "expandable_segments:True"),
        ("reservoir", "policy:reservoir"),
    ]
    .into_iter()
    .map(|(name, conf)| (name, AllocatorConfig::parse_with_policy(conf).unwrap()))
    .collect();
    let report = sweep::<Caching>(&SWEEP, &modes);
    report.print_and_check();
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
            report.entry_points.contains(&must),
            "the workload never calls {}",
            must.name()
        );
    }
}
