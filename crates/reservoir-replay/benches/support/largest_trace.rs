//! The largest real trace in `../shared/traces`, loaded and converted for
//! PyTorch-mode replay: shared by the `replay_trace` benchmark and the
//! `replay_profile` example (included with `#[path]`).

use reservoir_replay::input::{self, DeviceEvents};
use reservoir_replay::replay::recorded::{convert, recorded_setting, RecordedTrace};
use reservoir_replay::replay::ReplaySetting;

/// The file, relative to `../shared/traces`.
pub const FILE: &str = "cs336-wedsonlin/61dcd14d_medium_512_training_memory_snapshot.pickle";

/// The trace's device 0 with the setting it was recorded under.
pub struct LargestTrace {
    /// The recorded events (to convert again, or count).
    pub dev: DeviceEvents,
    /// The recorded allocator settings (PyTorch mode).
    pub setting: ReplaySetting,
    /// The converted trace, ready to replay.
    pub rec: RecordedTrace,
}

/// Loads and converts the trace; `None` (with a printed reason) when
/// `../shared/traces` is not beside the repository.
pub fn load() -> Option<LargestTrace> {
    let Some(path) = reservoir_testkit::traces::shared_trace(FILE) else {
        eprintln!("skipped: {FILE} not found beside the repository");
        return None;
    };
    let mut input = input::load(&path).unwrap().to_trace_input();
    let setting = recorded_setting(input.allocator_settings.as_ref());
    let config = setting.allocator_config().unwrap();
    let dev = input.devices.swap_remove(0);
    let rec = convert(&dev, &config, false).unwrap();
    Some(LargestTrace { dev, setting, rec })
}
