//! Which PyTorch release PyTorch mode reproduces, and every rule of the CUDA
//! caching allocator that changed between the supported releases, in one
//! table keyed by release.
//!
//! PyTorch mode (`policy:pytorch`, the default) is torch 2.15, the newest
//! supported release; `policy:pytorch-2.11` ... `policy:pytorch-2.15` name
//! one. Each rule below was found in the releases themselves (the wheels'
//! `libc10_cuda.so` strings, headers and Python sources) and confirmed with
//! that release's real allocator on the fake device (`../shared/oracle`,
//! `PYTORCH_ORACLE_TORCH_VERSION`); `docs/replay-fidelity.md` lists them with
//! the golden trace that shows each.

use std::fmt;
use std::str::FromStr;

use super::error::ConfigError;

/// A PyTorch release whose CUDA caching allocator PyTorch mode reproduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TorchRelease {
    /// torch 2.11.
    V2_11,
    /// torch 2.12.
    V2_12,
    /// torch 2.13.
    V2_13,
    /// torch 2.14.
    V2_14,
    /// torch 2.15 (the newest supported; PyTorch mode's default).
    #[default]
    V2_15,
}

impl TorchRelease {
    /// Every supported release, oldest first.
    pub const ALL: [TorchRelease; 5] = [
        TorchRelease::V2_11,
        TorchRelease::V2_12,
        TorchRelease::V2_13,
        TorchRelease::V2_14,
        TorchRelease::V2_15,
    ];

    /// The newest supported release (what `pytorch` means when the input
    /// does not show its release).
    pub const NEWEST: TorchRelease = TorchRelease::V2_15;

    /// `"2.13"` for [`TorchRelease::V2_13`].
    pub fn version(self) -> &'static str {
        match self {
            TorchRelease::V2_11 => "2.11",
            TorchRelease::V2_12 => "2.12",
            TorchRelease::V2_13 => "2.13",
            TorchRelease::V2_14 => "2.14",
            TorchRelease::V2_15 => "2.15",
        }
    }

    /// The policy name of this release: `pytorch-2.13`.
    pub fn policy_name(self) -> String {
        format!("pytorch-{}", self.version())
    }

    /// The release of a torch version string: `2.13`, `2.13.0`,
    /// `2.13.0+cu132`, `2.13.1` all give [`TorchRelease::V2_13`]; `None`
    /// for a release that is not supported (or not a version).
    pub fn from_version(v: &str) -> Option<TorchRelease> {
        let v = v.trim();
        let mut parts = v.split(['.', '+', 'a', 'r', 'd']);
        let major = parts.next()?;
        let minor = parts.next()?;
        if major != "2" {
            return None;
        }
        TorchRelease::ALL
            .into_iter()
            .find(|r| r.version().strip_prefix("2.") == Some(minor))
    }

    /// The release a policy name names: `pytorch-2.13` (or `pytorch-2.13.0`);
    /// `None` for any other name (plain `pytorch` included).
    pub fn from_policy_name(name: &str) -> Option<TorchRelease> {
        TorchRelease::from_version(name.strip_prefix("pytorch-")?)
    }

    /// The rules of this release (see [`ReleaseRules`]).
    pub fn rules(self) -> ReleaseRules {
        ReleaseRules::of(self)
    }
}

impl fmt::Display for TorchRelease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.version())
    }
}

impl FromStr for TorchRelease {
    type Err = ConfigError;

    /// `2.13`, `2.13.0`, `pytorch-2.13`; an unsupported release is
    /// [`ConfigError::UnknownPolicy`] naming it.
    fn from_str(s: &str) -> Result<TorchRelease, ConfigError> {
        TorchRelease::from_policy_name(s)
            .or_else(|| TorchRelease::from_version(s))
            .ok_or_else(|| ConfigError::UnknownPolicy {
                name: s.trim().to_owned(),
            })
    }
}

/// The settings keys added after torch 2.11, newest first: two in 2.15,
/// two in 2.13, two in 2.12 ([`ReleaseRules::unknown_keys`]).
const NEWER_KEYS: [&str; 6] = [
    "expandable_segments_reserve",
    "expandable_segments_reserve_by_class",
    "pinned_max_round_threshold_mb",
    "pinned_max_cached_size_mb",
    "throw_on_cudamalloc_oom",
    "pinned_free_catch_all",
];

/// How a release ends the out-of-memory message when expandable segments
/// are on ([`ReleaseRules::expandable_oom_advice`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpandableOomAdvice {
    /// torch 2.11 to 2.13: the same advice as with them off (`If reserved
    /// but unallocated memory is large try setting
    /// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ...`).
    Fragmentation,
    /// torch 2.14: no advice; the message ends after `... is reserved by
    /// PyTorch but unallocated.`.
    Nothing,
    /// torch 2.15: ` expandable_segments is enabled. If instead the process
    /// is running out of virtual address space (VSZ) ...`.
    VirtualAddressSpace,
}

/// Which of several free blocks of one stream and one size best fit takes
/// ([`ReleaseRules::free_block_order`]): the comparator of PyTorch's
/// `BlockPool::blocks`, whose first block at or after the search key
/// `get_free_block` takes, and whose order `release_available_cached_blocks`,
/// `release_blocks` and the garbage collection walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FreeBlockOrder {
    /// torch 2.11: `BlockComparatorSize` compares (stream, size, address):
    /// the lowest address first.
    Address,
    /// torch 2.12: `BlockComparatorRegistrationCounter` compares (stream,
    /// size, `registration_counter`), where every new `Block` object (a new
    /// segment's block, the front part a split hands out, the pieces an
    /// expandable segment's map and unmap cut off) takes the next value of
    /// one global counter, and a merge keeps the counter of the block that
    /// absorbs its neighbours: the block object created first comes first.
    BlockCreation,
    /// torch 2.13 and later: `BlockComparatorSizeCounterAddress` compares
    /// (stream, size, `registration_counter`, address), where the counter is
    /// taken once per segment (in `alloc_block`) and every block of the
    /// segment carries it: the oldest segment first, then the lowest address.
    SegmentCreation,
}

/// How a release turns `set_per_process_memory_fraction(f)` into the bytes
/// the allocator may reserve ([`ReleaseRules::memory_fraction_rounding`];
/// spec 1.13: `allowed = f x total`).
///
/// Measured with each release's wheel on the fake device (total
/// 85045870592 B): `set_per_process_memory_fraction(0.02)` then
/// `get_per_process_memory_fraction()` gives 0.019999999990122978
/// (1700917411 B) in 2.11 and 2.12, 0.02000000000188134 (1700917412 B) in
/// 2.13 to 2.15; a request of exactly `k x 2 MiB` bytes after setting the
/// fraction to `(k x 2 MiB - 0.3) / total` runs out of memory in 2.11 and
/// 2.12 and fits in 2.13 to 2.15; and `libc10_cuda.so`'s
/// `DeviceCachingAllocator::setMemoryFraction` converts with `cvttsd2si`
/// alone in 2.11 and 2.12, and first with GCC's inline `std::round` (add
/// 0.49999999999999994 to the magnitude below 2^52, truncate, copy the
/// sign) in 2.13 to 2.15.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FractionRounding {
    /// torch 2.11 and 2.12: `static_cast<size_t>(f * total)`, truncated
    /// (0.02 of 85045870592 B is 1700917411 B).
    Truncate,
    /// torch 2.13 and later: `static_cast<size_t>(std::round(f * total))`,
    /// to the nearest byte, halves away from zero (0.02 of 85045870592 B is
    /// 1700917412 B; 1/2^17 of it, 648848.5 B, is 648849 B).
    Nearest,
}

impl FractionRounding {
    /// The bytes a fraction `fraction` (in `[0, 1]`) of `total` bytes
    /// allows: `fraction * total` in `f64`, then truncated or rounded to the
    /// nearest byte as the release does.
    pub fn allowed_bytes(self, fraction: f64, total: u64) -> u64 {
        let product = fraction * total as f64;
        match self {
            FractionRounding::Truncate => product as u64,
            // `f64::round` rounds halves away from zero, as C's `round`.
            FractionRounding::Nearest => product.round() as u64,
        }
    }
}

/// The rules of the allocator that differ between supported releases. Each
/// field names the release that changed it; everything not listed here is
/// the same in 2.11 to 2.15 as far as the goldens of every release show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReleaseRules {
    /// How the out-of-memory message ends when expandable segments are on
    /// (changed in 2.14 and in 2.15; with them off it always ends with the
    /// advice to turn them on).
    pub expandable_oom_advice: ExpandableOomAdvice,
    /// `memory_stats()` has the key `num_oom_rejections` (torch 2.12 and
    /// later).
    pub stat_num_oom_rejections: bool,
    /// `memory_stats()` has the keys
    /// `reserved_bytes_by_private_pools.<id>.<pool>.<field>`, 12 per
    /// private pool that ever held driver memory (torch 2.13 and later:
    /// `DeviceStats::reserved_bytes_by_private_pools` in
    /// `c10/core/CachingDeviceAllocator.h`; absent from the 2.11 and 2.12
    /// headers).
    pub stat_reserved_bytes_by_private_pools: bool,
    /// The settings keys `expandable_segments_reserve` and
    /// `expandable_segments_reserve_by_class` exist (torch 2.15); before,
    /// they are unknown keys (`Unrecognized key
    /// 'expandable_segments_reserve' in Accelerator allocator config.`).
    pub expandable_segments_reserve_keys: bool,
    /// The settings keys `pinned_max_round_threshold_mb` and
    /// `pinned_max_cached_size_mb` exist (torch 2.13 and later); before,
    /// they are unknown keys (`Unrecognized key
    /// 'pinned_max_round_threshold_mb' in Accelerator allocator config.`).
    pub pinned_cache_limit_keys: bool,
    /// The settings keys `throw_on_cudamalloc_oom` and
    /// `pinned_free_catch_all` exist (torch 2.12 and later); in 2.11 they
    /// are unknown keys.
    pub throw_on_cudamalloc_oom_keys: bool,
    /// torch 2.15: an expandable segment created for a request larger than
    /// its whole address space is released at once, without a map
    /// (`reserve` + `addr_free`). Before, its whole range is mapped page by
    /// page until the device runs out, the pages are released, and the
    /// segment is kept (fully unmapped) for later requests.
    pub expandable_oversize_released_unmapped: bool,
    /// Which free block of equal size best fit takes (changed in 2.12 and
    /// in 2.13; see [`FreeBlockOrder`]).
    pub free_block_order: FreeBlockOrder,
    /// How the per-process memory fraction becomes allowed bytes
    /// (truncated until 2.12, to the nearest byte from 2.13; see
    /// [`FractionRounding`]).
    pub memory_fraction_rounding: FractionRounding,
    /// Where the settings parser's internal assertions sit in the release's
    /// sources, which PyTorch's error text quotes (see [`AssertLines`]).
    pub assert_lines: AssertLines,
}

/// Where PyTorch's internal assertions of the settings parser sit in one
/// release's sources: the directory its wheel was built in and the line of
/// each assertion. Both are part of the text PyTorch raises (`i <
/// config_.size() INTERNAL ASSERT FAILED at "/pytorch/c10/core/AllocatorConfig.h":124,
/// ...`, see [`ConfigError::pytorch_message_of`](super::ConfigError::pytorch_message_of)).
/// Measured with `_set_allocator_settings` on each release's wheel
/// (`tools/probe_config_releases.py`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AssertLines {
    /// The build's source root: `/pytorch` (2.11, 2.12) or
    /// `/__w/pytorch/pytorch` (2.13 and later).
    pub source_root: &'static str,
    /// `ConfigTokenizer::operator[]`, `c10/core/AllocatorConfig.h`: 55
    /// (2.15: 54).
    pub tokenizer_index: u32,
    /// `ConfigTokenizer::checkIndex`, `c10/core/AllocatorConfig.h`: 124
    /// (2.15: 123).
    pub tokenizer_check_index: u32,
    /// `ConfigTokenizer::skipKey`, `c10/core/AllocatorConfig.h`: 115 (2.15:
    /// 114).
    pub tokenizer_skip_key: u32,
    /// `parseRoundUpPower2Divisions`, `c10/core/AllocatorConfig.cpp`: 185
    /// (2.11, 2.12), 211 (2.13, 2.14), 213 (2.15).
    pub roundup_list: u32,
    /// The backend check of `CUDAAllocatorConfig::parseArgs`,
    /// `c10/cuda/CUDAAllocatorConfig.cpp`: 44 (2.15: 64).
    pub backend_mismatch: u32,
}

impl ReleaseRules {
    /// The rules of `release`.
    pub const fn of(release: TorchRelease) -> ReleaseRules {
        use TorchRelease::*;
        ReleaseRules {
            expandable_oom_advice: match release {
                V2_11 | V2_12 | V2_13 => ExpandableOomAdvice::Fragmentation,
                V2_14 => ExpandableOomAdvice::Nothing,
                V2_15 => ExpandableOomAdvice::VirtualAddressSpace,
            },
            stat_num_oom_rejections: !matches!(release, V2_11),
            stat_reserved_bytes_by_private_pools: !matches!(release, V2_11 | V2_12),
            expandable_segments_reserve_keys: matches!(release, V2_15),
            pinned_cache_limit_keys: !matches!(release, V2_11 | V2_12),
            throw_on_cudamalloc_oom_keys: !matches!(release, V2_11),
            expandable_oversize_released_unmapped: matches!(release, V2_15),
            free_block_order: match release {
                V2_11 => FreeBlockOrder::Address,
                V2_12 => FreeBlockOrder::BlockCreation,
                V2_13 | V2_14 | V2_15 => FreeBlockOrder::SegmentCreation,
            },
            memory_fraction_rounding: match release {
                V2_11 | V2_12 => FractionRounding::Truncate,
                V2_13 | V2_14 | V2_15 => FractionRounding::Nearest,
            },
            assert_lines: AssertLines {
                source_root: match release {
                    V2_11 | V2_12 => "/pytorch",
                    V2_13 | V2_14 | V2_15 => "/__w/pytorch/pytorch",
                },
                tokenizer_index: if matches!(release, V2_15) { 54 } else { 55 },
                tokenizer_check_index: if matches!(release, V2_15) { 123 } else { 124 },
                tokenizer_skip_key: if matches!(release, V2_15) { 114 } else { 115 },
                roundup_list: match release {
                    V2_11 | V2_12 => 185,
                    V2_13 | V2_14 => 211,
                    V2_15 => 213,
                },
                backend_mismatch: if matches!(release, V2_15) { 64 } else { 44 },
            },
        }
    }

    /// Whether this release has the settings key `name` (a name of torch
    /// 2.15's keys or an alias; see [`ReleaseRules::unknown_keys`]).
    pub fn has_key(&self, name: &str) -> bool {
        !self.unknown_keys().contains(&name)
    }

    /// The settings keys of torch 2.15 this release does not have: a
    /// settings string naming one is refused in PyTorch mode of the release
    /// (rules `expandable_segments_reserve_keys`, `pinned_cache_limit_keys`,
    /// `throw_on_cudamalloc_oom_keys`). Keys were only ever added, each
    /// release having every key of the releases before it, so the keys a
    /// release lacks are a prefix of `NEWER_KEYS`, newest first.
    pub fn unknown_keys(&self) -> &'static [&'static str] {
        let n = if !self.throw_on_cudamalloc_oom_keys {
            6
        } else if !self.pinned_cache_limit_keys {
            4
        } else if !self.expandable_segments_reserve_keys {
            2
        } else {
            0
        };
        &NEWER_KEYS[..n]
    }

    /// The `memory_stats()` keys this release does not have (Reservoir
    /// computes them; PyTorch mode of the release leaves them out).
    pub fn missing_stat_keys(&self) -> &'static [&'static str] {
        if self.stat_num_oom_rejections {
            &[]
        } else {
            &["num_oom_rejections"]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AllocatorConfig;

    #[test]
    fn versions_and_names_read_back() {
        for r in TorchRelease::ALL {
            assert_eq!(TorchRelease::from_version(r.version()), Some(r));
            assert_eq!(TorchRelease::from_policy_name(&r.policy_name()), Some(r));
            assert_eq!(r.policy_name().parse::<TorchRelease>().unwrap(), r);
        }
        assert_eq!(
            TorchRelease::from_version("2.13.0+cu132"),
            Some(TorchRelease::V2_13)
        );
        assert_eq!(
            TorchRelease::from_version("2.12.1"),
            Some(TorchRelease::V2_12)
        );
        assert_eq!(TorchRelease::from_version("2.10.0"), None);
        assert_eq!(TorchRelease::from_version("2.1"), None);
        assert_eq!(TorchRelease::from_version("3.13"), None);
        assert_eq!(TorchRelease::from_policy_name("pytorch"), None);
        let e = "pytorch-2.9".parse::<TorchRelease>().unwrap_err();
        assert!(e.to_string().contains("pytorch-2.9"), "{e}");
        assert_eq!(TorchRelease::default(), TorchRelease::NEWEST);
    }

    // Rule expandable_segments_reserve_keys (docs/replay-fidelity.md,
    // "PyTorch releases"): torch 2.13 refuses 'expandable_segments_reserve'
    // as an unknown key. A settings string is read as at start-up, where
    // the CUDA parser reads first ("Unrecognized key
    // 'expandable_segments_reserve' in CUDA allocator config.", measured
    // with PYTORCH_CUDA_ALLOC_CONF on each release's wheel); at run time
    // (`_set_allocator_settings`) the common parser reads first ("... in
    // Accelerator allocator config.").
    #[test]
    fn settings_string_names_the_release() {
        use crate::config::KeyParser;
        let c =
            AllocatorConfig::parse_with_policy("policy:pytorch-2.13,max_split_size_mb:64").unwrap();
        assert_eq!(c.torch_release, TorchRelease::V2_13);
        assert_eq!(c.max_split_size, 64 << 20);
        assert_eq!(c.policy, crate::config::ReservoirPolicy::PyTorch);
        let c = AllocatorConfig::parse_with_policy("").unwrap();
        assert_eq!(c.torch_release, TorchRelease::V2_15);
        // The reserve keys exist in 2.15 only.
        let reserve = "expandable_segments:True,expandable_segments_reserve:0.5";
        assert!(
            AllocatorConfig::parse_with_policy(&format!("{reserve},policy:pytorch-2.15")).is_ok()
        );
        assert!(AllocatorConfig::parse_with_policy(reserve).is_ok());
        for old in ["2.11", "2.12", "2.13", "2.14"] {
            let e = AllocatorConfig::parse_with_policy(&format!("policy:pytorch-{old},{reserve}"))
                .unwrap_err();
            match &e {
                ConfigError::UnknownKey { key, parser, .. } => {
                    assert_eq!(key, "expandable_segments_reserve");
                    assert_eq!(*parser, KeyParser::Cuda);
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(
                e.pytorch_message(),
                "Unrecognized key 'expandable_segments_reserve' in CUDA allocator config."
            );
            let mut c = AllocatorConfig {
                torch_release: old.parse().unwrap(),
                ..AllocatorConfig::default()
            };
            let before = c.clone();
            let e = c.apply_runtime(reserve).unwrap_err();
            assert_eq!(
                e.pytorch_message(),
                "Unrecognized key 'expandable_segments_reserve' in Accelerator allocator config."
            );
            assert_eq!(c, before, "a refused string changes nothing");
        }
        // torch 2.12 and 2.11 refuse the pinned cache limits of 2.13, 2.11
        // also throw_on_cudamalloc_oom and pinned_free_catch_all of 2.12
        // (measured at start-up and with `_set_allocator_settings` on each
        // release's wheel).
        for (setting, key, refused_by) in [
            (
                "pinned_max_round_threshold_mb:8",
                "pinned_max_round_threshold_mb",
                &["2.11", "2.12"][..],
            ),
            (
                "pinned_max_cached_size_mb:64",
                "pinned_max_cached_size_mb",
                &["2.11", "2.12"][..],
            ),
            (
                "throw_on_cudamalloc_oom:False",
                "throw_on_cudamalloc_oom",
                &["2.11"][..],
            ),
            (
                "pinned_free_catch_all:True",
                "pinned_free_catch_all",
                &["2.11"][..],
            ),
        ] {
            for r in TorchRelease::ALL {
                let conf = format!("max_split_size_mb:64,{setting},policy:pytorch-{r}");
                match AllocatorConfig::parse_with_policy(&conf) {
                    Ok(_) => assert!(!refused_by.contains(&r.version()), "{conf}"),
                    Err(e) => {
                        assert!(refused_by.contains(&r.version()), "{conf}: {e}");
                        assert!(
                            matches!(&e, ConfigError::UnknownKey { key: k, .. } if k == key),
                            "{e:?}"
                        );
                        assert_eq!(
                            e.pytorch_message(),
                            format!("Unrecognized key '{key}' in CUDA allocator config.")
                        );
                    }
                }
                let mut c = AllocatorConfig {
                    torch_release: r,
                    ..AllocatorConfig::default()
                };
                match c.apply_runtime(&format!("max_split_size_mb:64,{setting}")) {
                    Ok(()) => assert!(!refused_by.contains(&r.version()), "{r} {setting}"),
                    Err(e) => assert_eq!(
                        e.pytorch_message(),
                        format!("Unrecognized key '{key}' in Accelerator allocator config.")
                    ),
                }
            }
        }
        let e = AllocatorConfig::parse_with_policy("policy:pytorch-2.10").unwrap_err();
        assert!(matches!(e, ConfigError::UnknownPolicy { .. }), "{e:?}");
        assert!(e.to_string().contains("pytorch-2.10"), "{e}");
    }

    #[test]
    fn rule_table() {
        use ExpandableOomAdvice::*;
        use TorchRelease::*;
        let advice: Vec<ExpandableOomAdvice> = TorchRelease::ALL
            .iter()
            .map(|r| r.rules().expandable_oom_advice)
            .collect();
        assert_eq!(
            advice,
            [
                Fragmentation,
                Fragmentation,
                Fragmentation,
                Nothing,
                VirtualAddressSpace
            ]
        );
        // Rule free_block_order (docs/replay-fidelity.md, "PyTorch releases"):
        // the comparator of `BlockPool::blocks` in each release's
        // libc10_cuda.so.
        let order: Vec<FreeBlockOrder> = TorchRelease::ALL
            .iter()
            .map(|r| r.rules().free_block_order)
            .collect();
        assert_eq!(
            order,
            [
                FreeBlockOrder::Address,
                FreeBlockOrder::BlockCreation,
                FreeBlockOrder::SegmentCreation,
                FreeBlockOrder::SegmentCreation,
                FreeBlockOrder::SegmentCreation
            ]
        );
        assert_eq!(V2_11.rules().missing_stat_keys(), ["num_oom_rejections"]);
        assert!(V2_12.rules().missing_stat_keys().is_empty());
        assert_eq!(V2_14.rules().unknown_keys().len(), 2);
        assert!(V2_15.rules().unknown_keys().is_empty());
        // Rules pinned_cache_limit_keys and throw_on_cudamalloc_oom_keys
        // (docs/replay-fidelity.md, "PyTorch releases"): each release's
        // `_set_allocator_settings` on the oracle.
        assert_eq!(V2_13.rules().unknown_keys(), V2_14.rules().unknown_keys());
        assert_eq!(
            V2_12.rules().unknown_keys(),
            [
                "expandable_segments_reserve",
                "expandable_segments_reserve_by_class",
                "pinned_max_round_threshold_mb",
                "pinned_max_cached_size_mb"
            ]
        );
        assert_eq!(V2_11.rules().unknown_keys().len(), 6);
        assert!(V2_11
            .rules()
            .unknown_keys()
            .contains(&"throw_on_cudamalloc_oom"));
        assert!(V2_11
            .rules()
            .unknown_keys()
            .contains(&"pinned_free_catch_all"));
    }

    // Rule stat_num_oom_rejections (docs/replay-fidelity.md, "PyTorch
    // releases"): torch 2.11's memory_stats() has no `num_oom_rejections`
    // (releases/2.11/stats_keys.json); 2.12 added it.
    #[test]
    fn memory_stats_keys_follow_the_release() {
        use crate::caching::StreamShards;
        use crate::sim::SimDevice;
        use crate::CachingAllocator;
        for release in TorchRelease::ALL {
            let cfg =
                AllocatorConfig::parse_with_policy(&format!("policy:{}", release.policy_name()))
                    .unwrap();
            assert_eq!(cfg.torch_release, release);
            let alloc = CachingAllocator::new(SimDevice::default(), cfg.clone());
            let stats = alloc.memory_stats();
            let shards = StreamShards::new(SimDevice::default(), cfg).unwrap();
            let shard_stats = shards.memory_stats();
            let has = release != TorchRelease::V2_11;
            assert_eq!(stats.contains_key("num_oom_rejections"), has, "{release}");
            assert_eq!(
                shard_stats.contains_key("num_oom_rejections"),
                has,
                "{release}"
            );
            assert!(stats.contains_key("num_ooms"), "{release}");
            // Only that key differs from the newest release's set.
            let newest = CachingAllocator::new(SimDevice::default(), AllocatorConfig::default());
            let extra = newest.memory_stats().len() - stats.len();
            assert_eq!(extra, usize::from(!has), "{release}");
        }
    }

    // The settings string writes the release back (`policy:pytorch-2.13`,
    // last), and parse_with_policy reads it; the newest release is written
    // without it, so PyTorch's own parser reads the string.
    #[test]
    fn settings_string_round_trips_the_release() {
        for release in TorchRelease::ALL {
            let s = format!("max_split_size_mb:64,policy:{}", release.policy_name());
            let c = AllocatorConfig::parse_with_policy(&s).unwrap();
            let written = c.to_settings_string();
            if release == TorchRelease::NEWEST {
                assert_eq!(written, "max_split_size_mb:64");
                assert_eq!(
                    AllocatorConfig::parse(&written).unwrap().max_split_size,
                    64 << 20
                );
            } else {
                assert_eq!(written, s);
            }
            let back = AllocatorConfig::parse_with_policy(&written).unwrap();
            assert_eq!(back.torch_release, release);
            assert_eq!(back.max_split_size, 64 << 20);
        }
        // `policy:pytorch` is the newest release; the last entry wins.
        let c = AllocatorConfig::parse_with_policy("policy:pytorch-2.11,policy:pytorch").unwrap();
        assert_eq!(c.torch_release, TorchRelease::NEWEST);
        let c = AllocatorConfig::parse_with_policy("policy:pytorch,policy:pytorch-2.11").unwrap();
        assert_eq!(c.torch_release, TorchRelease::V2_11);
        assert_eq!(c.policy, crate::config::ReservoirPolicy::PyTorch);
        // A bad release is a typed error naming it, with the known names.
        let e = AllocatorConfig::parse_with_policy("policy:pytorch-2.99").unwrap_err();
        match &e {
            ConfigError::UnknownPolicy { name } => assert_eq!(name, "pytorch-2.99"),
            other => panic!("{other:?}"),
        }
        assert!(
            e.to_string().contains("pytorch-2.11 ... pytorch-2.15"),
            "{e}"
        );
    }

    /// Rule memory_fraction_rounding (spec ../shared/spec/pytorch-allocator.md
    /// 1.13, `allowed = f x total`): the allowed bytes of each fraction on the
    /// fake device (total 85045870592 B), as each release's wheel shows them
    /// (`PYTORCH_ORACLE_HOME=~/.cache/oracle-2.12 ../shared/oracle/oracle-python`
    /// with `torch.cuda.set_per_process_memory_fraction(f)`, then the bytes `a`
    /// of `int(f * total)` and `int(f * total) + 1` for which
    /// `a / total == torch.cuda.get_per_process_memory_fraction()`; the same
    /// with `~/.cache/oracle-2.11`, `-2.13`, `-2.14` and the 2.15 oracle).
    #[test]
    fn memory_fraction_bytes_truncated_until_2_12_rounded_from_2_13() {
        const TOTAL: u64 = 85_045_870_592;
        let half = 1.0 / (1u64 << 17) as f64;
        // (fraction, bytes in 2.11 and 2.12, bytes in 2.13 to 2.15)
        let measured: [(f64, u64, u64); 15] = [
            (0.02, 1_700_917_411, 1_700_917_412),
            (0.3333, 28_345_788_668, 28_345_788_668),
            (0.5, 42_522_935_296, 42_522_935_296),
            (0.1, 8_504_587_059, 8_504_587_059),
            (1e-9, 85, 85),
            (0.999999, 85_045_785_546, 85_045_785_546),
            (0.7, 59_532_109_414, 59_532_109_414),
            (1.0 / 3.0, 28_348_623_530, 28_348_623_531),
            (0.123456789, 10_499_490_100, 10_499_490_101),
            // f x total = 648848.5 exactly: halves go away from zero (not
            // to even: 648848 is even).
            (half, 648_848, 648_849),
            (3.0 * half, 1_946_545, 1_946_546),
            (5.0 * half, 3_244_242, 3_244_243),
            (131_071.0 * half, 85_045_221_743, 85_045_221_744),
            // Rounds up to the whole device (the getter then says 1.0).
            (0.999999999999, 85_045_870_591, 85_045_870_592),
            (0.0, 0, 0),
        ];
        for r in TorchRelease::ALL {
            let rounding = r.rules().memory_fraction_rounding;
            let truncates = matches!(r, TorchRelease::V2_11 | TorchRelease::V2_12);
            assert_eq!(
                rounding,
                if truncates {
                    FractionRounding::Truncate
                } else {
                    FractionRounding::Nearest
                },
                "{r}"
            );
            for (f, old, new) in measured {
                let want = if truncates { old } else { new };
                assert_eq!(rounding.allowed_bytes(f, TOTAL), want, "{r}: {f}");
            }
        }
        // -0.0 is inside [0, 1] (PyTorch's check is `0 <= f`): no bytes.
        assert_eq!(FractionRounding::Nearest.allowed_bytes(-0.0, TOTAL), 0);
        assert_eq!(FractionRounding::Truncate.allowed_bytes(-0.0, TOTAL), 0);
    }
}
