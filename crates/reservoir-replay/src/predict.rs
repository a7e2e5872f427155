//! Predicting a program's memory at another batch or context size from
//! recordings of it at other sizes, by replaying a synthesized trace
//! (`reservoir predict`, `reservoir replay --scale`).
//!
//! Each recording ([`Sample`]) is a recorded device trace at a known size
//! `x`, replayed from a cold start (the blocks live at its first entry are
//! its first allocations, see [`StartMode::Cold`]). Its allocations are
//! keyed by their call site: the innermost user frame (file, line,
//! function) and the function and file of every frame of the recorded
//! stack, or "allocated before the trace" for the blocks of
//! the start state (which are listed by size, smallest first: a set of
//! blocks is matched between recordings by the rank of its sizes).
//!
//! * **One recording** (the rule): an allocation made before the trace,
//!   one never freed within it (it lives across the whole trace:
//!   parameters, optimizer state, gradients kept for the next step), and
//!   one whose stack shows the optimizer (`torch/optim/`, a `_foreach_`
//!   kernel) keep their size; every other allocation (activations and
//!   temporaries: made and freed within the trace) scales linearly with
//!   the size.
//! * **Several recordings**: the allocations of the recording nearest the
//!   asked size (the base) are matched with those of each other recording
//!   by a longest common subsequence of their call-site keys (so an
//!   allocation one recording has and another lacks costs one match, not
//!   the rest), and each matched allocation gets its own law
//!   ([`Law`]: constant, linear, quadratic or a sum of these, the fewest
//!   terms that reproduce its recorded sizes). An allocation matched in no
//!   other recording falls back to the rule.
//!
//! The synthesized trace is the base's, op for op (the same frees, streams
//! and `empty_cache()` calls), with each allocation's requested bytes
//! replaced by its law's value at the asked size, rounded to the
//! allocation's granule (the largest power of two up to 512 dividing all
//! its recorded sizes: the element size the program asks in) and at least
//! one granule. The allocator's own rounding is the replay's. At a recorded
//! size the recording is replayed unchanged.

mod align;
mod law;

pub use law::{Law, LawKind};

use std::collections::BTreeMap;

use crate::oracle_trace::Op;
use crate::replay::capacity::MAX_CAPACITY;
use crate::replay::recorded::{replay_recorded, RecordedTrace, StartMode};
use crate::replay::{ReplayError, ReplayOptions, ReplayReport, ReplaySetting};
use reservoir::checksum::Fnv1a;
use reservoir::observe::trace::{Frame, TraceEntry};

/// Most recordings one prediction reads (each is matched with every other).
pub const MAX_SAMPLES: usize = 16;

/// How far a prediction extrapolates: the asked size (and a `--scale`
/// factor times the recorded size) is at most this many times the largest
/// recorded size.
pub const MAX_EXTRAPOLATION: u64 = 64;

/// A prediction that cannot be made, naming the bad value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PredictError {
    /// No recording was given.
    #[error("no recording to predict from")]
    NoSamples,
    /// More recordings than [`MAX_SAMPLES`].
    #[error("{count} recordings is more than the limit of {limit} per prediction")]
    TooManySamples {
        /// Recordings given.
        count: usize,
        /// [`MAX_SAMPLES`].
        limit: usize,
    },
    /// A recording's size, or the asked size, is 0.
    #[error("{what}: the size is 0; a batch or context size is at least 1")]
    ZeroSize {
        /// The recording, or `--at`.
        what: String,
    },
    /// Two recordings at one size.
    #[error("{first} and {second} are both at size {size}: give each size once")]
    SameSize {
        /// The size.
        size: u64,
        /// One recording.
        first: String,
        /// The other.
        second: String,
    },
    /// The asked size is too far from the recorded ones.
    #[error(
        "size {at} is more than {MAX_EXTRAPOLATION} times the largest recorded size ({largest}): \
         extrapolating that far says nothing (the limit is {limit})"
    )]
    TooFar {
        /// The asked size.
        at: u64,
        /// The largest recorded size.
        largest: u64,
        /// The largest size that may be asked.
        limit: u64,
    },
    /// A `--scale` factor that is not a number above 0.
    #[error("scale factor {factor}: expected a number above 0 and at most {MAX_EXTRAPOLATION}")]
    BadFactor {
        /// The factor.
        factor: f64,
    },
    /// Two recordings that do not look like one program.
    #[error(
        "{first} and {second} do not look like recordings of one program: only {matched} of \
         their {total} allocations match by call site and order (at least half must)"
    )]
    Mismatched {
        /// One recording.
        first: String,
        /// The other.
        second: String,
        /// Allocations matched.
        matched: usize,
        /// Allocations of the larger of the two.
        total: usize,
    },
    /// An allocation of the synthesized trace over the largest device.
    #[error(
        "at size {at}, an allocation (op {op} of the trace) would ask for {bytes} bytes, more \
         than the largest simulated device ({MAX_CAPACITY} bytes)"
    )]
    TooLarge {
        /// The asked size.
        at: f64,
        /// The op.
        op: usize,
        /// Its predicted bytes.
        bytes: f64,
    },
    /// The replay failed.
    #[error(transparent)]
    Replay(#[from] ReplayError),
}

/// One allocation of a recording.
#[derive(Clone, Debug)]
struct Alloc {
    /// Its op in the (cold-start) trace.
    op: usize,
    /// Its call-site key.
    key: u64,
    /// Requested bytes.
    bytes: u64,
    /// Kept at its size by the one-recording rule.
    fixed: bool,
}

/// A recording of the program at one size, ready to be matched and scaled.
#[derive(Clone, Debug)]
pub struct Sample {
    /// What names it in messages (the file).
    pub label: String,
    /// Its batch or context size.
    pub size: u64,
    /// Its trace, from a cold start.
    pub trace: RecordedTrace,
    allocs: Vec<Alloc>,
}

/// The key of a stack: its site (the innermost user frame, with its
/// line) and every frame's function and file, without their lines (so
/// that an edit of the driver script between two recordings, which moves
/// the lines of its outer frames, changes no key).
fn stack_key(frames: &[Frame]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(crate::replay::sites::site_of(frames).as_bytes());
    for f in frames {
        h.write_byte(0);
        h.write(f.name.as_bytes());
        h.write_byte(0);
        h.write(f.filename.as_bytes());
    }
    h.finish()
}

/// Does the stack show the optimizer (its state keeps its size)?
fn optimizer_stack(frames: &[Frame]) -> bool {
    frames.iter().any(|f| {
        f.filename.contains("/torch/optim/")
            || f.filename.starts_with("torch/optim/")
            || f.name.contains("_foreach_")
    })
}

/// The key of the blocks of the start state.
const BEFORE_TRACE_KEY: u64 = 0x6265_666f_7265;

impl Sample {
    /// The recording `label` at size `size`: `rec` converted from the
    /// device's `events` (from its recorded start: it is turned into a
    /// cold start here).
    pub fn new(
        label: impl Into<String>,
        size: u64,
        rec: RecordedTrace,
        events: &[TraceEntry],
    ) -> Result<Sample, PredictError> {
        let label = label.into();
        if size == 0 {
            return Err(PredictError::ZeroSize { what: label });
        }
        let recorded_ops = rec.trace.ops.len();
        let trace = rec.with_start(StartMode::Cold);
        let prefix = trace.trace.ops.len() - recorded_ops;
        let mut freed = rustc_hash::FxHashSet::default();
        for op in &trace.trace.ops {
            if let Op::Free { id } = op {
                freed.insert(*id);
            }
        }
        let mut allocs = Vec::new();
        for (i, op) in trace.trace.ops.iter().enumerate() {
            let Op::Alloc { id, bytes, .. } = op else {
                continue;
            };
            let frames = (i >= prefix)
                .then(|| events.get(trace.trace.lines[i]))
                .flatten()
                .map(|e| &e.frames[..])
                .unwrap_or(&[]);
            let before = i < prefix;
            allocs.push(Alloc {
                op: i,
                key: if before {
                    BEFORE_TRACE_KEY
                } else {
                    stack_key(frames)
                },
                bytes: *bytes,
                fixed: before || !freed.contains(id) || optimizer_stack(frames),
            });
        }
        // The blocks of the start state are a set, listed by address:
        // matched by size instead (the k-th smallest with the k-th
        // smallest), which pairs the same tensors when their sizes keep
        // their order.
        let before = allocs
            .iter()
            .take_while(|a| a.key == BEFORE_TRACE_KEY)
            .count();
        allocs[..before].sort_by_key(|a| (a.bytes, a.op));
        Ok(Sample {
            label,
            size,
            trace,
            allocs,
        })
    }

    /// Allocations of the trace (the start state's included).
    pub fn allocations(&self) -> usize {
        self.allocs.len()
    }

    /// The requested bytes of each allocation, in trace order.
    pub fn sizes(&self) -> Vec<u64> {
        self.allocs.iter().map(|a| a.bytes).collect()
    }

    /// Allocations the one-recording rule keeps at their size.
    pub fn fixed_allocations(&self) -> usize {
        self.allocs.iter().filter(|a| a.fixed).count()
    }

    /// This recording with every allocation the rule scales multiplied by
    /// `factor` (`reservoir replay --scale`), and how many were scaled.
    pub fn scaled(&self, factor: f64) -> Result<Synthesis, PredictError> {
        if factor.is_nan() || factor <= 0.0 || factor > MAX_EXTRAPOLATION as f64 {
            return Err(PredictError::BadFactor { factor });
        }
        let at = self.size as f64 * factor;
        let mut out = Synthesis::of(self, 0, at);
        for a in &self.allocs {
            let bytes = rule_bytes(a, factor);
            out.set(a, bytes, if a.fixed { RULE_FIXED } else { RULE_SCALED })?;
        }
        Ok(out)
    }
}

/// How an allocation kept by the rule is counted.
pub const RULE_FIXED: &str = "fixed (one recording)";
/// How an allocation scaled by the rule is counted.
pub const RULE_SCALED: &str = "scaled (one recording)";
/// How an allocation of a replayed recording is counted.
pub const RECORDED: &str = "recorded";

/// The rule's bytes for `a` at `factor` times its recording's size.
fn rule_bytes(a: &Alloc, factor: f64) -> f64 {
    if a.fixed {
        a.bytes as f64
    } else {
        a.bytes as f64 * factor
    }
}

/// The largest power of two up to 512 dividing every size.
pub(crate) fn granule(sizes: impl Iterator<Item = u64>) -> u64 {
    let mut g = 512u64;
    for s in sizes.filter(|&s| s > 0) {
        g = g.min(1 << s.trailing_zeros().min(9));
    }
    g
}

/// A synthesized trace, and how its allocations were sized.
#[derive(Clone, Debug)]
pub struct Synthesis {
    /// The trace (the base recording's, with new sizes), from a cold start.
    pub trace: RecordedTrace,
    /// The recording it was made from (an index of the samples).
    pub base: usize,
    /// Allocations by how they were sized: a [`LawKind`]'s formula,
    /// [`RULE_FIXED`], [`RULE_SCALED`] or [`RECORDED`].
    pub sized_by: BTreeMap<String, u64>,
    /// The requested bytes of each allocation, in trace order (as
    /// [`Sample::sizes`]).
    pub sizes: Vec<u64>,
    at: f64,
}

impl Synthesis {
    fn of(s: &Sample, base: usize, at: f64) -> Synthesis {
        let mut trace = s.trace.clone();
        trace.trace.header.push(format!(
            "predicted at size {at} from {} (size {})",
            s.label, s.size
        ));
        Synthesis {
            trace,
            base,
            sized_by: BTreeMap::new(),
            sizes: Vec::new(),
            at,
        }
    }

    /// Give allocation `a` `bytes` (rounded to its granule, at least one).
    fn set(&mut self, a: &Alloc, bytes: f64, how: &str) -> Result<(), PredictError> {
        self.set_in(a, bytes, granule(std::iter::once(a.bytes)), how)
    }

    fn set_in(&mut self, a: &Alloc, bytes: f64, g: u64, how: &str) -> Result<(), PredictError> {
        if bytes.is_nan() || bytes > MAX_CAPACITY as f64 {
            return Err(PredictError::TooLarge {
                at: self.at,
                op: a.op,
                bytes,
            });
        }
        let rounded = ((bytes / g as f64).round().max(1.0) as u64) * g;
        if let Some(Op::Alloc { bytes, .. }) = self.trace.trace.ops.get_mut(a.op) {
            *bytes = rounded;
        }
        self.sizes.push(rounded);
        *self.sized_by.entry(how.to_string()).or_default() += 1;
        Ok(())
    }
}

/// The largest size that fits a device ([`Predictor::largest_fitting`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "size")]
pub enum Largest {
    /// Not even size 1 fits.
    None,
    /// This size fits and the next does not.
    Size(u64),
    /// The largest size that may be asked ([`Predictor::max_at`]) fits.
    AtLeast(u64),
}

/// Recordings of one program at several sizes, matched.
#[derive(Clone, Debug)]
pub struct Predictor {
    samples: Vec<Sample>,
    /// `matches[b][o][i]`: the allocation of sample `o` matched with
    /// allocation `i` of sample `b`.
    matches: Vec<Vec<Vec<Option<usize>>>>,
}

impl Predictor {
    /// Match the allocations of every pair of recordings; refuses sizes
    /// given twice and recordings that do not look like one program.
    pub fn new(samples: Vec<Sample>) -> Result<Predictor, PredictError> {
        if samples.is_empty() {
            return Err(PredictError::NoSamples);
        }
        if samples.len() > MAX_SAMPLES {
            return Err(PredictError::TooManySamples {
                count: samples.len(),
                limit: MAX_SAMPLES,
            });
        }
        for (i, a) in samples.iter().enumerate() {
            if let Some(b) = samples[..i].iter().find(|b| b.size == a.size) {
                return Err(PredictError::SameSize {
                    size: a.size,
                    first: b.label.clone(),
                    second: a.label.clone(),
                });
            }
        }
        let keys: Vec<Vec<u64>> = samples
            .iter()
            .map(|s| s.allocs.iter().map(|a| a.key).collect())
            .collect();
        let n = samples.len();
        let mut matches = vec![vec![Vec::new(); n]; n];
        for b in 0..n {
            for o in b + 1..n {
                let pairs = align::match_keys(&keys[b], &keys[o]);
                let total = keys[b].len().max(keys[o].len());
                if pairs.len() * 2 < total {
                    return Err(PredictError::Mismatched {
                        first: samples[b].label.clone(),
                        second: samples[o].label.clone(),
                        matched: pairs.len(),
                        total,
                    });
                }
                let mut bo = vec![None; keys[b].len()];
                let mut ob = vec![None; keys[o].len()];
                for (i, j) in pairs {
                    bo[i] = Some(j);
                    ob[j] = Some(i);
                }
                matches[b][o] = bo;
                matches[o][b] = ob;
            }
        }
        Ok(Predictor { samples, matches })
    }

    /// The recordings, in the order given.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// For each allocation of recording `b`, the allocation of recording
    /// `o` matched with it (empty for `b == o`).
    pub fn matching(&self, b: usize, o: usize) -> &[Option<usize>] {
        &self.matches[b][o]
    }

    /// Allocations of recording `b` matched in recording `o`.
    pub fn matched(&self, b: usize, o: usize) -> usize {
        self.matches[b][o].iter().flatten().count()
    }

    /// The largest size that may be asked: [`MAX_EXTRAPOLATION`] times the
    /// largest recorded size.
    pub fn max_at(&self) -> u64 {
        let largest = self.samples.iter().map(|s| s.size).max().unwrap_or(1);
        largest.saturating_mul(MAX_EXTRAPOLATION)
    }

    /// The recording nearest `at` (the larger of two as near).
    fn base(&self, at: u64) -> usize {
        (0..self.samples.len())
            .min_by_key(|&i| {
                let s = self.samples[i].size;
                (s.abs_diff(at), std::cmp::Reverse(s))
            })
            .unwrap_or(0)
    }

    /// The trace at size `at` (see the module documentation).
    pub fn synthesize(&self, at: u64) -> Result<Synthesis, PredictError> {
        if at == 0 {
            return Err(PredictError::ZeroSize {
                what: "the asked size".into(),
            });
        }
        if at > self.max_at() {
            let largest = self.samples.iter().map(|s| s.size).max().unwrap_or(1);
            return Err(PredictError::TooFar {
                at,
                largest,
                limit: self.max_at(),
            });
        }
        let b = self.base(at);
        let base = &self.samples[b];
        let mut out = Synthesis::of(base, b, at as f64);
        if base.size == at {
            *out.sized_by.entry(RECORDED.into()).or_default() += base.allocs.len() as u64;
            out.sizes = base.sizes();
            return Ok(out);
        }
        let factor = at as f64 / base.size as f64;
        for (i, a) in base.allocs.iter().enumerate() {
            let mut points = vec![(base.size as f64, a.bytes as f64)];
            let mut sizes = vec![a.bytes];
            for (o, m) in self.matches[b].iter().enumerate() {
                if let Some(j) = m.get(i).copied().flatten() {
                    let other = &self.samples[o];
                    points.push((other.size as f64, other.allocs[j].bytes as f64));
                    sizes.push(other.allocs[j].bytes);
                }
            }
            let g = granule(sizes.into_iter());
            if points.len() < 2 {
                let how = if a.fixed { RULE_FIXED } else { RULE_SCALED };
                out.set_in(a, rule_bytes(a, factor), g, how)?;
            } else {
                let law = Law::fit(&points, g as f64);
                out.set_in(a, law.eval(at as f64), g, law.kind.formula())?;
            }
        }
        Ok(out)
    }

    /// The replay at size `at` with `setting` on a device of `capacity`
    /// bytes.
    pub fn replay(
        &self,
        at: u64,
        setting: &ReplaySetting,
        capacity: u64,
    ) -> Result<ReplayReport, PredictError> {
        let s = self.synthesize(at)?;
        replay_synthesis(&s, setting, capacity)
    }

    /// The largest size whose replay with `setting` meets no out-of-memory
    /// error on a device of `capacity` bytes, by bisection (the peak is
    /// taken to grow with the size); a size whose allocations exceed the
    /// largest device does not fit.
    pub fn largest_fitting(
        &self,
        setting: &ReplaySetting,
        capacity: u64,
    ) -> Result<Largest, PredictError> {
        let fits = |at: u64| -> Result<bool, PredictError> {
            match self.replay(at, setting, capacity) {
                Ok(r) => Ok(r.ooms == 0),
                Err(PredictError::TooLarge { .. }) => Ok(false),
                Err(e) => Err(e),
            }
        };
        let max = self.max_at();
        if fits(max)? {
            return Ok(Largest::AtLeast(max));
        }
        if !fits(1)? {
            return Ok(Largest::None);
        }
        let (mut lo, mut hi) = (1, max);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(Largest::Size(lo))
    }
}

/// Replay a synthesized trace with `setting` on a device of `capacity`
/// bytes.
pub fn replay_synthesis(
    s: &Synthesis,
    setting: &ReplaySetting,
    capacity: u64,
) -> Result<ReplayReport, PredictError> {
    let options = ReplayOptions::without_timeline(capacity);
    let (report, _) = replay_recorded(&s.trace, setting, &options, false, &mut |_| {})?;
    Ok(report)
}
