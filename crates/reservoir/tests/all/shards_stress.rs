//! `StreamShards` under threads on the asynchronous simulated device with
//! the race sanitizer (spec 1.10: a block freed after use on other streams
//! is reused only once their work has completed): N threads, each
//! allocating on its own stream, writing its blocks with device work,
//! handing some blocks to another thread that reads them on its own stream
//! (event wait + `record_stream`) and frees them. Every thread checks its
//! shard's invariants as it goes; between phases every shard is checked and
//! the sanitizer must have seen no race. A negative control shows the
//! sanitizer reports the race a missing `record_stream` causes.

use std::sync::{Barrier, Mutex};

use reservoir::caching::StreamShards;
use reservoir::rng::SplitMix64;
use reservoir::sim::{Access, AsyncSimDevice, RaceKind, SimConfig};
use reservoir::{AllocatorConfig, Backend, DevicePtr, EventId, StreamId};

const THREADS: usize = 4;
const PHASES: usize = 3;
const OPS_PER_PHASE: usize = 1500;
const LIVE: usize = 24;

fn device() -> AsyncSimDevice {
    AsyncSimDevice::new(SimConfig {
        capacity: 8 << 30,
        ..SimConfig::default()
    })
}

/// A block handed to another thread: its pointer and size, and the event
/// after its owner's last write.
struct Parcel {
    ptr: DevicePtr,
    size: u64,
    written: EventId,
}

/// Take the blocks other threads handed to this one: read each on `me`
/// after its owner's write, record `me` on it and free it. Returns how many.
fn receive(
    shards: &StreamShards<AsyncSimDevice>,
    me: StreamId,
    mailbox: &Mutex<Vec<Parcel>>,
) -> u64 {
    let dev = shards.backend();
    let parcels = std::mem::take(&mut *mailbox.lock().unwrap());
    let n = parcels.len() as u64;
    for parcel in parcels {
        dev.stream_wait_event(me, parcel.written).unwrap();
        dev.enqueue(me, 500, &[Access::read(parcel.ptr, parcel.size)])
            .unwrap();
        shards.record_stream(parcel.ptr, me).unwrap();
        shards.raw_free(parcel.ptr).unwrap();
        dev.destroy_event(parcel.written).unwrap();
    }
    n
}

#[test]
fn threads_on_their_own_streams_with_cross_thread_frees_have_no_races() {
    let dev = device();
    let streams: Vec<StreamId> = (0..THREADS).map(|_| dev.create_stream().unwrap()).collect();
    let shards = StreamShards::new(dev, AllocatorConfig::default()).unwrap();
    let mailboxes: Vec<Mutex<Vec<Parcel>>> = (0..THREADS).map(|_| Mutex::new(Vec::new())).collect();
    let barrier = Barrier::new(THREADS + 1);
    let totals = Mutex::new((0u64, 0u64)); // (cross-thread frees, record_streams)
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (shards, streams, mailboxes, barrier, totals) =
                (&shards, &streams, &mailboxes, &barrier, &totals);
            s.spawn(move || {
                let me = streams[t];
                let dev = shards.backend();
                let mut rng = SplitMix64::new(t as u64 + 11);
                let mut live: Vec<(DevicePtr, u64)> = Vec::new();
                let (mut cross, mut recorded) = (0u64, 0u64);
                for _ in 0..PHASES {
                    for op in 0..OPS_PER_PHASE {
                        // Blocks from other threads.
                        let n = receive(shards, me, &mailboxes[t]);
                        cross += n;
                        recorded += n;
                        let roll = rng.next_u64() % 10;
                        if live.len() >= LIVE || (roll < 3 && !live.is_empty()) {
                            let at = (rng.next_u64() % live.len() as u64) as usize;
                            let (ptr, size) = live.swap_remove(at);
                            if roll == 0 {
                                // Hand it to the next thread.
                                let written = dev.record_event(me).unwrap();
                                let to = (t + 1) % THREADS;
                                mailboxes[to]
                                    .lock()
                                    .unwrap()
                                    .push(Parcel { ptr, size, written });
                            } else {
                                shards.raw_free(ptr).unwrap();
                            }
                        } else {
                            let bits = 9 + rng.next_u64() % 13;
                            let size = (1u64 << bits) + rng.next_u64() % (1u64 << bits);
                            let ptr = shards.raw_alloc(size, me).unwrap();
                            dev.enqueue(
                                me,
                                200 + rng.next_u64() % 2000,
                                &[Access::write(ptr, size)],
                            )
                            .unwrap();
                            live.push((ptr, size));
                        }
                        if rng.next_u64() % 8 == 0 {
                            dev.advance(rng.next_u64() % 3000);
                        }
                        if op % 8 == 0 {
                            shards.check_stream_invariants(me).unwrap();
                        }
                    }
                    barrier.wait(); // phase ends: the main thread checks
                    barrier.wait();
                }
                // Drain: free what is left, including parcels still arriving.
                for (ptr, _) in live.drain(..) {
                    shards.raw_free(ptr).unwrap();
                }
                barrier.wait();
                // Parcels still arriving.
                let n = receive(shards, me, &mailboxes[t]);
                cross += n;
                recorded += n;
                let mut tot = totals.lock().unwrap();
                tot.0 += cross;
                tot.1 += recorded;
            });
        }
        for phase in 0..PHASES {
            barrier.wait();
            shards.check_invariants().unwrap();
            let races = shards.backend().races();
            assert!(races.is_empty(), "phase {phase}: {races:?}");
            barrier.wait();
        }
        barrier.wait();
    });
    shards.backend().run_until_idle();
    shards.empty_cache().unwrap();
    shards.check_invariants().unwrap();
    shards.backend().assert_no_races();
    let st = shards.stats();
    assert_eq!(st.allocation.all().current, 0);
    assert_eq!(st.reserved_bytes.all().current, 0);
    assert_eq!(shards.streams().len(), THREADS);
    let (cross, recorded) = *totals.lock().unwrap();
    assert!(cross > 100 && recorded > 100, "{cross} cross-thread frees");
    eprintln!(
        "shards stress: {THREADS} threads x {} ops, {cross} cross-thread frees with record_stream, \
         {} allocations, 0 races",
        PHASES * OPS_PER_PHASE,
        st.allocation.all().allocated
    );
}

#[test]
fn negative_control_a_missing_record_stream_is_reported() {
    // The same hand-over without record_stream: the owner's shard reuses
    // the block while the other stream still reads it.
    let dev = device();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let shards = StreamShards::new(dev, AllocatorConfig::default()).unwrap();
    let dev = shards.backend();
    let p = shards.raw_alloc(1 << 20, s1).unwrap();
    dev.enqueue(s1, 100, &[Access::write(p, 1 << 20)]).unwrap();
    let e = dev.record_event(s1).unwrap();
    dev.stream_wait_event(s2, e).unwrap();
    dev.enqueue(s2, 1_000_000, &[Access::read(p, 1 << 20)])
        .unwrap();
    shards.raw_free(p).unwrap(); // no record_stream(p, s2)
    let q = shards.raw_alloc(1 << 20, s1).unwrap();
    assert_eq!(q, p, "reused at once");
    let races = dev.races();
    assert_eq!(races.len(), 1, "{races:?}");
    assert_eq!(races[0].kind, RaceKind::HandedOutWhileInUse);
    assert_eq!(races[0].other_stream, s2);
    shards.raw_free(q).unwrap();
}
