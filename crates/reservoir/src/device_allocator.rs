//! The device-allocator contract of `c10/core/CachingDeviceAllocator.h`
//! (`DeviceAllocator`) and one allocator per device index.

use crate::backend::{Backend, MemInfo};
use crate::caching::CachingAllocator;
use crate::config::AllocatorConfig;
use crate::error::AllocError;
use crate::ids::{DeviceIndex, DevicePtr, MempoolId, StreamId};
use crate::stats::DeviceStats;

/// The contract every device allocator fulfils (`c10::DeviceAllocator`).
pub trait DeviceAllocator: Send + Sync {
    /// True once the allocator is ready to serve allocations.
    fn initialized(&self) -> bool;

    /// Allocate `size` bytes on `device` for `stream`.
    fn raw_alloc(
        &self,
        device: DeviceIndex,
        size: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, AllocError>;

    /// Free a pointer from [`raw_alloc`](Self::raw_alloc).
    fn raw_free(&self, ptr: DevicePtr) -> Result<(), AllocError>;

    /// Release cached memory of `pool` (every device; [`MempoolId::DEFAULT`]
    /// releases the global pools).
    fn empty_cache(&self, pool: MempoolId) -> Result<(), AllocError>;

    /// Mark `ptr` as used by `stream` until the work enqueued so far completes.
    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError>;

    /// The statistics of one device.
    fn device_stats(&self, device: DeviceIndex) -> Result<DeviceStats, AllocError>;

    /// Zero the lifetime totals of one device.
    fn reset_accumulated_stats(&self, device: DeviceIndex) -> Result<(), AllocError>;

    /// Reset the peaks of one device.
    fn reset_peak_stats(&self, device: DeviceIndex) -> Result<(), AllocError>;

    /// Free and total memory of one device.
    fn memory_info(&self, device: DeviceIndex) -> Result<MemInfo, AllocError>;
}

/// One [`CachingAllocator`] per device index, behind the [`DeviceAllocator`] contract.
pub struct MultiDeviceAllocator<B: Backend> {
    devices: Vec<CachingAllocator<B>>,
}

impl<B: Backend> MultiDeviceAllocator<B> {
    /// One allocator per backend; the i-th backend is device `i`.
    pub fn new(backends: Vec<B>, config: AllocatorConfig) -> Self {
        let devices = backends
            .into_iter()
            .enumerate()
            .map(|(i, b)| CachingAllocator::with_device(b, config.clone(), i as DeviceIndex))
            .collect();
        MultiDeviceAllocator { devices }
    }

    /// The allocator of one device.
    pub fn device(&self, device: DeviceIndex) -> Result<&CachingAllocator<B>, AllocError> {
        usize::try_from(device)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or_else(|| {
                AllocError::InvalidArgument(format!(
                    "device index {device} is out of range: this allocator has {} device(s) \
                 (valid indices 0..{})",
                    self.devices.len(),
                    self.devices.len()
                ))
            })
    }

    /// Number of devices.
    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn owner(&self, ptr: DevicePtr) -> Result<&CachingAllocator<B>, AllocError> {
        self.devices
            .iter()
            .find(|d| d.base_allocation(ptr).is_ok())
            .ok_or(AllocError::InvalidPointer { ptr })
    }
}

impl<B: Backend> DeviceAllocator for MultiDeviceAllocator<B> {
    fn initialized(&self) -> bool {
        !self.devices.is_empty()
    }

    fn raw_alloc(
        &self,
        device: DeviceIndex,
        size: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, AllocError> {
        self.device(device)?.raw_alloc(size, stream)
    }

    fn raw_free(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.owner(ptr)?.raw_free(ptr)
    }

    fn empty_cache(&self, pool: MempoolId) -> Result<(), AllocError> {
        if !pool.is_default() {
            return Err(AllocError::InvalidArgument(format!(
                "unknown memory pool {pool:?}: no private pool with this id exists"
            )));
        }
        for d in &self.devices {
            d.empty_cache()?;
        }
        Ok(())
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        self.owner(ptr)?.record_stream(ptr, stream)
    }

    fn device_stats(&self, device: DeviceIndex) -> Result<DeviceStats, AllocError> {
        Ok(self.device(device)?.stats())
    }

    fn reset_accumulated_stats(&self, device: DeviceIndex) -> Result<(), AllocError> {
        self.device(device)?.reset_accumulated_stats();
        Ok(())
    }

    fn reset_peak_stats(&self, device: DeviceIndex) -> Result<(), AllocError> {
        self.device(device)?.reset_peak_stats();
        Ok(())
    }

    fn memory_info(&self, device: DeviceIndex) -> Result<MemInfo, AllocError> {
        self.device(device)?.mem_info()
    }
}
