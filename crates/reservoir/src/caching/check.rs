//! The invariant checker: walks every segment, pool and counter and compares
//! them with a recount. Tests, property tests and fuzzing run it after every
//! operation.

use std::collections::HashMap;

use super::state::DeviceState;
use crate::observe::snapshot::BlockState;
use crate::stats::{DeviceStats, StatArray, StatType};
use crate::store::BlockId;

/// A broken invariant, with what was expected and what was found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("allocator invariant violated: {0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(InvariantViolation(format!($($arg)*)));
        }
    };
}

impl DeviceState {
    pub(crate) fn block_state(&self, id: BlockId) -> BlockState {
        let b = &self.store.blocks[id];
        if b.allocated {
            BlockState::ActiveAllocated
        } else if b.event_count > 0 || !b.stream_uses.is_empty() {
            BlockState::ActivePendingFree
        } else {
            BlockState::Inactive
        }
    }

    pub(crate) fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_contexts()?;
        self.store.check_tiling().map_err(InvariantViolation)?;
        let summary = self.layout_summary();
        let counted = crate::observe::snapshot::LayoutSummary::of(&self.segment_models(None));
        ensure!(
            summary == counted,
            "layout summary {summary:?} differs from a count of the segments {counted:?}"
        );
        let mut recount = DeviceStats::default();
        let mut reserved = 0u64;
        let mut pool_members = 0usize;
        let mut unmapped_members = 0usize;
        let mut pending: HashMap<BlockId, u32> = HashMap::new();
        for queue in self.events.queues.values() {
            for &(_, id) in queue {
                *pending.entry(id).or_default() += 1;
            }
        }
        for (sid, seg) in self.store.segments.items.iter().enumerate() {
            if !seg.live {
                continue;
            }
            let sid = sid as u32;
            let st = StatType::for_pool(self.pools[seg.pool as usize].is_small);
            let expandable = seg.expandable.as_deref();
            if expandable.is_none() {
                // Expandable segments never count as segments (spec 1.11).
                recount.segment.increase(st, 1);
                recount.reserved_bytes.increase(st, seg.size);
                reserved += seg.size;
            }
            // (free, mapped) of the previous block, to find unmerged neighbours.
            let mut prev_free: Option<bool> = None;
            for id in self.store.segment_blocks(sid) {
                let b = &self.store.blocks[id];
                ensure!(b.size % 512 == 0, "block {:#x} has size {}", b.addr, b.size);
                ensure!(
                    b.expandable == expandable.is_some(),
                    "block {:#x} disagrees with its segment about being expandable",
                    b.addr
                );
                if let Some(e) = expandable {
                    let page = e.page_size;
                    let first = (b.addr - seg.addr) / page;
                    let last = (b.addr + b.size - seg.addr).div_ceil(page);
                    for pg in first..last {
                        let is_mapped = e.pages.get(pg as usize).copied().unwrap_or(false);
                        // A block boundary may fall inside a page only between mapped blocks.
                        ensure!(
                            is_mapped == b.mapped,
                            "page {pg} of expandable segment {:#x} is {} under a {} block at {:#x}",
                            seg.addr,
                            if is_mapped { "mapped" } else { "unmapped" },
                            if b.mapped { "mapped" } else { "unmapped" },
                            b.addr
                        );
                    }
                    if b.mapped {
                        recount.reserved_bytes.increase(st, b.size);
                        reserved += b.size;
                    }
                } else {
                    ensure!(
                        b.mapped,
                        "block {:#x} of a plain segment is unmapped",
                        b.addr
                    );
                }
                if !b.mapped {
                    let key = super::pools::UnmappedKey {
                        stream: b.stream,
                        addr: b.addr,
                        id,
                    };
                    ensure!(
                        self.pools[b.pool as usize].unmapped.contains(&key),
                        "unmapped block {:#x} missing from the unmapped set",
                        b.addr
                    );
                    ensure!(
                        !b.allocated && b.event_count == 0,
                        "unmapped block {:#x} in use",
                        b.addr
                    );
                    ensure!(
                        prev_free != Some(false),
                        "adjacent unmapped blocks at {:#x}",
                        b.addr
                    );
                    unmapped_members += 1;
                    prev_free = Some(false);
                    continue;
                }
                let in_map = self.allocated.get(&b.addr) == Some(&id);
                let key = super::pools::FreeKey::new(
                    b.stream,
                    b.size,
                    self.store.segments[b.segment].seq,
                    b.addr,
                    id,
                );
                let in_pool = self.pools[b.pool as usize].blocks.contains(&key);
                let events = pending.get(&id).copied().unwrap_or(0);
                ensure!(
                    events == b.event_count,
                    "block {:#x}: event_count {} but {} queued events",
                    b.addr,
                    b.event_count,
                    events
                );
                let state = self.block_state(id);
                match state {
                    BlockState::ActiveAllocated => {
                        ensure!(
                            in_map,
                            "allocated block {:#x} missing from the pointer map",
                            b.addr
                        );
                        ensure!(!in_pool, "allocated block {:#x} is in a free list", b.addr);
                        recount.allocation.increase(st, 1);
                        recount.allocated_bytes.increase(st, b.size);
                        if b.size >= self.config.max_split_size {
                            recount.oversize_allocations.increase(1);
                        }
                    }
                    BlockState::ActivePendingFree => {
                        ensure!(!in_map, "pending block {:#x} is in the pointer map", b.addr);
                        ensure!(!in_pool, "pending block {:#x} is in a free list", b.addr);
                    }
                    BlockState::Inactive => {
                        ensure!(!in_map, "free block {:#x} is in the pointer map", b.addr);
                        ensure!(
                            in_pool,
                            "free block {:#x} missing from its free list",
                            b.addr
                        );
                        ensure!(
                            prev_free != Some(true),
                            "adjacent free blocks at {:#x} were not merged",
                            b.addr
                        );
                        pool_members += 1;
                        if b.is_split() && !b.expandable {
                            recount.inactive_split.increase(st, 1);
                            recount.inactive_split_bytes.increase(st, b.size);
                        }
                    }
                }
                prev_free = (state == BlockState::Inactive).then_some(true);
                if state != BlockState::Inactive {
                    recount.active.increase(st, 1);
                    recount.active_bytes.increase(st, b.size);
                    recount.requested_bytes.increase(st, b.requested_size);
                }
            }
            if expandable.is_none() && seg.size >= self.config.max_split_size {
                recount.oversize_segments.increase(1);
            }
        }
        let in_pools: usize = self.pools.iter().map(|p| p.blocks.len()).sum();
        ensure!(
            in_pools == pool_members,
            "free lists hold {in_pools} blocks, {pool_members} blocks are free"
        );
        let in_unmapped: usize = self.pools.iter().map(|p| p.unmapped.len()).sum();
        ensure!(
            in_unmapped == unmapped_members,
            "unmapped sets hold {in_unmapped} blocks, {unmapped_members} blocks are unmapped"
        );
        ensure!(
            self.allocated.len() as i64 == recount.allocation.all().current,
            "pointer map holds {} entries, {} blocks are allocated",
            self.allocated.len(),
            recount.allocation.all().current
        );
        ensure!(
            self.total_allocated_memory == reserved,
            "total_allocated_memory {} but segments hold {}",
            self.total_allocated_memory,
            reserved
        );
        let s = &self.stats.snapshot();
        let pairs: [(&str, &StatArray, &StatArray); 9] = [
            ("allocation", &s.allocation, &recount.allocation),
            ("segment", &s.segment, &recount.segment),
            ("active", &s.active, &recount.active),
            ("inactive_split", &s.inactive_split, &recount.inactive_split),
            (
                "allocated_bytes",
                &s.allocated_bytes,
                &recount.allocated_bytes,
            ),
            ("reserved_bytes", &s.reserved_bytes, &recount.reserved_bytes),
            ("active_bytes", &s.active_bytes, &recount.active_bytes),
            (
                "inactive_split_bytes",
                &s.inactive_split_bytes,
                &recount.inactive_split_bytes,
            ),
            (
                "requested_bytes",
                &s.requested_bytes,
                &recount.requested_bytes,
            ),
        ];
        for (name, have, want) in pairs {
            for t in StatType::ALL {
                ensure!(
                    have.get(t).current == want.get(t).current,
                    "{name}.{}.current is {} but a recount gives {}",
                    t.name(),
                    have.get(t).current,
                    want.get(t).current
                );
                ensure!(
                    have.get(t).peak >= have.get(t).current,
                    "{name}.{}.peak below current",
                    t.name()
                );
            }
        }
        if self.max_split_changed {
            return Ok(());
        }
        ensure!(
            s.oversize_allocations.current == recount.oversize_allocations.current,
            "oversize_allocations.current is {} but a recount gives {}",
            s.oversize_allocations.current,
            recount.oversize_allocations.current
        );
        ensure!(
            s.oversize_segments.current == recount.oversize_segments.current,
            "oversize_segments.current is {} but a recount gives {}",
            s.oversize_segments.current,
            recount.oversize_segments.current
        );
        Ok(())
    }
}
