//! [`CachingAllocator`]'s backend, device and settings.

use super::super::{supported, CachingAllocator};
use crate::backend::Backend;
use crate::config::AllocatorConfig;
use crate::error::AllocError;

/// What the allocator runs on and with what settings: its backend and
/// device, the settings in force (`_set_allocator_settings`) and the
/// per-process memory fraction.
impl<B: Backend> CachingAllocator<B> {
    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The device index.
    pub fn device(&self) -> i8 {
        self.state.lock().device
    }

    /// The settings in force.
    pub fn config(&self) -> AllocatorConfig {
        self.state.lock().config.clone()
    }

    /// Replace the settings at run time (PyTorch's `_set_allocator_settings`).
    /// `stats.max_split_size` keeps the value from construction, as in PyTorch.
    pub fn set_config(&self, config: AllocatorConfig) {
        let config = supported(config, &self.backend);
        self.state.lock().replace_config(config);
    }

    /// Limit the memory this allocator may reserve to `fraction` of the
    /// device (`torch.cuda.set_per_process_memory_fraction`). 1.0 removes
    /// the limit.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidArgument(format!(
                "invalid fraction: {fraction}. Please set within [0, 1]."
            )));
        }
        let total = self.backend.mem_info()?.total;
        let mut state = self.state.lock();
        let rounding = state.config.torch_release.rules().memory_fraction_rounding;
        state.acct.set_memory_fraction(fraction, total, rounding);
        Ok(())
    }

    /// The fraction of the device this allocator may reserve (1.0 when unlimited).
    pub fn memory_fraction(&self) -> Result<f64, AllocError> {
        let allowed = self.state.lock().acct.allowed_memory_maximum();
        Ok(match allowed {
            Some(a) => a as f64 / self.backend.mem_info()?.total as f64,
            None => 1.0,
        })
    }
}
