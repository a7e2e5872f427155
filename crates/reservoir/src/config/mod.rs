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
//! Layout, one file per concern, bottom to top (each file uses only the
//! ones on the lines above it):
//!
//! ```text
//! cnum, values          numbers read as glibc/libstdc++ read them (`std::stoull`,
//!                       `std::stod`, `istream >> double`); the value types and
//!                       bounds (AllocatorBackend, ReserveSpec, MIB, ...)
//! error                 errors and warnings, with PyTorch's texts
//! tokenizer             ConfigTokenizer
//! policy, settings      ReservoirPolicy (Reservoir-only knobs), AllocatorConfig
//!                       and its defaults
//! torch_release         TorchRelease (the PyTorch release PyTorch mode
//!                       reproduces) and ReleaseRules, every rule that differs
//!                       between releases
//! pass                  one reading of a string (Pass), a key's parser's
//!                       signature, the True/False parser
//! accelerator, cuda     the per-key parsers of PyTorch's two config classes
//!                       (AllocatorConfig.cpp, CUDAAllocatorConfig.cpp)
//! keys                  the one key table (name and aliases, which parser reads
//!                       it, its parser, its reset, its snapshot entry, its
//!                       settings-string entry), both passes over it, and
//!                       AllocatorConfig::to_settings_string
//! message               ConfigError's text (quotes the key table)
//! env                   the readers (environment, start-up string, run time, and
//!                       AllocatorConfig::parse_with_policy for `policy:NAME`)
//! ```
//!
//! Adding a key: a field in `settings.rs`, a row in the table of `keys.rs`,
//! and its parser in `accelerator.rs` or `cuda.rs` when it is more than a
//! `True`/`False`.
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

mod accelerator;
mod cnum;
mod cuda;
mod env;
mod error;
pub mod heap;
mod keys;
mod message;
mod pass;
mod policy;
mod settings;
mod tokenizer;
mod torch_release;
mod torch_text;
mod values;

#[cfg(test)]
mod tests;

pub use env::{ENV_ALLOC_CONF, ENV_CUDA_ALLOC_CONF, ENV_HIP_ALLOC_CONF};
pub use error::{quote_window, MAX_SETTINGS_LEN, QUOTE_WINDOW};
pub use error::{
    AssertSite, ConfigError, ConfigWarning, KeyParser, PyTorchException, SyntaxProblem, ValueRule,
};
pub use keys::KNOWN_KEYS;
pub use policy::{waste_bound, ReservoirPolicy, POLICY_KEY, WASTE_SLACK_PER_STREAM};
pub use settings::AllocatorConfig;
pub use torch_release::{
    AssertLines, ExpandableOomAdvice, FractionRounding, FreeBlockOrder, ReleaseRules, TorchRelease,
};
pub use values::{
    AllocatorBackend, ReserveSpec, MAX_REGISTER_THREADS, MIB, ROUNDUP_POWER2_INTERVALS,
};
