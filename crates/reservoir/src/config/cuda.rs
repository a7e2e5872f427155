//! `c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig` (CUDAAllocatorConfig.cpp):
//! the backend scan at load time and the CUDA keys, read at start-up before
//! the common keys and at run time after them. The keys themselves are rows
//! of the table in `keys.rs` (which also runs the pass); this file holds the
//! backend scan and the parsers of its keys that are more than a
//! `True`/`False`.

use std::collections::BTreeMap;

use super::cnum::istream_double;
use super::error::{AssertSite, ConfigError, ConfigWarning, ValueRule};
use super::pass::{token, Pass};
use super::tokenizer::Tokens;
use super::values::{AllocatorBackend, ReserveSpec, MAX_REGISTER_THREADS};

/// `BackendStaticInitializer::parseEnvForBackend`: the first `backend` key
/// decides; other keys are skipped with `skipKey`.
pub(super) fn backend_scan(t: &Tokens) -> Result<AllocatorBackend, ConfigError> {
    let n = t.len();
    let mut i = 0;
    while i < n {
        if t.text(i) == "backend" {
            t.colon(i + 1, "backend")?;
            let v = t.get(i + 2, AssertSite::TokenizerIndex, || {
                "a value for `backend`".to_owned()
            })?;
            return Ok(if v == "cudaMallocAsync" {
                AllocatorBackend::CudaMallocAsync
            } else {
                AllocatorBackend::Native
            });
        }
        i = t.skip_key(i)?;
        if i + 1 < n {
            i += 1;
        }
        i += 1;
    }
    Ok(AllocatorBackend::Native)
}

/// `backend`: `native` or `cudaMallocAsync`, equal to the loaded one.
pub(super) fn backend(p: &mut Pass<'_>, i: usize) -> Result<usize, ConfigError> {
    let value = p.value(i, token)?;
    let requested = match value.v {
        "native" => AllocatorBackend::Native,
        "cudaMallocAsync" => AllocatorBackend::CudaMallocAsync,
        _ => return Err(value.invalid(ValueRule::Backend)),
    };
    let loaded = p.cfg.backend;
    if requested != loaded {
        return Err(ConfigError::BackendMismatch {
            requested,
            loaded,
            index: value.at,
            offset: value.t.offset(value.at),
        });
    }
    Ok(value.at)
}

/// `pinned_num_register_threads`: a power of two up to [`MAX_REGISTER_THREADS`].
pub(super) fn pinned_num_register_threads(
    p: &mut Pass<'_>,
    i: usize,
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::size_t)?;
    let v = value.v;
    if !v.is_power_of_two() {
        return Err(value.invalid(ValueRule::ThreadsPowerOfTwo { got: v }));
    }
    if v > MAX_REGISTER_THREADS {
        return Err(value.invalid(ValueRule::ThreadsAtMost {
            max: MAX_REGISTER_THREADS,
            got: v,
        }));
    }
    p.cfg.pinned_num_register_threads = v;
    Ok(value.at)
}

/// `pinned_reserve_segment_size_mb`: greater than 0 (spec error 12).
pub(super) fn pinned_reserve_segment_size_mb(
    p: &mut Pass<'_>,
    i: usize,
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::size_t)?;
    if value.v == 0 {
        return Err(value.invalid(ValueRule::Positive));
    }
    p.cfg.pinned_reserve_segment_size_mb = value.v;
    Ok(value.at)
}

/// `per_process_memory_fraction`: a number from 0 to 1 inclusive.
pub(super) fn per_process_memory_fraction(
    p: &mut Pass<'_>,
    i: usize,
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::double)?;
    if !(0.0..=1.0).contains(&value.v) {
        return Err(value.invalid(ValueRule::UnitInterval));
    }
    p.cfg.per_process_memory_fraction = value.v;
    Ok(value.at)
}

/// `expandable_segments_reserve`: one reserve; a bad one is a warning and
/// keeps the previous setting.
pub(super) fn expandable_segments_reserve(
    p: &mut Pass<'_>,
    i: usize,
) -> Result<usize, ConfigError> {
    let value = p.value(i, token)?;
    match parse_reserve_spec(value.v) {
        Some(spec) => p.cfg.expandable_segments_reserve = Some(spec),
        None => p.warnings.push(ConfigWarning::InvalidReserveValue {
            value: value.v.to_owned(),
        }),
    }
    Ok(value.at)
}

/// `expandable_segments_reserve_by_class`: `[class:reserve,...]`, replacing
/// the previous list; a bad reserve is a warning and skips its class.
pub(super) fn expandable_segments_reserve_by_class(
    p: &mut Pass<'_>,
    mut i: usize,
) -> Result<usize, ConfigError> {
    let t = p.t;
    let key = t.text(i);
    t.colon(i + 1, key)?;
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
            None => p.warnings.push(ConfigWarning::InvalidReserveValue {
                value: v.to_owned(),
            }),
        }
        if t.check(i + 1, ",", || format!("`,` or `]` in the `{key}` list"))? {
            i += 1;
        }
    }
    i += 1;
    p.cfg.expandable_segments_reserve_by_class = parsed;
    Ok(i)
}

/// `parseReserveSpec`: `<fraction>` or `<GiB>G`, read with
/// `std::istringstream >> double`; `None` when PyTorch would ignore it.
pub(super) fn parse_reserve_spec(token: &str) -> Option<ReserveSpec> {
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
