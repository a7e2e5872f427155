//! `reserved_bytes_by_private_pools` (spec 1.12, torch 2.13+): PyTorch's
//! per-private-pool reserved bytes, in `memory_stats()` as
//! `reserved_bytes_by_private_pools.<a>_<b>.{all,small_pool,large_pool}.{current,peak,allocated,freed}`.
//!
//! Every literal below was measured on the oracle (real torch 2.15, and
//! 2.13 for the resets, on the fake device of `../shared/oracle`):
//! `x = torch.empty(10, device="cuda")`; `torch._C._cuda_beginAllocateToPool`
//! on a fresh `graph_pool_handle()` and `_cuda_endAllocateToPool` with no
//! allocation (no keys); then on the next handle `(0, 2)`: 5 MiB, 100 B and
//! 40 MiB, `del`, `_cuda_releasePool`, `empty_cache()`,
//! `reset_peak_memory_stats()`, `reset_accumulated_memory_stats()`. The same
//! numbers with `expandable_segments:True` (map/unmap move the pool's entry).

use std::collections::BTreeMap;

use reservoir::caching::PoolFilter;
use reservoir::MempoolId;

use crate::common::*;

const EMPTY: MempoolId = MempoolId(0, 1);
const POOL: MempoolId = MempoolId(0, 2);

/// The 12 keys of pool `0_2`, `(type, field)` -> value.
fn pool_keys(flat: &BTreeMap<String, i64>) -> BTreeMap<String, i64> {
    flat.iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("reserved_bytes_by_private_pools.")
                .map(|rest| (rest.to_string(), *v))
        })
        .collect()
}

/// `[current, peak, allocated, freed]` of `all`, `small_pool`, `large_pool`.
fn expect(all: [i64; 4], small: [i64; 4], large: [i64; 4]) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (t, v) in [("all", all), ("small_pool", small), ("large_pool", large)] {
        for (f, x) in ["current", "peak", "allocated", "freed"].iter().zip(v) {
            out.insert(format!("0_2.{t}.{f}"), x);
        }
    }
    out
}

fn scenario(conf: &str) {
    let c = Checked::new(conf, 80 * GIB);
    let x = c.alloc(40);
    c.a.begin_allocate_to_pool(EMPTY, PoolFilter::Stream(S0))
        .unwrap();
    c.a.end_allocate_to_pool(EMPTY).unwrap();
    c.check();
    // A pool that never held driver memory has no entry.
    assert!(pool_keys(&c.flat()).is_empty(), "{conf}");

    c.a.begin_allocate_to_pool(POOL, PoolFilter::Stream(S0))
        .unwrap();
    let p: Vec<_> = [5 * MIB, 100, 40 * MIB].map(|n| c.alloc(n)).into();
    c.a.end_allocate_to_pool(POOL).unwrap();
    c.check();
    let live = expect(
        [65011712, 65011712, 65011712, 0],
        [2097152, 2097152, 2097152, 0],
        [62914560, 62914560, 62914560, 0],
    );
    assert_eq!(pool_keys(&c.flat()), live, "{conf}: live");
    assert_eq!(c.flat()["reserved_bytes.all.current"], 67108864, "{conf}");

    for ptr in p {
        c.free(ptr);
    }
    c.a.release_pool(POOL).unwrap();
    c.check();
    assert_eq!(pool_keys(&c.flat()), live, "{conf}: released, not emptied");

    // "current drops to 0 when a pool is deleted, while peak/allocated/freed
    // are preserved until reset".
    c.empty_cache();
    let emptied = expect(
        [0, 65011712, 65011712, 65011712],
        [0, 2097152, 2097152, 2097152],
        [0, 62914560, 62914560, 62914560],
    );
    assert_eq!(pool_keys(&c.flat()), emptied, "{conf}: emptied");
    assert_eq!(c.flat()["reserved_bytes.all.current"], 2097152, "{conf}");

    // Resets keep the entry (torch never erases it).
    c.a.reset_peak_stats();
    c.check();
    let peak_reset = expect(
        [0, 0, 65011712, 65011712],
        [0, 0, 2097152, 2097152],
        [0, 0, 62914560, 62914560],
    );
    assert_eq!(pool_keys(&c.flat()), peak_reset, "{conf}: peak reset");
    c.a.reset_accumulated_stats();
    c.check();
    assert_eq!(
        pool_keys(&c.flat()),
        expect([0; 4], [0; 4], [0; 4]),
        "{conf}: accumulated reset"
    );
    c.free(x);
}

#[test]
fn private_pool_reserved_bytes_match_torch() {
    scenario("");
    scenario("policy:pytorch-2.13");
}

#[test]
fn private_pool_reserved_bytes_follow_expandable_maps() {
    scenario("expandable_segments:True");
}

#[test]
fn private_pool_reserved_bytes_survive_reuse_and_reset_peak() {
    // Oracle (torch 2.13 and 2.15): the pool keeps its segments while in use
    // (use count 2 after two begins, one release): a second round on the
    // cached segments changes nothing; reset_accumulated zeroes
    // allocated/freed, reset_peak keeps peak = current.
    let c = Checked::default_device();
    let _x = c.alloc(40);
    let one = MempoolId(0, 1);
    let round = |c: &Checked| {
        c.a.begin_allocate_to_pool(one, PoolFilter::Stream(S0))
            .unwrap();
        let p: Vec<_> = [5 * MIB, 100, 40 * MIB].map(|n| c.alloc(n)).into();
        c.a.end_allocate_to_pool(one).unwrap();
        p
    };
    for ptr in round(&c) {
        c.free(ptr);
    }
    c.empty_cache();
    let p = round(&c);
    let pool = |c: &Checked, f: &str| c.flat()[&format!("reserved_bytes_by_private_pools.0_1.{f}")];
    assert_eq!(pool(&c, "all.allocated"), 65011712);
    c.a.reset_peak_stats();
    c.a.reset_accumulated_stats();
    assert_eq!(
        [
            pool(&c, "all.current"),
            pool(&c, "all.peak"),
            pool(&c, "all.allocated"),
            pool(&c, "large_pool.peak")
        ],
        [65011712, 65011712, 0, 62914560]
    );
    for ptr in p {
        c.free(ptr);
    }
    c.a.release_pool(one).unwrap();
    c.empty_cache();
    // Still in use once: nothing released.
    assert_eq!(pool(&c, "all.current"), 65011712);
    assert_eq!(c.a.private_pool_reserved()[&one].all().current, 65011712);
}

#[test]
fn private_pool_keys_follow_the_release() {
    // c10/core/CachingDeviceAllocator.h has `reserved_bytes_by_private_pools`
    // in torch 2.13, 2.14 and 2.15, not in 2.11 or 2.12: PyTorch mode of
    // those releases leaves the keys out (the values are still kept).
    for (release, has) in [
        ("2.11", false),
        ("2.12", false),
        ("2.13", true),
        ("2.14", true),
        ("2.15", true),
    ] {
        let c = Checked::new(&format!("policy:pytorch-{release}"), 80 * GIB);
        c.a.begin_allocate_to_pool(POOL, PoolFilter::Stream(S0))
            .unwrap();
        let p = c.alloc(2 * MIB);
        c.a.end_allocate_to_pool(POOL).unwrap();
        assert_eq!(
            pool_keys(&c.flat()).len(),
            if has { 12 } else { 0 },
            "{release}"
        );
        assert_eq!(
            c.a.private_pool_reserved()[&POOL].all().current,
            20 * MIB as i64
        );
        c.free(p);
    }
}
