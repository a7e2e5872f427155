//! Bytes → the text and JSON readers: the oracle trace parser, the
//! alloc_data JSON reader and the allocatorSim log reader.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reservoir_replay::oracle_trace::Trace;
use reservoir_replay::input;

fuzz_target!(|data: &[u8]| {
    if let Ok(l) = input::load_alloc_data(data) {
        let _ = l.to_trace_input();
    }
    if let Ok(l) = input::load_allocator_sim_log(data) {
        let _ = l.to_trace_input();
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(t) = Trace::parse(text) {
            // What the writer prints, the parser reads back to the same ops.
            let again = Trace::parse(&t.to_text())
                .unwrap_or_else(|e| panic!("re-parse of to_text failed: {e}"));
            assert_eq!(again.ops, t.ops, "text round trip changed the ops");
        }
    }
});
