//! The opcodes the reader runs: [`Parser::step`] dispatches each, in one
//! `match`, to the code of its family (stack control, scalars, strings, new
//! containers, container updates, the memo, globals and calls).

use std::sync::Arc;

use reservoir::observe::pickle::{op, BigInt, GlobalName, Value};

use super::text::{
    escape_decode, parse_decimal, parse_index, raw_unicode_escape_decode, trim_ascii,
    trim_ascii_end,
};
use super::{bytes_or_str, pairs, Node, NodeState, Parser, PickleErrorKind, Res, Slot};

impl Parser<'_> {
    /// Run one opcode.
    pub(super) fn step(&mut self, opcode: u8) -> Res<()> {
        use op::*;
        match opcode {
            // The stream and the stack.
            PROTO => self.proto(),
            FRAME => self.frame(),
            MARK => self.mark(),
            POP => self.pop_top(),
            POP_MARK => self.pop_mark().map(drop),
            DUP => self.dup(),
            // Scalars.
            NONE => self.push_leaf(Value::None),
            NEWTRUE => self.push_leaf(Value::Bool(true)),
            NEWFALSE => self.push_leaf(Value::Bool(false)),
            BININT => self.i32le().and_then(|v| self.push_int(v.into())),
            BININT1 => self.u8().and_then(|v| self.push_int(v.into())),
            BININT2 => self.u16le().and_then(|v| self.push_int(v.into())),
            LONG1 => self.u8().and_then(|n| self.long_le(n.into())),
            LONG4 => self.len_i32().and_then(|n| self.long_le(n)),
            INT => self.int_text(),
            LONG => self.long_text(),
            FLOAT => self.float_text(),
            BINFLOAT => self.binfloat(),
            // Strings and bytes.
            STRING => self.string_text(),
            BINSTRING => self.len_i32().and_then(|n| self.binstring(n)),
            SHORT_BINSTRING => self.u8().and_then(|n| self.binstring(n.into())),
            UNICODE => self.unicode_text(),
            SHORT_BINUNICODE => self.u8().and_then(|n| self.unicode(n.into())),
            BINUNICODE => self.u32le().and_then(|n| self.unicode(n.into())),
            BINUNICODE8 => self.u64le().and_then(|n| self.unicode(n)),
            SHORT_BINBYTES => self.u8().and_then(|n| self.bytes(n.into())),
            BINBYTES => self.u32le().and_then(|n| self.bytes(n.into())),
            BINBYTES8 | BYTEARRAY8 => self.u64le().and_then(|n| self.bytes(n)),
            // New containers.
            EMPTY_LIST => self.push_node(Node::List(Vec::new())),
            EMPTY_DICT => self.push_node(Node::Dict(Vec::new())),
            EMPTY_TUPLE => self.push_node(Node::Tuple(Vec::new())),
            EMPTY_SET => self.push_node(Node::Set(Vec::new())),
            LIST => self
                .pop_mark()
                .and_then(|items| self.push_node(Node::List(items))),
            TUPLE => self
                .pop_mark()
                .and_then(|items| self.push_node(Node::Tuple(items))),
            FROZENSET => self
                .pop_mark()
                .and_then(|items| self.push_node(Node::Set(items))),
            DICT => self.dict(),
            TUPLE1 | TUPLE2 | TUPLE3 => self.small_tuple(usize::from(opcode - TUPLE1 + 1)),
            // Items added to the container under them.
            APPEND => self.append(),
            APPENDS => self.appends(),
            SETITEM => self.setitem(),
            SETITEMS => self.setitems(),
            ADDITEMS => self.additems(),
            // The memo.
            GET => self
                .line()
                .and_then(parse_index)
                .and_then(|i| self.memo_get(i)),
            BINGET => self.u8().and_then(|i| self.memo_get(i.into())),
            LONG_BINGET => self.u32le().and_then(|i| self.memo_get(i.into())),
            PUT => self
                .line()
                .and_then(parse_index)
                .and_then(|i| self.memo_put(i)),
            BINPUT => self.u8().and_then(|i| self.memo_put(i.into())),
            LONG_BINPUT => self.u32le().and_then(|i| self.memo_put(i.into())),
            MEMOIZE => self.memo_put(self.memo_count as u64),
            // Globals and calls; what would build class instances is refused.
            GLOBAL => self.global(),
            STACK_GLOBAL => self.stack_global(),
            REDUCE => self.reduce(),
            BUILD => Err(PickleErrorKind::Unsupported("BUILD sets object state")),
            NEWOBJ | NEWOBJ_EX => Err(PickleErrorKind::Unsupported(
                "NEWOBJ builds class instances",
            )),
            INST | OBJ => Err(PickleErrorKind::Unsupported(
                "INST/OBJ build class instances",
            )),
            PERSID | BINPERSID => Err(PickleErrorKind::Unsupported("persistent ids")),
            EXT1 | EXT2 | EXT4 => Err(PickleErrorKind::Unsupported("extension registry codes")),
            NEXT_BUFFER | READONLY_BUFFER => {
                Err(PickleErrorKind::Unsupported("out-of-band buffers"))
            }
            _ => Err(PickleErrorKind::UnknownOpcode),
        }
    }

    // ----- the stream and the stack -----

    #[inline]
    fn proto(&mut self) -> Res<()> {
        let v = self.u8()?;
        if v > 5 {
            return Err(PickleErrorKind::Protocol(v));
        }
        Ok(())
    }

    #[inline]
    fn frame(&mut self) -> Res<()> {
        let n = self.u64le()?;
        let remaining = self.remaining();
        if n > remaining as u64 {
            return Err(PickleErrorKind::Truncated {
                needed: n,
                remaining,
            });
        }
        Ok(())
    }

    #[inline]
    fn mark(&mut self) -> Res<()> {
        if self.stack.len() + self.marks.len() >= self.limits.max_stack {
            return Err(self.limit("stack", self.limits.max_stack as u64));
        }
        self.marks.push(self.stack.len());
        Ok(())
    }

    /// `POP`: the top item, or the top mark when no item is above it.
    #[inline]
    fn pop_top(&mut self) -> Res<()> {
        if self.stack.len() > self.fence() {
            self.stack.pop();
        } else if self.marks.pop().is_none() {
            return Err(PickleErrorKind::StackUnderflow);
        }
        Ok(())
    }

    #[inline]
    fn dup(&mut self) -> Res<()> {
        let s = self.top()?.clone();
        self.push(s)
    }

    // ----- scalars -----

    #[inline]
    fn push_int(&mut self, v: i64) -> Res<()> {
        self.push_leaf(Value::Int(v))
    }

    /// `LONG1` / `LONG4`: an `n`-byte little-endian two's-complement integer.
    #[inline]
    fn long_le(&mut self, n: u64) -> Res<()> {
        let b = self.take(n)?;
        self.push_leaf(BigInt::from_signed_le(b))
    }

    /// `INT`: a decimal line (`00` and `01` are the booleans).
    fn int_text(&mut self) -> Res<()> {
        let s = self.line()?;
        let v = match trim_ascii(s) {
            b"00" => Value::Bool(false),
            b"01" => Value::Bool(true),
            t => parse_decimal(t, self.limits.max_int_digits)?,
        };
        self.push_leaf(v)
    }

    /// `LONG`: a decimal line, with or without its `L`.
    fn long_text(&mut self) -> Res<()> {
        let s = trim_ascii(self.line()?);
        let s = s.strip_suffix(b"L").unwrap_or(s);
        let v = parse_decimal(s, self.limits.max_int_digits)?;
        self.push_leaf(v)
    }

    /// `FLOAT`: a float line.
    fn float_text(&mut self) -> Res<()> {
        let s = std::str::from_utf8(trim_ascii(self.line()?)).map_err(|_| PickleErrorKind::Utf8)?;
        let f: f64 = s
            .parse()
            .map_err(|_| PickleErrorKind::Literal(format!("float {s:?}")))?;
        self.push_leaf(Value::Float(f))
    }

    #[inline]
    fn binfloat(&mut self) -> Res<()> {
        let b = self.take_array::<8>()?;
        self.push_leaf(Value::Float(f64::from_be_bytes(b)))
    }

    // ----- strings and bytes -----

    /// `STRING`: a quoted, escaped line.
    fn string_text(&mut self) -> Res<()> {
        let s = self.line()?;
        let s = trim_ascii_end(s);
        let inner = match s {
            [q, inner @ .., q2] if q == q2 && (*q == b'\'' || *q == b'"') => inner,
            _ => {
                return Err(PickleErrorKind::Literal(
                    "STRING argument must be quoted".into(),
                ))
            }
        };
        let bytes = escape_decode(inner)?;
        self.push_leaf(bytes_or_str(bytes))
    }

    /// `BINSTRING` / `SHORT_BINSTRING`: `n` bytes, a `str` when they are
    /// UTF-8.
    #[inline]
    fn binstring(&mut self, n: u64) -> Res<()> {
        let b = self.take(n)?;
        self.push_leaf(bytes_or_str(b.to_vec()))
    }

    /// `UNICODE`: a raw-unicode-escaped line.
    fn unicode_text(&mut self) -> Res<()> {
        let s = raw_unicode_escape_decode(self.line()?)?;
        self.push_leaf(Value::Str(s.into()))
    }

    // ----- new containers -----

    /// `DICT`: the key-value pairs above the top mark.
    fn dict(&mut self) -> Res<()> {
        let items = self.pop_mark()?;
        let pairs = pairs(items)?;
        self.push_node(Node::Dict(pairs))
    }

    /// `TUPLE1` to `TUPLE3`: the top `n` items.
    fn small_tuple(&mut self, n: usize) -> Res<()> {
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(self.pop()?);
        }
        items.reverse();
        self.push_node(Node::Tuple(items))
    }

    // ----- items added to the container under them -----

    /// The list the top slot is, or a type error.
    fn top_list(&mut self) -> Res<&mut Vec<Slot>> {
        match self.top_node_mut("list")? {
            Node::List(l) => Ok(l),
            other => Err(PickleErrorKind::Type {
                expected: "list",
                found: other.type_name(),
            }),
        }
    }

    /// The dict the top slot is, or a type error.
    fn top_dict(&mut self) -> Res<&mut Vec<(Slot, Slot)>> {
        match self.top_node_mut("dict")? {
            Node::Dict(d) => Ok(d),
            other => Err(PickleErrorKind::Type {
                expected: "dict",
                found: other.type_name(),
            }),
        }
    }

    #[inline]
    fn append(&mut self) -> Res<()> {
        let v = self.pop()?;
        self.charge(1)?;
        self.top_list()?.push(v);
        Ok(())
    }

    #[inline]
    fn appends(&mut self) -> Res<()> {
        let items = self.pop_mark()?;
        self.charge(items.len())?;
        self.top_list()?.extend(items);
        Ok(())
    }

    #[inline]
    fn setitem(&mut self) -> Res<()> {
        let v = self.pop()?;
        let k = self.pop()?;
        self.charge(2)?;
        self.top_dict()?.push((k, v));
        Ok(())
    }

    #[inline]
    fn setitems(&mut self) -> Res<()> {
        let items = self.pop_mark()?;
        let new = pairs(items)?;
        self.charge(new.len().saturating_mul(2))?;
        self.top_dict()?.extend(new);
        Ok(())
    }

    fn additems(&mut self) -> Res<()> {
        let items = self.pop_mark()?;
        self.charge(items.len())?;
        match self.top_node_mut("set")? {
            Node::Set(s) => s.extend(items),
            other => {
                return Err(PickleErrorKind::Type {
                    expected: "set",
                    found: other.type_name(),
                })
            }
        }
        Ok(())
    }

    // ----- globals and calls -----

    /// `GLOBAL`: module and name lines.
    fn global(&mut self) -> Res<()> {
        let module = self.line_str()?.to_string();
        let name = self.line_str()?.to_string();
        self.push_leaf(Value::Global(Arc::new(GlobalName { module, name })))
    }

    /// `STACK_GLOBAL`: module and name strings from the stack.
    fn stack_global(&mut self) -> Res<()> {
        let name = self.pop()?;
        let module = self.pop()?;
        match (module, name) {
            (Slot::Leaf(Value::Str(m)), Slot::Leaf(Value::Str(n))) => {
                let g = GlobalName {
                    module: m.to_string(),
                    name: n.to_string(),
                };
                self.push_leaf(Value::Global(Arc::new(g)))
            }
            (m, n) => {
                let found = if matches!(m, Slot::Leaf(Value::Str(_))) {
                    self.slot_type(&n)
                } else {
                    self.slot_type(&m)
                };
                Err(PickleErrorKind::Type {
                    expected: "str",
                    found,
                })
            }
        }
    }

    fn unicode(&mut self, n: u64) -> Res<()> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| PickleErrorKind::Utf8)?;
        self.push_leaf(Value::Str(s.into()))
    }

    fn bytes(&mut self, n: u64) -> Res<()> {
        let b = self.take(n)?;
        self.push_leaf(Value::Bytes(b.into()))
    }

    /// `REDUCE` for the plain-data constructors only.
    fn reduce(&mut self) -> Res<()> {
        let args = self.pop()?;
        let callable = self.pop()?;
        let g = match &callable {
            Slot::Leaf(Value::Global(g)) => g.clone(),
            other => {
                return Err(PickleErrorKind::Type {
                    expected: "global",
                    found: self.slot_type(other),
                })
            }
        };
        let args = match &args {
            Slot::Node(i) => match self.nodes.get(*i as usize) {
                Some(NodeState::Pending(Node::Tuple(t))) if t.len() <= 2 => t.clone(),
                Some(NodeState::Pending(Node::Tuple(_))) => {
                    return Err(PickleErrorKind::BadArgs("a plain-data constructor"))
                }
                _ => {
                    return Err(PickleErrorKind::Type {
                        expected: "tuple",
                        found: self.slot_type(&args),
                    })
                }
            },
            Slot::Leaf(v) => {
                return Err(PickleErrorKind::Type {
                    expected: "tuple",
                    found: v.type_name(),
                })
            }
        };
        let module = match g.module.as_str() {
            "__builtin__" => "builtins",
            m => m,
        };
        match (module, g.name.as_str()) {
            ("collections", "OrderedDict") => {
                let pairs_out = match args.as_slice() {
                    [] => Vec::new(),
                    [src] => {
                        if let Slot::Node(i) = src {
                            if let Some(NodeState::Pending(Node::Dict(d))) =
                                self.nodes.get(*i as usize)
                            {
                                let d = d.clone();
                                return self.push_node(Node::Dict(d));
                            }
                        }
                        let items = self
                            .seq_items(src)
                            .ok_or(PickleErrorKind::BadArgs("collections.OrderedDict"))?;
                        let mut out = Vec::with_capacity(items.len());
                        for it in &items {
                            match self.seq_items(it).as_deref() {
                                Some([k, v]) => out.push((k.clone(), v.clone())),
                                _ => {
                                    return Err(PickleErrorKind::BadArgs("collections.OrderedDict"))
                                }
                            }
                        }
                        out
                    }
                    _ => return Err(PickleErrorKind::BadArgs("collections.OrderedDict")),
                };
                self.push_node(Node::Dict(pairs_out))
            }
            ("builtins", "set" | "frozenset") => {
                let items = match args.as_slice() {
                    [] => Vec::new(),
                    [src] => self.seq_items(src).ok_or(PickleErrorKind::BadArgs("set"))?,
                    _ => return Err(PickleErrorKind::BadArgs("set")),
                };
                self.push_node(Node::Set(items))
            }
            ("builtins", "bytearray") => match args.as_slice() {
                [] => self.push_leaf(Value::Bytes(Arc::from(&[][..]))),
                [Slot::Leaf(Value::Bytes(b))] => {
                    let b = b.clone();
                    self.push_leaf(Value::Bytes(b))
                }
                _ => Err(PickleErrorKind::BadArgs("bytearray")),
            },
            ("_codecs", "encode") => match args.as_slice() {
                [Slot::Leaf(Value::Str(s)), Slot::Leaf(Value::Str(enc))] => {
                    let enc = enc.to_ascii_lowercase().replace('_', "-");
                    let bytes: Vec<u8> = match enc.as_str() {
                        "latin1" | "latin-1" | "iso-8859-1" | "iso8859-1" => s
                            .chars()
                            .map(|c| u8::try_from(u32::from(c)))
                            .collect::<Result<_, _>>()
                            .map_err(|_| PickleErrorKind::BadArgs("_codecs.encode"))?,
                        "utf-8" | "utf8" => s.as_bytes().to_vec(),
                        _ => return Err(PickleErrorKind::BadArgs("_codecs.encode")),
                    };
                    self.push_leaf(Value::Bytes(bytes.into()))
                }
                _ => Err(PickleErrorKind::BadArgs("_codecs.encode")),
            },
            _ => Err(PickleErrorKind::Call(g.to_string())),
        }
    }
}
