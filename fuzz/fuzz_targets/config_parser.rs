//! Bytes → the settings-string readers of `reservoir::config` and the MPS
//! heap allocator's environment reader; the checks are in
//! `common/config_parser.rs`, shared with the stable replay test of
//! `crates/reservoir`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../common/config_parser.rs"]
mod config_parser;

fuzz_target!(|data: &[u8]| config_parser::run_bytes(data));
