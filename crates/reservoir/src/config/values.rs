//! The values and bounds of settings: the units, the backend and reserve
//! types, and the limits the parsers enforce. The bottom of `config/`: the
//! settings struct, the parsers and the error messages all use it, and it
//! uses none of them.

use std::fmt;

/// 1 MiB.
pub const MIB: u64 = 1 << 20;

/// Upper bound of `pinned_num_register_threads`.
pub const MAX_REGISTER_THREADS: u64 = 128;

/// Number of `roundup_power2_divisions` intervals (1 MiB .. 64 GiB, one per power of two).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;

/// Which allocator serves device memory (key `backend`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AllocatorBackend {
    /// PyTorch's caching allocator, the one Reservoir implements.
    #[default]
    Native,
    /// The driver's stream-ordered allocator (`cudaMallocAsync`). Reservoir
    /// records the choice but has no such allocator.
    CudaMallocAsync,
}

impl AllocatorBackend {
    /// The spelling used in settings strings: `native` or `cudaMallocAsync`.
    pub fn as_str(self) -> &'static str {
        match self {
            AllocatorBackend::Native => "native",
            AllocatorBackend::CudaMallocAsync => "cudaMallocAsync",
        }
    }
}

impl fmt::Display for AllocatorBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The virtual-address reserve of one expandable segment (keys
/// `expandable_segments_reserve` and `expandable_segments_reserve_by_class`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ReserveSpec {
    /// A fraction of the device's total memory (settings value `0.5`).
    Fraction(f64),
    /// An absolute size in GiB (settings value `40G` or `40g`).
    GiB(f64),
}

impl ReserveSpec {
    /// Bytes to reserve on a device with `total_global_mem` bytes, computed in
    /// `f64` and saturated to `u64::MAX` as PyTorch does.
    pub fn resolve_bytes(&self, total_global_mem: u64) -> u64 {
        let bytes = match *self {
            ReserveSpec::Fraction(f) => f * total_global_mem as f64,
            ReserveSpec::GiB(g) => g * (1u64 << 30) as f64,
        };
        if bytes >= u64::MAX as f64 {
            u64::MAX
        } else {
            // Truncation toward zero (and 0 for negatives), like the C++ cast.
            bytes as u64
        }
    }
}
