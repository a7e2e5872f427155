//! The arguments of the protocol-0 text opcodes (`INT`, `LONG`, `FLOAT`,
//! `STRING`, `UNICODE`, `GET`/`PUT`): decimal numbers, memo indices and
//! Python's escape decodings, as CPython's unpickler reads them.

use reservoir::observe::pickle::{BigInt, Value};

use super::{PickleErrorKind, Res};

pub(super) fn trim_ascii(s: &[u8]) -> &[u8] {
    trim_ascii_end(trim_ascii_start(s))
}

fn trim_ascii_start(mut s: &[u8]) -> &[u8] {
    while let [first, rest @ ..] = s {
        if first.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

pub(super) fn trim_ascii_end(mut s: &[u8]) -> &[u8] {
    while let [rest @ .., last] = s {
        if last.is_ascii_whitespace() {
            s = rest;
        } else {
            break;
        }
    }
    s
}

/// A memo index written in decimal (`GET` / `PUT`).
pub(super) fn parse_index(s: &[u8]) -> Res<u64> {
    let t = trim_ascii(s);
    std::str::from_utf8(t)
        .ok()
        .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| {
            PickleErrorKind::Literal(format!("memo index {:?}", String::from_utf8_lossy(t)))
        })
}

/// A decimal integer of any size (at most `max_digits` digits).
pub(super) fn parse_decimal(s: &[u8], max_digits: usize) -> Res<Value> {
    let bad = || PickleErrorKind::Literal(format!("int {:?}", String::from_utf8_lossy(s)));
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    if digits.len() > max_digits {
        return Err(PickleErrorKind::Limit {
            what: "int digits",
            limit: max_digits as u64,
        });
    }
    if digits.len() <= 18 {
        let mut v: i64 = 0;
        for d in digits {
            v = v * 10 + i64::from(d - b'0');
        }
        return Ok(Value::Int(if neg { -v } else { v }));
    }
    // Magnitude in base 2^32 limbs, little-endian.
    let mut limbs: Vec<u32> = vec![0];
    for d in digits {
        let mut carry = u64::from(d - b'0');
        for l in limbs.iter_mut() {
            let x = u64::from(*l) * 10 + carry;
            *l = x as u32;
            carry = x >> 32;
        }
        if carry != 0 {
            limbs.push(carry as u32);
        }
    }
    let mut bytes: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    bytes.push(0); // sign byte
    if neg {
        let mut carry = 1u16;
        for b in bytes.iter_mut() {
            let v = u16::from(!*b) + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    Ok(BigInt::from_signed_le(&bytes))
}

fn hex_digit(b: u8) -> Option<u32> {
    (b as char).to_digit(16)
}

/// Python's `codecs.escape_decode` (the `STRING` opcode's argument).
pub(super) fn escape_decode(s: &[u8]) -> Res<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        i += 1;
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let Some(&e) = s.get(i) else {
            return Err(PickleErrorKind::Literal(
                "trailing backslash in STRING".into(),
            ));
        };
        i += 1;
        match e {
            b'\n' => {}
            b'\\' => out.push(b'\\'),
            b'\'' => out.push(b'\''),
            b'"' => out.push(b'"'),
            b'a' => out.push(7),
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(e - b'0');
                for _ in 0..2 {
                    match s.get(i) {
                        Some(&d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                out.push(v as u8);
            }
            b'x' => {
                let h = s.get(i).copied().and_then(hex_digit);
                let l = s.get(i + 1).copied().and_then(hex_digit);
                match (h, l) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => {
                        return Err(PickleErrorKind::Literal(
                            "invalid \\x escape in STRING".into(),
                        ))
                    }
                }
            }
            other => {
                out.push(b'\\');
                out.push(other);
            }
        }
    }
    Ok(out)
}

/// Python's `raw-unicode-escape` decoding (the `UNICODE` opcode's argument):
/// bytes are Latin-1 characters, except `\uXXXX` and `\UXXXXXXXX` escapes
/// after an odd run of backslashes.
pub(super) fn raw_unicode_escape_decode(s: &[u8]) -> Res<String> {
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c != b'\\' {
            out.push(char::from(c));
            i += 1;
            continue;
        }
        let run_start = i;
        while i < s.len() && s[i] == b'\\' {
            i += 1;
        }
        let run = i - run_start;
        let digits = match s.get(i) {
            Some(b'u') if run % 2 == 1 => 4,
            Some(b'U') if run % 2 == 1 => 8,
            _ => 0,
        };
        let literal = if digits > 0 { run - 1 } else { run };
        for _ in 0..literal {
            out.push('\\');
        }
        if digits > 0 {
            let hex = s
                .get(i + 1..i + 1 + digits)
                .ok_or_else(|| PickleErrorKind::Literal("truncated \\u escape".into()))?;
            let mut v: u32 = 0;
            for &h in hex {
                let d = hex_digit(h)
                    .ok_or_else(|| PickleErrorKind::Literal("invalid \\u escape".into()))?;
                v = v
                    .checked_mul(16)
                    .and_then(|v| v.checked_add(d))
                    .ok_or(PickleErrorKind::Utf8)?;
            }
            out.push(char::from_u32(v).ok_or(PickleErrorKind::Utf8)?);
            i += 1 + digits;
        }
    }
    Ok(out)
}
