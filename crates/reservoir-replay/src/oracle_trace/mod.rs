//! The oracle's text trace format, and a seeded trace generator for
//! differential testing against PyTorch's real allocator.
//!
//! The oracle (`../shared/oracle/oracle_replay.py`) replays a text trace
//! through PyTorch's CUDA caching allocator on a fake device and reports what
//! the allocator did. This module is the Rust side of that format:
//!
//! * [`Op`] and [`Trace`]: a typed model of the format, one op per line:
//!
//!   | op | meaning |
//!   |---|---|
//!   | `a <id> <bytes> [stream]` | allocate (`K/M/G/T` suffixes allowed), on `stream` or the current stream |
//!   | `f <id>` | free (a free of an id whose allocation hit OOM is ignored) |
//!   | `e` | `torch.cuda.empty_cache()` |
//!   | `s <stream>` | make `stream` current; `0`/`default` is the default stream |
//!   | `r <id> <stream>` | `record_stream` |
//!   | `k <stream> [<id>...]` | enqueue fake work on `stream` writing those allocations |
//!   | `h <stream>` / `u <stream>` | hold / release the stream |
//!   | `y [<stream>]` | synchronize the stream, or the device |
//!   | `w <s1> <s2>` | `s1.wait_stream(s2)` |
//!   | `p <first> <second>` | allocations from now on go to that private pool (`torch.cuda.MemPool`, a CUDA graph's pool), created on first use; `p 0 0`: back to the default pool |
//!   | `x <first> <second>` | the private pool's owner is gone (`releasePool`: a `MemPool` destroyed, a graph reset) |
//!   | `e <first> <second>` | `emptyCache(pool)`: the cached memory of that released private pool |
//!
//!   The pool ops are Reservoir's own (recorded snapshots carry pool ids):
//!   `oracle_replay.py` does not read them.
//!   `#` starts a comment; blank lines are ignored. Op indices (the `op`
//!   fields of the oracle's output) count ops only, not comments or blank lines.
//! * [`Trace::parse`] with typed errors naming the line ([`ParseError`]), and
//!   [`Trace::to_text`] / [`Trace::write_to`].
//! * [`gen`]: a deterministic generator (its own PRNG, no floating-point
//!   transcendental functions, no hash maps), so a trace depends only on its
//!   [`GenSpec`] and never on crate or platform versions.
//! * [`spec`]: [`GenSpec`], the list of golden traces ([`golden_specs`]) and a
//!   small command-line front end ([`spec::cli`]) used by `tools/regen-goldens.sh`.

use std::fmt;
use std::io;

use reservoir::checksum::Fnv1a;

pub mod gen;
pub mod spec;

pub use gen::GenKind;
pub use spec::{golden_specs, GenSpec};

/// A stream name as the oracle sees it: a free-form word; `0` and `default`
/// both mean the default (legacy, null) stream.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamName(pub String);

impl StreamName {
    /// The default stream, written `0`.
    pub fn default_stream() -> StreamName {
        StreamName("0".to_string())
    }

    /// A named stream.
    pub fn new(name: impl Into<String>) -> StreamName {
        StreamName(name.into())
    }

    /// True for `0` and `default`.
    pub fn is_default(&self) -> bool {
        self.0 == "0" || self.0 == "default"
    }

    /// The name with `default` folded into `0` (the oracle reports the
    /// default stream as `"0"`).
    pub fn canonical(&self) -> &str {
        if self.is_default() {
            "0"
        } else {
            &self.0
        }
    }

    /// The name as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for StreamName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Identifier of an allocation within a trace (the oracle accepts any
/// integer; this model keeps non-negative ones).
pub type AllocId = u64;

/// One op of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `a <id> <bytes> [stream]`: allocate exactly `bytes` (a `uint8` tensor),
    /// on `stream` if given, else on the current stream.
    Alloc {
        /// Name of the allocation; must not be live.
        id: AllocId,
        /// Requested bytes.
        bytes: u64,
        /// Stream to allocate on; `None` = the current stream.
        stream: Option<StreamName>,
    },
    /// `f <id>`: free the allocation (ignored if its allocation hit OOM).
    Free {
        /// Name of the allocation.
        id: AllocId,
    },
    /// `e`: `torch.cuda.empty_cache()`.
    EmptyCache,
    /// `s <stream>`: make `stream` the current stream.
    SetStream {
        /// The new current stream.
        stream: StreamName,
    },
    /// `r <id> <stream>`: `tensor.record_stream(stream)` (ignored if the
    /// allocation hit OOM).
    RecordStream {
        /// Name of the allocation.
        id: AllocId,
        /// Stream that also uses it.
        stream: StreamName,
    },
    /// `k <stream> [<id>...]`: enqueue fake work on `stream` that writes the
    /// named allocations (ids that are not live are skipped). On a held
    /// stream this work stays pending, and so do events recorded after it.
    Kernel {
        /// Stream the work runs on.
        stream: StreamName,
        /// Allocations it writes (may be empty).
        ids: Vec<AllocId>,
    },
    /// `h <stream>`: hold the stream: work enqueued on it from now on stays
    /// pending until released (or synchronized).
    Hold {
        /// The stream.
        stream: StreamName,
    },
    /// `u <stream>`: release a held stream; its pending work completes.
    Release {
        /// The stream.
        stream: StreamName,
    },
    /// `y [<stream>]`: synchronize the stream, or the whole device. A
    /// synchronize completes pending work even on a held stream (the hold
    /// stays for later work).
    Sync {
        /// The stream; `None` = the device.
        stream: Option<StreamName>,
    },
    /// `w <s1> <s2>`: `s1.wait_stream(s2)`: work enqueued on `waiter` from now
    /// on waits for the work enqueued on `waited` so far.
    Wait {
        /// The stream that waits (`s1`).
        waiter: StreamName,
        /// The stream waited for (`s2`).
        waited: StreamName,
    },
    /// `p <first> <second>`: allocations from now on go to the private pool
    /// with this id (PyTorch's `MempoolId_t`), created on first use
    /// (`beginAllocateToPool`); `p 0 0` ends that (`endAllocateToPool`)
    /// and allocations go to the default pool again.
    UsePool {
        /// The pool; `(0, 0)` is the default pool.
        pool: PoolPair,
    },
    /// `x <first> <second>`: the private pool's owner is gone
    /// (`releasePool`: a `MemPool` destroyed, a CUDA graph reset); its
    /// cached memory goes back to the device at the next `e`.
    ReleasePool {
        /// The pool.
        pool: PoolPair,
    },
    /// `e <first> <second>`: `emptyCache(pool)`: the cached memory of that
    /// private pool, once released, goes back to the device.
    EmptyPool {
        /// The pool.
        pool: PoolPair,
    },
}

/// A memory pool id as PyTorch writes it (`MempoolId_t`, the `pool_id` of
/// a snapshot): `(0, 0)` is the default pool.
pub type PoolPair = (u64, u64);

impl Op {
    /// The op's letter in the text format.
    pub fn letter(&self) -> char {
        match self {
            Op::Alloc { .. } => 'a',
            Op::Free { .. } => 'f',
            Op::EmptyCache => 'e',
            Op::SetStream { .. } => 's',
            Op::RecordStream { .. } => 'r',
            Op::Kernel { .. } => 'k',
            Op::Hold { .. } => 'h',
            Op::Release { .. } => 'u',
            Op::Sync { .. } => 'y',
            Op::Wait { .. } => 'w',
            Op::UsePool { .. } => 'p',
            Op::ReleasePool { .. } => 'x',
            Op::EmptyPool { .. } => 'e',
        }
    }
}

impl fmt::Display for Op {
    /// The op as one line of the text format (no newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Alloc {
                id,
                bytes,
                stream: None,
            } => write!(f, "a {id} {bytes}"),
            Op::Alloc {
                id,
                bytes,
                stream: Some(s),
            } => write!(f, "a {id} {bytes} {s}"),
            Op::Free { id } => write!(f, "f {id}"),
            Op::EmptyCache => f.write_str("e"),
            Op::SetStream { stream } => write!(f, "s {stream}"),
            Op::RecordStream { id, stream } => write!(f, "r {id} {stream}"),
            Op::Kernel { stream, ids } => {
                write!(f, "k {stream}")?;
                for id in ids {
                    write!(f, " {id}")?;
                }
                Ok(())
            }
            Op::Hold { stream } => write!(f, "h {stream}"),
            Op::Release { stream } => write!(f, "u {stream}"),
            Op::Sync { stream: None } => f.write_str("y"),
            Op::Sync { stream: Some(s) } => write!(f, "y {s}"),
            Op::Wait { waiter, waited } => write!(f, "w {waiter} {waited}"),
            Op::UsePool { pool: (a, b) } => write!(f, "p {a} {b}"),
            Op::ReleasePool { pool: (a, b) } => write!(f, "x {a} {b}"),
            Op::EmptyPool { pool: (a, b) } => write!(f, "e {a} {b}"),
        }
    }
}

/// What is wrong with a line (see [`ParseError`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseErrorKind {
    /// The first word is not an op letter.
    UnknownOp(String),
    /// The op has the wrong number of fields.
    WrongFieldCount {
        /// The op letter.
        op: char,
        /// What the op accepts, e.g. "2 or 3".
        expected: &'static str,
        /// Fields found after the op letter.
        found: usize,
    },
    /// An allocation id is not a non-negative integer.
    BadId(String),
    /// A size is not a non-negative integer, or a number with a `K/M/G/T`
    /// suffix, or does not fit in 64 bits.
    BadSize(String),
    /// A pool id field is not a non-negative integer.
    BadPool(String),
}

impl fmt::Display for ParseErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseErrorKind::UnknownOp(w) => write!(f, "unknown op {w:?}"),
            ParseErrorKind::WrongFieldCount {
                op,
                expected,
                found,
            } => {
                write!(f, "op '{op}' takes {expected} fields, found {found}")
            }
            ParseErrorKind::BadId(w) => write!(f, "bad allocation id {w:?}"),
            ParseErrorKind::BadSize(w) => write!(f, "bad size {w:?}"),
            ParseErrorKind::BadPool(w) => write!(f, "bad pool id {w:?}"),
        }
    }
}

/// A line of a trace that cannot be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// The line's text (without the comment).
    pub text: String,
    /// What is wrong with it.
    pub kind: ParseErrorKind,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}: cannot parse {:?}: {}",
            self.line, self.text, self.kind
        )
    }
}

impl std::error::Error for ParseError {}

/// A parsed trace: the ops in order, and the line each came from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The ops; index `i` is op `i` of the oracle's output.
    pub ops: Vec<Op>,
    /// 1-based source line of each op (same length as `ops`). For a trace
    /// built in memory, the line [`Trace::to_text`] puts it on.
    pub lines: Vec<usize>,
    /// Comment lines written at the top by [`Trace::to_text`] (without `#`).
    pub header: Vec<String>,
}

impl Trace {
    /// A trace of these ops, numbered as [`Trace::to_text`] writes them.
    pub fn from_ops(ops: Vec<Op>, header: Vec<String>) -> Trace {
        let first = header.len() + 1;
        let lines = (first..first + ops.len()).collect();
        Trace { ops, lines, header }
    }

    /// Parse the text format. Comments and blank lines are skipped; the first
    /// bad line is reported with its number. Only the syntax is checked (not,
    /// for example, that a freed id is live).
    pub fn parse(text: &str) -> Result<Trace, ParseError> {
        let mut trace = Trace::default();
        for (i, raw) in text.lines().enumerate() {
            let body = raw.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            let op = parse_line(body).map_err(|kind| ParseError {
                line: i + 1,
                text: body.to_string(),
                kind,
            })?;
            trace.ops.push(op);
            trace.lines.push(i + 1);
        }
        Ok(trace)
    }

    /// The trace as text: the header as `#` comments, then one op per line.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for h in &self.header {
            s.push_str("# ");
            s.push_str(h);
            s.push('\n');
        }
        for op in &self.ops {
            use fmt::Write;
            let _ = writeln!(s, "{op}");
        }
        s
    }

    /// Write [`Trace::to_text`] to `w`.
    pub fn write_to(&self, w: &mut impl io::Write) -> io::Result<()> {
        w.write_all(self.to_text().as_bytes())
    }

    /// FNV-1a (64-bit) of the ops' text, one per line, without the header:
    /// a fingerprint that golden files record to notice a changed generator.
    pub fn fingerprint(&self) -> u64 {
        let mut h = Fnv1a::new();
        for op in &self.ops {
            h.write(op.to_string().as_bytes());
            h.write(b"\n");
        }
        h.finish()
    }

    /// Stream names in order of first use (the default stream excluded):
    /// the order in which the oracle creates them, except that the oracle
    /// skips an `r` whose allocation hit OOM (this function, which knows
    /// nothing of OOMs, counts it). `w s1 s2` uses `s1` first.
    pub fn streams_in_first_use_order(&self) -> Vec<StreamName> {
        let mut out: Vec<StreamName> = Vec::new();
        let mut note = |s: &StreamName| {
            if !s.is_default() && !out.contains(s) {
                out.push(s.clone());
            }
        };
        for op in &self.ops {
            match op {
                Op::Alloc {
                    stream: Some(s), ..
                }
                | Op::SetStream { stream: s }
                | Op::RecordStream { stream: s, .. }
                | Op::Kernel { stream: s, .. }
                | Op::Hold { stream: s }
                | Op::Release { stream: s }
                | Op::Sync { stream: Some(s) } => note(s),
                Op::Wait { waiter, waited } => {
                    note(waiter);
                    note(waited);
                }
                Op::Alloc { stream: None, .. }
                | Op::Free { .. }
                | Op::EmptyCache
                | Op::UsePool { .. }
                | Op::ReleasePool { .. }
                | Op::EmptyPool { .. }
                | Op::Sync { stream: None } => {}
            }
        }
        out
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

impl std::str::FromStr for Trace {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Trace, ParseError> {
        Trace::parse(s)
    }
}

fn parse_line(body: &str) -> Result<Op, ParseErrorKind> {
    let p: Vec<&str> = body.split_whitespace().collect();
    let n = p.len() - 1;
    let word = p[0];
    let arity = |op: char, ok: bool, expected: &'static str| {
        if ok {
            Ok(())
        } else {
            Err(ParseErrorKind::WrongFieldCount {
                op,
                expected,
                found: n,
            })
        }
    };
    let sn = |s: &str| StreamName(s.to_string());
    Ok(match word {
        "a" => {
            arity('a', n == 2 || n == 3, "2 or 3")?;
            Op::Alloc {
                id: parse_id(p[1])?,
                bytes: parse_size(p[2]).ok_or_else(|| ParseErrorKind::BadSize(p[2].to_string()))?,
                stream: p.get(3).map(|s| sn(s)),
            }
        }
        "f" => {
            arity('f', n == 1, "1")?;
            Op::Free {
                id: parse_id(p[1])?,
            }
        }
        "e" => {
            arity('e', n == 0 || n == 2, "0 or 2")?;
            match n {
                0 => Op::EmptyCache,
                _ => Op::EmptyPool {
                    pool: parse_pool(p[1], p[2])?,
                },
            }
        }
        "p" | "x" => {
            let c = word.chars().next().unwrap_or('?');
            arity(c, n == 2, "2")?;
            let pool = parse_pool(p[1], p[2])?;
            match c {
                'p' => Op::UsePool { pool },
                _ => Op::ReleasePool { pool },
            }
        }
        "s" | "h" | "u" => {
            let c = word.chars().next().unwrap_or('?');
            arity(c, n == 1, "1")?;
            let stream = sn(p[1]);
            match c {
                's' => Op::SetStream { stream },
                'h' => Op::Hold { stream },
                _ => Op::Release { stream },
            }
        }
        "r" => {
            arity('r', n == 2, "2")?;
            Op::RecordStream {
                id: parse_id(p[1])?,
                stream: sn(p[2]),
            }
        }
        "k" => {
            arity('k', n >= 1, "1 or more")?;
            let ids = p[2..]
                .iter()
                .map(|x| parse_id(x))
                .collect::<Result<Vec<_>, _>>()?;
            Op::Kernel {
                stream: sn(p[1]),
                ids,
            }
        }
        "y" => {
            arity('y', n <= 1, "0 or 1")?;
            Op::Sync {
                stream: p.get(1).map(|s| sn(s)),
            }
        }
        "w" => {
            arity('w', n == 2, "2")?;
            Op::Wait {
                waiter: sn(p[1]),
                waited: sn(p[2]),
            }
        }
        other => return Err(ParseErrorKind::UnknownOp(other.to_string())),
    })
}

/// A pool id: two non-negative integers.
fn parse_pool(a: &str, b: &str) -> Result<PoolPair, ParseErrorKind> {
    let num = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| ParseErrorKind::BadPool(s.to_string()))
    };
    Ok((num(a)?, num(b)?))
}

fn parse_id(s: &str) -> Result<AllocId, ParseErrorKind> {
    s.parse::<u64>()
        .map_err(|_| ParseErrorKind::BadId(s.to_string()))
}

/// Parse a size as the oracle does: a plain integer, or a number (decimals
/// allowed) followed by `K`, `M`, `G` or `T` (either case; powers of 1024),
/// truncated to whole bytes after multiplying in `f64`, as Python's
/// `int(float(x) * mul)`. Returns `None` for anything else, negative values
/// and values above `u64::MAX`.
pub fn parse_size(s: &str) -> Option<u64> {
    let mul = match s.chars().last()? {
        'k' | 'K' => 1u64 << 10,
        'm' | 'M' => 1 << 20,
        'g' | 'G' => 1 << 30,
        't' | 'T' => 1 << 40,
        _ => return s.parse::<u64>().ok(),
    };
    let num = &s[..s.len() - 1];
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    if let Ok(v) = num.parse::<u64>() {
        return v.checked_mul(mul);
    }
    let v: f64 = num.parse().ok()?;
    let bytes = v * mul as f64;
    if !(0.0..18_446_744_073_709_551_615.0).contains(&bytes) {
        return None;
    }
    Some(bytes as u64)
}

/// Format a byte count with the largest `K/M/G/T` suffix that divides it
/// exactly (plain digits otherwise); [`parse_size`] reads it back.
pub fn format_size_suffix(bytes: u64) -> String {
    for (shift, suffix) in [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')] {
        if bytes != 0 && bytes % (1u64 << shift) == 0 {
            return format!("{}{}", bytes >> shift, suffix);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_all_ops_and_round_trip() {
        let text = "# header\n\
                    a 1 1000\n\
                    a 2 3M side   # comment\n\
                    \n\
                    f 1\ne\ns default\nr 2 0\nk side 2 3\nk side\nh side\nu side\ny\ny side\nw 0 side\n\
                    p 0 1\np 0 0\nx 0 1\ne 0 1\n";
        let t = Trace::parse(text).unwrap();
        assert_eq!(t.ops.len(), 17);
        assert_eq!(t.ops[13], Op::UsePool { pool: (0, 1) });
        assert_eq!(t.ops[14], Op::UsePool { pool: (0, 0) });
        assert_eq!(t.ops[15], Op::ReleasePool { pool: (0, 1) });
        assert_eq!(t.ops[16], Op::EmptyPool { pool: (0, 1) });
        assert_eq!(t.lines[0], 2);
        assert_eq!(t.lines[2], 5);
        assert_eq!(
            t.ops[1],
            Op::Alloc {
                id: 2,
                bytes: 3 << 20,
                stream: Some(StreamName::new("side"))
            }
        );
        assert_eq!(
            t.ops[7],
            Op::Kernel {
                stream: StreamName::new("side"),
                ids: vec![]
            }
        );
        assert!(matches!(&t.ops[4], Op::SetStream { stream } if stream.is_default()));
        let again = Trace::parse(&t.to_text()).unwrap();
        assert_eq!(again.ops, t.ops);
        assert_eq!(
            t.streams_in_first_use_order(),
            vec![StreamName::new("side")]
        );
    }

    #[test]
    fn errors_name_the_line() {
        let e = Trace::parse("a 1 2\n\nq 3\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert_eq!(e.kind, ParseErrorKind::UnknownOp("q".into()));
        let e = Trace::parse("a 1\n").unwrap_err();
        assert!(matches!(
            e.kind,
            ParseErrorKind::WrongFieldCount {
                op: 'a',
                found: 1,
                ..
            }
        ));
        let e = Trace::parse("f x\n").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::BadId("x".into()));
        let e = Trace::parse("p 1 z\n").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::BadPool("z".into()));
        let e = Trace::parse("x 1\n").unwrap_err();
        assert!(matches!(
            e.kind,
            ParseErrorKind::WrongFieldCount {
                op: 'x',
                found: 1,
                ..
            }
        ));
        let e = Trace::parse("a 1 12Q\n").unwrap_err();
        assert_eq!(e.kind, ParseErrorKind::BadSize("12Q".into()));
        assert!(e.to_string().starts_with("line 1:"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1.5M"), Some(3 << 19));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("M"), None);
        assert_eq!(format_size_suffix(3 << 20), "3M");
        assert_eq!(format_size_suffix(1000), "1000");
        assert_eq!(parse_size(&format_size_suffix(5 << 30)), Some(5 << 30));
    }
}
