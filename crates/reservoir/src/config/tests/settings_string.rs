//! `to_settings_string` is written from the key table; these tests hold
//! it to the hand-written writer it replaced (kept here, verbatim apart
//! from `self` becoming `this`, as the reference only), byte for byte,
//! over many settings.

use std::collections::BTreeMap;

use proptest::prelude::*;

use crate::config::*;

/// The hand-written `AllocatorConfig::to_settings_string` before the key
/// table wrote it (commit 2737783).
fn hand_written(c: &AllocatorConfig) -> String {
    let this = c;
    let d = AllocatorConfig::default();
    let mut parts: Vec<String> = Vec::new();
    let flag = |parts: &mut Vec<String>, key: &str, on: bool| {
        if on {
            parts.push(format!("{key}:True"));
        }
    };
    if this.backend != d.backend {
        parts.push(format!("backend:{}", this.backend));
    }
    if this.large_segment_size != d.large_segment_size {
        parts.push(format!(
            "large_segment_size_mb:{}",
            this.large_segment_size / MIB
        ));
    }
    if this.max_split_size != d.max_split_size {
        parts.push(format!("max_split_size_mb:{}", this.max_split_size / MIB));
    }
    if this.max_non_split_rounding_size != this.large_segment_size {
        parts.push(format!(
            "max_non_split_rounding_mb:{}",
            this.max_non_split_rounding_size / MIB
        ));
    }
    if this.garbage_collection_threshold.to_bits() != d.garbage_collection_threshold.to_bits() {
        parts.push(format!(
            "garbage_collection_threshold:{}",
            format_c_double(this.garbage_collection_threshold)
        ));
    }
    let div = &this.roundup_power2_divisions;
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
    flag(&mut parts, "expandable_segments", this.expandable_segments);
    flag(
        &mut parts,
        "pinned_use_background_threads",
        this.pinned_use_background_threads,
    );
    if this.pinned_max_round_threshold != d.pinned_max_round_threshold {
        parts.push(format!(
            "pinned_max_round_threshold_mb:{}",
            this.pinned_max_round_threshold / MIB
        ));
    }
    if this.pinned_max_cached_size != d.pinned_max_cached_size {
        parts.push(format!(
            "pinned_max_cached_size_mb:{}",
            this.pinned_max_cached_size / MIB
        ));
    }
    flag(
        &mut parts,
        "release_lock_on_cudamalloc",
        this.release_lock_on_cudamalloc,
    );
    flag(
        &mut parts,
        "pinned_use_cuda_host_register",
        this.pinned_use_cuda_host_register,
    );
    if this.pinned_num_register_threads != d.pinned_num_register_threads {
        parts.push(format!(
            "pinned_num_register_threads:{}",
            this.pinned_num_register_threads
        ));
    }
    if this.pinned_reserve_segment_size_mb != d.pinned_reserve_segment_size_mb {
        parts.push(format!(
            "pinned_reserve_segment_size_mb:{}",
            this.pinned_reserve_segment_size_mb
        ));
    }
    flag(
        &mut parts,
        "graph_capture_record_stream_reuse",
        this.graph_capture_record_stream_reuse,
    );
    if this.per_process_memory_fraction.to_bits() != d.per_process_memory_fraction.to_bits() {
        parts.push(format!(
            "per_process_memory_fraction:{}",
            format_c_double(this.per_process_memory_fraction)
        ));
    }
    flag(
        &mut parts,
        "pinned_free_catch_all",
        this.pinned_free_catch_all,
    );
    flag(
        &mut parts,
        "throw_on_cudamalloc_oom",
        this.throw_on_cudamalloc_oom,
    );
    if let Some(spec) = this.expandable_segments_reserve {
        parts.push(format!(
            "expandable_segments_reserve:{}",
            format_reserve(spec)
        ));
    }
    if !this.expandable_segments_reserve_by_class.is_empty() {
        let list: Vec<String> = this
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

/// A size: the default, a whole number of MiB, or any value.
fn size(default: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(default),
        (0u64..1 << 20).prop_map(|m| m * MIB),
        any::<u64>()
    ]
}

/// A number: the default, a fraction, any bits (subnormals, -0.0, NaN...).
fn number(default: f64) -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(default),
        0.0f64..1.0,
        any::<u64>().prop_map(f64::from_bits),
        (1u64..1 << 52).prop_map(f64::from_bits),
        Just(-0.0),
    ]
}

fn reserve() -> impl Strategy<Value = ReserveSpec> {
    prop_oneof![
        number(0.5).prop_map(ReserveSpec::Fraction),
        number(40.0).prop_map(ReserveSpec::GiB),
    ]
}

fn divisions() -> impl Strategy<Value = [u64; ROUNDUP_POWER2_INTERVALS]> {
    let one = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(4),
        Just(8),
        Just(3),
        any::<u64>()
    ];
    prop_oneof![
        Just([0; ROUNDUP_POWER2_INTERVALS]),
        one.clone().prop_map(|v| [v; ROUNDUP_POWER2_INTERVALS]),
        proptest::array::uniform16(one),
    ]
}

fn config() -> impl Strategy<Value = AllocatorConfig> {
    let d = AllocatorConfig::default();
    (
        (
            size(d.max_split_size),
            size(d.max_non_split_rounding_size),
            size(d.large_segment_size),
            divisions(),
            number(d.garbage_collection_threshold),
            number(d.per_process_memory_fraction),
        ),
        (
            any::<[bool; 8]>(),
            prop_oneof![
                Just(AllocatorBackend::Native),
                Just(AllocatorBackend::CudaMallocAsync)
            ],
            proptest::option::of(reserve()),
            proptest::collection::btree_map("[a-z_]{1,6}", reserve(), 0..4),
        ),
        (
            prop_oneof![Just(1u64), any::<u64>(), (0u32..8).prop_map(|s| 1u64 << s)],
            prop_oneof![Just(0u64), any::<u64>()],
            size(d.pinned_max_round_threshold),
            size(d.pinned_max_cached_size),
        ),
    )
        .prop_map(
            |(
                (max_split, max_non_split, large, div, gc, fraction),
                (flags, backend, reserve, by_class),
                (threads, pinned_reserve, round, cached),
            )| {
                let by_class: BTreeMap<String, ReserveSpec> = by_class;
                AllocatorConfig {
                    max_split_size: max_split,
                    max_non_split_rounding_size: max_non_split,
                    large_segment_size: large,
                    roundup_power2_divisions: div,
                    garbage_collection_threshold: gc,
                    per_process_memory_fraction: fraction,
                    expandable_segments: flags[0],
                    release_lock_on_cudamalloc: flags[1],
                    graph_capture_record_stream_reuse: flags[2],
                    throw_on_cudamalloc_oom: flags[3],
                    pinned_use_cuda_host_register: flags[4],
                    pinned_use_background_threads: flags[5],
                    pinned_free_catch_all: flags[6],
                    backend,
                    expandable_segments_reserve: reserve,
                    expandable_segments_reserve_by_class: by_class,
                    pinned_num_register_threads: threads,
                    pinned_reserve_segment_size_mb: pinned_reserve,
                    pinned_max_round_threshold: round,
                    pinned_max_cached_size: cached,
                    last_settings: if flags[7] {
                        "x".to_owned()
                    } else {
                        String::new()
                    },
                    ..AllocatorConfig::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    // Issue 28: the table-written settings string is byte-identical to the
    // hand-written one for every settings value.
    #[test]
    fn the_table_writes_the_hand_written_string(c in config()) {
        prop_assert_eq!(c.to_settings_string(), hand_written(&c));
    }

    // And for every string PyTorch accepts that these keys make.
    #[test]
    fn the_table_writes_the_hand_written_string_for_parsed_settings(c in config()) {
        if let Ok(parsed) = AllocatorConfig::parse(&hand_written(&c)) {
            prop_assert_eq!(parsed.to_settings_string(), hand_written(&parsed));
        }
    }
}

// Issue 28: recorded strings (from the hand-written writer) for settings
// with every key set, each flag alone, and the default.
#[test]
fn recorded_settings_strings() {
    assert_eq!(AllocatorConfig::default().to_settings_string(), "");
    let all = AllocatorConfig::parse(
        "large_segment_size_mb:32,max_split_size_mb:100,max_non_split_rounding_mb:64,\
         garbage_collection_threshold:0.1,roundup_power2_divisions:[256:1,>:4],expandable_segments:True,\
         pinned_use_background_threads:True,pinned_max_round_threshold_mb:8,pinned_max_cached_size_mb:16,\
         release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:4,\
         pinned_reserve_segment_size_mb:8,graph_capture_record_stream_reuse:True,\
         per_process_memory_fraction:0.3,pinned_free_catch_all:True,throw_on_cudamalloc_oom:True,\
         expandable_segments_reserve:1e-7,expandable_segments_reserve_by_class:[b:2.5G,a:0.25]",
    )
    .unwrap();
    assert_eq!(
        all.to_settings_string(),
        "large_segment_size_mb:32,max_split_size_mb:100,max_non_split_rounding_mb:64,\
         garbage_collection_threshold:0.1,roundup_power2_divisions:[1:1,2:1,4:1,8:1,16:1,32:1,64:1,128:1,256:1,512:4,1024:4,2048:4,4096:4,8192:4,16384:4,32768:4],\
         expandable_segments:True,pinned_use_background_threads:True,pinned_max_round_threshold_mb:8,\
         pinned_max_cached_size_mb:16,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:True,\
         pinned_num_register_threads:4,pinned_reserve_segment_size_mb:8,graph_capture_record_stream_reuse:True,\
         per_process_memory_fraction:0.3,pinned_free_catch_all:True,throw_on_cudamalloc_oom:True,\
         expandable_segments_reserve:1e-7,expandable_segments_reserve_by_class:[a:0.25,b:2.5G]"
    );
    assert_eq!(
        AllocatorConfig::parse("backend:cudaMallocAsync")
            .unwrap()
            .to_settings_string(),
        "backend:cudaMallocAsync"
    );
    assert_eq!(
        AllocatorConfig::parse("roundup_power2_divisions:4")
            .unwrap()
            .to_settings_string(),
        "roundup_power2_divisions:4"
    );
}
