//! The sequences every implementation runs, as oracle trace text.

use std::fmt::Write;

use reservoir::rng::SplitMix64;
use reservoir_replay::input;
use reservoir_replay::replay::recorded::{convert, oracle_trace, recorded_setting};
use reservoir_replay::workload::Workload;

/// A named sequence.
pub struct Sequence {
    /// Short name for the table.
    pub name: String,
    /// Oracle trace text.
    pub text: String,
}

/// The three largest recorded traces in `../shared/traces` (by file size).
pub const TRACES: [&str; 3] = [
    "cs336-wedsonlin/61dcd14d_medium_512_training_memory_snapshot.pickle",
    "cs336-nothanmin/96f7f9d4_memory_snapshot.pickle",
    "cs336-wedsonlin/83e7cb0c_medium_1024_training_memory_snapshot.pickle",
];

/// Live-set bounds of the flatness sequences ("flat, N live": the random
/// sequence with sizes from 512 B to 1 MiB at every bound, so only the
/// number of live and cached blocks changes); `--quick` runs the first two.
pub const FLAT_LIVE: [usize; 4] = [100, 1_000, 10_000, 100_000];

/// Every sequence; `quick` makes the synthetic ones 10x shorter and skips
/// the recorded traces.
pub fn all(quick: bool) -> Vec<Sequence> {
    let n = if quick { 2_000 } else { 20_000 };
    let mut v = vec![
        Sequence {
            name: "churn 1 KiB".into(),
            text: churn(n),
        },
        workload("gpt-train"),
        workload("llm-infer"),
        Sequence {
            name: "random, 64 live".into(),
            text: random(n, 64, 26, &["0"], 1),
        },
        Sequence {
            name: "random, 10k live".into(),
            // Long enough to reach the bound (about a third of the
            // allocations stay live) and then churn at it.
            text: random(40_000, 10_000, 22, &["0"], 2),
        },
        Sequence {
            name: "two streams".into(),
            text: random(n, 64, 26, &["s1", "s2"], 3),
        },
    ];
    let flat: &[usize] = if quick { &FLAT_LIVE[..2] } else { &FLAT_LIVE };
    for (i, &live) in flat.iter().enumerate() {
        v.push(Sequence {
            name: format!("flat, {live} live"),
            // About 1.5 ops per live block to reach the bound, then at
            // least 20,000 allocations churning at it.
            text: random(20_000 + 2 * live, live, 20, &["0"], 10 + i as u64),
        });
    }
    if !quick {
        for file in TRACES {
            match recorded(file) {
                Some(s) => v.push(s),
                None => eprintln!("SKIPPED-BACKEND trace {file}: not found beside the repository"),
            }
        }
    }
    v
}

/// Same-size churn: `n` pairs of a 1 KiB alloc and its free.
fn churn(n: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        s.push_str("a 1 1024\nf 1\n");
    }
    s
}

/// `n` operations over a bounded live set: sizes log-uniform from 512 B to
/// `2^max_log2` bytes; at `live` blocks a random one is freed before the
/// next allocation, and streams take turns.
fn random(n: usize, live: usize, max_log2: u32, streams: &[&str], seed: u64) -> String {
    let mut rng = SplitMix64::new(seed);
    let mut s = String::new();
    let mut names: Vec<usize> = Vec::new();
    for i in 0..n {
        let next = i + 1;
        if names.len() >= live || (!names.is_empty() && rng.next_u64() % 3 == 0) {
            let at = (rng.next_u64() % names.len() as u64) as usize;
            let id = names.swap_remove(at);
            writeln!(s, "f {id}").unwrap();
        }
        // log2 of the size uniform in [9, max_log2).
        let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let bits = 9.0 + unit * f64::from(max_log2 - 9);
        let bytes = 2f64.powf(bits) as u64;
        let stream = streams[i % streams.len()];
        writeln!(s, "a {next} {bytes} {stream}").unwrap();
        names.push(next);
    }
    s
}

fn workload(name: &str) -> Sequence {
    let w = Workload::parse(name).expect("built-in preset");
    Sequence {
        name: name.into(),
        text: w.trace().to_text(),
    }
}

/// A recorded trace, converted and laid out for the real allocator (the
/// prelude rebuilding its start state included).
fn recorded(file: &str) -> Option<Sequence> {
    let path = reservoir_testkit::traces::shared_trace(file)?;
    let mut input = input::load(&path).ok()?.to_trace_input();
    let setting = recorded_setting(input.allocator_settings.as_ref());
    let config = setting.allocator_config().ok()?;
    let dev = input.devices.swap_remove(0);
    let rec = convert(&dev, &config, false).ok()?;
    let (trace, _) = oracle_trace(&rec);
    let short = file.split('/').next_back().unwrap_or(file);
    Some(Sequence {
        name: format!("trace {}", &short[..8.min(short.len())]),
        text: trace.to_text(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{calls_without_failures, parse, BenchOp, Ops};
    use crate::run::{run, Impl};

    /// The most blocks live at once.
    fn peak_live(ops: &Ops) -> usize {
        let mut live = vec![false; ops.ids];
        let (mut now, mut peak) = (0usize, 0);
        for op in &ops.ops {
            match *op {
                BenchOp::Alloc { id, .. } => {
                    now += usize::from(!live[id as usize]);
                    live[id as usize] = true;
                }
                BenchOp::Free { id } => {
                    now -= usize::from(live[id as usize]);
                    live[id as usize] = false;
                }
                BenchOp::EmptyCache => {}
            }
            peak = peak.max(now);
        }
        peak
    }

    #[test]
    fn flat_sequences_reach_their_bound() {
        for seq in all(true).into_iter().chain(all(false)) {
            let Some(bound) = seq.name.strip_prefix("flat, ") else {
                continue;
            };
            let bound: usize = bound.trim_end_matches(" live").parse().unwrap();
            assert_eq!(peak_live(&parse(&seq.text)), bound, "{}", seq.name);
        }
    }

    /// A failed allocation would make a column look cheaper (fewer, failed
    /// calls): every synthetic sequence fits every implementation, except
    /// 100,000 live blocks without a cache (each simulated device
    /// allocation counts at least `SimConfig::accounting_granularity`,
    /// 2 MiB: 200 GB), which the table marks.
    #[test]
    fn no_allocation_fails_in_the_synthetic_sequences() {
        for seq in all(false) {
            if seq.name.starts_with("trace") {
                continue;
            }
            let ops = parse(&seq.text);
            let expected = calls_without_failures(&ops);
            for &imp in Impl::ALL {
                let calls = run(imp, &ops, 1).1;
                if imp == Impl::NoCache && seq.name == "flat, 100000 live" {
                    assert!(calls < expected, "the no-cache device held 100,000 blocks");
                } else {
                    assert_eq!(calls, expected, "{} on {}", imp.name(), seq.name);
                }
            }
        }
    }
}
