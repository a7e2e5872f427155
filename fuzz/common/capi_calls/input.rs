//! The fuzz input: [`Op`], the calls of one input as `arbitrary` decodes
//! them, and the choices of handles, sizes, streams and pointers they name.

use arbitrary::Arbitrary;

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
