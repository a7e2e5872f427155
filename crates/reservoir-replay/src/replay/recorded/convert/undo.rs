//! Undoing one recorded entry, walking the trace backwards from dump time
//! (see [`Converter::walk_back_to_first_entry`](super::Converter)): before
//! an `alloc` its block was free, before a `free_completed` it was
//! allocated, before a `segment_alloc` the segment did not exist, before a
//! `segment_free` it existed, whole and free, before a `segment_map` its
//! pages were unmapped, before a `segment_unmap` mapped.

use std::collections::BTreeMap;

use super::super::{err, ConvertError};
use super::{
    seg_containing, xseg_containing, RSeg, XSeg, MAX_EXPANDABLE_RANGE, SMALL_BUFFER, SMALL_SIZE,
};
use reservoir::caching::rules;
use reservoir::config::AllocatorConfig;
use reservoir::observe::trace::{TraceAction, TraceEntry};

/// Undo entry `i` (an `alloc` or `free_completed`) in the expandable
/// segment `x` at `xb`: before an `alloc` its block was free, before a
/// `free_completed` allocated (at its rounded size: expandable blocks split
/// off any remainder).
pub(super) fn undo_expandable_block(
    x: &mut XSeg,
    xb: u64,
    i: usize,
    e: &TraceEntry,
    config: &AllocatorConfig,
) -> Result<(), ConvertError> {
    if e.action == TraceAction::Alloc {
        if x.blocks.remove(&e.addr).is_none() {
            return err(
                i,
                format!("alloc of {:#x}, which is not allocated afterwards", e.addr),
            );
        }
    } else {
        // Expandable blocks split off any remainder (spec 1.7):
        // the block is the rounded size.
        let size = rules::round_size(e.size.max(1), config);
        if size > MAX_EXPANDABLE_RANGE || e.addr > u64::MAX / 2 {
            return err(
                i,
                format!("free of {:#x} ({} bytes): out of range", e.addr, e.size),
            );
        }
        let overlaps_prev = x
            .blocks
            .range(..e.addr)
            .next_back()
            .is_some_and(|(&pa, &(ps, _))| pa + ps > e.addr);
        let overlaps_next = x
            .blocks
            .range(e.addr..)
            .next()
            .is_some_and(|(&a, _)| a < e.addr + size);
        if overlaps_prev || overlaps_next {
            return err(i, format!("free of {:#x} overlaps another block", e.addr));
        }
        let first = e.addr - (e.addr - xb) % x.page;
        let mut p = first;
        while p < e.addr + size {
            if !x.mapped.contains(&p) {
                return err(
                    i,
                    format!("free of {:#x}: page {p:#x} is not mapped", e.addr),
                );
            }
            p += x.page;
        }
        x.blocks.insert(e.addr, (size, e.size));
    }
    Ok(())
}

/// Undo `alloc` entry `i` in a plain segment: before it the block was free.
pub(super) fn undo_alloc(
    segs: &mut BTreeMap<u64, RSeg>,
    i: usize,
    e: &TraceEntry,
) -> Result<(), ConvertError> {
    let Some(base) = seg_containing(segs, e.addr) else {
        return err(i, format!("alloc of {:#x} in no segment", e.addr));
    };
    if segs
        .get_mut(&base)
        .and_then(|s| s.blocks.remove(&e.addr))
        .is_none()
    {
        return err(
            i,
            format!("alloc of {:#x}, which is not allocated afterwards", e.addr),
        );
    }
    Ok(())
}

/// Undo `free_completed` entry `i` in a plain segment: before it the block
/// was allocated, at its rounded size extended to the next boundary (an
/// address in `starts`, the next allocated block or the segment end) when
/// the remainder is too small to have been split off.
pub(super) fn undo_free(
    segs: &mut BTreeMap<u64, RSeg>,
    starts: &std::collections::BTreeSet<u64>,
    i: usize,
    e: &TraceEntry,
    config: &AllocatorConfig,
) -> Result<(), ConvertError> {
    let Some(base) = seg_containing(segs, e.addr) else {
        return err(i, format!("free of {:#x} in no segment", e.addr));
    };
    let seg = segs.get_mut(&base).expect("found above");
    let end = base + seg.size;
    let mut size = rules::round_size(e.size.max(1), config);
    let next = seg.blocks.range(e.addr..).next().map_or(end, |(&a, _)| a);
    if let Some((&pa, &(ps, _))) = seg.blocks.range(..e.addr).next_back() {
        if pa + ps > e.addr {
            return err(
                i,
                format!("free of {:#x} overlaps the block at {pa:#x}", e.addr),
            );
        }
    }
    if next == e.addr || e.addr + size > next {
        return err(
            i,
            format!(
                "free of {:#x} ({} bytes) overlaps the next block or the segment end",
                e.addr, e.size
            ),
        );
    }
    // Any address some block starts at, at some time, is a
    // boundary the block's end may reach.
    let boundary = starts
        .range(e.addr + 1..)
        .next()
        .map_or(next, |&a| a.min(next));
    let rest = boundary.saturating_sub(e.addr + size);
    if !seg.small && rest > 0 && rest <= SMALL_SIZE {
        size += rest;
    }
    seg.blocks.insert(e.addr, (size, e.size));
    Ok(())
}

/// Undo `segment_alloc` entry `i`: before it the segment did not exist.
pub(super) fn undo_segment_alloc(
    segs: &mut BTreeMap<u64, RSeg>,
    i: usize,
    e: &TraceEntry,
) -> Result<(), ConvertError> {
    match segs.get(&e.addr) {
        Some(s) if s.blocks.is_empty() && s.size == e.size => {
            segs.remove(&e.addr);
        }
        Some(s) => {
            return err(
                i,
                format!(
                    "segment_alloc of {:#x}: afterwards the segment has {} bytes and {} allocated blocks",
                    e.addr,
                    s.size,
                    s.blocks.len()
                ),
            )
        }
        None => {
            return err(i, format!("segment_alloc of {:#x}, a segment that does not exist afterwards", e.addr))
        }
    }
    Ok(())
}

/// Undo `segment_free` entry `i`: before it the segment existed, whole and
/// free.
pub(super) fn undo_segment_free(
    segs: &mut BTreeMap<u64, RSeg>,
    i: usize,
    e: &TraceEntry,
) -> Result<(), ConvertError> {
    if seg_containing(segs, e.addr).is_some()
        || segs
            .range(e.addr..e.addr.saturating_add(e.size))
            .next()
            .is_some()
    {
        return err(
            i,
            format!("segment_free of {:#x} overlaps a live segment", e.addr),
        );
    }
    segs.insert(
        e.addr,
        RSeg {
            size: e.size,
            stream: e.stream,
            small: e.size == SMALL_BUFFER,
            pool: super::pools::pair(e.pool_id),
            blocks: BTreeMap::new(),
        },
    );
    Ok(())
}

/// Undo `segment_map` / `segment_unmap` entry `i`: before a map its pages
/// were unmapped, before an unmap mapped.
pub(super) fn undo_map(
    xsegs: &mut BTreeMap<u64, XSeg>,
    i: usize,
    e: &TraceEntry,
) -> Result<(), ConvertError> {
    let Some(xb) = xseg_containing(xsegs, e.addr) else {
        return err(
            i,
            format!("{} of {:#x} in no expandable segment", e.action, e.addr),
        );
    };
    let x = xsegs.get_mut(&xb).expect("found above");
    if (e.addr - xb) % x.page != 0 || e.size % x.page != 0 || e.size == 0 {
        return err(
            i,
            format!(
                "{} of {:#x} ({} bytes) is not in whole pages",
                e.action, e.addr, e.size
            ),
        );
    }
    let map = e.action == TraceAction::SegmentMap;
    if map
        && x.blocks
            .range(..e.addr + e.size)
            .next_back()
            .is_some_and(|(&a, &(sz, _))| a + sz > e.addr)
    {
        return err(
            i,
            format!(
                "segment_map of {:#x}: afterwards a block is allocated there",
                e.addr
            ),
        );
    }
    let mut p = e.addr;
    while p < e.addr + e.size {
        // Before a map the page was unmapped, before an unmap mapped.
        let changed = if map {
            x.mapped.remove(&p)
        } else {
            x.mapped.insert(p)
        };
        if !changed {
            return err(
                i,
                format!(
                    "{} of {:#x}: page {p:#x} is {} afterwards",
                    e.action,
                    e.addr,
                    if map { "unmapped" } else { "mapped" }
                ),
            );
        }
        p += x.page;
    }
    Ok(())
}
