//! The key table: every key PyTorch 2.15 accepts in a settings string (CUDA
//! build), one row each, and the key loop both of PyTorch's parsers share.
//!
//! A row names the key and its aliases, says which of PyTorch's two parsers
//! reads it (the other one skips it with `skipKey`), points to its parser
//! (in `accelerator.rs` or `cuda.rs`, or a one-line `flag` for a
//! `True`/`False` key), says how it is reset before every reading of the
//! common keys (spec errors 3 and 4), writes its entry of the snapshot's
//! `allocator_settings` dict (spec 2.5) and its entry of
//! [`AllocatorConfig::to_settings_string`]. Adding a key: a field in
//! `settings.rs`, a row here, and its parser when it is more than a
//! `True`/`False`.

use std::collections::BTreeMap;

use super::accelerator;
use super::cuda;
use super::error::{ConfigError, ConfigWarning, KeyParser};
use super::pass::{flag, ParseFn, Pass};
use super::settings::AllocatorConfig;
use super::tokenizer::Tokens;
use super::values::{AllocatorBackend, ReserveSpec, MIB, ROUNDUP_POWER2_INTERVALS};
use crate::observe::snapshot::AllocatorSettings;

/// One row of the key table.
struct Key {
    /// The key, then the aliases PyTorch also accepts.
    names: &'static [&'static str],
    /// The parser that reads it.
    parser: KeyParser,
    /// How its value is read.
    parse: ParseFn,
    /// What happens to its setting before every reading of the common keys
    /// (start-up and `_set_allocator_settings`): `None` keeps the value.
    reset: Option<fn(&mut AllocatorConfig)>,
    /// Writes its entry of the snapshot's `allocator_settings` dict; `None`
    /// when PyTorch writes none.
    snapshot: Option<fn(&AllocatorConfig, &mut AllocatorSettings)>,
    /// Its value in [`AllocatorConfig::to_settings_string`], given the
    /// settings and the defaults; `None` leaves the key out (its setting is
    /// at the default).
    write: fn(&AllocatorConfig, &AllocatorConfig) -> Option<String>,
    /// Its place in the settings string (0 first): the order of the
    /// hand-written writer this table replaced, kept so that every string
    /// stays byte-identical. [`WRITE_ORDER`] checks that the places are
    /// 0..20, each once, when it compiles.
    written_at: usize,
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

/// A size written in MiB, when it is not `default`.
fn mib_text(v: u64, default: u64) -> Option<String> {
    (v != default).then(|| (v / MIB).to_string())
}

/// A count, when it is not `default`.
fn int_text(v: u64, default: u64) -> Option<String> {
    (v != default).then(|| v.to_string())
}

/// A number, when its bits are not `default`'s (so `-0.0` is written).
fn double_text(v: f64, default: f64) -> Option<String> {
    (v.to_bits() != default.to_bits()).then(|| double_text_of(v))
}

/// A `True`/`False` key: written only when on.
fn flag_text(on: bool) -> Option<String> {
    on.then(|| "True".to_owned())
}

/// `roundup_power2_divisions`: one value when every interval has the same
/// power of two, else the whole list; nothing when all are 0.
fn divisions_text(div: &[u64; ROUNDUP_POWER2_INTERVALS]) -> Option<String> {
    if div.iter().all(|&v| v == 0) {
        None
    } else if div.iter().all(|&v| v == div[0]) && div[0].is_power_of_two() {
        Some(div[0].to_string())
    } else {
        let list: Vec<String> = div
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{}:{v}", 1u64 << i))
            .collect();
        Some(format!("[{}]", list.join(",")))
    }
}

/// `expandable_segments_reserve_by_class`: `[class:reserve,...]`, nothing
/// when empty.
fn reserves_text(by_class: &BTreeMap<String, ReserveSpec>) -> Option<String> {
    if by_class.is_empty() {
        return None;
    }
    let list: Vec<String> = by_class
        .iter()
        .map(|(class, spec)| format!("{class}:{}", reserve_text(*spec)))
        .collect();
    Some(format!("[{}]", list.join(",")))
}

/// The key table, in the order of [`KNOWN_KEYS`] (aliases right after their key).
const KEYS: [Key; 20] = [
    Key {
        names: &["backend"],
        parser: KeyParser::Cuda,
        parse: cuda::backend,
        reset: None,
        snapshot: None,
        write: |c, d| (c.backend != d.backend).then(|| c.backend.to_string()),
        written_at: 0,
    },
    Key {
        names: &["large_segment_size_mb"],
        parser: KeyParser::Accelerator,
        // Read before every other key by `accelerator::large_segment_size`.
        parse: |p, i| p.t.skip_key(i),
        reset: None,
        snapshot: None,
        write: |c, d| mib_text(c.large_segment_size, d.large_segment_size),
        written_at: 1,
    },
    Key {
        names: &["max_split_size_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| accelerator::at_least_large_segment(p, i, |c, v| c.max_split_size = v),
        reset: Some(|c| c.max_split_size = AllocatorConfig::default().max_split_size),
        snapshot: Some(|c, s| s.max_split_size = Some(bytes_or_unset(c.max_split_size))),
        write: |c, d| mib_text(c.max_split_size, d.max_split_size),
        written_at: 2,
    },
    Key {
        names: &["max_non_split_rounding_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| {
            accelerator::at_least_large_segment(p, i, |c, v| c.max_non_split_rounding_size = v)
        },
        reset: Some(|c| c.max_non_split_rounding_size = c.large_segment_size),
        snapshot: None,
        write: |c, _| mib_text(c.max_non_split_rounding_size, c.large_segment_size),
        written_at: 3,
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
        write: |c, d| {
            double_text(
                c.garbage_collection_threshold,
                d.garbage_collection_threshold,
            )
        },
        written_at: 4,
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
        write: |c, _| divisions_text(&c.roundup_power2_divisions),
        written_at: 5,
    },
    Key {
        names: &["expandable_segments"],
        parser: KeyParser::Accelerator,
        parse: |p, i| flag(p, i, |c, v| c.expandable_segments = v),
        reset: None,
        snapshot: Some(|c, s| s.expandable_segments = Some(c.expandable_segments)),
        write: |c, _| flag_text(c.expandable_segments),
        written_at: 6,
    },
    Key {
        names: &["release_lock_on_cudamalloc", "release_lock_on_hipmalloc"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.release_lock_on_cudamalloc = v),
        reset: None,
        snapshot: Some(|c, s| s.release_lock_on_cudamalloc = Some(c.release_lock_on_cudamalloc)),
        write: |c, _| flag_text(c.release_lock_on_cudamalloc),
        written_at: 10,
    },
    Key {
        names: &["per_process_memory_fraction"],
        parser: KeyParser::Cuda,
        parse: cuda::per_process_memory_fraction,
        reset: None,
        snapshot: None,
        write: |c, d| double_text(c.per_process_memory_fraction, d.per_process_memory_fraction),
        written_at: 15,
    },
    Key {
        names: &["graph_capture_record_stream_reuse"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.graph_capture_record_stream_reuse = v),
        reset: None,
        snapshot: Some(|c, s| {
            s.graph_capture_record_stream_reuse = Some(c.graph_capture_record_stream_reuse)
        }),
        write: |c, _| flag_text(c.graph_capture_record_stream_reuse),
        written_at: 14,
    },
    Key {
        names: &["throw_on_cudamalloc_oom"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.throw_on_cudamalloc_oom = v),
        reset: None,
        snapshot: None,
        write: |c, _| flag_text(c.throw_on_cudamalloc_oom),
        written_at: 17,
    },
    Key {
        names: &["expandable_segments_reserve"],
        parser: KeyParser::Cuda,
        parse: cuda::expandable_segments_reserve,
        reset: None,
        snapshot: None,
        write: |c, _| c.expandable_segments_reserve.map(reserve_text),
        written_at: 18,
    },
    Key {
        names: &["expandable_segments_reserve_by_class"],
        parser: KeyParser::Cuda,
        parse: cuda::expandable_segments_reserve_by_class,
        reset: None,
        snapshot: None,
        write: |c, _| reserves_text(&c.expandable_segments_reserve_by_class),
        written_at: 19,
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
        write: |c, _| flag_text(c.pinned_use_cuda_host_register),
        written_at: 11,
    },
    Key {
        names: &["pinned_num_register_threads"],
        parser: KeyParser::Cuda,
        parse: cuda::pinned_num_register_threads,
        reset: None,
        snapshot: Some(|c, s| {
            s.pinned_num_register_threads = Some(c.pinned_num_register_threads as i64)
        }),
        write: |c, d| int_text(c.pinned_num_register_threads, d.pinned_num_register_threads),
        written_at: 12,
    },
    Key {
        names: &["pinned_use_background_threads"],
        parser: KeyParser::Accelerator,
        parse: |p, i| flag(p, i, |c, v| c.pinned_use_background_threads = v),
        reset: None,
        snapshot: None,
        write: |c, _| flag_text(c.pinned_use_background_threads),
        written_at: 7,
    },
    Key {
        names: &["pinned_reserve_segment_size_mb"],
        parser: KeyParser::Cuda,
        parse: cuda::pinned_reserve_segment_size_mb,
        reset: None,
        snapshot: None,
        write: |c, d| {
            int_text(
                c.pinned_reserve_segment_size_mb,
                d.pinned_reserve_segment_size_mb,
            )
        },
        written_at: 13,
    },
    Key {
        names: &["pinned_max_round_threshold_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| accelerator::mib(p, i, |c, v| c.pinned_max_round_threshold = v),
        reset: None,
        snapshot: Some(|c, s| {
            s.max_round_threshold = Some(bytes_or_unset(c.pinned_max_round_threshold))
        }),
        write: |c, d| mib_text(c.pinned_max_round_threshold, d.pinned_max_round_threshold),
        written_at: 8,
    },
    Key {
        names: &["pinned_max_cached_size_mb"],
        parser: KeyParser::Accelerator,
        parse: |p, i| accelerator::mib(p, i, |c, v| c.pinned_max_cached_size = v),
        reset: None,
        snapshot: Some(|c, s| s.max_cached_size = Some(bytes_or_unset(c.pinned_max_cached_size))),
        write: |c, d| mib_text(c.pinned_max_cached_size, d.pinned_max_cached_size),
        written_at: 9,
    },
    Key {
        names: &["pinned_free_catch_all"],
        parser: KeyParser::Cuda,
        parse: |p, i| flag(p, i, |c, v| c.pinned_free_catch_all = v),
        reset: None,
        snapshot: None,
        write: |c, _| flag_text(c.pinned_free_catch_all),
        written_at: 16,
    },
];

/// The rows in the order [`AllocatorConfig::to_settings_string`] writes
/// them (by `written_at`); does not compile unless the places are
/// `0..KEYS.len()`, each once.
const WRITE_ORDER: [usize; KEYS.len()] = {
    let mut order = [usize::MAX; KEYS.len()];
    let mut k = 0;
    while k < KEYS.len() {
        let at = KEYS[k].written_at;
        assert!(at < KEYS.len(), "written_at out of range");
        assert!(
            order[at] == usize::MAX,
            "two keys written at the same place"
        );
        order[at] = k;
        k += 1;
    }
    order
};

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
    let rules = p.cfg.torch_release.rules();
    while i < n {
        // A key the release does not have is unknown to it (PyTorch mode of
        // older releases, ReleaseRules::unknown_keys).
        let known = find(t.text(i)).filter(|k| k.names.iter().all(|n| rules.has_key(n)));
        i = match known {
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

    /// A settings string that reproduces these settings: parsing it (from the
    /// defaults) gives back `self`, apart from `last_settings`, `policy` and (unless
    /// [`parse_with_policy`](Self::parse_with_policy) reads it)
    /// `torch_release`.
    /// Only settings that differ from their defaults are written. Values that
    /// no settings string can produce (sizes that are not whole MiB, divisions
    /// that are not 0 or a power of two, out-of-range fractions) are written
    /// as best they can be and will not read back the same.
    ///
    /// Written from the key table: each row's `write` gives its value, in
    /// the order of the rows' `written_at`. A [`torch_release`](Self::torch_release)
    /// other than the newest is written last as `policy:pytorch-2.13`, which
    /// [`AllocatorConfig::parse_with_policy`] reads back (PyTorch's own
    /// parser knows no `policy` key: a string for it is of the newest
    /// release, written without one).
    pub fn to_settings_string(&self) -> String {
        let defaults = AllocatorConfig::default();
        let mut parts: Vec<String> = Vec::new();
        for &k in &WRITE_ORDER {
            let key = &KEYS[k];
            if let Some(value) = (key.write)(self, &defaults) {
                parts.push(format!("{}:{value}", key.names[0]));
            }
        }
        if self.torch_release != defaults.torch_release {
            parts.push(format!(
                "{}:{}",
                super::POLICY_KEY,
                self.torch_release.policy_name()
            ));
        }
        parts.join(",")
    }
}

/// `f64` text that C's `strtod` reads back exactly: the shortest round-trip
/// decimal, or a hexadecimal float for subnormals (an inexact decimal
/// subnormal is a range error for `strtod`).
fn double_text_of(v: f64) -> String {
    if v.is_subnormal() {
        let sign = if v.is_sign_negative() { "-" } else { "" };
        format!("{sign}0x0.{:013x}p-1022", v.to_bits() & ((1u64 << 52) - 1))
    } else {
        format!("{v:?}")
    }
}

/// A reserve as `expandable_segments_reserve` reads it.
fn reserve_text(spec: ReserveSpec) -> String {
    match spec {
        ReserveSpec::Fraction(f) => format!("{f:?}"),
        ReserveSpec::GiB(g) => format!("{g:?}G"),
    }
}
