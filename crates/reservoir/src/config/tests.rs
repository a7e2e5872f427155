//! The settings parser against PyTorch 2.15: every key, rule, message,
//! reset and reader (the golden tables are in `golden.rs`).

use super::accelerator::MAX_MB;
use super::cuda::parse_reserve_spec;
use super::*;

/// The state dump of the C++ probe that produced the golden tables
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
    assert_eq!(c.backend, AllocatorBackend::Native);
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
    assert_eq!(c.backend, AllocatorBackend::Native);
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
    let h =
        AllocatorConfig::parse("release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True")
            .unwrap();
    assert!(h.release_lock_on_cudamalloc && h.pinned_use_cuda_host_register);
    // The async backend is recorded.
    let a = AllocatorConfig::parse("backend:cudaMallocAsync").unwrap();
    assert_eq!(a.backend, AllocatorBackend::CudaMallocAsync);
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
    let c = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").unwrap();
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
    let c =
        AllocatorConfig::parse("expandable_segments:True]release_lock_on_cudamalloc:True").unwrap();
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

// spec 1.17 (spec error 8): the key table holds PyTorch 2.15's keys, each
// once, in the order the unknown-key advice lists them.
#[test]
fn key_table() {
    assert_eq!(
        KNOWN_KEYS,
        [
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
        ]
    );
    let mut names = KNOWN_KEYS.to_vec();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), KNOWN_KEYS.len());
    let advice = parse_err("bogus_key_name_that_is_far_from_all:1").to_string();
    assert!(advice.ends_with(&format!("(accepted keys: {})", KNOWN_KEYS.join(", "))));
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
            requested: AllocatorBackend::CudaMallocAsync,
            loaded: AllocatorBackend::Native,
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
    let c = AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "max_split_size_mb:64")]))
        .unwrap();
    assert_eq!(c.max_split_size, 64 * MIB);
    assert_eq!(c.last_settings, "max_split_size_mb:64");
    // Errors name the variable.
    let e = AllocatorConfig::from_env_with(env(&[("PYTORCH_ALLOC_CONF", "bogus:1")])).unwrap_err();
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
    let (c, w) =
        AllocatorConfig::parse_with_warnings("expandable_segments_reserve_by_class:[a:bad,b:0.5]")
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

mod golden;
mod golden_releases;
mod settings_string;

// Issue 29: a settings string is bounded, and messages quote a window of it.
#[test]
fn a_settings_string_over_the_limit_is_refused_before_it_is_read() {
    let huge = "[".repeat(64 << 20);
    for r in [
        AllocatorConfig::parse(&huge),
        AllocatorConfig::parse_with_policy(&huge),
        AllocatorConfig::default()
            .apply_runtime(&huge)
            .map(|()| AllocatorConfig::default()),
        AllocatorConfig::from_env_with(|v| (v == ENV_CUDA_ALLOC_CONF).then(|| huge.clone())),
    ] {
        let e = r.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("67108864 bytes") && text.contains("65536"),
            "{text}"
        );
        assert!(text.len() < 300, "{} bytes", text.len());
        assert!(e.pytorch_message().len() < 300);
        assert_eq!(e.pytorch_exception(), PyTorchException::ValueError);
    }
    // The limit itself is accepted (a string of spaces reads as empty).
    let at_limit = " ".repeat(MAX_SETTINGS_LEN);
    assert!(AllocatorConfig::parse(&at_limit).is_ok());
    let over = " ".repeat(MAX_SETTINGS_LEN + 1);
    assert!(matches!(
        AllocatorConfig::parse(&over),
        Err(ConfigError::TooLong { len, max: MAX_SETTINGS_LEN }) if len == MAX_SETTINGS_LEN + 1
    ));
}

#[test]
fn messages_quote_a_window_of_long_tokens() {
    let key = "k".repeat(60_000);
    let e = parse_err(&format!("{key}:1"));
    let text = e.to_string();
    assert!(text.len() < 1000, "{} bytes: {}", text.len(), &text[..200]);
    assert!(
        text.contains(&format!("`{}…`", "k".repeat(QUOTE_WINDOW))),
        "{text}"
    );
    let value = "9".repeat(50_000);
    let e = parse_err(&format!("max_split_size_mb:{value}"));
    assert!(e.to_string().len() < 1000, "{}", e.to_string().len());
    assert_eq!(e.offset(), Some(18));
    // Short inputs are quoted whole, as before.
    let e = parse_err("bogus:1");
    assert!(e
        .to_string()
        .starts_with("unknown allocator setting `bogus` (token 0, byte 0)"));
    assert_eq!(
        e.pytorch_message(),
        "Unrecognized key 'bogus' in CUDA allocator config."
    );
}

#[test]
fn quote_window_keeps_short_strings_and_cuts_long_ones_around_the_offset() {
    assert_eq!(quote_window("abc", 1), "abc");
    let s: String = ('a'..='z').cycle().take(1000).collect();
    let w = quote_window(&s, 500);
    assert_eq!(w.chars().count(), QUOTE_WINDOW + 2, "{w}");
    assert!(w.starts_with('…') && w.ends_with('…'));
    assert!(w.contains(&s[480..560]), "{w}");
    let w = quote_window(&s, 0);
    assert!(!w.starts_with('…') && w.ends_with('…'));
    let w = quote_window(&s, 5000);
    assert!(w.starts_with('…') && !w.ends_with('…'));
    let multi = "é".repeat(500);
    let w = quote_window(&multi, 501); // inside a character
    assert_eq!(w.trim_matches('…').chars().count(), QUOTE_WINDOW);
}
