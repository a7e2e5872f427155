//! One synthetic trace per lint with its exact bytes, and one where it
//! must not fire.

use super::*;
use crate::replay::replay;
use reservoir::caching::{CachingAllocator, PoolFilter};
use reservoir::ids::MempoolId;
use reservoir::sim::{SimConfig, SimDevice};

const MIB: u64 = 1 << 20;

/// Replay `text` with `config`, name the sites, and lint it.
fn lint(text: &str, config: &str, named: &[(u64, &str)]) -> SettingLints {
    let trace = Trace::parse(text).unwrap();
    let setting = ReplaySetting::new("t", config);
    let options = ReplayOptions::default();
    let report = replay(&trace, &setting, &options).unwrap();
    let mut sites = Sites::new();
    for (id, s) in named {
        sites.name(*id, s);
    }
    lints(&trace, None, &setting, &options, &report, &sites).unwrap()
}

fn of(l: &SettingLints, kind: LintKind) -> Vec<&Lint> {
    l.lints.iter().filter(|x| x.kind == kind).collect()
}

#[test]
fn bytes_cached_on_a_stream_that_allocates_no_more_are_stranded() {
    // 8 MiB on stream s1 takes a 20 MiB segment (spec 1.4); after s1's last
    // allocation (op 0) the whole segment sits free on s1 while the
    // default stream allocates (op 2).
    let text = "a 1 8M s1\nf 1\na 2 4M\nf 2\n";
    let l = lint(text, "", &[(1, "loader.py:3:prefetch")]);
    let s = of(&l, LintKind::StrandedStream);
    assert_eq!(s.len(), 1, "{l:?}");
    assert_eq!(s[0].bytes, 20 * MIB);
    assert_eq!(s[0].op, Some(2));
    assert_eq!(s[0].stream.as_deref(), Some("s1"));
    assert_eq!(s[0].sites[0].site, "loader.py:3:prefetch");
    assert_eq!(s[0].sites[0].bytes, 8 * MIB);
    assert!(s[0]
        .fix
        .contains("empty_cache() after stream s1's last use (op 0)"));
    assert!(of(&l, LintKind::DelayedFree).is_empty());
}

#[test]
fn no_stranded_bytes_once_the_cache_is_emptied_or_on_one_stream() {
    let l = lint("a 1 8M s1\nf 1\ne\na 2 4M\nf 2\n", "", &[]);
    assert!(of(&l, LintKind::StrandedStream).is_empty(), "{l:?}");
    // One stream: what is cached at the end is not stranded.
    let l = lint("a 1 8M\na 2 8M\nf 1\nf 2\n", "", &[]);
    assert!(l.lints.is_empty(), "{l:?}");
    // s1 goes on allocating: its cache is reused, not stranded.
    let l = lint("a 1 8M s1\nf 1\na 2 4M\na 3 8M s1\nf 2\nf 3\n", "", &[]);
    assert!(of(&l, LintKind::StrandedStream).is_empty(), "{l:?}");
}

#[test]
fn a_free_waiting_for_a_held_recorded_stream_is_delayed() {
    // Block 1 (8 MiB) is used on held stream s1 and freed at op 4; the
    // allocations at ops 5 and 6 find its event pending; after the release
    // (op 7), the allocation at op 8 completes the free: 4 ops late.
    let text = "a 1 8M\nh s1\nk s1 1\nr 1 s1\nf 1\na 2 2M\na 3 2M\nu s1\na 4 2M\n";
    let l = lint(text, "", &[(1, "model.py:10:forward")]);
    let d = of(&l, LintKind::DelayedFree);
    assert_eq!(d.len(), 1, "{l:?}");
    assert_eq!(d[0].bytes, 8 * MIB);
    assert_eq!(d[0].op, Some(5));
    assert_eq!(d[0].ops, Some(4));
    assert_eq!(d[0].sites.len(), 1);
    assert_eq!(d[0].sites[0].site, "model.py:10:forward");
    assert_eq!((d[0].sites[0].bytes, d[0].sites[0].count), (8 * MIB, 1));
    assert!(
        d[0].detail.starts_with("1 blocks (8.00 MiB)"),
        "{}",
        d[0].detail
    );
}

#[test]
fn a_free_whose_recorded_stream_is_done_by_the_next_allocation_is_not_delayed() {
    // The work on s1 completes at once: the next allocation completes the
    // free before it needs memory.
    let l = lint("a 1 8M\nk s1 1\nr 1 s1\nf 1\na 2 2M\na 3 2M\n", "", &[]);
    assert!(of(&l, LintKind::DelayedFree).is_empty(), "{l:?}");
    // No record_stream at all.
    let l = lint("a 1 8M\nh s1\nk s1 1\nf 1\na 2 2M\nu s1\n", "", &[]);
    assert!(of(&l, LintKind::DelayedFree).is_empty(), "{l:?}");
}

/// Drive an allocator directly (traces cannot route allocations to a
/// private pool) and feed its events to the lint accumulator.
fn pool_lints(private: bool) -> Vec<Lint> {
    let a = CachingAllocator::new(
        SimDevice::new(SimConfig::default()),
        AllocatorConfig::default(),
    );
    let buf: EventBuffer = Arc::default();
    a.attach_trace_tracker(tracker(&buf));
    let mut acc = Accumulator::new(AllocatorConfig::default());
    let pool = MempoolId(1, 1);
    if private {
        a.begin_allocate_to_pool(pool, PoolFilter::Stream(StreamId::DEFAULT))
            .unwrap();
    }
    let before = a.allocated_and_reserved().0;
    let p = a.raw_alloc(8 * MIB, StreamId::DEFAULT).unwrap();
    let block = a.allocated_and_reserved().0 - before;
    a.check_invariants().unwrap();
    acc.op_events(
        0,
        &drain(&buf),
        true,
        Some(("graph.py:5:capture", 8 * MIB, block)),
    );
    if private {
        a.end_allocate_to_pool(pool).unwrap();
    }
    a.raw_free(p).unwrap();
    a.check_invariants().unwrap();
    acc.op_events(1, &drain(&buf), false, None);
    acc.finish(2);
    acc.lints(MIB, |s| s.0.to_string(), |_| Some(1), "")
}

#[test]
fn a_private_pool_holding_a_free_segment_is_idle() {
    let l = pool_lints(true);
    let p: Vec<_> = l.iter().filter(|x| x.kind == LintKind::IdlePool).collect();
    assert_eq!(p.len(), 1, "{l:?}");
    assert_eq!(p[0].bytes, 20 * MIB);
    assert_eq!(p[0].op, Some(1));
    assert_eq!(p[0].pool, Some((1, 1)));
    assert_eq!(p[0].sites[0].site, "graph.py:5:capture");
    assert!(p[0].fix.contains("_cuda_releasePool"));
}

#[test]
fn the_default_pool_is_never_an_idle_private_pool() {
    let l = pool_lints(false);
    assert!(l.iter().all(|x| x.kind != LintKind::IdlePool), "{l:?}");
}

#[test]
fn requests_just_above_a_power_of_two_division_lose_to_rounding() {
    // With 4 divisions, 8 MiB + 1 rounds to 10 MiB (spec 1.3): 2 MiB - 1
    // lost per allocation, 3 live at the reserved peak (op 2).
    let text = "a 1 8388609\na 2 8388609\na 3 8388609\nf 1\nf 2\nf 3\n";
    let named = [
        (1, "attn.py:7:scores"),
        (2, "attn.py:7:scores"),
        (3, "attn.py:7:scores"),
    ];
    let l = lint(text, "roundup_power2_divisions:4", &named);
    let r = of(&l, LintKind::Rounding);
    assert_eq!(r.len(), 1, "{l:?}");
    assert_eq!(r[0].bytes, 3 * (2 * MIB - 1));
    assert_eq!(r[0].op, Some(2));
    assert_eq!(r[0].sites[0].site, "attn.py:7:scores");
    assert_eq!(r[0].sites[0].count, 3);
    assert_eq!(r[0].sites[0].request, Some(8388609));
    assert!(
        r[0].detail.contains("just above the boundary 8.00 MiB"),
        "{}",
        r[0].detail
    );
    assert!(
        r[0].fix
            .contains("to 8.00 MiB (8388608 B) to save 2.00 MiB"),
        "{}",
        r[0].fix
    );
    assert!(r[0].fix.contains("roundup_power2_divisions"));
    // Both fixes replayed: 8 MiB blocks (trimmed, or 512-byte steps) take
    // 20 MiB segments (spec 1.4) and the third needs a second one: 40 MiB
    // against the 30 MiB of three 10 MiB segments.
    assert!(
        r[0].fix.contains(
            "(replayed: the trim does not lower peak reserved here: 40.00 MiB against 30.00 MiB)"
        ),
        "{}",
        r[0].fix
    );
    assert!(
        r[0].fix.contains(
            "(replayed: roundup_power2_divisions:1 does not lower peak reserved here: \
             40.00 MiB against 30.00 MiB)"
        ),
        "{}",
        r[0].fix
    );
}

#[test]
fn a_trim_that_saves_memory_is_proven_by_replay() {
    // 16 MiB + 1 with 4 divisions rounds to 20 MiB; four live at once: 80
    // MiB of segments (each its own, spec 1.4). Trimmed to 16 MiB: 64 MiB.
    let text = "a 1 16777217\na 2 16777217\na 3 16777217\na 4 16777217\nf 1\nf 2\nf 3\nf 4\n";
    let named = [
        (1, "kv.py:1:grow"),
        (2, "kv.py:1:grow"),
        (3, "kv.py:1:grow"),
        (4, "kv.py:1:grow"),
    ];
    let l = lint(text, "roundup_power2_divisions:4", &named);
    let r = of(&l, LintKind::Rounding);
    assert_eq!(r.len(), 1, "{l:?}");
    assert_eq!(r[0].bytes, 4 * (4 * MIB - 1));
    assert!(
        r[0].fix
            .contains("(replayed: the trim lowers peak reserved from 80.00 MiB to 64.00 MiB)"),
        "{}",
        r[0].fix
    );
}

#[test]
fn no_rounding_lint_for_512_byte_steps_or_exact_divisions() {
    // The default rounding loses 511 bytes each: below the threshold.
    let text = "a 1 8388609\na 2 8388609\na 3 8388609\nf 1\nf 2\nf 3\n";
    let l = lint(text, "", &[]);
    assert!(of(&l, LintKind::Rounding).is_empty(), "{l:?}");
    // Requests on a division lose nothing.
    let l = lint(
        "a 1 8M\na 2 10M\nf 1\nf 2\n",
        "roundup_power2_divisions:4",
        &[],
    );
    assert!(of(&l, LintKind::Rounding).is_empty(), "{l:?}");
}

#[test]
fn the_boundary_below_a_request() {
    let c4 = AllocatorConfig::parse_with_policy("roundup_power2_divisions:4").unwrap();
    assert_eq!(boundary_below(8 * MIB + 1, &c4), 8 * MIB);
    assert_eq!(boundary_below(9 * MIB, &c4), 8 * MIB);
    assert_eq!(boundary_below(10 * MIB + 1, &c4), 10 * MIB);
    let d = AllocatorConfig::default();
    assert_eq!(boundary_below(1025, &d), 1024);
    assert_eq!(boundary_below(512, &d), 0);
    assert_eq!(boundary_below(513, &d), 512);
}

#[test]
fn the_heap_allocator_is_not_linted() {
    let trace = Trace::parse("a 1 8M s1\nf 1\na 2 4M\n").unwrap();
    let setting = ReplaySetting::mps_heap();
    let options = ReplayOptions::default();
    let report = replay(&trace, &setting, &options).unwrap();
    let l = lints(&trace, None, &setting, &options, &report, &Sites::new()).unwrap();
    assert!(!l.computed);
    assert!(l.lints.is_empty());
}
