//! `c10::CachingAllocator::AcceleratorAllocatorConfig::parseArgs`
//! (AllocatorConfig.cpp): the common keys, read at start-up after the CUDA
//! keys and at run time before them. The keys themselves are rows of the
//! table in `keys.rs`; this file holds the pass and the parsers of its
//! keys that are more than a `True`/`False`.

use super::error::{AssertSite, ConfigError, SyntaxProblem, ValueRule};
use super::pass::Pass;
use super::settings::AllocatorConfig;
use super::tokenizer::Tokens;
use super::values::{MIB, ROUNDUP_POWER2_INTERVALS};

/// `large_segment_size_mb` must be greater than this (kMinLargeAlloc in MiB).
const MIN_LARGE_SEGMENT_MB: u64 = 10;
/// Values in MiB are clamped to this before being multiplied by 1 MiB.
pub(super) const MAX_MB: u64 = u64::MAX / MIB;

/// The first pass over the whole string: `large_segment_size_mb`, the floor
/// of two other keys, wherever it is.
pub(super) fn large_segment_size(p: &mut Pass<'_>) -> Result<(), ConfigError> {
    const KEY: &str = "large_segment_size_mb";
    let t = p.t;
    let n = t.len();
    let mut i = 0;
    while i < n {
        if t.text(i) == KEY {
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
            p.cfg.large_segment_size = mib_value(v);
        }
        i += 1;
    }
    Ok(())
}

/// A size in MiB as bytes, saturating.
fn mib_value(v: u64) -> u64 {
    v.min(MAX_MB) * MIB
}

/// A size in MiB (`toSizeT`), stored in bytes by `set`.
pub(super) fn mib(
    p: &mut Pass<'_>,
    i: usize,
    set: fn(&mut AllocatorConfig, u64),
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::size_t)?;
    set(p.cfg, mib_value(value.v));
    Ok(value.at)
}

/// `max_split_size_mb` and `max_non_split_rounding_mb`: a size in MiB of at
/// least `large_segment_size_mb` (spec errors 2 and 3), stored in bytes by `set`.
pub(super) fn at_least_large_segment(
    p: &mut Pass<'_>,
    i: usize,
    set: fn(&mut AllocatorConfig, u64),
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::size_t)?;
    let min = p.cfg.large_segment_size / MIB;
    if value.v < min {
        return Err(value.invalid(ValueRule::AtLeastMib { min }));
    }
    set(p.cfg, mib_value(value.v));
    Ok(value.at)
}

/// `garbage_collection_threshold`: a number strictly between 0 and 1.
pub(super) fn garbage_collection_threshold(
    p: &mut Pass<'_>,
    i: usize,
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::double)?;
    if !(value.v > 0.0 && value.v < 1.0) {
        return Err(value.invalid(ValueRule::OpenUnitInterval));
    }
    p.cfg.garbage_collection_threshold = value.v;
    Ok(value.at)
}

/// `parseRoundUpPower2Divisions`; `i` is the key, returns the last index used.
pub(super) fn roundup_power2_divisions(
    p: &mut Pass<'_>,
    mut i: usize,
) -> Result<usize, ConfigError> {
    const KEY: &str = "roundup_power2_divisions";
    let t = p.t;
    let table = &mut p.cfg.roundup_power2_divisions;
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
