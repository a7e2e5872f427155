//! What a replay starts from: the allocator state of a trace that starts
//! mid-run ([`StartState`]) and the names of its streams ([`StreamTable`]).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::oracle_trace::{AllocId, PoolPair, StreamName};
use reservoir::backend::StreamId;
use reservoir::caching::{SeededBlock, SeededExpandable, SeededSegment};

/// What the allocator holds before the first op of a trace that starts
/// mid-run (a recorded snapshot's trace, see [`recorded`](super::recorded)), and how the
/// device behaves to reproduce a recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StartState {
    /// Segments to seed, in increasing address order: each with the
    /// address the device should give it and the trace id of each of its
    /// allocated blocks (parallel to `SeededSegment::blocks`).
    pub segments: Vec<(u64, SeededSegment, Vec<AllocId>)>,
    /// Expandable segments to seed after `segments`, in increasing address
    /// order: each with the base address its reservation should get and the
    /// trace id of each allocated block (parallel to
    /// `SeededExpandable::blocks`).
    pub expandable: Vec<(u64, SeededExpandable, Vec<AllocId>)>,
    /// Addresses the device hands out for the trace's new segments, in
    /// order, after the seeded ones (see [`AddressPolicy::Scripted`](reservoir::sim::AddressPolicy::Scripted)).
    pub scripted_addresses: Vec<u64>,
    /// Stream names are numbers: use them as the [`StreamId`]s (recorded
    /// `cudaStream_t` values) instead of numbering streams in first-use
    /// order. The order of streams then matches the recording (trap 2 of
    /// the replay-fidelity notes).
    pub literal_streams: bool,
    /// Log the device's calls and each allocation's address, for a fidelity
    /// report ([`Replay::segment_calls`](super::Replay::segment_calls),
    /// [`Replay::placements`](super::Replay::placements)).
    pub record_placements: bool,
    /// Break best-fit ties by address, as PyTorch's source does and
    /// recorded traces show (see
    /// [`Seeder::rank_segments_by_address`](reservoir::caching::Seeder::rank_segments_by_address)).
    pub address_order: bool,
    /// The private pool (a recorded `segment_pool_id` other than `(0, 0)`:
    /// a `torch.cuda.MemPool`, a CUDA graph's pool) of each segment of
    /// `segments` that has one, by index in `segments`; the others are in
    /// the default pool. Such a pool exists at the start with one use (its
    /// owner), as [`Seeder::seed_segment_in_pool`](reservoir::caching::Seeder::seed_segment_in_pool) makes it.
    pub segment_pools: BTreeMap<usize, PoolPair>,
    /// The recorded device's index: the allocator serves it, so its
    /// messages name it (`GPU 1` in an out-of-memory message of device 1).
    pub device: u32,
}

impl StartState {
    /// This start state without the placements and the device-call log
    /// (`record_placements` off), for replays that only measure.
    pub fn quiet(&self) -> StartState {
        StartState {
            record_placements: false,
            ..self.clone()
        }
    }

    /// Every allocated block it seeds, those of `segments` first, then those
    /// of `expandable`: its segment's base address and stream, the block,
    /// and its trace id.
    pub fn live_blocks(&self) -> impl Iterator<Item = (u64, StreamId, &SeededBlock, AllocId)> {
        let plain = self
            .segments
            .iter()
            .map(|(base, s, ids)| (*base, s.stream, &s.blocks, ids));
        let expandable = self
            .expandable
            .iter()
            .map(|(base, x, ids)| (*base, x.stream, &x.blocks, ids));
        plain
            .chain(expandable)
            .flat_map(|(base, stream, blocks, ids)| {
                blocks
                    .iter()
                    .zip(ids)
                    .map(move |(b, &id)| (base, stream, b, id))
            })
    }
}

/// Stream names to [`StreamId`]s: the one place where that mapping lives.
#[derive(Clone, Debug, Default)]
pub struct StreamTable {
    ids: FxHashMap<String, StreamId>,
    order: Vec<(String, StreamId)>,
    literal: bool,
}

impl StreamTable {
    /// An empty table.
    pub fn new() -> Self {
        StreamTable::default()
    }

    /// An empty table that maps names that are numbers to those numbers
    /// (other names are numbered as [`resolve`](Self::resolve) says, from
    /// `1 << 63` on so they cannot collide).
    pub fn literal() -> Self {
        StreamTable {
            literal: true,
            ..StreamTable::default()
        }
    }

    /// The id of `name`: [`StreamId::DEFAULT`] for `0` and `default`, else the
    /// id given at its first use, numbered 1, 2, ... in first-use order.
    /// The second value is true when `name` was not known before.
    pub fn resolve(&mut self, name: &StreamName) -> (StreamId, bool) {
        if name.is_default() {
            return (StreamId::DEFAULT, false);
        }
        if let Some(&id) = self.ids.get(name.as_str()) {
            return (id, false);
        }
        let id = match name.as_str().parse::<u64>() {
            Ok(v) if self.literal => StreamId(v),
            _ if self.literal => StreamId((1 << 63) + self.order.len() as u64 + 1),
            _ => StreamId(self.order.len() as u64 + 1),
        };
        self.ids.insert(name.as_str().to_string(), id);
        self.order.push((name.as_str().to_string(), id));
        (id, true)
    }

    /// The id of a known name (`None` if it was never resolved; the default
    /// stream is always known).
    pub fn get(&self, name: &StreamName) -> Option<StreamId> {
        if name.is_default() {
            return Some(StreamId::DEFAULT);
        }
        self.ids.get(name.as_str()).copied()
    }

    /// The named streams in first-use order, with their ids.
    pub fn streams(&self) -> &[(String, StreamId)] {
        &self.order
    }
}
