//! Which PyTorch release recorded a snapshot, where the file shows it, so
//! that `reservoir replay`'s `pytorch` setting replays in PyTorch mode of
//! that release ([`reservoir::TorchRelease`], `policy:pytorch-2.13`).
//!
//! A snapshot carries no version number; what it has is the keys each
//! release writes (checked against `torch.cuda.memory._snapshot()` of every
//! supported release, run on the fake device of `../shared/oracle`):
//!
//! | sign | releases |
//! |---|---|
//! | top-level `host_segments` / `host_traces` (pinned host memory) | 2.15 |
//! | neither, `allocator_settings` with `max_round_threshold` / `max_cached_size` | 2.13, 2.14: replayed as 2.14 |
//! | `allocator_settings` without them | 2.12 or older: replayed as 2.12 |
//!
//! Anything else (an `alloc_data` JSON, an allocatorSim log, a snapshot
//! without `allocator_settings`) does not show its release: `pytorch` is
//! then the newest supported release. `--torch RELEASE` overrides.

use reservoir::observe::snapshot::Snapshot;
use reservoir::TorchRelease;

use crate::input::{LoadedInput, TraceInput};
use crate::replay::recorded::{overlay_config, recorded_setting};
use crate::replay::ReplaySetting;

/// The release a replay's `pytorch` setting uses, and how it was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReleaseChoice {
    /// The release.
    pub release: TorchRelease,
    /// How it was decided, for the replay's header.
    pub how: String,
}

impl ReleaseChoice {
    /// The settings-string entry naming the release (`policy:pytorch-2.13`).
    pub fn policy_entry(&self) -> String {
        format!(
            "{}:{}",
            reservoir::config::POLICY_KEY,
            self.release.policy_name()
        )
    }

    /// The header line: `PyTorch mode: torch 2.14 (how)`.
    pub fn header(&self) -> String {
        format!("PyTorch mode: torch {} ({})", self.release, self.how)
    }

    /// `setting` in PyTorch mode of this release: its settings string with
    /// [`policy_entry`](Self::policy_entry) added (replacing any `policy:`
    /// entry), unless the release is the newest, which needs none (so the
    /// string of a newest-release input stays PyTorch's own).
    pub fn apply(&self, mut setting: ReplaySetting) -> ReplaySetting {
        if self.release != TorchRelease::NEWEST {
            setting.config = overlay_config(&setting.config, &self.policy_entry());
        }
        setting
    }
}

/// The `pytorch` setting of a loaded input (its recorded settings, see
/// [`recorded_setting`]; `input` is `loaded`'s
/// [`to_trace_input`](LoadedInput::to_trace_input)) in PyTorch mode of the
/// release [`choose`] picks, and that choice.
pub fn recorded_setting_as(
    loaded: &LoadedInput,
    input: &TraceInput,
    forced: Option<TorchRelease>,
) -> (ReplaySetting, ReleaseChoice) {
    let choice = choose(loaded, forced);
    let setting = recorded_setting(input.allocator_settings.as_ref());
    (choice.apply(setting), choice)
}

/// Top-level snapshot keys torch 2.15 added (pinned host memory).
pub const KEYS_ADDED_IN_2_15: [&str; 2] = ["host_segments", "host_traces"];

/// What a snapshot shows about its release: `Some` where its keys decide.
pub fn detect_snapshot(snap: &Snapshot) -> Option<ReleaseChoice> {
    if let Some(key) = KEYS_ADDED_IN_2_15
        .iter()
        .find(|k| snap.extra.get(k).is_some())
    {
        return Some(ReleaseChoice {
            release: TorchRelease::V2_15,
            how: format!("detected: the snapshot has `{key}`, which torch 2.15 added"),
        });
    }
    let settings = snap.allocator_settings.as_ref()?;
    if settings.max_round_threshold.is_some() || settings.max_cached_size.is_some() {
        return Some(ReleaseChoice {
            release: TorchRelease::V2_14,
            how: "detected: `allocator_settings` has `max_round_threshold` (torch 2.13+) and the \
                  snapshot has no `host_segments` (2.15+): torch 2.13 or 2.14, replayed as 2.14"
                .to_string(),
        });
    }
    Some(ReleaseChoice {
        release: TorchRelease::V2_12,
        how: "detected: `allocator_settings` without `max_round_threshold` (added in torch \
              2.13): torch 2.12 or older, replayed as 2.12"
            .to_string(),
    })
}

/// The release for `input`: `forced` when given (`--torch`), else what the
/// snapshot shows, else the newest supported release.
pub fn choose(input: &LoadedInput, forced: Option<TorchRelease>) -> ReleaseChoice {
    if let Some(release) = forced {
        return ReleaseChoice {
            release,
            how: "named by --torch".to_string(),
        };
    }
    input
        .snapshot()
        .and_then(detect_snapshot)
        .unwrap_or_else(|| ReleaseChoice {
            release: TorchRelease::NEWEST,
            how: format!(
                "the input does not show its release: the newest supported, {}",
                TorchRelease::NEWEST
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir::observe::pickle::Value;
    use reservoir::observe::snapshot::AllocatorSettings;

    #[test]
    fn keys_decide_the_release() {
        let mut snap = Snapshot::default();
        assert_eq!(detect_snapshot(&snap), None);
        snap.allocator_settings = Some(AllocatorSettings::default());
        let old = detect_snapshot(&snap).unwrap();
        assert_eq!(old.release, TorchRelease::V2_12);
        assert!(old.how.contains("max_round_threshold"), "{}", old.how);
        snap.allocator_settings = Some(AllocatorSettings {
            max_round_threshold: Some(-1),
            ..AllocatorSettings::default()
        });
        let mid = detect_snapshot(&snap).unwrap();
        assert_eq!(mid.release, TorchRelease::V2_14);
        assert_eq!(mid.policy_entry(), "policy:pytorch-2.14");
        snap.extra
            .0
            .push(("host_segments".to_string(), Value::List(Vec::new().into())));
        let new = detect_snapshot(&snap).unwrap();
        assert_eq!(new.release, TorchRelease::V2_15);
        assert_eq!(new.policy_entry(), "policy:pytorch-2.15");
        assert!(new
            .header()
            .starts_with("PyTorch mode: torch 2.15 (detected"));
    }
}
