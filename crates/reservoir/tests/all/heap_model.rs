//! The MPS heap allocator against a shadow model over more than 100,000
//! seeded random operations (spec section 4), with the invariant checker
//! after every one.

use std::collections::BTreeMap;

use reservoir::config::heap::HeapSettings;
use reservoir::heap::{HeapAllocator, PoolKind, UsageFlags, MAX_SMALL_ALLOC};
use reservoir::rng::SplitMix64;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocError, DevicePtr};

use crate::common::{GIB, MIB};

/// What the model knows of a buffer in use.
struct Live {
    requested: u64,
    size: u64,
    shared: bool,
    scalar: bool,
    id: u64,
}

/// The shadow model: the buffers in use by address.
#[derive(Default)]
struct Model {
    live: BTreeMap<u64, Live>,
    /// Bytes of freed scalars whose completion handler waits for the next
    /// commit of the default stream (audit #20): still counted as current
    /// allocated memory until `empty_cache` commits and waits.
    scalars_pending: u64,
}

impl Model {
    /// The pool spec 4.2 step 3 picks, on unified memory.
    fn pool(requested: u64, size: u64, usage: UsageFlags) -> PoolKind {
        let shared = usage.contains(UsageFlags::SHARED);
        if usage.contains(UsageFlags::SCALAR) {
            PoolKind::Scalar
        } else if requested <= 8 || (size <= MAX_SMALL_ALLOC && shared) {
            PoolKind::SharedSmall
        } else if size <= MAX_SMALL_ALLOC {
            PoolKind::PrivateSmall
        } else if shared {
            PoolKind::SharedLarge
        } else {
            PoolKind::PrivateLarge
        }
    }

    fn overlaps(&self, addr: u64, size: u64) -> bool {
        let before = self.live.range(..=addr).next_back();
        let after = self.live.range(addr..).next();
        before.is_some_and(|(&a, l)| a + l.size > addr)
            || after.is_some_and(|(&a, _)| a < addr + size)
    }

    fn in_use(&self) -> u64 {
        self.live.values().map(|l| l.size).sum()
    }
}

const OPS: usize = 100_000;

/// The size of the buffer at `p`, from the snapshot.
fn buffer_size(a: &HeapAllocator<SimDevice>, p: DevicePtr) -> u64 {
    a.snapshot()
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == Some(p.0))
        .map(|b| b.size)
        .expect("a buffer in the snapshot")
}
const ALIGN: u64 = 16 << 10;

#[test]
fn a_shadow_model_agrees_over_100_000_random_operations() {
    let dev = SimDevice::new(SimConfig {
        capacity: 2 * GIB,
        ..SimConfig::default()
    });
    let mut settings = HeapSettings::new(true);
    settings.recommended_max_memory = Some(GIB);
    settings.free_waits_for_events = false;
    let a = HeapAllocator::new(dev, settings).unwrap();
    let mut m = Model::default();
    let mut rng = SplitMix64::new(0x6d70_735f_6865_6170);
    let mut ooms = 0;
    let mut last_syncs = 0;
    for op in 0..OPS {
        match rng.weighted(&[10, 8, 1, 1, 1]) {
            0 => {
                let usage =
                    *rng.pick(&[UsageFlags::PRIVATE, UsageFlags::SHARED, UsageFlags::SCALAR]);
                let requested = if usage == UsageFlags::SCALAR {
                    rng.range(1, 8)
                } else {
                    rng.log_uniform(1, 200 * MIB)
                };
                let aligned = requested.div_ceil(ALIGN) * ALIGN;
                let before = a.stats();
                match a.malloc(requested, usage) {
                    Ok(p) => {
                        // A whole cached buffer up to 32 MiB larger may be
                        // reused (spec 4.2 step 5; larger still when an
                        // oversize buffer is kept).
                        let size = buffer_size(&a, p);
                        assert!(
                            size >= aligned && size % ALIGN == 0,
                            "op {op}: {size} for {requested}"
                        );
                        assert!(
                            !m.overlaps(p.0, size),
                            "op {op}: {p} overlaps a live buffer"
                        );
                        assert_eq!(a.unaligned_buffer_size(p), Some(requested), "op {op}");
                        let pool = Model::pool(requested, aligned, usage);
                        assert_eq!(a.is_shared_buffer(p), pool.is_shared(), "op {op}: {pool}");
                        let id = a.buffer_id(p);
                        assert!(
                            m.live.values().all(|l| l.id != id),
                            "op {op}: id {id} twice"
                        );
                        m.live.insert(
                            p.0,
                            Live {
                                requested,
                                size,
                                shared: pool.is_shared(),
                                scalar: pool == PoolKind::Scalar,
                                id,
                            },
                        );
                    }
                    Err(AllocError::OutOfMemory(_)) => {
                        ooms += 1;
                        let after = a.stats();
                        assert_eq!(after.allocated_bytes, before.allocated_bytes, "op {op}");
                    }
                    Err(e) => panic!("op {op}: {e}"),
                }
            }
            1 if !m.live.is_empty() => {
                let k = rng.below(m.live.len() as u64) as usize;
                let addr = *m.live.keys().nth(k).unwrap();
                a.free(DevicePtr(addr)).unwrap();
                let l = m.live.remove(&addr).unwrap();
                if l.scalar {
                    m.scalars_pending += l.size;
                }
                // Freed twice: a typed error, nothing changes.
                let before = a.stats();
                assert!(matches!(
                    a.free(DevicePtr(addr)),
                    Err(AllocError::InvalidPointer { .. })
                ));
                assert_eq!(a.stats(), before, "op {op}");
            }
            2 => a.empty_cache().unwrap(),
            3 => {
                let r = *rng.pick(&[0.0, 0.5, 1.0, 1.4]);
                a.set_low_watermark_ratio(r).unwrap();
            }
            _ => a.free_inactive_buffers().unwrap(),
        }
        if let Err(e) = a.check_invariants() {
            panic!("op {op}: {e}");
        }
        // release_cached_buffers (empty_cache, or the failure chain's full
        // flush) commits and waits: the freed scalars are back.
        let syncs = a.stats().num_sync_all_streams;
        if syncs != last_syncs {
            m.scalars_pending = 0;
            last_syncs = syncs;
        }
        assert_eq!(
            a.current_allocated_memory(),
            m.in_use() + m.scalars_pending,
            "op {op}"
        );
        let st = a.stats();
        assert_eq!(
            st.allocated_bytes.all().current as u64,
            m.in_use(),
            "op {op}"
        );
        assert_eq!(
            st.allocation.all().current as usize,
            m.live.len(),
            "op {op}"
        );
        assert_eq!(
            st.reserved_bytes.all().current as u64,
            a.total_allocated_memory(),
            "op {op}"
        );
        assert!(a.total_allocated_memory() >= m.in_use(), "op {op}");
    }
    for (&addr, l) in &m.live {
        assert_eq!(a.unaligned_buffer_size(DevicePtr(addr)), Some(l.requested));
        assert_eq!(a.is_shared_buffer(DevicePtr(addr)), l.shared);
        a.free(DevicePtr(addr)).unwrap();
    }
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.total_allocated_memory(), 0);
    assert!(ooms > 0, "the run never reached the limits");
}
