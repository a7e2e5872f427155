//! The heap allocator's invariant checker and its views: statistics recount
//! and the [`Snapshot`] model (heaps as segments, buffers and free space as
//! blocks).

use std::collections::BTreeSet;

use super::state::{BufState, State};
use super::types::PoolKind;
use crate::observe::snapshot::{Block, BlockState, Segment, SegmentType, Snapshot};
use crate::stats::{DeviceStats, StatType};
use crate::store::{BlockId, SegmentId};

impl State {
    /// Check: every heap tiled by buffers and free space (the store's own
    /// checker); heap available sizes; the pools' buffer and heap sets,
    /// byte and buffer counts exact; the pointer map, pending set and
    /// zombies exact; the totals and every current statistic equal to a
    /// recount.
    pub fn check(&self) -> Result<(), String> {
        self.store.check_tiling()?;
        let mut buffers = vec![BTreeSet::new(); 5];
        let mut heaps = vec![BTreeSet::new(); 5];
        let mut available = [0u64; 5];
        let mut allocated = [0u64; 5];
        let mut n_buffers = [0u32; 5];
        let mut pending_update = vec![BTreeSet::new(); 5];
        let (mut total, mut current) = (0u64, 0u64);
        let mut ptrs = 0usize;
        let (mut pending, mut zombies) = (BTreeSet::new(), BTreeSet::new());
        let mut stats = DeviceStats::default();
        for (h, heap) in &self.heaps {
            let h: SegmentId = *h;
            let seg = &self.store.segments[h];
            if !seg.live {
                return Err(format!("heap #{} is not a live segment", heap.id));
            }
            let pool = PoolKind::from_index(seg.pool);
            let pi = pool.index();
            let st = StatType::for_pool(pool.is_small());
            let mut live = 0;
            let mut has_zombie = false;
            for b in self.store.segment_blocks(h) {
                let block = &self.store.blocks[b];
                if !block.allocated {
                    if self.bufs.contains_key(&b) {
                        return Err(format!(
                            "free space at {:#x} has a buffer record",
                            block.addr
                        ));
                    }
                    continue;
                }
                let buf = self
                    .bufs
                    .get(&b)
                    .ok_or_else(|| format!("buffer at {:#x} has no record", block.addr))?;
                if block.size % self.alignment != 0 || (block.addr - seg.addr) % self.alignment != 0
                {
                    return Err(format!("buffer at {:#x} is not aligned", block.addr));
                }
                if buf.state == BufState::Zombie {
                    has_zombie = true;
                    zombies.insert(b);
                    continue;
                }
                live += 1;
                ptrs += 1;
                if self.ptrs.get(&block.addr) != Some(&b) {
                    return Err(format!(
                        "buffer at {:#x} is not in the pointer map",
                        block.addr
                    ));
                }
                allocated[pi] += block.size;
                n_buffers[pi] += 1;
                match buf.state {
                    BufState::Available => {
                        buffers[pi].insert((block.size, block.addr, b));
                        available[pi] += block.size;
                    }
                    BufState::InUse | BufState::PendingFree => {
                        current += block.size;
                        if buf.state == BufState::InUse {
                            stats.allocation.increase(st, 1);
                            stats.allocated_bytes.increase(st, block.size);
                        } else {
                            pending.insert(b);
                        }
                        stats.active.increase(st, 1);
                        stats.active_bytes.increase(st, block.size);
                        stats.requested_bytes.increase(st, buf.requested);
                    }
                    BufState::Zombie => unreachable!(),
                }
            }
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
            if heap.attached {
                heaps[pi].insert((heap.available, seg.addr, h));
                total += seg.size;
                stats.segment.increase(st, 1);
                stats.reserved_bytes.increase(st, seg.size);
                if has_zombie {
                    pending_update[pi].insert(h);
                }
            } else if !has_zombie {
                return Err(format!("released heap #{} has no busy range left", heap.id));
            }
        }
        if self.heaps.len() != self.store.segments.len() {
            return Err("a segment has no heap record".into());
        }
        for pool in PoolKind::ALL {
            let (pi, p) = (pool.index(), &self.pools[pool.index()]);
            let listed: BTreeSet<(u64, u64, BlockId)> = p.buffers.iter().copied().collect();
            if listed != buffers[pi] {
                return Err(format!(
                    "the {pool} pool's available buffers are not the available buffers"
                ));
            }
            let listed: BTreeSet<(u64, u64, SegmentId)> = p.heaps.iter().copied().collect();
            if listed != heaps[pi] {
                return Err(format!("the {pool} pool's heap set is not its heaps"));
            }
            if p.available_size != available[pi] || p.allocated_size != allocated[pi] {
                return Err(format!("the {pool} pool's byte counts are wrong"));
            }
            if p.n_buffers != n_buffers[pi] {
                return Err(format!("the {pool} pool's buffer count is wrong"));
            }
            if p.heaps_pending_update != pending_update[pi] {
                return Err(format!("the {pool} pool's heaps_pending_update is wrong"));
            }
        }
        if ptrs != self.ptrs.len() || self.bufs.len() != ptrs + zombies.len() {
            return Err("the pointer map or the buffer records hold dead buffers".into());
        }
        if pending != self.pending || zombies != self.zombies {
            return Err("the pending set or the zombies are wrong".into());
        }
        if total != self.total_allocated || current != self.current_allocated {
            return Err(format!(
                "totals: heaps {} (recount {total}), current {} (recount {current})",
                self.total_allocated, self.current_allocated
            ));
        }
        for ((name, want), (_, got)) in stats.arrays().into_iter().zip(self.stats.arrays()) {
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
        ids.sort_by_key(|&h| self.store.segments[h].addr);
        let segments = ids
            .into_iter()
            .map(|h| {
                let seg = &self.store.segments[h];
                let pool = PoolKind::from_index(seg.pool);
                let blocks: Vec<Block> = self
                    .store
                    .segment_blocks(h)
                    .map(|b| {
                        let block = &self.store.blocks[b];
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
                            address: Some(block.addr),
                            size: block.size,
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
                    address: seg.addr,
                    total_size: seg.size,
                    allocated_size,
                    active_size,
                    requested_size: Some(requested_size),
                    stream: seg.stream,
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
