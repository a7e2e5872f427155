//! The MPS heap allocator under the integrity scenario on the asynchronous
//! simulated device, with its race sanitizer: buffers freed while work of
//! any stream still uses them wait in the pending set (spec 4.3, the later
//! redesign's free path, `HeapSettings::free_waits_for_events`; work
//! recorded with `record_use`, completions by `freeInactiveBuffers`), so no
//! buffer is handed out or written while another stream's work is on it.

use reservoir::backend::{DevicePtr, StreamId};
use reservoir::config::heap::HeapSettings;
use reservoir::error::AllocError;
use reservoir::heap::HeapAllocator;
use reservoir::sim::{AsyncSimDevice, SimConfig};
use reservoir_testkit::conformance::{integrity_run, IntegrityConfig, ScenarioAllocator};

fn heap() -> HeapAllocator<AsyncSimDevice> {
    let dev = AsyncSimDevice::new(SimConfig {
        capacity: 8 << 30,
        ..SimConfig::default()
    });
    let mut s = HeapSettings::new(true);
    s.free_waits_for_events = true;
    HeapAllocator::new(dev, s).unwrap()
}

fn config() -> IntegrityConfig {
    IntegrityConfig {
        ops: 10_000,
        streams: 4,
        seed: 7,
        ..IntegrityConfig::default()
    }
}

#[test]
fn the_heap_allocator_has_no_races_on_the_async_device() {
    let a = heap();
    let rep = integrity_run(&a, &config()).unwrap();
    a.check_invariants().unwrap();
    a.backend().assert_no_races();
    eprintln!(
        "async sim (mps heap): {} ops, {} streams, 0 races ({} copies, {} frees, {} empty_cache, \
         peak reserved {} bytes)",
        rep.ops, rep.streams, rep.copies, rep.frees, rep.empty_caches, rep.peak_reserved
    );
    assert!(rep.copies > 500 && rep.frees > 1000, "{rep:?}");
    assert_eq!(a.stats().allocated_bytes.all().current, 0);
    a.backend().run_until_idle();
    a.free_inactive_buffers().unwrap();
    a.empty_cache().unwrap();
    a.check_invariants().unwrap();
    assert_eq!(a.total_allocated_memory(), 0);
}

/// The heap allocator without `record_use`: the negative control.
struct Forgetful(HeapAllocator<AsyncSimDevice>);

impl ScenarioAllocator for Forgetful {
    type Device = AsyncSimDevice;
    fn device(&self) -> &AsyncSimDevice {
        self.0.backend()
    }
    fn alloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.0.alloc(size, stream)
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        self.0.free(ptr)
    }
    fn before_use(&self, _: DevicePtr, _: StreamId, _: StreamId) -> Result<(), AllocError> {
        Ok(())
    }
    fn after_use(&self, _: &[DevicePtr], _: StreamId) -> Result<(), AllocError> {
        Ok(())
    }
    fn empty_cache(&self) -> Result<(), AllocError> {
        self.0.empty_cache()
    }
    fn peak_reserved(&self) -> i64 {
        self.0.peak_reserved()
    }
}

#[test]
fn without_record_events_the_sanitizer_reports_races() {
    let a = Forgetful(heap());
    let mut cfg = config();
    cfg.ops = 3_000;
    integrity_run(&a, &cfg).unwrap();
    let races = a.0.backend().take_races();
    assert!(
        !races.is_empty(),
        "the sanitizer saw no race without record_use"
    );
}
