//! Consistency checks of a snapshot's segments, as the viewers assume them.

use std::fmt;

use super::model::{BlockState, Snapshot};

/// One way a snapshot contradicts itself.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Inconsistency {
    /// `total_size` differs from the sum of the block sizes (the assertion
    /// of `_memory_viz.py segsum`).
    TotalSize {
        /// Index in `segments`.
        segment: usize,
        /// The recorded value.
        recorded: u64,
        /// The sum over the blocks.
        computed: u128,
    },
    /// `allocated_size` differs from the sum of the `active_allocated`
    /// block sizes.
    AllocatedSize {
        /// Index in `segments`.
        segment: usize,
        /// The recorded value.
        recorded: u64,
        /// The sum over the blocks.
        computed: u128,
    },
    /// `active_size` differs from the sum of the non-inactive block sizes.
    ActiveSize {
        /// Index in `segments`.
        segment: usize,
        /// The recorded value.
        recorded: u64,
        /// The sum over the blocks.
        computed: u128,
    },
    /// `requested_size` differs from the sum of the active blocks'
    /// `requested_size`.
    RequestedSize {
        /// Index in `segments`.
        segment: usize,
        /// The recorded value.
        recorded: u64,
        /// The sum over the blocks.
        computed: u128,
    },
    /// A block's recorded address is not the segment address plus the sizes
    /// of the blocks before it.
    BlockAddress {
        /// Index in `segments`.
        segment: usize,
        /// Index in the segment's `blocks`.
        block: usize,
        /// The recorded address.
        recorded: u64,
        /// Where the block starts by the sizes.
        expected: u128,
    },
    /// Two segments of a device overlap.
    Overlap {
        /// Index in `segments` of the lower segment.
        first: usize,
        /// Index in `segments` of the segment starting inside it.
        second: usize,
    },
}

impl fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Inconsistency::TotalSize { segment, recorded, computed } => write!(
                f,
                "segments[{segment}].total_size is {recorded} but its blocks sum to {computed}"
            ),
            Inconsistency::AllocatedSize { segment, recorded, computed } => write!(
                f,
                "segments[{segment}].allocated_size is {recorded} but its active_allocated blocks sum to {computed}"
            ),
            Inconsistency::ActiveSize { segment, recorded, computed } => write!(
                f,
                "segments[{segment}].active_size is {recorded} but its active blocks sum to {computed}"
            ),
            Inconsistency::RequestedSize { segment, recorded, computed } => write!(
                f,
                "segments[{segment}].requested_size is {recorded} but its active blocks request {computed}"
            ),
            Inconsistency::BlockAddress { segment, block, recorded, expected } => write!(
                f,
                "segments[{segment}].blocks[{block}].address is {recorded:#x} but the sizes place it at {expected:#x}"
            ),
            Inconsistency::Overlap { first, second } => {
                write!(f, "segments[{second}] starts inside segments[{first}]")
            }
        }
    }
}

/// The inconsistencies [`Snapshot::check_consistency`] found (at least one).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} inconsistencies, first: {}", .problems.len(), .problems[0])]
pub struct ConsistencyError {
    /// Every problem found, in segment order.
    pub problems: Vec<Inconsistency>,
}

impl Snapshot {
    /// Check what the viewers assume of every segment: `total_size` = sum
    /// of block sizes, `allocated_size` = sum of `active_allocated` block
    /// sizes, `active_size` = sum of non-inactive block sizes (the checks
    /// `_memory_viz.py` makes), and, when recorded, `requested_size` = sum
    /// of the active blocks' requested sizes and each block address = the
    /// segment address plus the sizes before it; segments of a device must
    /// not overlap. Every real snapshot in `../shared/traces` passes.
    pub fn check_consistency(&self) -> Result<(), ConsistencyError> {
        let mut problems = Vec::new();
        for (i, seg) in self.segments.iter().enumerate() {
            let (mut total, mut allocated, mut active, mut requested) =
                (0u128, 0u128, 0u128, 0u128);
            let mut addr = u128::from(seg.address);
            for (j, b) in seg.blocks.iter().enumerate() {
                if let Some(a) = b.address {
                    if u128::from(a) != addr {
                        problems.push(Inconsistency::BlockAddress {
                            segment: i,
                            block: j,
                            recorded: a,
                            expected: addr,
                        });
                    }
                }
                let size = u128::from(b.size);
                addr += size;
                total += size;
                if b.state == BlockState::ActiveAllocated {
                    allocated += size;
                }
                if b.state.is_active() {
                    active += size;
                    requested += u128::from(b.requested_or_size());
                }
            }
            let checks = [
                (
                    u128::from(seg.total_size) != total,
                    Inconsistency::TotalSize {
                        segment: i,
                        recorded: seg.total_size,
                        computed: total,
                    },
                ),
                (
                    u128::from(seg.allocated_size) != allocated,
                    Inconsistency::AllocatedSize {
                        segment: i,
                        recorded: seg.allocated_size,
                        computed: allocated,
                    },
                ),
                (
                    u128::from(seg.active_size) != active,
                    Inconsistency::ActiveSize {
                        segment: i,
                        recorded: seg.active_size,
                        computed: active,
                    },
                ),
            ];
            problems.extend(checks.into_iter().filter(|(bad, _)| *bad).map(|(_, p)| p));
            if let Some(r) = seg.requested_size {
                if u128::from(r) != requested {
                    problems.push(Inconsistency::RequestedSize {
                        segment: i,
                        recorded: r,
                        computed: requested,
                    });
                }
            }
        }
        let mut order: Vec<usize> = (0..self.segments.len()).collect();
        order.sort_by_key(|&i| (self.segments[i].device, self.segments[i].address));
        for w in order.windows(2) {
            let (a, b) = (&self.segments[w[0]], &self.segments[w[1]]);
            if a.device == b.device
                && u128::from(b.address) < u128::from(a.address) + u128::from(a.total_size)
            {
                problems.push(Inconsistency::Overlap {
                    first: w[0],
                    second: w[1],
                });
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConsistencyError { problems })
        }
    }
}
