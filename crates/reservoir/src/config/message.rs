//! What [`ConfigError`] says in Reservoir's words (its `Display`): what is
//! wrong, where, and what is accepted. It sits above the key table because
//! an unknown key is answered with the nearest known one, or the list of
//! them; `error.rs` below holds the error types (`torch_text.rs` PyTorch's own
//! texts).

use std::fmt;

use super::error::{short, ConfigError};
use super::keys::KNOWN_KEYS;

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::UnknownKey {
                key, index, offset, ..
            } => write!(
                f,
                "unknown allocator setting `{}` (token {index}, byte {offset}); {}",
                short(key),
                unknown_key_advice(key)
            ),
            ConfigError::UnknownPolicy { name } => write!(
                f,
                "unknown Reservoir policy `{}` in `policy:{}`; known: pytorch, pytorch-2.11 ... pytorch-2.15, reservoir, cross_stream_reuse",
                short(name),
                short(name)
            ),
            ConfigError::InvalidValue {
                key,
                value,
                index,
                offset,
                rule,
            } => write!(
                f,
                "invalid value `{}` for `{}` (token {index}, byte {offset}): {rule}",
                short(value),
                short(key)
            ),
            ConfigError::Syntax {
                index,
                offset,
                problem,
            } => write!(
                f,
                "malformed allocator settings at byte {offset} (token {index}): {problem}"
            ),
            ConfigError::BackendMismatch {
                requested,
                loaded,
                index,
                offset,
            } => write!(
                f,
                "`backend:{requested}` (token {index}, byte {offset}) differs from the backend chosen at start-up (`{loaded}`); the backend can only be chosen through the environment before the allocator starts, so drop `backend` from run-time settings"
            ),
            ConfigError::TooLong { len, max } => write!(
                f,
                "the allocator settings string is {len} bytes, over the limit of {max} bytes \
                 (reservoir::config::MAX_SETTINGS_LEN; real settings strings are a few hundred bytes): \
                 shorten it"
            ),
            ConfigError::Env { var, error } => write!(f, "{var}: {error}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// "Did you mean" for a misspelt key, else the list of accepted keys.
fn unknown_key_advice(key: &str) -> String {
    let lower = key.to_ascii_lowercase();
    // The distance is at least the difference in length: a long key is
    // compared with nothing (and costs nothing).
    let best = KNOWN_KEYS
        .iter()
        .filter(|k| lower.len() <= k.len() + 3)
        .map(|k| (edit_distance(&lower, k), *k))
        .min();
    match best {
        Some((d, k)) if d <= 3 && d < key.len() => {
            format!("did you mean `{k}`? (keys are case-sensitive)")
        }
        _ => format!(
            "remove it or fix its spelling (accepted keys: {})",
            KNOWN_KEYS.join(", ")
        ),
    }
}

/// Levenshtein distance over bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}
