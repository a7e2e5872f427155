//! Bytes → `input::load_bytes`. A loaded snapshot must encode to a pickle
//! that decodes to the same snapshot.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reservoir::observe::snapshot::Snapshot;
use reservoir_replay::pickle::{self, Limits};
use reservoir_replay::input::{self, ReadSnapshot};

fuzz_target!(|data: &[u8]| {
    let Ok(loaded) = input::load_bytes(data) else {
        return;
    };
    let _ = loaded.to_trace_input();
    let Some(s) = loaded.snapshot() else {
        return;
    };
    let _ = s.check_consistency();
    let bytes = match s.to_pickle() {
        Ok(b) => b,
        Err(e) => panic!("a loaded snapshot does not encode: {e}"),
    };
    let limits = Limits {
        min_node_budget: (data.len() as u64).saturating_mul(32).max(1 << 16),
        ..Limits::default()
    };
    let v = pickle::from_slice_with(&bytes, &limits)
        .unwrap_or_else(|e| panic!("encoded snapshot is not a readable pickle: {e}"));
    let back = Snapshot::from_value(&v)
        .unwrap_or_else(|e| panic!("encoded snapshot does not decode: {e}"));
    if &back != s {
        // NaN != NaN: fall back to comparing the encodings.
        assert_eq!(
            back.to_pickle().expect("re-encode"),
            bytes,
            "round trip changed the snapshot"
        );
    }
});
