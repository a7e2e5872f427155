//! The pickle reader: a pickle virtual machine that builds
//! [`Value`]s and never executes anything (spec
//! section 2.6). The value model and the writer are the allocator's
//! ([`reservoir::observe::pickle`]).
//!
//! * [`from_slice`] reads any pickle of protocol 0 to 5 made of plain data
//!   (None, bools, ints of any size, floats, str, bytes, lists, tuples, dicts,
//!   sets) into a `Value`. Memo references (`PUT`/`GET`/`MEMOIZE`) keep
//!   their sharing: an object referenced many times is stored once, behind an
//!   [`Arc`]. `GLOBAL`/`STACK_GLOBAL` yield a `Value::Global` name and never
//!   import anything; `REDUCE` is accepted only for a fixed allow-list of
//!   plain-data constructors (`collections.OrderedDict`, `set`, `frozenset`,
//!   `bytearray`, `_codecs.encode`). Object-building opcodes (`BUILD`,
//!   `NEWOBJ`, `INST`, `OBJ`, persistent ids, extension codes, out-of-band
//!   buffers) are errors.
//! * Hostile input cannot make the reader panic, recurse without bound or
//!   allocate more than a constant factor of the input: every declared length
//!   is checked against the bytes left, and [`Limits`] bounds container
//!   nesting, the value stack, the memo and the size of the value tree. Errors
//!   ([`PickleError`]) name the byte offset and the opcode.
//!
//! ```
//! use reservoir::observe::pickle::{self, Value};
//!
//! let v = Value::dict(vec![(Value::from("size"), Value::from(20u64 << 20))]);
//! let bytes = pickle::to_vec(&v).unwrap();
//! assert_eq!(reservoir_replay::pickle::from_slice(&bytes).unwrap(), v);
//! ```
//!
//! Containers are built in an arena while the opcodes run (a memoized list
//! keeps growing after `MEMOIZE`, exactly as in Python), and turned into
//! shared [`Value`]s once `STOP` is reached. Resolution is depth-first with an
//! explicit depth bound and detects self-containing structures.

use std::fmt;
use std::sync::Arc;

use rustc_hash::FxHashMap;

use reservoir::observe::pickle::{op, opcode_name, Value};

mod opcodes;
mod scan;
mod text;

pub use scan::{scan, Scanner};

/// Bounds that keep hostile input from exhausting the stack, memory or time.
///
/// The defaults accept every real PyTorch snapshot with a wide margin (their
/// containers nest 7 deep; their value trees, counting shared objects once
/// per reference, have about 3.4 nodes per input byte).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Deepest container nesting (a list in a list in … counts one per
    /// level). The reader and every consumer recurse this deep, so keep it
    /// well under ten thousand. Default 256.
    pub max_depth: usize,
    /// Most items (values plus marks) on the unpickler's stack at once.
    /// Default 4 Mi.
    pub max_stack: usize,
    /// Most memo entries. Default 4 Mi.
    pub max_memo: usize,
    /// Budget for containers created, for the items stored into containers
    /// (every `APPEND`ed, `SETITEM`ed or constructor-copied slot counts, so
    /// re-copying one big container through `REDUCE` cannot take quadratic
    /// memory), and for the size of the final value tree, counted with every
    /// reference to a shared object expanded:
    /// `max(min_node_budget, nodes_per_input_byte * input length)`. It bounds
    /// the time any traversal of the result can take. Default 32.
    pub nodes_per_input_byte: u64,
    /// Floor of the node budget for small inputs. Default 64 Ki.
    pub min_node_budget: u64,
    /// Most decimal digits in a text-mode (`INT`/`LONG`) integer; Python's
    /// own default limit. Default 4300.
    pub max_int_digits: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_depth: 256,
            max_stack: 1 << 22,
            max_memo: 1 << 22,
            nodes_per_input_byte: 32,
            min_node_budget: 1 << 16,
            max_int_digits: 4300,
        }
    }
}

impl Limits {
    fn node_budget(&self, input_len: usize) -> u64 {
        (input_len as u64)
            .saturating_mul(self.nodes_per_input_byte)
            .max(self.min_node_budget)
    }
}

/// A pickle that could not be read: where, at which opcode, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}{}: {kind}", OpcodeSuffix(*.opcode))]
pub struct PickleError {
    /// Offset of the opcode being executed (or of the end of input).
    pub offset: usize,
    /// The opcode byte being executed, if any.
    pub opcode: Option<u8>,
    /// What went wrong.
    pub kind: PickleErrorKind,
}

struct OpcodeSuffix(Option<u8>);

impl fmt::Display for OpcodeSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            None => Ok(()),
            Some(b) => match opcode_name(b) {
                Some(name) => write!(f, " (opcode {name}, {b:#04x})"),
                None => write!(f, " (byte {b:#04x})"),
            },
        }
    }
}

/// The reasons a pickle is rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickleErrorKind {
    /// The input ended before a `STOP` opcode.
    #[error("input ended before STOP")]
    UnexpectedEnd,
    /// An opcode's argument (or a declared length) runs past the input.
    #[error("needs {needed} bytes but only {remaining} are left")]
    Truncated {
        /// Bytes the opcode needs.
        needed: u64,
        /// Bytes left in the input.
        remaining: usize,
    },
    /// A text-mode argument has no terminating newline.
    #[error("argument line has no terminating newline")]
    MissingNewline,
    /// The byte is not a pickle opcode.
    #[error("not a pickle opcode")]
    UnknownOpcode,
    /// A real opcode this reader refuses (it would build arbitrary objects).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
    /// `PROTO` names a protocol newer than 5.
    #[error("unsupported protocol {0}")]
    Protocol(u8),
    /// An opcode needs more values than the stack holds above the last mark.
    #[error("stack underflow")]
    StackUnderflow,
    /// An opcode needs a mark and there is none.
    #[error("no MARK on the stack")]
    NoMark,
    /// A memo lookup names an index never stored.
    #[error("memo entry {0} does not exist")]
    MemoMissing(u64),
    /// An operand has the wrong type.
    #[error("expected {expected}, found {found}")]
    Type {
        /// What the opcode needs.
        expected: &'static str,
        /// What the stack held.
        found: &'static str,
    },
    /// A text-mode literal (int, float, string, memo index) is malformed.
    #[error("invalid literal: {0}")]
    Literal(String),
    /// A unicode string is not valid UTF-8.
    #[error("invalid UTF-8 in string")]
    Utf8,
    /// `DICT` or `SETITEMS` got an odd number of items.
    #[error("odd number of items for a dict")]
    OddItems,
    /// A [`Limits`] bound was reached.
    #[error("{what} limit of {limit} exceeded")]
    Limit {
        /// Which bound.
        what: &'static str,
        /// Its value.
        limit: u64,
    },
    /// An object contains itself; such values cannot be represented.
    #[error("recursive structure (an object contains itself)")]
    Recursive,
    /// `REDUCE` of a callable outside the plain-data allow-list.
    #[error("refusing to call {0}")]
    Call(String),
    /// `REDUCE` of an allowed callable with arguments it does not take.
    #[error("unsupported arguments for {0}")]
    BadArgs(&'static str),
    /// Bytes follow the `STOP` opcode (at byte `stop`) that ends the pickle
    /// (found by [`Scanner`]; [`from_slice`] ignores them, as Python does).
    #[error("data after the STOP opcode at byte {stop}: a pickle file holds one pickle")]
    TrailingData {
        /// Offset of the `STOP` opcode.
        stop: u64,
    },
}

/// Read a pickle with the default [`Limits`]. Bytes after `STOP` are ignored,
/// as Python does.
pub fn from_slice(data: &[u8]) -> Result<Value, PickleError> {
    from_slice_with(data, &Limits::default())
}

/// Read a pickle with explicit [`Limits`].
pub fn from_slice_with(data: &[u8], limits: &Limits) -> Result<Value, PickleError> {
    let mut p = Parser {
        data,
        pos: 0,
        op_pos: 0,
        op: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        memo_sparse: FxHashMap::default(),
        memo_count: 0,
        nodes: Vec::new(),
        items: 0,
        limits,
        node_budget: limits.node_budget(data.len()),
    };
    p.run()
}

/// A stack entry: a finished scalar, or a container in the arena.
#[derive(Clone)]
enum Slot {
    Leaf(Value),
    Node(u32),
}

enum Node {
    List(Vec<Slot>),
    Tuple(Vec<Slot>),
    Dict(Vec<(Slot, Slot)>),
    Set(Vec<Slot>),
}

impl Node {
    fn type_name(&self) -> &'static str {
        match self {
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Dict(_) => "dict",
            Node::Set(_) => "set",
        }
    }
}

enum NodeState {
    Pending(Node),
    Busy,
    /// Value, tree size, height.
    Done(Value, u64, usize),
}

type Res<T> = Result<T, PickleErrorKind>;

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    op_pos: usize,
    op: u8,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    /// Memo entries with small, dense indices (what `MEMOIZE` and real
    /// picklers produce).
    memo: Vec<Option<Slot>>,
    /// Memo entries whose index is far beyond the dense part.
    memo_sparse: FxHashMap<u32, Slot>,
    /// Number of distinct memo entries (Python's `len(memo)`).
    memo_count: usize,
    nodes: Vec<NodeState>,
    /// Slots stored into containers so far (charged against `node_budget`).
    items: u64,
    limits: &'a Limits,
    node_budget: u64,
}

impl<'a> Parser<'a> {
    fn run(&mut self) -> Result<Value, PickleError> {
        loop {
            self.op_pos = self.pos;
            let Some(&opcode) = self.data.get(self.pos) else {
                return Err(PickleError {
                    offset: self.pos,
                    opcode: None,
                    kind: PickleErrorKind::UnexpectedEnd,
                });
            };
            self.pos += 1;
            self.op = opcode;
            let step = if opcode == op::STOP {
                self.stop().map(Some)
            } else {
                self.step(opcode).map(|()| None)
            };
            match step {
                Ok(None) => {}
                Ok(Some(v)) => return Ok(v),
                Err(kind) => {
                    return Err(PickleError {
                        offset: self.op_pos,
                        opcode: Some(opcode),
                        kind,
                    });
                }
            }
        }
    }

    // ----- input -----

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: u64) -> Res<&'a [u8]> {
        let remaining = self.remaining();
        if n > remaining as u64 {
            return Err(PickleErrorKind::Truncated {
                needed: n,
                remaining,
            });
        }
        let n = n as usize;
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn take_array<const N: usize>(&mut self) -> Res<[u8; N]> {
        let s = self.take(N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self) -> Res<u8> {
        Ok(self.take_array::<1>()?[0])
    }

    fn u16le(&mut self) -> Res<u16> {
        Ok(u16::from_le_bytes(self.take_array()?))
    }

    fn u32le(&mut self) -> Res<u32> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    fn i32le(&mut self) -> Res<i32> {
        Ok(i32::from_le_bytes(self.take_array()?))
    }

    fn u64le(&mut self) -> Res<u64> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// A length stored as a signed 32-bit int (`BINSTRING`, `LONG4`).
    fn len_i32(&mut self) -> Res<u64> {
        let n = self.i32le()?;
        u64::try_from(n).map_err(|_| PickleErrorKind::Literal(format!("negative length {n}")))
    }

    /// The text up to the next newline (excluded); the newline is consumed.
    fn line(&mut self) -> Res<&'a [u8]> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or(PickleErrorKind::MissingNewline)?;
        self.pos += n + 1;
        Ok(&rest[..n])
    }

    fn line_str(&mut self) -> Res<&'a str> {
        std::str::from_utf8(self.line()?).map_err(|_| PickleErrorKind::Utf8)
    }

    // ----- stack -----

    fn fence(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn push(&mut self, s: Slot) -> Res<()> {
        if self.stack.len() + self.marks.len() >= self.limits.max_stack {
            return Err(self.limit("stack", self.limits.max_stack as u64));
        }
        self.stack.push(s);
        Ok(())
    }

    fn push_leaf(&mut self, v: Value) -> Res<()> {
        self.push(Slot::Leaf(v))
    }

    fn pop(&mut self) -> Res<Slot> {
        if self.stack.len() <= self.fence() {
            return Err(PickleErrorKind::StackUnderflow);
        }
        self.stack.pop().ok_or(PickleErrorKind::StackUnderflow)
    }

    fn top(&self) -> Res<&Slot> {
        if self.stack.len() <= self.fence() {
            return Err(PickleErrorKind::StackUnderflow);
        }
        self.stack.last().ok_or(PickleErrorKind::StackUnderflow)
    }

    fn pop_mark(&mut self) -> Res<Vec<Slot>> {
        let m = self.marks.pop().ok_or(PickleErrorKind::NoMark)?;
        if m > self.stack.len() {
            return Err(PickleErrorKind::StackUnderflow);
        }
        Ok(self.stack.split_off(m))
    }

    fn limit(&self, what: &'static str, limit: u64) -> PickleErrorKind {
        PickleErrorKind::Limit { what, limit }
    }

    // ----- arena -----

    /// Charge `n` slots stored into containers against the node budget.
    fn charge(&mut self, n: usize) -> Res<()> {
        self.items = self.items.saturating_add(n as u64);
        if self.items > self.node_budget {
            return Err(self.limit("container items", self.node_budget));
        }
        Ok(())
    }

    fn new_node(&mut self, node: Node) -> Res<Slot> {
        if self.nodes.len() as u64 >= self.node_budget {
            return Err(self.limit("container count", self.node_budget));
        }
        let n = match &node {
            Node::List(v) | Node::Tuple(v) | Node::Set(v) => v.len(),
            Node::Dict(d) => d.len().saturating_mul(2),
        };
        self.charge(n)?;
        let idx = u32::try_from(self.nodes.len())
            .map_err(|_| self.limit("container count", u64::from(u32::MAX)))?;
        self.nodes.push(NodeState::Pending(node));
        Ok(Slot::Node(idx))
    }

    fn push_node(&mut self, node: Node) -> Res<()> {
        let s = self.new_node(node)?;
        self.push(s)
    }

    /// The container on top of the stack, for the mutating opcodes.
    fn top_node_mut(&mut self, expected: &'static str) -> Res<&mut Node> {
        let idx = match self.top()? {
            Slot::Node(i) => *i as usize,
            Slot::Leaf(v) => {
                return Err(PickleErrorKind::Type {
                    expected,
                    found: v.type_name(),
                })
            }
        };
        match self.nodes.get_mut(idx) {
            Some(NodeState::Pending(n)) => Ok(n),
            _ => Err(PickleErrorKind::Type {
                expected,
                found: "finished object",
            }),
        }
    }

    /// The items of a list, tuple or set slot (cloned), if it is one.
    fn seq_items(&self, s: &Slot) -> Option<Vec<Slot>> {
        match s {
            Slot::Node(i) => match self.nodes.get(*i as usize) {
                Some(NodeState::Pending(Node::List(v) | Node::Tuple(v) | Node::Set(v))) => {
                    Some(v.clone())
                }
                _ => None,
            },
            Slot::Leaf(_) => None,
        }
    }

    fn slot_type(&self, s: &Slot) -> &'static str {
        match s {
            Slot::Leaf(v) => v.type_name(),
            Slot::Node(i) => match self.nodes.get(*i as usize) {
                Some(NodeState::Pending(n)) => n.type_name(),
                _ => "object",
            },
        }
    }

    // ----- memo -----

    fn memo_get(&mut self, idx: u64) -> Res<()> {
        let s = usize::try_from(idx)
            .ok()
            .and_then(|i| self.memo.get(i))
            .and_then(Option::as_ref)
            .or_else(|| {
                u32::try_from(idx)
                    .ok()
                    .and_then(|i| self.memo_sparse.get(&i))
            })
            .cloned()
            .ok_or(PickleErrorKind::MemoMissing(idx))?;
        self.push(s)
    }

    fn memo_put(&mut self, idx: u64) -> Res<()> {
        let s = self.top()?.clone();
        let idx = u32::try_from(idx)
            .map_err(|_| PickleErrorKind::Literal(format!("memo index {idx} too large")))?;
        let i = idx as usize;
        let exists =
            matches!(self.memo.get(i), Some(Some(_))) || self.memo_sparse.contains_key(&idx);
        if !exists {
            if self.memo_count >= self.limits.max_memo {
                return Err(self.limit("memo", self.limits.max_memo as u64));
            }
            self.memo_count += 1;
        }
        if i >= self.memo.len() && i < self.memo.len() + 1024 && i < self.limits.max_memo {
            // Grow the dense table (by a small gap at most), taking over any
            // entries of the new range that were stored sparsely.
            let old_len = self.memo.len();
            self.memo.resize(i + 1, None);
            if !self.memo_sparse.is_empty() {
                for j in old_len..=i {
                    if let Some(e) = self.memo_sparse.remove(&(j as u32)) {
                        self.memo[j] = Some(e);
                    }
                }
            }
        }
        match self.memo.get_mut(i) {
            Some(e) => *e = Some(s),
            None => {
                self.memo_sparse.insert(idx, s);
            }
        }
        Ok(())
    }

    // ----- STOP: resolve the arena into values -----

    fn stop(&mut self) -> Res<Value> {
        let root = self.pop()?;
        let (v, size, _) = self.resolve(root, 0)?;
        if size > self.node_budget {
            return Err(self.limit("value tree size", self.node_budget));
        }
        Ok(v)
    }

    fn resolve(&mut self, slot: Slot, depth: usize) -> Res<(Value, u64, usize)> {
        match slot {
            Slot::Leaf(v) => Ok((v, 1, 0)),
            Slot::Node(i) => self.resolve_node(i as usize, depth),
        }
    }

    fn resolve_node(&mut self, idx: usize, depth: usize) -> Res<(Value, u64, usize)> {
        let max_depth = self.limits.max_depth;
        if depth >= max_depth {
            return Err(self.limit("nesting depth", max_depth as u64));
        }
        let state = match self.nodes.get_mut(idx) {
            Some(s) => std::mem::replace(s, NodeState::Busy),
            None => return Err(PickleErrorKind::MemoMissing(idx as u64)),
        };
        let node = match state {
            NodeState::Done(v, size, height) => {
                self.nodes[idx] = NodeState::Done(v.clone(), size, height);
                if depth + height >= max_depth {
                    return Err(self.limit("nesting depth", max_depth as u64));
                }
                return Ok((v, size, height));
            }
            NodeState::Busy => return Err(PickleErrorKind::Recursive),
            NodeState::Pending(node) => node,
        };
        let mut size = 1u64;
        let mut height = 0usize;
        let value = match node {
            Node::List(items) => {
                Value::List(self.resolve_items(items, depth, &mut size, &mut height)?)
            }
            Node::Tuple(items) => {
                Value::Tuple(self.resolve_items(items, depth, &mut size, &mut height)?)
            }
            Node::Set(items) => {
                Value::Set(self.resolve_items(items, depth, &mut size, &mut height)?)
            }
            Node::Dict(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    let k = self.resolve_child(k, depth, &mut size, &mut height)?;
                    let v = self.resolve_child(v, depth, &mut size, &mut height)?;
                    out.push((k, v));
                }
                Value::Dict(out.into())
            }
        };
        self.nodes[idx] = NodeState::Done(value.clone(), size, height);
        Ok((value, size, height))
    }

    fn resolve_child(
        &mut self,
        s: Slot,
        depth: usize,
        size: &mut u64,
        height: &mut usize,
    ) -> Res<Value> {
        let (v, n, h) = self.resolve(s, depth + 1)?;
        *size = size.saturating_add(n);
        if *size > self.node_budget {
            return Err(self.limit("value tree size", self.node_budget));
        }
        *height = (*height).max(h + 1);
        Ok(v)
    }

    fn resolve_items(
        &mut self,
        items: Vec<Slot>,
        depth: usize,
        size: &mut u64,
        height: &mut usize,
    ) -> Res<Arc<[Value]>> {
        let mut out = Vec::with_capacity(items.len());
        for s in items {
            out.push(self.resolve_child(s, depth, size, height)?);
        }
        Ok(out.into())
    }
}

fn pairs(items: Vec<Slot>) -> Res<Vec<(Slot, Slot)>> {
    if items.len() % 2 != 0 {
        return Err(PickleErrorKind::OddItems);
    }
    let mut out = Vec::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.push((k, v));
    }
    Ok(out)
}

fn bytes_or_str(b: Vec<u8>) -> Value {
    match String::from_utf8(b) {
        Ok(s) => Value::Str(s.into()),
        Err(e) => Value::Bytes(e.into_bytes().into()),
    }
}

#[cfg(test)]
mod tests;
