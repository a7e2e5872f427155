//! Bad input gets a typed error and changes nothing.

use reservoir::{AllocError, AllocatorConfig, DevicePtr, StreamId};

use crate::common::*;

fn state(
    c: &Checked,
) -> (
    std::collections::BTreeMap<String, i64>,
    Vec<reservoir::observe::snapshot::Segment>,
) {
    (c.flat(), c.segments())
}

#[test]
fn double_free_is_rejected_and_changes_nothing() {
    let c = Checked::default_device();
    let p = c.alloc(MIB);
    let _keep = c.alloc(MIB);
    c.free(p);
    let before = state(&c);
    let err = c.a.raw_free(p).unwrap_err();
    assert_eq!(err, AllocError::InvalidPointer { ptr: p });
    assert!(
        err.to_string().contains("double free or foreign pointer"),
        "{err}"
    );
    c.check();
    assert_eq!(state(&c), before);
}

#[test]
fn foreign_and_interior_pointers_are_rejected() {
    let c = Checked::default_device();
    let p = c.alloc(4096);
    let before = state(&c);
    for bad in [
        DevicePtr(0xdead_beef),
        DevicePtr(p.0 + 512),
        DevicePtr(u64::MAX),
    ] {
        assert_eq!(
            c.a.raw_free(bad),
            Err(AllocError::InvalidPointer { ptr: bad })
        );
        assert_eq!(
            c.a.record_stream(bad, StreamId(3)),
            Err(AllocError::InvalidPointer { ptr: bad })
        );
        assert!(c.a.base_allocation(bad).is_err());
    }
    c.check();
    assert_eq!(state(&c), before);
}

#[test]
fn invalid_config_is_a_typed_error() {
    assert!(AllocatorConfig::parse("bogus_key:1").is_err());
    assert!(AllocatorConfig::parse("max_split_size_mb:abc").is_err());
    assert!(AllocatorConfig::parse("garbage_collection_threshold:1.5").is_err());
    let err = AllocatorConfig::parse("bogus_key:1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("bogus_key"), "{err}");
}

#[test]
fn failed_allocations_leave_the_state_consistent() {
    let c = Checked::new("", 64 * MIB);
    let p = c.alloc(40 * MIB);
    let before_segments = c.segments();
    assert!(c.try_alloc(40 * MIB).is_err());
    assert_eq!(c.segments(), before_segments);
    c.free(p);
    c.alloc(40 * MIB);
}

#[test]
fn owning_handles_free_on_drop() {
    let c = Checked::default_device();
    {
        let h = c.a.alloc(1000, StreamId(0)).unwrap();
        assert_eq!(h.size(), 1000);
        assert_eq!(c.stats().allocation.all().current, 1);
    }
    c.check();
    assert_eq!(c.stats().allocation.all().current, 0);
}
