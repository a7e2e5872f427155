//! The store's invariant checker: exactly the invariants written at the top
//! of the store's module (numbered there, and here on each check).
//! Allocators run it first in their own checkers (see `caching/check.rs`).

use super::BlockStore;

impl BlockStore {
    /// Check the store's invariants (1-7 of the module documentation); the
    /// message says which one broke, where.
    pub fn check_tiling(&self) -> Result<(), String> {
        let mut seen = 0usize;
        let mut registrations = std::collections::HashSet::new();
        for (sid, seg) in self.segments.iter() {
            if !seg.live {
                continue;
            }
            // 1.
            if !self.is_live_block(seg.head) {
                return Err(format!("segment {:#x} has no live head block", seg.addr));
            }
            if self.blocks[seg.head].prev.is_some() {
                return Err(format!("head of segment {:#x} has a prev block", seg.addr));
            }
            let mut expect_addr = seg.addr;
            let mut prev = None;
            for id in self.segment_blocks(sid) {
                let b = &self.blocks[id];
                seen += 1;
                // 2, 3, 5, 6, 7.
                let broken = if !b.live {
                    "a dead block is linked into it"
                } else if b.addr != expect_addr {
                    "gap or overlap"
                } else if b.size == 0 {
                    "an empty block"
                } else if b.prev != prev {
                    "prev link broken"
                } else if b.segment != sid {
                    "a block names the wrong segment"
                } else if b.stream != seg.stream {
                    "a block's stream differs from its segment"
                } else if b.pool != seg.pool {
                    "a block's pool differs from its segment"
                } else if b.expandable != seg.expandable.is_some() {
                    "a block's expandable flag differs from its segment"
                } else if !b.mapped && !b.expandable {
                    "an unmapped block outside an expandable segment"
                } else if b.registration == 0
                    || b.registration > self.registrations
                    || !registrations.insert(b.registration)
                {
                    "a block's registration is not one of its own"
                } else if b.rank != self.rank_of(b.segment, b.registration) {
                    "a block's rank is not its rule's"
                } else {
                    ""
                };
                if !broken.is_empty() {
                    return Err(format!(
                        "segment {:#x}, block {id} at {:#x} (expected at {expect_addr:#x}): {broken}",
                        seg.addr, b.addr
                    ));
                }
                expect_addr += b.size;
                prev = Some(id);
            }
            if expect_addr != seg.addr + seg.size {
                return Err(format!(
                    "blocks of segment {:#x} cover {} bytes, segment has {}",
                    seg.addr,
                    expect_addr - seg.addr,
                    seg.size
                ));
            }
        }
        // 4.
        if seen != self.blocks.len() {
            return Err(format!(
                "{} live blocks but {} reachable from segments",
                self.blocks.len(),
                seen
            ));
        }
        Ok(())
    }
}
