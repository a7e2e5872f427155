//! Reservoir's own replay of an oracle-format trace (the text format of
//! `../shared/oracle/oracle_replay.py`) on the simulated device: prints the
//! `torch.cuda.memory_stats()` keys at the end of the trace as JSON, for the
//! in-torch proof (`tools/torch-proof.sh`) to compare with what
//! `reservoir.torch.memory_stats()` reports after the same sequence ran
//! through torch tensors.
//!
//! ```sh
//! cargo run -p reservoir-python --example oracle_trace_stats -- TRACE [CAPACITY_BYTES] [CONF]
//! ```

use std::error::Error;

use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: oracle_trace_stats TRACE [CAPACITY_BYTES] [CONF]")?;
    let capacity = match args.next() {
        Some(c) => c
            .parse()
            .map_err(|e| format!("capacity {c:?} is not a byte count: {e}"))?,
        None => ReplayOptions::default().capacity,
    };
    let conf = args.next().unwrap_or_default();
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let trace = Trace::parse(&text).map_err(|e| format!("{path}: {e}"))?;
    let options = ReplayOptions {
        capacity,
        ..ReplayOptions::default()
    };
    let report = replay(&trace, &ReplaySetting::from_config(&conf), &options)
        .map_err(|e| format!("replaying {path}: {e}"))?;
    let out = serde_json::json!({
        "trace": path,
        "ops": report.ops,
        "memory_stats": report.memory_stats,
    });
    println!("{out}");
    Ok(())
}
