//! Errors and warnings of settings strings: what is wrong, where, and what
//! is accepted. Reservoir's words for an error (`Display`) are in
//! `message.rs`; the exact text and exception PyTorch raises
//! (`pytorch_message`, `pytorch_exception`) in `torch_text.rs`.

use std::fmt;

use super::values::{AllocatorBackend, MAX_REGISTER_THREADS};

/// Which of PyTorch's two parsers rejected a key. Start-up parsing runs the
/// CUDA parser first, `_set_allocator_settings` the common one first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyParser {
    /// `c10::CachingAllocator::AcceleratorAllocatorConfig` (common keys).
    Accelerator,
    /// `c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig` (CUDA keys).
    Cuda,
}

/// The rule a value broke, with what is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueRule {
    /// Exactly `True` or `False` (case-sensitive).
    TrueOrFalse,
    /// `native` or `cudaMallocAsync` (case-sensitive).
    Backend,
    /// At least `min` MiB (the floor is `large_segment_size_mb`).
    AtLeastMib {
        /// The smallest accepted value.
        min: u64,
    },
    /// More than `min` MiB.
    GreaterThanMib {
        /// The accepted values are above this.
        min: u64,
    },
    /// A number strictly between 0.0 and 1.0.
    OpenUnitInterval,
    /// A number from 0.0 to 1.0 inclusive.
    UnitInterval,
    /// A power of two (single-value `roundup_power2_divisions`).
    DivisionsPowerOfTwo,
    /// 0 or a power of two (a division in the list form).
    DivisionsPowerOfTwoOrZero,
    /// `>` or a power-of-two size in MiB (an interval in the list form).
    IntervalPowerOfTwo,
    /// A power of two (`pinned_num_register_threads`).
    ThreadsPowerOfTwo {
        /// The value as PyTorch read it.
        got: u64,
    },
    /// At most `max` (`pinned_num_register_threads`).
    ThreadsAtMost {
        /// The largest accepted value.
        max: u64,
        /// The value as PyTorch read it.
        got: u64,
    },
    /// Greater than 0.
    Positive,
    /// An integer (`std::stoull` found no digits).
    Integer,
    /// An integer that fits in 64 bits.
    IntegerInRange,
    /// A number (`std::stod` found none).
    Number,
    /// A number representable as a double (`std::stod` range error).
    NumberInRange,
}

impl fmt::Display for ValueRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueRule::TrueOrFalse => {
                f.write_str("expected `True` or `False` (case-sensitive, e.g. `expandable_segments:True`)")
            }
            ValueRule::Backend => {
                f.write_str("expected `native` or `cudaMallocAsync` (case-sensitive)")
            }
            ValueRule::AtLeastMib { min } => write!(
                f,
                "must be at least {min} (MiB; the floor is large_segment_size_mb); use a larger value or drop the key"
            ),
            ValueRule::GreaterThanMib { min } => {
                write!(f, "must be greater than {min} (MiB); use a larger value or drop the key")
            }
            ValueRule::OpenUnitInterval => f.write_str(
                "must be a number strictly between 0.0 and 1.0 (e.g. 0.8); drop the key to disable",
            ),
            ValueRule::UnitInterval => {
                f.write_str("must be a number from 0.0 to 1.0 inclusive (e.g. 0.5)")
            }
            ValueRule::DivisionsPowerOfTwo => f.write_str(
                "the number of divisions must be a power of two (1, 2, 4, 8, ...); to turn rounding off for some sizes use the list form, e.g. [256:0,>:4]",
            ),
            ValueRule::DivisionsPowerOfTwoOrZero => f.write_str(
                "the number of divisions must be 0 (no rounding) or a power of two (1, 2, 4, 8, ...)",
            ),
            ValueRule::IntervalPowerOfTwo => f.write_str(
                "list entries must start with `>` or a power-of-two size in MiB (1, 2, 4, ..., 32768), e.g. [256:1,512:2,>:4]",
            ),
            ValueRule::ThreadsPowerOfTwo { got } => {
                write!(f, "must be a power of two from 1 to {MAX_REGISTER_THREADS} (read as {got})")
            }
            ValueRule::ThreadsAtMost { max, got } => {
                write!(f, "must be at most {max} (read as {got}); use a power of two up to {max}")
            }
            ValueRule::Positive => f.write_str("must be greater than 0; drop the key for no reserve"),
            ValueRule::Integer => f.write_str("expected a decimal integer"),
            ValueRule::IntegerInRange => {
                f.write_str("the integer does not fit in 64 bits; use a smaller value")
            }
            ValueRule::Number => f.write_str("expected a number (e.g. 0.5)"),
            ValueRule::NumberInRange => f.write_str(
                "the number overflows or underflows a double; use a value of ordinary size",
            ),
        }
    }
}

/// Where PyTorch's internal assertion for a syntax error sits (it is part
/// of the text PyTorch raises; the lines are 2.15's, see [`AssertLines`](super::AssertLines)
/// for each release's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssertSite {
    /// `ConfigTokenizer::operator[]`, AllocatorConfig.h:54.
    TokenizerIndex,
    /// `ConfigTokenizer::checkIndex`, AllocatorConfig.h:123.
    TokenizerCheckIndex,
    /// `ConfigTokenizer::skipKey`, AllocatorConfig.h:114.
    TokenizerSkipKey,
    /// `parseRoundUpPower2Divisions`, AllocatorConfig.cpp:213.
    RoundupList,
}

/// What is malformed about a settings string.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SyntaxProblem {
    /// The string ends where `expected` should have come.
    UnexpectedEnd {
        /// What should have followed, e.g. "`:` after `expandable_segments`".
        expected: String,
        /// PyTorch's assertion.
        site: AssertSite,
    },
    /// A `[` opens a list that no `]` closes.
    UnclosedList {
        /// The key whose value the list is.
        key: String,
        /// PyTorch's assertion.
        site: AssertSite,
    },
}

impl fmt::Display for SyntaxProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyntaxProblem::UnexpectedEnd { expected, .. } => write!(
                f,
                "the settings end where {expected} was expected; write `key:value` pairs separated by commas, e.g. `expandable_segments:True,max_split_size_mb:128`"
            ),
            SyntaxProblem::UnclosedList { key, .. } => {
                let example = if key == "roundup_power2_divisions" {
                    "[256:1,512:2,>:4]"
                } else {
                    "[name:value,name:value]"
                };
                write!(
                    f,
                    "the list of `{key}` opened here is never closed; add the missing `]`, e.g. `{key}:{example}`"
                )
            }
        }
    }
}

/// The exception PyTorch raises for a [`ConfigError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyTorchException {
    /// `c10::ValueError`; Python `ValueError`.
    ValueError,
    /// `c10::Error` from a failed internal assertion; Python `RuntimeError`.
    InternalAssert,
    /// `std::invalid_argument` from `stoull`/`stod`; Python `ValueError` from
    /// `_set_allocator_settings`, `RuntimeError` at start-up.
    InvalidArgument,
    /// `std::out_of_range` from `stoull`/`stod`; Python `IndexError`.
    OutOfRange,
}

/// The longest settings string read, in bytes: 64 KiB. PyTorch's strings
/// are a few hundred bytes (every key once is under 1 KiB); a longer one is
/// refused with [`ConfigError::TooLong`] before it is tokenised, so that a
/// hostile string costs neither memory (a token per byte) nor a message
/// that repeats it. Not PyTorch's: PyTorch reads any length.
pub const MAX_SETTINGS_LEN: usize = 64 * 1024;

/// The most characters of a settings string (or of one of its tokens) an
/// error message quotes: [`quote_window`].
pub const QUOTE_WINDOW: usize = 80;

/// `s` whole when it has at most [`QUOTE_WINDOW`] characters; otherwise the
/// [`QUOTE_WINDOW`] characters around byte `offset` (clamped to `s`), with
/// `…` where text was left out.
pub fn quote_window(s: &str, offset: usize) -> String {
    if s.chars().count() <= QUOTE_WINDOW {
        return s.to_owned();
    }
    let mut at = offset.min(s.len());
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    // Up to a quarter of the window before the offset, the rest after.
    let before: Vec<(usize, char)> = s[..at]
        .char_indices()
        .rev()
        .take(QUOTE_WINDOW / 4)
        .collect();
    let start = before.last().map_or(at, |&(i, _)| i);
    let rest = QUOTE_WINDOW - before.len();
    let end = s[at..]
        .char_indices()
        .nth(rest)
        .map_or(s.len(), |(i, _)| at + i);
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(&s[start..end]);
    if end < s.len() {
        out.push('…');
    }
    out
}

/// A token quoted by Reservoir's messages: at most [`QUOTE_WINDOW`]
/// characters, from its start.
pub(super) fn short(token: &str) -> String {
    quote_window(token, 0)
}

/// A settings string PyTorch would reject. Its `Display` text, Reservoir's
/// own words, is written in `message.rs`, above the key table it quotes.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A key that PyTorch 2.15 does not know.
    UnknownKey {
        /// The key as written (whitespace removed).
        key: String,
        /// Token index in the string.
        index: usize,
        /// Byte offset in the string.
        offset: usize,
        /// The parser that rejected it (decides PyTorch's wording).
        parser: KeyParser,
    },
    /// A Reservoir policy name (`policy:NAME`) that does not exist.
    UnknownPolicy {
        /// The name as written (whitespace removed).
        name: String,
    },
    /// A value that breaks the key's rule.
    InvalidValue {
        /// The key.
        key: String,
        /// The offending token (whitespace removed).
        value: String,
        /// Token index of `value`.
        index: usize,
        /// Byte offset of `value`.
        offset: usize,
        /// What is accepted.
        rule: ValueRule,
    },
    /// The string is cut short or a list is not closed.
    Syntax {
        /// Token index where the problem shows.
        index: usize,
        /// Byte offset where the problem shows.
        offset: usize,
        /// What is wrong.
        problem: SyntaxProblem,
    },
    /// A runtime string names another backend than the one chosen at start-up.
    BackendMismatch {
        /// The backend in the string.
        requested: AllocatorBackend,
        /// The backend chosen at start-up.
        loaded: AllocatorBackend,
        /// Token index of the value.
        index: usize,
        /// Byte offset of the value.
        offset: usize,
    },
    /// The string is longer than [`MAX_SETTINGS_LEN`]; nothing of it was
    /// read. Reservoir's limit, not PyTorch's.
    TooLong {
        /// The string's length in bytes.
        len: usize,
        /// The limit, [`MAX_SETTINGS_LEN`].
        max: usize,
    },
    /// An error in the value of an environment variable.
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with its value.
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The byte offset in the settings string where the error shows, if it
    /// has one (for [`quote_window`]).
    pub fn offset(&self) -> Option<usize> {
        match self {
            ConfigError::UnknownKey { offset, .. }
            | ConfigError::InvalidValue { offset, .. }
            | ConfigError::Syntax { offset, .. }
            | ConfigError::BackendMismatch { offset, .. } => Some(*offset),
            ConfigError::Env { error, .. } => error.offset(),
            ConfigError::UnknownPolicy { .. } | ConfigError::TooLong { .. } => None,
        }
    }
}

/// Something PyTorch warns about (on stderr) while accepting the string.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConfigWarning {
    /// `backend:cudaMallocAsync` together with a key of the native allocator
    /// that the CUDA parser reads.
    AsyncBackendIgnoresNativeOptions,
    /// Both pinned thresholds in one string, rounding limit above cache limit.
    /// PyTorch prints this once per process.
    PinnedRoundThresholdAboveCachedSize {
        /// `pinned_max_round_threshold_mb` as stored (MiB).
        round_threshold_mb: u64,
        /// `pinned_max_cached_size_mb` as stored (MiB).
        cached_size_mb: u64,
    },
    /// An expandable-segment reserve value PyTorch ignores (it keeps the
    /// previous setting, or skips that class).
    InvalidReserveValue {
        /// The value as written (whitespace removed).
        value: String,
    },
}

impl ConfigWarning {
    /// The warning text PyTorch 2.15 prints.
    pub fn pytorch_message(&self) -> String {
        match self {
            ConfigWarning::AsyncBackendIgnoresNativeOptions => {
                "backend:cudaMallocAsync ignores max_split_size_mb,roundup_power2_divisions, and garbage_collect_threshold.".to_owned()
            }
            ConfigWarning::PinnedRoundThresholdAboveCachedSize {
                round_threshold_mb,
                cached_size_mb,
            } => format!(
                "pinned_max_round_threshold_mb ({round_threshold_mb}) > pinned_max_cached_size_mb ({cached_size_mb}). The cache size limit takes precedence: allocations above pinned_max_cached_size_mb are never rounded up."
            ),
            ConfigWarning::InvalidReserveValue { value } => format!(
                "Ignoring invalid expandable-segment reserve value '{value}' in PYTORCH_CUDA_ALLOC_CONF (expected a positive, finite fraction like 0.5 or an absolute size like 40G); using default."
            ),
        }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::AsyncBackendIgnoresNativeOptions => f.write_str(
                "backend:cudaMallocAsync is set, so the native allocator's settings in this string have no effect",
            ),
            ConfigWarning::PinnedRoundThresholdAboveCachedSize {
                round_threshold_mb,
                cached_size_mb,
            } => write!(
                f,
                "pinned_max_round_threshold_mb ({round_threshold_mb}) is above pinned_max_cached_size_mb ({cached_size_mb}); pinned requests above the cache limit are never rounded up"
            ),
            ConfigWarning::InvalidReserveValue { value } => write!(
                f,
                "ignored expandable-segment reserve `{value}`: expected a positive fraction of device memory (e.g. 0.5) or a size in GiB (e.g. 40G)"
            ),
        }
    }
}
