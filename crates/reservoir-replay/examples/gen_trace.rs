//! Print or write generated traces in the oracle's text format (used by
//! `tools/regen-goldens.sh`).
//!
//! ```sh
//! cargo run -p reservoir-replay --example gen_trace -- gen oom 7 2000 256M   # KIND SEED [OPS [LIMIT]]
//! cargo run -p reservoir-replay --example gen_trace -- trace streams-004     # one golden trace
//! cargo run -p reservoir-replay --example gen_trace -- write /tmp/traces     # all golden traces + manifest
//! ```
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = reservoir_replay::oracle_trace::spec::cli(&args) {
        eprintln!("{e}");
        std::process::exit(2);
    }
}
