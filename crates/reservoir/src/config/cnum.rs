//! Numbers as the C library reads them: `std::stoull` and `std::stod`
//! (glibc `strtoull` / `strtod`, exact to the last bit and the last range
//! error, with a small big-integer type for decimal-to-binary rounding), and
//! libstdc++'s `istream >> double`. PyTorch reads every settings value with
//! one of these, so their quirks are part of what a settings string means.

use std::cmp::Ordering;

/// C `isspace` in the "C" locale.
pub(super) fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// What every C number reader does first: skip `isspace` characters, then
/// read an optional `+` or `-`. The index after them, and whether it was `-`.
fn sign_prefix(b: &[u8]) -> (usize, bool) {
    let mut i = 0;
    while i < b.len() && is_c_space(b[i]) {
        i += 1;
    }
    match b.get(i) {
        Some(b'-') => (i + 1, true),
        Some(b'+') => (i + 1, false),
        _ => (i, false),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum NumError {
    /// No number at the start (`std::invalid_argument`).
    Invalid,
    /// `errno == ERANGE` (`std::out_of_range`).
    Range,
}

/// `std::stoull(s)` (base 10): optional sign, digits, anything after ignored;
/// a `-` negates modulo 2^64.
pub(super) fn c_stoull(s: &str) -> Result<u64, NumError> {
    let b = s.as_bytes();
    let (mut i, negative) = sign_prefix(b);
    let start = i;
    let mut value: u64 = 0;
    let mut overflow = false;
    while let Some(&c) = b.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        match value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
        {
            Some(v) => value = v,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start {
        Err(NumError::Invalid)
    } else if overflow {
        Err(NumError::Range)
    } else if negative {
        Ok(value.wrapping_neg())
    } else {
        Ok(value)
    }
}

/// C's `strtol(s, NULL, 0)`: leading white space, an optional sign, then
/// `0x`/`0X` + hexadecimal digits, `0` + octal digits, or decimal digits;
/// parsing stops at the first character that is not a digit of the base;
/// no digits gives 0; overflow saturates at `i64::MIN`/`i64::MAX` (`LONG_MIN`/`LONG_MAX`).
pub fn strtol_base0(s: &str) -> i64 {
    let b = s.as_bytes();
    let (mut i, negative) = sign_prefix(b);
    let mut radix = 10;
    if b.get(i) == Some(&b'0') {
        if matches!(b.get(i + 1), Some(b'x' | b'X'))
            && b.get(i + 2).is_some_and(|c| c.is_ascii_hexdigit())
        {
            radix = 16;
            i += 2;
        } else {
            radix = 8;
        }
    }
    let mut value: i128 = 0;
    while let Some(d) = b.get(i).and_then(|&c| (c as char).to_digit(radix)) {
        value = (value * radix as i128 + d as i128).min(i64::MAX as i128 + 1);
        i += 1;
    }
    let value = if negative { -value } else { value };
    value.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

fn starts_with_ignore_case(b: &[u8], word: &[u8]) -> bool {
    b.len() >= word.len() && b[..word.len()].eq_ignore_ascii_case(word)
}

/// `std::stod(s)` with glibc's `strtod`: decimal, hexadecimal (`0x1.8p-1`),
/// `inf`/`infinity`/`nan` (any case); anything after the number is ignored.
/// Overflow and inexact results below the normal range are range errors.
pub(super) fn c_stod(s: &str) -> Result<f64, NumError> {
    signed_number(s, |rest| match strtod_hex(rest) {
        Some(v) => v.map(Some),
        None => strtod_decimal(rest).map(Some),
    })
}

/// What `strtod` and `std::stod` share: leading blanks and an optional
/// sign, then `inf`/`infinity` or `nan` (any case), else what `number`
/// reads from the rest; `Ok(None)` from it is "no number at all", 0.0
/// (unsigned, as glibc returns it).
fn signed_number<E>(
    s: &str,
    number: impl FnOnce(&[u8]) -> Result<Option<f64>, E>,
) -> Result<f64, E> {
    let b = s.as_bytes();
    let (i, negative) = sign_prefix(b);
    let rest = &b[i..];
    let magnitude = if starts_with_ignore_case(rest, b"inf") {
        f64::INFINITY
    } else if starts_with_ignore_case(rest, b"nan") {
        f64::NAN
    } else {
        match number(rest)? {
            Some(v) => v,
            None => return Ok(0.0),
        }
    };
    Ok(if negative { -magnitude } else { magnitude })
}

/// Reads decimal digits from `b[*i..]` as a saturating exponent.
fn read_exponent(b: &[u8], i: &mut usize) -> i64 {
    let mut e: i64 = 0;
    while let Some(&c) = b.get(*i) {
        if !c.is_ascii_digit() {
            break;
        }
        e = e.saturating_mul(10).saturating_add(i64::from(c - b'0'));
        *i += 1;
    }
    e
}

/// An optional `e`/`p` exponent at `b[*i..]`: consumed only if digits follow.
fn optional_exponent(b: &[u8], i: &mut usize, marks: [u8; 2]) -> i64 {
    if !matches!(b.get(*i), Some(c) if marks.contains(c)) {
        return 0;
    }
    let mut j = *i + 1;
    let negative = match b.get(j) {
        Some(b'-') => {
            j += 1;
            true
        }
        Some(b'+') => {
            j += 1;
            false
        }
        _ => false,
    };
    if !matches!(b.get(j), Some(c) if c.is_ascii_digit()) {
        return 0;
    }
    let e = read_exponent(b, &mut j);
    *i = j;
    if negative {
        -e
    } else {
        e
    }
}

/// C's `strtod(s, NULL)` with `errno` ignored, as PyTorch's MPS allocator
/// reads its watermark ratios: leading blanks, an optional sign, then a
/// decimal or hexadecimal number, `inf`/`infinity` or `nan` (any case);
/// anything after the number is ignored; no number at all gives 0.0;
/// overflow gives ±infinity and underflow the rounded (zero or subnormal)
/// value, as glibc returns them.
pub fn strtod(s: &str) -> f64 {
    let read = signed_number::<std::convert::Infallible>(s, |rest| {
        Ok(match strtod_hex_full(rest) {
            Some((v, _)) => Some(v),
            None => decimal_text(rest).map(|(text, _, _, _)| text.parse().unwrap_or(0.0)),
        })
    });
    match read {
        Ok(v) => v,
        Err(never) => match never {},
    }
}

/// The text of a decimal number at the start of `b` (no sign), its digits,
/// the number of them after the point, and its exponent; `None` when no
/// digit starts it.
fn decimal_text(b: &[u8]) -> Option<(&str, Vec<u8>, i64, i64)> {
    let mut i = 0;
    let mut digits: Vec<u8> = Vec::new();
    let mut frac_len: i64 = 0;
    while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
        digits.push(c - b'0');
        i += 1;
    }
    if b.get(i) == Some(&b'.') {
        i += 1;
        while let Some(&c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            digits.push(c - b'0');
            frac_len += 1;
            i += 1;
        }
    }
    if digits.is_empty() {
        return None;
    }
    let exp = optional_exponent(b, &mut i, [b'e', b'E']);
    let text = std::str::from_utf8(&b[..i]).ok()?;
    Some((text, digits, frac_len, exp))
}

/// Decimal `strtod` (no sign): `digits[.digits][e[sign]digits]`.
fn strtod_decimal(b: &[u8]) -> Result<f64, NumError> {
    let (text, digits, frac_len, exp) = decimal_text(b).ok_or(NumError::Invalid)?;
    let value: f64 = text.parse().map_err(|_| NumError::Invalid)?;
    if value.is_infinite() {
        return Err(NumError::Range);
    }
    let first_nonzero = match digits.iter().position(|&d| d != 0) {
        Some(p) => p,
        None => return Ok(value), // an exact zero
    };
    if value == 0.0 {
        return Err(NumError::Range);
    }
    if value <= f64::MIN_POSITIVE {
        // Exact decimal value = digits * 10^exp10.
        let sig = &digits[first_nonzero..];
        let exp10 = exp.saturating_sub(frac_len);
        if value < f64::MIN_POSITIVE {
            // Subnormal: a range error unless the decimal is exact.
            if cmp_decimal_dyadic(sig, exp10, value.to_bits(), -1074) != Ordering::Equal {
                return Err(NumError::Range);
            }
        } else if cmp_decimal_dyadic(sig, exp10, (1u64 << 54) - 1, -1076) == Ordering::Less {
            // Rounded to 53 bits it would be below 2^-1022: tiny and inexact.
            return Err(NumError::Range);
        }
    }
    Ok(value)
}

/// Hexadecimal `strtod` (no sign) if `b` starts with `0x` and a hex digit
/// (possibly after the point) follows; `None` means "read as decimal".
fn strtod_hex(b: &[u8]) -> Option<Result<f64, NumError>> {
    strtod_hex_full(b).map(|(v, range)| if range { Err(NumError::Range) } else { Ok(v) })
}

/// [`strtod_hex`]'s value whatever `errno` says, and whether it is a range
/// error.
fn strtod_hex_full(b: &[u8]) -> Option<(f64, bool)> {
    if b.len() < 2 || b[0] != b'0' || !matches!(b[1], b'x' | b'X') {
        return None;
    }
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u64);
    let mut i = 2;
    let mut mant: u64 = 0;
    let mut taken = 0; // significant hex digits in `mant`
    let mut exp2: i64 = 0;
    let mut sticky = false;
    let mut any = false;
    while let Some(d) = b.get(i).and_then(|&c| hex(c)) {
        any = true;
        if taken < 16 {
            if mant != 0 || d != 0 {
                mant = mant * 16 + d;
                taken += 1;
            }
        } else {
            sticky |= d != 0;
            exp2 += 4;
        }
        i += 1;
    }
    if b.get(i) == Some(&b'.') {
        let mut j = i + 1;
        let mut frac_any = false;
        while let Some(d) = b.get(j).and_then(|&c| hex(c)) {
            frac_any = true;
            if taken < 16 {
                if mant != 0 || d != 0 {
                    mant = mant * 16 + d;
                    taken += 1;
                }
                exp2 -= 4;
            } else {
                sticky |= d != 0;
            }
            j += 1;
        }
        if any || frac_any {
            any = true;
            i = j;
        }
    }
    if !any {
        return None;
    }
    let e = optional_exponent(b, &mut i, [b'p', b'P']);
    if mant == 0 {
        return Some((0.0, false));
    }
    Some(round_binary(mant, exp2.saturating_add(e), sticky))
}

/// Rounds `mant * 2^exp2` (plus a nonzero tail below it if `sticky`) to the
/// nearest double, ties to even, with glibc's range errors: overflow, and
/// inexact results that are tiny after rounding to 53 bits. The value is
/// glibc's in every case (infinity on overflow); the flag says `ERANGE`.
fn round_binary(mant: u64, exp2: i64, sticky: bool) -> (f64, bool) {
    let msb = 63 - i64::from(mant.leading_zeros());
    // Round to 53 significant bits with an unbounded exponent.
    let shift = msb - 52;
    let (mut m53, mut lead) = (mant, msb.saturating_add(exp2));
    if shift > 0 {
        let (q, up) = round_shift(u128::from(mant), shift as u32, sticky);
        m53 = q as u64 + u64::from(up);
        if m53 == 1 << 53 {
            m53 >>= 1;
            lead = lead.saturating_add(1);
        }
    } else {
        m53 <<= -shift;
    }
    if lead > 1023 {
        return (f64::INFINITY, true);
    }
    if lead >= -1022 {
        let bits = (((lead + 1023) as u64) << 52) | (m53 & ((1 << 52) - 1));
        return (f64::from_bits(bits), false);
    }
    // Tiny: round to the subnormal grid (units of 2^-1074).
    let drop = (-1074i64).saturating_sub(exp2);
    let (q, inexact) = if drop <= 0 {
        (u128::from(mant) << (-drop) as u32, sticky)
    } else if drop >= 128 {
        (0, true)
    } else {
        let (q, up) = round_shift(u128::from(mant), drop as u32, sticky);
        let dropped = u128::from(mant) & ((1u128 << drop) - 1);
        (q + u128::from(up), dropped != 0 || sticky)
    };
    (f64::from_bits(q as u64), inexact)
}

/// `v >> shift` and whether to round up (nearest, ties to even; `sticky`
/// means a nonzero tail below `v`).
fn round_shift(v: u128, shift: u32, sticky: bool) -> (u128, bool) {
    let q = v >> shift;
    let rem = v & ((1u128 << shift) - 1);
    let half = 1u128 << (shift - 1);
    let up = rem > half || (rem == half && (sticky || q & 1 == 1));
    (q, up)
}

/// Compares `digits * 10^exp10` with `n * 2^exp2` exactly.
fn cmp_decimal_dyadic(digits: &[u8], exp10: i64, n: u64, exp2: i64) -> Ordering {
    // Far outside the double range: no need for exact arithmetic.
    let magnitude = digits.len() as i64 + exp10;
    if magnitude < -400 {
        return Ordering::Less;
    }
    if magnitude > 400 {
        return Ordering::Greater;
    }
    let mut a = BigUint::from_digits(digits);
    let mut b = BigUint::from_u64(n);
    if exp10 >= 0 {
        a.mul_pow10(exp10 as u64);
    } else {
        b.mul_pow10(exp10.unsigned_abs());
    }
    if exp2 >= 0 {
        b.shl(exp2 as u64);
    } else {
        a.shl(exp2.unsigned_abs());
    }
    a.cmp(&b)
}

/// Just enough arbitrary precision for [`cmp_decimal_dyadic`].
#[derive(PartialEq, Eq)]
struct BigUint(Vec<u32>); // little-endian limbs, no leading zero limbs

impl BigUint {
    fn from_u64(v: u64) -> BigUint {
        let mut b = BigUint(vec![v as u32, (v >> 32) as u32]);
        b.trim();
        b
    }

    fn from_digits(digits: &[u8]) -> BigUint {
        let mut b = BigUint(Vec::new());
        for chunk in digits.chunks(9) {
            let mut chunk_value = 0u32;
            for &d in chunk {
                chunk_value = chunk_value * 10 + u32::from(d);
            }
            b.mul_add(10u32.pow(chunk.len() as u32), chunk_value);
        }
        b
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn mul_add(&mut self, m: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry != 0 {
            self.0.push(carry as u32);
        }
        self.trim();
    }

    fn mul_pow10(&mut self, mut e: u64) {
        while e >= 9 {
            self.mul_add(1_000_000_000, 0);
            e -= 9;
        }
        self.mul_add(10u32.pow(e as u32), 0);
    }

    fn shl(&mut self, bits: u64) {
        if self.0.is_empty() {
            return;
        }
        let limbs = (bits / 32) as usize;
        let rest = (bits % 32) as u32;
        if rest != 0 {
            self.mul_add(1 << rest, 0);
        }
        let mut shifted = vec![0; limbs];
        shifted.extend_from_slice(&self.0);
        self.0 = shifted;
    }
}

impl PartialOrd for BigUint {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BigUint {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }
}

/// libstdc++'s `istream >> double` in the classic locale, requiring the whole
/// string to be read: the characters `[+-] digits . digits e [+-] digits` are
/// collected (`e` only after a digit, `.` once and before `e`), then `strtod`
/// must read all of them and not overflow. `None` when extraction fails or
/// stops before the end.
pub(super) fn istream_double(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.is_empty() {
        return None;
    }
    let mut acc = String::new();
    let mut i = 0;
    if matches!(b[0], b'+' | b'-') {
        acc.push(b[0] as char);
        i += 1;
    }
    let (mut found_mantissa, mut found_dec, mut found_sci) = (false, false, false);
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() {
            acc.push(c as char);
            found_mantissa = true;
        } else if c == b'.' && !found_dec && !found_sci {
            acc.push('.');
            found_dec = true;
        } else if (c == b'e' || c == b'E') && !found_sci && found_mantissa {
            acc.push('e');
            found_sci = true;
            if let Some(&next) = b.get(i + 1) {
                if next == b'+' || next == b'-' {
                    acc.push(next as char);
                    i += 1;
                }
            }
        } else {
            break;
        }
        i += 1;
    }
    if i < b.len() {
        return None; // not at end of stream
    }
    // `strtod` must consume everything collected.
    let value: f64 = acc.parse().ok()?;
    if value.is_infinite() {
        return None;
    }
    Some(value)
}

/// A `double` written by `std::ostream << x` with the default flags
/// (`%g`, six significant digits): "2.5", "1.8", "1e+20", "inf", "nan".
/// PyTorch's `TORCH_CHECK` messages print their numbers this way.
pub(crate) fn ostream_double(x: f64) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.into();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to six significant digits.
    let sci = format!("{x:.5e}");
    let (mant, exp) = sci.split_once('e').expect("an exponent");
    let exp: i32 = exp.parse().expect("a number");
    let strip = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..6).contains(&exp) {
        strip(&format!("{x:.*}", (5 - exp) as usize))
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", strip(mant), exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // spec 1.17: integers are read with std::stoull.
    #[test]
    fn stoull_like_glibc() {
        assert_eq!(c_stoull("42"), Ok(42));
        assert_eq!(c_stoull("42x"), Ok(42));
        assert_eq!(c_stoull("-1"), Ok(u64::MAX));
        assert_eq!(c_stoull("-18446744073709551615"), Ok(1));
        assert_eq!(c_stoull("-18446744073709551616"), Err(NumError::Range));
        assert_eq!(c_stoull("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(c_stoull("18446744073709551616"), Err(NumError::Range));
        assert_eq!(c_stoull("+"), Err(NumError::Invalid));
        assert_eq!(c_stoull("--1"), Err(NumError::Invalid));
        assert_eq!(c_stoull(""), Err(NumError::Invalid));
        assert_eq!(c_stoull("0x10"), Ok(0));
    }

    // spec 1.17: fractions are read with std::stod (glibc strtod).
    #[test]
    fn stod_like_glibc() {
        let ok = |s: &str, v: f64| assert_eq!(c_stod(s).map(f64::to_bits), Ok(v.to_bits()), "{s}");
        let range = |s: &str| assert_eq!(c_stod(s), Err(NumError::Range), "{s}");
        let invalid = |s: &str| assert_eq!(c_stod(s), Err(NumError::Invalid), "{s}");
        ok("0.5", 0.5);
        ok(".5", 0.5);
        ok("5.", 5.0);
        ok("1e", 1.0);
        ok("1e+", 1.0);
        ok("1.e-1", 0.1);
        ok("-0", -0.0);
        ok("0x", 0.0);
        ok("0x.", 0.0);
        ok("0x.8", 0.5);
        ok("0X1P-1", 0.5);
        ok("0x1p", 1.0);
        ok("0x1.8p-1", 0.75);
        ok("0x.00000000000000000000000001p100", 0.0625);
        ok("0x1.00000000000008p0", 1.0); // tie, to even
        ok("0x1.00000000000018p0", 1.0 + 2.0 * f64::EPSILON);
        ok("0x1.000000000000080000000000001p0", 1.0 + f64::EPSILON);
        ok("0x8000000000000000000000000000000000p-136", 0.5);
        ok("0x1p-1074", f64::from_bits(1));
        ok("2.2250738585072014e-308", f64::MIN_POSITIVE);
        ok("2.2250738585072013e-308", f64::MIN_POSITIVE);
        ok("0e99999999999999999999", 0.0);
        ok("inf", f64::INFINITY);
        ok("-Infinity", f64::NEG_INFINITY);
        ok("infinit", f64::INFINITY);
        assert!(c_stod("nan(abc)").unwrap().is_nan());
        assert!(c_stod("NaN").unwrap().is_nan());
        range("1e400");
        range("1e-400");
        range("1e-310");
        range("4.9406564584124654e-324");
        range("2.2250738585072011e-308");
        range("2.2250738585072009e-308");
        range("0x1p-1075");
        range("0x3p-1076");
        range("0x1.fffffffffffffp-1023");
        range("0x1.fffffffffffff8p1023");
        range("1e99999999999999999999");
        range("1e-99999999999999999999");
        invalid("");
        invalid(".");
        invalid("+");
        invalid("-");
        invalid(".e1");
        invalid("abc");
        // An exact decimal subnormal is not a range error (2^-1074, all 751 digits).
        let exact = "4.940656458412465441765687928682213723650598026143247644255856825006755072702087518652998363616359923797965646954457177309266567103559397963987747960107818781263007131903114045278458171678489821036887186360569987307230500063874091535649843873124733972731696151400317153853980741262385655911710266585566867681870395603106249319452715914924553293054565444011274801297099995419319894090804165633245247571478690147267801593552386115501348035264934720193790268107107491703332226844753335720832431936092382893458368060106011506169809753078342277318329247904982524730776375927247874656084778203734469699533647017972677717585125660551199131504891101451037862738167250955837389733598993664809941164205702637090279242767544565229087538682506419718265533447265625e-324";
        ok(exact, f64::from_bits(1));
    }

    // The MPS allocator reads its ratios with strtod(s, nullptr) (audit #28).
    #[test]
    fn strtod_ignores_errno_and_reads_what_it_can() {
        assert_eq!(strtod("1.5"), 1.5);
        assert_eq!(strtod("  1.5x"), 1.5);
        assert_eq!(strtod("0x1.8p0"), 1.5);
        assert_eq!(strtod("abc"), 0.0);
        assert_eq!(strtod(""), 0.0);
        assert_eq!(strtod("-"), 0.0);
        assert_eq!(strtod(".5"), 0.5);
        assert_eq!(strtod("1e400"), f64::INFINITY);
        assert_eq!(strtod("-1e400"), f64::NEG_INFINITY);
        assert_eq!(strtod("1e-400"), 0.0);
        assert_eq!(strtod("4.9e-324"), f64::from_bits(1));
        assert_eq!(strtod("0x1p-1080"), 0.0);
        assert_eq!(strtod("0x1p2000"), f64::INFINITY);
        assert!(strtod("nan").is_nan());
        assert_eq!(strtod("Infinity"), f64::INFINITY);
    }

    #[test]
    fn ostream_writes_doubles_like_printf_g() {
        for (x, s) in [
            (2.5, "2.5"),
            (1.8, "1.8"),
            (2.1, "2.1"),
            (-1.0, "-1"),
            (0.0, "0"),
            (1e20, "1e+20"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (0.1 + 0.2, "0.3"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "nan"),
            (999999.5, "1e+06"),
        ] {
            assert_eq!(ostream_double(x), s, "{x}");
        }
    }
}
