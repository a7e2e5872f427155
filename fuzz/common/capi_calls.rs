//! The body of the `capi_calls` fuzz target, shared with its stable replay
//! test (`crates/reservoir-capi/tests/fuzz_capi_calls.rs`, which includes
//! this file with `#[path]`).
//!
//! The input is decoded with `arbitrary` into a sequence of [`Op`]s, each
//! one call (or a few) of the C ABI of `reservoir-capi` on one of up to
//! [`MAX_LIVE`] handles on the simulated device (sometimes host memory),
//! with valid, freed, foreign, interior, null and made-up pointers, streams
//! and handles. A model of each handle (its live pointers and sizes, its
//! streams) decides which statuses the header allows for each call; after
//! every call:
//!
//! * the status is one the header documents for that call and those
//!   arguments (never `RESERVOIR_ERR_PANIC` or `RESERVOIR_ERR_POISONED`);
//! * `reservoir_last_error()` is a NUL-terminated UTF-8 string: empty after
//!   success; after a failure non-empty, starting with the function's name,
//!   and at most [`MESSAGE_SLACK`] bytes plus 8 bytes per byte of text the
//!   caller passed in (config, key, path);
//! * the handle's statistics hold together: `requested <= active`,
//!   `allocated <= active <= reserved <= capacity`, `allocation.all.current`
//!   is the number of live pointers, `allocated_bytes` and `requested_bytes`
//!   are at least their sizes' sum (a block freed while a recorded stream
//!   still uses it keeps its requested bytes until released, as in
//!   PyTorch), no segment without reserved bytes;
//! * a failed call changes no statistic (an out-of-memory error may only
//!   release: pending frees complete and cached segments go back, so
//!   `active`, `requested` and `reserved` may shrink; `allocated` and the
//!   allocation count stay);
//! * a pointer handed out is non-null, 512-byte aligned and overlaps no live
//!   block of its handle (on host memory, a tag written at both ends of each
//!   block must still be there when it is freed);
//! * freeing every live pointer and emptying the cache leaves nothing
//!   allocated, requested, active or reserved (run by [`Op::FreeAll`] and at the end of
//!   every input, before each handle is destroyed).
//!
//! Streams: the header says the simulated and host devices take stream ids
//! from `reservoir_allocator_create_stream`, so an id the handle never made
//! must be refused with `RESERVOIR_ERR_INVALID_ARGUMENT` (issue 29 item 2).
//! Setting `RESERVOIR_FUZZ_SKIP_UNKNOWN_STREAMS=1` replaces every unknown
//! stream id by the default stream instead, so that a run can explore past
//! that known bug; the check itself is never relaxed.

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::PathBuf;

use arbitrary::{Arbitrary, Unstructured};
use reservoir_capi::{
    reservoir_allocator_alloc, reservoir_allocator_create, reservoir_allocator_create_stream,
    reservoir_allocator_destroy, reservoir_allocator_empty_cache, reservoir_allocator_free,
    reservoir_allocator_memory_fraction, reservoir_allocator_record_history,
    reservoir_allocator_record_stream, reservoir_allocator_set_memory_fraction,
    reservoir_allocator_snapshot, reservoir_allocator_stat, reservoir_allocator_stat_at,
    reservoir_allocator_stats_count, reservoir_last_error, reservoir_status_name,
    ReservoirAllocator, ReservoirStatus,
};
use ReservoirStatus::*;

// Explicit paths: this file is itself included with `#[path]`.
#[path = "capi_calls/calls.rs"]
mod calls;
#[path = "capi_calls/input.rs"]
mod input;

pub use input::*;

/// At most this many ops of one input are run (the rest is ignored).
pub const MAX_OPS: usize = 512;
/// At most this many handles are alive at once; a `Create` beyond it is
/// checked and destroyed at once.
pub const MAX_LIVE: usize = 4;
/// A failure message may be this long plus 8 bytes per byte of caller text.
pub const MESSAGE_SLACK: usize = 4096;
/// The low 16 bits of every handle token (`handle.rs`).
const MAGIC: u64 = 0x5e5e;
const MIB: u64 = 1 << 20;

/// Settings strings that parse, to reach the allocator's policies quickly.
const CONFIGS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:20",
    "max_split_size_mb:40,roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:1,2:2,>:8]",
    "garbage_collection_threshold:0.5",
    "per_process_memory_fraction:0.5",
    "large_segment_size_mb:2",
    "policy:reservoir",
    "policy:cross_stream_reuse",
    "policy:pytorch,expandable_segments:True",
    "policy:reservoir,max_split_size_mb:64",
    "expandable_segments:True,per_process_memory_fraction:0.25",
    "backend:cudaMallocAsync",
    "throw_on_cudamalloc_oom:True",
    "max_non_split_rounding_mb:40",
];

/// Statistic keys that exist, and near misses.
const STAT_KEYS: &[&str] = &[
    "allocated_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.large_pool.freed",
    "requested_bytes.small_pool.allocated",
    "num_ooms",
    "num_alloc_retries",
    "segment.all.current",
    "inactive_split.all.current",
    "max_split_size",
    "oversize_allocations.current",
    "allocated_bytes.all",
    "allocated_bytes.all.current ",
    "",
    "ALLOCATED_BYTES.ALL.CURRENT",
];

/// Decode `data` as libFuzzer's `fuzz_target!(|ops: Vec<Op>| ...)` does and
/// run it. Inputs that do not decode are ignored, as libFuzzer does.
pub fn run_bytes(data: &[u8]) {
    let Ok(ops) = Vec::<Op>::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    run(&ops);
}

/// Run `ops` (at most [`MAX_OPS`] of them) and check every call; panics
/// with the op's index and a description on the first violation.
pub fn run(ops: &[Op]) {
    let mut r = Runner::new();
    for (i, op) in ops.iter().take(MAX_OPS).enumerate() {
        r.op_index = i;
        if r.trace {
            eprintln!("op {i}: {op:?}");
        }
        r.op(op);
    }
    r.finish();
}

/// What the model knows of one handle.
struct Model {
    h: *mut ReservoirAllocator,
    live: bool,
    host: bool,
    /// The capacity the device was given (`None`: its default).
    capacity: Option<u64>,
    streams: Vec<u64>,
    /// Live blocks: address → (size, tag written at both ends on host).
    blocks: BTreeMap<u64, (u64, u64)>,
    freed: Vec<u64>,
    /// The statistics as the last check read them (each handle changes
    /// only through calls on it, each of which ends with a check).
    last: std::cell::Cell<Option<Stats>>,
}

/// The statistics the checks read (each read costs a full
/// `memory_stats()` in the library, so only these).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stats {
    allocated: i64,
    active: i64,
    reserved: i64,
    requested: i64,
    allocations: i64,
    segments: i64,
    inactive_split: i64,
}

const STAT_NAMES: [&CStr; 7] = [
    c"allocated_bytes.all.current",
    c"active_bytes.all.current",
    c"reserved_bytes.all.current",
    c"requested_bytes.all.current",
    c"allocation.all.current",
    c"segment.all.current",
    c"inactive_split_bytes.all.current",
];

struct Runner {
    handles: Vec<Model>,
    op_index: usize,
    dir: PathBuf,
    next_tag: u64,
    skip_unknown_streams: bool,
    /// `RESERVOIR_FUZZ_TRACE=1`: print every op and every call's status.
    trace: bool,
}

/// The bad-handle status a call must answer for `h` (`None`: `h` is live).
fn handle_error(
    h: *mut ReservoirAllocator,
    live: &[*mut ReservoirAllocator],
) -> Option<ReservoirStatus> {
    if h.is_null() {
        Some(RESERVOIR_ERR_NULL_HANDLE)
    } else if live.contains(&h) {
        None
    } else {
        Some(RESERVOIR_ERR_INVALID_HANDLE)
    }
}

/// `text` as a C string, cut at its first NUL.
fn c_text(text: &[u8]) -> CString {
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    CString::new(&text[..end]).expect("no NUL left")
}

impl Runner {
    fn new() -> Runner {
        // One folder per runner: tests run several at once in one process.
        static RUNNERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = RUNNERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("reservoir-fuzz-capi-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temporary folder");
        Runner {
            handles: Vec::new(),
            op_index: 0,
            dir,
            next_tag: 0x7a61_0000_0000_0000,
            skip_unknown_streams: std::env::var_os("RESERVOIR_FUZZ_SKIP_UNKNOWN_STREAMS")
                .is_some_and(|v| v != "0" && !v.is_empty()),
            trace: std::env::var_os("RESERVOIR_FUZZ_TRACE")
                .is_some_and(|v| v != "0" && !v.is_empty()),
        }
    }

    fn fail(&self, what: String) -> ! {
        panic!("capi_calls op {}: {what}", self.op_index)
    }

    fn live_tokens(&self) -> Vec<*mut ReservoirAllocator> {
        self.handles
            .iter()
            .filter(|m| m.live)
            .map(|m| m.h)
            .collect()
    }

    /// The handle `r` names, and the index of its model when live.
    fn resolve(&self, r: HandleRef) -> (*mut ReservoirAllocator, Option<usize>) {
        let live: Vec<usize> = (0..self.handles.len())
            .filter(|&i| self.handles[i].live)
            .collect();
        let dead: Vec<usize> = (0..self.handles.len())
            .filter(|&i| !self.handles[i].live)
            .collect();
        let token: u64 = match r {
            HandleRef::Live(i) if !live.is_empty() => {
                self.handles[live[i as usize % live.len()]].h as usize as u64
            }
            HandleRef::Live(_) | HandleRef::Null => 0,
            HandleRef::Destroyed(i) if !dead.is_empty() => {
                self.handles[dead[i as usize % dead.len()]].h as usize as u64
            }
            // A token of the right shape whose generation was never handed out.
            HandleRef::Destroyed(i) => ((u64::MAX >> 20) - u64::from(i)) << 16 | MAGIC,
            HandleRef::Garbage(x) => x,
        };
        let h = token as usize as *mut ReservoirAllocator;
        let idx = self.handles.iter().position(|m| m.live && m.h == h);
        (h, idx)
    }

    /// Check `status` is in `allowed` and the last error matches it.
    fn check(
        &self,
        func: &str,
        status: ReservoirStatus,
        allowed: &[ReservoirStatus],
        caller_text: usize,
    ) {
        // SAFETY: reservoir_last_error returns a NUL-terminated string owned
        // by the library, valid until this thread's next call.
        let msg = unsafe { CStr::from_ptr(reservoir_last_error()) };
        let msg = match msg.to_str() {
            Ok(m) => m,
            Err(e) => self.fail(format!("{func}: last error is not UTF-8 ({e}): {msg:?}")),
        };
        if self.trace {
            eprintln!("  {func} -> {status:?} {msg}");
        }
        if !allowed.contains(&status) {
            self.fail(format!(
                "{func} answered {status:?}, allowed {allowed:?}; last error: {msg}"
            ));
        }
        if status == RESERVOIR_OK {
            if !msg.is_empty() {
                self.fail(format!("{func} succeeded but the last error is {msg:?}"));
            }
        } else {
            if !msg.starts_with(func) {
                self.fail(format!(
                    "{func} failed ({status:?}) with a message not naming it: {msg:?}"
                ));
            }
            let bound = MESSAGE_SLACK + 8 * caller_text;
            if msg.len() > bound {
                self.fail(format!(
                    "{func}: message of {} bytes for {caller_text} bytes of caller text (bound {bound}): {}...",
                    msg.len(),
                    &msg[..msg.floor_char_boundary_compat(200)]
                ));
            }
        }
    }

    fn stat(&self, h: *mut ReservoirAllocator, key: &CStr) -> i64 {
        let mut v = i64::MIN;
        // SAFETY: `key` is NUL-terminated, `v` is writable.
        let s = unsafe { reservoir_allocator_stat(h, key.as_ptr(), &mut v) };
        if s != RESERVOIR_OK {
            self.fail(format!("reading {key:?} answered {s:?}"));
        }
        v
    }

    fn stats(&self, idx: usize) -> Stats {
        let h = self.handles[idx].h;
        let v: Vec<i64> = STAT_NAMES.iter().map(|k| self.stat(h, k)).collect();
        Stats {
            allocated: v[0],
            active: v[1],
            reserved: v[2],
            requested: v[3],
            allocations: v[4],
            segments: v[5],
            inactive_split: v[6],
        }
    }

    /// The statistics of handle `idx` hold together and agree with the model.
    fn check_stats(&self, idx: usize, ctx: &str) -> Stats {
        let s = self.stats(idx);
        let m = &self.handles[idx];
        let live = m.blocks.len() as i64;
        let requested: u64 = m.blocks.values().map(|(size, _)| size).sum();
        let bad = |what: &str| -> ! { self.fail(format!("after {ctx}: {what}: {s:?}")) };
        if [
            s.allocated,
            s.active,
            s.reserved,
            s.requested,
            s.allocations,
            s.segments,
            s.inactive_split,
        ]
        .iter()
        .any(|&v| v < 0)
        {
            bad("a negative statistic");
        }
        // As in PyTorch, `free` lowers allocated_bytes at once but
        // requested_bytes with active_bytes, when the block is released
        // (later when recorded streams still use it).
        if !(s.requested <= s.active && s.allocated <= s.active && s.active <= s.reserved) {
            bad("not requested, allocated <= active <= reserved");
        }
        if s.inactive_split > s.reserved - s.active {
            bad("inactive_split_bytes above reserved - active");
        }
        // Expandable segments reserve without counting a segment (as in
        // PyTorch: map_block raises reserved_bytes only), so only one way.
        if s.segments > 0 && s.reserved == 0 {
            bad("segments without reserved bytes");
        }
        if let Some(cap) = m.capacity {
            if s.reserved as u64 > cap {
                bad(&format!("reserved above the capacity {cap}"));
            }
        }
        if s.allocations != live {
            bad(&format!(
                "allocation.all.current is not the {live} live blocks"
            ));
        }
        if (s.requested as u64) < requested || (s.allocated as u64) < requested {
            bad(&format!(
                "requested or allocated bytes below the live sizes' sum {requested}"
            ));
        }
        m.last.set(Some(s));
        s
    }

    /// The statistics of live handle `idx` before a call: those the last
    /// check read.
    fn before(&self, idx: usize) -> Stats {
        match self.handles[idx].last.get() {
            Some(s) => s,
            None => self.check_stats(idx, "a call"),
        }
    }

    /// After a failed call on live handle `idx`: nothing changed (an
    /// out-of-memory error may only release cached segments).
    fn check_unchanged(&self, idx: usize, before: Stats, status: ReservoirStatus, ctx: &str) {
        let after = self.check_stats(idx, ctx);
        let same = if status == RESERVOIR_ERR_OUT_OF_MEMORY {
            // The retry chain waits for the events of blocks freed while
            // recorded streams used them (releasing them: active and
            // requested bytes fall) and frees cached segments.
            after.allocated == before.allocated
                && after.allocations == before.allocations
                && after.active <= before.active
                && after.requested <= before.requested
                && after.reserved <= before.reserved
        } else {
            after == before
        };
        if !same {
            self.fail(format!(
                "{ctx} failed with {status:?} but changed the statistics: before {before:?}, after {after:?}"
            ));
        }
    }

    fn size(c: SizeChoice) -> u64 {
        match c {
            SizeChoice::Zero => 0,
            SizeChoice::Small(n) => u64::from(n),
            SizeChoice::Mib(n) => u64::from(n) * MIB,
            SizeChoice::Medium(n) => u64::from(n),
            SizeChoice::Edge { shift, delta } => (1u64 << (shift % 64))
                .wrapping_add(u64::from(delta))
                .wrapping_sub(128),
            SizeChoice::Largest => isize::MAX as u64,
            SizeChoice::TooLarge => isize::MAX as u64 + 1,
            SizeChoice::Any(n) => n,
        }
    }

    /// The stream id `r` names for handle `idx` (if live), and whether the
    /// handle knows it.
    fn stream(&self, idx: Option<usize>, r: StreamRef) -> (u64, bool) {
        let own: &[u64] = idx.map_or(&[], |i| &self.handles[i].streams);
        let id = match r {
            StreamRef::Default => 0,
            StreamRef::Created(i) if !own.is_empty() => own[i as usize % own.len()],
            StreamRef::Created(_) => 0,
            StreamRef::OtherHandles(i) => {
                let others: Vec<u64> = self
                    .handles
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| Some(*j) != idx)
                    .flat_map(|(_, m)| m.streams.iter().copied())
                    .collect();
                if others.is_empty() {
                    1
                } else {
                    others[i as usize % others.len()]
                }
            }
            StreamRef::Any(x) => x,
            StreamRef::Max => u64::MAX,
        };
        let known = id == 0 || own.contains(&id);
        if !known && self.skip_unknown_streams {
            return (0, true);
        }
        (id, known)
    }

    /// The address `r` names for handle `idx`, and the size of the live
    /// block of `idx` that starts there (if any).
    fn pointer(&self, idx: Option<usize>, r: PtrRef) -> (u64, Option<u64>) {
        let pick = |v: Vec<u64>, i: u8| -> Option<u64> {
            (!v.is_empty()).then(|| v[i as usize % v.len()])
        };
        let own: Vec<u64> = idx.map_or_else(Vec::new, |i| {
            self.handles[i].blocks.keys().copied().collect()
        });
        let p = match r {
            PtrRef::Live(i) => pick(own, i).unwrap_or(0),
            PtrRef::Freed(i) => idx
                .and_then(|j| pick(self.handles[j].freed.clone(), i))
                .unwrap_or(512),
            PtrRef::Foreign(i) => {
                let others: Vec<u64> = self
                    .handles
                    .iter()
                    .enumerate()
                    .filter(|(j, m)| Some(*j) != idx && m.live)
                    .flat_map(|(_, m)| m.blocks.keys().copied())
                    .collect();
                pick(others, i).unwrap_or(1 << 40)
            }
            PtrRef::Interior(i, off) => match idx.and_then(|j| {
                let b: Vec<(u64, u64)> = self.handles[j]
                    .blocks
                    .iter()
                    .map(|(&p, &(s, _))| (p, s))
                    .collect();
                (!b.is_empty()).then(|| b[i as usize % b.len()])
            }) {
                Some((p, size)) if size > 1 => p + 1 + u64::from(off) % (size - 1),
                Some((p, _)) => p + 1,
                None => 0x1000,
            },
            PtrRef::Null => 0,
            PtrRef::Any(x) => x,
        };
        let size = idx.and_then(|j| self.handles[j].blocks.get(&p).map(|&(s, _)| s));
        (p, size)
    }

    /// Make the call (or calls) of `op` and check what they did.
    fn op(&mut self, op: &Op) {
        match op {
            Op::Create {
                backend,
                device,
                capacity,
                config,
            } => self.create(*backend, *device, *capacity, config),
            Op::Destroy(r) => self.destroy(*r),
            Op::CreateStream(r) => self.create_stream(*r),
            Op::Alloc(r, size, stream) => self.alloc(*r, Self::size(*size), *stream),
            Op::Free(r, p) => self.free(*r, *p),
            Op::RecordStream(r, p, stream) => self.record_stream(*r, *p, *stream),
            Op::EmptyCache(r) => self.empty_cache(*r),
            Op::Fraction(r, f) => self.fraction(*r, *f),
            Op::RecordHistory(r, on, max) => self.record_history(*r, *on, *max),
            Op::Snapshot(r, path) => self.snapshot(*r, *path),
            Op::StatAt {
                h: r,
                index,
                capacity,
                null_key,
            } => self.stat_at(*r, *index, *capacity, *null_key),
            Op::Stat(r, key) => self.stat_key(*r, key),
            Op::NullOut(r, which) => self.null_out(*r, *which),
            Op::FreeAll(r) => {
                let (_, idx) = self.resolve(*r);
                if let Some(i) = idx {
                    self.free_all(i);
                }
            }
            Op::StatusName(st) => self.status_name(*st),
        }
    }

    fn finish(&mut self) {
        for i in 0..self.handles.len() {
            if self.handles[i].live {
                self.free_all(i);
                self.handles[i].live = false;
                let s = reservoir_allocator_destroy(self.handles[i].h);
                self.check("reservoir_allocator_destroy", s, &[RESERVOIR_OK], 0);
            }
        }
    }
}

fn key_known(k: &StatKey) -> Option<&'static str> {
    match k {
        StatKey::Known(i) => Some(STAT_KEYS[*i as usize % STAT_KEYS.len()]),
        _ => None,
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // On a panic (a finding) the handles stay alive: the process ends.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

trait FloorCharBoundary {
    fn floor_char_boundary_compat(&self, i: usize) -> usize;
}

impl FloorCharBoundary for str {
    fn floor_char_boundary_compat(&self, i: usize) -> usize {
        let mut i = i.min(self.len());
        while !self.is_char_boundary(i) {
            i -= 1;
        }
        i
    }
}
