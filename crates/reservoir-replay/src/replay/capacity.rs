//! The smallest device a trace fits on: [`min_capacity`] bisects the device
//! capacity (in steps of [`CAPACITY_STEP`], 2 MiB) over the deterministic
//! replay, for one setting.
//!
//! A capacity *fits* when the whole trace replays with no out-of-memory
//! error (and, from a recorded start state, the start state can be seeded).
//! Nothing can fit below the peak of the bytes callers hold
//! ([`ReplayReport::peak_live`](super::ReplayReport::peak_live)): reserved
//! bytes are never fewer than requested ones. A replay on a device at least
//! as large as its peak reserved bytes never meets the limit, so it runs as
//! on any larger device; the search starts from there (growing it while it
//! does not fit, for settings whose behaviour depends on the capacity, such
//! as `garbage_collection_threshold` or `per_process_memory_fraction`).
//! Between the two it bisects, assuming that fitting is monotone in the
//! capacity, as it is for PyTorch's policy (a larger device only ever lets
//! a `cudaMalloc` succeed that failed before); the answer is checked to fit.

use super::{Replay, ReplayError, ReplayOptions, ReplaySetting, StartState};
use crate::oracle_trace::Trace;
use reservoir::sim::DEFAULT_CAPACITY;

/// The granularity of [`min_capacity`]: 2 MiB, the device's large page.
pub const CAPACITY_STEP: u64 = 2 << 20;

/// The largest capacity tried: 16 TiB, the largest a replay accepts
/// (defined beside [`ReplayOptions::capacity`]).
pub use super::setting::MAX_CAPACITY;

/// The answer of [`min_capacity`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MinCapacity {
    /// The setting's name.
    pub setting: String,
    /// The smallest capacity (a multiple of [`CAPACITY_STEP`]) on which the
    /// trace replays without an out-of-memory error; `None` when even
    /// [`MAX_CAPACITY`] is not enough.
    pub min_capacity: Option<u64>,
    /// Replays the search ran.
    pub replays: u32,
}

fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(CAPACITY_STEP).saturating_mul(CAPACITY_STEP)
}

/// One replay of the search: `Ok(Some(peaks))` when `capacity` fits, with
/// the (peak live, peak reserved) bytes; `Ok(None)` when it does not.
fn try_capacity(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    capacity: u64,
) -> Result<Option<(u64, u64)>, ReplayError> {
    let options = ReplayOptions::without_timeline(capacity);
    let mut r: Replay<'_> = match Replay::build(trace, start, setting, &options) {
        Ok(r) => r,
        // The start state itself does not fit on this device.
        Err(ReplayError::Seed { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    r.track_peak = false;
    r.run()?;
    if r.ooms > 0 {
        return Ok(None);
    }
    let stats = r.alloc.stats();
    let live = stats.requested_bytes.all().peak.max(0) as u64;
    let reserved = stats.reserved_bytes.all().peak.max(0) as u64;
    Ok(Some((live, reserved)))
}

/// The smallest capacity on which `trace` (from `start`, when given) replays
/// with `setting` without running out of memory; see the module
/// documentation. `progress` is called after each replay with the range
/// still searched (`lo` does not fit, `hi` fits).
pub fn min_capacity(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<MinCapacity, ReplayError> {
    // Placements and the device-call log are not needed.
    let quiet = start.map(StartState::quiet);
    let start = quiet.as_ref();
    let mut replays = 0;
    let mut fits = |capacity: u64| {
        replays += 1;
        try_capacity(trace, start, setting, capacity)
    };
    // An upper bound that fits, and the peak live bytes.
    let mut hi = DEFAULT_CAPACITY;
    let mut found = fits(hi)?;
    while found.is_none() && hi < MAX_CAPACITY {
        hi = (hi * 2).min(MAX_CAPACITY);
        found = fits(hi)?;
    }
    let Some((live, reserved)) = found else {
        return Ok(MinCapacity {
            setting: setting.name.clone(),
            min_capacity: None,
            replays,
        });
    };
    // Below the peak live bytes nothing fits.
    let mut lo = round_up(live).saturating_sub(CAPACITY_STEP);
    // The peak reserved bytes are enough unless the setting depends on the
    // capacity: then grow from there.
    let mut guess = round_up(reserved).max(lo + CAPACITY_STEP);
    while guess < hi {
        if fits(guess)?.is_some() {
            hi = guess;
            break;
        }
        lo = guess;
        guess = round_up(guess.saturating_mul(2));
    }
    progress(lo, hi);
    while hi - lo > CAPACITY_STEP {
        let mid = lo + (hi - lo) / 2 / CAPACITY_STEP * CAPACITY_STEP;
        if fits(mid)?.is_some() {
            hi = mid;
        } else {
            lo = mid;
        }
        progress(lo, hi);
    }
    Ok(MinCapacity {
        setting: setting.name.clone(),
        min_capacity: Some(hi),
        replays,
    })
}
