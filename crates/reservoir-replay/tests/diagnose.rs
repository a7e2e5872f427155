//! Every OOM classified, with the cheapest change that avoids it proven by
//! replay (issue 30 item 1; `reservoir_replay::replay::diagnose`): one
//! small synthetic trace per class and rule in PyTorch mode, the causes a
//! replay cannot make (private pools, the oversize rule's free blocks) on
//! hand-built states, the shortfall arithmetic, and the trace transforms
//! the proofs replay.

use reservoir::caching::{SeededBlock, SeededSegment};
use reservoir::config::AllocatorConfig;
use reservoir::observe::snapshot::{Block, BlockState, Segment, SegmentType};
use reservoir::StreamId;
use reservoir_replay::oracle_trace::{Op, Trace};
use reservoir_replay::replay::diagnose::{
    classify, drop_allocations, limit, segment_request, shortfall, sync_and_empty_before,
    CauseClass, Diagnosis, FixKind, OomState, Rule,
};
use reservoir_replay::replay::explain::explain_on_device;
use reservoir_replay::replay::sites::Sites;
use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting, StartState};

const M: u64 = 1 << 20;

/// The general settings the CLI tries, on PyTorch's defaults (a subset).
fn general() -> Vec<ReplaySetting> {
    ["expandable_segments:True", "max_split_size_mb:128"]
        .iter()
        .map(|c| ReplaySetting::new(*c, *c))
        .collect()
}

/// Replay `text` with `conf` on `capacity` (of a `device_total` device)
/// and diagnose its first OOM.
fn diagnose(
    text: &str,
    conf: &str,
    capacity: u64,
    device_total: Option<u64>,
    sites: &Sites,
) -> Diagnosis {
    let trace = Trace::parse(text).unwrap();
    let setting = ReplaySetting::new("pytorch", conf);
    let options = ReplayOptions {
        capacity,
        ..ReplayOptions::default()
    };
    let report = replay(&trace, &setting, &options).unwrap();
    assert!(report.ooms >= 1, "{text}");
    let ex = explain_on_device(
        &trace,
        None,
        &setting,
        &options,
        &report,
        sites,
        &general(),
        device_total,
    )
    .unwrap();
    let d = ex.oom.expect("an OOM").diagnosis;
    assert!(d.replays as usize <= reservoir_replay::replay::diagnose::MAX_REPLAYS);
    d
}

fn mib(n: u64) -> String {
    (n * M).to_string()
}

/// The first cause: class, rule and bytes.
fn first(d: &Diagnosis) -> (CauseClass, Option<Rule>, u64) {
    let c = &d.causes[0];
    (c.class, c.rule, c.bytes)
}

/// The proven fix: kind, change and peak reserved.
fn fix(d: &Diagnosis) -> (FixKind, &str, u64) {
    let f = d.fix.as_ref().expect("a proven fix");
    assert!(
        d.verdict.contains("proven by replay: no OOM")
            || (f.kind == FixKind::FreeSites
                && d.verdict.contains("proven by replaying the trace without")),
        "{}",
        d.verdict
    );
    (f.kind, f.change.as_str(), f.peak_reserved)
}

#[test]
fn capacity_is_the_excess_and_the_lightest_site_that_covers_it_is_freed() {
    // Live 30 + 20 + 12 MiB, a 20 MiB request ("grads"), a 64 MiB device:
    // 18 MiB more than any allocator could serve. Dropping the largest
    // site's allocations runs the trace; so does dropping the 20 MiB
    // site's, the lighter one that still covers 18 MiB (12 MiB does not).
    let mut sites = Sites::new();
    sites.name(1, "weights");
    sites.name(2, "activations");
    sites.name(3, "buffers");
    sites.name(4, "grads");
    let text = format!(
        "a 1 {}\na 2 {}\na 3 {}\na 4 {}\n",
        mib(30),
        mib(20),
        mib(12),
        mib(20)
    );
    let d = diagnose(&text, "", 64 * M, None, &sites);
    assert_eq!(first(&d), (CauseClass::Capacity, None, 18 * M));
    assert_eq!(d.shortfall, 18 * M);
    assert_eq!(d.live_requested, 62 * M);
    assert!(d.causes[0].sentence.starts_with("you are 18.00 MiB short"));
    assert_eq!(fix(&d), (FixKind::FreeSites, "free activations", 62 * M));
    let f = d.fix.as_ref().unwrap();
    assert_eq!(f.sites.len(), 1);
    assert_eq!((f.sites[0].bytes, f.sites[0].count), (20 * M, 1));
    // No setting can help: only the what-if was replayed (all top sites,
    // the largest, then the lighter one).
    assert_eq!(
        d.tried,
        [
            "free weights + activations + buffers",
            "free weights",
            "free activations"
        ]
    );
}

#[test]
fn free_x_says_what_was_replayed_and_that_the_recording_ends_at_the_oom() {
    // Issue 41 item 5: "free X at the failure, 1 allocation" was proven by
    // dropping every allocation of the site from the whole trace; the text
    // must say so. Site "acts" makes 3 allocations, 1 live at the failure.
    let mut sites = Sites::new();
    for (id, name) in [
        (1, "weights"),
        (2, "acts"),
        (3, "acts"),
        (4, "acts"),
        (5, "grads"),
    ] {
        sites.name(id, name);
    }
    let text = format!(
        "a 1 {}\na 2 {}\nf 2\na 3 {}\nf 3\na 4 {}\na 5 {}\n",
        mib(30),
        mib(24),
        mib(24),
        mib(24),
        mib(20)
    );
    let d = diagnose(&text, "", 64 * M, None, &sites);
    assert_eq!(first(&d).0, CauseClass::Capacity);
    let f = d.fix.as_ref().expect("a proven fix");
    assert_eq!(
        (f.kind, f.change.as_str()),
        (FixKind::FreeSites, "free acts")
    );
    assert_eq!(f.dropped_allocations, 3);
    assert!(
        f.sentence.contains(
            "proven by replaying the trace without all 3 allocations these sites make \
             (the 1 live at the failure and 2 earlier or later ones)"
        ),
        "{}",
        f.sentence
    );
    // The trace ends at the failed request (op 6): the verdict says the
    // proof covers the run only up to it.
    assert!(d.recording_ends_at_failure);
    assert!(
        d.verdict
            .ends_with("(the recording ends at this OOM (op 6): the replay proves the run only up to the failure; what the program does after it was never recorded)"),
        "{}",
        d.verdict
    );
    // An allocation after the failure: the recording goes on, no clause.
    let d = diagnose(
        &format!("{text}f 1\na 6 {}\n", mib(1)),
        "",
        64 * M,
        None,
        &sites,
    );
    assert!(!d.recording_ends_at_failure);
    assert!(!d.verdict.contains("recording ends"), "{}", d.verdict);
    // Only the live allocation made by the site: "without this allocation".
    let one = format!("a 1 {}\na 4 {}\na 5 {}\n", mib(30), mib(24), mib(20));
    let d = diagnose(&one, "", 64 * M, None, &sites);
    let f = d.fix.as_ref().expect("a proven fix");
    assert_eq!(f.dropped_allocations, 1);
    assert!(
        f.sentence
            .contains("proven by replaying the trace without this allocation: no OOM"),
        "{}",
        f.sentence
    );
}

#[test]
fn capacity_with_no_site_that_fits_says_none_found() {
    // Two 40 MiB allocations at once on 64 MiB: dropping the live site's
    // allocations (1 and 3, site "a") still leaves 2 and 4 together.
    let mut sites = Sites::new();
    for id in 1..=4 {
        sites.name(id, if id % 2 == 1 { "a" } else { "b" });
    }
    let text = format!("a 1 {0}\na 2 {0}\nf 1\na 3 {0}\na 4 {0}\n", mib(40));
    let d = diagnose(&text, "", 64 * M, None, &sites);
    assert_eq!(first(&d).0, CauseClass::Capacity);
    assert_eq!(d.fix, None);
    assert!(d.verdict.starts_with("none found"), "{}", d.verdict);
}

#[test]
fn the_split_limit_holds_oversize_blocks_whole_and_removing_it_is_proven() {
    // Spec 1.6/1.7 with max_split_size_mb:40: the 45 MiB request takes the
    // cached 60 MiB block whole (oversize blocks are never split), so
    // 14 MiB needs a new segment: 60 + 14 > 70 MiB. Without the limit the
    // 60 MiB block is split and the 15 MiB remainder serves the 14 MiB.
    let text = format!("a 1 {}\nf 1\na 2 {}\na 3 {}\n", mib(60), mib(45), mib(14));
    let d = diagnose(&text, "max_split_size_mb:40", 70 * M, None, &Sites::new());
    assert_eq!(
        first(&d),
        (CauseClass::Fragmentation, Some(Rule::SplitLimit), 15 * M)
    );
    assert_eq!(d.shortfall, 4 * M);
    assert_eq!(fix(&d), (FixKind::Setting, "-max_split_size_mb", 60 * M));
}

#[test]
fn scattered_holes_are_fragmentation_and_the_reservoir_policy_is_proven() {
    // Ten 2 MiB blocks fill one 20 MiB segment; every other one is freed:
    // 10 MiB free in 2 MiB holes, and 6 MiB needs a new 20 MiB segment.
    let mut t = String::new();
    for i in 1..=10 {
        t += &format!("a {i} {}\n", mib(2));
    }
    for i in [1, 3, 5, 7, 9] {
        t += &format!("f {i}\n");
    }
    t += &format!("a 11 {}\n", mib(6));
    let d = diagnose(&t, "", 30 * M, None, &Sites::new());
    assert_eq!(
        first(&d),
        (CauseClass::Fragmentation, Some(Rule::Scattered), 10 * M)
    );
    assert_eq!(d.shortfall, 10 * M);
    assert_eq!(fix(&d), (FixKind::Policy, "policy:reservoir", 24 * M));
    assert_eq!(
        d.tried,
        [
            "expandable_segments:True",
            "max_split_size_mb:128",
            "policy:reservoir"
        ]
    );
}

#[test]
fn small_pool_free_bytes_are_the_pool_split() {
    // Spec 1.4: ten 1 MiB blocks in five 2 MiB small segments, every other
    // one freed: 5 MiB free in the small pool cannot serve 16 MiB.
    let mut t = String::new();
    for i in 1..=10 {
        t += &format!("a {i} {}\n", M);
    }
    for i in [1, 3, 5, 7, 9] {
        t += &format!("f {i}\n");
    }
    t += &format!("a 11 {}\n", mib(16));
    let d = diagnose(&t, "", 24 * M, None, &Sites::new());
    assert_eq!(
        first(&d),
        (CauseClass::Fragmentation, Some(Rule::PoolSplit), 5 * M)
    );
    assert_eq!(d.shortfall, 2 * M);
    // No setting tried helps; freeing the 1 MiB allocations does (the
    // stacks name no site, so they are told apart by size).
    assert_eq!(
        fix(&d),
        (
            FixKind::FreeSites,
            "free (no stack recorded), requests of 1024.00 KiB",
            16 * M
        )
    );
}

#[test]
fn expandable_page_pieces_are_the_expandable_granularity() {
    // Spec 1.11: five 8 MiB blocks map two 20 MiB pages; two freed leave
    // 8 MiB pieces of mapped pages, and 12 MiB needs a third page.
    let text = format!(
        "a 1 {0}\na 2 {0}\na 3 {0}\na 4 {0}\na 5 {0}\nf 1\nf 3\na 6 {1}\n",
        mib(8),
        mib(12)
    );
    let d = diagnose(
        &text,
        "expandable_segments:True",
        40 * M,
        None,
        &Sites::new(),
    );
    assert_eq!(
        first(&d),
        (
            CauseClass::Fragmentation,
            Some(Rule::ExpandableGranularity),
            16 * M
        )
    );
    assert_eq!(d.shortfall, 20 * M);
    assert_eq!(d.tried[0], "-expandable_segments");
    assert_eq!(fix(&d), (FixKind::Policy, "policy:reservoir", 40 * M));
}

#[test]
fn rounding_loss_and_removing_the_divisions_is_proven() {
    // Spec 1.3: with two divisions per power of two 33 MiB rounds to
    // 48 MiB; two of them need 96 MiB on a 90 MiB device, 68 MiB unrounded.
    let text = format!("a 1 {0}\na 2 {0}\n", mib(33));
    let d = diagnose(
        &text,
        "roundup_power2_divisions:2",
        90 * M,
        None,
        &Sites::new(),
    );
    assert_eq!(
        first(&d),
        (CauseClass::Fragmentation, Some(Rule::Rounding), 30 * M)
    );
    assert_eq!(d.shortfall, 6 * M);
    assert_eq!(
        fix(&d),
        (FixKind::Setting, "-roundup_power2_divisions", 68 * M)
    );
}

#[test]
fn free_blocks_of_another_stream_are_stream_stranding() {
    // Spec 1.10: stream 0's 20 MiB segment holds one live 2 MiB block and
    // 18 MiB free; stream s1's 16 MiB needs a segment of its own.
    let text = format!("a 1 {0} 0\na 2 {0} 0\nf 1\na 3 {1} s1\n", mib(2), mib(16));
    let d = diagnose(&text, "", 30 * M, None, &Sites::new());
    assert_eq!(first(&d), (CauseClass::StreamStranding, None, 18 * M));
    assert_eq!(d.shortfall, 6 * M);
    assert_eq!(fix(&d), (FixKind::Policy, "policy:reservoir", 20 * M));
}

#[test]
fn the_memory_fraction_cap_and_the_fraction_that_fits() {
    // Spec 1.13: half of 64 MiB allowed; 40 MiB needs 0.625, tried as 0.65.
    let text = format!("a 1 {0}\na 2 {0}\n", mib(20));
    let d = diagnose(
        &text,
        "per_process_memory_fraction:0.5",
        64 * M,
        None,
        &Sites::new(),
    );
    assert_eq!(first(&d), (CauseClass::MemoryFraction, None, 32 * M));
    assert_eq!((d.shortfall, d.limit), (8 * M, 32 * M));
    assert_eq!(
        fix(&d),
        (FixKind::Setting, "per_process_memory_fraction:0.65", 40 * M)
    );
}

#[test]
fn memory_outside_the_allocator_and_the_whole_device() {
    // The allocator is given 32 MiB of a 128 MiB device.
    let text = format!("a 1 {0}\na 2 {0}\n", mib(20));
    let d = diagnose(&text, "", 32 * M, Some(128 * M), &Sites::new());
    assert_eq!(first(&d), (CauseClass::OutsideAllocator, None, 96 * M));
    // On the 32 MiB it was given no allocator could serve it either.
    assert_eq!(
        (d.causes[1].class, d.causes[1].bytes),
        (CauseClass::Capacity, 8 * M)
    );
    assert_eq!(
        fix(&d),
        (FixKind::Device, "the whole 128.00 MiB device", 40 * M)
    );
}

/// A 20 MiB large-pool segment of stream 0 with these blocks.
fn segment(blocks: &[(u64, BlockState)]) -> Segment {
    Segment {
        total_size: blocks.iter().map(|b| b.0).sum(),
        stream: StreamId(0),
        segment_type: SegmentType::Large,
        blocks: blocks
            .iter()
            .map(|&(size, state)| Block {
                size,
                requested_size: Some(size),
                state,
                ..Block::default()
            })
            .collect(),
        ..Segment::default()
    }
}

fn state<'a>(
    segments: &'a [Segment],
    bytes: u64,
    capacity: u64,
    config: &'a AllocatorConfig,
) -> OomState<'a> {
    OomState {
        segments,
        bytes,
        rounded: bytes,
        stream: 0,
        capacity,
        device_total: None,
        config,
    }
}

#[test]
fn free_blocks_of_a_private_pool_are_pool_retention() {
    // Spec 1.14: a graph pool's free 16 MiB serves only that pool. The
    // replay has no private pools, so the state is built by hand.
    let config = AllocatorConfig::default();
    let mut pool = segment(&[
        (4 * M, BlockState::ActiveAllocated),
        (16 * M, BlockState::Inactive),
    ]);
    pool.segment_pool_id = Some((1, 0));
    let segs = [pool];
    let causes = classify(&state(&segs, 16 * M, 30 * M, &config));
    assert_eq!(
        (causes[0].class, causes[0].rule, causes[0].bytes),
        (CauseClass::PoolRetention, None, 16 * M)
    );
    assert!(causes[0].sentence.contains("private pools"));
}

#[test]
fn a_free_block_too_large_for_an_oversize_request_is_the_oversize_rule() {
    // Spec 1.6: with max_split_size 40 MiB a 50 MiB request may not take a
    // block of 50 + 20 MiB or more; a 40 MiB free block too small is
    // scattered. (After PyTorch's OOM path such a block has been released
    // whole, so only a hand-built state shows it.)
    let config = AllocatorConfig::parse("max_split_size_mb:40").unwrap();
    let segs = [segment(&[
        (M, BlockState::ActiveAllocated),
        (80 * M, BlockState::Inactive),
    ])];
    let causes = classify(&state(&segs, 50 * M, 100 * M, &config));
    assert_eq!(
        (causes[0].class, causes[0].rule, causes[0].bytes),
        (CauseClass::Fragmentation, Some(Rule::Oversize), 80 * M)
    );
    // Stream stranding: the same block on another stream, or pending free.
    let mut other = segs.clone();
    other[0].stream = StreamId(7);
    let causes = classify(&state(&other, 50 * M, 100 * M, &config));
    assert_eq!(causes[0].class, CauseClass::StreamStranding);
}

#[test]
fn shortfall_arithmetic() {
    // Spec 1.4: the segment asked for; spec 1.9: reserved + segment - limit.
    let config = AllocatorConfig::default();
    let none: [Segment; 0] = [];
    let seg = |bytes| segment_request(&state(&none, bytes, 100 * M, &config));
    assert_eq!(seg(512), 2 * M);
    assert_eq!(seg(4 * M), 20 * M);
    assert_eq!(seg(17 * M), 18 * M);
    let segs = [segment(&[(20 * M, BlockState::ActiveAllocated)])];
    assert_eq!(shortfall(&state(&segs, 4 * M, 30 * M, &config)), 10 * M);
    assert_eq!(shortfall(&state(&segs, 4 * M, 40 * M, &config)), 0);
    // Spec 1.13: the limit is the fraction of the device in whole bytes,
    // truncated until torch 2.12 and the nearest byte (halves up) from 2.13.
    let half = AllocatorConfig::parse("per_process_memory_fraction:0.5").unwrap();
    assert_eq!(limit(101, &half), 51);
    let half_2_12 =
        AllocatorConfig::parse_with_policy("policy:pytorch-2.12,per_process_memory_fraction:0.5")
            .unwrap();
    assert_eq!(limit(101, &half_2_12), 50);
    assert_eq!(shortfall(&state(&segs, 4 * M, 60 * M, &half)), 10 * M);
    // Spec 1.11: expandable segments map whole 20 MiB pages after the free
    // tail of the stream's mapped run.
    let x = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let mut run = segment(&[
        (14 * M, BlockState::ActiveAllocated),
        (6 * M, BlockState::Inactive),
    ]);
    run.is_expandable = Some(true);
    let runs = [run];
    assert_eq!(segment_request(&state(&runs, 10 * M, 40 * M, &x)), 20 * M);
    assert_eq!(segment_request(&state(&runs, 26 * M, 40 * M, &x)), 20 * M);
    assert_eq!(segment_request(&state(&runs, 27 * M, 40 * M, &x)), 40 * M);
    assert_eq!(shortfall(&state(&runs, 27 * M, 40 * M, &x)), 20 * M);
}

#[test]
fn dropping_allocations_removes_their_ops_and_start_blocks() {
    let trace =
        Trace::parse("a 1 100\na 2 200 s1\nr 2 0\nk s1 1 2\nf 2\nf 1\ne\na 2 300\nf 2\n").unwrap();
    // Drop allocation 2's first life (200 bytes), not its second (300).
    let (t, st) = drop_allocations(&trace, None, &|id, bytes| id == 2 && bytes == 200);
    assert!(st.is_none());
    assert_eq!(
        t.to_text()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>(),
        ["a 1 100", "k s1 1", "f 1", "e", "a 2 300", "f 2"]
    );
    // The ops kept keep their lines (errors name the original line).
    assert_eq!(t.lines, [1, 4, 6, 7, 8, 9]);
    // A start-state block becomes free space of its segment.
    let start = StartState {
        segments: vec![(
            1 << 30,
            SeededSegment {
                stream: StreamId(0),
                small: false,
                size: 20 * M,
                blocks: vec![
                    SeededBlock {
                        offset: 0,
                        size: 2 * M,
                        requested_size: 2 * M,
                    },
                    SeededBlock {
                        offset: 2 * M,
                        size: 4 * M,
                        requested_size: 4 * M - 100,
                    },
                ],
            },
            vec![7, 8],
        )],
        ..StartState::default()
    };
    let trace = Trace::parse("f 8\nf 7\n").unwrap();
    let (t, st) = drop_allocations(&trace, Some(&start), &|_, bytes| bytes == 4 * M - 100);
    let st = st.unwrap();
    assert_eq!(st.segments[0].2, [7]);
    assert_eq!(st.segments[0].1.blocks.len(), 1);
    assert_eq!(t.ops, [Op::Free { id: 7 }]);
    // And the transformed trace replays from the transformed start.
    let setting = ReplaySetting::new("pytorch", "");
    let r =
        reservoir_replay::replay::Replay::with_start(&t, &st, &setting, &ReplayOptions::default())
            .and_then(|mut r| r.run().map(|_| r.report()))
            .unwrap();
    assert_eq!(r.ooms, 0);
}

#[test]
fn sync_and_empty_cache_go_right_before_the_failed_op() {
    let trace = Trace::parse("a 1 100\na 2 200\n").unwrap();
    let t = sync_and_empty_before(&trace, 1);
    assert_eq!(
        t.ops,
        [
            Op::Alloc {
                id: 1,
                bytes: 100,
                stream: None
            },
            Op::Sync { stream: None },
            Op::EmptyCache,
            Op::Alloc {
                id: 2,
                bytes: 200,
                stream: None
            },
        ]
    );
    assert_eq!(t.lines, [1, 2, 2, 2]);
}
