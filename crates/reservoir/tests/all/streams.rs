//! record_stream and cross-stream frees on the simulated device (spec 1.10).

use reservoir::observe::snapshot::{BlockState, SegmentType};
use reservoir::observe::trace::TraceAction;
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

/// Issue 29: a stream the device does not know is refused by the call that
/// names it, with a typed error naming the stream, and nothing changes (no
/// counter, no block, no trace entry, no device call).
#[test]
fn an_unknown_stream_is_refused_and_changes_nothing() {
    use reservoir::{AllocError, StreamId};
    for conf in ["", "expandable_segments:True", "policy:reservoir"] {
        let c = Checked::new(conf, 8 * GIB);
        let dev = c.a.backend();
        let s1 = dev.create_stream().unwrap();
        let live = c.alloc_on(MIB, s1);
        let before = (c.flat(), c.segments(), c.a.history().len(), dev.counters());
        for bad in [StreamId(12345), StreamId(u64::MAX), StreamId(s1.0 + 1)] {
            let e = c.a.raw_alloc(16, bad).unwrap_err();
            assert!(
                matches!(&e, AllocError::UnknownStream { stream, message }
                    if *stream == bad && message.contains(&format!("unknown stream {bad}"))),
                "{conf}: {e:?}"
            );
            assert!(e.to_string().contains("nothing was changed"), "{e}");
            let e = c.a.raw_alloc(1 << 62, bad).unwrap_err();
            assert!(
                matches!(e, AllocError::UnknownStream { .. }),
                "before the size: {e}"
            );
            let e = c.a.record_stream(live, bad).unwrap_err();
            assert!(
                matches!(&e, AllocError::UnknownStream { stream, .. } if *stream == bad),
                "{e:?}"
            );
            c.check();
            let after = (c.flat(), c.segments(), c.a.history().len(), dev.counters());
            assert_eq!(after, before, "{conf}: stream {bad} changed something");
        }
        // A stream registered later is known from then on.
        dev.register_stream(StreamId(12345));
        let p = c.alloc_on(16, StreamId(12345));
        c.a.record_stream(p, s1).unwrap();
        c.free(p);
        c.free(live);
        c.empty_cache();
        assert_eq!(c.reserved(), 0);
    }
}

/// The device's limit on streams: `create_stream` past it is an error
/// naming the limit, and the streams made so far keep working.
#[test]
fn the_sim_device_holds_a_bounded_number_of_streams() {
    use reservoir::sim::{SimConfig, SimDevice};
    let dev = SimDevice::new(SimConfig {
        max_streams: 4,
        ..SimConfig::default()
    });
    let made: Vec<_> = (0..3).map(|_| dev.create_stream().unwrap()).collect();
    let e = dev.create_stream().unwrap_err();
    assert!(e.to_string().contains("SimConfig::max_streams = 4"), "{e}");
    assert!(!e.is_retryable());
    assert_eq!(dev.streams().len(), 4);
    let a = reservoir::CachingAllocator::new(dev, reservoir::AllocatorConfig::default());
    for s in made {
        let p = a.raw_alloc(MIB, s).unwrap();
        a.raw_free(p).unwrap();
    }
    assert_eq!(
        reservoir::sim::SimConfig::default().max_streams,
        reservoir::backend::DEFAULT_STREAM_LIMIT
    );
}

/// `StreamShards` refuses an unknown stream before making it a shard (no
/// slot is used), and so does the heap allocator's `record_events`.
#[test]
fn shards_and_the_heap_refuse_unknown_streams() {
    use reservoir::caching::StreamShards;
    use reservoir::heap::{HeapAllocator, UsageFlags};
    use reservoir::sim::SimDevice;
    use reservoir::{AllocError, AllocatorConfig, StreamId};
    let s = StreamShards::with_max_streams(SimDevice::default(), AllocatorConfig::default(), 0, 1)
        .unwrap();
    let e = s.raw_alloc(512, StreamId(9)).unwrap_err();
    assert!(
        matches!(
            e,
            AllocError::UnknownStream {
                stream: StreamId(9),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(s.streams().is_empty(), "no shard for an unknown stream");
    let p = s.raw_alloc(512, StreamId::DEFAULT).unwrap(); // the one slot is still free
    let e = s.record_stream(p, StreamId(9)).unwrap_err();
    assert!(matches!(e, AllocError::UnknownStream { .. }), "{e:?}");
    s.raw_free(p).unwrap();
    s.check_invariants().unwrap();

    let settings = reservoir::config::heap::HeapSettings::new(false);
    let h = HeapAllocator::new(SimDevice::default(), settings).unwrap();
    let b = h.malloc(4096, UsageFlags::PRIVATE).unwrap();
    let before = h.stats();
    let e = h.record_events(&[b], StreamId(77)).unwrap_err();
    assert!(
        matches!(
            e,
            AllocError::UnknownStream {
                stream: StreamId(77),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(h.stats(), before);
    h.free(b).unwrap();
}
