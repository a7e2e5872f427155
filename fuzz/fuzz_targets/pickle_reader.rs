//! Raw bytes → pickle reader. Whatever parses must write back (when the
//! writer supports every value in it) and read back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reservoir::observe::pickle::WriteError;
use reservoir_replay::pickle::{self, Limits};

fuzz_target!(|data: &[u8]| {
    let Ok(v) = pickle::from_slice(data) else {
        return;
    };
    let bytes = match reservoir::observe::pickle::to_vec(&v) {
        Ok(b) => b,
        // bytes, sets, globals and ints wider than 255 bytes are readable
        // but deliberately not writable.
        Err(WriteError::Unsupported(_)) => return,
        Err(e) => panic!("write failed on a value the reader accepted: {e}"),
    };
    // The writer's output can be much shorter than the input (binary opcodes
    // and memo sharing), so the size budget is taken from the original input.
    let limits = Limits {
        min_node_budget: (data.len() as u64).saturating_mul(32).max(1 << 16),
        ..Limits::default()
    };
    let back = pickle::from_slice_with(&bytes, &limits)
        .unwrap_or_else(|e| panic!("re-read of written pickle failed: {e}"));
    if back != v {
        // NaN != NaN: fall back to comparing the encodings.
        let again = reservoir::observe::pickle::to_vec(&back).expect("second write");
        assert_eq!(again, bytes, "round trip changed the value");
    }
});
