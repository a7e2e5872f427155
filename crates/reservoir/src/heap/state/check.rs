//! The heap allocator's invariant checker and its views: statistics recount
//! and the [`Snapshot`] model (heaps as segments, buffers and free space as
//! blocks). The checker checks exactly the invariants written at the top of
//! `state/mod.rs`, each marked with its number below.

use std::collections::BTreeSet;

use super::{BufState, Heap, State};
use crate::heap::types::PoolKind;
use crate::observe::snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use crate::stats::{DeviceStats, StatType};
use crate::store::{BlockId, SegmentId};

/// What [`State::check`] recounts from the heaps and their buffers, to
/// compare with what the state keeps. Indexed by pool where per pool.
struct Recount {
    buffers: Vec<BTreeSet<(u64, u64, BlockId)>>,
    heaps: Vec<BTreeSet<(u64, u64, SegmentId)>>,
    available: [u64; 5],
    allocated: [u64; 5],
    n_buffers: [u32; 5],
    pending_update: Vec<BTreeSet<SegmentId>>,
    total: u64,
    current: u64,
    ptrs: usize,
    pending: BTreeSet<BlockId>,
    zombies: BTreeSet<BlockId>,
    stats: DeviceStats,
}

impl Default for Recount {
    fn default() -> Self {
        Recount {
            buffers: vec![BTreeSet::new(); 5],
            heaps: vec![BTreeSet::new(); 5],
            available: [0; 5],
            allocated: [0; 5],
            n_buffers: [0; 5],
            pending_update: vec![BTreeSet::new(); 5],
            total: 0,
            current: 0,
            ptrs: 0,
            pending: BTreeSet::new(),
            zombies: BTreeSet::new(),
            stats: DeviceStats::default(),
        }
    }
}

impl State {
    /// Check the invariants of `state/mod.rs`, 1 to 9: every heap tiled by
    /// buffers and free space (the store's own checker); heap counts and
    /// available sizes; the pools' buffer and heap sets, byte and buffer
    /// counts exact; the pointer map, pending set and zombies exact; the
    /// totals and every current statistic equal to a recount.
    pub fn check(&self) -> Result<(), String> {
        // 1: the tiling.
        self.store.check_tiling()?;
        let mut r = Recount::default();
        for (&h, heap) in &self.heaps {
            self.recount_heap(h, heap, &mut r)?;
        }
        // 1: every record is a segment (each segment's record: above).
        if self.heaps.len() != self.store.segment_count() {
            return Err("a segment has no heap record".into());
        }
        self.check_pools(&r)?;
        self.check_totals(&r)
    }

    /// Recount heap `h`: its buffers into `r`, then its own buffer count,
    /// available size and pool membership.
    fn recount_heap(&self, h: SegmentId, heap: &Heap, r: &mut Recount) -> Result<(), String> {
        let seg = self.store.segment(h);
        // 1: a live segment.
        if !seg.live() {
            return Err(format!("heap #{} is not a live segment", heap.id));
        }
        let pool = PoolKind::from_pool(seg.pool());
        let pi = pool.index();
        let st = StatType::for_pool(pool.is_small());
        let mut live = 0;
        let mut has_zombie = false;
        for b in self.store.segment_blocks(h) {
            let block = self.store.block(b);
            // 2: a record exactly for the allocated blocks, aligned.
            if !block.allocated() {
                if self.bufs.contains_key(&b) {
                    return Err(format!(
                        "free space at {:#x} has a buffer record",
                        block.addr()
                    ));
                }
                continue;
            }
            let buf = self
                .bufs
                .get(&b)
                .ok_or_else(|| format!("buffer at {:#x} has no record", block.addr()))?;
            if block.size() % self.alignment != 0
                || (block.addr() - seg.addr()) % self.alignment != 0
            {
                return Err(format!("buffer at {:#x} is not aligned", block.addr()));
            }
            if buf.state == BufState::Zombie {
                has_zombie = true;
                r.zombies.insert(b);
                continue;
            }
            live += 1;
            r.ptrs += 1;
            // 3: in the pointer map under its address.
            if self.ptrs.get(&block.addr()) != Some(&b) {
                return Err(format!(
                    "buffer at {:#x} is not in the pointer map",
                    block.addr()
                ));
            }
            r.allocated[pi] += block.size();
            r.n_buffers[pi] += 1;
            match buf.state {
                BufState::Available => {
                    r.buffers[pi].insert((block.size(), block.addr(), b));
                    r.available[pi] += block.size();
                }
                BufState::InUse | BufState::PendingFree => {
                    r.current += block.size();
                    if buf.state == BufState::InUse {
                        r.stats.allocation.increase(st, 1);
                        r.stats.allocated_bytes.increase(st, block.size());
                    } else {
                        r.pending.insert(b);
                    }
                    r.stats.active.increase(st, 1);
                    r.stats.active_bytes.increase(st, block.size());
                    r.stats.requested_bytes.increase(st, buf.requested);
                }
                BufState::Zombie => unreachable!(),
            }
        }
        // 5: the heap's counts.
        if heap.n_buffers != live {
            return Err(format!(
                "heap #{} counts {} buffers, has {live}",
                heap.id, heap.n_buffers
            ));
        }
        if heap.available != self.free_range_max(h) {
            return Err(format!(
                "heap #{} says {} bytes available, its largest free range is {}",
                heap.id,
                heap.available,
                self.free_range_max(h)
            ));
        }
        // 6: an attached heap in its pool's sets, a detached one holds a
        // zombie.
        if heap.attached {
            r.heaps[pi].insert((heap.available, seg.addr(), h));
            r.total += seg.size();
            r.stats.segment.increase(st, 1);
            r.stats.reserved_bytes.increase(st, seg.size());
            if has_zombie {
                r.pending_update[pi].insert(h);
            }
        } else if !has_zombie {
            return Err(format!("released heap #{} has no busy range left", heap.id));
        }
        Ok(())
    }

    /// Each pool's buffer and heap sets, byte and buffer counts and heaps
    /// pending update against the recount (invariants 6 and 7).
    fn check_pools(&self, r: &Recount) -> Result<(), String> {
        for pool in PoolKind::ALL {
            let (pi, p) = (pool.index(), &self.pools[pool.index()]);
            // 7: the available buffers and the pool's counts.
            let listed: BTreeSet<(u64, u64, BlockId)> = p.buffers.iter().copied().collect();
            if listed != r.buffers[pi] {
                return Err(format!(
                    "the {pool} pool's available buffers are not the available buffers"
                ));
            }
            let listed: BTreeSet<(u64, u64, SegmentId)> = p.heaps.iter().copied().collect();
            // 6: the heap set.
            if listed != r.heaps[pi] {
                return Err(format!("the {pool} pool's heap set is not its heaps"));
            }
            if p.available_size != r.available[pi] || p.allocated_size != r.allocated[pi] {
                return Err(format!("the {pool} pool's byte counts are wrong"));
            }
            if p.n_buffers != r.n_buffers[pi] {
                return Err(format!("the {pool} pool's buffer count is wrong"));
            }
            // 6: the heaps holding zombies.
            if p.heaps_pending_update != r.pending_update[pi] {
                return Err(format!("the {pool} pool's heaps_pending_update is wrong"));
            }
        }
        Ok(())
    }

    /// The pointer map, buffer records, pending set, zombies, totals and
    /// every current statistic against the recount (invariants 3, 4, 8, 9).
    fn check_totals(&self, r: &Recount) -> Result<(), String> {
        // 3: no other pointer, no other record.
        if r.ptrs != self.ptrs.len() || self.bufs.len() != r.ptrs + r.zombies.len() {
            return Err("the pointer map or the buffer records hold dead buffers".into());
        }
        // 4: the waiting sets.
        if r.pending != self.pending || r.zombies != self.zombies {
            return Err("the pending set or the zombies are wrong".into());
        }
        // 8: the totals.
        if r.total != self.total_allocated || r.current != self.current_allocated {
            return Err(format!(
                "totals: heaps {} (recount {}), current {} (recount {})",
                self.total_allocated, r.total, self.current_allocated, r.current
            ));
        }
        // 9: every current statistic.
        for ((name, want), (_, got)) in r.stats.arrays().into_iter().zip(self.stats.arrays()) {
            for t in StatType::ALL {
                if want.get(t).current != got.get(t).current {
                    return Err(format!(
                        "stat {name}.{}.current is {}, recount {}",
                        t.name(),
                        got.get(t).current,
                        want.get(t).current
                    ));
                }
            }
        }
        Ok(())
    }

    /// The attached heaps as snapshot segments, by address.
    pub fn snapshot(&self) -> Snapshot {
        let mut ids: Vec<SegmentId> = self
            .heaps
            .iter()
            .filter(|(_, h)| h.attached)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_by_key(|&h| self.store.segment(h).addr());
        let segments = ids
            .into_iter()
            .map(|h| {
                let seg = self.store.segment(h);
                let pool = PoolKind::from_pool(seg.pool());
                let blocks: Vec<Block> = self
                    .store
                    .segment_blocks(h)
                    .map(|b| {
                        let block = self.store.block(b);
                        let (state, requested) = match self.bufs.get(&b) {
                            None => (BlockState::Inactive, None),
                            Some(buf) => (
                                match buf.state {
                                    BufState::InUse => BlockState::ActiveAllocated,
                                    BufState::Available => BlockState::Inactive,
                                    BufState::PendingFree | BufState::Zombie => {
                                        BlockState::ActivePendingFree
                                    }
                                },
                                Some(buf.requested),
                            ),
                        };
                        Block {
                            address: Some(block.addr()),
                            size: block.size(),
                            requested_size: requested,
                            state,
                            ..Block::default()
                        }
                    })
                    .collect();
                let sum = |f: &dyn Fn(&Block) -> bool| -> u64 {
                    blocks.iter().filter(|b| f(b)).map(|b| b.size).sum()
                };
                let allocated_size = sum(&|b| b.state == BlockState::ActiveAllocated);
                let active_size = sum(&|b| b.state != BlockState::Inactive);
                let requested_size = blocks
                    .iter()
                    .filter(|b| b.state != BlockState::Inactive)
                    .map(|b| b.requested_size.unwrap_or(0))
                    .sum();
                Segment {
                    address: seg.addr(),
                    total_size: seg.size(),
                    allocated_size,
                    active_size,
                    requested_size: Some(requested_size),
                    stream: seg.stream(),
                    segment_type: if pool.is_small() {
                        SegmentType::Small
                    } else {
                        SegmentType::Large
                    },
                    segment_pool_id: Some((0, 0)),
                    is_expandable: Some(false),
                    blocks,
                    ..Segment::default()
                }
            })
            .collect();
        Snapshot {
            segments,
            ..Snapshot::default()
        }
    }
}
