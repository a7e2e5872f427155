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

/// Which handle a call names.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum HandleRef {
    /// A live handle (index modulo the live ones; null when none lives).
    Live(u8),
    /// A destroyed handle (a made-up token when none was destroyed).
    Destroyed(u8),
    /// Null.
    Null,
    /// A made-up token.
    Garbage(u64),
}

/// A size for `alloc`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum SizeChoice {
    /// 0: refused.
    Zero,
    /// Below 64 KiB.
    Small(u16),
    /// Whole MiB, below 256 MiB.
    Mib(u8),
    /// Any 32-bit size.
    Medium(u32),
    /// Around a rounding boundary: `2^shift + delta - 128`.
    Edge {
        /// The power of two (modulo 64).
        shift: u8,
        /// Offset around it.
        delta: u8,
    },
    /// `PTRDIFF_MAX`, the largest size accepted (out of memory).
    Largest,
    /// `PTRDIFF_MAX + 1`: refused.
    TooLarge,
    /// Any 64-bit size.
    Any(u64),
}

/// A stream for `alloc` and `record_stream`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum StreamRef {
    /// 0.
    Default,
    /// One the handle made (index modulo their number; 0 when none).
    Created(u8),
    /// One another handle made.
    OtherHandles(u8),
    /// Any id.
    Any(u64),
    /// `UINT64_MAX`.
    Max,
}

/// A pointer for `free` and `record_stream`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum PtrRef {
    /// A live block of the handle.
    Live(u8),
    /// A block the handle freed.
    Freed(u8),
    /// A live block of another handle.
    Foreign(u8),
    /// Inside a live block of the handle.
    Interior(u8, u32),
    /// Null.
    Null,
    /// Any address.
    Any(u64),
}

/// A `config` argument for `create`.
#[derive(Arbitrary, Debug, Clone)]
pub enum ConfigChoice {
    /// A null pointer.
    Null,
    /// One of [`CONFIGS`].
    Known(u8),
    /// Any text (cut at its first NUL).
    Text(String),
    /// Any bytes (cut at the first NUL), maybe not UTF-8.
    Bytes(Vec<u8>),
}

/// A capacity for `create`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum CapacityChoice {
    /// 0: the backend's default (80 GiB on the simulated device).
    Default,
    /// A few bytes to 64 KiB.
    Tiny(u16),
    /// 1..=256 MiB.
    Mib(u8),
    /// Any.
    Any(u64),
}

/// A backend for `create`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum BackendChoice {
    /// `RESERVOIR_BACKEND_SIM`.
    Sim,
    /// `RESERVOIR_BACKEND_HOST` (its capacity capped at 256 MiB, never 0).
    Host,
    /// `RESERVOIR_BACKEND_CUDA` with a capacity: always refused before the
    /// driver is touched.
    CudaWithCapacity,
    /// Any number.
    Any(u32),
}

/// A `fraction` for `set_memory_fraction`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum FractionChoice {
    /// `k / 255`.
    Ratio(u8),
    /// Any `f64` (NaN, infinities, negatives...).
    Any(f64),
}

/// A `path` for `snapshot`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum PathChoice {
    /// A file in the run's temporary folder.
    Temp,
    /// Null.
    Null,
    /// A file in a folder that does not exist.
    NoFolder,
    /// A file name that is not UTF-8 (valid on Linux).
    NotUtf8,
}

/// A statistic key for `stat`.
#[derive(Arbitrary, Debug, Clone)]
pub enum StatKey {
    /// One of [`STAT_KEYS`].
    Known(u8),
    /// Any text (cut at its first NUL).
    Text(String),
    /// Null.
    Null,
}

/// One step of the call sequence.
#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    /// `reservoir_allocator_create`.
    Create {
        /// Backend.
        backend: BackendChoice,
        /// Device index (valid: 0..=127).
        device: i8,
        /// Capacity.
        capacity: CapacityChoice,
        /// Settings string.
        config: ConfigChoice,
    },
    /// `reservoir_allocator_destroy`.
    Destroy(HandleRef),
    /// `reservoir_allocator_create_stream`.
    CreateStream(HandleRef),
    /// `reservoir_allocator_alloc`.
    Alloc(HandleRef, SizeChoice, StreamRef),
    /// `reservoir_allocator_free`.
    Free(HandleRef, PtrRef),
    /// `reservoir_allocator_record_stream`.
    RecordStream(HandleRef, PtrRef, StreamRef),
    /// `reservoir_allocator_empty_cache`.
    EmptyCache(HandleRef),
    /// `reservoir_allocator_set_memory_fraction`, then
    /// `reservoir_allocator_memory_fraction`.
    Fraction(HandleRef, FractionChoice),
    /// `reservoir_allocator_record_history`.
    RecordHistory(HandleRef, bool, u16),
    /// `reservoir_allocator_snapshot`.
    Snapshot(HandleRef, PathChoice),
    /// `reservoir_allocator_stats_count`, then `reservoir_allocator_stat_at`
    /// with a key buffer of `capacity` bytes (none when `null_key`).
    StatAt {
        /// Handle.
        h: HandleRef,
        /// Statistic index (the count is about 150).
        index: u8,
        /// Key buffer size.
        capacity: u8,
        /// Pass a null key buffer.
        null_key: bool,
    },
    /// `reservoir_allocator_stat`.
    Stat(HandleRef, StatKey),
    /// A call with a null out-pointer (which call: modulo 5).
    NullOut(HandleRef, u8),
    /// Free every live block of the handle, empty its cache: nothing may
    /// stay allocated, active or reserved.
    FreeAll(HandleRef),
    /// `reservoir_status_name`.
    StatusName(i32),
}

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

    fn op(&mut self, op: &Op) {
        match op {
            Op::Create {
                backend,
                device,
                capacity,
                config,
            } => self.create(*backend, *device, *capacity, config),
            Op::Destroy(r) => {
                let (h, idx) = self.resolve(*r);
                let live = self.live_tokens();
                if let Some(i) = idx {
                    // What destroy releases is checked by FreeAll; here only
                    // the status and that the handle is gone.
                    self.handles[i].live = false;
                }
                let s = reservoir_allocator_destroy(h);
                let allowed = match handle_error(h, &live) {
                    Some(e) => vec![e],
                    None => vec![RESERVOIR_OK],
                };
                self.check("reservoir_allocator_destroy", s, &allowed, 0);
                if idx.is_some() {
                    let mut v = 0;
                    // SAFETY: `v` is writable; the key is NUL-terminated.
                    let s2 = unsafe { reservoir_allocator_stat(h, c"num_ooms".as_ptr(), &mut v) };
                    self.check(
                        "reservoir_allocator_stat",
                        s2,
                        &[RESERVOIR_ERR_INVALID_HANDLE],
                        0,
                    );
                }
            }
            Op::CreateStream(r) => {
                let (h, idx) = self.resolve(*r);
                let mut id = u64::MAX;
                // SAFETY: `id` is writable.
                let s = unsafe { reservoir_allocator_create_stream(h, &mut id) };
                match idx {
                    Some(i) => {
                        // A limit on streams may refuse one (issue 29 item 2).
                        self.check(
                            "reservoir_allocator_create_stream",
                            s,
                            &[
                                RESERVOIR_OK,
                                RESERVOIR_ERR_INVALID_STATE,
                                RESERVOIR_ERR_INVALID_ARGUMENT,
                                RESERVOIR_ERR_BACKEND,
                            ],
                            0,
                        );
                        if s == RESERVOIR_OK {
                            if id == 0 || self.handles[i].streams.contains(&id) {
                                self.fail(format!("create_stream handed out stream {id} again"));
                            }
                            self.handles[i].streams.push(id);
                        }
                    }
                    None => {
                        let e = handle_error(h, &self.live_tokens()).expect("not live");
                        self.check("reservoir_allocator_create_stream", s, &[e], 0);
                    }
                }
            }
            Op::Alloc(r, size, stream) => self.alloc(*r, Self::size(*size), *stream),
            Op::Free(r, p) => self.free(*r, *p),
            Op::RecordStream(r, p, stream) => self.record_stream(*r, *p, *stream),
            Op::EmptyCache(r) => {
                let (h, idx) = self.resolve(*r);
                let s = reservoir_allocator_empty_cache(h);
                self.simple("reservoir_allocator_empty_cache", h, idx, s, RESERVOIR_OK);
                if let Some(i) = idx {
                    self.check_stats(i, "empty_cache");
                }
            }
            Op::Fraction(r, f) => {
                let (h, idx) = self.resolve(*r);
                let f = match *f {
                    FractionChoice::Ratio(k) => f64::from(k) / 255.0,
                    FractionChoice::Any(x) => x,
                };
                let before = idx.map(|i| self.before(i));
                let s = reservoir_allocator_set_memory_fraction(h, f);
                let ok = (0.0..=1.0).contains(&f);
                let arg = if ok {
                    RESERVOIR_OK
                } else {
                    RESERVOIR_ERR_INVALID_ARGUMENT
                };
                self.simple("reservoir_allocator_set_memory_fraction", h, idx, s, arg);
                if let (Some(i), Some(b)) = (idx, before) {
                    if s == RESERVOIR_OK {
                        self.check_stats(i, "set_memory_fraction");
                    } else {
                        self.check_unchanged(i, b, s, "set_memory_fraction");
                    }
                }
                let mut got = f64::NAN;
                // SAFETY: `got` is writable.
                let s = unsafe { reservoir_allocator_memory_fraction(h, &mut got) };
                self.simple(
                    "reservoir_allocator_memory_fraction",
                    h,
                    idx,
                    s,
                    RESERVOIR_OK,
                );
                if s == RESERVOIR_OK && !(0.0..=1.0).contains(&got) {
                    self.fail(format!("memory_fraction answered {got}"));
                }
            }
            Op::RecordHistory(r, on, max) => {
                let (h, idx) = self.resolve(*r);
                let s = reservoir_allocator_record_history(h, *on, usize::from(*max));
                self.simple(
                    "reservoir_allocator_record_history",
                    h,
                    idx,
                    s,
                    RESERVOIR_OK,
                );
            }
            Op::Snapshot(r, path) => self.snapshot(*r, *path),
            Op::StatAt {
                h: r,
                index,
                capacity,
                null_key,
            } => {
                let (h, idx) = self.resolve(*r);
                let mut n = usize::MAX;
                // SAFETY: `n` is writable.
                let s = unsafe { reservoir_allocator_stats_count(h, &mut n) };
                self.simple("reservoir_allocator_stats_count", h, idx, s, RESERVOIR_OK);
                let mut buf = vec![0xffu8; usize::from(*capacity)];
                let key = if *null_key {
                    std::ptr::null_mut()
                } else {
                    buf.as_mut_ptr().cast::<c_char>()
                };
                let (mut len, mut value) = (usize::MAX, i64::MIN);
                let index = usize::from(*index);
                // SAFETY: `key` is null or holds `capacity` writable bytes;
                // `len` and `value` are writable.
                let s2 = unsafe {
                    reservoir_allocator_stat_at(
                        h,
                        index,
                        key,
                        if *null_key { 0 } else { buf.len() },
                        &mut len,
                        &mut value,
                    )
                };
                let arg = if idx.is_some() && index >= n {
                    RESERVOIR_ERR_INVALID_ARGUMENT
                } else if idx.is_some() {
                    // The key's length is only known from the answer.
                    if s2 == RESERVOIR_ERR_BUFFER_TOO_SMALL {
                        if len == usize::MAX || (!*null_key && usize::from(*capacity) > len) {
                            self.fail(format!(
                                "stat_at: buffer of {capacity} too small for a key of {len}"
                            ));
                        }
                        RESERVOIR_ERR_BUFFER_TOO_SMALL
                    } else {
                        RESERVOIR_OK
                    }
                } else {
                    RESERVOIR_OK
                };
                self.simple("reservoir_allocator_stat_at", h, idx, s2, arg);
                if s2 == RESERVOIR_OK {
                    if *null_key || len >= buf.len() || buf[len] != 0 || buf[..len].contains(&0) {
                        self.fail(format!(
                            "stat_at wrote a key of length {len} badly: {buf:?}"
                        ));
                    }
                    let k = std::str::from_utf8(&buf[..len])
                        .unwrap_or_else(|e| self.fail(format!("key not UTF-8: {e}")));
                    let key = CString::new(k).expect("no NUL");
                    let again = self.stat(h, &key);
                    // `stat_at` and `stat` read the same counters.
                    if again != value {
                        self.fail(format!("stat_at said {k} = {value}, stat says {again}"));
                    }
                }
            }
            Op::Stat(r, key) => {
                let (h, idx) = self.resolve(*r);
                let text = match key {
                    StatKey::Known(i) => {
                        Some(STAT_KEYS[*i as usize % STAT_KEYS.len()].as_bytes().to_vec())
                    }
                    StatKey::Text(t) => Some(t.as_bytes().to_vec()),
                    StatKey::Null => None,
                };
                let c = text.as_deref().map(c_text);
                let mut v = i64::MIN;
                // SAFETY: the key is null or NUL-terminated; `v` is writable.
                let s = unsafe {
                    reservoir_allocator_stat(
                        h,
                        c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                        &mut v,
                    )
                };
                let len = c.as_ref().map_or(0, |c| c.as_bytes().len());
                let allowed: Vec<ReservoirStatus> = match (c.as_ref(), idx) {
                    // Whether the key exists is the library's to say.
                    (Some(_), Some(_)) => vec![RESERVOIR_OK, RESERVOIR_ERR_INVALID_ARGUMENT],
                    (None, _) => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
                    (Some(_), None) => {
                        let mut a = vec![handle_error(h, &self.live_tokens()).expect("not live")];
                        if std::str::from_utf8(c.as_ref().unwrap().as_bytes()).is_err() {
                            a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                        }
                        a
                    }
                };
                self.check("reservoir_allocator_stat", s, &allowed, len);
                if let (Some(k), true) = (key_known(key), idx.is_some()) {
                    if s != RESERVOIR_OK
                        && STAT_KEYS
                            .iter()
                            .position(|x| *x == k)
                            .is_some_and(|p| p < 10)
                    {
                        self.fail(format!("stat {k:?} exists but answered {s:?}"));
                    }
                }
            }
            Op::NullOut(r, which) => self.null_out(*r, *which),
            Op::FreeAll(r) => {
                let (_, idx) = self.resolve(*r);
                if let Some(i) = idx {
                    self.free_all(i);
                }
            }
            Op::StatusName(st) => {
                // SAFETY: a static NUL-terminated string.
                let name = unsafe { CStr::from_ptr(reservoir_status_name(*st)) };
                let name = name
                    .to_str()
                    .unwrap_or_else(|e| self.fail(format!("status name not UTF-8: {e}")));
                let want = if (0..=13).contains(st) {
                    "RESERVOIR_"
                } else {
                    "RESERVOIR_UNKNOWN_STATUS"
                };
                if !name.starts_with(want)
                    || ((0..=13).contains(st) && name == "RESERVOIR_UNKNOWN_STATUS")
                {
                    self.fail(format!("status {st} is named {name:?}"));
                }
            }
        }
    }

    /// A call whose only failure causes are the handle and `arg` (the
    /// status its arguments call for on a live handle).
    fn simple(
        &self,
        func: &str,
        h: *mut ReservoirAllocator,
        idx: Option<usize>,
        s: ReservoirStatus,
        arg: ReservoirStatus,
    ) {
        let allowed: Vec<ReservoirStatus> = match idx {
            Some(_) => vec![arg],
            None => {
                let mut a = vec![handle_error(h, &self.live_tokens()).expect("not live")];
                if arg != RESERVOIR_OK && arg != RESERVOIR_ERR_BUFFER_TOO_SMALL {
                    a.push(arg);
                }
                a
            }
        };
        self.check(func, s, &allowed, 0);
    }

    fn create(
        &mut self,
        backend: BackendChoice,
        device: i8,
        capacity: CapacityChoice,
        config: &ConfigChoice,
    ) {
        let (backend_id, host) = match backend {
            BackendChoice::Sim => (0u32, false),
            BackendChoice::Host => (1, true),
            BackendChoice::CudaWithCapacity => (2, false),
            BackendChoice::Any(b) => (b, b == 1),
        };
        let mut cap = match capacity {
            CapacityChoice::Default => 0,
            CapacityChoice::Tiny(n) => u64::from(n),
            CapacityChoice::Mib(n) => (u64::from(n) + 1) * MIB,
            CapacityChoice::Any(n) => n,
        };
        if host {
            cap = cap.clamp(1, 256 * MIB);
        }
        if backend_id == 2 && cap == 0 {
            cap = MIB;
        }
        // Never touch a CUDA driver: `Any(2)` gets a capacity too.
        let cfg: Option<Vec<u8>> = match config {
            ConfigChoice::Null => None,
            ConfigChoice::Known(i) => {
                Some(CONFIGS[*i as usize % CONFIGS.len()].as_bytes().to_vec())
            }
            ConfigChoice::Text(t) => Some(t.as_bytes().to_vec()),
            ConfigChoice::Bytes(b) => Some(b.clone()),
        };
        let c = cfg.as_deref().map(c_text);
        let cfg_len = c.as_ref().map_or(0, |c| c.as_bytes().len());
        let parses = match c.as_ref().map(|c| c.to_str()) {
            None => Some(true),
            Some(Ok(s)) => Some(reservoir::config::AllocatorConfig::parse_with_policy(s).is_ok()),
            Some(Err(_)) => None, // not UTF-8
        };
        let mut out: *mut ReservoirAllocator = 0x1 as *mut _;
        // SAFETY: the config is null or NUL-terminated; `out` is writable.
        let s = unsafe {
            reservoir_allocator_create(
                backend_id,
                i32::from(device),
                cap,
                c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                &mut out,
            )
        };
        let mut allowed = Vec::new();
        let args_ok = device >= 0 && backend_id <= 1;
        if parses == Some(false) {
            allowed.push(RESERVOIR_ERR_INVALID_CONFIG);
        }
        if parses.is_none() || !args_ok {
            allowed.push(RESERVOIR_ERR_INVALID_ARGUMENT);
        }
        if allowed.is_empty() {
            allowed.push(RESERVOIR_OK);
        }
        self.check("reservoir_allocator_create", s, &allowed, cfg_len);
        if s != RESERVOIR_OK {
            if !out.is_null() {
                self.fail(format!("create failed with {s:?} but *out is {out:p}"));
            }
            return;
        }
        if out.is_null() || self.handles.iter().any(|m| m.h == out) {
            self.fail(format!(
                "create answered OK with handle {out:p} (null or reused)"
            ));
        }
        self.handles.push(Model {
            h: out,
            live: true,
            host,
            capacity: (cap != 0).then_some(cap),
            streams: Vec::new(),
            blocks: BTreeMap::new(),
            freed: Vec::new(),
            last: std::cell::Cell::new(None),
        });
        let i = self.handles.len() - 1;
        let st = self.check_stats(i, "create");
        if st.reserved != 0 || st.allocated != 0 {
            self.fail(format!("a new allocator holds memory: {st:?}"));
        }
        if self.handles.iter().filter(|m| m.live).count() > MAX_LIVE {
            self.handles[i].live = false;
            let s = reservoir_allocator_destroy(out);
            self.check("reservoir_allocator_destroy", s, &[RESERVOIR_OK], 0);
        }
    }

    fn alloc(&mut self, r: HandleRef, size: u64, stream: StreamRef) {
        let (h, idx) = self.resolve(r);
        let (stream, known) = self.stream(idx, stream);
        let before = idx.map(|i| self.before(i));
        let mut out: *mut c_void = 0x1 as *mut c_void;
        // SAFETY: `out` is writable; the simulated and host devices take any
        // stream number.
        let s = unsafe { reservoir_allocator_alloc(h, size, stream, &mut out) };
        let size_ok = size != 0 && size <= isize::MAX as u64;
        let allowed: Vec<ReservoirStatus> = match idx {
            None => {
                let mut a = vec![handle_error(h, &self.live_tokens()).expect("not live")];
                if !size_ok {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                a
            }
            Some(_) if !size_ok || !known => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            Some(_) => vec![RESERVOIR_OK, RESERVOIR_ERR_OUT_OF_MEMORY],
        };
        self.check("reservoir_allocator_alloc", s, &allowed, 0);
        if s != RESERVOIR_OK {
            if !out.is_null() {
                self.fail(format!("alloc failed with {s:?} but *out is {out:p}"));
            }
            if let (Some(i), Some(b)) = (idx, before) {
                self.check_unchanged(i, b, s, &format!("alloc({size}, stream {stream})"));
            }
            return;
        }
        let i = idx.expect("OK only on a live handle");
        let p = out as usize as u64;
        if p == 0 || p % 512 != 0 {
            self.fail(format!(
                "alloc({size}) handed out {p:#x}: null or not 512-byte aligned"
            ));
        }
        let end = p
            .checked_add(size)
            .unwrap_or_else(|| self.fail(format!("block {p:#x}+{size} wraps")));
        let m = &self.handles[i];
        if let Some((&q, &(qs, _))) = m.blocks.range(..end).next_back() {
            if q + qs > p {
                self.fail(format!(
                    "alloc({size}) handed out {p:#x}, overlapping live block {q:#x}+{qs}"
                ));
            }
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        if m.host {
            // SAFETY: host memory: the block [p, p+size) is ours and
            // writable; unaligned writes of the tag at both ends.
            unsafe {
                (p as *mut u8).cast::<u64>().write_unaligned(tag);
                if size >= 16 {
                    ((end - 8) as *mut u8).cast::<u64>().write_unaligned(tag);
                }
            }
        }
        let m = &mut self.handles[i];
        m.blocks.insert(p, (size, tag));
        m.freed.retain(|&f| f != p);
        self.check_stats(i, &format!("alloc({size})"));
    }

    fn free(&mut self, r: HandleRef, pr: PtrRef) {
        let (h, idx) = self.resolve(r);
        let (p, live_size) = self.pointer(idx, pr);
        let before = idx.map(|i| self.before(i));
        if let (Some(i), Some(size)) = (idx, live_size) {
            self.check_tag(i, p, size);
        }
        let s = reservoir_allocator_free(h, p as usize as *mut c_void);
        let allowed: Vec<ReservoirStatus> = match idx {
            None => vec![handle_error(h, &self.live_tokens()).expect("not live")],
            Some(_) if live_size.is_some() => vec![RESERVOIR_OK],
            Some(_) => vec![RESERVOIR_ERR_INVALID_POINTER],
        };
        self.check("reservoir_allocator_free", s, &allowed, 0);
        if let Some(i) = idx {
            if s == RESERVOIR_OK {
                let m = &mut self.handles[i];
                m.blocks.remove(&p);
                m.freed.push(p);
                if m.freed.len() > 32 {
                    m.freed.remove(0);
                }
                self.check_stats(i, &format!("free({p:#x})"));
            } else if let Some(b) = before {
                self.check_unchanged(i, b, s, &format!("free({p:#x})"));
            }
        }
    }

    fn check_tag(&self, i: usize, p: u64, size: u64) {
        let m = &self.handles[i];
        if !m.host {
            return;
        }
        let tag = m.blocks[&p].1;
        // SAFETY: a live host block of ours, [p, p+size).
        let (a, b) = unsafe {
            let a = (p as *const u8).cast::<u64>().read_unaligned();
            let b = if size >= 16 {
                ((p + size - 8) as *const u8).cast::<u64>().read_unaligned()
            } else {
                tag
            };
            (a, b)
        };
        if a != tag || b != tag {
            self.fail(format!("host block {p:#x}+{size}: its tags were overwritten ({a:#x}, {b:#x}, want {tag:#x})"));
        }
    }

    fn record_stream(&mut self, r: HandleRef, pr: PtrRef, stream: StreamRef) {
        let (h, idx) = self.resolve(r);
        let (p, live_size) = self.pointer(idx, pr);
        let (stream, known) = self.stream(idx, stream);
        let before = idx.map(|i| self.before(i));
        // SAFETY: the simulated and host devices take any stream number.
        let s = unsafe { reservoir_allocator_record_stream(h, p as usize as *mut c_void, stream) };
        let allowed: Vec<ReservoirStatus> = match idx {
            None => vec![handle_error(h, &self.live_tokens()).expect("not live")],
            // A null pointer is a no-op, as in PyTorch's recordStream (an
            // empty tensor has no block); the header does not say so.
            Some(_) if p == 0 => {
                let mut a = vec![RESERVOIR_OK];
                if !known {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                a
            }
            Some(_) => {
                let mut a = Vec::new();
                if live_size.is_none() {
                    a.push(RESERVOIR_ERR_INVALID_POINTER);
                }
                if !known {
                    a.push(RESERVOIR_ERR_INVALID_ARGUMENT);
                }
                if a.is_empty() {
                    a.push(RESERVOIR_OK);
                }
                a
            }
        };
        self.check("reservoir_allocator_record_stream", s, &allowed, 0);
        if let (Some(i), Some(b)) = (idx, before) {
            if s == RESERVOIR_OK {
                self.check_stats(i, "record_stream");
            } else {
                self.check_unchanged(i, b, s, &format!("record_stream({p:#x}, {stream})"));
            }
        }
    }

    fn snapshot(&mut self, r: HandleRef, path: PathChoice) {
        let (h, idx) = self.resolve(r);
        let file = self.dir.join("snapshot.pickle");
        let bytes: Option<Vec<u8>> = match path {
            PathChoice::Temp => Some(file.to_str().expect("UTF-8 temp dir").as_bytes().to_vec()),
            PathChoice::Null => None,
            PathChoice::NoFolder => Some(
                self.dir
                    .join("no/such/folder/s.pickle")
                    .to_str()
                    .expect("UTF-8")
                    .as_bytes()
                    .to_vec(),
            ),
            PathChoice::NotUtf8 => {
                let mut b = self.dir.to_str().expect("UTF-8").as_bytes().to_vec();
                b.extend_from_slice(b"/s\xff\xfe.pickle");
                Some(b)
            }
        };
        let c = bytes.as_deref().map(c_text);
        let _ = std::fs::remove_file(&file);
        // SAFETY: the path is null or NUL-terminated.
        let s = unsafe {
            reservoir_allocator_snapshot(h, c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()))
        };
        let len = c.as_ref().map_or(0, |c| c.as_bytes().len());
        let mut allowed: Vec<ReservoirStatus> = match (path, idx) {
            (PathChoice::Null, _) => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            (PathChoice::Temp, Some(_)) => vec![RESERVOIR_OK],
            (PathChoice::NoFolder, Some(_)) => vec![RESERVOIR_ERR_IO],
            // Refused today; issue 29 item 8 asks for byte paths.
            (PathChoice::NotUtf8, Some(_)) => vec![RESERVOIR_ERR_INVALID_ARGUMENT, RESERVOIR_OK],
            (PathChoice::NotUtf8, None) => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
            (_, None) => vec![],
        };
        if idx.is_none() {
            allowed.push(handle_error(h, &self.live_tokens()).expect("not live"));
        }
        self.check("reservoir_allocator_snapshot", s, &allowed, len);
        if s == RESERVOIR_OK && matches!(path, PathChoice::Temp) {
            let b =
                std::fs::read(&file).unwrap_or_else(|e| self.fail(format!("snapshot file: {e}")));
            if b.len() < 3 || b[0] != 0x80 || *b.last().unwrap() != b'.' {
                self.fail(format!(
                    "snapshot wrote {} bytes that are no pickle",
                    b.len()
                ));
            }
        }
        if let Some(i) = idx {
            self.check_stats(i, "snapshot");
        }
    }

    fn null_out(&mut self, r: HandleRef, which: u8) {
        let (h, idx) = self.resolve(r);
        let before = idx.map(|i| self.before(i));
        let live = self.live_tokens();
        let bad = || handle_error(h, &live);
        let null = std::ptr::null_mut();
        let (func, s, out_first) = match which % 5 {
            0 => {
                // SAFETY: a null `out` is allowed (refused).
                let s = unsafe { reservoir_allocator_alloc(h, 4096, 0, null) };
                ("reservoir_allocator_alloc", s, true)
            }
            1 => {
                // SAFETY: a null `out` is allowed (refused).
                let s = unsafe { reservoir_allocator_stats_count(h, null.cast()) };
                ("reservoir_allocator_stats_count", s, false)
            }
            2 => {
                // SAFETY: a null `out` is allowed (refused).
                let s = unsafe { reservoir_allocator_memory_fraction(h, null.cast()) };
                ("reservoir_allocator_memory_fraction", s, false)
            }
            3 => {
                // SAFETY: the key is NUL-terminated; a null `value` is
                // allowed (refused).
                let s = unsafe { reservoir_allocator_stat(h, c"num_ooms".as_ptr(), null.cast()) };
                ("reservoir_allocator_stat", s, false)
            }
            _ => {
                // SAFETY: a null config and a null `out` are allowed; create
                // checks `out` first, whatever the other arguments.
                let s =
                    unsafe { reservoir_allocator_create(0, 0, 0, std::ptr::null(), null.cast()) };
                self.check(
                    "reservoir_allocator_create",
                    s,
                    &[RESERVOIR_ERR_INVALID_ARGUMENT],
                    0,
                );
                return;
            }
        };
        // alloc checks `out` before the handle; the others the handle first.
        let allowed: Vec<ReservoirStatus> = match bad() {
            Some(e) if !out_first => vec![e],
            _ => vec![RESERVOIR_ERR_INVALID_ARGUMENT],
        };
        self.check(func, s, &allowed, 0);
        if let (Some(i), Some(b)) = (idx, before) {
            self.check_unchanged(i, b, s, &format!("{func} with a null out-pointer"));
        }
    }

    /// Free every live block of handle `i`, empty its cache: nothing may
    /// remain allocated, active or reserved.
    fn free_all(&mut self, i: usize) {
        let h = self.handles[i].h;
        let ptrs: Vec<(u64, u64)> = self.handles[i]
            .blocks
            .iter()
            .map(|(&p, &(s, _))| (p, s))
            .collect();
        for (p, size) in ptrs {
            self.check_tag(i, p, size);
            let s = reservoir_allocator_free(h, p as usize as *mut c_void);
            self.check("reservoir_allocator_free", s, &[RESERVOIR_OK], 0);
            self.handles[i].blocks.remove(&p);
            self.handles[i].freed.push(p);
        }
        let s = reservoir_allocator_empty_cache(h);
        self.check("reservoir_allocator_empty_cache", s, &[RESERVOIR_OK], 0);
        let st = self.check_stats(i, "freeing everything and empty_cache");
        if st.allocated != 0
            || st.active != 0
            || st.requested != 0
            || st.reserved != 0
            || st.segments != 0
            || st.inactive_split != 0
        {
            self.fail(format!(
                "everything freed and the cache emptied, yet {st:?}"
            ));
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
