//! Reservoir's own policies: a choice PyTorch does not have. They live beside
//! PyTorch's settings (in [`AllocatorConfig::policy`](super::AllocatorConfig::policy)),
//! and their defaults leave the allocator PyTorch-exact. PyTorch's parser
//! ([`AllocatorConfig::parse`]) never reads them; the Reservoir-only
//! [`AllocatorConfig::parse_with_policy`] also accepts `policy:NAME` entries.

use super::error::ConfigError;
use super::torch_release::TorchRelease;
#[cfg(doc)]
use super::AllocatorConfig;

/// The policy in force: PyTorch's behaviour (the default) or one of
/// Reservoir's own policies. One choice, made when the settings are made
/// (`policy:NAME`, see [`ReservoirPolicy::named`]); the allocator matches on
/// it at its one "choose the fit" hook and its other policy hooks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReservoirPolicy {
    /// PyTorch's behaviour, exact (`policy:pytorch`, the default).
    #[default]
    PyTorch,
    /// Cross-stream reuse (`policy:cross_stream_reuse`): when a stream's
    /// pool has no fitting free block, take one cached on another stream,
    /// making the allocating stream wait on an event recorded on the block's
    /// stream (as RMM does) instead of asking the driver for more memory.
    /// The block keeps its segment's stream and records the allocating
    /// stream as a user, so it returns to its own stream's pool only after
    /// the borrower's work.
    /// Needs [`Backend::stream_wait_event`](crate::backend::Backend::stream_wait_event);
    /// on backends without it the policy does nothing.
    CrossStreamReuse,
    /// The `reservoir` policy (settings string `policy:reservoir`):
    /// expandable segments in 2 MiB pages for both pools, and, when the
    /// cache must grow past a target (the peak of allocated bytes so far,
    /// or the bytes allocated with this request if more, plus 1/64 and
    /// 8 MiB, at most 1/20 + 4 MiB), the free pages of the expandable segments are unmapped
    /// first (release with hysteresis: nothing is given back while the
    /// cache stays under the target). Implies
    /// [`expandable_segments`](super::AllocatorConfig::expandable_segments);
    /// on a backend without virtual memory it does nothing.
    Reservoir,
}

/// The Reservoir-only settings key naming a policy.
pub const POLICY_KEY: &str = "policy";

/// Slack per allocating stream in [`waste_bound`]: 4 MiB.
pub const WASTE_SLACK_PER_STREAM: u64 = 4 << 20;

/// The reserved bytes the `reservoir` policy is meant to stay within for a
/// run whose peak live bytes are `peak_live` on `streams` allocating
/// streams (at least one): `1.05 x peak_live + 4 MiB x streams` (issue 17's
/// bound; `reservoir compare` checks it, the policy's target never passes
/// it for one stream).
pub fn waste_bound(peak_live: u64, streams: u64) -> u64 {
    peak_live + peak_live / 20 + WASTE_SLACK_PER_STREAM * streams.max(1)
}

impl ReservoirPolicy {
    /// The policy named `name` in `policy:NAME`: `pytorch`
    /// ([`PyTorch`](Self::PyTorch)), `reservoir` ([`Reservoir`](Self::Reservoir))
    /// or `cross_stream_reuse` ([`CrossStreamReuse`](Self::CrossStreamReuse)).
    pub fn named(name: &str) -> Result<ReservoirPolicy, ConfigError> {
        match name {
            "pytorch" => Ok(ReservoirPolicy::PyTorch),
            "reservoir" => Ok(ReservoirPolicy::Reservoir),
            "cross_stream_reuse" => Ok(ReservoirPolicy::CrossStreamReuse),
            _ => Err(ConfigError::UnknownPolicy {
                name: name.to_owned(),
            }),
        }
    }

    /// The name [`named`](Self::named) reads for this policy.
    pub fn name(self) -> &'static str {
        match self {
            ReservoirPolicy::PyTorch => "pytorch",
            ReservoirPolicy::Reservoir => "reservoir",
            ReservoirPolicy::CrossStreamReuse => "cross_stream_reuse",
        }
    }
}

/// The policy and release a `policy:NAME` entry names: `pytorch` (PyTorch
/// mode of the newest release), `pytorch-2.11` ... `pytorch-2.15` (PyTorch
/// mode of that release), or one of Reservoir's own policies
/// ([`ReservoirPolicy::named`], with the newest release's rules).
pub(super) fn policy_and_release(
    name: &str,
) -> Result<(ReservoirPolicy, TorchRelease), ConfigError> {
    match TorchRelease::from_policy_name(name) {
        Some(release) => Ok((ReservoirPolicy::PyTorch, release)),
        None => Ok((ReservoirPolicy::named(name)?, TorchRelease::NEWEST)),
    }
}
