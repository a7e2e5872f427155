//! The key table: every key PyTorch 2.15 accepts in a settings string (CUDA
//! build), one row each, and the key loop both of PyTorch's parsers share.
//!
//! A row names the key and its aliases, says which of PyTorch's two parsers
//! reads it (the other one skips it with `skipKey`), points to its parser
//! (in `accelerator.rs` or `cuda.rs`, or a one-line `flag` for a
//! `True`/`False` key), says how it is reset before every reading of the
//! common keys (spec errors 3 and 4), and writes its entry of the snapshot's
//! `allocator_settings` dict (spec 2.5). Adding a key: a field in
//! `settings.rs`, a row here, its parser, and its line in
//! [`AllocatorConfig::to_settings_string`].

use super::accelerator;
use super::cuda;
use super::error::{ConfigError, ConfigWarning, KeyParser};
use super::pass::{flag, ParseFn, Pass};
use super::settings::AllocatorConfig;
use super::tokenizer::Tokens;
use super::values::{AllocatorBackend, MIB};
use crate::snapshot::AllocatorSettings;

/// One row of the key table.
pub(super) struct Key {
    /// The key, then the aliases PyTorch also accepts.
    pub(super) names: &'static [&'static str],
    /// The parser that reads it.
    pub(super) parser: KeyParser,
    /// How its value is read.
    pub(super) parse: ParseFn,
    /// What happens to its setting before every reading of the common keys
    /// (start-up and `_set_allocator_settings`): `None` keeps the value.
    pub(super) reset: Option<fn(&mut AllocatorConfig)>,
    /// Writes its entry of the snapshot's `allocator_settings` dict; `None`
    /// when PyTorch writes none.
    pub(super) snapshot: Option<fn(&AllocatorConfig, &mut AllocatorSettings)>,
}

/// `max_split_size` and the pinned thresholds in the snapshot: bytes, or -1
/// for "unlimited" (`SIZE_MAX` as a Python int of an `int64`).
fn bytes_or_unset(v: u64) -> i64 {
    if v == u64::MAX {
        -1
    } else {
        v as i64
    }
}

/// The key table, in the order of [`KNOWN_KEYS`] (aliases right after their key).
const KEYS: [Key; 20] = [
    Key {
        names: &["backend"],
        parser: KeyParser::Cuda,
        parse: cuda::backend,
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["large_segment_size_mb"],
        parser: KeyParser::Accelerator,
        // Read before every other key by `accelerator::large_segment_size`.
        parse: |p, i| p.t.skip_key(i),
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["max_split_size_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| accelerator::at_least_large_segment(p, i, |c, v| c.max_split_size = v),
        reset: Some(|c| c.max_split_size = AllocatorConfig::default().max_split_size),
        snapshot: Some(|c, s| s.max_split_size = Some(bytes_or_unset(c.max_split_size))),
    },
    Key {
        names: &["max_non_split_rounding_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| {
            accelerator::at_least_large_segment(p, i, |c, v| c.max_non_split_rounding_size = v)
        },
        reset: Some(|c| c.max_non_split_rounding_size = c.large_segment_size),
        snapshot: None,
    },
    Key {
        names: &["garbage_collection_threshold"],
        parser: KeyParser::Accelerator,
        parse: accelerator::garbage_collection_threshold,
        reset: Some(|c| {
            c.garbage_collection_threshold = AllocatorConfig::default().garbage_collection_threshold
        }),
        snapshot: Some(|c, s| {
            s.garbage_collection_threshold = Some(c.garbage_collection_threshold)
        }),
    },
    Key {
        names: &["roundup_power2_divisions"],
        parser: KeyParser::Accelerator,
        parse: accelerator::roundup_power2_divisions,
        reset: Some(|c| {
            c.roundup_power2_divisions = AllocatorConfig::default().roundup_power2_divisions
        }),
        snapshot: Some(|c, s| {
            s.roundup_power2_divisions = Some(
                c.roundup_power2_divisions
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| (1u64 << i, d))
                    .collect(),
            )
        }),
    },
    Key {
        names: &["expandable_segments"],
        parser: KeyParser::Accelerator,
        parse: |p, i| flag(p, i, |c, v| c.expandable_segments = v),
        reset: None,
        snapshot: Some(|c, s| s.expandable_segments = Some(c.expandable_segments)),
    },
    Key {
        names: &["release_lock_on_cudamalloc", "release_lock_on_hipmalloc"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.release_lock_on_cudamalloc = v),
        reset: None,
        snapshot: Some(|c, s| s.release_lock_on_cudamalloc = Some(c.release_lock_on_cudamalloc)),
    },
    Key {
        names: &["per_process_memory_fraction"],
        parser: KeyParser::Cuda,
        parse: cuda::per_process_memory_fraction,
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["graph_capture_record_stream_reuse"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.graph_capture_record_stream_reuse = v),
        reset: None,
        snapshot: Some(|c, s| {
            s.graph_capture_record_stream_reuse = Some(c.graph_capture_record_stream_reuse)
        }),
    },
    Key {
        names: &["throw_on_cudamalloc_oom"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.throw_on_cudamalloc_oom = v),
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["expandable_segments_reserve"],
        parser: KeyParser::Cuda,
        parse: cuda::expandable_segments_reserve,
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["expandable_segments_reserve_by_class"],
        parser: KeyParser::Cuda,
        parse: cuda::expandable_segments_reserve_by_class,
        reset: None,
        snapshot: None,
    },
    Key {
        names: &[
            "pinned_use_cuda_host_register",
            "pinned_use_hip_host_register",
        ],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.pinned_use_cuda_host_register = v),
        reset: None,
        snapshot: Some(|c, s| {
            s.pinned_use_cuda_host_register = Some(c.pinned_use_cuda_host_register)
        }),
    },
    Key {
        names: &["pinned_num_register_threads"],
        parser: KeyParser::Cuda,
        parse: cuda::pinned_num_register_threads,
        reset: None,
        snapshot: Some(|c, s| {
            s.pinned_num_register_threads = Some(c.pinned_num_register_threads as i64)
        }),
    },
    Key {
        names: &["pinned_use_background_threads"],
        parser: KeyParser::Accelerator,
        parse: |p, i| flag(p, i, |c, v| c.pinned_use_background_threads = v),
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["pinned_reserve_segment_size_mb"],
        parser: KeyParser::Cuda,
        parse: cuda::pinned_reserve_segment_size_mb,
        reset: None,
        snapshot: None,
    },
    Key {
        names: &["pinned_max_round_threshold_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| accelerator::mib(p, i, |c, v| c.pinned_max_round_threshold = v),
        reset: None,
        snapshot: Some(|c, s| {
            s.max_round_threshold = Some(bytes_or_unset(c.pinned_max_round_threshold))
        }),
    },
    Key {
        names: &["pinned_max_cached_size_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| accelerator::mib(p, i, |c, v| c.pinned_max_cached_size = v),
        reset: None,
        snapshot: Some(|c, s| s.max_cached_size = Some(bytes_or_unset(c.pinned_max_cached_size))),
    },
    Key {
        names: &["pinned_free_catch_all"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.pinned_free_catch_all = v),
        reset: None,
        snapshot: None,
    },
];

/// How many names (keys and aliases) the table holds.
const fn name_count() -> usize {
    let mut n = 0;
    let mut k = 0;
    while k < KEYS.len() {
        n += KEYS[k].names.len();
        k += 1;
    }
    n
}

/// The names of the table, in its order.
const fn known_keys() -> [&'static str; name_count()] {
    let mut out = [""; name_count()];
    let mut n = 0;
    let mut k = 0;
    while k < KEYS.len() {
        let mut a = 0;
        while a < KEYS[k].names.len() {
            out[n] = KEYS[k].names[a];
            n += 1;
            a += 1;
        }
        k += 1;
    }
    out
}

/// Every key PyTorch 2.15 accepts in a settings string (CUDA build).
pub const KNOWN_KEYS: [&str; name_count()] = known_keys();

/// `AcceleratorAllocatorConfig::parseArgs`: `large_segment_size_mb` first
/// (spec error 5), the resets (spec errors 3 and 4), then every common key.
pub(super) fn accelerator_keys(
    cfg: &mut AllocatorConfig,
    t: &Tokens,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<(), ConfigError> {
    let p = &mut Pass { cfg, t, warnings };
    accelerator::large_segment_size(p)?;
    reset(p.cfg);
    let read = read_keys(p, KeyParser::Accelerator)?;
    let cfg = &p.cfg;
    if read.contains(&"pinned_max_round_threshold_mb")
        && read.contains(&"pinned_max_cached_size_mb")
        && cfg.pinned_max_round_threshold > cfg.pinned_max_cached_size
    {
        p.warnings
            .push(ConfigWarning::PinnedRoundThresholdAboveCachedSize {
                round_threshold_mb: cfg.pinned_max_round_threshold / MIB,
                cached_size_mb: cfg.pinned_max_cached_size / MIB,
            });
    }
    Ok(())
}

/// `CUDAAllocatorConfig::parseArgs`. `backend` may only repeat the backend
/// chosen at load time (`cfg.backend`, spec error 10). PyTorch warns when the
/// async backend meets any other CUDA key (spec error 11).
pub(super) fn cuda_keys(
    cfg: &mut AllocatorConfig,
    t: &Tokens,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<(), ConfigError> {
    let p = &mut Pass { cfg, t, warnings };
    let read = read_keys(p, KeyParser::Cuda)?;
    let used_async =
        read.contains(&"backend") && p.cfg.backend == AllocatorBackend::CudaMallocAsync;
    let used_native_option = read.iter().any(|&key| key != "backend");
    if used_async && used_native_option {
        p.warnings
            .push(ConfigWarning::AsyncBackendIgnoresNativeOptions);
    }
    Ok(())
}

/// The row of `name` (a key or an alias).
fn find(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.names.contains(&name))
}

/// The loop both `parseArgs` share: a key of `parser` is read by its row's
/// parser, a key of the other parser is skipped with `skipKey`, anything
/// else is an unknown key. The separator after each value is skipped, never
/// checked (spec error 9). Returns the keys read (their first names).
fn read_keys(p: &mut Pass<'_>, parser: KeyParser) -> Result<Vec<&'static str>, ConfigError> {
    let t = p.t;
    let n = t.len();
    let mut read = Vec::new();
    let mut i = 0;
    while i < n {
        i = match find(t.text(i)) {
            Some(key) if key.parser == parser => {
                let last = (key.parse)(p, i)?;
                read.push(key.names[0]);
                last
            }
            Some(_) => t.skip_key(i)?,
            None => {
                return Err(ConfigError::UnknownKey {
                    key: t.text(i).to_owned(),
                    index: i,
                    offset: t.offset(i),
                    parser,
                })
            }
        };
        if i + 1 < n {
            i += 1;
        }
        i += 1;
    }
    Ok(read)
}

/// The resets every reading of the common keys starts with (spec error 4),
/// after `large_segment_size_mb` has been read.
fn reset(cfg: &mut AllocatorConfig) {
    for reset in KEYS.iter().filter_map(|k| k.reset) {
        reset(cfg);
    }
}

impl AllocatorConfig {
    /// The `allocator_settings` dict torch 2.15 writes in a snapshot (spec
    /// 2.5, with its `max_round_threshold` and `max_cached_size`).
    pub(crate) fn allocator_settings(&self) -> AllocatorSettings {
        let mut s = AllocatorSettings {
            pytorch_cuda_alloc_conf: Some(self.last_settings.clone()),
            ..AllocatorSettings::default()
        };
        for write in KEYS.iter().filter_map(|k| k.snapshot) {
            write(self, &mut s);
        }
        s
    }
}
