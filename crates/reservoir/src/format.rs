//! Human-readable sizes exactly as PyTorch's `format_size` prints them (and, for
//! the MPS allocator, its PyTorch 2.0-2.6 variant: [`SizeFormat`]).
//!
//! PyTorch (`c10/cuda/CUDACachingAllocator.cpp`, unchanged in 2.15) writes the
//! size to an `std::ostringstream` with `std::fixed` and precision 2:
//! `size <= 1024` prints `"{size} bytes"`, `size <= 1048576` prints
//! `size / 1024.0` with " KiB", `size <= 1073741824` prints `size / 1048576.0`
//! with " MiB", and anything larger `size / 1073741824.0` with " GiB". The
//! boundaries are inclusive, so 1 MiB prints as "1024.00 KiB", and the
//! rounding happens after the unit is chosen: 1048575 bytes is also
//! "1024.00 KiB", never "1.00 MiB". The division is done in `f64` (the size is
//! first rounded to the nearest `f64`, which matters above 2^53) and printed
//! like C's `%.2f`: the exact binary value rounded to two decimals, ties to
//! even (1152 bytes = 1.125 KiB prints "1.12 KiB"). Rust's `{:.2}` does the
//! same, which the tests check against PyTorch's output and against exact
//! integer arithmetic.

/// Format a byte count as PyTorch does in its out-of-memory message:
/// up to 1024 → "N bytes"; up to 1 MiB → KiB; up to 1 GiB → MiB; else GiB,
/// two decimals (spec section 1.9).
///
/// ```
/// use reservoir::format::format_size;
/// assert_eq!(format_size(1024), "1024 bytes");
/// assert_eq!(format_size(1025), "1.00 KiB");
/// assert_eq!(format_size(20 << 20), "20.00 MiB");
/// assert_eq!(format_size(80 << 30), "80.00 GiB");
/// ```
pub fn format_size(size: u64) -> String {
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1_048_576 {
        format!("{:.2} KiB", size as f64 / 1024.0)
    } else if size <= 1_073_741_824 {
        format!("{:.2} MiB", size as f64 / 1_048_576.0)
    } else {
        format!("{:.2} GiB", size as f64 / 1_073_741_824.0)
    }
}

/// How the MPS allocator writes sizes (`MPSHeapAllocatorImpl::format_size`),
/// by PyTorch version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SizeFormat {
    /// The seed's 2.7-era code (pytorch/pytorch 57ba412): `return
    /// c10::CachingAllocator::format_size(size);`, "bytes"/"KiB"/"MiB"/"GiB"
    /// from a `double` ([`format_size`], the CUDA allocator's).
    /// The default.
    #[default]
    C10,
    /// PyTorch 2.0-2.6: the MPS allocator's own version, "KB"/"MB"/"GB"
    /// from a `float` ([`format_size_2_6`]).
    Mps26,
}

impl SizeFormat {
    /// `size` written this way.
    pub fn format(self, size: u64) -> String {
        match self {
            SizeFormat::C10 => format_size(size),
            SizeFormat::Mps26 => format_size_2_6(size),
        }
    }
}

/// The MPS allocator's own `format_size` of PyTorch 2.0-2.6 (the
/// [`SizeFormat::Mps26`] setting): unlike c10's it says "KB", "MB", "GB"
/// and divides a *single-precision* copy of the size, printed with two
/// decimals; the boundaries (1024, 1 MiB, 1 GiB) are inclusive.
///
/// ```
/// use reservoir::heap::format_size_2_6;
/// assert_eq!(format_size_2_6(1024), "1024 bytes");
/// assert_eq!(format_size_2_6(1025), "1.00 KB");
/// assert_eq!(format_size_2_6(32 << 20), "32.00 MB");
/// assert_eq!(format_size_2_6(524_293_232), "500.01 MB");
/// assert_eq!(format_size_2_6(3 << 30), "3.00 GB");
/// ```
pub fn format_size_2_6(size: u64) -> String {
    let f = size as f32 as f64;
    if size <= 1024 {
        format!("{size} bytes")
    } else if size <= 1_048_576 {
        format!("{:.2} KB", f / 1024.0)
    } else if size <= 1_073_741_824 {
        format!("{:.2} MB", f / 1_048_576.0)
    } else {
        format!("{:.2} GB", f / 1_073_741_824.0)
    }
}

#[cfg(test)]
mod tests {
    use super::format_size;

    /// Outputs of PyTorch 2.15.0's own `format_size`, read from the "GPU 0 has
    /// a total capacity of X" part of real out-of-memory messages (the
    /// oracle's fake device with its capacity set to each value).
    const FROM_PYTORCH: &[(u64, &str)] = &[
        (0, "0 bytes"),
        (1, "1 bytes"),
        (2, "2 bytes"),
        (3, "3 bytes"),
        (1021, "1021 bytes"),
        (1022, "1022 bytes"),
        (1023, "1023 bytes"),
        (1024, "1024 bytes"),
        (1025, "1.00 KiB"),
        (1026, "1.00 KiB"),
        (1027, "1.00 KiB"),
        (1152, "1.12 KiB"),
        (1408, "1.38 KiB"),
        (1664, "1.62 KiB"),
        (1920, "1.88 KiB"),
        (5242, "5.12 KiB"),
        (40320, "39.38 KiB"),
        (46208, "45.12 KiB"),
        (93696, "91.50 KiB"),
        (129833, "126.79 KiB"),
        (194816, "190.25 KiB"),
        (199680, "195.00 KiB"),
        (397568, "388.25 KiB"),
        (459392, "448.62 KiB"),
        (462720, "451.88 KiB"),
        (486912, "475.50 KiB"),
        (794943, "776.31 KiB"),
        (1048573, "1024.00 KiB"),
        (1048574, "1024.00 KiB"),
        (1048575, "1024.00 KiB"),
        (1048576, "1024.00 KiB"),
        (1048577, "1.00 MiB"),
        (1048578, "1.00 MiB"),
        (1048579, "1.00 MiB"),
        (1179648, "1.12 MiB"),
        (1441792, "1.38 MiB"),
        (2097152, "2.00 MiB"),
        (10485760, "10.00 MiB"),
        (20971520, "20.00 MiB"),
        (56098816, "53.50 MiB"),
        (63569920, "60.62 MiB"),
        (74842112, "71.38 MiB"),
        (143654912, "137.00 MiB"),
        (173932544, "165.88 MiB"),
        (274202624, "261.50 MiB"),
        (488898560, "466.25 MiB"),
        (607101535, "578.98 MiB"),
        (630476505, "601.27 MiB"),
        (717236704, "684.01 MiB"),
        (1073741821, "1024.00 MiB"),
        (1073741822, "1024.00 MiB"),
        (1073741823, "1024.00 MiB"),
        (1073741824, "1024.00 MiB"),
        (1073741825, "1.00 GiB"),
        (1073741826, "1.00 GiB"),
        (1073741827, "1.00 GiB"),
        (1610612736, "1.50 GiB"),
        (85899345920, "80.00 GiB"),
        (132875550720, "123.75 GiB"),
        (136230993920, "126.88 GiB"),
        (144552493056, "134.62 GiB"),
        (148720491742, "138.51 GiB"),
        (156229435392, "145.50 GiB"),
        (307682830214, "286.55 GiB"),
        (363864260608, "338.88 GiB"),
        (374064807936, "348.38 GiB"),
        (391915765760, "365.00 GiB"),
        (396344950784, "369.12 GiB"),
        (493115932672, "459.25 GiB"),
        (524991816274, "488.94 GiB"),
        (530309940745, "493.89 GiB"),
        (537407782912, "500.50 GiB"),
        (649718136214, "605.10 GiB"),
        (672751304794, "626.55 GiB"),
        (914990066714, "852.15 GiB"),
        (1016745548812, "946.92 GiB"),
        (1072210770625, "998.57 GiB"),
        (1137460155142974951, "1059342320.21 GiB"),
        (1137520939590763799, "1059398930.14 GiB"),
        (1152018932971492032, "1072901238.66 GiB"),
    ];

    // spec 1.9: format_size as PyTorch prints it.
    #[test]
    fn matches_pytorch() {
        for &(size, text) in FROM_PYTORCH {
            assert_eq!(format_size(size), text, "{size}");
        }
    }

    /// An independent model: round the exact value of `size as f64 / 2^shift`
    /// to two decimals, ties to even, with integer arithmetic only.
    fn reference(size: u64) -> String {
        if size <= 1024 {
            return format!("{size} bytes");
        }
        let (shift, unit) = if size <= 1 << 20 {
            (10, "KiB")
        } else if size <= 1 << 30 {
            (20, "MiB")
        } else {
            (30, "GiB")
        };
        // `size as f64` is what C++ converts to (nearest, ties to even); the
        // double is an integer, so `as u128` is exact.
        let v = (size as f64) as u128 * 100;
        let q = v >> shift;
        let rem = v & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        let q = if rem > half || (rem == half && q % 2 == 1) {
            q + 1
        } else {
            q
        };
        format!("{}.{:02} {unit}", q / 100, q % 100)
    }

    // spec 1.9: every size in and around the unit boundaries.
    #[test]
    fn exhaustive_near_boundaries() {
        // Every size up to 2 MiB: all of "bytes", all of KiB, the KiB/MiB edge.
        for size in 0..=(2u64 << 20) {
            assert_eq!(format_size(size), reference(size), "{size}");
        }
        for edge in [1u64 << 30, 1 << 40, 1 << 53, 1 << 63] {
            for size in edge - 70_000..=edge + 70_000 {
                assert_eq!(format_size(size), reference(size), "{size}");
            }
        }
        for size in u64::MAX - 70_000..=u64::MAX {
            assert_eq!(format_size(size), reference(size), "{size}");
        }
    }

    // spec 1.9: ties round to even, carries stay in the chosen unit.
    #[test]
    fn rounding_cases() {
        // x.xx5 exactly: to even.
        assert_eq!(format_size(1024 + 128), "1.12 KiB"); // 1.125
        assert_eq!(format_size(1024 + 384), "1.38 KiB"); // 1.375
        assert_eq!(format_size((1 << 20) + (1 << 17)), "1.12 MiB");
        assert_eq!(format_size((1 << 30) + (3 << 27)), "1.38 GiB");
        // Just below the next unit rounds to 1024.00 of the smaller one.
        assert_eq!(format_size((1 << 20) - 1), "1024.00 KiB");
        assert_eq!(format_size((1 << 30) - 1), "1024.00 MiB");
        assert_eq!(format_size((1 << 40) - 1), "1024.00 GiB");
        // Above 2^53 the size is first rounded to a double.
        assert_eq!(format_size(u64::MAX), "17179869184.00 GiB");
        assert_eq!(format_size((1 << 53) + 1), "8388608.00 GiB");
    }

    // spec 1.9: a sweep over all magnitudes.
    #[test]
    fn sweep_all_magnitudes() {
        let mut size = 1u64;
        while size <= u64::MAX / 2 {
            for s in [
                size - 1,
                size,
                size + 1,
                size + size / 2,
                size + size / 4 + 7,
            ] {
                assert_eq!(format_size(s), reference(s), "{s}");
            }
            size += size / 2 + 1;
        }
    }
}
