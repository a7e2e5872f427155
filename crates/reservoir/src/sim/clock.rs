//! An asynchronous simulated device: work with durations on a simulated
//! clock, and a race sanitizer.
//!
//! [`AsyncSimDevice`] keeps the memory model of [`SimDevice`] (capacity,
//! addresses, faults) and replaces its streams with a clock:
//!
//! * **Work.** [`AsyncSimDevice::enqueue`] puts a work item of a given
//!   duration on a stream, with the byte ranges it reads and writes
//!   ([`Access`]). Each stream runs its items in order, one at a time: an
//!   item starts when the item before it on its stream has finished (and
//!   not before the time it was enqueued) and finishes `duration` later.
//! * **Events.** [`Backend::record_event`] marks the end of the work
//!   enqueued on the stream so far; the event is complete once the clock
//!   has reached the finish time of that work. Querying never moves the
//!   clock.
//! * **Cross-stream waits.** [`Backend::stream_wait_event`] (and the
//!   inherent [`wait_event`](AsyncSimDevice::wait_event)) make later work
//!   on a stream start no earlier than the event completes.
//! * **Program work.** The [`DeviceWork`] and [`Memcpy`] capabilities
//!   enqueue fills, read-backs, holds and copies as work items with their
//!   byte ranges (no data is kept), so the conformance scenarios of
//!   `reservoir-testkit` run on this device.
//! * **The clock** moves only when told: [`advance`](AsyncSimDevice::advance),
//!   [`run_until`](AsyncSimDevice::run_until),
//!   [`run_until_idle`](AsyncSimDevice::run_until_idle), or a host-side
//!   synchronisation (event, stream, device), which moves it to the moment
//!   the awaited work finishes, as a blocked CPU would see it.
//!
//! Because every item depends only on work enqueued before it, finish times
//! are known when the item is enqueued: the simulation is exact and
//! deterministic.
//!
//! The device has no virtual-memory capability (expandable segments fall
//! back to plain segments on it), so unmapping is never checked.
//!
//! ## The race sanitizer
//!
//! Happens-before is tracked with one vector clock per stream: an event
//! carries its stream's clock, a wait merges it in. Work that has finished
//! (finish time at or before the clock) can no longer race. A
//! [`RaceReport`] is added to [`races`](AsyncSimDevice::races) when
//!
//! * the caching allocator hands out a block
//!   ([`Backend::on_block_handed_out`]) for stream `s` while pending work of
//!   another stream touches its bytes and is not ordered before `s`
//!   ([`RaceKind::HandedOutWhileInUse`]): the block was reused too early;
//! * a segment is freed to the driver ([`Backend::free`]) while pending work
//!   of a stream other than the segment's own touches it, unordered with
//!   the segment's stream ([`RaceKind::DriverFreeWhileInUse`]); the free is
//!   treated as an operation of the segment's stream (like
//!   `clEnqueueSVMFree` on its queue);
//! * a work item touches bytes that pending work of another stream touches,
//!   one of them writing, without ordering ([`RaceKind::DataRace`]).
//!
//! Tests call [`assert_no_races`](AsyncSimDevice::assert_no_races) (or
//! inspect the list) at the end.
//!
//! ```
//! use reservoir::backend::{Backend, DevicePtr};
//! use reservoir::sim::{Access, AsyncSimDevice, RaceKind};
//!
//! let dev = AsyncSimDevice::default();
//! let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
//! let buf = DevicePtr(0x10000);
//! dev.enqueue(s1, 100, &[Access::write(buf, 64)]).unwrap();
//! // s2 reads what s1 is still writing, without waiting for it: a race.
//! dev.enqueue(s2, 10, &[Access::read(buf, 64)]).unwrap();
//! assert_eq!(dev.races()[0].kind, RaceKind::DataRace);
//! // Ordered through an event, the same read is fine.
//! let e = dev.record_event(s1).unwrap();
//! dev.stream_wait_event(s2, e).unwrap();
//! dev.enqueue(s2, 10, &[Access::read(buf, 64)]).unwrap();
//! assert_eq!(dev.races().len(), 1);
//! dev.run_until_idle();
//! assert!(dev.query_event(e).unwrap());
//! ```

use std::fmt;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use super::{SimConfig, SimDevice};
use crate::backend::{
    Backend, BackendError, DevicePtr, DeviceWork, EventId, MemInfo, Memcpy, StreamId,
};

/// How a work item uses a byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// The item only reads the range.
    Read,
    /// The item writes (and may read) the range.
    Write,
}

/// A byte range a work item touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// First byte.
    pub ptr: DevicePtr,
    /// Length in bytes.
    pub len: u64,
    /// Read or write.
    pub kind: AccessKind,
}

impl Access {
    /// A read of `len` bytes at `ptr`.
    pub fn read(ptr: DevicePtr, len: u64) -> Access {
        Access {
            ptr,
            len,
            kind: AccessKind::Read,
        }
    }

    /// A write of `len` bytes at `ptr`.
    pub fn write(ptr: DevicePtr, len: u64) -> Access {
        Access {
            ptr,
            len,
            kind: AccessKind::Write,
        }
    }

    fn overlaps(&self, ptr: u64, len: u64) -> bool {
        self.ptr.0 < ptr.saturating_add(len) && ptr < self.ptr.0.saturating_add(self.len)
    }
}

/// What the race sanitizer found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RaceKind {
    /// The allocator handed out a block while unordered work of another
    /// stream still touched it.
    HandedOutWhileInUse,
    /// A segment went back to the driver while unordered work of another
    /// stream still touched it.
    DriverFreeWhileInUse,
    /// Two work items of different streams touch the same bytes, at least
    /// one writing, with no ordering between them.
    DataRace,
}

/// One finding of the race sanitizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaceReport {
    /// What happened.
    pub kind: RaceKind,
    /// First byte of the range that was handed out, freed or accessed.
    pub ptr: DevicePtr,
    /// Its length.
    pub len: u64,
    /// The stream that received the block, owned the segment, or ran the new work.
    pub stream: StreamId,
    /// The stream of the pending work that still touches the range.
    pub other_stream: StreamId,
    /// That work's number on its stream (1 = first item enqueued there).
    pub other_work: u64,
    /// When that work finishes, in simulated nanoseconds.
    pub other_finish_ns: u64,
    /// The simulated time of the finding.
    pub at_ns: u64,
}

impl fmt::Display for RaceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            RaceKind::HandedOutWhileInUse => "block handed out",
            RaceKind::DriverFreeWhileInUse => "segment freed to the driver",
            RaceKind::DataRace => "work accesses",
        };
        write!(
            f,
            "race at t={} ns: {what} [{}, +{}) on stream {} while work #{} of stream {} \
             (finishing at t={} ns) still touches it with no ordering event",
            self.at_ns,
            self.ptr,
            self.len,
            self.stream,
            self.other_work,
            self.other_stream,
            self.other_finish_ns
        )
    }
}

/// A work item not yet known to have finished.
#[derive(Clone, Debug)]
struct Pending {
    stream: usize,
    seq: u64,
    finish: u64,
    accesses: Vec<Access>,
}

#[derive(Clone, Debug)]
struct Stream {
    id: StreamId,
    /// Work items enqueued so far.
    seq: u64,
    /// When the last item enqueued (or waited for) finishes.
    tail: u64,
    /// `vc[j]`: the last item of stream `j` ordered before this stream's
    /// next item.
    vc: Vec<u64>,
}

#[derive(Clone, Debug)]
struct Event {
    finish: u64,
    vc: Vec<u64>,
}

#[derive(Debug, Default)]
struct ClockState {
    now: u64,
    streams: Vec<Stream>,
    by_id: FxHashMap<u64, usize>,
    next_stream: u64,
    events: FxHashMap<u64, Event>,
    next_event: u64,
    pending: Vec<Pending>,
    /// Stream a live driver allocation was made for.
    segments: FxHashMap<u64, usize>,
    races: Vec<RaceReport>,
    sanitizer: bool,
    work_items: u64,
    busy_ns: u64,
}

impl ClockState {
    fn add_stream(&mut self, id: StreamId) -> usize {
        let i = self.streams.len();
        for s in &mut self.streams {
            s.vc.push(0);
        }
        self.streams.push(Stream {
            id,
            seq: 0,
            tail: 0,
            vc: vec![0; i + 1],
        });
        self.by_id.insert(id.0, i);
        i
    }

    fn index(&self, s: StreamId) -> Result<usize, BackendError> {
        self.by_id.get(&s.0).copied().ok_or_else(|| {
            BackendError::InvalidValue(format!("unknown stream {s} on the async sim device"))
        })
    }

    fn event(&self, e: EventId) -> Result<&Event, BackendError> {
        self.events.get(&e.0).ok_or_else(|| {
            BackendError::InvalidValue(format!("unknown event {} on the async sim device", e.0))
        })
    }

    fn set_now(&mut self, t: u64) {
        if t > self.now {
            self.now = t;
        }
        let now = self.now;
        self.pending.retain(|p| p.finish > now);
    }

    /// Pending work of other streams than `i` that overlaps the range, is
    /// not ordered before stream `i`'s next item, and (when `write` is
    /// `Some`) conflicts with an access of that kind.
    fn unordered(&self, i: usize, ptr: u64, len: u64, write: Option<bool>) -> Option<&Pending> {
        let vc = &self.streams[i].vc;
        self.pending.iter().find(|p| {
            p.stream != i
                && p.finish > self.now
                && vc[p.stream] < p.seq
                && p.accesses.iter().any(|a| {
                    a.overlaps(ptr, len)
                        && match write {
                            None => true,
                            Some(w) => w || a.kind == AccessKind::Write,
                        }
                })
        })
    }

    fn report(&mut self, kind: RaceKind, ptr: u64, len: u64, i: usize, write: Option<bool>) {
        if !self.sanitizer {
            return;
        }
        if let Some(p) = self.unordered(i, ptr, len, write) {
            let r = RaceReport {
                kind,
                ptr: DevicePtr(ptr),
                len,
                stream: self.streams[i].id,
                other_stream: self.streams[p.stream].id,
                other_work: p.seq,
                other_finish_ns: p.finish,
                at_ns: self.now,
            };
            tracing::warn!("{r}");
            self.races.push(r);
        }
    }
}

/// The asynchronous simulated device. See the module documentation of `sim::clock`.
pub struct AsyncSimDevice {
    memory: SimDevice,
    state: Mutex<ClockState>,
}

impl Default for AsyncSimDevice {
    fn default() -> Self {
        AsyncSimDevice::new(SimConfig::default())
    }
}

impl fmt::Debug for AsyncSimDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.state.lock();
        f.debug_struct("AsyncSimDevice")
            .field("now_ns", &st.now)
            .field("streams", &st.streams.len())
            .field("pending", &st.pending.len())
            .field("races", &st.races.len())
            .finish_non_exhaustive()
    }
}

impl AsyncSimDevice {
    /// A device whose memory behaves as `SimDevice::new(config)`, with the
    /// clock at 0, only the default stream, and the sanitizer on.
    pub fn new(config: SimConfig) -> Self {
        let mut st = ClockState {
            next_stream: 1,
            next_event: 1,
            sanitizer: true,
            ..ClockState::default()
        };
        st.add_stream(StreamId::DEFAULT);
        AsyncSimDevice {
            memory: SimDevice::new(config),
            state: Mutex::new(st),
        }
    }

    /// The memory model underneath (counters, capacity, fault injection).
    /// Its own streams are not used.
    pub fn memory(&self) -> &SimDevice {
        &self.memory
    }

    /// Turn the race sanitizer on (the default) or off.
    pub fn set_sanitizer(&self, on: bool) {
        self.state.lock().sanitizer = on;
    }

    /// Enqueue a work item of `duration_ns` on `stream` that touches
    /// `accesses`. Returns its finish time. The sanitizer checks it against
    /// pending work of other streams ([`RaceKind::DataRace`]).
    pub fn enqueue(
        &self,
        stream: StreamId,
        duration_ns: u64,
        accesses: &[Access],
    ) -> Result<u64, BackendError> {
        let mut st = self.state.lock();
        let i = st.index(stream)?;
        for a in accesses {
            st.report(
                RaceKind::DataRace,
                a.ptr.0,
                a.len,
                i,
                Some(a.kind == AccessKind::Write),
            );
        }
        let now = st.now;
        let s = &mut st.streams[i];
        s.seq += 1;
        s.vc[i] = s.seq;
        s.tail = s.tail.max(now).saturating_add(duration_ns);
        let (seq, finish) = (s.seq, s.tail);
        st.work_items += 1;
        st.busy_ns = st.busy_ns.saturating_add(duration_ns);
        if finish > now && !accesses.is_empty() {
            st.pending.push(Pending {
                stream: i,
                seq,
                finish,
                accesses: accesses.to_vec(),
            });
        }
        Ok(finish)
    }

    /// Make later work on `stream` wait for `event` (`cudaStreamWaitEvent`).
    pub fn wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        let i = st.index(stream)?;
        let ev = st.event(event)?.clone();
        let s = &mut st.streams[i];
        s.tail = s.tail.max(ev.finish);
        for (mine, theirs) in s.vc.iter_mut().zip(&ev.vc) {
            *mine = (*mine).max(*theirs);
        }
        Ok(())
    }

    /// The simulated time in nanoseconds.
    pub fn now(&self) -> u64 {
        self.state.lock().now
    }

    /// Move the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        let mut st = self.state.lock();
        let t = st.now.saturating_add(ns);
        st.set_now(t);
    }

    /// Move the clock to `t` (no effect if it is already later).
    pub fn run_until(&self, t: u64) {
        self.state.lock().set_now(t);
    }

    /// Move the clock to when every stream has finished its work.
    pub fn run_until_idle(&self) {
        let mut st = self.state.lock();
        let t = st.streams.iter().map(|s| s.tail).max().unwrap_or(0);
        st.set_now(t);
    }

    /// When the work enqueued on `stream` so far finishes.
    pub fn stream_finish(&self, stream: StreamId) -> Result<u64, BackendError> {
        let st = self.state.lock();
        Ok(st.streams[st.index(stream)?].tail)
    }

    /// Work items with byte ranges that have not finished yet.
    pub fn pending_work(&self) -> usize {
        let st = self.state.lock();
        st.pending.iter().filter(|p| p.finish > st.now).count()
    }

    /// Work items enqueued so far, and their total duration.
    pub fn work_done(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.work_items, st.busy_ns)
    }

    /// Every race found so far, oldest first.
    pub fn races(&self) -> Vec<RaceReport> {
        self.state.lock().races.clone()
    }

    /// Take the races found so far, leaving the list empty.
    pub fn take_races(&self) -> Vec<RaceReport> {
        std::mem::take(&mut self.state.lock().races)
    }

    /// Panic with every report if the sanitizer found a race.
    ///
    /// # Panics
    ///
    /// When [`races`](Self::races) is not empty.
    pub fn assert_no_races(&self) {
        let races = self.races();
        if !races.is_empty() {
            let lines: Vec<String> = races.iter().map(|r| r.to_string()).collect();
            panic!("{} race(s):\n{}", races.len(), lines.join("\n"));
        }
    }
}

impl Backend for AsyncSimDevice {
    fn name(&self) -> &'static str {
        "async-sim"
    }

    fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr, BackendError> {
        let mut st = self.state.lock();
        let i = st.index(stream)?;
        let ptr = self.memory.allocate(size, stream)?;
        st.segments.insert(ptr.0, i);
        Ok(ptr)
    }

    /// Free a segment; see [`RaceKind::DriverFreeWhileInUse`].
    fn free(&self, ptr: DevicePtr, size: u64) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        self.memory.free(ptr, size)?;
        let i = st.segments.remove(&ptr.0).unwrap_or(0);
        st.report(RaceKind::DriverFreeWhileInUse, ptr.0, size, i, None);
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        self.memory.mem_info()
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        let mut st = self.state.lock();
        while st.by_id.contains_key(&st.next_stream) {
            st.next_stream += 1;
        }
        let id = StreamId(st.next_stream);
        st.next_stream += 1;
        st.add_stream(id);
        Ok(id)
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        self.state.lock().index(stream).map(|_| ())
    }

    fn record_event(&self, stream: StreamId) -> Result<EventId, BackendError> {
        let mut st = self.state.lock();
        let i = st.index(stream)?;
        let ev = Event {
            finish: st.streams[i].tail,
            vc: st.streams[i].vc.clone(),
        };
        let id = st.next_event;
        st.next_event += 1;
        st.events.insert(id, ev);
        Ok(EventId(id))
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        let st = self.state.lock();
        Ok(st.event(event)?.finish <= st.now)
    }

    /// Moves the clock to the event's completion.
    fn synchronize_event(&self, event: EventId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        let t = st.event(event)?.finish;
        st.set_now(t);
        Ok(())
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        st.event(event)?;
        st.events.remove(&event.0);
        Ok(())
    }

    /// Moves the clock to when the stream's work so far finishes.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        let mut st = self.state.lock();
        let t = st.streams[st.index(stream)?].tail;
        st.set_now(t);
        Ok(())
    }

    fn synchronize_device(&self) -> Result<(), BackendError> {
        self.run_until_idle();
        Ok(())
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        self.wait_event(stream, event)
    }

    fn on_block_handed_out(&self, ptr: DevicePtr, size: u64, stream: StreamId) {
        let mut st = self.state.lock();
        if let Ok(i) = st.index(stream) {
            st.report(RaceKind::HandedOutWhileInUse, ptr.0, size, i, None);
        }
    }

    fn as_memcpy(&self) -> Option<&dyn Memcpy> {
        Some(self)
    }

    fn as_device_work(&self) -> Option<&dyn DeviceWork> {
        Some(self)
    }
}

/// Simulated durations of [`DeviceWork`] and [`Memcpy`] operations: 1 us plus 1 ns per
/// 16 bytes (about 16 GB/s).
fn work_ns(len: u64) -> u64 {
    1_000 + len / 16
}

/// How long a [`DeviceWork::hold`] keeps a stream busy: one simulated second.
pub const HOLD_NS: u64 = 1_000_000_000;

impl Memcpy for AsyncSimDevice {
    /// A work item reading `src` and writing `dst`.
    fn copy(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.enqueue(
            stream,
            work_ns(len),
            &[Access::read(src, len), Access::write(dst, len)],
        )
        .map(drop)
    }
}

impl DeviceWork for AsyncSimDevice {
    /// A work item writing the range (no data is kept).
    fn fill(
        &self,
        ptr: DevicePtr,
        len: u64,
        _byte: u8,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        self.enqueue(stream, work_ns(len), &[Access::write(ptr, len)])
            .map(drop)
    }

    /// A work item reading the range, then a host wait for the stream; `None`.
    fn read_checksum(
        &self,
        ptr: DevicePtr,
        len: u64,
        stream: StreamId,
    ) -> Result<Option<u64>, BackendError> {
        self.enqueue(stream, work_ns(len), &[Access::read(ptr, len)])?;
        Backend::synchronize_stream(self, stream)?;
        Ok(None)
    }

    /// A work item of [`HOLD_NS`] with no byte ranges.
    fn hold(&self, stream: StreamId) -> Result<(), BackendError> {
        self.enqueue(stream, HOLD_NS, &[]).map(drop)
    }

    /// Runs the clock to the end of the stream's work.
    fn release(&self, stream: StreamId) -> Result<(), BackendError> {
        Backend::synchronize_stream(self, stream)
    }

    fn let_time_pass(&self, ns: u64) {
        self.advance(ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev() -> (AsyncSimDevice, StreamId, StreamId) {
        let d = AsyncSimDevice::default();
        let a = d.create_stream().unwrap();
        let b = d.create_stream().unwrap();
        (d, a, b)
    }

    #[test]
    fn streams_run_in_order_and_events_follow_the_clock() {
        let (d, a, b) = dev();
        assert_eq!(d.enqueue(a, 100, &[]).unwrap(), 100);
        assert_eq!(d.enqueue(a, 50, &[]).unwrap(), 150, "in order on a stream");
        assert_eq!(
            d.enqueue(b, 30, &[]).unwrap(),
            30,
            "streams run concurrently"
        );
        let ea = d.record_event(a).unwrap();
        let eb = d.record_event(b).unwrap();
        assert!(!d.query_event(ea).unwrap());
        d.advance(30);
        assert!(d.query_event(eb).unwrap());
        assert!(!d.query_event(ea).unwrap());
        d.run_until(149);
        assert!(!d.query_event(ea).unwrap());
        d.advance(1);
        assert!(d.query_event(ea).unwrap());
        // Work enqueued on an idle stream starts now, not at its old tail.
        assert_eq!(d.enqueue(b, 5, &[]).unwrap(), 155);
    }

    #[test]
    fn a_wait_delays_later_work_until_the_event() {
        let (d, a, b) = dev();
        d.enqueue(a, 100, &[]).unwrap();
        let e = d.record_event(a).unwrap();
        d.wait_event(b, e).unwrap();
        assert_eq!(d.enqueue(b, 10, &[]).unwrap(), 110);
        let eb = d.record_event(b).unwrap();
        d.synchronize_event(eb).unwrap();
        assert_eq!(
            d.now(),
            110,
            "a host sync moves the clock to the completion"
        );
        assert!(d.query_event(e).unwrap());
    }

    #[test]
    fn synchronisations_move_the_clock() {
        let (d, a, b) = dev();
        d.enqueue(a, 70, &[]).unwrap();
        d.enqueue(b, 90, &[]).unwrap();
        d.synchronize_stream(a).unwrap();
        assert_eq!(d.now(), 70);
        d.synchronize_device().unwrap();
        assert_eq!(d.now(), 90);
        d.synchronize_stream(a).unwrap();
        assert_eq!(d.now(), 90, "the clock never goes back");
    }

    #[test]
    fn sanitizer_reports_unordered_conflicts_only() {
        let (d, a, b) = dev();
        let p = DevicePtr(0x1000);
        d.enqueue(a, 100, &[Access::write(p, 100)]).unwrap();
        // Disjoint bytes: fine.
        d.enqueue(b, 10, &[Access::write(p.offset(100), 10)])
            .unwrap();
        assert!(d.races().is_empty());
        // Read/read is no conflict.
        d.enqueue(a, 10, &[Access::read(p.offset(200), 8)]).unwrap();
        d.enqueue(b, 10, &[Access::read(p.offset(200), 8)]).unwrap();
        assert!(d.races().is_empty());
        // Overlapping write while a's write is pending.
        d.enqueue(b, 10, &[Access::read(p.offset(99), 2)]).unwrap();
        let r = d.take_races();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].kind, RaceKind::DataRace);
        assert_eq!((r[0].stream, r[0].other_stream, r[0].other_work), (b, a, 1));
        assert!(r[0].to_string().contains("no ordering event"));
        // After the clock passed a's work it cannot race any more.
        d.run_until(100);
        d.enqueue(b, 10, &[Access::write(p, 100)]).unwrap();
        assert!(d.races().is_empty());
    }

    #[test]
    fn ordering_is_transitive_through_events() {
        let d = AsyncSimDevice::default();
        let [a, b, c] = [(); 3].map(|_| d.create_stream().unwrap());
        let p = DevicePtr(0x1000);
        d.enqueue(a, 100, &[Access::write(p, 8)]).unwrap();
        let ea = d.record_event(a).unwrap();
        d.wait_event(b, ea).unwrap();
        d.enqueue(b, 1, &[]).unwrap();
        let eb = d.record_event(b).unwrap();
        d.wait_event(c, eb).unwrap();
        d.enqueue(c, 1, &[Access::write(p, 8)]).unwrap();
        assert!(d.races().is_empty(), "{:?}", d.races());
        // An event recorded before the work does not order it.
        d.run_until_idle();
        let early = d.record_event(a).unwrap();
        d.enqueue(a, 100, &[Access::write(p, 8)]).unwrap();
        d.wait_event(b, early).unwrap();
        d.enqueue(b, 1, &[Access::read(p, 8)]).unwrap();
        assert_eq!(d.races().len(), 1);
    }

    #[test]
    fn hand_out_and_driver_free_are_checked() {
        let (d, a, b) = dev();
        let p = d.allocate(4096, a).unwrap();
        d.enqueue(b, 50, &[Access::read(p, 16)]).unwrap();
        d.on_block_handed_out(p, 4096, b); // same stream as the work: fine
        assert!(d.races().is_empty());
        d.on_block_handed_out(p, 4096, a);
        d.free(p, 4096).unwrap();
        let kinds: Vec<RaceKind> = d.races().iter().map(|r| r.kind).collect();
        assert_eq!(
            kinds,
            [
                RaceKind::HandedOutWhileInUse,
                RaceKind::DriverFreeWhileInUse
            ]
        );
        d.set_sanitizer(false);
        d.enqueue(a, 1, &[Access::write(DevicePtr(p.0), 16)])
            .unwrap();
        assert_eq!(
            d.races().len(),
            2,
            "nothing is checked with the sanitizer off"
        );
    }

    #[test]
    fn unknown_streams_and_events_are_errors() {
        let d = AsyncSimDevice::default();
        let e = d.enqueue(StreamId(99), 1, &[]).unwrap_err();
        assert!(e.to_string().contains("unknown stream 99"), "{e}");
        let e = d.query_event(EventId(7)).unwrap_err();
        assert!(e.to_string().contains("unknown event 7"), "{e}");
        let ev = d.record_event(StreamId::DEFAULT).unwrap();
        d.destroy_event(ev).unwrap();
        assert!(d.destroy_event(ev).is_err());
    }
}
