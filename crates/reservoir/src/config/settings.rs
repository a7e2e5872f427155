//! The settings struct: every setting of PyTorch 2.15's two config classes
//! (`c10::CachingAllocator::AcceleratorAllocatorConfig` and
//! `c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig`), PyTorch's
//! defaults (spec 1.17), and the settings string that reproduces them.

use std::collections::BTreeMap;

use super::policy::ReservoirPolicy;
use super::values::{AllocatorBackend, ReserveSpec, MIB, ROUNDUP_POWER2_INTERVALS};

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
    pub backend: AllocatorBackend,
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
    /// Reservoir's own policies, not PyTorch settings: never parsed from nor
    /// written to a settings string. The defaults are PyTorch-exact.
    pub policy: ReservoirPolicy,
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
            backend: AllocatorBackend::Native,
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
            policy: ReservoirPolicy::default(),
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

    /// A settings string that reproduces these settings: parsing it (from the
    /// defaults) gives back `self`, apart from `last_settings` and `policy`.
    /// Only settings that differ from their defaults are written. Values that
    /// no settings string can produce (sizes that are not whole MiB, divisions
    /// that are not 0 or a power of two, out-of-range fractions) are written
    /// as best they can be and will not read back the same.
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
