//! Size arguments: `80GiB`, `512M`, `1.5G`, `1048576`.

use reservoir_replay::replay::capacity::MAX_CAPACITY;

/// What a size argument may look like, for error messages.
pub const ACCEPTED: &str = "plain bytes (e.g. 1073741824) or a number with a unit \
     K, M, G or T, optionally followed by iB or B (all powers of 1024), \
     e.g. 80GiB, 512M, 1.5G";

/// Parse a size. Units are binary (`G`, `GB` and `GiB` all mean 2^30), as in
/// PyTorch's and the oracle's size arguments. Decimals are allowed with a
/// unit; the result is truncated to whole bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("invalid size {s:?}: expected {ACCEPTED}");
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num = num.replace('_', "");
    let unit = unit.trim();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    if num.is_empty() {
        return Err(bad());
    }
    if let Ok(v) = num.parse::<u64>() {
        return v.checked_mul(1u64 << shift).ok_or_else(bad);
    }
    if shift == 0 {
        // fractions of a byte make no sense
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || !(0.0..18_446_744_073_709_551_615.0).contains(&bytes) {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Parse a device capacity: a size ([`parse_size`]) of at most
/// [`MAX_CAPACITY`] (16 TiB). The simulated device places segments in a
/// 127 TiB address window and expandable segments reserve up to twice the
/// device, so a larger device cannot be simulated faithfully (a capacity
/// of 2^64 - 1 bytes overflowed). See docs/limits.md.
pub fn parse_capacity(s: &str) -> Result<u64, String> {
    let bytes = parse_size(s)?;
    if bytes > MAX_CAPACITY {
        return Err(format!(
            "{s:?} is {bytes} bytes, more than the largest simulated device, 16 TiB \
             ({MAX_CAPACITY} bytes)"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("80 GB").unwrap(), 80 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("1048576B").unwrap(), 1 << 20);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("1_000").unwrap(), 1000);
    }

    #[test]
    fn errors_name_the_value_and_forms() {
        for bad in [
            "",
            "GiB",
            "80XB",
            "-1G",
            "1.5",
            "1.2.3G",
            "99999999999T",
            "ten",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
            assert!(e.contains("80GiB"), "{e}");
        }
    }
}
