//! record_stream and cross-stream frees on the simulated device (spec 1.10).

use reservoir::snapshot::{BlockState, SegmentType};
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
        .filter(|s| s.segment_type == SegmentType::Large)
        .map(|s| s.blocks[0].state)
        .collect();
    assert!(states.contains(&BlockState::ActivePendingFree));
    assert!(states.contains(&BlockState::Inactive));
}

#[test]
fn record_stream_on_the_allocation_stream_is_ignored() {
    // spec 1.10: recordStream(block, s) is ignored when s is the block's
    // allocation stream: the free is immediate even while that stream is busy.
    let c = Checked::default_device();
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = c.alloc_on(MIB, s1);
    c.a.record_stream(p, s1).unwrap();
    dev.hold_stream(s1).unwrap();
    let events_before = dev.counters().events_recorded;
    c.free(p);
    assert_eq!(
        dev.counters().events_recorded,
        events_before,
        "no event recorded"
    );
    assert_eq!(c.stats().active.all().current, 0);
    assert_eq!(c.segments()[0].blocks[0].state, BlockState::Inactive);
    assert_eq!(c.alloc_on(MIB, s1), p, "reused on its stream at once");
}

#[test]
fn a_pending_block_stays_active_until_a_malloc_after_its_events() {
    // spec 1.10: the event is only queried at the start of a malloc; between
    // the stream finishing and the next malloc the block stays pending.
    let c = Checked::default_device();
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let p = c.alloc(MIB);
    c.a.record_stream(p, s1).unwrap();
    c.a.record_stream(p, s2).unwrap();
    dev.hold_stream(s1).unwrap();
    dev.hold_stream(s2).unwrap();
    c.free(p);
    dev.release_stream(s1).unwrap();
    c.alloc(512);
    let state = |c: &Checked| {
        c.segments()
            .iter()
            .flat_map(|s| s.blocks.iter())
            .find(|b| b.address == Some(p.0))
            .map(|b| b.state)
            .unwrap()
    };
    assert_eq!(
        state(&c),
        BlockState::ActivePendingFree,
        "one of two events done: still pending"
    );
    dev.release_stream(s2).unwrap();
    assert_eq!(state(&c), BlockState::ActivePendingFree, "no malloc yet");
    let flat = c.flat();
    assert_eq!(flat["active.all.current"], 2);
    c.alloc(512);
    assert_eq!(state(&c), BlockState::Inactive);
    assert_eq!(c.stats().num_sync_all_streams, 0, "never synchronised");
}

#[test]
fn oom_flush_synchronizes_pending_frees_and_retries() {
    // spec 1.9: when the driver is full, release_cached_blocks waits for every
    // outstanding event (num_sync_all_streams + 1), frees the pending block's
    // segment and the retry (num_alloc_retries + 1) succeeds.
    let c = Checked::new("", 40 * MIB);
    let dev = c.a.backend();
    let s1 = dev.create_stream().unwrap();
    let p = c.alloc(30 * MIB);
    c.a.record_stream(p, s1).unwrap();
    dev.hold_stream(s1).unwrap();
    c.free(p);
    let q = c.alloc(32 * MIB); // needs the pending segment's memory
    assert!(!q.is_null());
    let s = c.stats();
    assert_eq!(s.num_sync_all_streams, 1);
    assert_eq!(s.num_alloc_retries, 1);
    assert_eq!(s.num_device_free, 1, "the pending segment went back");
    assert_eq!(s.num_ooms, 0);
    assert!(
        dev.counters().forced_syncs >= 1,
        "the held stream was waited for"
    );
    let actions: Vec<TraceAction> = c.a.history().iter().map(|e| e.action).collect();
    let fc = actions
        .iter()
        .position(|&a| a == TraceAction::FreeCompleted)
        .unwrap();
    assert_eq!(actions[fc + 1], TraceAction::SegmentFree);
}
