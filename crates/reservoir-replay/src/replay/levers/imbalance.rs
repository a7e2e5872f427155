//! The imbalance lever: for a file with several devices or a folder of
//! ranks, the heaviest device (or rank) made to carry the mean share of
//! the work, and its trace replayed so.
//!
//! The caller (`reservoir replay`) gives each device's peaks, from the
//! replays it already ran (its first setting), and its *work*: the most
//! bytes of activations and temporaries live at once ([`work_bytes`]: what
//! a micro-batch or a share of the data sets). When the heaviest device's
//! peak reserved is at least [`IMBALANCE_RATIO`] times the mean of the
//! others' ([`Imbalance::of`]), its activations and temporaries are scaled
//! by the mean work of all the devices over its own (rounded as the
//! micro-batch lever rounds), and its trace replayed once more with the
//! levers' setting: one replay (two when it does not fit).

use rustc_hash::FxHashMap;

use super::{resized, Lever, LeverInput};
use crate::oracle_trace::{AllocId, Op, Trace};
use crate::replay::roles::{Role, Roles};
use crate::replay::sites::Sites;
use crate::replay::ReplayError;
use reservoir::format::format_size;

/// The heaviest device is imbalanced when its peak reserved is at least
/// `IMBALANCE_RATIO.0 / IMBALANCE_RATIO.1` (1.25) times the mean peak
/// reserved of the others.
pub const IMBALANCE_RATIO: (u64, u64) = (5, 4);

/// Other devices named one by one in the text, at most (more are given by
/// their mean and the lightest).
const NAMED: usize = 3;

/// One device, or rank, of an input with several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its name in the text: `device 1`, `rank 3`.
    pub name: String,
    /// Peak reserved bytes of its replay.
    pub peak_reserved: u64,
    /// Peak allocated bytes of the same replay.
    pub peak_allocated: u64,
    /// Its work: the most bytes of activations and temporaries live at once
    /// ([`work_bytes`]).
    pub work: u64,
}

/// Devices (or ranks) of one input whose heaviest is imbalanced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imbalance {
    /// Every device, in the input's order.
    pub peers: Vec<Peer>,
    /// The heaviest (the largest peak reserved; the first on ties).
    pub heaviest: usize,
}

impl Imbalance {
    /// The imbalance of `peers`: `None` for fewer than 2, or when the
    /// heaviest's peak reserved is below [`IMBALANCE_RATIO`] times the mean
    /// of the others'.
    pub fn of(peers: Vec<Peer>) -> Option<Imbalance> {
        if peers.len() < 2 {
            return None;
        }
        let mut heaviest = 0;
        for (i, p) in peers.iter().enumerate() {
            if p.peak_reserved > peers[heaviest].peak_reserved {
                heaviest = i;
            }
        }
        let others: u128 = peers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != heaviest)
            .map(|(_, p)| u128::from(p.peak_reserved))
            .sum();
        let n = (peers.len() - 1) as u128;
        // heaviest >= ratio * others / n, in integers.
        let (num, den) = (u128::from(IMBALANCE_RATIO.0), u128::from(IMBALANCE_RATIO.1));
        let imbalanced = u128::from(peers[heaviest].peak_reserved) * n * den >= others * num
            && peers[heaviest].peak_reserved > 0;
        imbalanced.then_some(Imbalance { peers, heaviest })
    }

    /// The mean work of the devices.
    fn mean_work(&self) -> u64 {
        let sum: u128 = self.peers.iter().map(|p| u128::from(p.work)).sum();
        (sum / self.peers.len() as u128) as u64
    }

    /// The other devices and their peaks, in words.
    fn others_words(&self) -> String {
        let others: Vec<&Peer> = self
            .peers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != self.heaviest)
            .map(|(_, p)| p)
            .collect();
        if others.len() <= NAMED {
            let named: Vec<String> = others
                .iter()
                .map(|p| format!("{} at {}", p.name, format_size(p.peak_reserved)))
                .collect();
            return named.join(", ");
        }
        let sum: u128 = others.iter().map(|p| u128::from(p.peak_reserved)).sum();
        let mean = (sum / others.len() as u128) as u64;
        let lightest = others
            .iter()
            .min_by_key(|p| p.peak_reserved)
            .map_or(String::new(), |p| {
                format!(
                    ", the lightest {} at {}",
                    p.name,
                    format_size(p.peak_reserved)
                )
            });
        format!(
            "the other {} at {} on average{lightest}",
            others.len(),
            format_size(mean)
        )
    }
}

/// The work of `trace`: the most bytes of activations and temporaries
/// (by [`Roles`]) live at once.
pub fn work_bytes(trace: &Trace, sites: &Sites) -> u64 {
    let roles = Roles::classify(trace, sites);
    let mut live: FxHashMap<AllocId, u64> = FxHashMap::default();
    let (mut now, mut peak) = (0u64, 0u64);
    for op in &trace.ops {
        match op {
            Op::Alloc { id, bytes, .. }
                if matches!(roles.role(*id).0, Role::Activations | Role::Temporaries) =>
            {
                // An id allocated again replaces its earlier bytes.
                now = now - live.insert(*id, *bytes).unwrap_or(0) + bytes;
                peak = peak.max(now);
            }
            Op::Free { id } => now -= live.remove(id).unwrap_or(0),
            _ => {}
        }
    }
    peak
}

/// The lever of moving work off the heaviest device, when `input` is its
/// trace ([`LeverInput::imbalance`]) and its work is above the mean.
pub(super) fn imbalance(
    input: &LeverInput<'_>,
    roles: &Roles,
) -> Result<Option<Lever>, ReplayError> {
    let Some(im) = input.imbalance else {
        return Ok(None);
    };
    let heavy = &im.peers[im.heaviest];
    let mean = im.mean_work();
    if heavy.work == 0 || mean >= heavy.work {
        return Ok(None);
    }
    let (t, count, bytes) = resized(
        input.trace,
        roles,
        &[Role::Activations, Role::Temporaries],
        mean,
        heavy.work,
    );
    if count == 0 {
        return Ok(None);
    }
    let o = input.outcome(&t)?;
    // `devices` or `ranks`: the first word of the names.
    let kind = heavy.name.split(' ').next().unwrap_or("device");
    let what = format!(
        "{} peaks at {} reserved ({} allocated), {}; moving work so {} carries the mean share of the {} {kind}s (its activations and temporaries peak at {} live, the mean is {}): its {count} activation and temporary allocations ({} in all) made {:.2} of their size, every other allocation kept",
        heavy.name,
        format_size(heavy.peak_reserved),
        format_size(heavy.peak_allocated),
        im.others_words(),
        heavy.name,
        im.peers.len(),
        format_size(heavy.work),
        format_size(mean),
        format_size(bytes),
        mean as f64 / heavy.work as f64,
    );
    Ok(Some(input.lever("imbalance", what, o)))
}
