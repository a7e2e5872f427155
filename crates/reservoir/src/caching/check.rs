//! The invariant checker: walks every segment, pool and counter and compares
//! them with a recount. Tests, property tests and fuzzing run it after every
//! operation.

use std::collections::HashMap;

use super::state::pools::UnmappedKey;
use super::state::DeviceState;
use crate::observe::snapshot::BlockState;
use crate::stats::{DeviceStats, StatArray, StatType};
use crate::store::{Block, BlockId, Expandable, Segment, SegmentId};

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

/// One statistic `name` (a `StatArray`) against its recount: each pool
/// type's current value equal, its peak at least the current value.
fn check_stat_array(
    name: &str,
    have: &StatArray,
    want: &StatArray,
) -> Result<(), InvariantViolation> {
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
    Ok(())
}

impl DeviceState {
    pub(crate) fn block_state(&self, id: BlockId) -> BlockState {
        let b = self.store.block(id);
        if b.allocated() {
            BlockState::ActiveAllocated
        } else if b.event_count() > 0 || !b.stream_uses().is_empty() {
            BlockState::ActivePendingFree
        } else {
            BlockState::Inactive
        }
    }

    /// Every invariant of the device, each compared with a recount: the
    /// stacks kept for blocks, the tiling of the segments, the layout
    /// summary, each segment and block with its free list, pointer map and
    /// events, and the statistics.
    pub(crate) fn check_invariants(&self) -> Result<(), InvariantViolation> {
        self.check_contexts()?;
        (self.events)
            .check(|id| self.store.is_live_block(id))
            .map_err(InvariantViolation)?;
        self.store.check_tiling().map_err(InvariantViolation)?;
        self.check_layout_summary()?;
        let recount = self.recount_segments()?;
        self.check_membership(&recount)?;
        self.check_private_pool_reserved(&recount.private_reserved)?;
        self.check_stats(&recount.stats)
    }

    /// The layout summary equals a count of the segments.
    fn check_layout_summary(&self) -> Result<(), InvariantViolation> {
        let summary = self.layout_summary();
        let counted = crate::observe::snapshot::LayoutSummary::of(&self.segment_models(None));
        ensure!(
            summary == counted,
            "layout summary {summary:?} differs from a count of the segments {counted:?}"
        );
        Ok(())
    }

    /// Checks every live segment and its blocks, counting what the
    /// statistics and the free lists should hold.
    fn recount_segments(&self) -> Result<Recount, InvariantViolation> {
        let mut r = Recount::default();
        let pending = self.events.queued_per_block();
        for (sid, seg) in self.store.live_segments() {
            self.recount_segment(sid, seg, &pending, &mut r)?;
        }
        Ok(r)
    }

    /// One live segment: its blocks, their pages, pools and neighbours.
    fn recount_segment(
        &self,
        sid: SegmentId,
        seg: &Segment,
        pending: &HashMap<BlockId, u32>,
        r: &mut Recount,
    ) -> Result<(), InvariantViolation> {
        let st = StatType::for_pool(self.pools[seg.pool().index()].is_small());
        let expandable = seg.expandable();
        let owner = self.owner(seg.pool());
        if expandable.is_none() {
            // Expandable segments never count as segments (spec 1.11).
            r.stats.segment.increase(st, 1);
            r.stats.reserved_bytes.increase(st, seg.size());
            r.reserved += seg.size();
            if let Some(id) = owner {
                r.private_reserved
                    .entry(id)
                    .or_default()
                    .increase(st, seg.size());
            }
        }
        // (free, mapped) of the previous block, to find unmerged neighbours.
        let mut prev_free: Option<bool> = None;
        for id in self.store.segment_blocks(sid) {
            let b = self.store.block(id);
            ensure!(
                b.size() % 512 == 0,
                "block {:#x} has size {}",
                b.addr(),
                b.size()
            );
            ensure!(
                b.expandable() == expandable.is_some(),
                "block {:#x} disagrees with its segment about being expandable",
                b.addr()
            );
            if let Some(e) = expandable {
                check_pages(seg.addr(), e, b)?;
                if b.mapped() {
                    r.stats.reserved_bytes.increase(st, b.size());
                    r.reserved += b.size();
                    if let Some(id) = owner {
                        r.private_reserved
                            .entry(id)
                            .or_default()
                            .increase(st, b.size());
                    }
                }
            } else {
                ensure!(
                    b.mapped(),
                    "block {:#x} of a plain segment is unmapped",
                    b.addr()
                );
            }
            if !b.mapped() {
                self.check_unmapped_block(id, prev_free)?;
                r.unmapped_members += 1;
                prev_free = Some(false);
                continue;
            }
            let events = pending.get(&id).copied().unwrap_or(0);
            let state = self.recount_mapped_block(id, st, events, prev_free, r)?;
            prev_free = (state == BlockState::Inactive).then_some(true);
        }
        if expandable.is_none() && seg.size() >= self.config.max_split_size {
            r.stats.oversize_segments.increase(1);
        }
        Ok(())
    }

    /// An unmapped block is in its pool's unmapped set, unused, and not
    /// next to another unmapped block.
    fn check_unmapped_block(
        &self,
        id: BlockId,
        prev_free: Option<bool>,
    ) -> Result<(), InvariantViolation> {
        let b = self.store.block(id);
        let key = UnmappedKey {
            stream: b.stream(),
            addr: b.addr(),
            id,
        };
        ensure!(
            self.pools[b.pool().index()].contains_unmapped(&key),
            "unmapped block {:#x} missing from the unmapped set",
            b.addr()
        );
        ensure!(
            !b.allocated() && b.event_count() == 0,
            "unmapped block {:#x} in use",
            b.addr()
        );
        ensure!(
            prev_free != Some(false),
            "adjacent unmapped blocks at {:#x}",
            b.addr()
        );
        Ok(())
    }

    /// A mapped block: its events, and by its state its place in the
    /// pointer map or its free list; counted in `r`. Returns its state.
    fn recount_mapped_block(
        &self,
        id: BlockId,
        st: StatType,
        events: u32,
        prev_free: Option<bool>,
        r: &mut Recount,
    ) -> Result<BlockState, InvariantViolation> {
        let b = self.store.block(id);
        let in_map = self.allocated.get(&b.addr()) == Some(&id);
        let key = self.free_key(id);
        let in_pool = self.pools[b.pool().index()].contains(&key);
        ensure!(
            events == b.event_count(),
            "block {:#x}: event_count {} but {} queued events",
            b.addr(),
            b.event_count(),
            events
        );
        let state = self.block_state(id);
        let recount = &mut r.stats;
        match state {
            BlockState::ActiveAllocated => {
                ensure!(
                    in_map,
                    "allocated block {:#x} missing from the pointer map",
                    b.addr()
                );
                ensure!(
                    !in_pool,
                    "allocated block {:#x} is in a free list",
                    b.addr()
                );
                recount.allocation.increase(st, 1);
                recount.allocated_bytes.increase(st, b.size());
                if b.size() >= self.config.max_split_size {
                    recount.oversize_allocations.increase(1);
                }
            }
            BlockState::ActivePendingFree => {
                ensure!(
                    !in_map,
                    "pending block {:#x} is in the pointer map",
                    b.addr()
                );
                ensure!(!in_pool, "pending block {:#x} is in a free list", b.addr());
            }
            BlockState::Inactive => {
                ensure!(!in_map, "free block {:#x} is in the pointer map", b.addr());
                ensure!(
                    in_pool,
                    "free block {:#x} missing from its free list",
                    b.addr()
                );
                ensure!(
                    prev_free != Some(true),
                    "adjacent free blocks at {:#x} were not merged",
                    b.addr()
                );
                r.pool_members += 1;
                if b.is_split() && !b.expandable() {
                    recount.inactive_split.increase(st, 1);
                    recount.inactive_split_bytes.increase(st, b.size());
                }
            }
        }
        if state != BlockState::Inactive {
            recount.active.increase(st, 1);
            recount.active_bytes.increase(st, b.size());
            recount.requested_bytes.increase(st, b.requested_size());
        }
        Ok(state)
    }

    /// The free lists, unmapped sets, pointer map and driver total hold
    /// what the walk over the segments counted.
    fn check_membership(&self, r: &Recount) -> Result<(), InvariantViolation> {
        let pool_members = r.pool_members;
        let unmapped_members = r.unmapped_members;
        let in_pools: usize = self.pools.iter().map(|p| p.len()).sum();
        ensure!(
            in_pools == pool_members,
            "free lists hold {in_pools} blocks, {pool_members} blocks are free"
        );
        let in_unmapped: usize = self.pools.iter().map(|p| p.unmapped_len()).sum();
        ensure!(
            in_unmapped == unmapped_members,
            "unmapped sets hold {in_unmapped} blocks, {unmapped_members} blocks are unmapped"
        );
        ensure!(
            self.allocated.len() as i64 == r.stats.allocation.all().current,
            "pointer map holds {} entries, {} blocks are allocated",
            self.allocated.len(),
            r.stats.allocation.all().current
        );
        ensure!(
            self.acct.total_allocated_memory() == r.reserved,
            "total_allocated_memory {} but segments hold {}",
            self.acct.total_allocated_memory(),
            r.reserved
        );
        Ok(())
    }

    /// `reserved_bytes_by_private_pools` equals a recount of each private
    /// pool's segments: every pool holding memory has an entry, and each
    /// entry's current values (0 for a pool with none left) are the
    /// recount's; peaks at least the current values.
    fn check_private_pool_reserved(
        &self,
        recount: &std::collections::BTreeMap<crate::ids::MempoolId, StatArray>,
    ) -> Result<(), InvariantViolation> {
        let have = self.acct.private_pool_reserved();
        for id in recount.keys() {
            ensure!(
                have.contains_key(id),
                "private pool {id:?} holds driver memory but has no reserved_bytes_by_private_pools entry"
            );
        }
        let zero = StatArray::default();
        for (id, array) in have {
            let want = recount.get(id).unwrap_or(&zero);
            let name = format!("reserved_bytes_by_private_pools.{}_{}", id.0, id.1);
            check_stat_array(&name, array, want)?;
        }
        Ok(())
    }

    /// The statistics equal the recount (current values; peaks at least
    /// the current values; the oversize counters unless `max_split_size`
    /// changed at run time).
    fn check_stats(&self, recount: &DeviceStats) -> Result<(), InvariantViolation> {
        let s = &self.acct.snapshot();
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
            check_stat_array(name, have, want)?;
        }
        if self.acct.max_split_changed() {
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

/// What the walk over the segments counts.
#[derive(Default)]
struct Recount {
    stats: DeviceStats,
    /// Reserved bytes of each private pool's live segments.
    private_reserved: std::collections::BTreeMap<crate::ids::MempoolId, StatArray>,
    /// Bytes the segments hold from the driver.
    reserved: u64,
    /// Free mapped blocks (each must be in its pool).
    pool_members: usize,
    /// Unmapped blocks (each must be in its unmapped set).
    unmapped_members: usize,
}

/// Each page under block `b` of the expandable segment at `seg_addr` is
/// mapped exactly when `b` is: a block boundary may fall inside a page only
/// between mapped blocks.
fn check_pages(seg_addr: u64, e: &Expandable, b: &Block) -> Result<(), InvariantViolation> {
    let page = e.page_size();
    let first = (b.addr() - seg_addr) / page;
    let last = (b.addr() + b.size() - seg_addr).div_ceil(page);
    for pg in first..last {
        let is_mapped = e.is_mapped(pg);
        ensure!(
            is_mapped == b.mapped(),
            "page {pg} of expandable segment {:#x} is {} under a {} block at {:#x}",
            seg_addr,
            if is_mapped { "mapped" } else { "unmapped" },
            if b.mapped() { "mapped" } else { "unmapped" },
            b.addr()
        );
    }
    Ok(())
}
