//! PyTorch's sizing rules as pure functions (spec sections 1.2 - 1.4, 1.7).

use crate::config::AllocatorConfig;

/// Every size is rounded to a multiple of this (spec 1.2).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Largest "small" request: rounded sizes up to this go to the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size for small-pool requests.
pub const SMALL_BUFFER: u64 = 2 << 20;
/// Requests at or above this get a segment of their own size (2 MiB rounded).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments.
pub const ROUND_LARGE: u64 = 2 << 20;
/// Requests of this size or more fail at once with "more than 1EB" (spec 1.9).
pub const ONE_EXABYTE: u64 = 1 << 60;

/// PyTorch's `round_size` (spec 1.3): the block size serving a request.
#[inline]
pub fn round_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.roundup_power2_divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        roundup_power2_next_division(size, divisions)
    } else {
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
    }
}

/// Round `size` up to the next of `divisions` equal steps between two powers
/// of two (spec 1.3, PyTorch's `roundup_power2_next_division`).
#[inline]
pub fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let rounded_floor = size & !(step - 1);
    if rounded_floor == size {
        size
    } else {
        rounded_floor + step
    }
}

/// Does a rounded size belong to the small pool? (spec 1.4: exactly 1 MiB is small)
#[inline]
pub fn is_small(size: u64) -> bool {
    size <= SMALL_SIZE
}

/// PyTorch's `get_allocation_size` (spec 1.4): the segment size requested from
/// the driver for a rounded request.
#[inline]
pub fn allocation_size(size: u64, config: &AllocatorConfig) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        config.large_segment_size
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// The oversize rules of PyTorch's `get_free_block` (spec 1.6): a free
/// block of `block_size` bytes may not serve a rounded request of `size`
/// bytes when the request is below `max_split_size` and the block is not
/// (oversize blocks serve only oversize requests), or when an oversize
/// request would leave `max_non_split_rounding_size` bytes or more unused.
#[inline]
pub fn oversize_misfit(size: u64, block_size: u64, config: &AllocatorConfig) -> bool {
    let max_split = config.max_split_size;
    (size < max_split && block_size >= max_split)
        || (size >= max_split
            && block_size >= size.saturating_add(config.max_non_split_rounding_size))
}

/// PyTorch's `should_split` (spec 1.7): is the remainder of a `block_size`
/// block serving `size` bytes worth keeping as a free block?
#[inline]
pub fn should_split(
    block_size: u64,
    size: u64,
    small_pool: bool,
    config: &AllocatorConfig,
) -> bool {
    if config.expandable_segments {
        block_size - size >= MIN_BLOCK_SIZE
    } else {
        should_split_plain(block_size, size, small_pool, config)
    }
}

/// [`should_split`] with expandable segments inactive whatever the
/// configuration says: torch's `should_split(..., is_expandable_segments_active
/// = false)`, for a block of a pool with its own allocator
/// (`MemPool(allocator=...)`) and a block borrowed from a `use_on_oom` pool.
pub fn should_split_plain(
    block_size: u64,
    size: u64,
    small_pool: bool,
    config: &AllocatorConfig,
) -> bool {
    let remaining = block_size - size;
    if small_pool {
        remaining >= MIN_BLOCK_SIZE
    } else {
        size < config.max_split_size && remaining > SMALL_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn with_divisions(d: u64) -> AllocatorConfig {
        AllocatorConfig {
            roundup_power2_divisions: [d; 16],
            ..AllocatorConfig::default()
        }
    }

    #[test]
    fn golden_rounding_table_default() {
        // spec 6.1 / 1.3 step 1 and 3: 512-byte rounding, minimum 512.
        let c = AllocatorConfig::default();
        for (n, want) in [
            (1, 512),
            (511, 512),
            (512, 512),
            (513, 1024),
            (MIB - 1, MIB),
            (MIB, MIB),
            (MIB + 1, MIB + 512),
            (10 * MIB - 1, 10 * MIB),
            (10 * MIB, 10 * MIB),
            ((1 << 30) + 1, (1 << 30) + 512),
        ] {
            assert_eq!(round_size(n, &c), want, "round_size({n})");
        }
    }

    #[test]
    fn power2_divisions_path_and_gate() {
        // spec 1.3: 1200 with 4 divisions fails the n > 512*d gate -> 1536.
        assert_eq!(round_size(1200, &with_divisions(4)), 1536);
        // spec 1.3: 5000 with 4 divisions -> f = 4096, step 1024 -> 5120.
        assert_eq!(round_size(5000, &with_divisions(4)), 5120);
        // powers of two stay.
        assert_eq!(round_size(1 << 22, &with_divisions(4)), 1 << 22);
        // 2 divisions: between 8 MiB and 16 MiB steps of 4 MiB.
        assert_eq!(round_size(9 * MIB, &with_divisions(2)), 12 * MIB);
        assert_eq!(round_size(13 * MIB, &with_divisions(2)), 16 * MIB);
        // 8 divisions: 1 MiB + 1 -> step 128 KiB.
        assert_eq!(round_size(MIB + 1, &with_divisions(8)), MIB + 128 * 1024);
        // 1 division behaves as disabled.
        assert_eq!(round_size(MIB + 1, &with_divisions(1)), MIB + 512);
        // helper alone (the source comment's example): 1200, 4 -> 1280.
        assert_eq!(roundup_power2_next_division(1200, 4), 1280);
    }

    #[test]
    fn divisions_index_by_log2_size() {
        // spec 1.3: index = floor(log2 n) - 20 clamped to [0, 15].
        let mut c = AllocatorConfig::default();
        c.roundup_power2_divisions[0] = 2;
        c.roundup_power2_divisions[3] = 8;
        c.roundup_power2_divisions[15] = 4;
        assert_eq!(c.roundup_power2_divisions_for(1000), 2); // sub-MiB uses entry 0
        assert_eq!(c.roundup_power2_divisions_for(8 * MIB), 8);
        assert_eq!(c.roundup_power2_divisions_for(15 * MIB), 8);
        assert_eq!(c.roundup_power2_divisions_for(1 << 40), 4);
    }

    #[test]
    fn allocation_sizes() {
        // spec 1.4 and 6.1: 2 MiB / 20 MiB / 2 MiB-rounded.
        let c = AllocatorConfig::default();
        assert_eq!(allocation_size(512, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB, &c), 2 * MIB);
        assert_eq!(allocation_size(MIB + 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB - 512, &c), 20 * MIB);
        assert_eq!(allocation_size(10 * MIB, &c), 10 * MIB);
        assert_eq!(allocation_size(11 * MIB + 512, &c), 12 * MIB);
        assert!(is_small(MIB));
        assert!(!is_small(MIB + 512));
    }

    #[test]
    fn split_rule() {
        // spec 6.2: 22 MiB block; 20.5 MiB -> split, 20.9 -> split, 21.1 -> no split.
        let c = AllocatorConfig::default();
        let b = 22 * MIB;
        assert!(should_split(b, b - 3 * MIB / 2, false, &c));
        assert!(should_split(b, b - MIB - 102_400, false, &c));
        assert!(!should_split(b, b - 921_600, false, &c));
        assert!(!should_split(b, b - MIB, false, &c)); // strictly greater than 1 MiB
                                                       // small pool: any remainder >= 512.
        assert!(should_split(2 * MIB, 2 * MIB - 512, true, &c));
        assert!(!should_split(2 * MIB, 2 * MIB, true, &c));
        // max_split_size: requests at or above it are never split.
        let m = AllocatorConfig {
            max_split_size: 100 * MIB,
            ..AllocatorConfig::default()
        };
        assert!(!should_split(300 * MIB, 100 * MIB, false, &m));
        assert!(should_split(300 * MIB, 99 * MIB, false, &m));
        // expandable: 512-byte rule even in the large pool.
        let e = AllocatorConfig {
            expandable_segments: true,
            ..AllocatorConfig::default()
        };
        assert!(should_split(22 * MIB, 22 * MIB - 512, false, &e));
    }
}
