//! The store's invariant checker: every live segment is tiled exactly by
//! its linked blocks, and every live block is reachable from its segment.
//! Allocators run it first in their own checkers (see `caching/check.rs`).

use super::{BlockStore, NIL};

impl BlockStore {
    /// Check the invariants written on [`BlockStore`]'s fields; the message
    /// says which one broke, where.
    pub fn check_tiling(&self) -> Result<(), String> {
        let mut seen = 0usize;
        for (sid, seg) in self.segments.items.iter().enumerate() {
            if !seg.live {
                continue;
            }
            let sid = sid as u32;
            if seg.head == NIL {
                return Err(format!("segment {:#x} has no head block", seg.addr));
            }
            if self.blocks[seg.head].prev != NIL {
                return Err(format!("head of segment {:#x} has a prev block", seg.addr));
            }
            let mut expect_addr = seg.addr;
            let mut prev = NIL;
            for id in self.segment_blocks(sid) {
                let b = &self.blocks[id];
                seen += 1;
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
                prev = id;
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
