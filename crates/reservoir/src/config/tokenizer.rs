//! `c10::CachingAllocator::ConfigTokenizer` (AllocatorConfig.h): the
//! settings string cut into tokens, and the value readers (`toSizeT`,
//! `toDouble`, `toBool`, `checkToken`, `skipKey`) both parsers use.

use super::cnum::{c_stod, c_stoull, is_c_space, NumError};
use super::error::{AssertSite, ConfigError, SyntaxProblem, ValueRule};

/// [`ConfigError::TooLong`] when `s` is longer than
/// [`MAX_SETTINGS_LEN`](super::MAX_SETTINGS_LEN).
pub(super) fn check_len(s: &str) -> Result<(), ConfigError> {
    if s.len() > super::MAX_SETTINGS_LEN {
        return Err(ConfigError::TooLong {
            len: s.len(),
            max: super::MAX_SETTINGS_LEN,
        });
    }
    Ok(())
}

struct Token {
    text: String,
    offset: usize,
}

/// The string cut at `,` `:` `[` `]` (each its own token), whitespace removed.
pub(super) struct Tokens {
    toks: Vec<Token>,
    end: usize,
}

impl Tokens {
    /// The tokens of `s`; [`ConfigError::TooLong`] past
    /// [`MAX_SETTINGS_LEN`](super::MAX_SETTINGS_LEN) bytes.
    pub(super) fn new(s: &str) -> Result<Tokens, ConfigError> {
        check_len(s)?;
        let mut toks = Vec::new();
        let mut buf = String::new();
        let mut start = 0;
        for (pos, ch) in s.char_indices() {
            if matches!(ch, ',' | ':' | '[' | ']') {
                if !buf.is_empty() {
                    toks.push(Token {
                        text: std::mem::take(&mut buf),
                        offset: start,
                    });
                }
                toks.push(Token {
                    text: ch.to_string(),
                    offset: pos,
                });
            } else if !(ch.is_ascii() && is_c_space(ch as u8)) {
                if buf.is_empty() {
                    start = pos;
                }
                buf.push(ch);
            }
        }
        if !buf.is_empty() {
            toks.push(Token {
                text: buf,
                offset: start,
            });
        }
        Ok(Tokens { toks, end: s.len() })
    }

    pub(super) fn len(&self) -> usize {
        self.toks.len()
    }

    pub(super) fn text(&self, i: usize) -> &str {
        &self.toks[i].text
    }

    pub(super) fn offset(&self, i: usize) -> usize {
        self.toks.get(i).map_or(self.end, |t| t.offset)
    }

    /// Token `i`, or PyTorch's index assertion at `site`.
    pub(super) fn get(
        &self,
        i: usize,
        site: AssertSite,
        expected: impl FnOnce() -> String,
    ) -> Result<&str, ConfigError> {
        match self.toks.get(i) {
            Some(t) => Ok(&t.text),
            None => Err(ConfigError::Syntax {
                index: i,
                offset: self.end,
                problem: SyntaxProblem::UnexpectedEnd {
                    expected: expected(),
                    site,
                },
            }),
        }
    }

    /// `checkToken`: whether token `i` is `tok`; only a missing token fails.
    pub(super) fn check(
        &self,
        i: usize,
        tok: &str,
        expected: impl FnOnce() -> String,
    ) -> Result<bool, ConfigError> {
        Ok(self.get(i, AssertSite::TokenizerCheckIndex, expected)? == tok)
    }

    /// `checkToken(i, ":")` after `key`.
    pub(super) fn colon(&self, i: usize, key: &str) -> Result<(), ConfigError> {
        self.check(i, ":", || format!("`:` after `{key}`"))
            .map(|_| ())
    }

    /// `checkToken(i + 1, ":")` after the key at `i`: the index of its value.
    pub(super) fn value_of(&self, i: usize) -> Result<usize, ConfigError> {
        self.colon(i + 1, self.text(i))?;
        Ok(i + 2)
    }

    /// The error for token `i`, the value of `key`, breaking `rule`.
    pub(super) fn invalid(&self, key: &str, i: usize, rule: ValueRule) -> ConfigError {
        ConfigError::InvalidValue {
            key: key.to_owned(),
            value: self
                .toks
                .get(i)
                .map_or_else(String::new, |t| t.text.clone()),
            index: i,
            offset: self.offset(i),
            rule,
        }
    }

    /// `toSizeT`: `std::stoull` of token `i`.
    pub(super) fn size_t(&self, i: usize, key: &str) -> Result<u64, ConfigError> {
        let text = self.get(i, AssertSite::TokenizerCheckIndex, || {
            format!("a value for `{key}`")
        })?;
        c_stoull(text).map_err(|e| {
            let rule = match e {
                NumError::Invalid => ValueRule::Integer,
                NumError::Range => ValueRule::IntegerInRange,
            };
            self.invalid(key, i, rule)
        })
    }

    /// `toDouble`: `std::stod` of token `i`.
    pub(super) fn double(&self, i: usize, key: &str) -> Result<f64, ConfigError> {
        let text = self.get(i, AssertSite::TokenizerCheckIndex, || {
            format!("a value for `{key}`")
        })?;
        c_stod(text).map_err(|e| {
            let rule = match e {
                NumError::Invalid => ValueRule::Number,
                NumError::Range => ValueRule::NumberInRange,
            };
            self.invalid(key, i, rule)
        })
    }

    /// `toBool`: exactly `True` or `False`.
    pub(super) fn boolean(&self, i: usize, key: &str) -> Result<bool, ConfigError> {
        match self.get(i, AssertSite::TokenizerCheckIndex, || {
            format!("`True` or `False` for `{key}`")
        })? {
            "True" => Ok(true),
            "False" => Ok(false),
            _ => Err(self.invalid(key, i, ValueRule::TrueOrFalse)),
        }
    }

    /// `skipKey`: from a key to its value, or to the `]` closing a list value.
    pub(super) fn skip_key(&self, i: usize) -> Result<usize, ConfigError> {
        let key = self.text(i).to_owned();
        self.colon(i + 1, &key)?;
        let mut j = i + 2;
        let value = self.get(j, AssertSite::TokenizerCheckIndex, || {
            format!("a value for `{key}`")
        })?;
        if value != "[" {
            return Ok(j);
        }
        let open = j;
        j += 1;
        while j < self.len() && self.text(j) != "]" {
            j += 1;
        }
        if j >= self.len() {
            return Err(ConfigError::Syntax {
                index: open,
                offset: self.offset(open),
                problem: SyntaxProblem::UnclosedList {
                    key,
                    site: AssertSite::TokenizerSkipKey,
                },
            });
        }
        Ok(j)
    }
}

// ---------------------------------------------------------------------------
// The three readers of PyTorch 2.15
// ---------------------------------------------------------------------------
