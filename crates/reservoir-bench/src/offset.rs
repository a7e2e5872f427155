//! The `offset-allocator` column: Sebastian Aaltonen's two-level-bitmap
//! offset allocator (the `offset-allocator` crate) over one arena of the
//! device's capacity in 512-byte units. It manages offsets only, so it
//! touches no memory and makes no device calls; it is neither stream-aware
//! (every stream shares the one arena) nor caching (a freed range merges
//! back at once), so it is a lower bound of bookkeeping, not an equivalent.

use offset_allocator::{Allocation, Allocator};

use crate::ops::BenchOp;

/// Bytes per offset-allocator unit (PyTorch's smallest rounding).
pub const UNIT: u64 = 512;

/// Most live allocations plus free ranges the arena keeps track of (room
/// for the suite's largest live set, 100,000 blocks, with its free gaps).
const MAX_NODES: u32 = 1 << 18;

/// A fresh arena of `capacity` bytes (rounded down to whole units, at most
/// `u32::MAX` units).
pub fn arena(capacity: u64) -> Allocator {
    let units = (capacity / UNIT).min(u64::from(u32::MAX - 1)) as u32;
    Allocator::with_max_allocs(units, MAX_NODES)
}

/// allocbench's `run_replay` over the offset allocator (streams ignored):
/// an allocation whose name is live frees it first; a failed allocation
/// leaves the name empty; leftovers are freed at the end. Returns the
/// allocator calls made.
#[inline(never)]
pub fn run_offset(
    arena: &mut Allocator,
    ops: &[BenchOp],
    live: &mut [Option<Allocation>],
) -> usize {
    let mut calls = 0;
    for op in ops {
        match *op {
            BenchOp::Alloc { id, bytes, .. } => {
                let slot = &mut live[id as usize];
                if let Some(a) = slot.take() {
                    arena.free(a);
                    calls += 1;
                }
                *slot = arena.allocate(units(bytes));
                calls += 1;
            }
            BenchOp::Free { id } => {
                if let Some(a) = live[id as usize].take() {
                    arena.free(a);
                    calls += 1;
                }
            }
            // Nothing is cached, so there is nothing to empty.
            BenchOp::EmptyCache => calls += 1,
        }
    }
    for slot in live.iter_mut() {
        if let Some(a) = slot.take() {
            arena.free(a);
            calls += 1;
        }
    }
    calls
}

/// `bytes` in whole units (at least one; saturating at `u32::MAX`).
fn units(bytes: u64) -> u32 {
    bytes.max(1).div_ceil(UNIT).min(u64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_and_frees_everything() {
        let mut a = arena(1 << 20);
        let ops = [
            BenchOp::Alloc {
                id: 0,
                bytes: 1000,
                stream: 0,
            },
            BenchOp::Alloc {
                id: 1,
                bytes: 512,
                stream: 0,
            },
            BenchOp::Alloc {
                id: 0,
                bytes: 1 << 19,
                stream: 0,
            },
            BenchOp::Free { id: 1 },
            BenchOp::Free { id: 1 },
        ];
        let mut live = vec![None; 2];
        // alloc, alloc, free+alloc, free, (not live), leftover free.
        assert_eq!(run_offset(&mut a, &ops, &mut live), 6);
        assert!(live.iter().all(Option::is_none));
        let report = a.storage_report();
        assert_eq!(report.total_free_space, (1 << 20) / 512);
    }

    #[test]
    fn too_large_fails_and_leaves_the_name_empty() {
        let mut a = arena(1 << 20);
        let ops = [BenchOp::Alloc {
            id: 0,
            bytes: 2 << 20,
            stream: 0,
        }];
        let mut live = vec![None; 1];
        assert_eq!(run_offset(&mut a, &ops, &mut live), 1);
        assert!(live[0].is_none());
    }

    #[test]
    fn rounds_to_whole_units() {
        assert_eq!(units(0), 1);
        assert_eq!(units(512), 1);
        assert_eq!(units(513), 2);
        assert_eq!(units(u64::MAX), u32::MAX);
    }
}
