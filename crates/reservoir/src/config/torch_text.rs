//! What PyTorch raises for a [`ConfigError`]: the exact text of each
//! release (its internal assertions name source lines that move between
//! releases, see [`AssertLines`](super::AssertLines)) and the exception
//! type. It sits above `torch_release.rs`, whose release rules it reads,
//! and `error.rs`, whose types it renders.

use super::error::{
    AssertSite, ConfigError, KeyParser, PyTorchException, SyntaxProblem, ValueRule,
};
use super::torch_release::TorchRelease;

impl ConfigError {
    /// The message PyTorch 2.15 raises for this error (without its C++
    /// stack trace), e.g. `Unrecognized key 'bogus' in CUDA allocator config.`.
    pub fn pytorch_message(&self) -> String {
        self.pytorch_message_of(TorchRelease::NEWEST)
    }

    /// The message PyTorch `release` raises for this error: as
    /// [`ConfigError::pytorch_message`], with the source locations of the
    /// release's internal assertions ([`AssertLines`](super::AssertLines)).
    pub fn pytorch_message_of(&self, release: TorchRelease) -> String {
        let lines = release.rules().assert_lines;
        let root = lines.source_root;
        match self {
            ConfigError::UnknownKey { key, parser, .. } => {
                let which = match parser {
                    KeyParser::Accelerator => "Accelerator",
                    KeyParser::Cuda => "CUDA",
                };
                format!("Unrecognized key '{key}' in {which} allocator config.")
            }
            ConfigError::InvalidValue {
                key,
                value,
                index,
                rule,
                ..
            } => match rule {
                ValueRule::TrueOrFalse => format!(
                    "Expected 'True' or 'False' at index {index} in ConfigTokenizer but got '{value}'"
                ),
                ValueRule::Backend => {
                    "Unknown allocator backend, options are native and cudaMallocAsync".to_owned()
                }
                ValueRule::AtLeastMib { min } => {
                    format!("CachingAllocator option {key} too small, must be >= {min}")
                }
                ValueRule::GreaterThanMib { min } => {
                    format!("CachingAllocator option {key} must be > {min} MB")
                }
                ValueRule::OpenUnitInterval => {
                    "garbage_collect_threshold is invalid, set it in (0.0, 1.0)".to_owned()
                }
                ValueRule::UnitInterval => {
                    format!("{key} is invalid, set it in [0.0, 1.0]")
                }
                ValueRule::DivisionsPowerOfTwo => {
                    "For roundups, the divisions has to be power of 2 ".to_owned()
                }
                ValueRule::DivisionsPowerOfTwoOrZero => {
                    "For roundups, the divisions has to be power of 2 or 0 to disable roundup "
                        .to_owned()
                }
                ValueRule::IntervalPowerOfTwo => {
                    "For roundups, the intervals have to be power of 2 ".to_owned()
                }
                ValueRule::ThreadsPowerOfTwo { got } => {
                    format!("Number of register threads has to be power of 2, got {got}")
                }
                ValueRule::ThreadsAtMost { max, got } => format!(
                    "Number of register threads should be less than or equal to {max}, got {got}"
                ),
                ValueRule::Positive => {
                    "Pinned reserve segment size has to be greater than 0".to_owned()
                }
                ValueRule::Integer | ValueRule::IntegerInRange => "stoull".to_owned(),
                ValueRule::Number | ValueRule::NumberInRange => "stod".to_owned(),
            },
            ConfigError::Syntax { problem, .. } => {
                let site = match problem {
                    SyntaxProblem::UnexpectedEnd { site, .. }
                    | SyntaxProblem::UnclosedList { site, .. } => *site,
                };
                let bracket = "Expected closing bracket ']' in ConfigTokenizer but reached end of config";
                let index = "Index out of bounds in ConfigTokenizer";
                let (cond, file, line, text) = match site {
                    AssertSite::TokenizerIndex => {
                        ("i < config_.size()", "core/AllocatorConfig.h", lines.tokenizer_index, index)
                    }
                    AssertSite::TokenizerCheckIndex => (
                        "i < config_.size()",
                        "core/AllocatorConfig.h",
                        lines.tokenizer_check_index,
                        index,
                    ),
                    AssertSite::TokenizerSkipKey => (
                        "i < config_.size()",
                        "core/AllocatorConfig.h",
                        lines.tokenizer_skip_key,
                        bracket,
                    ),
                    AssertSite::RoundupList => (
                        "i < tokenizer.size()",
                        "core/AllocatorConfig.cpp",
                        lines.roundup_list,
                        bracket,
                    ),
                };
                format!(
                    "{cond} INTERNAL ASSERT FAILED at \"{root}/c10/{file}\":{line}, please report a bug to PyTorch. {text}"
                )
            }
            ConfigError::BackendMismatch {
                requested, loaded, ..
            } => format!(
                "tokenizer[i] == get()->name() INTERNAL ASSERT FAILED at \"{root}/c10/cuda/CUDAAllocatorConfig.cpp\":{}, please report a bug to PyTorch. Allocator backend parsed at runtime != allocator backend parsed at load time, {requested} != {loaded}",
                lines.backend_mismatch
            ),
            ConfigError::Env { error, .. } => error.pytorch_message_of(release),
            // PyTorch has no limit: Reservoir's own words.
            ConfigError::TooLong { .. } => self.to_string(),
            // PyTorch knows no `policy` key at all.
            ConfigError::UnknownPolicy { .. } => {
                "Unrecognized key 'policy' in Accelerator allocator config.".to_owned()
            }
        }
    }

    /// The exception PyTorch 2.15 raises for this error.
    pub fn pytorch_exception(&self) -> PyTorchException {
        match self {
            ConfigError::UnknownKey { .. }
            | ConfigError::UnknownPolicy { .. }
            | ConfigError::TooLong { .. } => PyTorchException::ValueError,
            ConfigError::InvalidValue { rule, .. } => match rule {
                ValueRule::Integer | ValueRule::Number => PyTorchException::InvalidArgument,
                ValueRule::IntegerInRange | ValueRule::NumberInRange => {
                    PyTorchException::OutOfRange
                }
                _ => PyTorchException::ValueError,
            },
            ConfigError::Syntax { .. } | ConfigError::BackendMismatch { .. } => {
                PyTorchException::InternalAssert
            }
            ConfigError::Env { error, .. } => error.pytorch_exception(),
        }
    }
}
