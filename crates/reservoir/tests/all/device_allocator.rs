//! The DeviceAllocator contract: one allocator per device index.

use reservoir::device_allocator::{DeviceAllocator, MultiDeviceAllocator};
use reservoir::sim::SimDevice;
use reservoir::{AllocatorConfig, MempoolId, StreamId};

use crate::common::*;

fn two_devices() -> MultiDeviceAllocator<SimDevice> {
    MultiDeviceAllocator::new(
        vec![SimDevice::default(), SimDevice::default()],
        AllocatorConfig::default(),
    )
}

#[test]
fn one_allocator_per_device_index() {
    let m = two_devices();
    assert!(m.initialized());
    let p = m.raw_alloc(1, 3 * MIB, StreamId(0)).unwrap();
    assert_eq!(m.device_stats(1).unwrap().allocation.all().current, 1);
    assert_eq!(m.device_stats(0).unwrap().allocation.all().current, 0);
    m.record_stream(p, StreamId(0)).unwrap();
    m.raw_free(p).unwrap();
    m.empty_cache(MempoolId::DEFAULT).unwrap();
    assert_eq!(m.device_stats(1).unwrap().reserved_bytes.all().current, 0);
    assert!(m.raw_alloc(2, 1, StreamId(0)).is_err(), "no device 2");
    assert!(m.raw_alloc(-1, 1, StreamId(0)).is_err());
    m.reset_peak_stats(1).unwrap();
    m.reset_accumulated_stats(1).unwrap();
    assert_eq!(m.device_stats(1).unwrap().num_device_alloc, 0);
    assert_eq!(m.memory_info(0).unwrap().total, 80 * GIB);
    assert!(
        m.empty_cache(MempoolId(1, 0)).is_err(),
        "unknown private pool"
    );
}

#[test]
fn allocators_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<reservoir::CachingAllocator<SimDevice>>();
    assert_send_sync::<MultiDeviceAllocator<SimDevice>>();
}
