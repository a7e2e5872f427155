//! A checked allocator: every operation is followed by the invariant checker.

use std::collections::BTreeMap;

use reservoir::observe::snapshot::Segment;
use reservoir::sim::{SimConfig, SimDevice};
use reservoir::{AllocError, AllocatorConfig, CachingAllocator, DevicePtr, DeviceStats, StreamId};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

pub const S0: StreamId = StreamId(0);

/// An allocator on a simulated device whose invariants are checked after every call.
pub struct Checked {
    pub a: CachingAllocator<SimDevice>,
}

impl Checked {
    pub fn new(conf: &str, capacity: u64) -> Checked {
        let config = if conf.is_empty() {
            AllocatorConfig::default()
        } else {
            // Reads PyTorch's strings exactly as `parse`, plus `policy:NAME`.
            AllocatorConfig::parse_with_policy(conf).expect("valid config")
        };
        let dev = SimDevice::new(SimConfig {
            capacity,
            ..SimConfig::default()
        });
        let a = CachingAllocator::new(dev, config);
        a.record_history(Some(usize::MAX));
        Checked { a }
    }

    pub fn default_device() -> Checked {
        Checked::new("", 80 * GIB)
    }

    pub fn check(&self) {
        if let Err(e) = self.a.check_invariants() {
            panic!("{e}\nsegments: {:#?}", self.a.segments());
        }
    }

    pub fn alloc(&self, size: u64) -> DevicePtr {
        self.alloc_on(size, S0)
    }

    pub fn alloc_on(&self, size: u64, stream: StreamId) -> DevicePtr {
        let p = self
            .a
            .raw_alloc(size, stream)
            .unwrap_or_else(|e| panic!("alloc {size}: {e}"));
        self.check();
        p
    }

    pub fn try_alloc(&self, size: u64) -> Result<DevicePtr, AllocError> {
        let r = self.a.raw_alloc(size, S0);
        self.check();
        r
    }

    pub fn free(&self, p: DevicePtr) {
        self.a
            .raw_free(p)
            .unwrap_or_else(|e| panic!("free {p}: {e}"));
        self.check();
    }

    pub fn empty_cache(&self) {
        self.a.empty_cache().unwrap();
        self.check();
    }

    pub fn stats(&self) -> DeviceStats {
        self.a.stats()
    }

    pub fn flat(&self) -> BTreeMap<String, i64> {
        self.a.memory_stats()
    }

    pub fn segments(&self) -> Vec<Segment> {
        self.a.segments()
    }

    pub fn reserved(&self) -> i64 {
        self.stats().reserved_bytes.all().current
    }

    pub fn allocated_now(&self) -> i64 {
        self.stats().allocated_bytes.all().current
    }

    /// (action, size) of every segment event so far.
    pub fn segment_events(&self) -> Vec<(String, u64)> {
        self.a
            .history()
            .into_iter()
            .filter(|e| e.action.is_segment_event())
            .map(|e| (e.action.as_str().to_string(), e.size))
            .collect()
    }
}
