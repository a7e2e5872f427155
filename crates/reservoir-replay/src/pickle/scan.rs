//! [`Scanner`]: the opcode framing of a pickle, checked a chunk at a time
//! while the file is read, so that a file that is no pickle (or that stops
//! being one: a header, then a hole of zeros) is refused at its first bad
//! byte, before the rest of it is read.

use reservoir::observe::pickle::op;

use super::{PickleError, PickleErrorKind};

/// What the scanner expects next.
#[derive(Clone, Copy, Debug)]
enum State {
    /// An opcode.
    Opcode,
    /// `left` more bytes of an argument of `need` bytes.
    Skip { left: u64, need: u64 },
    /// A little-endian length of `width` bytes (`got` read so far, value
    /// `value`), then that many bytes; `signed`: a 4-byte length read as an
    /// `i32` (`BINSTRING`, `LONG4`), negative being an error.
    Len {
        width: u8,
        got: u8,
        value: u64,
        signed: bool,
    },
    /// `lines` more newline-terminated argument lines; `raw`: the bytes may
    /// be anything (a string, a name), else a NUL byte is an error (no
    /// number or memo index holds one).
    Lines { lines: u8, raw: bool },
    /// After `STOP` (at byte `at`): the pickle is whole.
    Stopped { at: u64 },
}

/// How an opcode's argument is framed.
enum Arg {
    None,
    Fixed(u64),
    Len(u8, bool),
    Lines(u8, bool),
}

fn arg(opcode: u8) -> Option<Arg> {
    use op::*;
    Some(match opcode {
        MARK | STOP | POP | POP_MARK | DUP | NONE | BINPERSID | REDUCE | APPEND | BUILD | DICT
        | EMPTY_DICT | APPENDS | LIST | EMPTY_LIST | OBJ | SETITEM | TUPLE | EMPTY_TUPLE
        | SETITEMS | NEWOBJ | TUPLE1 | TUPLE2 | TUPLE3 | NEWTRUE | NEWFALSE | EMPTY_SET
        | ADDITEMS | FROZENSET | NEWOBJ_EX | STACK_GLOBAL | MEMOIZE | NEXT_BUFFER
        | READONLY_BUFFER => Arg::None,
        BININT1 | BINGET | BINPUT | PROTO | EXT1 => Arg::Fixed(1),
        BININT2 | EXT2 => Arg::Fixed(2),
        BININT | LONG_BINGET | LONG_BINPUT | EXT4 => Arg::Fixed(4),
        BINFLOAT | FRAME => Arg::Fixed(8),
        SHORT_BINSTRING | SHORT_BINBYTES | SHORT_BINUNICODE | LONG1 => Arg::Len(1, false),
        BINSTRING | LONG4 => Arg::Len(4, true),
        BINUNICODE | BINBYTES => Arg::Len(4, false),
        BINUNICODE8 | BINBYTES8 | BYTEARRAY8 => Arg::Len(8, false),
        // Numbers and memo indices hold no NUL; strings and names may
        // (the reader takes them).
        FLOAT | INT | LONG | PERSID | GET | PUT => Arg::Lines(1, false),
        STRING | UNICODE => Arg::Lines(1, true),
        GLOBAL | INST => Arg::Lines(2, true),
        _ => return None,
    })
}

/// Checks a pickle's opcode framing as its bytes arrive: every byte where
/// an opcode is due is one, every argument is whole, and nothing follows
/// the `STOP` opcode. It does not run the opcodes (the reader,
/// [`super::from_slice`], does that once the file is read); it only makes
/// a file that is not a pickle fail at its first bad byte, whatever its
/// size.
///
/// ```
/// use reservoir_replay::pickle::Scanner;
///
/// let mut s = Scanner::new();
/// s.feed(b"\x80\x04K\x07").unwrap();
/// s.feed(b".").unwrap();
/// s.finish().unwrap();
/// // A hole of zeros after the header: refused at its first byte.
/// let e = Scanner::new().feed(b"\x80\x04\0\0\0").unwrap_err();
/// assert_eq!(e.offset, 2);
/// // Bytes after STOP.
/// let e = Scanner::new().feed(b"K\x07.\n").unwrap_err();
/// assert_eq!(e.offset, 3);
/// assert!(e.to_string().contains("after the STOP opcode at byte 2"), "{e}");
/// ```
#[derive(Clone, Debug)]
pub struct Scanner {
    /// Offset of the next byte.
    offset: u64,
    /// Offset and byte of the opcode whose argument is being read.
    opcode: (u64, u8),
    state: State,
}

impl Default for Scanner {
    fn default() -> Scanner {
        Scanner::new()
    }
}

impl Scanner {
    /// A scanner at the first byte of a pickle.
    pub fn new() -> Scanner {
        Scanner {
            offset: 0,
            opcode: (0, 0),
            state: State::Opcode,
        }
    }

    /// Bytes scanned so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Offset of the `STOP` opcode, once it was seen.
    pub fn stop(&self) -> Option<u64> {
        match self.state {
            State::Stopped { at } => Some(at),
            _ => None,
        }
    }

    fn error(&self, offset: u64, opcode: Option<u8>, kind: PickleErrorKind) -> PickleError {
        PickleError {
            offset: usize::try_from(offset).unwrap_or(usize::MAX),
            opcode,
            kind,
        }
    }

    /// Scan the next bytes of the pickle: an error names the first byte
    /// (or the opcode) that makes it no pickle.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), PickleError> {
        while !chunk.is_empty() {
            match self.state {
                State::Stopped { at } => {
                    return Err(self.error(
                        self.offset,
                        None,
                        PickleErrorKind::TrailingData { stop: at },
                    ));
                }
                State::Opcode => {
                    let b = chunk[0];
                    let Some(a) = arg(b) else {
                        return Err(self.error(
                            self.offset,
                            Some(b),
                            PickleErrorKind::UnknownOpcode,
                        ));
                    };
                    self.opcode = (self.offset, b);
                    self.state = match a {
                        _ if b == op::STOP => State::Stopped { at: self.offset },
                        Arg::None => State::Opcode,
                        Arg::Fixed(n) => State::Skip { left: n, need: n },
                        Arg::Len(width, signed) => State::Len {
                            width,
                            got: 0,
                            value: 0,
                            signed,
                        },
                        Arg::Lines(lines, raw) => State::Lines { lines, raw },
                    };
                    chunk = &chunk[1..];
                    self.offset += 1;
                }
                State::Skip { left, need } => {
                    let n = left.min(chunk.len() as u64);
                    chunk = &chunk[n as usize..];
                    self.offset += n;
                    self.state = match left - n {
                        0 => State::Opcode,
                        left => State::Skip { left, need },
                    };
                }
                State::Len {
                    width,
                    got,
                    value,
                    signed,
                } => {
                    let value = value | u64::from(chunk[0]) << (8 * got);
                    chunk = &chunk[1..];
                    self.offset += 1;
                    let got = got + 1;
                    self.state = if got < width {
                        State::Len {
                            width,
                            got,
                            value,
                            signed,
                        }
                    } else if signed && value >= 1 << 31 {
                        let (at, b) = self.opcode;
                        return Err(self.error(
                            at,
                            Some(b),
                            PickleErrorKind::Literal(format!(
                                "negative length {}",
                                value as u32 as i32
                            )),
                        ));
                    } else if value == 0 {
                        State::Opcode
                    } else {
                        State::Skip {
                            left: value,
                            need: value,
                        }
                    };
                }
                State::Lines { lines, raw } => {
                    let end = chunk.iter().position(|&b| b == b'\n');
                    let line = &chunk[..end.unwrap_or(chunk.len())];
                    if !raw {
                        if let Some(i) = line.iter().position(|&b| b == 0) {
                            let (at, b) = self.opcode;
                            return Err(self.error(
                                at,
                                Some(b),
                                PickleErrorKind::Literal(format!(
                                    "NUL byte at byte {} in a text argument",
                                    self.offset + i as u64
                                )),
                            ));
                        }
                    }
                    match end {
                        None => {
                            self.offset += chunk.len() as u64;
                            chunk = &[];
                        }
                        Some(i) => {
                            self.offset += i as u64 + 1;
                            chunk = &chunk[i + 1..];
                            self.state = match lines - 1 {
                                0 => State::Opcode,
                                lines => State::Lines { lines, raw },
                            };
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The end of the input: an error unless the pickle ended with `STOP`.
    pub fn finish(&self) -> Result<(), PickleError> {
        let (at, b) = self.opcode;
        match self.state {
            State::Stopped { .. } => Ok(()),
            State::Opcode => Err(self.error(self.offset, None, PickleErrorKind::UnexpectedEnd)),
            State::Lines { .. } => Err(self.error(at, Some(b), PickleErrorKind::MissingNewline)),
            // As the reader says it: the argument's whole size, and the
            // bytes of it the input holds.
            State::Skip { left, need } => Err(self.error(
                at,
                Some(b),
                PickleErrorKind::Truncated {
                    needed: need,
                    remaining: usize::try_from(need - left).unwrap_or(usize::MAX),
                },
            )),
            State::Len { width, got, .. } => Err(self.error(
                at,
                Some(b),
                PickleErrorKind::Truncated {
                    needed: u64::from(width),
                    remaining: usize::from(got),
                },
            )),
        }
    }
}

/// Check `data`'s opcode framing whole (see [`Scanner`]): the pickle ends
/// with its `STOP` opcode, the last byte.
pub fn scan(data: &[u8]) -> Result<(), PickleError> {
    let mut s = Scanner::new();
    s.feed(data)?;
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir::observe::pickle::opcode_name;

    #[test]
    fn every_opcode_the_reader_knows_is_framed() {
        for b in 0..=255u8 {
            assert_eq!(arg(b).is_some(), opcode_name(b).is_some(), "{b:#04x}");
        }
    }

    #[test]
    fn chunks_of_any_size_scan_alike() {
        // PROTO 4, FRAME, SHORT_BINUNICODE "ab", BINBYTES 3, INT "12\n",
        // GLOBAL "m\nn\n", BINSTRING, STOP
        let mut p =
            b"\x80\x04\x95\x10\0\0\0\0\0\0\0\x8c\x02abB\x03\0\0\0xyzI12\ncm\nn\nT\x01\0\0\0q"
                .to_vec();
        p.push(b'.');
        for size in 1..p.len() {
            let mut s = Scanner::new();
            for c in p.chunks(size) {
                s.feed(c).unwrap();
            }
            s.finish().unwrap();
            assert_eq!(s.stop(), Some(p.len() as u64 - 1));
        }
        for cut in 0..p.len() {
            assert!(scan(&p[..cut]).is_err(), "cut at {cut}");
        }
        let mut trailing = p.clone();
        trailing.push(b'\n');
        let e = scan(&trailing).unwrap_err();
        assert_eq!(e.offset, p.len());
        assert_eq!(
            e.kind,
            PickleErrorKind::TrailingData {
                stop: p.len() as u64 - 1
            }
        );
        // A negative BINSTRING length; a NUL in a text argument.
        assert!(scan(b"T\xff\xff\xff\xff.").is_err());
        let e = scan(b"I1\x002\n.").unwrap_err();
        assert!(e.to_string().contains("NUL byte at byte 2"), "{e}");
    }
}
