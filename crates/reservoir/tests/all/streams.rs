//! record_stream and cross-stream frees on the simulated device (spec 1.10).

use reservoir::caching::BlockState;
use reservoir::trace::TraceAction;
use reservoir::Backend;

use crate::common::*;

#[test]
fn record_stream_delays_reuse_until_the_stream_completes() {
    // spec 1.10 and 6.4: free with record_stream -> active_pending_free until
    // the next malloc after the event completed; trace shows free_requested
    // then, later, free_completed.
    let c = Checked::default_device();
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = c.alloc(MIB);
    c.a.record_stream(p, s1).unwrap();
    c.a.record_stream(p, S0).unwrap(); // the allocation stream: ignored
    dev.hold_stream(s1).unwrap();
    c.free(p);
    let s = c.stats();
    assert_eq!(s.allocation.all().current, 0, "allocation drops at free");
    assert_eq!(s.active.all().current, 1, "still active while pending");
    let seg = &c.segments()[0];
    assert_eq!(seg.blocks[0].state, BlockState::ActivePendingFree);
    // The pending block is not handed out while the stream is busy.
    let q = c.alloc(MIB);
    assert_ne!(q, p);
    dev.release_stream(s1).unwrap();
    let r = c.alloc(512); // process_events frees p's block first
    assert_eq!(r, p, "p's block is reusable once its stream finished");
    let actions: Vec<TraceAction> = c.a.history().iter().map(|e| e.action).collect();
    let fr = actions
        .iter()
        .position(|&a| a == TraceAction::FreeRequested)
        .unwrap();
    let fc = actions
        .iter()
        .position(|&a| a == TraceAction::FreeCompleted)
        .unwrap();
    assert!(
        fc > fr + 1,
        "free_completed comes at a later malloc: {actions:?}"
    );
    assert_eq!(actions[fc + 1], TraceAction::Alloc);
    assert_eq!(c.stats().active.all().current, 2);
}

#[test]
fn empty_cache_synchronizes_pending_frees() {
    // spec 1.9 synchronize_and_free_events: empty_cache waits for every
    // outstanding event (num_sync_all_streams) and then releases the segment.
    let c = Checked::default_device();
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = c.alloc(30 * MIB);
    c.a.record_stream(p, s1).unwrap();
    dev.hold_stream(s1).unwrap();
    c.free(p);
    c.empty_cache();
    let s = c.stats();
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(s.active.all().current, 0);
    assert_eq!(c.reserved(), 0, "the segment was released after the sync");
}

#[test]
fn each_stream_is_reaped_independently() {
    // spec 1.10: no head-of-line blocking across streams.
    let c = Checked::default_device();
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let a = c.alloc(30 * MIB);
    let b = c.alloc(40 * MIB);
    c.a.record_stream(a, s1).unwrap();
    c.a.record_stream(b, s2).unwrap();
    dev.hold_stream(s1).unwrap();
    c.free(a);
    c.free(b);
    c.alloc(512); // reaps s2's event; s1 is still busy
    let states: Vec<BlockState> = c
        .segments()
        .iter()
        .filter(|s| !s.is_small)
        .map(|s| s.blocks[0].state)
        .collect();
    assert!(states.contains(&BlockState::ActivePendingFree));
    assert!(states.contains(&BlockState::Inactive));
}
