//! The replay engine and the built-in workloads.

use reservoir::backend::StreamId;
use reservoir_replay::oracle_trace::{Op, Trace};
use reservoir_replay::replay::{
    replay, replay_all, Replay, ReplayError, ReplayOptions, ReplaySetting,
};
use reservoir_replay::workload::{self, Workload, WorkloadParams};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn opts(capacity: u64) -> ReplayOptions {
    ReplayOptions {
        capacity,
        ..ReplayOptions::default()
    }
}

fn pytorch() -> ReplaySetting {
    ReplaySetting::new("pytorch", "")
}

/// Every preset, shrunk so that the test stays quick.
fn small_workloads() -> Vec<Workload> {
    workload::presets()
        .iter()
        .map(|p| {
            let mut params = p.params();
            match &mut params {
                WorkloadParams::GptTrain(g) => {
                    g.steps = g.steps.min(2);
                    g.layers = g.layers.min(4);
                }
                WorkloadParams::LlmInfer(l) => {
                    l.requests = l.requests.min(4);
                    l.layers = l.layers.min(4);
                    l.gen_max = l.gen_max.min(100);
                    l.gen_min = l.gen_min.min(l.gen_max);
                }
            }
            Workload {
                preset: p.name,
                params,
            }
        })
        .collect()
}

#[test]
fn workloads_are_deterministic_and_round_trip_as_text() {
    for w in small_workloads() {
        let a = w.trace();
        let b = Workload::parse(&w.spec()).unwrap().trace();
        assert_eq!(a, b, "{}", w.preset);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let text = a.to_text();
        assert!(text.starts_with("# reservoir workload "), "{}", w.preset);
        let parsed = Trace::parse(&text).unwrap();
        assert_eq!(parsed.ops, a.ops, "{}", w.preset);
    }
    // the quick presets are pinned: a changed generator shows up here (update
    // the numbers when the change is intended)
    let pinned = |spec: &str| {
        let t = workload::generate(spec).unwrap();
        (t.ops.len(), format!("{:016x}", t.fingerprint()))
    };
    assert_eq!(pinned("gpt-train"), (3710, "885628bc2d4ca52a".to_string()));
    assert_eq!(pinned("llm-infer"), (81504, "eb6d5b45be1de30c".to_string()));
}

#[test]
fn workloads_use_both_pools() {
    for name in ["gpt-train", "llm-infer"] {
        let t = workload::generate(name).unwrap();
        let sizes: Vec<u64> = t
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Alloc { bytes, .. } => Some(*bytes),
                _ => None,
            })
            .collect();
        assert!(
            sizes.iter().any(|&s| s <= MIB),
            "{name}: no small-pool sizes"
        );
        assert!(
            sizes.iter().any(|&s| s > 10 * MIB),
            "{name}: no large sizes"
        );
    }
}

#[test]
fn report_agrees_with_the_allocator() {
    for w in small_workloads() {
        let trace = w.trace();
        let options = ReplayOptions {
            max_samples: 300,
            ..opts(80 * GIB)
        };
        for setting in ReplaySetting::defaults() {
            let mut r = Replay::new(&trace, &setting, &options).unwrap();
            r.run().unwrap();
            assert!(r.is_done());
            let report = r.report();
            let alloc = r.allocator();
            alloc.check_invariants().unwrap();
            let stats = alloc.stats();
            let ctx = format!("{} / {}", w.preset, setting.name);
            assert_eq!(report.setting, setting.name);
            assert_eq!(report.config, setting.config);
            assert_eq!(report.ops, trace.ops.len() as u64, "{ctx}");
            assert_eq!(
                report.peak_allocated as i64,
                stats.allocated_bytes.all().peak,
                "{ctx}"
            );
            assert_eq!(
                report.peak_reserved as i64,
                stats.reserved_bytes.all().peak,
                "{ctx}"
            );
            assert_eq!(report.driver_allocs as i64, stats.num_device_alloc, "{ctx}");
            assert_eq!(report.driver_frees as i64, stats.num_device_free, "{ctx}");
            assert_eq!(report.ooms as i64, stats.num_ooms, "{ctx}");
            assert_eq!(report.ooms, 0, "{ctx}");
            assert_eq!(report.memory_stats, alloc.memory_stats(), "{ctx}");
            let counters = r.device().counters();
            if counters.maps == 0 {
                assert_eq!(report.driver_allocs, counters.allocs, "{ctx}");
            } else {
                // expandable segments (`expandable`, `reservoir`) grow by
                // mapping pages: no cudaMalloc, except the `reservoir`
                // policy's segments of their own (2 MiB multiples); every
                // counted device allocation is one of those or mapped at
                // least one page
                if setting.name != "reservoir" {
                    assert_eq!(counters.allocs, 0, "{ctx}");
                }
                assert_eq!(
                    counters.allocs,
                    counters.allocs.min(report.driver_allocs),
                    "{ctx}"
                );
                assert!(
                    counters.maps + counters.allocs >= report.driver_allocs,
                    "{ctx}"
                );
            }
            assert_eq!(report.driver_time_ns, counters.driver_time_ns, "{ctx}");
            assert!(report.driver_time_ns > 0, "{ctx}");
            // the peak moment
            let peak = report.peak.clone().unwrap();
            assert_eq!(peak.reserved, report.peak_reserved, "{ctx}");
            assert!(peak.allocated <= report.peak_allocated, "{ctx}");
            assert_eq!(
                report.reserved_unallocated_at_peak,
                peak.reserved - peak.allocated
            );
            assert_eq!(report.largest_free_block_at_peak, peak.largest_free_block);
            assert!(report.largest_free_block_at_peak <= report.reserved_unallocated_at_peak);
            let frag = report.fragmentation.unwrap();
            let expect = report.peak_reserved as f64 / report.peak_allocated as f64;
            assert!((frag - expect).abs() < 1e-12 && frag >= 1.0, "{ctx}");
            // the time series: bounded, ordered, and it shows the peaks
            assert!(
                report.samples.len() <= 300,
                "{ctx}: {}",
                report.samples.len()
            );
            assert!(
                report.samples.windows(2).all(|p| p[0].op < p[1].op),
                "{ctx}"
            );
            let max_alloc = report.samples.iter().map(|s| s.allocated).max().unwrap();
            assert_eq!(max_alloc, report.peak_allocated, "{ctx}");
            assert!(
                report.samples.iter().all(|s| s.reserved >= s.allocated),
                "{ctx}"
            );
            // calls: every alloc and free reached the allocator
            assert!(report.allocator_calls >= report.alloc_ops + report.free_ops);
            assert!(report.allocator_timed_calls > 0 && report.allocator_ns_per_op > 0.0);
            assert!(report.allocator_ns_p50 <= report.allocator_ns_p99);
        }
    }
}

#[test]
fn settings_change_the_outcome() {
    let trace = workload::generate("gpt2-medium-finetune:steps=3").unwrap();
    let reports = replay_all(
        &trace,
        &ReplaySetting::defaults(),
        &opts(80 * GIB),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(reports.len(), 6);
    let by = |n: &str| reports.iter().find(|r| r.setting == n).unwrap();
    // oversize blocks cannot be split: more driver allocations
    assert!(by("max-split-128").driver_allocs > by("pytorch").driver_allocs);
    // rounding to power-of-two divisions allocates more
    assert!(by("roundup-4").peak_allocated > by("pytorch").peak_allocated);
    // the reservoir policy reserves no more than PyTorch's defaults or
    // expandable segments (issue 17)
    for other in ["pytorch", "expandable"] {
        assert!(
            by("reservoir").peak_reserved <= by(other).peak_reserved,
            "{other}"
        );
    }
}

#[test]
fn out_of_memory_does_not_stop_the_replay() {
    let trace = workload::generate("gpt-train").unwrap();
    let report = replay(&trace, &pytorch(), &opts(512 * MIB)).unwrap();
    assert_eq!(report.ops, trace.ops.len() as u64);
    assert!(report.ooms > 0);
    assert_eq!(report.memory_stats["num_ooms"], report.ooms as i64);
    let first = report.first_oom.as_ref().unwrap();
    assert!(first.message.contains("out of memory"), "{}", first.message);
    assert!(
        first.message.contains("Tried to allocate"),
        "{}",
        first.message
    );
    assert!(report.peak_reserved <= 512 * MIB);

    // frees, record_stream and kernels of a failed allocation are skipped;
    // the id can be allocated again
    let text = "a 1 1G\nr 1 side\nk side 1\nf 1\na 2 100M\na 1 10M\nf 1\nf 2\n";
    let trace = Trace::parse(text).unwrap();
    let mut r = Replay::new(&trace, &pytorch(), &opts(512 * MIB)).unwrap();
    r.run().unwrap();
    let report = r.report();
    assert_eq!(report.ooms, 1);
    let first = report.first_oom.unwrap();
    assert_eq!(
        (first.op, first.line, first.id, first.bytes),
        (0, 1, 1, GIB)
    );
    assert_eq!(report.alloc_ops, 3);
    assert_eq!(report.free_ops, 2);
    assert_eq!(r.allocator().stats().allocated_bytes.all().current, 0);
    // the `r` of the failed id did not create the stream; `k` did
    assert_eq!(report.streams, vec![("side".to_string(), 1)]);
}

/// Issue 44 (F6): each out-of-memory error costs the allocator a pass over
/// every cached block, so a program far too large for the device replayed
/// for hours. With `max_ooms` the replay stops past that many, with a
/// typed error naming the op, the count and the limit; without (the
/// default) it runs to the end as before.
#[test]
fn replay_stops_past_max_ooms() {
    // 50 allocations of 1 GiB on a 512 MiB device: 50 out-of-memory errors,
    // between cached 2 MiB blocks.
    let mut text = String::from("a 1000 1M\n");
    for id in 1..=50 {
        text.push_str(&format!("a {id} 1G\nf {id}\n"));
    }
    let trace = Trace::parse(&text).unwrap();
    let report = replay(&trace, &pytorch(), &opts(512 * MIB)).unwrap();
    assert_eq!(report.ooms, 50);
    for limit in [50, 1000] {
        let options = ReplayOptions {
            max_ooms: Some(limit),
            ..opts(512 * MIB)
        };
        let capped = replay(&trace, &pytorch(), &options).unwrap();
        assert_eq!(capped.ooms, 50, "limit {limit}");
        assert_eq!(capped.peak_reserved, report.peak_reserved);
    }
    for limit in [0, 10, 49] {
        let options = ReplayOptions {
            max_ooms: Some(limit),
            ..opts(512 * MIB)
        };
        let e = replay(&trace, &pytorch(), &options).unwrap_err();
        // The (limit + 1)th failing allocation, `a <limit + 1> 1G`, is op
        // 2 * limit + 1 on line 2 * limit + 2.
        let at = 2 * limit as usize + 1;
        match &e {
            ReplayError::TooManyOoms {
                op,
                line,
                ooms,
                limit: l,
            } => assert_eq!((*op, *line, *ooms, *l), (at, at + 1, limit + 1, limit)),
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        for want in [
            format!(
                "out of memory {} times, more than the limit of {limit}",
                limit + 1
            ),
            "does not fit this device".into(),
            "--capacity".into(),
            "RESERVOIR_MAX_REPLAY_OOMS=N".into(),
        ] {
            assert!(msg.contains(&want), "{want:?} not in {msg}");
        }
    }
}

#[test]
fn trace_errors_name_the_op_and_line() {
    let trace = Trace::parse("# header\na 1 10\n\nf 2\n").unwrap();
    let e = replay(&trace, &pytorch(), &opts(GIB)).unwrap_err();
    match &e {
        ReplayError::Trace { op, line, message } => {
            assert_eq!((*op, *line), (1, 4));
            assert!(message.contains("id 2"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("line 4"), "{e}");
    let trace = Trace::parse("a 1 10\na 1 10\n").unwrap();
    let e = replay(&trace, &pytorch(), &opts(GIB)).unwrap_err();
    assert!(e.to_string().contains("already live"), "{e}");
    let trace = Trace::parse("r 5 side\n").unwrap();
    assert!(replay(&trace, &pytorch(), &opts(GIB)).is_err());
}

#[test]
fn stream_names_map_in_first_use_order() {
    let text = "\
        a 1 30M b\n\
        s a\n\
        a 2 30M\n\
        a 3 30M default\n\
        w c b\n\
        s 0\n\
        a 4 30M\n";
    let trace = Trace::parse(text).unwrap();
    let mut r = Replay::new(&trace, &pytorch(), &opts(GIB)).unwrap();
    r.run().unwrap();
    let table: Vec<(String, StreamId)> = r.streams().streams().to_vec();
    assert_eq!(
        table,
        vec![
            ("b".to_string(), StreamId(1)),
            ("a".to_string(), StreamId(2)),
            ("c".to_string(), StreamId(3)),
        ]
    );
    let stream_of = |id| {
        let ptr = r.pointer(id).unwrap();
        r.allocator()
            .segments()
            .into_iter()
            .find(|s| s.address <= ptr.0 && ptr.0 < s.address + s.total_size)
            .unwrap()
            .stream
    };
    assert_eq!(stream_of(1), StreamId(1));
    assert_eq!(stream_of(2), StreamId(2));
    assert_eq!(stream_of(3), StreamId::DEFAULT);
    assert_eq!(stream_of(4), StreamId::DEFAULT);
    let report = r.report();
    assert_eq!(
        report.streams,
        vec![("b".into(), 1), ("a".into(), 2), ("c".into(), 3)]
    );
}

#[test]
fn record_stream_on_a_held_stream_delays_reuse() {
    let text = "\
        h side\n\
        a 1 30M\n\
        r 1 side\n\
        k side 1\n\
        f 1\n\
        a 2 30M\n\
        u side\n\
        a 3 30M\n";
    let trace = Trace::parse(text).unwrap();
    let mut r = Replay::new(&trace, &pytorch(), &opts(GIB)).unwrap();
    for _ in 0..6 {
        assert!(r.step().unwrap());
    }
    // block 1 waits for the held stream: block 2 needed a new segment
    assert_eq!(r.allocator().stats().num_device_alloc, 2);
    r.run().unwrap();
    assert!(!r.step().unwrap());
    // released: block 1 was reused for block 3
    assert_eq!(r.report().driver_allocs, 2);
}

#[test]
fn ddp_workload_uses_a_communication_stream() {
    let trace = workload::generate("gpt2-small-ddp-train:layers=2,steps=2,seq=128").unwrap();
    assert!(trace
        .ops
        .iter()
        .any(|op| matches!(op, Op::RecordStream { .. })));
    let report = replay(&trace, &pytorch(), &opts(80 * GIB)).unwrap();
    assert_eq!(report.streams, vec![("comm".to_string(), 1)]);
    assert_eq!(report.ooms, 0);
}

#[test]
fn bad_settings_are_refused() {
    assert!(matches!(
        ReplaySetting::parse("x=no_such_key:1"),
        Err(ReplayError::Config { .. })
    ));
    assert!(ReplaySetting::parse("=max_split_size_mb:128").is_err());
    let s = ReplaySetting::parse("big=max_split_size_mb:512").unwrap();
    assert_eq!(
        (s.name.as_str(), s.config.as_str()),
        ("big", "max_split_size_mb:512")
    );
    let s = ReplaySetting::parse("roundup_power2_divisions:2").unwrap();
    assert_eq!(s.name, "roundup_power2_divisions:2");
    assert_eq!(ReplaySetting::from_config("").name, "pytorch");
    let names: Vec<String> = ReplaySetting::defaults()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        [
            "pytorch",
            "expandable",
            "reservoir",
            "max-split-128",
            "roundup-4",
            "gc-0.8"
        ]
    );
    for s in ReplaySetting::defaults() {
        s.allocator_config().unwrap();
    }
}

#[test]
fn json_has_the_documented_keys() {
    let trace = workload::generate("llm-infer:requests=3").unwrap();
    let report = replay(&trace, &pytorch(), &opts(80 * GIB)).unwrap();
    let v = serde_json::to_value(&report).unwrap();
    let obj = v.as_object().unwrap();
    for key in [
        "setting",
        "config",
        "allocator",
        "capacity",
        "ops",
        "alloc_ops",
        "free_ops",
        "peak_allocated",
        "peak_reserved",
        "peak_live",
        "fragmentation",
        "reserved_unallocated_at_peak",
        "largest_free_block_at_peak",
        "peak",
        "driver_allocs",
        "driver_frees",
        "ooms",
        "first_oom",
        "driver_time_ns",
        "allocator_calls",
        "allocator_timed_calls",
        "allocator_time_ns",
        "allocator_ns_per_op",
        "allocator_ns_p50",
        "allocator_ns_p99",
        "streams",
        "memory_stats",
        "samples",
    ] {
        assert!(obj.contains_key(key), "missing {key}");
    }
    assert_eq!(
        obj.len(),
        28,
        "new keys must be documented here and in the CLI"
    );
    assert_eq!(v["setting"], "pytorch");
    assert_eq!(v["allocator"], "caching");
    assert!(v["first_oom"].is_null());
    assert_eq!(v["peak_reserved"].as_u64(), Some(report.peak_reserved));
    assert!(v["memory_stats"]["allocated_bytes.all.peak"].is_i64());
    let s0 = &v["samples"][0];
    assert!(s0["op"].is_u64() && s0["allocated"].is_u64() && s0["reserved"].is_u64());
}

#[test]
fn progress_reaches_the_total() {
    let trace = workload::generate("gpt-train:steps=1").unwrap();
    let settings = ReplaySetting::defaults();
    let mut last = 0;
    let reports = replay_all(&trace, &settings, &opts(80 * GIB), &mut |n| {
        assert!(n >= last);
        last = n;
    })
    .unwrap();
    assert_eq!(last, trace.ops.len() * settings.len());
    assert_eq!(reports.len(), settings.len());
}
