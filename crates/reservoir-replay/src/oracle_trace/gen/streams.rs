//! The `streams` and `streams-sync` kinds: allocations on several streams.

use super::{Gen, MIB};
use crate::oracle_trace::Op;

impl Gen {
    /// Allocations and frees on several streams, with holds, kernels,
    /// `record_stream` and (`sync`) synchronizations and waits.
    pub(super) fn streams(&mut self, sync: bool) {
        let n = self.r.range(2, 5) as usize;
        self.add_streams(n);
        let live_target = *self.r.pick(&[16usize, 64, 256]);
        let hi = *self.r.pick(&[4 * MIB, 64 * MIB, 256 * MIB]);
        let budget_pct = *self.r.pick(&[50u64, 80, 80, 150]);
        let budget = self.limit / 100 * budget_pct;
        let nsn = self.streams.len() as u64;
        while !self.done() {
            let w: &[u32] = if sync {
                &[40, 25, 8, 4, 5, 4, 4, 6, 1, 2, 2]
            } else {
                &[40, 25, 8, 4, 5, 4, 4, 6, 1, 0, 0]
            };
            match self.r.weighted(w) {
                0 => self.streams_alloc(live_target, hi, budget),
                1 => self.free_random(),
                2 if !self.live.is_empty() => {
                    let i = self.r.below(self.live.len() as u64) as usize;
                    let id = self.live[i].id;
                    let s = self.random_stream();
                    self.ops.push(Op::RecordStream {
                        id,
                        stream: self.name(s),
                    });
                }
                3 => self.hold_random_stream(nsn),
                4 => {
                    let s = self.random_stream();
                    let ids = self.random_live_ids(3);
                    self.ops.push(Op::Kernel {
                        stream: self.name(s),
                        ids,
                    });
                }
                5 => self.release_held_stream(),
                6 => {
                    let s = self.random_stream();
                    self.set_stream(s);
                }
                7 if !self.live.is_empty() => self.cross_stream_reuse(nsn),
                8 => self.empty_cache(),
                9 => self.sync_random_stream(),
                10 => self.wait_random_streams(nsn),
                _ => {}
            }
        }
    }

    /// An allocation of the `streams` kind, on the current stream or a random
    /// one; a free instead when `live_target` blocks or `budget` bytes are
    /// live.
    fn streams_alloc(&mut self, live_target: usize, hi: u64, budget: u64) {
        if self.live.len() >= live_target || self.live_bytes > budget {
            self.free_random();
            return;
        }
        let b = self.size_mix(1, hi);
        if self.r.chance(0.5) {
            self.alloc(b);
        } else {
            let s = self.random_stream();
            self.alloc_on(b, s);
        }
    }

    /// Hold a random stream of the `nsn`, usually with pending work right
    /// away.
    fn hold_random_stream(&mut self, nsn: u64) {
        // hold a stream, usually with pending work right away
        let first = if self.r.chance(0.1) { 0 } else { 1 };
        let s = self.r.range(first, nsn - 1) as usize;
        self.held[s] = true;
        self.ops.push(Op::Hold {
            stream: self.name(s),
        });
        if self.r.chance(0.7) {
            let ids = self.random_live_ids(3);
            self.ops.push(Op::Kernel {
                stream: self.name(s),
                ids,
            });
        }
    }

    /// Release a random held stream, if any.
    fn release_held_stream(&mut self) {
        let held: Vec<usize> = (0..self.held.len()).filter(|&i| self.held[i]).collect();
        if !held.is_empty() {
            let s = *self.r.pick(&held);
            self.held[s] = false;
            self.ops.push(Op::Release {
                stream: self.name(s),
            });
        }
    }

    /// The canonical cross-stream episode: a block used on a held stream
    /// (of the `nsn`) is freed, then its size is asked for again.
    fn cross_stream_reuse(&mut self, nsn: u64) {
        // The canonical cross-stream episode: a block used on a held
        // stream is freed, then its size is asked for again.
        let i = self.r.below(self.live.len() as u64) as usize;
        let l = self.live[i];
        let mut s = self.r.range(1, nsn - 1) as usize;
        if s == l.stream {
            s = if s + 1 < nsn as usize { s + 1 } else { 0 };
        }
        if !self.held[s] {
            self.held[s] = true;
            self.ops.push(Op::Hold {
                stream: self.name(s),
            });
        }
        self.ops.push(Op::Kernel {
            stream: self.name(s),
            ids: vec![l.id],
        });
        self.ops.push(Op::RecordStream {
            id: l.id,
            stream: self.name(s),
        });
        if self.r.chance(0.3) {
            // a second user stream
            let t = self.random_stream();
            self.ops.push(Op::RecordStream {
                id: l.id,
                stream: self.name(t),
            });
        }
        self.free_id(l.id);
        if self.r.chance(0.7) {
            self.alloc_on(l.bytes, l.stream);
        }
    }

    /// Synchronize the device or a random stream.
    fn sync_random_stream(&mut self) {
        if self.r.chance(0.4) {
            self.ops.push(Op::Sync { stream: None });
        } else {
            let s = self.random_stream();
            self.ops.push(Op::Sync {
                stream: Some(self.name(s)),
            });
        }
    }

    /// A random stream waits for another (of the `nsn`).
    fn wait_random_streams(&mut self, nsn: u64) {
        let a = self.random_stream();
        let mut b = self.random_stream();
        if a == b {
            b = (b + 1) % nsn as usize;
        }
        self.ops.push(Op::Wait {
            waiter: self.name(a),
            waited: self.name(b),
        });
    }
}
