//! One reading of a settings string by one of PyTorch's two parsers
//! ([`Pass`]), the signature of a key's parser ([`ParseFn`]) and the parser
//! every `True`/`False` key shares ([`flag`]). The parsers in
//! `accelerator.rs` and `cuda.rs` and the key table in `keys.rs` above
//! them all use it.

use super::error::{AssertSite, ConfigError, ConfigWarning, ValueRule};
use super::settings::AllocatorConfig;
use super::tokenizer::Tokens;

/// One reading of a settings string by one of PyTorch's two parsers.
pub(super) struct Pass<'a> {
    /// The settings being changed (a copy, committed only on success).
    pub(super) cfg: &'a mut AllocatorConfig,
    /// The string.
    pub(super) t: &'a Tokens,
    /// What PyTorch would print on stderr.
    pub(super) warnings: &'a mut Vec<ConfigWarning>,
}

/// The value of the key at some token, read: what every key's parser
/// starts with ([`Pass::value`]).
pub(super) struct Value<'a, T> {
    /// The string.
    pub(super) t: &'a Tokens,
    /// The key as written.
    pub(super) key: &'a str,
    /// The token index of the value.
    pub(super) at: usize,
    /// The value as read.
    pub(super) v: T,
}

impl<T> Value<'_, T> {
    /// The error for a value that breaks `rule`.
    pub(super) fn invalid(&self, rule: ValueRule) -> ConfigError {
        self.t.invalid(self.key, self.at, rule)
    }
}

impl<'a> Pass<'a> {
    /// The value of the key at token `i`: checks the `:` after the key and
    /// reads the token after it with `read` (such as [`Tokens::size_t`]).
    pub(super) fn value<T>(
        &self,
        i: usize,
        read: impl FnOnce(&'a Tokens, usize, &'a str) -> Result<T, ConfigError>,
    ) -> Result<Value<'a, T>, ConfigError> {
        let t = self.t;
        let key = t.text(i);
        let at = t.value_of(i)?;
        let v = read(t, at, key)?;
        Ok(Value { t, key, at, v })
    }
}

/// A value read as one token, whatever it holds (a `read` for [`Pass::value`]).
pub(super) fn token<'a>(t: &'a Tokens, at: usize, key: &str) -> Result<&'a str, ConfigError> {
    t.get(at, AssertSite::TokenizerIndex, || {
        format!("a value for `{key}`")
    })
}

/// Reads the value of the key at token `i`; returns the index of the last
/// token it used.
pub(super) type ParseFn = fn(&mut Pass<'_>, usize) -> Result<usize, ConfigError>;

/// A `True`/`False` key (`toBool`), stored by `set`.
pub(super) fn flag(
    p: &mut Pass<'_>,
    i: usize,
    set: fn(&mut AllocatorConfig, bool),
) -> Result<usize, ConfigError> {
    let value = p.value(i, Tokens::boolean)?;
    set(p.cfg, value.v);
    Ok(value.at)
}
