//! FNV-1a (64-bit), the one checksum of the workspace: what a device's
//! [`DeviceWork::read_checksum`](crate::backend::DeviceWork::read_checksum)
//! returns for the bytes it read back, and the fingerprint of oracle traces
//! and golden results in `reservoir-replay`.

/// 64-bit FNV-1a, fed incrementally.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// The FNV offset basis.
    pub fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    /// Hash more bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_byte(b);
        }
    }

    /// Hash one byte.
    pub fn write_byte(&mut self, b: u8) {
        self.0 ^= u64::from(b);
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }

    /// The hash so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a::new()
    }
}

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(bytes);
    h.finish()
}

/// The [`checksum`] of `len` copies of `byte` (what a filled block reads back
/// as), without materialising the bytes.
pub fn checksum_of_fill(byte: u8, len: u64) -> u64 {
    let mut h = Fnv1a::new();
    for _ in 0..len {
        h.write_byte(byte);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_checksum_matches_the_bytes() {
        assert_eq!(checksum(&[7; 1000]), checksum_of_fill(7, 1000));
        assert_eq!(checksum(b""), 0xcbf2_9ce4_8422_2325);
    }
}
