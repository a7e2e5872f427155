//! Replaying a trace to the end under a setting: the one place where a
//! setting's [`AllocatorKind`] picks the allocator type the replay drives.

use super::{
    AllocatorKind, Replay, ReplayError, ReplayOptions, ReplayReport, ReplaySetting, ReplayTarget,
    StartState,
};
use crate::oracle_trace::Trace;
use reservoir::caching::CachingAllocator;
use reservoir::heap::HeapAllocator;
use reservoir::sim::SimDevice;

/// Replay `trace` with one setting, to the end.
pub fn replay(
    trace: &Trace,
    setting: &ReplaySetting,
    options: &ReplayOptions,
) -> Result<ReplayReport, ReplayError> {
    run_setting(trace, None, setting, options, &mut |_| {})
}

/// What to do with a fresh [`Replay`], whatever allocator type it drives:
/// the job [`with_replay`] hands the replay it builds.
pub(crate) trait ReplayJob {
    /// What the job returns.
    type Output;

    /// Do the job on `replay`.
    fn run<T: ReplayTarget>(self, replay: Replay<'_, T>) -> Result<Self::Output, ReplayError>;
}

/// Build the replay of `trace` (from `start` when given) through the
/// allocator of `setting` and hand it to `job`.
pub(crate) fn with_replay<J: ReplayJob>(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    job: J,
) -> Result<J::Output, ReplayError> {
    match setting.allocator {
        AllocatorKind::Caching => job.run(Replay::<CachingAllocator<SimDevice>>::build(
            trace, start, setting, options,
        )?),
        AllocatorKind::MpsHeap => job.run(Replay::<HeapAllocator<SimDevice>>::build(
            trace, start, setting, options,
        )?),
    }
}

/// Replay `trace` (from `start` when given) through the allocator of
/// `setting`, to the end; `progress` gets the number of ops done.
pub fn run_setting(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<ReplayReport, ReplayError> {
    struct ToTheEnd<'p>(&'p mut dyn FnMut(usize));
    impl ReplayJob for ToTheEnd<'_> {
        type Output = ReplayReport;
        fn run<T: ReplayTarget>(self, mut r: Replay<'_, T>) -> Result<ReplayReport, ReplayError> {
            r.run_with_progress(self.0)?;
            Ok(r.report())
        }
    }
    with_replay(trace, start, setting, options, ToTheEnd(progress))
}

/// The segments of the allocator of `setting` after replaying `trace` (from
/// `start` when given) up to op `op` included (to the end when `None`):
/// the segment map at a peak.
pub fn segments_at(
    trace: &Trace,
    start: Option<&StartState>,
    setting: &ReplaySetting,
    options: &ReplayOptions,
    op: Option<u64>,
) -> Result<Vec<reservoir::observe::snapshot::Segment>, ReplayError> {
    struct UpTo(Option<u64>);
    impl ReplayJob for UpTo {
        type Output = Vec<reservoir::observe::snapshot::Segment>;
        fn run<T: ReplayTarget>(self, mut r: Replay<'_, T>) -> Result<Self::Output, ReplayError> {
            while !matches!(self.0, Some(op) if r.position() as u64 > op) && r.step()? {}
            Ok(r.allocator().segments())
        }
    }
    with_replay(trace, start, setting, options, UpTo(op))
}

/// Replay `trace` with each setting in turn; `progress` gets the number of
/// ops done over all settings so far (out of `trace.ops.len() * settings.len()`).
pub fn replay_all(
    trace: &Trace,
    settings: &[ReplaySetting],
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Vec<ReplayReport>, ReplayError> {
    let mut out = Vec::with_capacity(settings.len());
    for (k, s) in settings.iter().enumerate() {
        let base = k * trace.ops.len();
        out.push(run_setting(trace, None, s, options, &mut |n| {
            progress(base + n)
        })?);
    }
    Ok(out)
}
