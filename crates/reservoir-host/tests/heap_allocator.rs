//! The MPS heap allocator over real host memory: scalar buffers with a
//! value and shared buffer pointers (`getSharedBufferPtr`) are real bytes.

use reservoir::config::heap::HeapSettings;
use reservoir::heap::HeapAllocator;
use reservoir::{AllocError, DevicePtr};
use reservoir_host::{checksum_bytes, HostConfig, HostDevice};

fn heap() -> HeapAllocator<HostDevice> {
    let dev = HostDevice::new(HostConfig {
        capacity: 256 << 20,
        ..HostConfig::default()
    })
    .unwrap();
    HeapAllocator::new(dev, HeapSettings::new(true)).unwrap()
}

#[test]
fn heap_scalar_buffers_hold_their_value_in_host_memory() {
    let a = heap();
    let value = 0x0102_0304_0506_0708u64.to_le_bytes();
    let p = a.alloc_scalar_buffer_with_value(&value).unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.backend().checksum(p, 8).unwrap(), checksum_bytes(&value));
    let mut back = [0u8; 8];
    a.backend().copy_to_host(p, &mut back).unwrap();
    assert_eq!(back, value);
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
}

#[test]
fn heap_shared_buffer_pointers_are_host_memory() {
    let a = heap();
    let shared = a.shared_allocator().unwrap();
    let s = shared.allocate(3 << 20).unwrap();
    let (host, retain) = a.shared_buffer_ptr(s).unwrap();
    assert_eq!((host, retain), (s.0, 1));
    // The whole buffer is live host memory at that address: written through
    // the device, read back at the host address.
    a.backend().fill(s, 3 << 20, 0x5a).unwrap();
    assert!(a.backend().is_live(DevicePtr(host), 3 << 20));
    let mut back = vec![0u8; 3 << 20];
    a.backend()
        .copy_to_host(DevicePtr(host), &mut back)
        .unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    // A private buffer has none: a typed error, nothing changes.
    let p = a.private_allocator().allocate(4096).unwrap();
    let before = a.stats();
    assert!(matches!(
        a.shared_buffer_ptr(p),
        Err(AllocError::InvalidArgument(_))
    ));
    assert_eq!(a.stats(), before);
    a.free(p).unwrap();
    shared.delete(s).unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.backend().counters().live_allocs, 0);
}
