//! Sequences of C ABI calls (`reservoir-capi`) on a few handles, decoded
//! from the input with `arbitrary`; the checks are in `common/capi_calls.rs`,
//! shared with the stable replay test of `crates/reservoir-capi`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../common/capi_calls.rs"]
mod capi_calls;

fuzz_target!(|data: &[u8]| capi_calls::run_bytes(data));
