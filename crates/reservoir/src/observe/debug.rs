//! Debug output of the allocator's decisions through [`tracing`], with the
//! levels of PyTorch's MPS allocator (`PYTORCH_DEBUG_MPS_ALLOCATOR`).
//!
//! The environment variable [`ENV_VAR`] (`RESERVOIR_DEBUG_VERBOSITY`) holds
//! a bitmask, read when an allocator is created:
//!
//! | bit | name | what is logged |
//! |---|---|---|
//! | 1 | `PROFILING` | allocator creation, `empty_cache` and out-of-memory failures |
//! | 2 | `ALLOCATIONS` | new segments and mapped pages, and blocks served from them |
//! | 4 | `RECYCLES` | blocks served from the cache |
//! | 8 | `RELEASES` | segments and pages given back to the device, blocks returned to the cache |
//! | 16 | `LARGE_ONLY` | restrict 2, 4 and 8 to the large pool |
//!
//! The value is a number (decimal, `0x` hexadecimal, `0o` octal or `0b`
//! binary) or names joined by `|` or `,` (case-insensitive), e.g.
//! `RESERVOIR_DEBUG_VERBOSITY=allocations|releases` or `=10`. An unset or
//! empty variable means 0 (off). A malformed value is reported with a
//! [`VerbosityError`] that names it; an allocator that meets one logs the
//! error (`tracing` warning) and keeps debug output off.
//!
//! Events are emitted at `INFO` level with target [`TARGET`]
//! (`reservoir::debug`), so a subscriber can route them, e.g.
//! `RUST_LOG=reservoir::debug=info` with `tracing-subscriber`'s `EnvFilter`.
//! The level can also be changed at run time with
//! [`CachingAllocator::set_debug_verbosity`](crate::caching::CachingAllocator::set_debug_verbosity).
//! With verbosity 0 the allocator pays one branch per event.

use std::fmt;

/// The environment variable holding the verbosity bitmask.
pub const ENV_VAR: &str = "RESERVOIR_DEBUG_VERBOSITY";

/// The `tracing` target of debug events.
pub const TARGET: &str = "reservoir::debug";

/// A set of debug levels (PyTorch's MPS `DebugVerbosity` bitmask).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DebugVerbosity(u32);

impl DebugVerbosity {
    /// Nothing is logged.
    pub const OFF: DebugVerbosity = DebugVerbosity(0);
    /// Creation, `empty_cache`, out-of-memory failures.
    pub const PROFILING: DebugVerbosity = DebugVerbosity(1);
    /// New segments or pages, and blocks served from them.
    pub const ALLOCATIONS: DebugVerbosity = DebugVerbosity(2);
    /// Blocks served from the cache.
    pub const RECYCLES: DebugVerbosity = DebugVerbosity(4);
    /// Memory given back to the device, blocks returned to the cache.
    pub const RELEASES: DebugVerbosity = DebugVerbosity(8);
    /// Only large-pool events for `ALLOCATIONS`, `RECYCLES` and `RELEASES`.
    pub const LARGE_ONLY: DebugVerbosity = DebugVerbosity(16);

    const NAMES: [(&'static str, DebugVerbosity); 5] = [
        ("PROFILING", DebugVerbosity::PROFILING),
        ("ALLOCATIONS", DebugVerbosity::ALLOCATIONS),
        ("RECYCLES", DebugVerbosity::RECYCLES),
        ("RELEASES", DebugVerbosity::RELEASES),
        ("LARGE_ONLY", DebugVerbosity::LARGE_ONLY),
    ];
    const ALL_BITS: u32 = 31;

    /// The bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// From bits; `None` if a bit above 16 is set.
    pub fn from_bits(bits: u32) -> Option<DebugVerbosity> {
        (bits & !Self::ALL_BITS == 0).then_some(DebugVerbosity(bits))
    }

    /// From bits, unknown ones kept (PyTorch's MPS allocator keeps its
    /// whole `strtol` value: a value with only unknown bits logs nothing
    /// but is still "non-zero" for the messages that test that,
    /// [`is_zero`](Self::is_zero)).
    pub fn from_bits_retain(bits: u32) -> DebugVerbosity {
        DebugVerbosity(bits)
    }

    /// True when no bit at all is set (PyTorch's `getDebugVerbosity() == 0`).
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// True when every bit of `other` is set.
    pub fn contains(self, other: DebugVerbosity) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when nothing is logged.
    pub fn is_off(self) -> bool {
        self.0 & !Self::LARGE_ONLY.0 == 0
    }

    /// Should an event of `level` about a block of the given pool be logged?
    pub fn logs(self, level: DebugVerbosity, small_pool: bool) -> bool {
        self.contains(level)
            && !(small_pool
                && self.contains(DebugVerbosity::LARGE_ONLY)
                && level != DebugVerbosity::PROFILING)
    }

    /// Parse a bitmask (see the [module documentation](self)).
    pub fn parse(s: &str) -> Result<DebugVerbosity, VerbosityError> {
        let t = s.trim();
        if t.is_empty() {
            return Ok(DebugVerbosity::OFF);
        }
        let err = |reason: String| VerbosityError {
            value: s.to_string(),
            reason,
        };
        let number = |t: &str| -> Option<Result<u32, std::num::ParseIntError>> {
            let (digits, radix) = if let Some(h) = t.strip_prefix("0x").or(t.strip_prefix("0X")) {
                (h, 16)
            } else if let Some(o) = t.strip_prefix("0o").or(t.strip_prefix("0O")) {
                (o, 8)
            } else if let Some(b) = t.strip_prefix("0b").or(t.strip_prefix("0B")) {
                (b, 2)
            } else if t.bytes().next().is_some_and(|b| b.is_ascii_digit()) {
                (t, 10)
            } else {
                return None;
            };
            Some(u32::from_str_radix(digits, radix))
        };
        if let Some(n) = number(t) {
            let bits = n.map_err(|e| err(format!("not a number ({e})")))?;
            return DebugVerbosity::from_bits(bits).ok_or_else(|| {
                err(format!(
                    "unknown bits {:#x} (valid bits: 1 PROFILING, 2 ALLOCATIONS, 4 RECYCLES, \
                     8 RELEASES, 16 LARGE_ONLY)",
                    bits & !Self::ALL_BITS
                ))
            });
        }
        let mut bits = 0;
        for part in t.split(['|', ',']) {
            let name = part.trim();
            match Self::NAMES
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
            {
                Some((_, v)) => bits |= v.0,
                None => {
                    return Err(err(format!(
                        "unknown level {name:?} (expected a number or names among PROFILING, \
                         ALLOCATIONS, RECYCLES, RELEASES, LARGE_ONLY joined by '|' or ',')"
                    )))
                }
            }
        }
        Ok(DebugVerbosity(bits))
    }

    /// Read [`ENV_VAR`]; unset means off.
    pub fn from_env() -> Result<DebugVerbosity, VerbosityError> {
        match std::env::var(ENV_VAR) {
            Ok(v) => DebugVerbosity::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(DebugVerbosity::OFF),
            Err(std::env::VarError::NotUnicode(v)) => Err(VerbosityError {
                value: v.to_string_lossy().into_owned(),
                reason: "not valid UTF-8".into(),
            }),
        }
    }
}

impl std::ops::BitOr for DebugVerbosity {
    type Output = DebugVerbosity;
    fn bitor(self, rhs: DebugVerbosity) -> DebugVerbosity {
        DebugVerbosity(self.0 | rhs.0)
    }
}

impl fmt::Display for DebugVerbosity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Self::NAMES
            .iter()
            .filter(|(_, v)| self.contains(*v))
            .map(|(n, _)| *n)
            .collect();
        let unknown = self.0 & !Self::ALL_BITS;
        match (names.is_empty(), unknown) {
            (true, 0) => f.write_str("OFF"),
            (false, 0) => f.write_str(&names.join("|")),
            (true, u) => write!(f, "{u:#x}"),
            (false, u) => write!(f, "{}|{u:#x}", names.join("|")),
        }
    }
}

/// A malformed verbosity value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {ENV_VAR} value {value:?}: {reason}")]
pub struct VerbosityError {
    /// The value as given.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}
