//! Stand-alone build of Reservoir's trace generator, for `tools/regen-goldens.sh`.
//!
//! `reservoir::oracle_trace` uses only `std`, so this compiles with plain
//! `rustc` even when the rest of the crate does not build:
//!
//! ```sh
//! rustc --edition 2021 -O -o target/gen_traces tools/gen_traces.rs
//! target/gen_traces write DIR      # see `gen_traces` without arguments for the rest
//! ```
//! `cargo run -p reservoir --example gen_trace -- ...` runs the same command line.
#![forbid(unsafe_code)]
#![allow(dead_code, unused_imports)]

#[path = "../crates/reservoir/src/oracle_trace/mod.rs"]
mod oracle_trace;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = oracle_trace::spec::cli(&args) {
        eprintln!("{e}");
        std::process::exit(2);
    }
}
