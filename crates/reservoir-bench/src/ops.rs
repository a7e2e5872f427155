//! The benchmarked operation sequences, in the oracle's trace text format
//! (`a ID BYTES [STREAM]`, `f ID`, `e`, `s STREAM`), parsed exactly as
//! `../shared/oracle/src/allocbench.cpp`'s `load_trace` does, so every
//! implementation makes the same allocator calls.

/// One operation, with streams as dense indices (0 = the default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchOp {
    /// Allocate `bytes` on `stream` under the name `id` (freeing a live
    /// allocation of the same name first, as allocbench does).
    Alloc {
        /// Name of the allocation.
        id: u32,
        /// Requested bytes.
        bytes: u64,
        /// Stream index.
        stream: u32,
    },
    /// Free the allocation named `id` (ignored when it is not live).
    Free {
        /// Name of the allocation.
        id: u32,
    },
    /// `empty_cache`.
    EmptyCache,
}

/// A parsed sequence.
#[derive(Clone, Debug, Default)]
pub struct Ops {
    /// The operations.
    pub ops: Vec<BenchOp>,
    /// Largest allocation name + 1.
    pub ids: usize,
    /// Number of distinct streams (the default stream included).
    pub streams: u32,
}

/// Parse trace text like allocbench's `load_trace` (other ops are skipped).
pub fn parse(text: &str) -> Ops {
    let mut names: Vec<String> = Vec::new();
    let mut stream_index = |name: &str| -> u32 {
        if name == "0" || name == "default" {
            return 0;
        }
        match names.iter().position(|n| n == name) {
            Some(i) => i as u32 + 1,
            None => {
                names.push(name.to_string());
                names.len() as u32
            }
        }
    };
    let mut out = Ops::default();
    let mut current = 0;
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("");
        let tok: Vec<&str> = line.split_whitespace().take(5).collect();
        let Some(first) = tok.first() else { continue };
        match (first.as_bytes()[0], tok.len()) {
            (b'a', 3 | 4) => {
                let id = tok[1].parse().unwrap_or(0);
                let stream = if tok.len() == 4 {
                    stream_index(tok[3])
                } else {
                    current
                };
                out.ops.push(BenchOp::Alloc {
                    id,
                    bytes: parse_size(tok[2]),
                    stream,
                });
                out.ids = out.ids.max(id as usize + 1);
            }
            (b'f', 2) => {
                let id = tok[1].parse().unwrap_or(0);
                out.ops.push(BenchOp::Free { id });
                out.ids = out.ids.max(id as usize + 1);
            }
            (b'e', 1) => out.ops.push(BenchOp::EmptyCache),
            (b's', 2) => current = stream_index(tok[1]),
            _ => {}
        }
    }
    out.streams = names.len() as u32 + 1;
    out
}

/// The allocator calls a replay of `ops` makes (as the `run_*` loops count
/// them) when no allocation fails. Each failed allocation makes exactly one
/// call fewer (the free, free-before-reuse or final free of its name), so
/// this minus the calls made is the number of failed allocations.
pub fn calls_without_failures(ops: &Ops) -> usize {
    let mut live = vec![false; ops.ids];
    let mut calls = 0;
    for op in &ops.ops {
        match *op {
            BenchOp::Alloc { id, .. } => {
                calls += 1 + usize::from(live[id as usize]);
                live[id as usize] = true;
            }
            BenchOp::Free { id } => {
                calls += usize::from(live[id as usize]);
                live[id as usize] = false;
            }
            BenchOp::EmptyCache => calls += 1,
        }
    }
    calls + live.iter().filter(|&&l| l).count()
}

/// `1024`, `1.5M`, `4k`: allocbench's `parse_size`.
fn parse_size(s: &str) -> u64 {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let v: f64 = s[..split].parse().unwrap_or(0.0);
    let mul = match s[split..].chars().next() {
        Some('k' | 'K') => 1u64 << 10,
        Some('m' | 'M') => 1 << 20,
        Some('g' | 'G') => 1 << 30,
        Some('t' | 'T') => 1 << 40,
        _ => 1,
    };
    (v * mul as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_allocbench() {
        let o = parse("# c\na 1 4k\ns side\na 2 1.5M\na 3 7 0\nf 1\ne\nx 9\n");
        assert_eq!(
            o.ops,
            [
                BenchOp::Alloc {
                    id: 1,
                    bytes: 4096,
                    stream: 0
                },
                BenchOp::Alloc {
                    id: 2,
                    bytes: 1_572_864,
                    stream: 1
                },
                BenchOp::Alloc {
                    id: 3,
                    bytes: 7,
                    stream: 0
                },
                BenchOp::Free { id: 1 },
                BenchOp::EmptyCache,
            ]
        );
        assert_eq!((o.ids, o.streams), (4, 2));
    }
}
