//! The settings struct: every setting of PyTorch 2.15's two config classes
//! (`c10::CachingAllocator::AcceleratorAllocatorConfig` and
//! `c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig`), PyTorch's
//! defaults (spec 1.17). The settings string that reproduces them is
//! written from the key table (`keys.rs`).

use std::collections::BTreeMap;

use super::policy::ReservoirPolicy;
use super::torch_release::TorchRelease;
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
    /// The PyTorch release whose allocator PyTorch mode reproduces (its
    /// [`ReleaseRules`](super::ReleaseRules)): settings string entry
    /// `policy:pytorch-2.13` ([`AllocatorConfig::parse_with_policy`]); the
    /// default is the newest supported, [`TorchRelease::NEWEST`]. Not a
    /// PyTorch setting: PyTorch's parser never reads it.
    pub torch_release: TorchRelease,
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
            torch_release: TorchRelease::NEWEST,
        }
    }
}

impl AllocatorConfig {
    /// Reservoir's default settings **outside PyTorch mode**: PyTorch's
    /// defaults plus the `reservoir` policy (and the expandable segments it
    /// implies), the same as `parse_with_policy("policy:reservoir")`.
    ///
    /// PyTorch mode is every way of asking for PyTorch's behaviour, and it
    /// stays exact: [`AllocatorConfig::default`] and
    /// [`AllocatorConfig::parse`] (a `PYTORCH_CUDA_ALLOC_CONF` string), the
    /// C ABI and the torch plugin (they read settings strings, `""` being
    /// PyTorch's defaults) and `reservoir replay`'s `pytorch` setting (replay
    /// fidelity). A program that names no PyTorch settings starts here, or
    /// with [`CachingAllocator::reservoir`](crate::CachingAllocator::reservoir).
    ///
    /// ```
    /// use reservoir::config::ReservoirPolicy;
    /// use reservoir::AllocatorConfig;
    ///
    /// let c = AllocatorConfig::reservoir();
    /// assert!(c.policy == ReservoirPolicy::Reservoir && c.expandable_segments);
    /// assert_eq!(c, AllocatorConfig::parse_with_policy("policy:reservoir").unwrap());
    /// assert_eq!(AllocatorConfig::default().policy, ReservoirPolicy::PyTorch); // PyTorch mode
    /// ```
    pub fn reservoir() -> AllocatorConfig {
        AllocatorConfig {
            expandable_segments: true,
            policy: ReservoirPolicy::Reservoir,
            ..AllocatorConfig::default()
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
}
