// # Spec errors found
//
// Places where `../shared/spec/pytorch-allocator.md` disagrees with the real
// PyTorch 2.15.0 allocator (torch 2.15.0+cu132, git d0f2af8b, run on the fake
// device of `../shared/oracle`). The real allocator wins; this module follows it.
// Evidence: a C++ probe linking the real `libc10.so`/`libc10_cuda.so` that calls
// `c10::CachingAllocator::setAllocatorSettings` and prints every getter, Python
// runs of `torch.cuda.memory._set_allocator_settings` / `_snapshot()`, the
// strings and disassembly of the 2.15 libraries, and the 2.15 headers shipped
// in the wheel (`torch/include/c10/core/AllocatorConfig.h`,
// `torch/include/c10/cuda/CUDAAllocatorConfig.h`).
//
// 1. spec 1.3, roundup_power2_divisions list form: `>` fills from the entry
//    *after* the last explicit one (`last_index + 1`), not from the last
//    explicit index inclusive. `[256:1,512:2,1024:4,>:8]` gives entries 0..=8
//    -> 1, 9 -> 2, 10 -> 4, 11..=15 -> 8 (snapshot dict {"1":1,...,"256":1,
//    "512":2,"1024":4,"2048":8,...}); the spec's "idx>=10 -> 8" is wrong and
//    PyTorch's documented reading (1 GiB to 2 GiB uses 4 divisions) holds.
//    Consequence: `[>:8]` alone leaves entry 0 (sizes below 2 MiB) at 0.
// 2. spec 1.17, max_split_size_mb: the floor is `large_segment_size_mb`
//    (default 20) and inclusive (`>=`), not a fixed 20 / "> 20".
//    `large_segment_size_mb:64,max_split_size_mb:40` fails with
//    "CachingAllocator option max_split_size_mb too small, must be >= 64".
// 3. spec 1.17, max_non_split_rounding_mb: same floor (`>= large_segment_size_mb`),
//    not "> 20"; its default follows `large_segment_size_mb`, and every parse
//    (also `_set_allocator_settings`) resets it to `large_segment_size` before
//    applying the string.
// 4. spec 1.17, runtime changes: the reset-to-default list is max_split_size,
//    roundup_power2_divisions, garbage_collection_threshold *and*
//    max_non_split_rounding_size (to the current large_segment_size). Every
//    other setting, large_segment_size included, keeps its value.
// 5. spec 1.17 / 1.2, large_segment_size_mb is read in a first pass over the
//    whole string, so its position does not matter for the floors above.
// 6. spec 1.17, environment priority ("unresolved"): PYTORCH_CUDA_ALLOC_CONF
//    wins over PYTORCH_ALLOC_CONF in all three readers (backend selection,
//    CUDA keys, common keys), even when it is set to an empty string. The
//    header comment claiming PYTORCH_ALLOC_CONF has priority is stale.
//    PYTORCH_HIP_ALLOC_CONF is consulted on a CUDA build by the common-key
//    reader only (after the CUDA variable, before PYTORCH_ALLOC_CONF).
// 7. spec 1.17, unknown key text: "Unrecognized key 'X' in CUDA allocator
//    config." is what start-up (environment) parsing raises; runtime
//    `_set_allocator_settings` parses the common keys first and raises
//    "Unrecognized key 'X' in Accelerator allocator config.".
// 8. spec 1.17, key list: 2.15 also accepts pinned_max_round_threshold_mb and
//    pinned_max_cached_size_mb (not in the spec), and already has
//    throw_on_cudamalloc_oom, expandable_segments_reserve,
//    expandable_segments_reserve_by_class and pinned_free_catch_all (listed as
//    "newest main, not analysed"); release_lock_on_hipmalloc and
//    pinned_use_hip_host_register are accepted aliases. expandable_segments_handle_type
//    is *not* a key (rejected as unknown) although an error message mentions it.
// 9. spec 1.17, syntax: the `:` and `,` separators are never checked, only
//    skipped (ConfigTokenizer::checkToken returns a bool that is ignored):
//    `expandable_segments,True` and `max_split_size_mb[40` are accepted. A
//    trailing `,` is accepted. Whitespace is any C `isspace` character
//    (also `\t`, `\n`, `\v`), removed everywhere, even inside a value
//    (`max_split_size_mb:3 0` is 30).
// 10. spec 1.17, backend: 2.15 has no CUDA-version check while parsing, and a
//    runtime string naming the other backend is an internal assert
//    ("Allocator backend parsed at runtime != allocator backend parsed at load
//    time, cudaMallocAsync != native"), naming the same backend is accepted.
// 11. spec 1.17, cudaMallocAsync warning: it is raised when the async backend
//    is combined with a CUDA-specific key (release_lock_on_cudamalloc, the
//    pinned_* keys of the CUDA parser, graph_capture_record_stream_reuse,
//    per_process_memory_fraction, throw_on_cudamalloc_oom, the reserve keys),
//    *not* when combined with max_split_size_mb, roundup_power2_divisions or
//    garbage_collection_threshold, which its text names.
// 12. spec 1.17, pinned_reserve_segment_size_mb must be > 0 when given
//    ("Pinned reserve segment size has to be greater than 0").
// 13. spec 2.5, allocator_settings dict: 2.15 adds "max_round_threshold" and
//    "max_cached_size" (pinned thresholds in bytes, -1 when unset).
//
// Not in the spec at all (so not errors, but easy to get wrong): numbers are
// read with `std::stoull` / `std::stod`, so a leading sign is accepted
// (`-1` wraps to 2^64-1, then the MiB value saturates), trailing garbage is
// ignored (`40abc` is 40, `0x20` is 0), `1e400` and inexact subnormals are
// range errors, and `nan`, `inf` and hexadecimal floats are numbers. The
// reserve values use `std::istringstream` instead (whole token, decimal only)
// and a bad one is a warning, not an error.

//! Allocator settings: `PYTORCH_CUDA_ALLOC_CONF`-style strings, typed and
//! validated exactly as PyTorch 2.15 does it (spec section 1.17).
//!
//! * [`AllocatorConfig::parse`] reads a settings string the way PyTorch reads
//!   `PYTORCH_CUDA_ALLOC_CONF` at start-up; [`AllocatorConfig::from_env`] reads
//!   the environment itself.
//! * [`AllocatorConfig::apply_runtime`] is `torch.cuda.memory._set_allocator_settings`
//!   (`torch._C._accelerator_setAllocatorSettings`): some settings are reset
//!   to their defaults first, the others keep their values.
//! * Errors are [`ConfigError`]s that say what is wrong and what is accepted;
//!   [`ConfigError::pytorch_message`] is the text PyTorch itself raises.
//!
//! One deliberate difference: PyTorch applies a string token by token, so a
//! failing string leaves its settings half-applied. Reservoir parses into a
//! copy and only commits on success; on error nothing changes.
//!
//! ```
//! use reservoir::config::{AllocatorConfig, ConfigError};
//!
//! let cfg = AllocatorConfig::parse(
//!     "max_split_size_mb:256, roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
//! )
//! .unwrap();
//! assert_eq!(cfg.max_split_size, 256 << 20);
//! assert_eq!(cfg.roundup_power2_divisions_for(700 << 20), 2); // 512 MiB..1 GiB
//! assert_eq!(cfg.roundup_power2_divisions_for(1536 << 20), 4); // 1..2 GiB
//! assert_eq!(cfg.roundup_power2_divisions_for(4 << 30), 8); // 2 GiB and up
//!
//! let err = AllocatorConfig::parse("expandable_segments:true").unwrap_err();
//! assert!(matches!(err, ConfigError::InvalidValue { .. }));
//! assert_eq!(
//!     err.pytorch_message(),
//!     "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'"
//! );
//! ```

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

/// 1 MiB.
pub const MIB: u64 = 1 << 20;

/// Number of `roundup_power2_divisions` intervals (1 MiB .. 64 GiB, one per power of two).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// The environment variable PyTorch reads first (it wins even when empty).
pub const ENV_CUDA_ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
/// The ROCm spelling; a CUDA build reads it for the common keys only.
pub const ENV_HIP_ALLOC_CONF: &str = "PYTORCH_HIP_ALLOC_CONF";
/// The device-generic variable, read when `PYTORCH_CUDA_ALLOC_CONF` is unset.
pub const ENV_ALLOC_CONF: &str = "PYTORCH_ALLOC_CONF";

/// Upper bound of `pinned_num_register_threads`.
pub const MAX_REGISTER_THREADS: u64 = 128;

/// `large_segment_size_mb` must be greater than this (kMinLargeAlloc in MiB).
const MIN_LARGE_SEGMENT_MB: u64 = 10;
/// Values in MiB are clamped to this before being multiplied by 1 MiB.
const MAX_MB: u64 = u64::MAX / MIB;

/// Keys read by PyTorch's common (`AcceleratorAllocatorConfig`) parser.
const ACCELERATOR_KEYS: [&str; 9] = [
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "pinned_use_background_threads",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
];

/// Keys read by PyTorch's CUDA (`CUDAAllocatorConfig`) parser.
const CUDA_KEYS: [&str; 13] = [
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register",
    "graph_capture_record_stream_reuse",
    "pinned_reserve_segment_size_mb",
    "pinned_num_register_threads",
    "per_process_memory_fraction",
    "pinned_free_catch_all",
    "throw_on_cudamalloc_oom",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
];

/// Every key PyTorch 2.15 accepts in a settings string (CUDA build).
pub const KNOWN_KEYS: [&str; 22] = [
    "backend",
    "large_segment_size_mb",
    "max_split_size_mb",
    "max_non_split_rounding_mb",
    "garbage_collection_threshold",
    "roundup_power2_divisions",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "release_lock_on_hipmalloc",
    "per_process_memory_fraction",
    "graph_capture_record_stream_reuse",
    "throw_on_cudamalloc_oom",
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "pinned_free_catch_all",
];

fn is_known_key(key: &str) -> bool {
    ACCELERATOR_KEYS.contains(&key) || CUDA_KEYS.contains(&key)
}

/// Which allocator serves device memory (key `backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// PyTorch's caching allocator, the one Reservoir implements.
    #[default]
    Native,
    /// The driver's stream-ordered allocator (`cudaMallocAsync`). Reservoir
    /// records the choice but has no such allocator.
    CudaMallocAsync,
}

impl Backend {
    /// The spelling used in settings strings: `native` or `cudaMallocAsync`.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::CudaMallocAsync => "cudaMallocAsync",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The virtual-address reserve of one expandable segment (keys
/// `expandable_segments_reserve` and `expandable_segments_reserve_by_class`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReserveSpec {
    /// A fraction of the device's total memory (settings value `0.5`).
    Fraction(f64),
    /// An absolute size in GiB (settings value `40G` or `40g`).
    GiB(f64),
}

impl ReserveSpec {
    /// Bytes to reserve on a device with `total_global_mem` bytes, computed in
    /// `f64` and saturated to `u64::MAX` as PyTorch does.
    pub fn resolve_bytes(&self, total_global_mem: u64) -> u64 {
        let bytes = match *self {
            ReserveSpec::Fraction(f) => f * total_global_mem as f64,
            ReserveSpec::GiB(g) => g * (1u64 << 30) as f64,
        };
        if bytes >= u64::MAX as f64 {
            u64::MAX
        } else {
            // Truncation toward zero (and 0 for negatives), like the C++ cast.
            bytes as u64
        }
    }
}

/// Settings of the caching allocator, with PyTorch's defaults.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct AllocatorConfig {
    /// Blocks at least this large are never split ("oversize"); `u64::MAX`
    /// (the default) disables the rule. Key `max_split_size_mb`.
    pub max_split_size: u64,
    /// An oversize block serves an oversize request only if it is less than
    /// this much larger. Default 20 MiB (follows `large_segment_size`).
    /// Key `max_non_split_rounding_mb`.
    pub max_non_split_rounding_size: u64,
    /// Divisions per power-of-two interval for size rounding, indexed by
    /// `floor(log2(size)) - 20` clamped to `0..16`; 0 or 1 means plain 512-byte
    /// rounding. Key `roundup_power2_divisions`.
    pub roundup_power2_divisions: [u64; ROUNDUP_POWER2_INTERVALS],
    /// Fraction of the allowed memory above which cached blocks are garbage
    /// collected; 0 disables. Only active with a memory fraction set.
    /// Key `garbage_collection_threshold`.
    pub garbage_collection_threshold: f64,
    /// Grow one virtual segment per stream instead of allocating new
    /// segments. Key `expandable_segments`.
    pub expandable_segments: bool,
    /// Release the device lock around driver allocations.
    /// Key `release_lock_on_cudamalloc` (alias `release_lock_on_hipmalloc`).
    pub release_lock_on_cudamalloc: bool,
    /// Segment size for requests between 1 MiB and 10 MiB, and the page size
    /// of large-pool expandable segments. Default 20 MiB. Key `large_segment_size_mb`.
    pub large_segment_size: u64,
    /// Fraction of the device this process may reserve. Default 1.0.
    /// Key `per_process_memory_fraction`.
    pub per_process_memory_fraction: f64,
    /// Reuse blocks freed with `record_stream` during graph capture.
    /// Key `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: bool,
    /// The settings string these settings were last parsed from ("" if none).
    pub last_settings: String,
    /// The allocator chosen at start-up. Key `backend`; a runtime string may
    /// only repeat it.
    pub backend: Backend,
    /// Fail an allocation before calling the driver when it would likely run
    /// out of memory. Key `throw_on_cudamalloc_oom`.
    pub throw_on_cudamalloc_oom: bool,
    /// Reserve of every expandable segment whose stream class has no entry in
    /// `expandable_segments_reserve_by_class`; `None` keeps PyTorch's
    /// historical 9/8 of device memory. Key `expandable_segments_reserve`.
    pub expandable_segments_reserve: Option<ReserveSpec>,
    /// Per stream-class reserves. Key `expandable_segments_reserve_by_class`
    /// (`[class:value,...]`; a new list replaces the old one).
    pub expandable_segments_reserve_by_class: BTreeMap<String, ReserveSpec>,
    /// Pinned host memory: register with `cudaHostRegister` instead of
    /// `cudaHostAlloc`. Key `pinned_use_cuda_host_register`.
    pub pinned_use_cuda_host_register: bool,
    /// Pinned host memory: threads used to register a block (a power of two,
    /// at most 128). Default 1. Key `pinned_num_register_threads`.
    pub pinned_num_register_threads: u64,
    /// Pinned host memory: process events on a background thread.
    /// Key `pinned_use_background_threads`.
    pub pinned_use_background_threads: bool,
    /// Pinned host memory: size of the reserved segment in MiB (0 = none).
    /// Key `pinned_reserve_segment_size_mb`.
    pub pinned_reserve_segment_size_mb: u64,
    /// Pinned host memory: requests above this many bytes are not rounded to a
    /// power of two; `u64::MAX` (default) = always round.
    /// Key `pinned_max_round_threshold_mb`.
    pub pinned_max_round_threshold: u64,
    /// Pinned host memory: freed blocks above this many bytes are released
    /// instead of cached; `u64::MAX` (default) = cache all.
    /// Key `pinned_max_cached_size_mb`.
    pub pinned_max_cached_size: u64,
    /// Pinned host memory: let the pinned allocator free any pinned pointer.
    /// Key `pinned_free_catch_all`.
    pub pinned_free_catch_all: bool,
    /// Reservoir-only policy, not PyTorch's (off by default, and then the
    /// allocator is PyTorch-exact): when a stream's pool has no fitting free
    /// block, take one cached on another stream, making the allocating
    /// stream wait on an event recorded on the block's stream (as RMM does)
    /// instead of asking the driver for more memory. The block keeps its
    /// segment's stream and records the allocating stream as a user, so it
    /// returns to its own stream's pool only after the borrower's work.
    /// Needs [`Backend::stream_wait_event`](crate::backend::Backend::stream_wait_event);
    /// on backends without it the policy does nothing. Not a settings-string
    /// key: never parsed from nor written to one.
    pub cross_stream_reuse: bool,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: u64::MAX,
            max_non_split_rounding_size: 20 * MIB,
            roundup_power2_divisions: [0; ROUNDUP_POWER2_INTERVALS],
            garbage_collection_threshold: 0.0,
            expandable_segments: false,
            release_lock_on_cudamalloc: false,
            large_segment_size: 20 * MIB,
            per_process_memory_fraction: 1.0,
            graph_capture_record_stream_reuse: false,
            last_settings: String::new(),
            backend: Backend::Native,
            throw_on_cudamalloc_oom: false,
            expandable_segments_reserve: None,
            expandable_segments_reserve_by_class: BTreeMap::new(),
            pinned_use_cuda_host_register: false,
            pinned_num_register_threads: 1,
            pinned_use_background_threads: false,
            pinned_reserve_segment_size_mb: 0,
            pinned_max_round_threshold: u64::MAX,
            pinned_max_cached_size: u64::MAX,
            pinned_free_catch_all: false,
            cross_stream_reuse: false,
        }
    }
}

impl AllocatorConfig {
    /// The number of divisions that applies to a request of `size` bytes.
    ///
    /// As in PyTorch, `size == 0` maps to the last interval (its `log2`
    /// wraps around); the allocator never asks for sizes below 512.
    #[inline]
    pub fn roundup_power2_divisions_for(&self, size: u64) -> u64 {
        let idx = if size == 0 {
            ROUNDUP_POWER2_INTERVALS - 1
        } else {
            let log = 63 - size.leading_zeros() as usize;
            log.saturating_sub(20).min(ROUNDUP_POWER2_INTERVALS - 1)
        };
        self.roundup_power2_divisions[idx]
    }

    /// Parses a settings string as PyTorch reads `PYTORCH_CUDA_ALLOC_CONF`
    /// at start-up: the backend scan, then the CUDA keys, then the common
    /// keys, each against PyTorch's defaults. Same result as
    /// [`AllocatorConfig::from_env_with`] with only that variable set, except
    /// that errors are not wrapped in [`ConfigError::Env`].
    pub fn parse(s: &str) -> Result<AllocatorConfig, ConfigError> {
        Self::parse_with_warnings(s).map(|(cfg, _)| cfg)
    }

    /// [`AllocatorConfig::parse`], also returning the warnings PyTorch would
    /// print (it prints them on stderr and carries on).
    pub fn parse_with_warnings(
        s: &str,
    ) -> Result<(AllocatorConfig, Vec<ConfigWarning>), ConfigError> {
        let mut warnings = Vec::new();
        let cfg = startup_parse(Some((s, None)), Some((s, None)), &mut warnings)?;
        Ok((cfg, warnings))
    }

    /// Reads the settings from the process environment, as PyTorch does at
    /// start-up (see [`AllocatorConfig::from_env_with`]). Values that are not
    /// valid Unicode are read lossily.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        Self::from_env_with(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the settings through `lookup` (a variable name to its value, or
    /// `None` when unset), with PyTorch 2.15's priorities:
    ///
    /// * backend and CUDA keys: `PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_ALLOC_CONF`;
    /// * common keys (and [`AllocatorConfig::last_settings`]):
    ///   `PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_HIP_ALLOC_CONF`, else
    ///   `PYTORCH_ALLOC_CONF`.
    ///
    /// A variable set to the empty string counts as set. Errors name the
    /// variable ([`ConfigError::Env`]).
    pub fn from_env_with<F>(lookup: F) -> Result<AllocatorConfig, ConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        Self::from_env_with_warnings(lookup).map(|(cfg, _)| cfg)
    }

    /// [`AllocatorConfig::from_env_with`], also returning PyTorch's warnings.
    pub fn from_env_with_warnings<F>(
        mut lookup: F,
    ) -> Result<(AllocatorConfig, Vec<ConfigWarning>), ConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        let cuda = lookup(ENV_CUDA_ALLOC_CONF);
        let hip = lookup(ENV_HIP_ALLOC_CONF);
        let generic = lookup(ENV_ALLOC_CONF);
        let cuda_src = match (&cuda, &generic) {
            (Some(v), _) => Some((v.as_str(), Some(ENV_CUDA_ALLOC_CONF))),
            (None, Some(v)) => Some((v.as_str(), Some(ENV_ALLOC_CONF))),
            (None, None) => None,
        };
        let common_src = match (&cuda, &hip, &generic) {
            (Some(v), _, _) => Some((v.as_str(), Some(ENV_CUDA_ALLOC_CONF))),
            (None, Some(v), _) => Some((v.as_str(), Some(ENV_HIP_ALLOC_CONF))),
            (None, None, Some(v)) => Some((v.as_str(), Some(ENV_ALLOC_CONF))),
            (None, None, None) => None,
        };
        let mut warnings = Vec::new();
        let cfg = startup_parse(cuda_src, common_src, &mut warnings)?;
        Ok((cfg, warnings))
    }

    /// Applies a settings string at run time, as
    /// `torch.cuda.memory._set_allocator_settings` (2.15:
    /// `torch._C._accelerator_setAllocatorSettings`) does: first
    /// `max_split_size`, `roundup_power2_divisions` and
    /// `garbage_collection_threshold` go back to their defaults and
    /// `max_non_split_rounding_size` to `large_segment_size`; then the common
    /// keys and the CUDA keys of `s` are applied. Everything else keeps its
    /// value; `backend` may only repeat the start-up backend.
    ///
    /// On error `self` is left unchanged (PyTorch would leave it half-applied).
    pub fn apply_runtime(&mut self, s: &str) -> Result<(), ConfigError> {
        self.apply_runtime_with_warnings(s).map(|_| ())
    }

    /// [`AllocatorConfig::apply_runtime`], also returning PyTorch's warnings.
    pub fn apply_runtime_with_warnings(
        &mut self,
        s: &str,
    ) -> Result<Vec<ConfigWarning>, ConfigError> {
        let mut warnings = Vec::new();
        let mut next = self.clone();
        let tokens = Tokens::new(s);
        accelerator_pass(&mut next, &tokens, &mut warnings)?;
        next.last_settings = s.to_owned();
        let loaded = self.backend;
        cuda_pass(&mut next, &tokens, loaded, &mut warnings)?;
        *self = next;
        Ok(warnings)
    }

    /// A settings string that reproduces these settings: parsing it (from the
    /// defaults) gives back `self`, apart from `last_settings`. Only settings
    /// that differ from their defaults are written. Values that no settings
    /// string can produce (sizes that are not whole MiB, divisions that are not
    /// 0 or a power of two, out-of-range fractions) are written as best they
    /// can be and will not read back the same.
    pub fn to_settings_string(&self) -> String {
        let d = AllocatorConfig::default();
        let mut parts: Vec<String> = Vec::new();
        let flag = |parts: &mut Vec<String>, key: &str, on: bool| {
            if on {
                parts.push(format!("{key}:True"));
            }
        };
        if self.backend != d.backend {
            parts.push(format!("backend:{}", self.backend));
        }
        if self.large_segment_size != d.large_segment_size {
            parts.push(format!(
                "large_segment_size_mb:{}",
                self.large_segment_size / MIB
            ));
        }
        if self.max_split_size != d.max_split_size {
            parts.push(format!("max_split_size_mb:{}", self.max_split_size / MIB));
        }
        if self.max_non_split_rounding_size != self.large_segment_size {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                self.max_non_split_rounding_size / MIB
            ));
        }
        if self.garbage_collection_threshold.to_bits() != d.garbage_collection_threshold.to_bits() {
            parts.push(format!(
                "garbage_collection_threshold:{}",
                format_c_double(self.garbage_collection_threshold)
            ));
        }
        let div = &self.roundup_power2_divisions;
        if div.iter().any(|&v| v != 0) {
            if div.iter().all(|&v| v == div[0]) && div[0].is_power_of_two() {
                parts.push(format!("roundup_power2_divisions:{}", div[0]));
            } else {
                let list: Vec<String> = div
                    .iter()
                    .enumerate()
                    .map(|(i, v)| format!("{}:{v}", 1u64 << i))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", list.join(",")));
            }
        }
        flag(&mut parts, "expandable_segments", self.expandable_segments);
        flag(
            &mut parts,
            "pinned_use_background_threads",
            self.pinned_use_background_threads,
        );
        if self.pinned_max_round_threshold != d.pinned_max_round_threshold {
            parts.push(format!(
                "pinned_max_round_threshold_mb:{}",
                self.pinned_max_round_threshold / MIB
            ));
        }
        if self.pinned_max_cached_size != d.pinned_max_cached_size {
            parts.push(format!(
                "pinned_max_cached_size_mb:{}",
                self.pinned_max_cached_size / MIB
            ));
        }
        flag(
            &mut parts,
            "release_lock_on_cudamalloc",
            self.release_lock_on_cudamalloc,
        );
        flag(
            &mut parts,
            "pinned_use_cuda_host_register",
            self.pinned_use_cuda_host_register,
        );
        if self.pinned_num_register_threads != d.pinned_num_register_threads {
            parts.push(format!(
                "pinned_num_register_threads:{}",
                self.pinned_num_register_threads
            ));
        }
        if self.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb {
            parts.push(format!(
                "pinned_reserve_segment_size_mb:{}",
                self.pinned_reserve_segment_size_mb
            ));
        }
        flag(
            &mut parts,
            "graph_capture_record_stream_reuse",
            self.graph_capture_record_stream_reuse,
        );
        if self.per_process_memory_fraction.to_bits() != d.per_process_memory_fraction.to_bits() {
            parts.push(format!(
                "per_process_memory_fraction:{}",
                format_c_double(self.per_process_memory_fraction)
            ));
        }
        flag(
            &mut parts,
            "pinned_free_catch_all",
            self.pinned_free_catch_all,
        );
        flag(
            &mut parts,
            "throw_on_cudamalloc_oom",
            self.throw_on_cudamalloc_oom,
        );
        if let Some(spec) = self.expandable_segments_reserve {
            parts.push(format!(
                "expandable_segments_reserve:{}",
                format_reserve(spec)
            ));
        }
        if !self.expandable_segments_reserve_by_class.is_empty() {
            let list: Vec<String> = self
                .expandable_segments_reserve_by_class
                .iter()
                .map(|(class, spec)| format!("{class}:{}", format_reserve(*spec)))
                .collect();
            parts.push(format!(
                "expandable_segments_reserve_by_class:[{}]",
                list.join(",")
            ));
        }
        parts.join(",")
    }
}

/// `f64` text that C's `strtod` reads back exactly: the shortest round-trip
/// decimal, or a hexadecimal float for subnormals (an inexact decimal
/// subnormal is a range error for `strtod`).
fn format_c_double(v: f64) -> String {
    if v.is_subnormal() {
        let sign = if v.is_sign_negative() { "-" } else { "" };
        format!("{sign}0x0.{:013x}p-1022", v.to_bits() & ((1u64 << 52) - 1))
    } else {
        format!("{v:?}")
    }
}

fn format_reserve(spec: ReserveSpec) -> String {
    match spec {
        ReserveSpec::Fraction(f) => format!("{f:?}"),
        ReserveSpec::GiB(g) => format!("{g:?}G"),
    }
}

// ---------------------------------------------------------------------------
// Errors and warnings
// ---------------------------------------------------------------------------

/// Which of PyTorch's two parsers rejected a key. Start-up parsing runs the
/// CUDA parser first, `_set_allocator_settings` the common one first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyParser {
    /// `c10::CachingAllocator::AcceleratorAllocatorConfig` (common keys).
    Accelerator,
    /// `c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig` (CUDA keys).
    Cuda,
}

/// The rule a value broke, with what is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueRule {
    /// Exactly `True` or `False` (case-sensitive).
    TrueOrFalse,
    /// `native` or `cudaMallocAsync` (case-sensitive).
    Backend,
    /// At least `min` MiB (the floor is `large_segment_size_mb`).
    AtLeastMib {
        /// The smallest accepted value.
        min: u64,
    },
    /// More than `min` MiB.
    GreaterThanMib {
        /// The accepted values are above this.
        min: u64,
    },
    /// A number strictly between 0.0 and 1.0.
    OpenUnitInterval,
    /// A number from 0.0 to 1.0 inclusive.
    UnitInterval,
    /// A power of two (single-value `roundup_power2_divisions`).
    DivisionsPowerOfTwo,
    /// 0 or a power of two (a division in the list form).
    DivisionsPowerOfTwoOrZero,
    /// `>` or a power-of-two size in MiB (an interval in the list form).
    IntervalPowerOfTwo,
    /// A power of two (`pinned_num_register_threads`).
    ThreadsPowerOfTwo {
        /// The value as PyTorch read it.
        got: u64,
    },
    /// At most `max` (`pinned_num_register_threads`).
    ThreadsAtMost {
        /// The largest accepted value.
        max: u64,
        /// The value as PyTorch read it.
        got: u64,
    },
    /// Greater than 0.
    Positive,
    /// An integer (`std::stoull` found no digits).
    Integer,
    /// An integer that fits in 64 bits.
    IntegerInRange,
    /// A number (`std::stod` found none).
    Number,
    /// A number representable as a double (`std::stod` range error).
    NumberInRange,
}

impl fmt::Display for ValueRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueRule::TrueOrFalse => {
                f.write_str("expected `True` or `False` (case-sensitive, e.g. `expandable_segments:True`)")
            }
            ValueRule::Backend => {
                f.write_str("expected `native` or `cudaMallocAsync` (case-sensitive)")
            }
            ValueRule::AtLeastMib { min } => write!(
                f,
                "must be at least {min} (MiB; the floor is large_segment_size_mb); use a larger value or drop the key"
            ),
            ValueRule::GreaterThanMib { min } => {
                write!(f, "must be greater than {min} (MiB); use a larger value or drop the key")
            }
            ValueRule::OpenUnitInterval => f.write_str(
                "must be a number strictly between 0.0 and 1.0 (e.g. 0.8); drop the key to disable",
            ),
            ValueRule::UnitInterval => {
                f.write_str("must be a number from 0.0 to 1.0 inclusive (e.g. 0.5)")
            }
            ValueRule::DivisionsPowerOfTwo => f.write_str(
                "the number of divisions must be a power of two (1, 2, 4, 8, ...); to turn rounding off for some sizes use the list form, e.g. [256:0,>:4]",
            ),
            ValueRule::DivisionsPowerOfTwoOrZero => f.write_str(
                "the number of divisions must be 0 (no rounding) or a power of two (1, 2, 4, 8, ...)",
            ),
            ValueRule::IntervalPowerOfTwo => f.write_str(
                "list entries must start with `>` or a power-of-two size in MiB (1, 2, 4, ..., 32768), e.g. [256:1,512:2,>:4]",
            ),
            ValueRule::ThreadsPowerOfTwo { got } => {
                write!(f, "must be a power of two from 1 to {MAX_REGISTER_THREADS} (read as {got})")
            }
            ValueRule::ThreadsAtMost { max, got } => {
                write!(f, "must be at most {max} (read as {got}); use a power of two up to {max}")
            }
            ValueRule::Positive => f.write_str("must be greater than 0; drop the key for no reserve"),
            ValueRule::Integer => f.write_str("expected a decimal integer"),
            ValueRule::IntegerInRange => {
                f.write_str("the integer does not fit in 64 bits; use a smaller value")
            }
            ValueRule::Number => f.write_str("expected a number (e.g. 0.5)"),
            ValueRule::NumberInRange => f.write_str(
                "the number overflows or underflows a double; use a value of ordinary size",
            ),
        }
    }
}

/// Where PyTorch's internal assertion for a syntax error sits (it is part
/// of the text PyTorch raises).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssertSite {
    /// `ConfigTokenizer::operator[]`, AllocatorConfig.h:54.
    TokenizerIndex,
    /// `ConfigTokenizer::checkIndex`, AllocatorConfig.h:123.
    TokenizerCheckIndex,
    /// `ConfigTokenizer::skipKey`, AllocatorConfig.h:114.
    TokenizerSkipKey,
    /// `parseRoundUpPower2Divisions`, AllocatorConfig.cpp:213.
    RoundupList,
}

/// What is malformed about a settings string.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyntaxProblem {
    /// The string ends where `expected` should have come.
    UnexpectedEnd {
        /// What should have followed, e.g. "`:` after `expandable_segments`".
        expected: String,
        /// PyTorch's assertion.
        site: AssertSite,
    },
    /// A `[` opens a list that no `]` closes.
    UnclosedList {
        /// The key whose value the list is.
        key: String,
        /// PyTorch's assertion.
        site: AssertSite,
    },
}

impl fmt::Display for SyntaxProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyntaxProblem::UnexpectedEnd { expected, .. } => write!(
                f,
                "the settings end where {expected} was expected; write `key:value` pairs separated by commas, e.g. `expandable_segments:True,max_split_size_mb:128`"
            ),
            SyntaxProblem::UnclosedList { key, .. } => {
                let example = if key == "roundup_power2_divisions" {
                    "[256:1,512:2,>:4]"
                } else {
                    "[name:value,name:value]"
                };
                write!(
                    f,
                    "the list of `{key}` opened here is never closed; add the missing `]`, e.g. `{key}:{example}`"
                )
            }
        }
    }
}

/// The exception PyTorch raises for a [`ConfigError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyTorchException {
    /// `c10::ValueError`; Python `ValueError`.
    ValueError,
    /// `c10::Error` from a failed internal assertion; Python `RuntimeError`.
    InternalAssert,
    /// `std::invalid_argument` from `stoull`/`stod`; Python `ValueError` from
    /// `_set_allocator_settings`, `RuntimeError` at start-up.
    InvalidArgument,
    /// `std::out_of_range` from `stoull`/`stod`; Python `IndexError`.
    OutOfRange,
}

/// A settings string PyTorch would reject.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key that PyTorch 2.15 does not know.
    #[error(
        "unknown allocator setting `{key}` (token {index}, byte {offset}); {}",
        unknown_key_advice(key)
    )]
    UnknownKey {
        /// The key as written (whitespace removed).
        key: String,
        /// Token index in the string.
        index: usize,
        /// Byte offset in the string.
        offset: usize,
        /// The parser that rejected it (decides PyTorch's wording).
        parser: KeyParser,
    },
    /// A value that breaks the key's rule.
    #[error("invalid value `{value}` for `{key}` (token {index}, byte {offset}): {rule}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The offending token (whitespace removed).
        value: String,
        /// Token index of `value`.
        index: usize,
        /// Byte offset of `value`.
        offset: usize,
        /// What is accepted.
        rule: ValueRule,
    },
    /// The string is cut short or a list is not closed.
    #[error("malformed allocator settings at byte {offset} (token {index}): {problem}")]
    Syntax {
        /// Token index where the problem shows.
        index: usize,
        /// Byte offset where the problem shows.
        offset: usize,
        /// What is wrong.
        problem: SyntaxProblem,
    },
    /// A runtime string names another backend than the one chosen at start-up.
    #[error(
        "`backend:{requested}` (token {index}, byte {offset}) differs from the backend chosen at start-up (`{loaded}`); the backend can only be chosen through the environment before the allocator starts, so drop `backend` from run-time settings"
    )]
    BackendMismatch {
        /// The backend in the string.
        requested: Backend,
        /// The backend chosen at start-up.
        loaded: Backend,
        /// Token index of the value.
        index: usize,
        /// Byte offset of the value.
        offset: usize,
    },
    /// An error in the value of an environment variable.
    #[error("{var}: {error}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with its value.
        error: Box<ConfigError>,
    },
}

/// "Did you mean" for a misspelt key, else the list of accepted keys.
fn unknown_key_advice(key: &str) -> String {
    let lower = key.to_ascii_lowercase();
    let best = KNOWN_KEYS
        .iter()
        .map(|k| (edit_distance(&lower, k), *k))
        .min();
    match best {
        Some((d, k)) if d <= 3 && d < key.len() => {
            format!("did you mean `{k}`? (keys are case-sensitive)")
        }
        _ => format!(
            "remove it or fix its spelling (accepted keys: {})",
            KNOWN_KEYS.join(", ")
        ),
    }
}

/// Levenshtein distance over bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

const H_FILE: &str = "/__w/pytorch/pytorch/c10/core/AllocatorConfig.h";
const CPP_FILE: &str = "/__w/pytorch/pytorch/c10/core/AllocatorConfig.cpp";
const CUDA_CPP_FILE: &str = "/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp";

impl ConfigError {
    /// The message PyTorch 2.15 raises for this error (without its C++
    /// stack trace), e.g. `Unrecognized key 'bogus' in CUDA allocator config.`.
    pub fn pytorch_message(&self) -> String {
        match self {
            ConfigError::UnknownKey { key, parser, .. } => {
                let which = match parser {
                    KeyParser::Accelerator => "Accelerator",
                    KeyParser::Cuda => "CUDA",
                };
                format!("Unrecognized key '{key}' in {which} allocator config.")
            }
            ConfigError::InvalidValue {
                key,
                value,
                index,
                rule,
                ..
            } => match rule {
                ValueRule::TrueOrFalse => format!(
                    "Expected 'True' or 'False' at index {index} in ConfigTokenizer but got '{value}'"
                ),
                ValueRule::Backend => {
                    "Unknown allocator backend, options are native and cudaMallocAsync".to_owned()
                }
                ValueRule::AtLeastMib { min } => {
                    format!("CachingAllocator option {key} too small, must be >= {min}")
                }
                ValueRule::GreaterThanMib { min } => {
                    format!("CachingAllocator option {key} must be > {min} MB")
                }
                ValueRule::OpenUnitInterval => {
                    "garbage_collect_threshold is invalid, set it in (0.0, 1.0)".to_owned()
                }
                ValueRule::UnitInterval => {
                    format!("{key} is invalid, set it in [0.0, 1.0]")
                }
                ValueRule::DivisionsPowerOfTwo => {
                    "For roundups, the divisions has to be power of 2 ".to_owned()
                }
                ValueRule::DivisionsPowerOfTwoOrZero => {
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
                        .to_owned()
                }
                ValueRule::IntervalPowerOfTwo => {
                    "For roundups, the intervals have to be power of 2 ".to_owned()
                }
                ValueRule::ThreadsPowerOfTwo { got } => {
                    format!("Number of register threads has to be power of 2, got {got}")
                }
                ValueRule::ThreadsAtMost { max, got } => format!(
                    "Number of register threads should be less than or equal to {max}, got {got}"
                ),
                ValueRule::Positive => {
                    "Pinned reserve segment size has to be greater than 0".to_owned()
                }
                ValueRule::Integer | ValueRule::IntegerInRange => "stoull".to_owned(),
                ValueRule::Number | ValueRule::NumberInRange => "stod".to_owned(),
            },
            ConfigError::Syntax { problem, .. } => {
                let site = match problem {
                    SyntaxProblem::UnexpectedEnd { site, .. }
                    | SyntaxProblem::UnclosedList { site, .. } => *site,
                };
                let bracket = "Expected closing bracket ']' in ConfigTokenizer but reached end of config";
                let index = "Index out of bounds in ConfigTokenizer";
                let (cond, file, line, text) = match site {
                    AssertSite::TokenizerIndex => ("i < config_.size()", H_FILE, 54, index),
                    AssertSite::TokenizerCheckIndex => ("i < config_.size()", H_FILE, 123, index),
                    AssertSite::TokenizerSkipKey => ("i < config_.size()", H_FILE, 114, bracket),
                    AssertSite::RoundupList => ("i < tokenizer.size()", CPP_FILE, 213, bracket),
                };
                format!(
                    "{cond} INTERNAL ASSERT FAILED at \"{file}\":{line}, please report a bug to PyTorch. {text}"
                )
            }
            ConfigError::BackendMismatch {
                requested, loaded, ..
            } => format!(
                "tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"{CUDA_CPP_FILE}\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, {requested} != {loaded}"
            ),
            ConfigError::Env { error, .. } => error.pytorch_message(),
        }
    }

    /// The exception PyTorch 2.15 raises for this error.
    pub fn pytorch_exception(&self) -> PyTorchException {
        match self {
            ConfigError::UnknownKey { .. } => PyTorchException::ValueError,
            ConfigError::InvalidValue { rule, .. } => match rule {
                ValueRule::Integer | ValueRule::Number => PyTorchException::InvalidArgument,
                ValueRule::IntegerInRange | ValueRule::NumberInRange => {
                    PyTorchException::OutOfRange
                }
                _ => PyTorchException::ValueError,
            },
            ConfigError::Syntax { .. } | ConfigError::BackendMismatch { .. } => {
                PyTorchException::InternalAssert
            }
            ConfigError::Env { error, .. } => error.pytorch_exception(),
        }
    }
}

/// Something PyTorch warns about (on stderr) while accepting the string.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConfigWarning {
    /// `backend:cudaMallocAsync` together with a key of the native allocator
    /// that the CUDA parser reads.
    AsyncBackendIgnoresNativeOptions,
    /// Both pinned thresholds in one string, rounding limit above cache limit.
    /// PyTorch prints this once per process.
    PinnedRoundThresholdAboveCachedSize {
        /// `pinned_max_round_threshold_mb` as stored (MiB).
        round_threshold_mb: u64,
        /// `pinned_max_cached_size_mb` as stored (MiB).
        cached_size_mb: u64,
    },
    /// An expandable-segment reserve value PyTorch ignores (it keeps the
    /// previous setting, or skips that class).
    InvalidReserveValue {
        /// The value as written (whitespace removed).
        value: String,
    },
}

impl ConfigWarning {
    /// The warning text PyTorch 2.15 prints.
    pub fn pytorch_message(&self) -> String {
        match self {
            ConfigWarning::AsyncBackendIgnoresNativeOptions => {
                "backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold.".to_owned()
            }
            ConfigWarning::PinnedRoundThresholdAboveCachedSize {
                round_threshold_mb,
                cached_size_mb,
            } => format!(
                "pinned_max_round_threshold_mb ({round_threshold_mb}) > pinned_max_cached_size_mb ({cached_size_mb}). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."
            ),
            ConfigWarning::InvalidReserveValue { value } => format!(
                "Ignoring invalid expandable-segment reserve value '{value}' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."
            ),
        }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::AsyncBackendIgnoresNativeOptions => f.write_str(
                "backend:cudaMallocAsync is set, so the native allocator's settings in this string have no effect",
            ),
            ConfigWarning::PinnedRoundThresholdAboveCachedSize {
                round_threshold_mb,
                cached_size_mb,
            } => write!(
                f,
                "pinned_max_round_threshold_mb ({round_threshold_mb}) is above pinned_max_cached_size_mb ({cached_size_mb}); pinned requests above the cache limit are never rounded up"
            ),
            ConfigWarning::InvalidReserveValue { value } => write!(
                f,
                "ignored expandable-segment reserve `{value}`: expected a positive fraction of device memory (e.g. 0.5) or a size in GiB (e.g. 40G)"
            ),
        }
    }
}

// ---------------------------------------------------------------------------
// Tokenizer (c10::CachingAllocator::ConfigTokenizer)
// ---------------------------------------------------------------------------

/// C `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

struct Token {
    text: String,
    offset: usize,
}

/// The string cut at `,` `:` `[` `]` (each its own token), whitespace removed.
struct Tokens {
    toks: Vec<Token>,
    end: usize,
}

impl Tokens {
    fn new(s: &str) -> Tokens {
        let mut toks = Vec::new();
        let mut buf = String::new();
        let mut start = 0;
        for (pos, ch) in s.char_indices() {
            if matches!(ch, ',' | ':' | '[' | ']') {
                if !buf.is_empty() {
                    toks.push(Token {
                        text: std::mem::take(&mut buf),
                        offset: start,
                    });
                }
                toks.push(Token {
                    text: ch.to_string(),
                    offset: pos,
                });
            } else if !(ch.is_ascii() && is_c_space(ch as u8)) {
                if buf.is_empty() {
                    start = pos;
                }
                buf.push(ch);
            }
        }
        if !buf.is_empty() {
            toks.push(Token {
                text: buf,
                offset: start,
            });
        }
        Tokens { toks, end: s.len() }
    }

    fn len(&self) -> usize {
        self.toks.len()
    }

    fn text(&self, i: usize) -> &str {
        &self.toks[i].text
    }

    fn offset(&self, i: usize) -> usize {
        self.toks.get(i).map_or(self.end, |t| t.offset)
    }

    /// Token `i`, or PyTorch's index assertion at `site`.
    fn get(
        &self,
        i: usize,
        site: AssertSite,
        expected: impl FnOnce() -> String,
    ) -> Result<&str, ConfigError> {
        match self.toks.get(i) {
            Some(t) => Ok(&t.text),
            None => Err(ConfigError::Syntax {
                index: i,
                offset: self.end,
                problem: SyntaxProblem::UnexpectedEnd {
                    expected: expected(),
                    site,
                },
            }),
        }
    }

    /// `checkToken`: whether token `i` is `tok`; only a missing token fails.
    fn check(
        &self,
        i: usize,
        tok: &str,
        expected: impl FnOnce() -> String,
    ) -> Result<bool, ConfigError> {
        Ok(self.get(i, AssertSite::TokenizerCheckIndex, expected)? == tok)
    }

    /// `checkToken(i, ":")` after `key`.
    fn colon(&self, i: usize, key: &str) -> Result<(), ConfigError> {
        self.check(i, ":", || format!("`:` after `{key}`"))
            .map(|_| ())
    }

    fn invalid(&self, key: &str, i: usize, rule: ValueRule) -> ConfigError {
        ConfigError::InvalidValue {
            key: key.to_owned(),
            value: self
                .toks
                .get(i)
                .map_or_else(String::new, |t| t.text.clone()),
            index: i,
            offset: self.offset(i),
            rule,
        }
    }

    /// `toSizeT`: `std::stoull` of token `i`.
    fn size_t(&self, i: usize, key: &str) -> Result<u64, ConfigError> {
        let text = self.get(i, AssertSite::TokenizerCheckIndex, || {
            format!("a value for `{key}`")
        })?;
        c_stoull(text).map_err(|e| {
            let rule = match e {
                NumError::Invalid => ValueRule::Integer,
                NumError::Range => ValueRule::IntegerInRange,
            };
            self.invalid(key, i, rule)
        })
    }

    /// `toDouble`: `std::stod` of token `i`.
    fn double(&self, i: usize, key: &str) -> Result<f64, ConfigError> {
        let text = self.get(i, AssertSite::TokenizerCheckIndex, || {
            format!("a value for `{key}`")
        })?;
        c_stod(text).map_err(|e| {
            let rule = match e {
                NumError::Invalid => ValueRule::Number,
                NumError::Range => ValueRule::NumberInRange,
            };
            self.invalid(key, i, rule)
        })
    }

    /// `toBool`: exactly `True` or `False`.
    fn boolean(&self, i: usize, key: &str) -> Result<bool, ConfigError> {
        match self.get(i, AssertSite::TokenizerCheckIndex, || {
            format!("`True` or `False` for `{key}`")
        })? {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(self.invalid(key, i, ValueRule::TrueOrFalse)),
        }
    }

    /// `skipKey`: from a key to its value, or to the `]` closing a list value.
    fn skip_key(&self, i: usize) -> Result<usize, ConfigError> {
        let key = self.text(i).to_owned();
        self.colon(i + 1, &key)?;
        let mut j = i + 2;
        let value = self.get(j, AssertSite::TokenizerCheckIndex, || {
            format!("a value for `{key}`")
        })?;
        if value != "[" {
            return Ok(j);
        }
        let open = j;
        j += 1;
        while j < self.len() && self.text(j) != "]" {
            j += 1;
        }
        if j >= self.len() {
            return Err(ConfigError::Syntax {
                index: open,
                offset: self.offset(open),
                problem: SyntaxProblem::UnclosedList {
                    key,
                    site: AssertSite::TokenizerSkipKey,
                },
            });
        }
        Ok(j)
    }
}

// ---------------------------------------------------------------------------
// The three readers of PyTorch 2.15
// ---------------------------------------------------------------------------

/// A settings string and, when it came from the environment, its variable.
type Source<'a> = Option<(&'a str, Option<&'static str>)>;

/// Start-up parsing in PyTorch's order: the backend scan and the CUDA keys
/// of `cuda_src`, then the common keys of `common_src`.
fn startup_parse(
    cuda_src: Source<'_>,
    common_src: Source<'_>,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<AllocatorConfig, ConfigError> {
    fn wrap(var: Option<&'static str>) -> impl Fn(ConfigError) -> ConfigError {
        move |e| match var {
            Some(var) => ConfigError::Env {
                var,
                error: Box::new(e),
            },
            None => e,
        }
    }
    let mut cfg = AllocatorConfig::default();
    if let Some((src, var)) = cuda_src {
        let tokens = Tokens::new(src);
        cfg.backend = backend_scan(&tokens).map_err(wrap(var))?;
        let loaded = cfg.backend;
        cuda_pass(&mut cfg, &tokens, loaded, warnings).map_err(wrap(var))?;
    }
    if let Some((src, var)) = common_src {
        accelerator_pass(&mut cfg, &Tokens::new(src), warnings).map_err(wrap(var))?;
        cfg.last_settings = src.to_owned();
    }
    Ok(cfg)
}

/// `BackendStaticInitializer::parseEnvForBackend`: the first `backend` key
/// decides; other keys are skipped with `skipKey`.
fn backend_scan(t: &Tokens) -> Result<Backend, ConfigError> {
    let n = t.len();
    let mut i = 0;
    while i < n {
        if t.text(i) == "backend" {
            t.colon(i + 1, "backend")?;
            let v = t.get(i + 2, AssertSite::TokenizerIndex, || {
                "a value for `backend`".to_owned()
            })?;
            return Ok(if v == "cudaMallocAsync" {
                Backend::CudaMallocAsync
            } else {
                Backend::Native
            });
        }
        i = t.skip_key(i)?;
        if i + 1 < n {
            i += 1;
        }
        i += 1;
    }
    Ok(Backend::Native)
}

fn mib_value(v: u64) -> u64 {
    v.min(MAX_MB) * MIB
}

/// `AcceleratorAllocatorConfig::parseArgs`: the common keys.
fn accelerator_pass(
    cfg: &mut AllocatorConfig,
    t: &Tokens,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<(), ConfigError> {
    // Reset to defaults on every parse.
    cfg.max_split_size = u64::MAX;
    cfg.roundup_power2_divisions = [0; ROUNDUP_POWER2_INTERVALS];
    cfg.garbage_collection_threshold = 0.0;

    let n = t.len();
    // large_segment_size_mb first: it is the floor of two other keys.
    let mut i = 0;
    while i < n {
        if t.text(i) == "large_segment_size_mb" {
            const KEY: &str = "large_segment_size_mb";
            t.colon(i + 1, KEY)?;
            i += 2;
            let v = t.size_t(i, KEY)?;
            if v <= MIN_LARGE_SEGMENT_MB {
                return Err(t.invalid(
                    KEY,
                    i,
                    ValueRule::GreaterThanMib {
                        min: MIN_LARGE_SEGMENT_MB,
                    },
                ));
            }
            cfg.large_segment_size = mib_value(v);
        }
        i += 1;
    }
    cfg.max_non_split_rounding_size = cfg.large_segment_size;

    let mut saw_round_threshold = false;
    let mut saw_cached_size = false;
    let mut i = 0;
    while i < n {
        let key = t.text(i).to_owned();
        match key.as_str() {
            "large_segment_size_mb" => i = t.skip_key(i)?,
            "max_split_size_mb" | "max_non_split_rounding_mb" => {
                t.colon(i + 1, &key)?;
                let min = cfg.large_segment_size / MIB;
                i += 2;
                let v = t.size_t(i, &key)?;
                if v < min {
                    return Err(t.invalid(&key, i, ValueRule::AtLeastMib { min }));
                }
                if key == "max_split_size_mb" {
                    cfg.max_split_size = mib_value(v);
                } else {
                    cfg.max_non_split_rounding_size = mib_value(v);
                }
            }
            "garbage_collection_threshold" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = t.double(i, &key)?;
                if !(v > 0.0 && v < 1.0) {
                    return Err(t.invalid(&key, i, ValueRule::OpenUnitInterval));
                }
                cfg.garbage_collection_threshold = v;
            }
            "roundup_power2_divisions" => {
                i = parse_roundup(cfg, t, i)?;
            }
            "expandable_segments" => {
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.expandable_segments = t.boolean(i, &key)?;
            }
            "pinned_use_background_threads" => {
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.pinned_use_background_threads = t.boolean(i, &key)?;
            }
            "pinned_max_round_threshold_mb" | "pinned_max_cached_size_mb" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = mib_value(t.size_t(i, &key)?);
                if key == "pinned_max_round_threshold_mb" {
                    saw_round_threshold = true;
                    cfg.pinned_max_round_threshold = v;
                } else {
                    saw_cached_size = true;
                    cfg.pinned_max_cached_size = v;
                }
            }
            _ => {
                if !is_known_key(&key) {
                    return Err(ConfigError::UnknownKey {
                        key,
                        index: i,
                        offset: t.offset(i),
                        parser: KeyParser::Accelerator,
                    });
                }
                i = t.skip_key(i)?;
            }
        }
        // The separator is skipped, never checked.
        if i + 1 < n {
            i += 1;
        }
        i += 1;
    }
    if saw_round_threshold
        && saw_cached_size
        && cfg.pinned_max_round_threshold > cfg.pinned_max_cached_size
    {
        warnings.push(ConfigWarning::PinnedRoundThresholdAboveCachedSize {
            round_threshold_mb: cfg.pinned_max_round_threshold / MIB,
            cached_size_mb: cfg.pinned_max_cached_size / MIB,
        });
    }
    Ok(())
}

/// `parseRoundUpPower2Divisions`; `i` is the key, returns the last index used.
fn parse_roundup(
    cfg: &mut AllocatorConfig,
    t: &Tokens,
    mut i: usize,
) -> Result<usize, ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    let table = &mut cfg.roundup_power2_divisions;
    t.colon(i + 1, KEY)?;
    i += 2;
    let first = t.get(i, AssertSite::TokenizerIndex, || {
        format!("a value for `{KEY}`")
    })?;
    if first != "[" {
        // Single value for every interval.
        let v = t.size_t(i, KEY)?;
        if !v.is_power_of_two() {
            return Err(t.invalid(KEY, i, ValueRule::DivisionsPowerOfTwo));
        }
        *table = [v; ROUNDUP_POWER2_INTERVALS];
        return Ok(i);
    }
    let open = i;
    let mut first_value = true;
    let mut last_index = 0usize;
    loop {
        i += 1;
        if i >= t.len() || t.text(i) == "]" {
            break;
        }
        let interval = i;
        let interval_text = t.text(interval).to_owned();
        t.check(i + 1, ":", || {
            format!("`:` after `{interval_text}` in the `{KEY}` list")
        })?;
        i += 2;
        let value = t.size_t(i, KEY)?;
        if value != 0 && !value.is_power_of_two() {
            return Err(t.invalid(KEY, i, ValueRule::DivisionsPowerOfTwoOrZero));
        }
        if interval_text == ">" {
            for slot in table.iter_mut().skip(last_index + 1) {
                *slot = value;
            }
        } else {
            let boundary = t.size_t(interval, KEY)?;
            if !boundary.is_power_of_two() {
                return Err(t.invalid(KEY, interval, ValueRule::IntervalPowerOfTwo));
            }
            let index = (boundary.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1);
            if first_value {
                for slot in table.iter_mut().take(index) {
                    *slot = value;
                }
                first_value = false;
            }
            table[index] = value;
            last_index = index;
        }
        if t.get(i + 1, AssertSite::TokenizerIndex, || {
            format!("`,` or `]` in the `{KEY}` list")
        })? != "]"
        {
            i += 1;
        }
    }
    if i >= t.len() {
        return Err(ConfigError::Syntax {
            index: open,
            offset: t.offset(open),
            problem: SyntaxProblem::UnclosedList {
                key: KEY.to_owned(),
                site: AssertSite::RoundupList,
            },
        });
    }
    Ok(i)
}

/// `CUDAAllocatorConfig::parseArgs`: the CUDA keys.
fn cuda_pass(
    cfg: &mut AllocatorConfig,
    t: &Tokens,
    loaded: Backend,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<(), ConfigError> {
    let n = t.len();
    let mut used_async = false;
    let mut used_native_option = false;
    let mut i = 0;
    while i < n {
        let key = t.text(i).to_owned();
        match key.as_str() {
            "backend" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = t.get(i, AssertSite::TokenizerIndex, || {
                    "a value for `backend`".to_owned()
                })?;
                let requested = match v {
                    "native" => Backend::Native,
                    "cudaMallocAsync" => Backend::CudaMallocAsync,
                    _ => return Err(t.invalid(&key, i, ValueRule::Backend)),
                };
                used_async = requested == Backend::CudaMallocAsync;
                if requested != loaded {
                    return Err(ConfigError::BackendMismatch {
                        requested,
                        loaded,
                        index: i,
                        offset: t.offset(i),
                    });
                }
            }
            "release_lock_on_hipmalloc" | "release_lock_on_cudamalloc" => {
                used_native_option = true;
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.release_lock_on_cudamalloc = t.boolean(i, &key)?;
            }
            "pinned_use_hip_host_register" | "pinned_use_cuda_host_register" => {
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.pinned_use_cuda_host_register = t.boolean(i, &key)?;
                used_native_option = true;
            }
            "pinned_num_register_threads" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = t.size_t(i, &key)?;
                if !v.is_power_of_two() {
                    return Err(t.invalid(&key, i, ValueRule::ThreadsPowerOfTwo { got: v }));
                }
                if v > MAX_REGISTER_THREADS {
                    return Err(t.invalid(
                        &key,
                        i,
                        ValueRule::ThreadsAtMost {
                            max: MAX_REGISTER_THREADS,
                            got: v,
                        },
                    ));
                }
                cfg.pinned_num_register_threads = v;
                used_native_option = true;
            }
            "pinned_reserve_segment_size_mb" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = t.size_t(i, &key)?;
                if v == 0 {
                    return Err(t.invalid(&key, i, ValueRule::Positive));
                }
                cfg.pinned_reserve_segment_size_mb = v;
                used_native_option = true;
            }
            "graph_capture_record_stream_reuse" => {
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.graph_capture_record_stream_reuse = t.boolean(i, &key)?;
                used_native_option = true;
            }
            "per_process_memory_fraction" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = t.double(i, &key)?;
                if !(0.0..=1.0).contains(&v) {
                    return Err(t.invalid(&key, i, ValueRule::UnitInterval));
                }
                cfg.per_process_memory_fraction = v;
                used_native_option = true;
            }
            "pinned_free_catch_all" => {
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.pinned_free_catch_all = t.boolean(i, &key)?;
                used_native_option = true;
            }
            "throw_on_cudamalloc_oom" => {
                t.colon(i + 1, &key)?;
                i += 2;
                cfg.throw_on_cudamalloc_oom = t.boolean(i, &key)?;
                used_native_option = true;
            }
            "expandable_segments_reserve" => {
                t.colon(i + 1, &key)?;
                i += 2;
                let v = t.get(i, AssertSite::TokenizerIndex, || {
                    format!("a value for `{key}`")
                })?;
                match parse_reserve_spec(v) {
                    Some(spec) => cfg.expandable_segments_reserve = Some(spec),
                    None => warnings.push(ConfigWarning::InvalidReserveValue {
                        value: v.to_owned(),
                    }),
                }
                used_native_option = true;
            }
            "expandable_segments_reserve_by_class" => {
                t.colon(i + 1, &key)?;
                i += 1;
                // checkToken(++i, "[") is not enforced either.
                t.check(i + 1, "[", || format!("`[` starting the `{key}` list"))?;
                i += 1;
                let mut parsed = BTreeMap::new();
                while !t.check(i + 1, "]", || format!("`]` closing the `{key}` list"))? {
                    i += 1;
                    let class = t
                        .get(i, AssertSite::TokenizerIndex, || {
                            format!("a class name in the `{key}` list")
                        })?
                        .to_owned();
                    t.check(i + 1, ":", || format!("`:` after class `{class}`"))?;
                    i += 2;
                    let v = t.get(i, AssertSite::TokenizerIndex, || {
                        format!("a reserve for class `{class}`")
                    })?;
                    match parse_reserve_spec(v) {
                        Some(spec) => {
                            parsed.insert(class, spec);
                        }
                        None => warnings.push(ConfigWarning::InvalidReserveValue {
                            value: v.to_owned(),
                        }),
                    }
                    if t.check(i + 1, ",", || format!("`,` or `]` in the `{key}` list"))? {
                        i += 1;
                    }
                }
                i += 1;
                cfg.expandable_segments_reserve_by_class = parsed;
                used_native_option = true;
            }
            _ => {
                if !is_known_key(&key) {
                    return Err(ConfigError::UnknownKey {
                        key,
                        index: i,
                        offset: t.offset(i),
                        parser: KeyParser::Cuda,
                    });
                }
                i = t.skip_key(i)?;
            }
        }
        if i + 1 < n {
            i += 1;
        }
        i += 1;
    }
    if used_async && used_native_option {
        warnings.push(ConfigWarning::AsyncBackendIgnoresNativeOptions);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Numbers as the C library reads them
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NumError {
    /// No number at the start (`std::invalid_argument`).
    Invalid,
    /// `errno == ERANGE` (`std::out_of_range`).
    Range,
}

/// `std::stoull(s)` (base 10): optional sign, digits, anything after ignored;
/// a `-` negates modulo 2^64.
fn c_stoull(s: &str) -> Result<u64, NumError> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && is_c_space(b[i]) {
        i += 1;
    }
    let negative = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let start = i;
    let mut value: u64 = 0;
    let mut overflow = false;
    while let Some(&c) = b.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start {
        Err(NumError::Invalid)
    } else if overflow {
        Err(NumError::Range)
    } else if negative {
        Ok(value.wrapping_neg())
    } else {
        Ok(value)
    }
}

fn starts_with_ignore_case(b: &[u8], word: &[u8]) -> bool {
    b.len() >= word.len() && b[..word.len()].eq_ignore_ascii_case(word)
}

/// `std::stod(s)` with glibc's `strtod`: decimal, hexadecimal (`0x1.8p-1`),
/// `inf`/`infinity`/`nan` (any case); anything after the number is ignored.
/// Overflow and inexact results below the normal range are range errors.
fn c_stod(s: &str) -> Result<f64, NumError> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && is_c_space(b[i]) {
        i += 1;
    }
    let negative = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let rest = &b[i..];
    let magnitude = if starts_with_ignore_case(rest, b"inf") {
        f64::INFINITY
    } else if starts_with_ignore_case(rest, b"nan") {
        f64::NAN
    } else if let Some(v) = strtod_hex(rest) {
        v?
    } else {
        strtod_decimal(rest)?
    };
    Ok(if negative { -magnitude } else { magnitude })
}

/// Reads decimal digits from `b[*i..]` as a saturating exponent.
fn read_exponent(b: &[u8], i: &mut usize) -> i64 {
    let mut e: i64 = 0;
    while let Some(&c) = b.get(*i) {
        if !c.is_ascii_digit() {
            break;
        }
        e = e.saturating_mul(10).saturating_add(i64::from(c - b'0'));
        *i += 1;
    }
    e
}

/// An optional `e`/`p` exponent at `b[*i..]`: consumed only if digits follow.
fn optional_exponent(b: &[u8], i: &mut usize, marks: [u8; 2]) -> i64 {
    if !matches!(b.get(*i), Some(c) if marks.contains(c)) {
        return 0;
    }
    let mut j = *i + 1;
    let negative = match b.get(j) {
        Some(b'-') => {
            j += 1;
            true
        }
        Some(b'+') => {
            j += 1;
            false
        }
        _ => false,
    };
    if !matches!(b.get(j), Some(c) if c.is_ascii_digit()) {
        return 0;
    }
    let e = read_exponent(b, &mut j);
    *i = j;
    if negative {
        -e
    } else {
        e
    }
}

/// Decimal `strtod` (no sign): `digits[.digits][e[sign]digits]`.
fn strtod_decimal(b: &[u8]) -> Result<f64, NumError> {
    let mut i = 0;
    let mut digits: Vec<u8> = Vec::new();
    let mut frac_len: i64 = 0;
    while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
        digits.push(c - b'0');
        i += 1;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            digits.push(c - b'0');
            frac_len += 1;
            i += 1;
        }
    }
    if digits.is_empty() {
        return Err(NumError::Invalid);
    }
    let exp = optional_exponent(b, &mut i, [b'e', b'E']);
    let text = std::str::from_utf8(&b[..i]).map_err(|_| NumError::Invalid)?;
    let value: f64 = text.parse().map_err(|_| NumError::Invalid)?;
    if value.is_infinite() {
        return Err(NumError::Range);
    }
    let first_nonzero = match digits.iter().position(|&d| d != 0) {
        Some(p) => p,
        None => return Ok(value), // an exact zero
    };
    if value == 0.0 {
        return Err(NumError::Range);
    }
    if value <= f64::MIN_POSITIVE {
        // Exact decimal value = digits * 10^exp10.
        let sig = &digits[first_nonzero..];
        let exp10 = exp.saturating_sub(frac_len);
        if value < f64::MIN_POSITIVE {
            // Subnormal: a range error unless the decimal is exact.
            if cmp_decimal_dyadic(sig, exp10, value.to_bits(), -1074) != Ordering::Equal {
                return Err(NumError::Range);
            }
        } else if cmp_decimal_dyadic(sig, exp10, (1u64 << 54) - 1, -1076) == Ordering::Less {
            // Rounded to 53 bits it would be below 2^-1022: tiny and inexact.
            return Err(NumError::Range);
        }
    }
    Ok(value)
}

/// Hexadecimal `strtod` (no sign) if `b` starts with `0x` and a hex digit
/// (possibly after the point) follows; `None` means "read as decimal".
fn strtod_hex(b: &[u8]) -> Option<Result<f64, NumError>> {
    if b.len() < 2 || b[0] != b'0' || !matches!(b[1], b'x' | b'X') {
        return None;
    }
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u64);
    let mut i = 2;
    let mut mant: u64 = 0;
    let mut taken = 0; // significant hex digits in `mant`
    let mut exp2: i64 = 0;
    let mut sticky = false;
    let mut any = false;
    while let Some(d) = b.get(i).and_then(|&c| hex(c)) {
        any = true;
        if taken < 16 {
            if mant != 0 || d != 0 {
                mant = mant * 16 + d;
                taken += 1;
            }
        } else {
            sticky |= d != 0;
            exp2 += 4;
        }
        i += 1;
    }
    if b.get(i) == Some(&b'.') {
        let mut j = i + 1;
        let mut frac_any = false;
        while let Some(d) = b.get(j).and_then(|&c| hex(c)) {
            frac_any = true;
            if taken < 16 {
                if mant != 0 || d != 0 {
                    mant = mant * 16 + d;
                    taken += 1;
                }
                exp2 -= 4;
            } else {
                sticky |= d != 0;
            }
            j += 1;
        }
        if any || frac_any {
            any = true;
            i = j;
        }
    }
    if !any {
        return None;
    }
    let e = optional_exponent(b, &mut i, [b'p', b'P']);
    if mant == 0 {
        return Some(Ok(0.0));
    }
    Some(round_binary(mant, exp2.saturating_add(e), sticky))
}

/// Rounds `mant * 2^exp2` (plus a nonzero tail below it if `sticky`) to the
/// nearest double, ties to even, with glibc's range errors: overflow, and
/// inexact results that are tiny after rounding to 53 bits.
fn round_binary(mant: u64, exp2: i64, sticky: bool) -> Result<f64, NumError> {
    let msb = 63 - i64::from(mant.leading_zeros());
    // Round to 53 significant bits with an unbounded exponent.
    let shift = msb - 52;
    let (mut m53, mut lead) = (mant, msb.saturating_add(exp2));
    if shift > 0 {
        let (q, up) = round_shift(u128::from(mant), shift as u32, sticky);
        m53 = q as u64 + u64::from(up);
        if m53 == 1 << 53 {
            m53 >>= 1;
            lead = lead.saturating_add(1);
        }
    } else {
        m53 <<= -shift;
    }
    if lead > 1023 {
        return Err(NumError::Range);
    }
    if lead >= -1022 {
        let bits = (((lead + 1023) as u64) << 52) | (m53 & ((1 << 52) - 1));
        return Ok(f64::from_bits(bits));
    }
    // Tiny: round to the subnormal grid (units of 2^-1074).
    let drop = (-1074i64).saturating_sub(exp2);
    let (q, inexact) = if drop <= 0 {
        (u128::from(mant) << (-drop) as u32, sticky)
    } else if drop >= 128 {
        (0, true)
    } else {
        let (q, up) = round_shift(u128::from(mant), drop as u32, sticky);
        let dropped = u128::from(mant) & ((1u128 << drop) - 1);
        (q + u128::from(up), dropped != 0 || sticky)
    };
    if inexact {
        return Err(NumError::Range);
    }
    Ok(f64::from_bits(q as u64))
}

/// `v >> shift` and whether to round up (nearest, ties to even; `sticky`
/// means a nonzero tail below `v`).
fn round_shift(v: u128, shift: u32, sticky: bool) -> (u128, bool) {
    let q = v >> shift;
    let rem = v & ((1u128 << shift) - 1);
    let half = 1u128 << (shift - 1);
    let up = rem > half || (rem == half && (sticky || q & 1 == 1));
    (q, up)
}

/// Compares `digits * 10^exp10` with `n * 2^exp2` exactly.
fn cmp_decimal_dyadic(digits: &[u8], exp10: i64, n: u64, exp2: i64) -> Ordering {
    // Far outside the double range: no need for exact arithmetic.
    let magnitude = digits.len() as i64 + exp10;
    if magnitude < -400 {
        return Ordering::Less;
    }
    if magnitude > 400 {
        return Ordering::Greater;
    }
    let mut a = BigUint::from_digits(digits);
    let mut b = BigUint::from_u64(n);
    if exp10 >= 0 {
        a.mul_pow10(exp10 as u64);
    } else {
        b.mul_pow10(exp10.unsigned_abs());
    }
    if exp2 >= 0 {
        b.shl(exp2 as u64);
    } else {
        a.shl(exp2.unsigned_abs());
    }
    a.cmp(&b)
}

/// Just enough arbitrary precision for [`cmp_decimal_dyadic`].
#[derive(PartialEq, Eq)]
struct BigUint(Vec<u32>); // little-endian limbs, no leading zero limbs

impl BigUint {
    fn from_u64(v: u64) -> BigUint {
        let mut b = BigUint(vec![v as u32, (v >> 32) as u32]);
        b.trim();
        b
    }

    fn from_digits(digits: &[u8]) -> BigUint {
        let mut b = BigUint(Vec::new());
        for chunk in digits.chunks(9) {
            let mut chunk_value = 0u32;
            for &d in chunk {
                chunk_value = chunk_value * 10 + u32::from(d);
            }
            b.mul_add(10u32.pow(chunk.len() as u32), chunk_value);
        }
        b
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn mul_add(&mut self, m: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
        self.trim();
    }

    fn mul_pow10(&mut self, mut e: u64) {
        while e >= 9 {
            self.mul_add(1_000_000_000, 0);
            e -= 9;
        }
        self.mul_add(10u32.pow(e as u32), 0);
    }

    fn shl(&mut self, bits: u64) {
        if self.0.is_empty() {
            return;
        }
        let limbs = (bits / 32) as usize;
        let rest = (bits % 32) as u32;
        if rest != 0 {
            self.mul_add(1 << rest, 0);
        }
        let mut shifted = vec![0; limbs];
        shifted.extend_from_slice(&self.0);
        self.0 = shifted;
    }
}

impl PartialOrd for BigUint {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BigUint {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }
}

/// `parseReserveSpec`: `<fraction>` or `<GiB>G`, read with
/// `std::istringstream >> double`; `None` when PyTorch would ignore it.
fn parse_reserve_spec(token: &str) -> Option<ReserveSpec> {
    let gib = token.ends_with('G') || token.ends_with('g');
    let num = if gib {
        &token[..token.len() - 1]
    } else {
        token
    };
    let value = istream_double(num)?;
    if !(value.is_finite() && value > 0.0) {
        return None;
    }
    Some(if gib {
        ReserveSpec::GiB(value)
    } else {
        ReserveSpec::Fraction(value)
    })
}

/// libstdc++'s `istream >> double` in the classic locale, requiring the whole
/// string to be read: the characters `[+-] digits . digits e [+-] digits` are
/// collected (`e` only after a digit, `.` once and before `e`), then `strtod`
/// must read all of them and not overflow. `None` when extraction fails or
/// stops before the end.
fn istream_double(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    let mut acc = String::new();
    let mut i = 0;
    if matches!(b[0], b'+' | b'-') {
        acc.push(b[0] as char);
        i += 1;
    }
    let (mut found_mantissa, mut found_dec, mut found_sci) = (false, false, false);
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() {
            acc.push(c as char);
            found_mantissa = true;
        } else if c == b'.' && !found_dec && !found_sci {
            acc.push('.');
            found_dec = true;
        } else if (c == b'e' || c == b'E') && !found_sci && found_mantissa {
            acc.push('e');
            found_sci = true;
            if let Some(&next) = b.get(i + 1) {
                if next == b'+' || next == b'-' {
                    acc.push(next as char);
                    i += 1;
                }
            }
        } else {
            break;
        }
        i += 1;
    }
    if i < b.len() {
        return None; // not at end of stream
    }
    // `strtod` must consume everything collected.
    let value: f64 = acc.parse().ok()?;
    if value.is_infinite() {
        return None;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state dump of the C++ probe that produced the golden tables below
    /// (`probe2.cpp`: every getter of PyTorch's two config classes, doubles as
    /// bit patterns, reserves resolved for 64 GiB and 48 GiB devices).
    fn dump(c: &AllocatorConfig) -> Vec<(&'static str, String)> {
        let b = |v: bool| if v { "1" } else { "0" }.to_owned();
        let decision = |class: &str| {
            let pick = |total: u64| match c.expandable_segments_reserve_by_class.get(class) {
                Some(spec) => Some((spec.resolve_bytes(total), true)),
                None => c
                    .expandable_segments_reserve
                    .map(|s| (s.resolve_bytes(total), false)),
            };
            match (pick(1 << 36), pick(3 << 34)) {
                (Some((x, known)), Some((y, _))) => {
                    format!("{x}/{y}{}", if known { "k" } else { "" })
                }
                _ => "none".to_owned(),
            }
        };
        let roundup: Vec<String> = c
            .roundup_power2_divisions
            .iter()
            .map(u64::to_string)
            .collect();
        vec![
            ("backend", c.backend.to_string()),
            ("large_segment_size", c.large_segment_size.to_string()),
            ("max_split_size", c.max_split_size.to_string()),
            (
                "max_non_split_rounding_size",
                c.max_non_split_rounding_size.to_string(),
            ),
            ("roundup", roundup.join(",")),
            (
                "gc",
                format!("{:016x}", c.garbage_collection_threshold.to_bits()),
            ),
            ("expandable", b(c.expandable_segments)),
            ("pinned_bg", b(c.pinned_use_background_threads)),
            ("pinned_round", c.pinned_max_round_threshold.to_string()),
            ("pinned_cached", c.pinned_max_cached_size.to_string()),
            ("release_lock", b(c.release_lock_on_cudamalloc)),
            ("gcrsr", b(c.graph_capture_record_stream_reuse)),
            (
                "fraction",
                format!("{:016x}", c.per_process_memory_fraction.to_bits()),
            ),
            ("throw_oom", b(c.throw_on_cudamalloc_oom)),
            ("host_register", b(c.pinned_use_cuda_host_register)),
            ("threads", c.pinned_num_register_threads.to_string()),
            ("reserve_mb", c.pinned_reserve_segment_size_mb.to_string()),
            ("catch_all", b(c.pinned_free_catch_all)),
            ("r.zz", decision("zz")),
            ("r.a", decision("a")),
            ("r.b", decision("b")),
        ]
    }

    /// "ok" plus every dump entry that differs from the defaults, or the
    /// exception and the message PyTorch raises.
    fn outcome(r: &Result<AllocatorConfig, ConfigError>) -> String {
        match r {
            Ok(c) => {
                let base = dump(&AllocatorConfig::default());
                let mut s = "ok".to_owned();
                for ((k, v), (_, d)) in dump(c).into_iter().zip(base) {
                    if v != d {
                        s.push_str(&format!(" {k}={v}"));
                    }
                }
                s
            }
            Err(e) => format!("{:?} {}", e.pytorch_exception(), e.pytorch_message()),
        }
    }

    fn texts(w: &[ConfigWarning]) -> Vec<String> {
        w.iter().map(ConfigWarning::pytorch_message).collect()
    }

    fn parse_err(s: &str) -> ConfigError {
        AllocatorConfig::parse(s).expect_err(s)
    }

    // spec 1.17: defaults.
    #[test]
    fn defaults_are_pytorch_defaults() {
        let c = AllocatorConfig::default();
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.max_non_split_rounding_size, 20 * MIB);
        assert_eq!(c.large_segment_size, 20 * MIB);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert_eq!(c.garbage_collection_threshold, 0.0);
        assert_eq!(c.per_process_memory_fraction, 1.0);
        assert_eq!(c.pinned_num_register_threads, 1);
        assert_eq!(c.pinned_reserve_segment_size_mb, 0);
        assert_eq!(c.pinned_max_round_threshold, u64::MAX);
        assert_eq!(c.pinned_max_cached_size, u64::MAX);
        assert_eq!(c.backend, Backend::Native);
        assert!(!c.expandable_segments && !c.release_lock_on_cudamalloc);
        assert!(!c.graph_capture_record_stream_reuse && !c.throw_on_cudamalloc_oom);
        assert!(!c.pinned_use_cuda_host_register && !c.pinned_use_background_threads);
        assert!(!c.pinned_free_catch_all);
        assert_eq!(c.expandable_segments_reserve, None);
        assert!(c.expandable_segments_reserve_by_class.is_empty());
        assert_eq!(c.last_settings, "");
        assert_eq!(AllocatorConfig::parse("").unwrap(), c);
        assert_eq!(c.to_settings_string(), "");
    }

    // spec 1.17: every key with a good value.
    #[test]
    fn every_key_good_value() {
        let s = "backend:native,large_segment_size_mb:32,max_split_size_mb:100,\
                 max_non_split_rounding_mb:64,garbage_collection_threshold:0.5,\
                 roundup_power2_divisions:4,expandable_segments:True,\
                 release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,\
                 pinned_num_register_threads:4,pinned_use_background_threads:True,\
                 pinned_reserve_segment_size_mb:8,graph_capture_record_stream_reuse:True,\
                 per_process_memory_fraction:0.25,pinned_max_round_threshold_mb:8,\
                 pinned_max_cached_size_mb:16,pinned_free_catch_all:True,\
                 throw_on_cudamalloc_oom:True,expandable_segments_reserve:0.5,\
                 expandable_segments_reserve_by_class:[a:2G,b:0.25]";
        let c = AllocatorConfig::parse(s).unwrap();
        assert_eq!(c.backend, Backend::Native);
        assert_eq!(c.large_segment_size, 32 * MIB);
        assert_eq!(c.max_split_size, 100 * MIB);
        assert_eq!(c.max_non_split_rounding_size, 64 * MIB);
        assert_eq!(c.garbage_collection_threshold, 0.5);
        assert_eq!(c.roundup_power2_divisions, [4; 16]);
        assert!(c.expandable_segments);
        assert!(c.release_lock_on_cudamalloc);
        assert!(c.pinned_use_cuda_host_register);
        assert_eq!(c.pinned_num_register_threads, 4);
        assert!(c.pinned_use_background_threads);
        assert_eq!(c.pinned_reserve_segment_size_mb, 8);
        assert!(c.graph_capture_record_stream_reuse);
        assert_eq!(c.per_process_memory_fraction, 0.25);
        assert_eq!(c.pinned_max_round_threshold, 8 * MIB);
        assert_eq!(c.pinned_max_cached_size, 16 * MIB);
        assert!(c.pinned_free_catch_all);
        assert!(c.throw_on_cudamalloc_oom);
        assert_eq!(
            c.expandable_segments_reserve,
            Some(ReserveSpec::Fraction(0.5))
        );
        assert_eq!(
            c.expandable_segments_reserve_by_class["a"],
            ReserveSpec::GiB(2.0)
        );
        assert_eq!(
            c.expandable_segments_reserve_by_class["b"],
            ReserveSpec::Fraction(0.25)
        );
        assert_eq!(c.last_settings, s);
        // The ROCm spellings are aliases.
        let h = AllocatorConfig::parse(
            "release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True",
        )
        .unwrap();
        assert!(h.release_lock_on_cudamalloc && h.pinned_use_cuda_host_register);
        // The async backend is recorded.
        let a = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap();
        assert_eq!(a.backend, Backend::CudaMallocAsync);
    }

    fn assert_invalid(s: &str, key: &str, value: &str, rule: ValueRule) {
        match parse_err(s) {
            ConfigError::InvalidValue {
                key: k,
                value: v,
                rule: r,
                ..
            } => {
                assert_eq!((k.as_str(), v.as_str(), r), (key, value, rule), "{s}");
            }
            other => panic!("{s}: {other:?}"),
        }
        let shown = parse_err(s).to_string();
        assert!(shown.contains(key) && shown.contains(value), "{shown}");
    }

    // spec 1.17: every validation rule, with the key and value in the error.
    #[test]
    fn every_key_bad_value() {
        use ValueRule::*;
        assert_invalid("backend:Native", "backend", "Native", Backend);
        assert_invalid(
            "max_split_size_mb:19",
            "max_split_size_mb",
            "19",
            AtLeastMib { min: 20 },
        );
        assert_invalid(
            "large_segment_size_mb:64,max_split_size_mb:40",
            "max_split_size_mb",
            "40",
            AtLeastMib { min: 64 },
        );
        assert_invalid(
            "max_non_split_rounding_mb:19",
            "max_non_split_rounding_mb",
            "19",
            AtLeastMib { min: 20 },
        );
        assert_invalid(
            "large_segment_size_mb:10",
            "large_segment_size_mb",
            "10",
            GreaterThanMib { min: 10 },
        );
        assert_invalid(
            "garbage_collection_threshold:1",
            "garbage_collection_threshold",
            "1",
            OpenUnitInterval,
        );
        assert_invalid(
            "garbage_collection_threshold:0",
            "garbage_collection_threshold",
            "0",
            OpenUnitInterval,
        );
        assert_invalid(
            "garbage_collection_threshold:nan",
            "garbage_collection_threshold",
            "nan",
            OpenUnitInterval,
        );
        assert_invalid(
            "per_process_memory_fraction:1.5",
            "per_process_memory_fraction",
            "1.5",
            UnitInterval,
        );
        assert_invalid(
            "roundup_power2_divisions:3",
            "roundup_power2_divisions",
            "3",
            DivisionsPowerOfTwo,
        );
        assert_invalid(
            "roundup_power2_divisions:0",
            "roundup_power2_divisions",
            "0",
            DivisionsPowerOfTwo,
        );
        assert_invalid(
            "roundup_power2_divisions:[256:3]",
            "roundup_power2_divisions",
            "3",
            DivisionsPowerOfTwoOrZero,
        );
        assert_invalid(
            "roundup_power2_divisions:[3:2]",
            "roundup_power2_divisions",
            "3",
            IntervalPowerOfTwo,
        );
        assert_invalid(
            "roundup_power2_divisions:[0:2]",
            "roundup_power2_divisions",
            "0",
            IntervalPowerOfTwo,
        );
        assert_invalid(
            "roundup_power2_divisions:[abc:2]",
            "roundup_power2_divisions",
            "abc",
            Integer,
        );
        for key in [
            "expandable_segments",
            "release_lock_on_cudamalloc",
            "pinned_use_cuda_host_register",
            "pinned_use_background_threads",
            "graph_capture_record_stream_reuse",
            "pinned_free_catch_all",
            "throw_on_cudamalloc_oom",
        ] {
            // True/False are case-sensitive.
            for bad in ["true", "TRUE", "false", "1", "yes"] {
                assert_invalid(&format!("{key}:{bad}"), key, bad, TrueOrFalse);
            }
        }
        assert_invalid(
            "pinned_num_register_threads:3",
            "pinned_num_register_threads",
            "3",
            ThreadsPowerOfTwo { got: 3 },
        );
        assert_invalid(
            "pinned_num_register_threads:0",
            "pinned_num_register_threads",
            "0",
            ThreadsPowerOfTwo { got: 0 },
        );
        assert_invalid(
            "pinned_num_register_threads:256",
            "pinned_num_register_threads",
            "256",
            ThreadsAtMost { max: 128, got: 256 },
        );
        assert_invalid(
            "pinned_reserve_segment_size_mb:0",
            "pinned_reserve_segment_size_mb",
            "0",
            Positive,
        );
        assert_invalid("max_split_size_mb:abc", "max_split_size_mb", "abc", Integer);
        assert_invalid(
            "max_split_size_mb:18446744073709551616",
            "max_split_size_mb",
            "18446744073709551616",
            IntegerInRange,
        );
        assert_invalid(
            "per_process_memory_fraction:x",
            "per_process_memory_fraction",
            "x",
            Number,
        );
        assert_invalid(
            "garbage_collection_threshold:1e400",
            "garbage_collection_threshold",
            "1e400",
            NumberInRange,
        );
        assert_invalid(
            "pinned_max_cached_size_mb:x",
            "pinned_max_cached_size_mb",
            "x",
            Integer,
        );
    }

    // spec 1.17: PyTorch's own error texts.
    #[test]
    fn pytorch_messages() {
        let m = |s: &str| parse_err(s).pytorch_message();
        assert_eq!(
            m("bogus:1"),
            "Unrecognized key 'bogus' in CUDA allocator config."
        );
        assert_eq!(
            m("max_split_size_mb:5"),
            "CachingAllocator option max_split_size_mb too small, must be >= 20"
        );
        assert_eq!(
            m("large_segment_size_mb:8"),
            "CachingAllocator option large_segment_size_mb must be > 10 MB"
        );
        assert_eq!(
            m("garbage_collection_threshold:2"),
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
        );
        assert_eq!(
            m("per_process_memory_fraction:2"),
            "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"
        );
        assert_eq!(
            m("pinned_num_register_threads:3"),
            "Number of register threads has to be power of 2, got 3"
        );
        assert_eq!(m("max_split_size_mb:x"), "stoull");
        assert_eq!(m("garbage_collection_threshold:x"), "stod");
        assert_eq!(
            m("expandable_segments"),
            "i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer"
        );
        let mut c = AllocatorConfig::default();
        let e = c.apply_runtime("bogus:1").unwrap_err();
        assert_eq!(
            e.pytorch_message(),
            "Unrecognized key 'bogus' in Accelerator allocator config."
        );
        assert_eq!(e.pytorch_exception(), PyTorchException::ValueError);
    }

    // spec 1.3: the list form, with PyTorch's exact index semantics.
    #[test]
    fn roundup_list_form() {
        let c =
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
        // 256 MB -> index 8; the first entry also fills every index below it;
        // `>` fills from the index after the last explicit one.
        assert_eq!(
            c.roundup_power2_divisions,
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8]
        );
        assert_eq!(c.roundup_power2_divisions_for(MIB), 1);
        assert_eq!(c.roundup_power2_divisions_for(600 * MIB), 2);
        assert_eq!(c.roundup_power2_divisions_for(1500 * MIB), 4);
        assert_eq!(c.roundup_power2_divisions_for(3000 * MIB), 8);
        assert_eq!(c.roundup_power2_divisions_for(1 << 50), 8);
        // `>` alone starts at index 1: sizes below 2 MiB keep 0.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[>:8]").unwrap();
        assert_eq!(c.roundup_power2_divisions[0], 0);
        assert_eq!(c.roundup_power2_divisions[1..], [8; 15]);
        // Only the first explicit entry fills downwards; out of order entries overwrite.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[1024:4,256:1]").unwrap();
        assert_eq!(
            c.roundup_power2_divisions,
            [4, 4, 4, 4, 4, 4, 4, 4, 1, 4, 4, 0, 0, 0, 0, 0]
        );
        // Intervals beyond 32768 MB clamp to the last entry; 0 disables.
        let c = AllocatorConfig::parse("roundup_power2_divisions:[65536:2]").unwrap();
        assert_eq!(c.roundup_power2_divisions, [2; 16]);
        let c = AllocatorConfig::parse("roundup_power2_divisions:[1:4,2:0,>:2]").unwrap();
        assert_eq!(&c.roundup_power2_divisions[..3], &[4, 0, 2]);
        // Empty list: all 0.
        assert_eq!(
            AllocatorConfig::parse("roundup_power2_divisions:[]")
                .unwrap()
                .roundup_power2_divisions,
            [0; 16]
        );
        // Single value: every interval.
        assert_eq!(
            AllocatorConfig::parse("roundup_power2_divisions:2")
                .unwrap()
                .roundup_power2_divisions,
            [2; 16]
        );
        // Unclosed list: at run time the list parser notices; at start-up the
        // backend scan, which runs first, already does.
        let mut c = AllocatorConfig::default();
        match c
            .apply_runtime("roundup_power2_divisions:[256:1,")
            .unwrap_err()
        {
            ConfigError::Syntax {
                index,
                offset,
                problem: SyntaxProblem::UnclosedList { key, site },
            } => {
                assert_eq!(
                    (index, offset, key.as_str(), site),
                    (2, 25, "roundup_power2_divisions", AssertSite::RoundupList)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_err("roundup_power2_divisions:[256:1,"),
            ConfigError::Syntax {
                problem: SyntaxProblem::UnclosedList {
                    site: AssertSite::TokenizerSkipKey,
                    ..
                },
                ..
            }
        ));
    }

    // spec 1.3: sizes map to entry floor(log2(size)) - 20, clamped.
    #[test]
    fn roundup_divisions_for_sizes() {
        let mut c = AllocatorConfig::default();
        for (i, slot) in c.roundup_power2_divisions.iter_mut().enumerate() {
            *slot = i as u64 + 100;
        }
        assert_eq!(c.roundup_power2_divisions_for(1), 100);
        assert_eq!(c.roundup_power2_divisions_for(2 * MIB - 1), 100);
        assert_eq!(c.roundup_power2_divisions_for(2 * MIB), 101);
        assert_eq!(c.roundup_power2_divisions_for(64 << 30), 115);
        assert_eq!(c.roundup_power2_divisions_for(u64::MAX), 115);
        // PyTorch's log2(0) wraps around to the last entry.
        assert_eq!(c.roundup_power2_divisions_for(0), 115);
    }

    // spec 1.17: whitespace is ignored everywhere, even inside values.
    #[test]
    fn whitespace_is_ignored() {
        let a = AllocatorConfig::parse(" max_split_size_mb : 1 0 0 ,\texpandable_segments:\nTrue ")
            .unwrap();
        assert_eq!(a.max_split_size, 100 * MIB);
        assert!(a.expandable_segments);
        let b = AllocatorConfig::parse("roundup_power2_divisions:[ 256 : 1 , > : 8 ]").unwrap();
        assert_eq!(b.roundup_power2_divisions[8..10], [1, 8]);
        // \v and \f count as space, like C's isspace.
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:4\u{b}0\u{c}")
                .unwrap()
                .max_split_size,
            40 * MIB
        );
        // The raw string is kept as written.
        assert_eq!(
            a.last_settings,
            " max_split_size_mb : 1 0 0 ,\texpandable_segments:\nTrue "
        );
    }

    // spec 1.17: separators are skipped, not checked; a trailing comma is fine.
    #[test]
    fn lenient_separators() {
        assert!(
            AllocatorConfig::parse("expandable_segments,True")
                .unwrap()
                .expandable_segments
        );
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb[40")
                .unwrap()
                .max_split_size,
            40 * MIB
        );
        assert!(
            AllocatorConfig::parse("expandable_segments:True,")
                .unwrap()
                .expandable_segments
        );
        let c = AllocatorConfig::parse("expandable_segments:True]release_lock_on_cudamalloc:True")
            .unwrap();
        assert!(c.expandable_segments && c.release_lock_on_cudamalloc);
    }

    // spec 1.17: stoull/stod quirks are PyTorch's.
    #[test]
    fn c_number_quirks() {
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:40abc")
                .unwrap()
                .max_split_size,
            40 * MIB
        );
        // -1 wraps to 2^64-1 MiB, then saturates.
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:-1")
                .unwrap()
                .max_split_size,
            MAX_MB * MIB
        );
        assert_eq!(
            AllocatorConfig::parse("max_split_size_mb:+30")
                .unwrap()
                .max_split_size,
            30 * MIB
        );
        assert_invalid(
            "max_split_size_mb:0x20",
            "max_split_size_mb",
            "0x20",
            ValueRule::AtLeastMib { min: 20 },
        );
        assert_eq!(
            AllocatorConfig::parse("garbage_collection_threshold:0x1.8p-1")
                .unwrap()
                .garbage_collection_threshold,
            0.75
        );
        assert_eq!(
            AllocatorConfig::parse("garbage_collection_threshold:.5x")
                .unwrap()
                .garbage_collection_threshold,
            0.5
        );
        let neg_zero = AllocatorConfig::parse("per_process_memory_fraction:-0").unwrap();
        assert!(neg_zero.per_process_memory_fraction.is_sign_negative());
    }

    // spec 1.17: integers are read with std::stoull.
    #[test]
    fn stoull_like_glibc() {
        assert_eq!(c_stoull("42"), Ok(42));
        assert_eq!(c_stoull("42x"), Ok(42));
        assert_eq!(c_stoull("-1"), Ok(u64::MAX));
        assert_eq!(c_stoull("-18446744073709551615"), Ok(1));
        assert_eq!(c_stoull("-18446744073709551616"), Err(NumError::Range));
        assert_eq!(c_stoull("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(c_stoull("18446744073709551616"), Err(NumError::Range));
        assert_eq!(c_stoull("+"), Err(NumError::Invalid));
        assert_eq!(c_stoull("--1"), Err(NumError::Invalid));
        assert_eq!(c_stoull(""), Err(NumError::Invalid));
        assert_eq!(c_stoull("0x10"), Ok(0));
    }

    // spec 1.17: fractions are read with std::stod (glibc strtod).
    #[test]
    fn stod_like_glibc() {
        let ok = |s: &str, v: f64| assert_eq!(c_stod(s).map(f64::to_bits), Ok(v.to_bits()), "{s}");
        let range = |s: &str| assert_eq!(c_stod(s), Err(NumError::Range), "{s}");
        let invalid = |s: &str| assert_eq!(c_stod(s), Err(NumError::Invalid), "{s}");
        ok("0.5", 0.5);
        ok(".5", 0.5);
        ok("5.", 5.0);
        ok("1e", 1.0);
        ok("1e+", 1.0);
        ok("1.e-1", 0.1);
        ok("-0", -0.0);
        ok("0x", 0.0);
        ok("0x.", 0.0);
        ok("0x.8", 0.5);
        ok("0X1P-1", 0.5);
        ok("0x1p", 1.0);
        ok("0x1.8p-1", 0.75);
        ok("0x.00000000000000000000000001p100", 0.0625);
        ok("0x1.00000000000008p0", 1.0); // tie, to even
        ok("0x1.00000000000018p0", 1.0 + 2.0 * f64::EPSILON);
        ok("0x1.000000000000080000000000001p0", 1.0 + f64::EPSILON);
        ok("0x8000000000000000000000000000000000p-136", 0.5);
        ok("0x1p-1074", f64::from_bits(1));
        ok("2.2250738585072014e-308", f64::MIN_POSITIVE);
        ok("2.2250738585072013e-308", f64::MIN_POSITIVE);
        ok("0e99999999999999999999", 0.0);
        ok("inf", f64::INFINITY);
        ok("-Infinity", f64::NEG_INFINITY);
        ok("infinit", f64::INFINITY);
        assert!(c_stod("nan(abc)").unwrap().is_nan());
        assert!(c_stod("NaN").unwrap().is_nan());
        range("1e400");
        range("1e-400");
        range("1e-310");
        range("4.9406564584124654e-324");
        range("2.2250738585072011e-308");
        range("2.2250738585072009e-308");
        range("0x1p-1075");
        range("0x3p-1076");
        range("0x1.fffffffffffffp-1023");
        range("0x1.fffffffffffff8p1023");
        range("1e99999999999999999999");
        range("1e-99999999999999999999");
        invalid("");
        invalid(".");
        invalid("+");
        invalid("-");
        invalid(".e1");
        invalid("abc");
        // An exact decimal subnormal is not a range error (2^-1074, all 751 digits).
        let exact = "4.940656458412465441765687928682213723650598026143247644255856825006755072702087518652998363616359923797965646954457177309266567103559397963987747960107818781263007131903114045278458171678489821036887186360569987307230500063874091535649843873124733972731696151400317153853980741262385655911710266585566867681870395603106249319452715914924553293054565444011274801297099995419319894090804165633245247571478690147267801593552386115501348035264934720193790268107107491703332226844753335720832431936092382893458368060106011506169809753078342277318329247904982524730776375927247874656084778203734469699533647017972677717585125660551199131504891101451037862738167250955837389733598993664809941164205702637090279242767544565229087538682506419718265533447265625e-324";
        ok(exact, f64::from_bits(1));
    }

    // spec 1.17: reserve values are read with std::istringstream.
    #[test]
    fn istream_reserve_values() {
        assert_eq!(parse_reserve_spec("0.5"), Some(ReserveSpec::Fraction(0.5)));
        assert_eq!(parse_reserve_spec("2G"), Some(ReserveSpec::GiB(2.0)));
        assert_eq!(parse_reserve_spec("2g"), Some(ReserveSpec::GiB(2.0)));
        assert_eq!(parse_reserve_spec("+.5"), Some(ReserveSpec::Fraction(0.5)));
        assert_eq!(parse_reserve_spec("5."), Some(ReserveSpec::Fraction(5.0)));
        assert_eq!(parse_reserve_spec("1e+0"), Some(ReserveSpec::Fraction(1.0)));
        assert_eq!(
            parse_reserve_spec("1e-310"),
            Some(ReserveSpec::Fraction(1e-310))
        );
        for bad in [
            "", "G", "abc", "0", "-0.5", "1e", "1e+", ".", "+", "inf", "0x1p-1", "1e400", "1e-400",
            "1.5.5", "0.5GG", "e5",
        ] {
            assert_eq!(parse_reserve_spec(bad), None, "{bad}");
        }
    }

    // spec 1.17 / 1.11: expandable-segment reserves in bytes.
    #[test]
    fn reserve_resolution_saturates() {
        assert_eq!(ReserveSpec::Fraction(0.5).resolve_bytes(1 << 36), 1 << 35);
        assert_eq!(ReserveSpec::GiB(2.0).resolve_bytes(12345), 2 << 30);
        assert_eq!(ReserveSpec::GiB(1e20).resolve_bytes(0), u64::MAX);
        assert_eq!(ReserveSpec::Fraction(1e-310).resolve_bytes(1 << 36), 0);
    }

    // spec 1.17: unknown keys name the key and the position.
    #[test]
    fn unknown_key() {
        match parse_err("expandable_segments:True, bogus_key:1") {
            ConfigError::UnknownKey {
                key,
                index,
                offset,
                parser,
            } => {
                assert_eq!(
                    (key.as_str(), index, offset, parser),
                    ("bogus_key", 4, 26, KeyParser::Cuda)
                );
            }
            other => panic!("{other:?}"),
        }
        let shown = parse_err("bogus_key:1").to_string();
        assert!(
            shown.contains("`bogus_key`") && shown.contains("max_split_size_mb"),
            "{shown}"
        );
        // Near misses get a suggestion.
        let shown = parse_err("expandable_segment:True").to_string();
        assert!(
            shown.contains("did you mean `expandable_segments`?"),
            "{shown}"
        );
        let shown = parse_err("Max_Split_Size_MB:64").to_string();
        assert!(
            shown.contains("did you mean `max_split_size_mb`?"),
            "{shown}"
        );
        // Key matching is case-sensitive.
        assert!(matches!(
            parse_err("Expandable_segments:True"),
            ConfigError::UnknownKey { .. }
        ));
        // Not a key although PyTorch's messages mention it.
        assert!(matches!(
            parse_err("expandable_segments_handle_type:posix_fd"),
            ConfigError::UnknownKey { .. }
        ));
    }

    // spec 1.17: malformed strings name the position and what was expected.
    #[test]
    fn syntax_errors_name_the_position() {
        match parse_err("expandable_segments:True,max_split_size_mb") {
            ConfigError::Syntax {
                index,
                offset,
                problem: SyntaxProblem::UnexpectedEnd { expected, site },
            } => {
                assert_eq!((index, offset), (5, 42));
                assert!(expected.contains("max_split_size_mb"), "{expected}");
                assert_eq!(site, AssertSite::TokenizerCheckIndex);
            }
            other => panic!("{other:?}"),
        }
        match parse_err("bogus:[1,2") {
            ConfigError::Syntax {
                index,
                offset,
                problem: SyntaxProblem::UnclosedList { key, site },
            } => {
                assert_eq!(
                    (index, offset, key.as_str(), site),
                    (2, 6, "bogus", AssertSite::TokenizerSkipKey)
                );
            }
            other => panic!("{other:?}"),
        }
        let shown = parse_err("max_split_size_mb:").to_string();
        assert!(
            shown.contains("byte 18") && shown.contains("max_split_size_mb"),
            "{shown}"
        );
    }

    // spec 1.17: _set_allocator_settings resets some settings, keeps the others.
    #[test]
    fn runtime_resets_and_keeps() {
        let mut c = AllocatorConfig::parse(
            "large_segment_size_mb:32,max_split_size_mb:100,max_non_split_rounding_mb:64,\
             garbage_collection_threshold:0.5,roundup_power2_divisions:4,expandable_segments:True,\
             per_process_memory_fraction:0.5,pinned_max_cached_size_mb:16,expandable_segments_reserve:0.5,\
             expandable_segments_reserve_by_class:[a:1G]",
        )
        .unwrap();
        c.apply_runtime("release_lock_on_cudamalloc:True").unwrap();
        // Reset: max_split_size, roundup, gc threshold; max_non_split_rounding follows large_segment_size.
        assert_eq!(c.max_split_size, u64::MAX);
        assert_eq!(c.roundup_power2_divisions, [0; 16]);
        assert_eq!(c.garbage_collection_threshold, 0.0);
        assert_eq!(c.max_non_split_rounding_size, 32 * MIB);
        // Kept.
        assert_eq!(c.large_segment_size, 32 * MIB);
        assert!(c.expandable_segments && c.release_lock_on_cudamalloc);
        assert_eq!(c.per_process_memory_fraction, 0.5);
        assert_eq!(c.pinned_max_cached_size, 16 * MIB);
        assert_eq!(
            c.expandable_segments_reserve,
            Some(ReserveSpec::Fraction(0.5))
        );
        assert_eq!(c.expandable_segments_reserve_by_class.len(), 1);
        assert_eq!(c.last_settings, "release_lock_on_cudamalloc:True");
        // A bad reserve keeps the old one (with a warning); a new class list replaces the old one.
        let w = c
            .apply_runtime_with_warnings(
                "expandable_segments_reserve:bad,expandable_segments_reserve_by_class:[b:0.25]",
            )
            .unwrap();
        assert_eq!(
            w,
            vec![ConfigWarning::InvalidReserveValue {
                value: "bad".into()
            }]
        );
        assert_eq!(
            c.expandable_segments_reserve,
            Some(ReserveSpec::Fraction(0.5))
        );
        assert_eq!(
            c.expandable_segments_reserve_by_class
                .keys()
                .collect::<Vec<_>>(),
            ["b"]
        );
        // The floor of max_split_size_mb is the kept large_segment_size.
        assert!(c.apply_runtime("max_split_size_mb:20").is_err());
        c.apply_runtime("max_split_size_mb:32").unwrap();
        assert_eq!(c.max_split_size, 32 * MIB);
    }

    // spec 1.17: a failing runtime string leaves the settings unchanged.
    #[test]
    fn runtime_error_leaves_config_unchanged() {
        let start = AllocatorConfig::parse(
            "max_split_size_mb:100,roundup_power2_divisions:[256:1,>:4],garbage_collection_threshold:0.5,\
             expandable_segments:True,release_lock_on_cudamalloc:True",
        )
        .unwrap();
        for bad in [
            "bogus:1",
            "expandable_segments:False,bogus:1",
            "max_split_size_mb:200,release_lock_on_cudamalloc:yes",
            "expandable_segments:False,max_split_size_mb:5",
            "large_segment_size_mb:64,max_split_size_mb:40",
            "roundup_power2_divisions:[256:1,",
            "expandable_segments:",
            "expandable_segments_reserve_by_class:[a:0.5",
            "garbage_collection_threshold:1e400",
            "backend:cudaMallocAsync",
            "pinned_num_register_threads:3",
        ] {
            let mut c = start.clone();
            let e = c.apply_runtime(bad).unwrap_err();
            assert_eq!(c, start, "{bad}: {e}");
        }
    }

    // spec 1.17: the backend is chosen at start-up only.
    #[test]
    fn runtime_backend() {
        let mut c = AllocatorConfig::default();
        c.apply_runtime("backend:native").unwrap();
        let e = c.apply_runtime("backend:cudaMallocAsync").unwrap_err();
        assert_eq!(
            e,
            ConfigError::BackendMismatch {
                requested: Backend::CudaMallocAsync,
                loaded: Backend::Native,
                index: 2,
                offset: 8
            }
        );
        assert!(e.pytorch_message().ends_with("cudaMallocAsync != native"));
        let mut a = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap();
        a.apply_runtime("backend:cudaMallocAsync").unwrap();
        assert!(a.apply_runtime("backend:native").is_err());
        // At start-up the first backend key decides; a different later one fails.
        assert!(matches!(
            parse_err("backend:native,backend:cudaMallocAsync"),
            ConfigError::BackendMismatch { .. }
        ));
    }

    // spec 1.17: environment variables and their priority.
    #[test]
    fn from_env_priority() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let c = AllocatorConfig::from_env_with(env(&[])).unwrap();
        assert_eq!(c, AllocatorConfig::default());
        let c = AllocatorConfig::from_env_with(env(&[
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("PYTORCH_ALLOC_CONF", "release_lock_on_cudamalloc:True"),
        ]))
        .unwrap();
        assert!(c.expandable_segments && !c.release_lock_on_cudamalloc);
        // Set but empty still wins.
        let c = AllocatorConfig::from_env_with(env(&[
            ("PYTORCH_CUDA_ALLOC_CONF", ""),
            ("PYTORCH_ALLOC_CONF", "release_lock_on_cudamalloc:True"),
        ]))
        .unwrap();
        assert_eq!(c, AllocatorConfig::default());
        let c =
            AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")]))
                .unwrap();
        assert_eq!(c.max_split_size, 64 * MIB);
        assert_eq!(c.last_settings, "max_split_size_mb:64");
        // Errors name the variable.
        let e =
            AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "bogus:1")])).unwrap_err();
        match &e {
            ConfigError::Env { var, error } => {
                assert_eq!(*var, "PYTORCH_ALLOC_CONF");
                assert!(matches!(**error, ConfigError::UnknownKey { .. }));
            }
            other => panic!("{other:?}"),
        }
        assert!(e
            .to_string()
            .starts_with("PYTORCH_ALLOC_CONF: unknown allocator setting `bogus`"));
        assert_eq!(
            e.pytorch_message(),
            "Unrecognized key 'bogus' in CUDA allocator config."
        );
        // The real environment (nothing set by the test runner).
        if [ENV_CUDA_ALLOC_CONF, ENV_HIP_ALLOC_CONF, ENV_ALLOC_CONF]
            .iter()
            .all(|v| std::env::var_os(v).is_none())
        {
            assert_eq!(
                AllocatorConfig::from_env().unwrap(),
                AllocatorConfig::default()
            );
        }
    }

    // spec 1.17: warnings PyTorch prints.
    #[test]
    fn warnings() {
        let (_, w) = AllocatorConfig::parse_with_warnings(
            "backend:cudaMallocAsync,release_lock_on_cudamalloc:True",
        )
        .unwrap();
        assert_eq!(w, vec![ConfigWarning::AsyncBackendIgnoresNativeOptions]);
        let (_, w) =
            AllocatorConfig::parse_with_warnings("backend:cudaMallocAsync,max_split_size_mb:40")
                .unwrap();
        assert!(w.is_empty());
        let (_, w) = AllocatorConfig::parse_with_warnings(
            "pinned_max_round_threshold_mb:256,pinned_max_cached_size_mb:128",
        )
        .unwrap();
        assert_eq!(
            w,
            vec![ConfigWarning::PinnedRoundThresholdAboveCachedSize {
                round_threshold_mb: 256,
                cached_size_mb: 128
            }]
        );
        assert!(w[0].to_string().contains("256"));
        let (c, w) = AllocatorConfig::parse_with_warnings(
            "expandable_segments_reserve_by_class:[a:bad,b:0.5]",
        )
        .unwrap();
        assert_eq!(texts(&w), ["Ignoring invalid expandable-segment reserve value 'bad' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]);
        assert_eq!(
            c.expandable_segments_reserve_by_class
                .keys()
                .collect::<Vec<_>>(),
            ["b"]
        );
    }

    // spec 1.17 / 2.5: the settings string reads back to the same settings.
    #[test]
    fn settings_string_round_trip() {
        let mut odd = AllocatorConfig {
            garbage_collection_threshold: f64::from_bits(3), // subnormal
            per_process_memory_fraction: -0.0,
            pinned_max_round_threshold: MAX_MB * MIB,
            ..AllocatorConfig::default()
        };
        odd.roundup_power2_divisions[3] = 2;
        for c in [
            AllocatorConfig::default(),
            odd,
            AllocatorConfig::parse("backend:cudaMallocAsync").unwrap(),
            AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap(),
            AllocatorConfig::parse(
                "large_segment_size_mb:32,max_split_size_mb:100,max_non_split_rounding_mb:64,\
                 garbage_collection_threshold:0.1,roundup_power2_divisions:4,expandable_segments:True,\
                 pinned_use_background_threads:True,pinned_max_round_threshold_mb:8,pinned_max_cached_size_mb:16,\
                 release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:4,\
                 pinned_reserve_segment_size_mb:8,graph_capture_record_stream_reuse:True,\
                 per_process_memory_fraction:0.3,pinned_free_catch_all:True,throw_on_cudamalloc_oom:True,\
                 expandable_segments_reserve:1e-7,expandable_segments_reserve_by_class:[a:2.5G,b:0.25]",
            )
            .unwrap(),
        ] {
            let s = c.to_settings_string();
            let mut back = AllocatorConfig::parse(&s).unwrap_or_else(|e| panic!("{s}: {e}"));
            back.last_settings = c.last_settings.clone();
            assert_eq!(back, c, "{s}");
        }
    }

    // spec 1.17: every golden case, against PyTorch 2.15 itself.
    #[test]
    fn golden_startup_and_runtime() {
        for &(input, runtime, runtime_warnings, startup, startup_warnings) in GOLDEN {
            let parsed = AllocatorConfig::parse_with_warnings(input);
            assert_eq!(
                outcome(&parsed.clone().map(|(c, _)| c)),
                startup,
                "start-up {input:?}"
            );
            if let Ok((c, w)) = &parsed {
                assert_eq!(c.last_settings, input);
                assert_eq!(texts(w), startup_warnings, "start-up warnings {input:?}");
            }
            let mut c = AllocatorConfig::default();
            let applied = c.apply_runtime_with_warnings(input);
            let result = applied.as_ref().map(|_| c.clone()).map_err(Clone::clone);
            assert_eq!(outcome(&result), runtime, "runtime {input:?}");
            match applied {
                Ok(w) => {
                    assert_eq!(c.last_settings, input);
                    assert_eq!(texts(&w), runtime_warnings, "runtime warnings {input:?}");
                }
                Err(_) => assert_eq!(c, AllocatorConfig::default()),
            }
        }
    }

    // spec 1.17: runtime strings applied one after another, against PyTorch 2.15.
    #[test]
    fn golden_runtime_sequences() {
        for &(steps, expected) in GOLDEN_SEQUENCES {
            let mut c = AllocatorConfig::default();
            for (step, want) in steps.iter().zip(expected) {
                let before = c.clone();
                let r = c.apply_runtime(step).map(|_| c.clone());
                assert_eq!(outcome(&r), *want, "{step:?}");
                if r.is_err() {
                    assert_eq!(c, before);
                }
            }
        }
    }

    // spec 1.17: environment priorities, against PyTorch 2.15.
    #[test]
    fn golden_environment() {
        for &(cuda, hip, generic, expected) in GOLDEN_ENV {
            let r = AllocatorConfig::from_env_with(|name| match name {
                ENV_CUDA_ALLOC_CONF => cuda.map(str::to_owned),
                ENV_HIP_ALLOC_CONF => hip.map(str::to_owned),
                ENV_ALLOC_CONF => generic.map(str::to_owned),
                _ => None,
            });
            assert_eq!(outcome(&r), expected, "{cuda:?} {hip:?} {generic:?}");
        }
    }

    type GoldenCase = (
        &'static str,
        &'static str,
        &'static [&'static str],
        &'static str,
        &'static [&'static str],
    );
    type GoldenSequence = (&'static [&'static str], &'static [&'static str]);
    type GoldenEnv = (
        Option<&'static str>,
        Option<&'static str>,
        Option<&'static str>,
        &'static str,
    );

    // The tables below were produced by PyTorch 2.15.0 itself: a C++ probe
    // linked against the wheel's libc10.so/libc10_cuda.so, one fresh process
    // per case, on the oracle's fake device. `runtime` is
    // `c10::CachingAllocator::setAllocatorSettings(input)` (what
    // `_set_allocator_settings` calls); `startup` is the input as
    // PYTORCH_CUDA_ALLOC_CONF (backend scan, CUDA parser, common parser, in
    // the order Python triggers them). "ok" lists the getters that differ from
    // the defaults (doubles as bit patterns); otherwise the C++ exception and
    // its message. Warnings are the `Warning:` lines PyTorch printed.

    #[rustfmt::skip]
    const GOLDEN: &[GoldenCase] = &[
    ("", "ok", &[], "ok", &[]),
    (" ", "ok", &[], "ok", &[]),
    ("\u{9}\u{a}", "ok", &[], "ok", &[]),
    (",", "ValueError Unrecognized key ',' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("backend:native", "ok", &[], "ok", &[]),
    ("backend:cudaMallocAsync", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "ok backend=cudaMallocAsync", &[]),
    ("backend:Native", "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[], "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[]),
    ("backend:hipMallocAsync", "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[], "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[]),
    ("backend:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":54, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("backend", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("backend:[native]", "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[], "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[]),
    ("backend:native:", "ok", &[], "ok", &[]),
    ("backend:native,backend:cudaMallocAsync", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[]),
    ("backend:cudaMallocAsync,backend:native", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, native != cudaMallocAsync", &[]),
    ("backend:cudaMallocAsync,release_lock_on_cudamalloc:True", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "ok backend=cudaMallocAsync release_lock=1", &["backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold."]),
    ("backend:cudaMallocAsync,max_split_size_mb:40", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "ok backend=cudaMallocAsync max_split_size=41943040", &[]),
    ("backend:cudaMallocAsync,per_process_memory_fraction:0.5", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "ok backend=cudaMallocAsync fraction=3fe0000000000000", &["backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold."]),
    ("expandable_segments:True,backend:cudaMallocAsync", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "ok backend=cudaMallocAsync expandable=1", &[]),
    ("backend:cudaMallocAsync,expandable_segments_reserve:0.5", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native", &[], "ok backend=cudaMallocAsync r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &["backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold."]),
    ("max_split_size_mb:20", "ok max_split_size=20971520", &[], "ok max_split_size=20971520", &[]),
    ("max_split_size_mb:19", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[]),
    ("max_split_size_mb:0", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[]),
    ("max_split_size_mb:100", "ok max_split_size=104857600", &[], "ok max_split_size=104857600", &[]),
    ("max_split_size_mb:17592186044415", "ok max_split_size=18446744073708503040", &[], "ok max_split_size=18446744073708503040", &[]),
    ("max_split_size_mb:17592186044416", "ok max_split_size=18446744073708503040", &[], "ok max_split_size=18446744073708503040", &[]),
    ("max_split_size_mb:18446744073709551615", "ok max_split_size=18446744073708503040", &[], "ok max_split_size=18446744073708503040", &[]),
    ("max_split_size_mb:18446744073709551616", "OutOfRange stoull", &[], "OutOfRange stoull", &[]),
    ("max_split_size_mb:-5", "ok max_split_size=18446744073708503040", &[], "ok max_split_size=18446744073708503040", &[]),
    ("max_split_size_mb:-0", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[]),
    ("max_split_size_mb:+30", "ok max_split_size=31457280", &[], "ok max_split_size=31457280", &[]),
    ("max_split_size_mb:0x20", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[]),
    ("max_split_size_mb:40abc", "ok max_split_size=41943040", &[], "ok max_split_size=41943040", &[]),
    ("max_split_size_mb:abc", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("max_split_size_mb:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("max_split_size_mb", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("max_split_size_mb:3 0", "ok max_split_size=31457280", &[], "ok max_split_size=31457280", &[]),
    (" max_split_size_mb : 30 ", "ok max_split_size=31457280", &[], "ok max_split_size=31457280", &[]),
    ("max_split_size_mb:4\u{b}0", "ok max_split_size=41943040", &[], "ok max_split_size=41943040", &[]),
    ("max_split_size_mb:--5", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("max_split_size_mb:+-5", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("max_split_size_mb:-", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("max_split_size_mb:00030", "ok max_split_size=31457280", &[], "ok max_split_size=31457280", &[]),
    ("max_split_size_mb:-18446744073709551615", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[]),
    ("max_split_size_mb:-18446744073709551616", "OutOfRange stoull", &[], "OutOfRange stoull", &[]),
    ("max_split_size_mb:1.5e2", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[]),
    ("max_non_split_rounding_mb:20", "ok", &[], "ok", &[]),
    ("max_non_split_rounding_mb:19", "ValueError CachingAllocator option max_non_split_rounding_mb too small, must be >= 20", &[], "ValueError CachingAllocator option max_non_split_rounding_mb too small, must be >= 20", &[]),
    ("max_non_split_rounding_mb:64", "ok max_non_split_rounding_size=67108864", &[], "ok max_non_split_rounding_size=67108864", &[]),
    ("max_non_split_rounding_mb:x", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("large_segment_size_mb:10", "ValueError CachingAllocator option large_segment_size_mb must be > 10 MB", &[], "ValueError CachingAllocator option large_segment_size_mb must be > 10 MB", &[]),
    ("large_segment_size_mb:11", "ok large_segment_size=11534336 max_non_split_rounding_size=11534336", &[], "ok large_segment_size=11534336 max_non_split_rounding_size=11534336", &[]),
    ("large_segment_size_mb:64", "ok large_segment_size=67108864 max_non_split_rounding_size=67108864", &[], "ok large_segment_size=67108864 max_non_split_rounding_size=67108864", &[]),
    ("large_segment_size_mb:64,max_split_size_mb:40", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 64", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 64", &[]),
    ("max_split_size_mb:40,large_segment_size_mb:64", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 64", &[], "ValueError CachingAllocator option max_split_size_mb too small, must be >= 64", &[]),
    ("max_split_size_mb:64,large_segment_size_mb:64", "ok large_segment_size=67108864 max_split_size=67108864 max_non_split_rounding_size=67108864", &[], "ok large_segment_size=67108864 max_split_size=67108864 max_non_split_rounding_size=67108864", &[]),
    ("large_segment_size_mb:64,max_non_split_rounding_mb:63", "ValueError CachingAllocator option max_non_split_rounding_mb too small, must be >= 64", &[], "ValueError CachingAllocator option max_non_split_rounding_mb too small, must be >= 64", &[]),
    ("large_segment_size_mb:64,max_non_split_rounding_mb:100", "ok large_segment_size=67108864 max_non_split_rounding_size=104857600", &[], "ok large_segment_size=67108864 max_non_split_rounding_size=104857600", &[]),
    ("large_segment_size_mb:-1", "ok large_segment_size=18446744073708503040 max_non_split_rounding_size=18446744073708503040", &[], "ok large_segment_size=18446744073708503040 max_non_split_rounding_size=18446744073708503040", &[]),
    ("large_segment_size_mb:32,large_segment_size_mb:48", "ok large_segment_size=50331648 max_non_split_rounding_size=50331648", &[], "ok large_segment_size=50331648 max_non_split_rounding_size=50331648", &[]),
    ("large_segment_size_mb", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("large_segment_size_mb:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve_by_class:[large_segment_size_mb:0.5]", "ValueError CachingAllocator option large_segment_size_mb must be > 10 MB", &[], "ValueError CachingAllocator option large_segment_size_mb must be > 10 MB", &[]),
    ("large_segment_size_mb:abc", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("garbage_collection_threshold:0.5", "ok gc=3fe0000000000000", &[], "ok gc=3fe0000000000000", &[]),
    ("garbage_collection_threshold:0", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:1", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:1.0", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:.5", "ok gc=3fe0000000000000", &[], "ok gc=3fe0000000000000", &[]),
    ("garbage_collection_threshold:5e-1", "ok gc=3fe0000000000000", &[], "ok gc=3fe0000000000000", &[]),
    ("garbage_collection_threshold:0x0.8", "ok gc=3fe0000000000000", &[], "ok gc=3fe0000000000000", &[]),
    ("garbage_collection_threshold:0x1.8p-1", "ok gc=3fe8000000000000", &[], "ok gc=3fe8000000000000", &[]),
    ("garbage_collection_threshold:nan", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:inf", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:-0.5", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:0.5abc", "ok gc=3fe0000000000000", &[], "ok gc=3fe0000000000000", &[]),
    ("garbage_collection_threshold:abc", "InvalidArgument stod", &[], "InvalidArgument stod", &[]),
    ("garbage_collection_threshold:1e-400", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:1e400", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:1e-310", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:0,5", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("garbage_collection_threshold:0.9999999999999999", "ok gc=3fefffffffffffff", &[], "ok gc=3fefffffffffffff", &[]),
    ("garbage_collection_threshold:0.99999999999999999", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:1e", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:5.", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:0x1p-1074", "ok gc=0000000000000001", &[], "ok gc=0000000000000001", &[]),
    ("garbage_collection_threshold:0x1p-1075", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:2.2250738585072014e-308", "ok gc=0010000000000000", &[], "ok gc=0010000000000000", &[]),
    ("garbage_collection_threshold:2.2250738585072011e-308", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:2.2250738585072013e-308", "ok gc=0010000000000000", &[], "ok gc=0010000000000000", &[]),
    ("garbage_collection_threshold:0x1.fffffffffffffp-1023", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:.", "InvalidArgument stod", &[], "InvalidArgument stod", &[]),
    ("garbage_collection_threshold:+", "InvalidArgument stod", &[], "InvalidArgument stod", &[]),
    ("garbage_collection_threshold:0x", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:0x.8p1", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:0X1P-2", "ok gc=3fd0000000000000", &[], "ok gc=3fd0000000000000", &[]),
    ("garbage_collection_threshold:0x.00000000000000000000000001p100", "ok gc=3fb0000000000000", &[], "ok gc=3fb0000000000000", &[]),
    ("garbage_collection_threshold:0x1.00000000000008p-1", "ok gc=3fe0000000000000", &[], "ok gc=3fe0000000000000", &[]),
    ("garbage_collection_threshold:0x1.00000000000018p-1", "ok gc=3fe0000000000002", &[], "ok gc=3fe0000000000002", &[]),
    ("garbage_collection_threshold:0x1.000000000000080000000000001p-1", "ok gc=3fe0000000000001", &[], "ok gc=3fe0000000000001", &[]),
    ("garbage_collection_threshold:0.1000000000000000055511151231257827021181583404541015625", "ok gc=3fb999999999999a", &[], "ok gc=3fb999999999999a", &[]),
    ("garbage_collection_threshold:0.00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000001e399", "ok gc=3f847ae147ae147b", &[], "ok gc=3f847ae147ae147b", &[]),
    ("garbage_collection_threshold:4.9406564584124654e-324", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:0.000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000049406564584124654417656879286822137236505980261432476442558568250067550727020875186529983636163599237979656469544571773092665671035593979639877479601078187812630071319031140452784581716784898210368871863605699873072305000638740915356498438731247339727316961514003171538539807412623856559117102665855668676818703956031062493194527159149245532930545654440112748012970999954193198940908041656332452475714786901472678015935523861155013480352649347201937902681071074917033322268447533357208324319360923828934583680601060115061698097530783422773183292479049825247307763759272478746560847782037344696995336470179726777175851256605511991315048911014510378627381672509558373897335989936648099411642057026370902792427675445652290875386825064197182655334472656250", "ok gc=000009184e72a000", &[], "ok gc=000009184e72a000", &[]),
    ("garbage_collection_threshold:1e99999999999999999999", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("garbage_collection_threshold:0e99999999999999999999", "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[], "ValueError garbage_collect_threshold is invalid, set it in (0.0, 1.0)", &[]),
    ("garbage_collection_threshold:1e-99999999999999999999", "OutOfRange stod", &[], "OutOfRange stod", &[]),
    ("per_process_memory_fraction:0", "ok fraction=0000000000000000", &[], "ok fraction=0000000000000000", &[]),
    ("per_process_memory_fraction:1", "ok", &[], "ok", &[]),
    ("per_process_memory_fraction:1.5", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:-0", "ok fraction=8000000000000000", &[], "ok fraction=8000000000000000", &[]),
    ("per_process_memory_fraction:0.25", "ok fraction=3fd0000000000000", &[], "ok fraction=3fd0000000000000", &[]),
    ("per_process_memory_fraction:nan", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:NaN(abc)", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:-nan", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:Infinity", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:infinit", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:-0x1p-1", "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[], "ValueError per_process_memory_fraction is invalid, set it in [0.0, 1.0]", &[]),
    ("per_process_memory_fraction:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("per_process_memory_fraction:1.0000000000000001", "ok", &[], "ok", &[]),
    ("per_process_memory_fraction:x", "InvalidArgument stod", &[], "InvalidArgument stod", &[]),
    ("roundup_power2_divisions:4", "ok roundup=4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4", &[], "ok roundup=4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4", &[]),
    ("roundup_power2_divisions:1", "ok roundup=1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", &[], "ok roundup=1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1", &[]),
    ("roundup_power2_divisions:0", "ValueError For roundups, the divisions has to be power of 2 ", &[], "ValueError For roundups, the divisions has to be power of 2 ", &[]),
    ("roundup_power2_divisions:3", "ValueError For roundups, the divisions has to be power of 2 ", &[], "ValueError For roundups, the divisions has to be power of 2 ", &[]),
    ("roundup_power2_divisions:-4", "ValueError For roundups, the divisions has to be power of 2 ", &[], "ValueError For roundups, the divisions has to be power of 2 ", &[]),
    ("roundup_power2_divisions:abc", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "ok roundup=1,1,1,1,1,1,1,1,1,2,4,8,8,8,8,8", &[], "ok roundup=1,1,1,1,1,1,1,1,1,2,4,8,8,8,8,8", &[]),
    ("roundup_power2_divisions:[>:8]", "ok roundup=0,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8", &[], "ok roundup=0,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8", &[]),
    ("roundup_power2_divisions:[1024:4,256:1]", "ok roundup=4,4,4,4,4,4,4,4,1,4,4,0,0,0,0,0", &[], "ok roundup=4,4,4,4,4,4,4,4,1,4,4,0,0,0,0,0", &[]),
    ("roundup_power2_divisions:[256:1,>:8,1024:4]", "ok roundup=1,1,1,1,1,1,1,1,1,8,4,8,8,8,8,8", &[], "ok roundup=1,1,1,1,1,1,1,1,1,8,4,8,8,8,8,8", &[]),
    ("roundup_power2_divisions:[65536:2]", "ok roundup=2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2", &[], "ok roundup=2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2", &[]),
    ("roundup_power2_divisions:[1:4,>:2]", "ok roundup=4,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2", &[], "ok roundup=4,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2", &[]),
    ("roundup_power2_divisions:[0:2]", "ValueError For roundups, the intervals have to be power of 2 ", &[], "ValueError For roundups, the intervals have to be power of 2 ", &[]),
    ("roundup_power2_divisions:[3:2]", "ValueError For roundups, the intervals have to be power of 2 ", &[], "ValueError For roundups, the intervals have to be power of 2 ", &[]),
    ("roundup_power2_divisions:[256:3]", "ValueError For roundups, the divisions has to be power of 2 or 0 to disable roundup ", &[], "ValueError For roundups, the divisions has to be power of 2 or 0 to disable roundup ", &[]),
    ("roundup_power2_divisions:[256:0]", "ok", &[], "ok", &[]),
    ("roundup_power2_divisions:[]", "ok", &[], "ok", &[]),
    ("roundup_power2_divisions:[256:1,512:2", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":54, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[]),
    ("roundup_power2_divisions:[256:1", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":54, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[]),
    ("roundup_power2_divisions:[256:1,", "InternalAssert i < tokenizer.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.cpp\":213, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[]),
    ("roundup_power2_divisions:[256:1 512:2]", "ValueError For roundups, the divisions has to be power of 2 or 0 to disable roundup ", &[], "ValueError For roundups, the divisions has to be power of 2 or 0 to disable roundup ", &[]),
    ("roundup_power2_divisions:[256:1,,512:2]", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("roundup_power2_divisions:[256,1]", "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0", &[], "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0", &[]),
    ("roundup_power2_divisions:[256:1]x", "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0", &[], "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0", &[]),
    ("roundup_power2_divisions:[256:1],expandable_segments:True", "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0 expandable=1", &[], "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0 expandable=1", &[]),
    ("roundup_power2_divisions:[>:2,>:4]", "ok roundup=0,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4", &[], "ok roundup=0,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4", &[]),
    ("roundup_power2_divisions:[1:2,2:4,4:8,>:16]", "ok roundup=2,4,8,16,16,16,16,16,16,16,16,16,16,16,16,16", &[], "ok roundup=2,4,8,16,16,16,16,16,16,16,16,16,16,16,16,16", &[]),
    ("roundup_power2_divisions:[abc:2]", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("roundup_power2_divisions:[abc:3]", "ValueError For roundups, the divisions has to be power of 2 or 0 to disable roundup ", &[], "ValueError For roundups, the divisions has to be power of 2 or 0 to disable roundup ", &[]),
    ("roundup_power2_divisions:[256:abc]", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("roundup_power2_divisions:[:]", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("roundup_power2_divisions:[", "InternalAssert i < tokenizer.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.cpp\":213, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[]),
    ("roundup_power2_divisions:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":54, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("roundup_power2_divisions", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("roundup_power2_divisions:[2048:2,>:4]", "ok roundup=2,2,2,2,2,2,2,2,2,2,2,2,4,4,4,4", &[], "ok roundup=2,2,2,2,2,2,2,2,2,2,2,2,4,4,4,4", &[]),
    ("roundup_power2_divisions:[32768:2,>:4]", "ok roundup=2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2", &[], "ok roundup=2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2", &[]),
    ("roundup_power2_divisions:[256:1:2]", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("roundup_power2_divisions:[ 256 : 1 , > : 8 ]", "ok roundup=1,1,1,1,1,1,1,1,1,8,8,8,8,8,8,8", &[], "ok roundup=1,1,1,1,1,1,1,1,1,8,8,8,8,8,8,8", &[]),
    ("roundup_power2_divisions:[>>:2]", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("roundup_power2_divisions:[256:1]]", "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0", &[], "ok roundup=1,1,1,1,1,1,1,1,1,0,0,0,0,0,0,0", &[]),
    ("roundup_power2_divisions:[512:2,256:1,>:4]", "ok roundup=2,2,2,2,2,2,2,2,1,4,4,4,4,4,4,4", &[], "ok roundup=2,2,2,2,2,2,2,2,1,4,4,4,4,4,4,4", &[]),
    ("roundup_power2_divisions:[-1:2]", "ValueError For roundups, the intervals have to be power of 2 ", &[], "ValueError For roundups, the intervals have to be power of 2 ", &[]),
    ("roundup_power2_divisions:[256]", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments:True", "ok expandable=1", &[], "ok expandable=1", &[]),
    ("expandable_segments:False", "ok", &[], "ok", &[]),
    ("expandable_segments:true", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'", &[]),
    ("expandable_segments:TRUE", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'TRUE'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'TRUE'", &[]),
    ("expandable_segments:1", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '1'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '1'", &[]),
    ("expandable_segments:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments:True,", "ok expandable=1", &[], "ok expandable=1", &[]),
    ("expandable_segments:True,,", "ValueError Unrecognized key ',' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    (",expandable_segments:True", "ValueError Unrecognized key ',' in Accelerator allocator config.", &[], "ValueError Unrecognized key ',' in CUDA allocator config.", &[]),
    ("expandable_segments:True:False", "ValueError Unrecognized key 'False' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments:[True]", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '['", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '['", &[]),
    ("expandable_segments,True", "ok expandable=1", &[], "ok expandable=1", &[]),
    ("expandable_segments::True", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got ':'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got ':'", &[]),
    ("expandable_segments:True]release_lock_on_cudamalloc:True", "ok expandable=1 release_lock=1", &[], "ok expandable=1 release_lock=1", &[]),
    ("max_split_size_mb[40", "ok max_split_size=41943040", &[], "ok max_split_size=41943040", &[]),
    ("expandable_segments:\u{9}True\u{a}", "ok expandable=1", &[], "ok expandable=1", &[]),
    ("expandable_segments:Tr ue", "ok expandable=1", &[], "ok expandable=1", &[]),
    ("release_lock_on_cudamalloc:True", "ok release_lock=1", &[], "ok release_lock=1", &[]),
    ("release_lock_on_hipmalloc:True", "ok release_lock=1", &[], "ok release_lock=1", &[]),
    ("release_lock_on_cudamalloc:yes", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'", &[]),
    ("pinned_use_cuda_host_register:True", "ok host_register=1", &[], "ok host_register=1", &[]),
    ("pinned_use_hip_host_register:True", "ok host_register=1", &[], "ok host_register=1", &[]),
    ("pinned_use_cuda_host_register:false", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'false'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'false'", &[]),
    ("pinned_use_background_threads:True", "ok pinned_bg=1", &[], "ok pinned_bg=1", &[]),
    ("pinned_use_background_threads:0", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '0'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got '0'", &[]),
    ("graph_capture_record_stream_reuse:True", "ok gcrsr=1", &[], "ok gcrsr=1", &[]),
    ("graph_capture_record_stream_reuse:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("throw_on_cudamalloc_oom:True", "ok throw_oom=1", &[], "ok throw_oom=1", &[]),
    ("throw_on_cudamalloc_oom:true", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'", &[]),
    ("pinned_free_catch_all:True", "ok catch_all=1", &[], "ok catch_all=1", &[]),
    ("pinned_free_catch_all:x", "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'x'", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'x'", &[]),
    ("pinned_num_register_threads:1", "ok", &[], "ok", &[]),
    ("pinned_num_register_threads:8", "ok threads=8", &[], "ok threads=8", &[]),
    ("pinned_num_register_threads:128", "ok threads=128", &[], "ok threads=128", &[]),
    ("pinned_num_register_threads:256", "ValueError Number of register threads should be less than or equal to 128, got 256", &[], "ValueError Number of register threads should be less than or equal to 128, got 256", &[]),
    ("pinned_num_register_threads:3", "ValueError Number of register threads has to be power of 2, got 3", &[], "ValueError Number of register threads has to be power of 2, got 3", &[]),
    ("pinned_num_register_threads:0", "ValueError Number of register threads has to be power of 2, got 0", &[], "ValueError Number of register threads has to be power of 2, got 0", &[]),
    ("pinned_num_register_threads:-1", "ValueError Number of register threads has to be power of 2, got 18446744073709551615", &[], "ValueError Number of register threads has to be power of 2, got 18446744073709551615", &[]),
    ("pinned_num_register_threads:6abc", "ValueError Number of register threads has to be power of 2, got 6", &[], "ValueError Number of register threads has to be power of 2, got 6", &[]),
    ("pinned_num_register_threads:x", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("pinned_reserve_segment_size_mb:0", "ValueError Pinned reserve segment size has to be greater than 0", &[], "ValueError Pinned reserve segment size has to be greater than 0", &[]),
    ("pinned_reserve_segment_size_mb:64", "ok reserve_mb=64", &[], "ok reserve_mb=64", &[]),
    ("pinned_reserve_segment_size_mb:-1", "ok reserve_mb=18446744073709551615", &[], "ok reserve_mb=18446744073709551615", &[]),
    ("pinned_reserve_segment_size_mb:abc", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("pinned_max_round_threshold_mb:64", "ok pinned_round=67108864", &[], "ok pinned_round=67108864", &[]),
    ("pinned_max_round_threshold_mb:0", "ok pinned_round=0", &[], "ok pinned_round=0", &[]),
    ("pinned_max_cached_size_mb:0", "ok pinned_cached=0", &[], "ok pinned_cached=0", &[]),
    ("pinned_max_cached_size_mb:-1", "ok pinned_cached=18446744073708503040", &[], "ok pinned_cached=18446744073708503040", &[]),
    ("pinned_max_round_threshold_mb:256,pinned_max_cached_size_mb:128", "ok pinned_round=268435456 pinned_cached=134217728", &["pinned_max_round_threshold_mb (256) > pinned_max_cached_size_mb (128). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."], "ok pinned_round=268435456 pinned_cached=134217728", &["pinned_max_round_threshold_mb (256) > pinned_max_cached_size_mb (128). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."]),
    ("pinned_max_cached_size_mb:128,pinned_max_round_threshold_mb:129", "ok pinned_round=135266304 pinned_cached=134217728", &["pinned_max_round_threshold_mb (129) > pinned_max_cached_size_mb (128). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."], "ok pinned_round=135266304 pinned_cached=134217728", &["pinned_max_round_threshold_mb (129) > pinned_max_cached_size_mb (128). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."]),
    ("pinned_max_cached_size_mb:128,pinned_max_round_threshold_mb:128", "ok pinned_round=134217728 pinned_cached=134217728", &[], "ok pinned_round=134217728 pinned_cached=134217728", &[]),
    ("pinned_max_round_threshold_mb:-1,pinned_max_cached_size_mb:1", "ok pinned_round=18446744073708503040 pinned_cached=1048576", &["pinned_max_round_threshold_mb (17592186044415) > pinned_max_cached_size_mb (1). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."], "ok pinned_round=18446744073708503040 pinned_cached=1048576", &["pinned_max_round_threshold_mb (17592186044415) > pinned_max_cached_size_mb (1). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."]),
    ("pinned_max_round_threshold_mb:x", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("expandable_segments_reserve:0.5", "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[], "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[]),
    ("expandable_segments_reserve:2G", "ok r.zz=2147483648/2147483648 r.a=2147483648/2147483648 r.b=2147483648/2147483648", &[], "ok r.zz=2147483648/2147483648 r.a=2147483648/2147483648 r.b=2147483648/2147483648", &[]),
    ("expandable_segments_reserve:2g", "ok r.zz=2147483648/2147483648 r.a=2147483648/2147483648 r.b=2147483648/2147483648", &[], "ok r.zz=2147483648/2147483648 r.a=2147483648/2147483648 r.b=2147483648/2147483648", &[]),
    ("expandable_segments_reserve:abc", "ok", &["Ignoring invalid expandable-segment reserve value 'abc' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value 'abc' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:0", "ok", &["Ignoring invalid expandable-segment reserve value '0' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '0' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1e-310", "ok r.zz=0/0 r.a=0/0 r.b=0/0", &[], "ok r.zz=0/0 r.a=0/0 r.b=0/0", &[]),
    ("expandable_segments_reserve:1e-400", "ok", &["Ignoring invalid expandable-segment reserve value '1e-400' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1e-400' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1e400", "ok", &["Ignoring invalid expandable-segment reserve value '1e400' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1e400' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:5.", "ok r.zz=343597383680/257698037760 r.a=343597383680/257698037760 r.b=343597383680/257698037760", &[], "ok r.zz=343597383680/257698037760 r.a=343597383680/257698037760 r.b=343597383680/257698037760", &[]),
    ("expandable_segments_reserve:.5", "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[], "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[]),
    ("expandable_segments_reserve:1e", "ok", &["Ignoring invalid expandable-segment reserve value '1e' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1e' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:[a:1]", "ValueError Unrecognized key ':' in CUDA allocator config.", &["Ignoring invalid expandable-segment reserve value '[' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ValueError Unrecognized key ':' in CUDA allocator config.", &["Ignoring invalid expandable-segment reserve value '[' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve:inf", "ok", &["Ignoring invalid expandable-segment reserve value 'inf' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value 'inf' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:0x1p-1", "ok", &["Ignoring invalid expandable-segment reserve value '0x1p-1' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '0x1p-1' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:+0.5", "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[], "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[]),
    ("expandable_segments_reserve:-0.5", "ok", &["Ignoring invalid expandable-segment reserve value '-0.5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '-0.5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1e+0", "ok r.zz=68719476736/51539607552 r.a=68719476736/51539607552 r.b=68719476736/51539607552", &[], "ok r.zz=68719476736/51539607552 r.a=68719476736/51539607552 r.b=68719476736/51539607552", &[]),
    ("expandable_segments_reserve:00.5e0G", "ok r.zz=536870912/536870912 r.a=536870912/536870912 r.b=536870912/536870912", &[], "ok r.zz=536870912/536870912 r.a=536870912/536870912 r.b=536870912/536870912", &[]),
    ("expandable_segments_reserve:G", "ok", &["Ignoring invalid expandable-segment reserve value 'G' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value 'G' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1.5.5", "ok", &["Ignoring invalid expandable-segment reserve value '1.5.5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1.5.5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1e5e5", "ok", &["Ignoring invalid expandable-segment reserve value '1e5e5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1e5e5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:+", "ok", &["Ignoring invalid expandable-segment reserve value '+' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '+' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:.", "ok", &["Ignoring invalid expandable-segment reserve value '.' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '.' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1e+", "ok", &["Ignoring invalid expandable-segment reserve value '1e+' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1e+' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1ee5", "ok", &["Ignoring invalid expandable-segment reserve value '1ee5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '1ee5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:e5", "ok", &["Ignoring invalid expandable-segment reserve value 'e5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value 'e5' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:0.5,expandable_segments_reserve:bad", "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &["Ignoring invalid expandable-segment reserve value 'bad' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &["Ignoring invalid expandable-segment reserve value 'bad' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:1e20G", "ok r.zz=18446744073709551615/18446744073709551615 r.a=18446744073709551615/18446744073709551615 r.b=18446744073709551615/18446744073709551615", &[], "ok r.zz=18446744073709551615/18446744073709551615 r.a=18446744073709551615/18446744073709551615 r.b=18446744073709551615/18446744073709551615", &[]),
    ("expandable_segments_reserve:-.5e-1G", "ok", &["Ignoring invalid expandable-segment reserve value '-.5e-1G' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '-.5e-1G' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve:+.5", "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[], "ok r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", &[]),
    ("expandable_segments_reserve:0.5GG", "ok", &["Ignoring invalid expandable-segment reserve value '0.5GG' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok", &["Ignoring invalid expandable-segment reserve value '0.5GG' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve_by_class:[a:0.5,b:1G]", "ok r.a=34359738368/25769803776k r.b=1073741824/1073741824k", &[], "ok r.a=34359738368/25769803776k r.b=1073741824/1073741824k", &[]),
    ("expandable_segments_reserve_by_class:[]", "ok", &[], "ok", &[]),
    ("expandable_segments_reserve_by_class:[a:0.5", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[]),
    ("expandable_segments_reserve_by_class:[a:0.5,]", "ok r.a=34359738368/25769803776k", &[], "ok r.a=34359738368/25769803776k", &[]),
    ("expandable_segments_reserve_by_class:[a:bad,b:0.5]", "ok r.b=34359738368/25769803776k", &["Ignoring invalid expandable-segment reserve value 'bad' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "ok r.b=34359738368/25769803776k", &["Ignoring invalid expandable-segment reserve value 'bad' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve_by_class:a:0.5]", "ValueError Unrecognized key '0.5' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve_by_class:[a:0.5 b:0.25]", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &["Ignoring invalid expandable-segment reserve value '0.5b' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default.", "Ignoring invalid expandable-segment reserve value ']' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &["Ignoring invalid expandable-segment reserve value '0.5b' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default.", "Ignoring invalid expandable-segment reserve value ']' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve_by_class:[a:0.5]junk", "ok r.a=34359738368/25769803776k", &[], "ok r.a=34359738368/25769803776k", &[]),
    ("expandable_segments_reserve_by_class:[a:0.5,a:0.25]", "ok r.a=17179869184/12884901888k", &[], "ok r.a=17179869184/12884901888k", &[]),
    ("expandable_segments_reserve_by_class:0.5", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve_by_class:[a:0.5],expandable_segments_reserve:0.25", "ok r.zz=17179869184/12884901888 r.a=34359738368/25769803776k r.b=17179869184/12884901888", &[], "ok r.zz=17179869184/12884901888 r.a=34359738368/25769803776k r.b=17179869184/12884901888", &[]),
    ("expandable_segments_reserve_by_class:[a]", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":54, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":54, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve_by_class:[a:]", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &["Ignoring invalid expandable-segment reserve value ']' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &["Ignoring invalid expandable-segment reserve value ']' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."]),
    ("expandable_segments_reserve_by_class", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve_by_class:", "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("expandable_segments_reserve_by_class:[a,0.5]", "ok r.a=34359738368/25769803776k", &[], "ok r.a=34359738368/25769803776k", &[]),
    ("expandable_segments_reserve_by_class:(a:0.5]", "ValueError Unrecognized key '0.5' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("bogus:1", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "ValueError Unrecognized key 'bogus' in CUDA allocator config.", &[]),
    ("bogus", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("bogus:", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("bogus:[1,2]", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "ValueError Unrecognized key 'bogus' in CUDA allocator config.", &[]),
    ("bogus:[1,2", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":114, please report a bug to PyTorch. Expected closing bracket ']' in ConfigTokenizer but reached end of config", &[]),
    ("expandable_segments_handle_type:posix_fd", "ValueError Unrecognized key 'expandable_segments_handle_type' in Accelerator allocator config.", &[], "ValueError Unrecognized key 'expandable_segments_handle_type' in CUDA allocator config.", &[]),
    ("Expandable_segments:True", "ValueError Unrecognized key 'Expandable_segments' in Accelerator allocator config.", &[], "ValueError Unrecognized key 'Expandable_segments' in CUDA allocator config.", &[]),
    ("expandable_segments:True,bogus:1", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "ValueError Unrecognized key 'bogus' in CUDA allocator config.", &[]),
    ("bogus2:1,max_split_size_mb:5", "ValueError Unrecognized key 'bogus2' in Accelerator allocator config.", &[], "ValueError Unrecognized key 'bogus2' in CUDA allocator config.", &[]),
    ("max_split_size_mb:5,bogus2:1", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError Unrecognized key 'bogus2' in CUDA allocator config.", &[]),
    ("max_split_size_mb:5,release_lock_on_cudamalloc:yes", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 20", &[], "ValueError Expected 'True' or 'False' at index 6 in ConfigTokenizer but got 'yes'", &[]),
    (":", "ValueError Unrecognized key ':' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("[", "ValueError Unrecognized key '[' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("]", "ValueError Unrecognized key ']' in Accelerator allocator config.", &[], "InternalAssert i < config_.size() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/core/AllocatorConfig.h\":123, please report a bug to PyTorch. Index out of bounds in ConfigTokenizer", &[]),
    ("release_lock_on_cudamalloc:yes,bogus:1", "ValueError Unrecognized key 'bogus' in Accelerator allocator config.", &[], "ValueError Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'yes'", &[]),
    ("backend:[native,x]", "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[], "ValueError Unknown allocator backend, options are native and cudaMallocAsync", &[]),
    ("pinned_num_register_threads:[4]", "InvalidArgument stoull", &[], "InvalidArgument stoull", &[]),
    ("expandable_segments:True,max_split_size_mb:256,garbage_collection_threshold:0.6,roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", "ok max_split_size=268435456 roundup=1,1,1,1,1,1,1,1,1,2,4,8,8,8,8,8 gc=3fe3333333333333 expandable=1", &[], "ok max_split_size=268435456 roundup=1,1,1,1,1,1,1,1,1,2,4,8,8,8,8,8 gc=3fe3333333333333 expandable=1", &[]),
    ("large_segment_size_mb:32,max_split_size_mb:100,max_non_split_rounding_mb:64,garbage_collection_threshold:0.5,roundup_power2_divisions:4,expandable_segments:True,pinned_use_background_threads:True,pinned_max_round_threshold_mb:8,pinned_max_cached_size_mb:16,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:4,pinned_reserve_segment_size_mb:8,graph_capture_record_stream_reuse:True,per_process_memory_fraction:0.5,pinned_free_catch_all:True,throw_on_cudamalloc_oom:True,expandable_segments_reserve:0.5,expandable_segments_reserve_by_class:[a:2G,b:0.25]", "ok large_segment_size=33554432 max_split_size=104857600 max_non_split_rounding_size=67108864 roundup=4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4 gc=3fe0000000000000 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=2147483648/2147483648k r.b=17179869184/12884901888k", &[], "ok large_segment_size=33554432 max_split_size=104857600 max_non_split_rounding_size=67108864 roundup=4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4 gc=3fe0000000000000 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=2147483648/2147483648k r.b=17179869184/12884901888k", &[]),
    ("max_split_size_mb:40,max_split_size_mb:60", "ok max_split_size=62914560", &[], "ok max_split_size=62914560", &[]),
    ("expandable_segments:True,expandable_segments:False", "ok", &[], "ok", &[]),
    ];

    #[rustfmt::skip]
    const GOLDEN_SEQUENCES: &[GoldenSequence] = &[
    (&["large_segment_size_mb:32,max_split_size_mb:100,max_non_split_rounding_mb:64,garbage_collection_threshold:0.5,roundup_power2_divisions:4,expandable_segments:True,pinned_use_background_threads:True,pinned_max_round_threshold_mb:8,pinned_max_cached_size_mb:16,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:4,pinned_reserve_segment_size_mb:8,graph_capture_record_stream_reuse:True,per_process_memory_fraction:0.5,pinned_free_catch_all:True,throw_on_cudamalloc_oom:True,expandable_segments_reserve:0.5,expandable_segments_reserve_by_class:[a:2G,b:0.25]", "", "expandable_segments_reserve_by_class:[b:0.125]", "max_non_split_rounding_mb:40", "large_segment_size_mb:64", "max_split_size_mb:64", "expandable_segments:False", "expandable_segments_reserve:bad", "expandable_segments_reserve_by_class:[]", "max_split_size_mb:40"], &["ok large_segment_size=33554432 max_split_size=104857600 max_non_split_rounding_size=67108864 roundup=4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4 gc=3fe0000000000000 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=2147483648/2147483648k r.b=17179869184/12884901888k", "ok large_segment_size=33554432 max_non_split_rounding_size=33554432 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=2147483648/2147483648k r.b=17179869184/12884901888k", "ok large_segment_size=33554432 max_non_split_rounding_size=33554432 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=8589934592/6442450944k", "ok large_segment_size=33554432 max_non_split_rounding_size=41943040 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=8589934592/6442450944k", "ok large_segment_size=67108864 max_non_split_rounding_size=67108864 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=8589934592/6442450944k", "ok large_segment_size=67108864 max_split_size=67108864 max_non_split_rounding_size=67108864 expandable=1 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=8589934592/6442450944k", "ok large_segment_size=67108864 max_non_split_rounding_size=67108864 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=8589934592/6442450944k", "ok large_segment_size=67108864 max_non_split_rounding_size=67108864 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=8589934592/6442450944k", "ok large_segment_size=67108864 max_non_split_rounding_size=67108864 pinned_bg=1 pinned_round=8388608 pinned_cached=16777216 release_lock=1 gcrsr=1 fraction=3fe0000000000000 throw_oom=1 host_register=1 threads=4 reserve_mb=8 catch_all=1 r.zz=34359738368/25769803776 r.a=34359738368/25769803776 r.b=34359738368/25769803776", "ValueError CachingAllocator option max_split_size_mb too small, must be >= 64"]),
    (&["max_split_size_mb:100,garbage_collection_threshold:0.5,roundup_power2_divisions:[256:1,>:4]", "expandable_segments:True", "release_lock_on_cudamalloc:True", "backend:native", "backend:cudaMallocAsync"], &["ok max_split_size=104857600 roundup=1,1,1,1,1,1,1,1,1,4,4,4,4,4,4,4 gc=3fe0000000000000", "ok expandable=1", "ok expandable=1 release_lock=1", "ok expandable=1 release_lock=1", "InternalAssert tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"/__w/pytorch/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":64, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, cudaMallocAsync != native"]),
    (&["pinned_max_round_threshold_mb:256", "pinned_max_cached_size_mb:128", "pinned_max_round_threshold_mb:512,pinned_max_cached_size_mb:64"], &["ok pinned_round=268435456", "ok pinned_round=268435456 pinned_cached=134217728", "ok pinned_round=536870912 pinned_cached=67108864"]),
    (&["large_segment_size_mb:32", "max_non_split_rounding_mb:20"], &["ok large_segment_size=33554432 max_non_split_rounding_size=33554432", "ValueError CachingAllocator option max_non_split_rounding_mb too small, must be >= 32"]),
    ];

    /// (PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF, PYTORCH_ALLOC_CONF, outcome).
    #[rustfmt::skip]
    const GOLDEN_ENV: &[GoldenEnv] = &[
    (None, None, None, "ok"),
    (Some("expandable_segments:True"), None, Some("release_lock_on_cudamalloc:True"), "ok expandable=1"),
    (Some(""), None, Some("release_lock_on_cudamalloc:True"), "ok"),
    (None, None, Some("release_lock_on_cudamalloc:True,expandable_segments:True"), "ok expandable=1 release_lock=1"),
    (None, Some("expandable_segments:True,release_lock_on_cudamalloc:True"), None, "ok expandable=1"),
    (None, Some("expandable_segments:True"), Some("release_lock_on_cudamalloc:True,max_split_size_mb:50"), "ok expandable=1 release_lock=1"),
    (None, Some("bogus:1"), None, "ValueError Unrecognized key 'bogus' in Accelerator allocator config."),
    (None, Some("max_split_size_mb:64"), Some("bogus:1"), "ValueError Unrecognized key 'bogus' in CUDA allocator config."),
    (Some("max_split_size_mb:64"), Some("bogus:1"), Some("bogus:2"), "ok max_split_size=67108864"),
    (None, None, Some("backend:cudaMallocAsync,per_process_memory_fraction:0.5"), "ok backend=cudaMallocAsync fraction=3fe0000000000000"),
    (None, Some("backend:cudaMallocAsync"), None, "ok"),
    (Some("bogus:1"), None, Some("expandable_segments:True"), "ValueError Unrecognized key 'bogus' in CUDA allocator config."),
    ];
}
