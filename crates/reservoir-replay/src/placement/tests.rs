//! The placement solvers against brute force on small cases, and an
//! independent checker of every placement.

use proptest::prelude::*;

use super::*;

/// Independent of the solvers: every pair of buffers live at once is
/// disjoint in address.
fn pairwise_ok(buffers: &[Buffer], offsets: &[u64]) -> bool {
    (0..buffers.len()).all(|i| {
        (0..i).all(|j| {
            let (a, b) = (buffers[i], buffers[j]);
            !a.meets(&b) || offsets[i] + a.size <= offsets[j] || offsets[j] + b.size <= offsets[i]
        })
    })
}

/// Brute force over offsets: the least height `h` for which some
/// assignment of integer offsets in `[0, h - size]` is valid (sizes are
/// small integers here), tried from the peak of live bytes up.
fn brute_force(buffers: &[Buffer]) -> u64 {
    fn fits(buffers: &[Buffer], offsets: &mut Vec<u64>, h: u64) -> bool {
        let k = offsets.len();
        if k == buffers.len() {
            return true;
        }
        let b = buffers[k];
        for o in 0..=(h - b.size) {
            let clash = (0..k).any(|j| {
                let c = buffers[j];
                b.meets(&c) && o < offsets[j] + c.size && offsets[j] < o + b.size
            });
            if !clash {
                offsets.push(o);
                if fits(buffers, offsets, h) {
                    return true;
                }
                offsets.pop();
            }
        }
        false
    }
    let total: u64 = buffers.iter().map(|b| b.size).sum();
    let max = buffers.iter().map(|b| b.size).max().unwrap_or(0);
    (max..=total)
        .find(|&h| fits(buffers, &mut Vec::new(), h))
        .unwrap_or(0)
}

fn small_buffers() -> impl Strategy<Value = Vec<Buffer>> {
    prop::collection::vec((1u64..=4, 0u64..6, 1u64..5), 0..=7).prop_map(|v| {
        v.into_iter()
            .map(|(size, start, len)| Buffer::new(size, start, start + len))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The exact search equals brute force; the heuristic is never below
    /// it; both placements pass both checkers; the lower bound holds.
    #[test]
    fn exact_equals_brute_force(buffers in small_buffers()) {
        let optimum = brute_force(&buffers);
        let lb = peak_live(&buffers);
        prop_assert!(lb <= optimum);

        let h = heuristic(&buffers);
        prop_assert!(pairwise_ok(&buffers, &h));
        prop_assert_eq!(verify(&buffers, &h), Ok(height(&buffers, &h)));
        prop_assert!(height(&buffers, &h) >= optimum);

        let t = heuristic::by_time(&buffers);
        prop_assert!(pairwise_ok(&buffers, &t));
        prop_assert!(height(&buffers, &t) >= optimum);
        prop_assert_eq!(heuristic::meeting_pairs(&buffers),
            (0..buffers.len()).map(|i| (0..i).filter(|&j| buffers[i].meets(&buffers[j])).count() as u64).sum::<u64>());

        let e = exact(&buffers, &h, lb, u64::MAX);
        prop_assert!(e.complete);
        prop_assert_eq!(e.height, optimum);
        prop_assert!(pairwise_ok(&buffers, &e.offsets));
        prop_assert_eq!(verify(&buffers, &e.offsets), Ok(optimum));

        let p = solve(&buffers, u64::MAX);
        prop_assert_eq!(p.bound, Bound::Exact { bytes: optimum });
        prop_assert!(pairwise_ok(&buffers, &p.offsets));
        prop_assert_eq!(verify(&buffers, &p.offsets), Ok(optimum));
    }

    /// Without budget the answer is still valid, never below the optimum,
    /// and its bound brackets the optimum.
    #[test]
    fn no_budget_still_brackets_the_optimum(buffers in small_buffers()) {
        let optimum = brute_force(&buffers);
        let p = solve(&buffers, 0);
        prop_assert!(pairwise_ok(&buffers, &p.offsets));
        prop_assert!(p.bound.lower_bound() <= optimum && optimum <= p.bound.best());
    }
}

/// The checker finds an overlap the pairwise check also finds, and
/// accepts a valid placement.
#[test]
fn verify_catches_overlaps() {
    let b = [
        Buffer::new(2, 0, 3),
        Buffer::new(2, 2, 4),
        Buffer::new(2, 3, 5),
    ];
    assert_eq!(
        verify(&b, &[0, 1, 0]),
        Err(PlacementError::Overlap { a: 0, b: 1 })
    );
    assert!(!pairwise_ok(&b, &[0, 1, 0]));
    // 0 and 2 do not meet: both at 0; 1 above both.
    assert_eq!(verify(&b, &[0, 2, 0]), Ok(4));
    assert!(pairwise_ok(&b, &[0, 2, 0]));
    assert_eq!(
        verify(&b, &[0, 2]),
        Err(PlacementError::Length {
            buffers: 3,
            offsets: 2
        })
    );
}

#[test]
fn degenerate_inputs() {
    // Empty.
    let p = solve(&[], DEFAULT_WORK_BUDGET);
    assert_eq!(p.bound, Bound::Exact { bytes: 0 });
    assert!(p.offsets.is_empty());
    // One allocation.
    let one = [Buffer::new(512, 3, 9)];
    let p = solve(&one, DEFAULT_WORK_BUDGET);
    assert_eq!(
        (p.bound, p.offsets.clone()),
        (Bound::Exact { bytes: 512 }, vec![0])
    );
    // All disjoint in time: each at 0, the largest is the height.
    let disjoint: Vec<Buffer> = (0..50)
        .map(|i| Buffer::new(512 * (1 + i % 7), 2 * i, 2 * i + 1))
        .collect();
    let p = solve(&disjoint, DEFAULT_WORK_BUDGET);
    assert_eq!(p.bound, Bound::Exact { bytes: 512 * 7 });
    assert!(p.offsets.iter().all(|&o| o == 0));
    assert_eq!(components(&disjoint).len(), 50);
    // All live at once: stacked, the sum is the height.
    let together: Vec<Buffer> = (0..50)
        .map(|i| Buffer::new(512 * (1 + i % 7), i, 100))
        .collect();
    let sum: u64 = together.iter().map(|b| b.size).sum();
    let p = solve(&together, DEFAULT_WORK_BUDGET);
    assert_eq!(p.bound, Bound::Exact { bytes: sum });
    assert_eq!(verify(&together, &p.offsets), Ok(sum));
    // Zero sizes and empty lifetimes take no space.
    let empty = [
        Buffer::new(0, 0, 5),
        Buffer::new(512, 4, 4),
        Buffer::new(512, 0, 1),
    ];
    assert_eq!(solve(&empty, 0).bound, Bound::Exact { bytes: 512 });
}

/// A case (found by a random search against brute force) where every
/// greedy order of the heuristic stays one unit above the optimum, and the
/// exact search finds and proves the optimum.
#[test]
fn exact_beats_the_heuristic() {
    let b = [
        Buffer::new(3, 1, 3),
        Buffer::new(3, 0, 2),
        Buffer::new(2, 1, 2),
        Buffer::new(4, 2, 6),
    ];
    let optimum = brute_force(&b);
    assert_eq!(optimum, 8);
    let h = heuristic(&b);
    assert_eq!(height(&b, &h), 9);
    let p = solve(&b, DEFAULT_WORK_BUDGET);
    assert_eq!(p.bound, Bound::Exact { bytes: 8 });
    assert_eq!(verify(&b, &p.offsets), Ok(8));
    assert!(pairwise_ok(&b, &p.offsets));
    // With no budget, the search gives the heuristic's answer back,
    // unproven.
    let e = exact(&b, &h, peak_live(&b), 0);
    assert!(!e.complete);
    assert_eq!((e.height, e.offsets), (9, h));
}

/// Many buffers live at once (more meeting pairs than
/// `ONE_ORDER_PAIRS`): the placement in order of time, valid and fast.
#[test]
fn many_meeting_pairs_place_in_order_of_time() {
    let n = 6_000u64;
    let b: Vec<Buffer> = (0..n)
        .map(|i| Buffer::new(512 * (1 + i % 5), i, n + (i * 7919) % n))
        .collect();
    assert!(heuristic::meeting_pairs(&b) > ONE_ORDER_PAIRS);
    let p = solve(&b, DEFAULT_WORK_BUDGET);
    assert_eq!(verify(&b, &p.offsets), Ok(p.bound.best()));
    // Everything is live at time n: the sum is the only height.
    let sum: u64 = b.iter().map(|b| b.size).sum();
    assert_eq!(p.bound, Bound::Exact { bytes: sum });
}

/// The buffers of a trace: rounded to 512, freed ones end at their free,
/// live ones at the end, start-state blocks from time 0.
#[test]
fn buffers_of_a_trace() {
    let trace = Trace::parse("a 1 100\na 2 513\nf 1\na 3 0\na 1 1024\n").unwrap();
    let mut b = buffers(&trace, None);
    b.sort_by_key(|b| (b.start, b.size));
    assert_eq!(
        b,
        [
            Buffer::new(512, 1, 3),
            Buffer::new(1024, 2, 6),
            Buffer::new(1024, 5, 6)
        ]
    );
    let l = limit(&trace, None, DEFAULT_WORK_BUDGET);
    assert_eq!(l.peak_live, 513 + 1024);
    assert_eq!(l.lower_bound, 2048);
    assert_eq!((l.best_placement, l.exact, l.gap), (2048, true, 0));
}

/// The heuristic scales: thousands of allocations in a long-lived
/// training-like pattern solve quickly and validly.
#[test]
fn heuristic_on_a_workload_is_valid() {
    let trace = crate::workload::generate("gpt-train:layers=2,steps=2").unwrap();
    let bufs = buffers(&trace, None);
    let p = solve(&bufs, 200_000);
    assert_eq!(verify(&bufs, &p.offsets), Ok(p.bound.best()));
    assert!(p.bound.lower_bound() >= peak_live(&bufs));
    assert!(p.bound.best() >= p.bound.lower_bound());
}
