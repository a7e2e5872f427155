//! The `cubecl` column (cargo feature `cubecl`): the memory management of
//! CubeCL's runtimes (`cubecl-server` 0.11, what Burn's GPU backends
//! allocate with) over a counting storage that touches no memory.
//!
//! One `MemoryManagement` per stream, as CubeCL keeps one per stream, in its
//! default `Adaptive` configuration, with the fake driver's device: 79.2 GiB,
//! pages of at most 2 GiB (PyTorch's largest request rounding step is far
//! below), 512-byte alignment. An allocation is a `reserve`; a free is
//! dropping the handle (CubeCL frees by reference count, the slice is reused
//! on a later reservation); `empty_cache` is an explicit cleanup. The
//! storage counts what the pools ask of the device and hands out ids, as a
//! device storage would, so the column measures CubeCL's bookkeeping only,
//! like the offset-allocator column.

use std::sync::Arc;

use cubecl_ir::MemoryDeviceProperties;
use cubecl_server::logging::ServerLogger;
use cubecl_server::memory_management::{
    Cleanup, ErrorGraph, ManagedMemoryHandle, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, PageUpdate,
};
use cubecl_server::server::IoError;
use cubecl_server::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

use crate::ops::BenchOp;

/// The device CubeCL sees: largest page and alignment.
const PROPERTIES: MemoryDeviceProperties = MemoryDeviceProperties::new(2 << 30, 512);

/// A storage that only counts: each allocation gets a fresh id and adds to
/// the bytes held, each deallocation subtracts; the device's capacity is the
/// fake driver's, past which an allocation fails as a device would.
#[derive(Debug, Default)]
pub struct CountingStorage {
    /// Bytes held from the "device" now.
    held: u64,
    /// Size of every live allocation, by id.
    sizes: std::collections::HashMap<StorageId, u64>,
    /// Device allocations made so far.
    allocations: u64,
}

impl ComputeStorage for CountingStorage {
    type Resource = u64;

    fn alignment(&self) -> usize {
        PROPERTIES.alignment as usize
    }

    fn get(&mut self, handle: &StorageHandle) -> Result<u64, IoError> {
        Ok(handle.offset())
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        if self.held + size > reservoir::sim::FAKE_DRIVER_CAPACITY {
            return Err(IoError::BufferTooBig {
                size,
                backtrace: Default::default(),
            });
        }
        let id = StorageId::new();
        self.held += size;
        self.allocations += 1;
        self.sizes.insert(id, size);
        Ok(StorageHandle {
            id,
            utilization: StorageUtilization { offset: 0, size },
        })
    }

    fn dealloc(&mut self, id: StorageId) {
        if let Some(size) = self.sizes.remove(&id) {
            self.held -= size;
        }
    }

    fn flush(&mut self) {}

    fn bytes_allocated(&self) -> u64 {
        self.held
    }
}

/// CubeCL's memory management for each of `streams` streams.
pub struct CubeclPools {
    streams: Vec<MemoryManagement<CountingStorage>>,
    failures: ErrorGraph,
}

impl CubeclPools {
    /// Fresh pools, one per stream, in CubeCL's default configuration.
    pub fn new(streams: usize) -> CubeclPools {
        let logger = Arc::new(ServerLogger::default());
        CubeclPools {
            streams: (0..streams.max(1))
                .map(|i| {
                    MemoryManagement::from_configuration(
                        CountingStorage::default(),
                        &PROPERTIES,
                        MemoryConfiguration::default(),
                        logger.clone(),
                        MemoryManagementOptions::new(format!("stream {i}")),
                    )
                })
                .collect(),
            failures: ErrorGraph::default(),
        }
    }

    /// Bytes held from the device over all streams.
    #[cfg(test)]
    pub fn bytes_held(&mut self) -> u64 {
        self.streams
            .iter_mut()
            .map(|m| m.storage().bytes_allocated())
            .sum()
    }

    /// Device allocations made over all streams.
    #[cfg(test)]
    pub fn device_allocations(&mut self) -> u64 {
        self.streams
            .iter_mut()
            .map(|m| m.storage().allocations)
            .sum()
    }
}

/// allocbench's `run_replay` over CubeCL's memory management: an allocation
/// whose name is live frees it first (drops its handle); a failed
/// allocation leaves the name empty; leftovers are freed at the end.
/// Returns the allocator calls made.
#[inline(never)]
pub fn run_cubecl(
    pools: &mut CubeclPools,
    ops: &[BenchOp],
    live: &mut [Option<ManagedMemoryHandle>],
) -> usize {
    let mut calls = 0;
    for op in ops {
        match *op {
            BenchOp::Alloc { id, bytes, stream } => {
                let slot = &mut live[id as usize];
                if slot.take().is_some() {
                    calls += 1;
                }
                let n = pools.streams.len();
                let memory = &mut pools.streams[stream as usize % n];
                *slot = memory
                    .reserve(bytes.max(1), PageUpdate::Allow, &mut pools.failures)
                    .ok();
                calls += 1;
            }
            BenchOp::Free { id } => {
                if live[id as usize].take().is_some() {
                    calls += 1;
                }
            }
            BenchOp::EmptyCache => {
                for memory in &mut pools.streams {
                    memory.cleanup(Cleanup::Explicit, &mut pools.failures);
                }
                calls += 1;
            }
        }
    }
    for slot in live.iter_mut() {
        if slot.take().is_some() {
            calls += 1;
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frees_are_reused_and_empty_cache_gives_pages_back() {
        let mut pools = CubeclPools::new(1);
        let ops = [
            BenchOp::Alloc {
                id: 0,
                bytes: 1 << 20,
                stream: 0,
            },
            BenchOp::Free { id: 0 },
            BenchOp::Alloc {
                id: 0,
                bytes: 1 << 20,
                stream: 0,
            },
        ];
        let mut live = vec![None; 1];
        // alloc, free, alloc, leftover free.
        assert_eq!(run_cubecl(&mut pools, &ops, &mut live), 4);
        assert!(live.iter().all(Option::is_none));
        assert_eq!(pools.device_allocations(), 1, "the freed slice is reused");
        assert!(pools.bytes_held() >= 1 << 20);
        run_cubecl(&mut pools, &[BenchOp::EmptyCache], &mut live);
        assert_eq!(
            pools.bytes_held(),
            0,
            "an explicit cleanup frees every page"
        );
    }

    #[test]
    fn too_large_fails_and_leaves_the_name_empty() {
        let mut pools = CubeclPools::new(2);
        let ops = [BenchOp::Alloc {
            id: 0,
            bytes: reservoir::sim::FAKE_DRIVER_CAPACITY + 1,
            stream: 1,
        }];
        let mut live = vec![None; 1];
        assert_eq!(run_cubecl(&mut pools, &ops, &mut live), 1);
        assert!(live[0].is_none());
        assert_eq!(pools.bytes_held(), 0);
    }
}
