//! The levers on the built-in training workload, whose roles are known by
//! construction (see `roles::workload_tests`).

use super::*;
use crate::replay::explain::{add_levers, explain};
use crate::workload::Workload;

const SPEC: &str = "gpt-train:layers=2,steps=2";

fn workload() -> (Trace, Sites) {
    Workload::parse(SPEC).unwrap().trace_and_sites()
}

fn defaults() -> ReplaySetting {
    ReplaySetting::new("defaults", "")
}

/// The levers' input over `trace` from a cold start, explained at op 0,
/// its recording not ending at an OOM.
fn input_of<'a>(
    trace: &'a Trace,
    sites: &'a Sites,
    setting: &'a ReplaySetting,
    options: &'a ReplayOptions,
) -> LeverInput<'a> {
    LeverInput {
        trace,
        start: None,
        setting,
        options,
        sites,
        moment: 0,
        ends_at: None,
        imbalance: None,
    }
}

/// The peak of the bytes live, each allocation counted as `size(id,
/// bytes)` rounded up to 512 bytes (the allocator's rounding, spec 1.3).
fn requested_peak(trace: &Trace, size: &dyn Fn(AllocId, u64) -> u64) -> u64 {
    let mut live: FxHashMap<AllocId, u64> = FxHashMap::default();
    let (mut now, mut peak) = (0u64, 0u64);
    for op in &trace.ops {
        match op {
            Op::Alloc { id, bytes, .. } => {
                let b = size(*id, *bytes).div_ceil(512) * 512;
                now += b;
                live.insert(*id, b);
                peak = peak.max(now);
            }
            Op::Free { id } => now -= live.remove(id).unwrap_or(0),
            _ => {}
        }
    }
    peak
}

/// The levers of the workload on a device of `capacity`, and its own
/// replay's peaks there.
fn levers_at(capacity: u64) -> (Vec<Lever>, Outcome, Trace, Roles) {
    let (trace, sites) = workload();
    let setting = defaults();
    let options = ReplayOptions::without_timeline(capacity);
    let input = input_of(&trace, &sites, &setting, &options);
    let base = replay_peaks(&trace, None, &setting, &options, false)
        .unwrap()
        .unwrap();
    let roles = Roles::classify(&trace, &sites);
    let mut input = input;
    // The moment: the op of the requested peak (checkpointing chooses the
    // sites of the saved activations at their peak before it).
    input.moment = peak_op(&trace, &roles);
    (levers(&input).unwrap(), base, trace, roles)
}

/// The op after which the requested bytes live peak.
fn peak_op(trace: &Trace, _roles: &Roles) -> u64 {
    let mut live: FxHashMap<AllocId, u64> = FxHashMap::default();
    let (mut now, mut peak, mut at) = (0u64, 0u64, 0usize);
    for (i, op) in trace.ops.iter().enumerate() {
        match op {
            Op::Alloc { id, bytes, .. } => {
                now += bytes;
                live.insert(*id, *bytes);
                if now > peak {
                    peak = now;
                    at = i;
                }
            }
            Op::Free { id } => now -= live.remove(id).unwrap_or(0),
            _ => {}
        }
    }
    at as u64
}

fn find<'a>(levers: &'a [Lever], name: &str) -> &'a Lever {
    levers
        .iter()
        .find(|l| l.lever == name)
        .unwrap_or_else(|| panic!("no {name} lever in {levers:?}"))
}

/// Each resizing lever's replay peaks at the bytes its transformation
/// leaves (its requested peak, plus under 2 % the allocator adds, as it
/// does to the workload's own), below the workload's own.
#[test]
fn resizing_levers_cut_the_peak_by_what_they_resize() {
    let (levers, base, trace, roles) = levers_at(80 << 30);
    // What the allocator adds to the requested peak (the unsplit rest of
    // large blocks, under 1 MiB each): under 2 % here, and the slack each
    // lever's peak may exceed its requested peak by.
    let own = requested_peak(&trace, &|_, b| b);
    assert!(base.peak_allocated >= own);
    let slack = base.peak_allocated / 50;
    assert!(base.peak_allocated - own < slack);
    let cases: [(&str, &[Role], u64); 3] = [
        ("micro_batch", &[Role::Activations, Role::Temporaries], 2),
        ("optimizer_sharding", &[Role::OptimizerState], 2),
        ("lower_precision", &[Role::Activations], 2),
    ];
    for (name, pick, den) in cases {
        let l = find(&levers, name);
        assert!(l.fits, "{name}: {}", l.replayed);
        let want = requested_peak(&trace, &|id, b| {
            if pick.contains(&roles.role(id).0) {
                scale(b, 1, den)
            } else {
                b
            }
        });
        assert!(
            l.peak_allocated >= want && l.peak_allocated - want < slack,
            "{name}: {} vs {want}: {}",
            l.peak_allocated,
            l.replayed
        );
        assert!(
            l.peak_allocated < base.peak_allocated,
            "{name}: {} not below {}",
            l.peak_allocated,
            base.peak_allocated
        );
        assert!(l.peak_reserved <= base.peak_reserved, "{name}");
    }
    // The micro-batch halves more than the activations alone do.
    assert!(
        find(&levers, "micro_batch").peak_allocated
            <= find(&levers, "lower_precision").peak_allocated
    );
    let m = find(&levers, "micro_batch");
    assert!(m.replayed.contains("factor 1/2"), "{}", m.replayed);
    assert!(m.replayed.contains("fits in 80.00 GiB"), "{}", m.replayed);
    let s = find(&levers, "optimizer_sharding");
    assert!(
        s.replayed.contains("over 2 ranks") && s.replayed.contains("smallest of 2, 4, 8"),
        "{}",
        s.replayed
    );
}

/// Checkpointing drops the chosen sites' saved activations between forward
/// and backward: the trace stays valid (every id freed once it is made
/// again) and the peak falls.
#[test]
fn checkpointing_frees_saved_activations_between_forward_and_backward() {
    let (levers, base, trace, roles) = levers_at(80 << 30);
    let l = find(&levers, "activation_checkpointing");
    assert!(l.fits, "{}", l.replayed);
    assert!(
        l.peak_allocated < base.peak_allocated,
        "{} not below {}: {}",
        l.peak_allocated,
        base.peak_allocated,
        l.replayed
    );
    assert!(l.replayed.contains("layer forward"), "{}", l.replayed);
    // Every site checkpointed: each activation made twice, freed twice.
    let (_, sites) = workload();
    let all: FxHashSet<&str> = activation_sites(&trace, &roles, &sites, peak_op(&trace, &roles))
        .0
        .into_iter()
        .map(|g| g.0)
        .collect();
    let (t, count, _) = checkpoint::checkpointed(&trace, &roles, &sites, &all);
    assert!(count > 0);
    let allocs = |t: &Trace| {
        t.ops
            .iter()
            .filter(|o| matches!(o, Op::Alloc { .. }))
            .count()
    };
    let frees = |t: &Trace| {
        t.ops
            .iter()
            .filter(|o| matches!(o, Op::Free { .. }))
            .count()
    };
    assert_eq!(allocs(&t), allocs(&trace) + count as usize);
    assert_eq!(frees(&t), frees(&trace) + count as usize);
    assert_eq!(t.ops.len(), t.lines.len());
    let o = replay_peaks(
        &t,
        None,
        &defaults(),
        &ReplayOptions::without_timeline(80 << 30),
        false,
    )
    .unwrap()
    .unwrap();
    assert!(o.fits && o.peak_allocated < base.peak_allocated);
}

/// On a device too small for the workload (a capacity OOM), the explained
/// OOM carries the levers, replayed on that device, and says which fit.
#[test]
fn a_capacity_oom_gets_levers_on_its_device() {
    let (trace, sites) = workload();
    let setting = defaults();
    let big = ReplayOptions::without_timeline(80 << 30);
    let base = replay_peaks(&trace, None, &setting, &big, false)
        .unwrap()
        .unwrap();
    // The largest device, in 5 % steps of the allocated peak, whose first
    // OOM is a capacity one (no allocator could serve it).
    let capacity_oom = |pct: u64| {
        let capacity = base.peak_allocated / 100 * pct;
        let options = ReplayOptions::without_timeline(capacity);
        let mut r: Replay<'_> = Replay::build(&trace, None, &setting, &options).unwrap();
        r.run().unwrap();
        let report = r.report();
        let e = explain(&trace, None, &setting, &options, &report, &sites, &[]).unwrap();
        let capacity_cause = e.oom.as_ref().is_some_and(|o| {
            o.diagnosis
                .causes
                .iter()
                .any(|c| c.class == crate::replay::diagnose::CauseClass::Capacity)
        });
        capacity_cause.then_some((capacity, options, e))
    };
    let (capacity, options, mut e) = (1..20)
        .rev()
        .find_map(|k| capacity_oom(k * 5))
        .expect("a capacity OOM");
    add_levers(&mut e, &trace, None, &setting, &options, &sites, None).unwrap();
    let o = e.oom.as_ref().unwrap();
    assert!(o.diagnosis.fix.as_ref().is_none_or(|f| f.config.is_none()));
    let m = find(&o.levers, "micro_batch");
    assert!(m.fits, "{}", m.replayed);
    assert!(m.peak_reserved <= capacity);
    for l in &o.levers {
        if !l.fits {
            assert!(l.peak_reserved > 0 && l.replayed.contains("does not fit in"));
        }
    }
    let json = serde_json::to_value(&e).unwrap();
    let levers = json["oom"]["levers"].as_array().unwrap();
    assert_eq!(levers.len(), o.levers.len());
    for k in [
        "lever",
        "replayed",
        "peak_reserved",
        "peak_allocated",
        "fits",
    ] {
        assert!(levers[0].get(k).is_some(), "{k}");
    }
    // The peak of a run without an OOM gets none until asked, and then
    // its own.
    assert!(e.peak.as_ref().unwrap().levers.is_empty());
}

/// A recording that ends at its OOM: a lever that fits says that its
/// replay proves the run only up to the failure.
#[test]
fn a_lever_says_when_the_recording_ends_at_the_oom() {
    let (trace, sites) = workload();
    let setting = defaults();
    let options = ReplayOptions::without_timeline(80 << 30);
    let roles = Roles::classify(&trace, &sites);
    let mut input = LeverInput {
        ends_at: Some(7),
        ..input_of(&trace, &sites, &setting, &options)
    };
    let l = micro_batch(&input, &roles).unwrap().unwrap();
    assert!(l.fits);
    assert!(
        l.replayed
            .ends_with(&format!("({})", ends_at_failure_clause(7))),
        "{}",
        l.replayed
    );
    input.ends_at = None;
    let l = micro_batch(&input, &roles).unwrap().unwrap();
    assert!(!l.replayed.contains("the recording ends"), "{}", l.replayed);
}

/// The levers of built-in workload `spec` on an 80 GiB device, and the
/// peaks of its own replay there.
fn levers_of(spec: &str) -> (Vec<Lever>, Outcome, Trace, Sites) {
    let (trace, sites) = Workload::parse(spec).unwrap().trace_and_sites();
    let setting = defaults();
    let options = ReplayOptions::without_timeline(80 << 30);
    let base = replay_peaks(&trace, None, &setting, &options, false)
        .unwrap()
        .unwrap();
    let input = LeverInput {
        moment: trace.ops.len().saturating_sub(1) as u64,
        ..input_of(&trace, &sites, &setting, &options)
    };
    let levers = levers(&input).unwrap();
    (levers, base, trace, sites)
}

const EAGER: &str = "llm-infer:layers=2,requests=3,prompt_max=1024,flash=0";

/// Eager prefill attention materialises `heads x n x n` scores, their
/// masked copy, the fp32 softmax and its downcast (4 per layer and
/// prefill): the lever drops exactly those, and its peak falls; fused
/// (flash) prefill has none, and no lever.
#[test]
fn fused_attention_drops_the_scores_of_eager_attention() {
    let (levers, base, trace, sites) = levers_of(EAGER);
    let l = find(&levers, "fused_attention");
    assert!(l.fits, "{}", l.replayed);
    assert!(l.peak_allocated < base.peak_allocated, "{}", l.replayed);
    let setting = defaults();
    let options = ReplayOptions::without_timeline(80 << 30);
    let input = input_of(&trace, &sites, &setting, &options);
    let scores = fused::score_allocations(&input);
    let attention: Vec<u64> = trace
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Alloc { id, bytes, .. } if sites.site(*id) == "attention" => Some(*bytes),
            _ => None,
        })
        .collect();
    assert!(
        !scores.is_empty() && scores.len() % 4 == 0,
        "{}",
        scores.len()
    );
    assert!(scores.len() < attention.len());
    // Each is `heads x n x n` elements of 2 bytes (bf16) or 4 (the fp32
    // softmax), 8 heads (the workload's default).
    let square = |x: u64| (x as f64).sqrt().round() as u64 * (x as f64).sqrt().round() as u64 == x;
    for (id, bytes) in &scores {
        assert_eq!(sites.site(*id), "attention");
        assert!(
            [16, 32].iter().any(|k| bytes % k == 0 && square(bytes / k)),
            "{bytes} is not heads x n x n"
        );
    }
    assert!(
        l.replayed.contains(&format!(
            "the {} allocations the size of attention scores",
            scores.len()
        )),
        "{}",
        l.replayed
    );
    assert!(l.replayed.contains("at attention ("), "{}", l.replayed);
    let fused = EAGER.replace("flash=0", "flash=1");
    let (levers, ..) = levers_of(&fused);
    assert!(levers.iter().all(|l| l.lever != "fused_attention"));
    // The training workload's attention site frees two score-sized
    // allocations per run (the scores and the masked scores; the
    // probabilities are saved for backward): fewer than 3, no lever
    // (conservative).
    let (levers, ..) = levers_at(80 << 30);
    assert!(levers.iter().all(|l| l.lever != "fused_attention"));
}

/// `y = f(x); del x` twice in a row (a chain) becomes one allocation kept
/// until the last one's free; an allocation of another size, or whose
/// predecessor outlives it, is left alone.
#[test]
fn in_place_reuses_the_predecessor_that_dies_at_once() {
    let text = "a 1 4096\na 2 4096\nf 1\na 3 4096\nf 2\na 4 1024\na 5 2048\nf 4\na 6 2048\na 7 2048\nf 3\nf 5\nf 6\nf 7\n";
    let trace = Trace::parse(text).unwrap();
    let ops = inplace::in_place_ops(&trace);
    let pairs: Vec<(AllocId, AllocId)> = ops.iter().map(|p| (p.old, p.new)).collect();
    // 2 on 1, 3 on 2; 5 (other size than 4) and 7 (6 not freed next) not.
    assert_eq!(pairs, [(1, 2), (2, 3)]);
    let t = inplace::in_placed(&trace, &ops);
    let want =
        Trace::parse("a 1 4096\na 4 1024\na 5 2048\nf 4\na 6 2048\na 7 2048\nf 1\nf 5\nf 6\nf 7\n")
            .unwrap();
    assert_eq!(t.ops, want.ops);
    assert_eq!(t.lines.len(), t.ops.len());
}

/// On the inference workload the lever finds the out-of-place ops whose
/// input dies at once (RMSNorm's casts, among others), keeps the trace
/// valid (as many frees as allocations fewer) and does not raise the peak.
#[test]
fn in_place_on_a_workload_keeps_the_trace_valid() {
    let (levers, base, trace, _) = levers_of(EAGER);
    let l = find(&levers, "in_place");
    let ops = inplace::in_place_ops(&trace);
    assert!(!ops.is_empty());
    let t = inplace::in_placed(&trace, &ops);
    let count = |t: &Trace, alloc: bool| {
        t.ops
            .iter()
            .filter(|o| {
                matches!(o, Op::Alloc { .. }) == alloc
                    && matches!(o, Op::Alloc { .. } | Op::Free { .. })
            })
            .count()
    };
    assert_eq!(count(&t, true), count(&trace, true) - ops.len());
    assert_eq!(count(&t, false), count(&trace, false) - ops.len());
    assert!(l.fits, "{}", l.replayed);
    assert!(l.peak_allocated <= base.peak_allocated, "{}", l.replayed);
    assert!(
        l.replayed
            .contains(&format!("the {} allocations whose predecessor", ops.len())),
        "{}",
        l.replayed
    );
}

/// The device of one gpt-train workload of `batch` sequences per step:
/// named `name`, with its peaks on an unbounded device and its work.
fn device(name: &str, batch: u64) -> (Trace, Sites, Peer) {
    let (trace, sites) = Workload::parse(&format!("{SPEC},batch={batch}"))
        .unwrap()
        .trace_and_sites();
    let options = ReplayOptions::without_timeline(80 << 30);
    let o = replay_peaks(&trace, None, &defaults(), &options, false)
        .unwrap()
        .unwrap();
    let peer = Peer {
        name: name.to_string(),
        peak_reserved: o.peak_reserved,
        peak_allocated: o.peak_allocated,
        work: work_bytes(&trace, &sites),
    };
    (trace, sites, peer)
}

/// The heaviest of the peaks is imbalanced from 1.25 times the mean of the
/// others' on; fewer than 2 devices never are.
#[test]
fn imbalance_starts_at_a_quarter_above_the_mean_of_the_others() {
    let peer = |name: &str, peak: u64| Peer {
        name: name.into(),
        peak_reserved: peak,
        peak_allocated: peak,
        work: peak,
    };
    let at = |peaks: &[u64]| {
        let peers = peaks
            .iter()
            .enumerate()
            .map(|(i, &p)| peer(&format!("device {i}"), p))
            .collect();
        Imbalance::of(peers).map(|im| im.heaviest)
    };
    assert_eq!(at(&[100, 125]), Some(1));
    assert_eq!(at(&[100, 124]), None);
    assert_eq!(at(&[300, 100, 140]), Some(0)); // 300 >= 1.25 * 120
    assert_eq!(at(&[149, 100, 140]), None); // the mean of the others: 120
    assert_eq!(at(&[0, 0]), None);
    assert_eq!(at(&[5, 0]), Some(0));
    assert_eq!(at(&[5]), None);
    assert_eq!(at(&[7, 7]), None);
}

/// Device 1 runs 4 times device 0's batch: the imbalance lever, on device
/// 1 only, scales its activations and temporaries to the mean work and its
/// replay peaks below device 1's own; two equal devices list none.
#[test]
fn the_heaviest_device_carrying_the_mean_share_peaks_lower() {
    let (_, _, light) = device("device 0", 2);
    let (trace, sites, heavy) = device("device 1", 8);
    assert!(heavy.work > 3 * light.work, "{heavy:?} {light:?}");
    let im = Imbalance::of(vec![light.clone(), heavy.clone()]).expect("imbalanced");
    assert_eq!(im.heaviest, 1);
    let setting = defaults();
    let options = ReplayOptions::without_timeline(80 << 30);
    let input = LeverInput {
        imbalance: Some(&im),
        ..input_of(&trace, &sites, &setting, &options)
    };
    let all = levers(&input).unwrap();
    assert_eq!(all.last().map(|l| l.lever), Some("imbalance"), "{all:?}");
    let l = find(&all, "imbalance");
    assert!(l.fits, "{}", l.replayed);
    assert!(l.peak_reserved < heavy.peak_reserved, "{l:?} {heavy:?}");
    assert!(l.peak_allocated < heavy.peak_allocated, "{l:?} {heavy:?}");
    // Above the light device's: only the activations and temporaries move.
    assert!(l.peak_allocated > light.peak_allocated, "{l:?} {light:?}");
    let head = format!(
        "device 1 peaks at {} reserved ({} allocated), device 0 at {}; moving work so device 1 carries the mean share of the 2 devices (its activations and temporaries peak at {} live, the mean is {}): its ",
        format_size(heavy.peak_reserved),
        format_size(heavy.peak_allocated),
        format_size(light.peak_reserved),
        format_size(heavy.work),
        format_size((heavy.work + light.work) / 2),
    );
    assert!(l.replayed.starts_with(&head), "{}\n{head}", l.replayed);
    assert!(l
        .replayed
        .contains("; replayed with PyTorch's default settings: peak reserved "));
    // The imbalance's replay is the micro-batch lever's with the factor
    // of the mean share: the same transformation.
    let roles = Roles::classify(&trace, &sites);
    let mean = (heavy.work + light.work) / 2;
    let (t, _, _) = resized(
        &trace,
        &roles,
        &[Role::Activations, Role::Temporaries],
        mean,
        heavy.work,
    );
    let o = input.outcome(&t).unwrap();
    assert_eq!(
        (o.peak_reserved, o.peak_allocated),
        (l.peak_reserved, l.peak_allocated)
    );

    // Two equal devices are balanced: no imbalance, no lever.
    let twin = Peer {
        name: "device 0".into(),
        ..heavy.clone()
    };
    assert!(Imbalance::of(vec![twin, heavy.clone()]).is_none());
    let balanced = levers(&input_of(&trace, &sites, &setting, &options)).unwrap();
    assert!(
        balanced.iter().all(|l| l.lever != "imbalance"),
        "{balanced:?}"
    );
}
