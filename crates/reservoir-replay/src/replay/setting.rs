//! What to replay with: the allocator and its settings string
//! ([`ReplaySetting`]), the device and measurement options
//! ([`ReplayOptions`]), and why a replay stops ([`ReplayError`]).

use reservoir::backend::BackendError;
use reservoir::caching::SeedError;
use reservoir::config::AllocatorConfig;
use reservoir::error::AllocError;
use reservoir::sim::DEFAULT_CAPACITY;

/// The allocator a [`ReplaySetting`] replays through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AllocatorKind {
    /// PyTorch's CUDA caching allocator ([`CachingAllocator`](reservoir::caching::CachingAllocator)), with the
    /// setting's settings string.
    #[default]
    Caching,
    /// PyTorch's MPS heap allocator ([`HeapAllocator`](reservoir::heap::HeapAllocator)) on unified memory,
    /// its default watermarks; the settings string does not apply.
    MpsHeap,
}

impl AllocatorKind {
    /// `caching` or `mps-heap` (the report's `allocator`).
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Caching => "caching",
            AllocatorKind::MpsHeap => "mps-heap",
        }
    }

    /// Whether a replay of a recorded CUDA snapshot through this allocator
    /// is meant to reproduce the recording, so that its
    /// [`Fidelity`](super::recorded::Fidelity) is measured: the caching
    /// allocator made the recording; the MPS heap allocator lays memory out
    /// its own way.
    pub fn reproduces_recordings(self) -> bool {
        match self {
            AllocatorKind::Caching => true,
            AllocatorKind::MpsHeap => false,
        }
    }
}

/// A named allocator setting: a `PYTORCH_CUDA_ALLOC_CONF`-style string, or
/// another allocator ([`AllocatorKind`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplaySetting {
    /// Name shown in reports (`pytorch`, `max-split-128`, ...).
    pub name: String,
    /// The settings string ("" = PyTorch's defaults).
    pub config: String,
    /// The allocator replayed.
    pub allocator: AllocatorKind,
}

impl ReplaySetting {
    /// A setting of the caching allocator with this name and settings string.
    pub fn new(name: impl Into<String>, config: impl Into<String>) -> Self {
        ReplaySetting {
            name: name.into(),
            config: config.into(),
            allocator: AllocatorKind::Caching,
        }
    }

    /// The MPS heap allocator, named `mps-heap`.
    pub fn mps_heap() -> Self {
        ReplaySetting {
            allocator: AllocatorKind::MpsHeap,
            ..ReplaySetting::new("mps-heap", "")
        }
    }

    /// A setting named after its settings string (`pytorch` when empty).
    pub fn from_config(config: &str) -> Self {
        let config = config.trim();
        let name = if config.is_empty() { "pytorch" } else { config };
        ReplaySetting::new(name, config)
    }

    /// Read `NAME=CONF` (or a bare `CONF`, named after itself), checking
    /// that the settings string parses.
    pub fn parse(s: &str) -> Result<Self, ReplayError> {
        let setting = match s.split_once('=') {
            Some((name, conf)) => {
                let name = name.trim();
                if name.is_empty() {
                    return Err(ReplayError::Config {
                        setting: s.to_string(),
                        config: conf.trim().to_string(),
                        message: "the setting has no name (write NAME=CONF)".into(),
                    });
                }
                ReplaySetting::new(name, conf.trim())
            }
            None => ReplaySetting::from_config(s),
        };
        setting.allocator_config()?;
        Ok(setting)
    }

    /// The default comparison: `pytorch` (PyTorch's defaults), `expandable`
    /// (`expandable_segments:True`), `reservoir` (`policy:reservoir`, the
    /// policy that keeps peak reserved near peak live), `max-split-128`
    /// (`max_split_size_mb:128`), `roundup-4` (`roundup_power2_divisions:4`)
    /// and `gc-0.8`
    /// (`garbage_collection_threshold:0.8,per_process_memory_fraction:0.95`):
    /// the same policies `reservoir replay` compares on a recorded trace.
    pub fn defaults() -> Vec<ReplaySetting> {
        vec![
            ReplaySetting::new("pytorch", ""),
            ReplaySetting::new("expandable", "expandable_segments:True"),
            ReplaySetting::new("reservoir", "policy:reservoir"),
            ReplaySetting::new("max-split-128", "max_split_size_mb:128"),
            ReplaySetting::new("roundup-4", "roundup_power2_divisions:4"),
            ReplaySetting::new(
                "gc-0.8",
                "garbage_collection_threshold:0.8,per_process_memory_fraction:0.95",
            ),
        ]
    }

    /// The typed settings.
    pub fn allocator_config(&self) -> Result<AllocatorConfig, ReplayError> {
        if self.config.trim().is_empty() {
            return Ok(AllocatorConfig::default());
        }
        AllocatorConfig::parse_with_policy(&self.config).map_err(|e| ReplayError::Config {
            setting: self.name.clone(),
            config: self.config.clone(),
            message: e.to_string(),
        })
    }
}

/// The largest device capacity a replay accepts: 16 TiB. The simulated
/// device places segments in a 127 TiB address window and an expandable
/// segment reserves up to twice the device ([`ReplayError::Capacity`]).
pub const MAX_CAPACITY: u64 = 16 << 40;

/// How to replay, besides the allocator setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Device capacity in bytes. Default [`DEFAULT_CAPACITY`] (80 GiB), at
    /// most [`MAX_CAPACITY`].
    pub capacity: u64,
    /// Most points in [`ReplayReport::samples`](super::ReplayReport::samples) (at least 2). Default 2000.
    pub max_samples: usize,
    /// Time one allocator call in this many, chosen at random (a fixed
    /// seed, so which calls are timed is the same in every run); 1 times
    /// every call. Reading the clock costs about as much as a cached
    /// allocation, so timing every call would slow the replay down by
    /// half. Default 8; traces of fewer than 100 000 ops are always timed
    /// in full, except replays from a [`StartState`](super::StartState) (recorded traces,
    /// where replay speed matters more than exact quantiles).
    pub time_one_in: u32,
    /// Most out-of-memory errors the replay may meet: past it the replay
    /// stops with [`ReplayError::TooManyOoms`]. Each OOM costs the
    /// allocator a pass over every cached block (it releases them all
    /// before failing, as PyTorch's does), so a program far too large for
    /// the device would otherwise replay for hours. Default `None` (no
    /// cap): recorded traces, capacity searches and what-if replays always
    /// run to the end; the CLI sets a cap for built-in workloads only.
    pub max_ooms: Option<u64>,
}

impl ReplayOptions {
    /// The options of a replay on a device of `capacity` bytes whose
    /// timeline is not shown (a search, an explanation, a lint pass, a
    /// comparison): the fewest samples, 2; the rest as by default.
    pub fn without_timeline(capacity: u64) -> ReplayOptions {
        ReplayOptions {
            capacity,
            max_samples: 2,
            ..ReplayOptions::default()
        }
    }
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            capacity: DEFAULT_CAPACITY,
            max_samples: 2000,
            time_one_in: 8,
            max_ooms: None,
        }
    }
}

/// Why a replay stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The settings string of a setting does not parse.
    #[error("setting {setting:?}: invalid allocator settings {config:?}: {message}")]
    Config {
        /// The setting's name.
        setting: String,
        /// Its settings string.
        config: String,
        /// The parser's complaint.
        message: String,
    },
    /// The trace does something the oracle refuses.
    #[error("op {op} (line {line}): {message}")]
    Trace {
        /// Op index.
        op: usize,
        /// Source line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The allocator failed other than by running out of memory.
    #[error("op {op} (line {line}): allocator error: {source}")]
    Allocator {
        /// Op index.
        op: usize,
        /// Source line.
        line: usize,
        /// The error.
        source: AllocError,
    },
    /// The start state could not be laid into the allocator.
    #[error("seeding segment {segment} of the start state: {source}")]
    Seed {
        /// Index of the segment in [`StartState::segments`](super::StartState::segments) (then
        /// [`StartState::expandable`](super::StartState::expandable), numbered on after them).
        segment: usize,
        /// The error.
        source: SeedError,
    },
    /// The device capacity asked for is more than the simulated device
    /// can have ([`MAX_CAPACITY`], 16 TiB).
    #[error(
        "a device of {capacity} bytes cannot be simulated: at most {} bytes (16 TiB)",
        MAX_CAPACITY
    )]
    Capacity {
        /// The capacity asked for.
        capacity: u64,
    },
    /// More allocations ran out of memory than
    /// [`ReplayOptions::max_ooms`] allows: the program does not fit the
    /// device, and replaying on would only repeat the failure.
    #[error(
        "op {op} (line {line}): out of memory {ooms} times, more than the limit of {limit}: \
         the program does not fit this device; replay it on a larger device (--capacity), \
         make it smaller, or raise the limit with RESERVOIR_MAX_REPLAY_OOMS=N \
         (see docs/limits.md)"
    )]
    TooManyOoms {
        /// Op index of the out-of-memory error past the limit.
        op: usize,
        /// Source line.
        line: usize,
        /// Out-of-memory errors so far (the limit plus one).
        ooms: u64,
        /// The limit ([`ReplayOptions::max_ooms`]).
        limit: u64,
    },
    /// The simulated device refused a stream operation.
    #[error("op {op} (line {line}): device error: {source}")]
    Device {
        /// Op index.
        op: usize,
        /// Source line.
        line: usize,
        /// The error.
        source: BackendError,
    },
}
