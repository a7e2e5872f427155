//! Where a recorded trace's replay starts: from the recorded start state
//! (the default, for fidelity) or cold, from an empty allocator
//! ([`StartMode`], [`RecordedTrace::with_start`]).
//!
//! A cold start turns the blocks live at the first entry into allocations
//! made before the trace's first op, in their recorded order (the order of
//! their addresses; for a source without device addresses, the order in
//! which the source listed them), each asking for its requested bytes on
//! its segment's stream. No recorded segment is inherited and no address is
//! scripted, so every policy builds its own segments from nothing: this is
//! the start on which policies are compared. The bytes callers hold (the
//! `requested_bytes` statistic) follow the same sequence whatever the policy,
//! so its peak, [`ReplayReport::peak_live`](crate::replay::ReplayReport::peak_live),
//! is the yardstick for peak reserved bytes.

use std::str::FromStr;

use super::RecordedTrace;
use crate::oracle_trace::{AllocId, Op, PoolPair, StreamName, Trace};
use crate::replay::StartState;
use reservoir::backend::StreamId;

/// Where a recorded trace's replay starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StartMode {
    /// From the recorded start state: the segments and blocks PyTorch held
    /// at the first entry are seeded at their recorded addresses (exact
    /// replay; the default).
    #[default]
    Recorded,
    /// From an empty allocator: the blocks live at the first entry are
    /// allocated first, then the trace runs; no recorded segment is
    /// inherited.
    Cold,
}

impl StartMode {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            StartMode::Recorded => "recorded",
            StartMode::Cold => "cold",
        }
    }
}

impl std::fmt::Display for StartMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A start mode name that is neither `recorded` nor `cold`.
#[derive(Debug, thiserror::Error)]
#[error("unknown start mode {0:?}: expected `recorded` or `cold`")]
pub struct UnknownStartMode(pub String);

impl FromStr for StartMode {
    type Err = UnknownStartMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "recorded" => Ok(StartMode::Recorded),
            "cold" => Ok(StartMode::Cold),
            other => Err(UnknownStartMode(other.to_string())),
        }
    }
}

/// A block live at the first entry, to allocate before the trace.
struct LiveBlock {
    /// Recorded address (0 when unknown).
    addr: u64,
    id: AllocId,
    stream: StreamId,
    requested: u64,
    /// Its segment's private pool, `(0, 0)` for the default pool.
    pool: PoolPair,
}

impl RecordedTrace {
    /// Blocks live at the first entry (allocated first on a cold start).
    pub fn live_at_start_count(&self) -> usize {
        let plain = self.start.segments.iter().map(|s| s.1.blocks.len());
        let expandable = self.start.expandable.iter().map(|x| x.1.blocks.len());
        plain.chain(expandable).sum()
    }

    /// The blocks live at the first entry, in recorded order: by address,
    /// or, when a segment's address is unknown (recorded as 0), in the
    /// order the source listed them (their ids).
    fn live_at_start(&self) -> Vec<LiveBlock> {
        // The blocks of plain segments come first, in segment order.
        let plain_pools = self
            .start
            .segments
            .iter()
            .enumerate()
            .flat_map(|(k, (_, s, _))| {
                let pool = self.start.segment_pools.get(&k).copied();
                std::iter::repeat(pool.unwrap_or((0, 0))).take(s.blocks.len())
            });
        let pools = plain_pools.chain(std::iter::repeat((0, 0)));
        let mut out: Vec<LiveBlock> = self
            .start
            .live_blocks()
            .zip(pools)
            .map(|((base, stream, b, id), pool)| LiveBlock {
                addr: if base == 0 { 0 } else { base + b.offset },
                id,
                stream,
                requested: b.requested_size,
                pool,
            })
            .collect();
        if out.iter().all(|b| b.addr != 0) {
            out.sort_by_key(|b| (b.addr, b.id));
        } else {
            out.sort_by_key(|b| b.id);
        }
        out
    }

    /// This trace, to replay from `mode`: itself for
    /// [`StartMode::Recorded`]; for [`StartMode::Cold`], a trace whose first
    /// ops allocate the blocks live at the first entry (see the module
    /// documentation), with an empty start state, no scripted address, no
    /// recorded segment events to compare with (no fidelity), and a capacity
    /// only when the recording ran out of memory (the device's real size;
    /// a capacity inferred from expandable reservations only served to
    /// place them at their recorded addresses).
    pub fn with_start(self, mode: StartMode) -> RecordedTrace {
        if mode == StartMode::Recorded {
            return self;
        }
        let live = self.live_at_start();
        let mut ops = Vec::with_capacity(live.len() + self.trace.ops.len());
        let mut lines = Vec::with_capacity(live.len() + self.trace.ops.len());
        // Blocks of a private pool's segments are allocated in that pool;
        // every private pool of the start state exists before the trace
        // (it may release it), then allocations go to the default pool.
        let mut routed = (0, 0);
        let mut unused: std::collections::BTreeSet<PoolPair> =
            self.start.segment_pools.values().copied().collect();
        for b in &live {
            if b.pool != routed {
                routed = b.pool;
                unused.remove(&routed);
                ops.push(Op::UsePool { pool: routed });
                lines.push(0);
            }
            ops.push(Op::Alloc {
                id: b.id,
                bytes: b.requested,
                stream: Some(StreamName::new(b.stream.0.to_string())),
            });
            lines.push(0);
        }
        for pool in unused {
            routed = pool;
            ops.push(Op::UsePool { pool });
            lines.push(0);
        }
        if routed != (0, 0) {
            ops.push(Op::UsePool { pool: (0, 0) });
            lines.push(0);
        }
        ops.extend(self.trace.ops);
        lines.extend(self.trace.lines);
        let mut header = self.trace.header;
        header.push(format!(
            "cold start: the first {} ops allocate the blocks live at the first entry",
            live.len()
        ));
        let mut trace = Trace::from_ops(ops, header);
        trace.lines = lines;
        RecordedTrace {
            device: self.device,
            trace,
            start: StartState {
                device: self.start.device,
                literal_streams: true,
                address_order: self.start.address_order,
                ..StartState::default()
            },
            segment_events: Vec::new(),
            placements: Vec::new(),
            ooms: self.ooms,
            capacity: if self.ooms > 0 { self.capacity } else { None },
            peak_reserved: self.peak_reserved,
            peak_allocated: self.peak_allocated,
            empty_caches: self.empty_caches,
            sites: self.sites,
            segments_known: false,
        }
    }
}
