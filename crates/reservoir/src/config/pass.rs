//! One reading of a settings string by one of PyTorch's two parsers
//! ([`Pass`]), the signature of a key's parser ([`ParseFn`]) and the parser
//! every `True`/`False` key shares ([`flag`]). The parsers in
//! `accelerator.rs` and `cuda.rs` and the key table in `keys.rs` above
//! them all use it.

use super::error::{ConfigError, ConfigWarning};
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

/// Reads the value of the key at token `i`; returns the index of the last
/// token it used.
pub(super) type ParseFn = fn(&mut Pass<'_>, usize) -> Result<usize, ConfigError>;

/// A `True`/`False` key (`toBool`), stored by `set`.
pub(super) fn flag(
    p: &mut Pass<'_>,
    i: usize,
    set: fn(&mut AllocatorConfig, bool),
) -> Result<usize, ConfigError> {
    let t = p.t;
    let value = t.value_of(i)?;
    set(p.cfg, t.boolean(value, t.text(i))?);
    Ok(value)
}
