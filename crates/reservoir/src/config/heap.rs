//! Settings of the MPS-style heap allocator ([`HeapAllocator`](crate::heap::HeapAllocator)):
//! the watermark ratios (spec 4.4) and the debug bitmask (spec 4.5), read
//! from PyTorch's environment variables by `MPSHeapAllocatorImpl::init_allocator`.
//!
//! | variable | default | valid | meaning |
//! |---|---|---|---|
//! | [`ENV_HIGH_WATERMARK_RATIO`] | 1.7 | `[0, 2.0]` | hard limit = ratio × recommended max memory; 0 = unlimited |
//! | [`ENV_LOW_WATERMARK_RATIO`] | 1.4 unified, 1.0 discrete | `[0, high]` (`[0, 2.0]` if high is 0) | soft limit (memory pressure, GC); 0 = GC off |
//! | [`ENV_DEBUG`] | 0 | any `strtol(s, NULL, 0)` value | the [`DebugVerbosity`] bitmask |
//!
//! PyTorch reads the ratios with `strtod(s, nullptr)` and so does Reservoir
//! ([`strtod`]): leading blanks are skipped, trailing text is ignored
//! ("1.5x" is 1.5), hexadecimal floats are read ("0x1.8p0" is 1.5), and text
//! that is not a number is 0.0, which *disables* the limit ("abc" and ""
//! mean unlimited). A ratio outside its range is PyTorch's `TORCH_CHECK`
//! failure "invalid high watermark ratio {r}" / "invalid low watermark ratio
//! {r}", the ratio written as C++'s `ostream` writes a double ("nan",
//! "2.5"), here [`HeapSettingsError::InvalidHighWatermark`] /
//! [`HeapSettingsError::InvalidLowWatermark`].
//! The debug value follows C's `strtol` with base 0 exactly (see [`strtol_base0`]):
//! leading blanks, an optional sign, `0x` hexadecimal, a leading `0` for
//! octal, trailing text ignored, no digits = 0; the value is kept whole as
//! PyTorch's `uint32_t m_debug_verbosity` (the low 32 bits), so bits above
//! `LARGE_ONLY` still make "Initializing ..." and "Attempting to release
//! ..." print (PyTorch tests `getDebugVerbosity()` for non-zero there).
//!
//! **Which PyTorch.** The defaults are the `MPSAllocator.mm` of the seed
//! headers (pytorch/pytorch `57ba412974d87ca62f0c7010e5953581587c40c6`, the
//! 2.7-era code; see `docs/heap.md`). Two behaviours of other versions are
//! named settings: [`HeapSettings::size_format`] = [`SizeFormat::Mps26`]
//! for the "KB"/"MB"/"GB" messages of PyTorch 2.0-2.6, and
//! [`HeapSettings::free_waits_for_events`] for the pending-free path of the
//! later MPS redesign.

use super::cnum::ostream_double;
pub use super::cnum::{strtod, strtol_base0};
pub use crate::format::SizeFormat;
use crate::observe::debug::DebugVerbosity;

/// `PYTORCH_MPS_HIGH_WATERMARK_RATIO`.
pub const ENV_HIGH_WATERMARK_RATIO: &str = "PYTORCH_MPS_HIGH_WATERMARK_RATIO";
/// `PYTORCH_MPS_LOW_WATERMARK_RATIO`.
pub const ENV_LOW_WATERMARK_RATIO: &str = "PYTORCH_MPS_LOW_WATERMARK_RATIO";
/// `PYTORCH_DEBUG_MPS_ALLOCATOR`.
pub const ENV_DEBUG: &str = "PYTORCH_DEBUG_MPS_ALLOCATOR";

/// Default high watermark ratio (`default_high_watermark_ratio`).
pub const DEFAULT_HIGH_WATERMARK_RATIO: f64 = 1.7;
/// Largest valid high watermark ratio (`default_high_watermark_upper_bound`).
pub const HIGH_WATERMARK_UPPER_BOUND: f64 = 2.0;
/// Default low watermark ratio on unified memory.
pub const DEFAULT_LOW_WATERMARK_RATIO_UNIFIED: f64 = 1.4;
/// Default low watermark ratio on a discrete GPU.
pub const DEFAULT_LOW_WATERMARK_RATIO_DISCRETE: f64 = 1.0;

/// Settings of one heap allocator. Plain data; [`HeapSettings::new`] gives
/// PyTorch's defaults, [`HeapSettings::from_env`] reads the environment.
#[derive(Clone, Debug, PartialEq)]
pub struct HeapSettings {
    /// The device has unified memory (Apple silicon): decides the low
    /// watermark default, the extra-large heap size (spec 4.2 step 7), the
    /// shared pool for ≤ 8-byte requests and whether the shared allocator
    /// exists.
    pub unified_memory: bool,
    /// High watermark ratio (spec 4.4).
    pub high_watermark_ratio: f64,
    /// Low watermark ratio (spec 4.4).
    pub low_watermark_ratio: f64,
    /// Debug output (spec 4.5).
    pub debug: DebugVerbosity,
    /// `device.recommendedMaxWorkingSetSize`; `None` = the backend's
    /// `mem_info().total`.
    pub recommended_max_memory: Option<u64>,
    /// `device.maxBufferLength`: requests must be smaller ("Invalid buffer
    /// size"); `None` = the backend's `mem_info().total`.
    pub max_buffer_length: Option<u64>,
    /// The free path (spec 4.3). False (the default) is the seed's 2.x
    /// `free()`: a freed buffer goes back to its pool's available buffers
    /// at once, whatever its retain count (still busy, which is what the
    /// retain-count branches of `get_free_buffer` and of garbage collection
    /// look at). True is the later MPS redesign (after the seed's
    /// 57ba412): a freed buffer whose recorded work is still pending waits
    /// in `buffers_pending_free`, still counted in the current allocated
    /// memory and not reusable, until that work completes. Backends with
    /// several queues need true: 2.x relies on Metal's one serial queue
    /// and its hazard tracking to order the reuse.
    pub free_waits_for_events: bool,
    /// How sizes are written in messages (out-of-memory text, "Invalid
    /// buffer size", debug output): [`SizeFormat::C10`] (the default, the
    /// seed's 2.7-era code: c10's `format_size`, "KiB"/"MiB"/"GiB") or
    /// [`SizeFormat::Mps26`] (PyTorch 2.0-2.6's own, "KB"/"MB"/"GB" from a
    /// `float`).
    pub size_format: SizeFormat,
    /// Reservoir extension: also fire the `Allocated`, `Recycled`, `Freed`
    /// and `Released` callback events. False (the default) fires only
    /// `AllocationFailed`, the one event PyTorch 2.x fires.
    pub all_callback_events: bool,
}

impl HeapSettings {
    /// PyTorch's defaults for a unified or discrete device.
    pub fn new(unified_memory: bool) -> HeapSettings {
        HeapSettings {
            unified_memory,
            high_watermark_ratio: DEFAULT_HIGH_WATERMARK_RATIO,
            low_watermark_ratio: default_low_watermark_ratio(unified_memory),
            debug: DebugVerbosity::OFF,
            recommended_max_memory: None,
            max_buffer_length: None,
            free_waits_for_events: false,
            size_format: SizeFormat::C10,
            all_callback_events: false,
        }
    }

    /// The defaults, overridden by [`ENV_HIGH_WATERMARK_RATIO`],
    /// [`ENV_LOW_WATERMARK_RATIO`] and [`ENV_DEBUG`] where set.
    pub fn from_env(unified_memory: bool) -> Result<HeapSettings, HeapSettingsError> {
        HeapSettings::from_lookup(unified_memory, |name| std::env::var(name).ok())
    }

    /// Like [`from_env`](Self::from_env), with the variables looked up by `get`.
    pub fn from_lookup(
        unified_memory: bool,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<HeapSettings, HeapSettingsError> {
        let mut s = HeapSettings::new(unified_memory);
        if let Some(v) = get(ENV_DEBUG) {
            s.debug = debug_from_strtol(strtol_base0(&v));
        }
        if let Some(v) = get(ENV_HIGH_WATERMARK_RATIO) {
            s.high_watermark_ratio = strtod(&v);
        }
        if let Some(v) = get(ENV_LOW_WATERMARK_RATIO) {
            s.low_watermark_ratio = strtod(&v);
        }
        s.validate()?;
        Ok(s)
    }

    /// PyTorch 2.0-2.6's behaviour where it differs from the default (the
    /// seed's 2.7-era code): sizes in "KB"/"MB"/"GB" ([`SizeFormat::Mps26`]).
    /// The allocation logic of `MPSAllocator.mm` is the same in those
    /// versions.
    pub fn torch_2_6(unified_memory: bool) -> HeapSettings {
        HeapSettings {
            size_format: SizeFormat::Mps26,
            ..HeapSettings::new(unified_memory)
        }
    }

    /// Check both ratios against their ranges, high first (as PyTorch sets
    /// them).
    pub fn validate(&self) -> Result<(), HeapSettingsError> {
        check_high_watermark(self.high_watermark_ratio)?;
        check_low_watermark(self.low_watermark_ratio, self.high_watermark_ratio)
    }
}

/// The low watermark default: 1.4 on unified memory, 1.0 on a discrete GPU.
pub fn default_low_watermark_ratio(unified_memory: bool) -> f64 {
    if unified_memory {
        DEFAULT_LOW_WATERMARK_RATIO_UNIFIED
    } else {
        DEFAULT_LOW_WATERMARK_RATIO_DISCRETE
    }
}

/// `setHighWatermarkRatio`'s check: `0 <= ratio <= 2.0`.
pub fn check_high_watermark(ratio: f64) -> Result<(), HeapSettingsError> {
    if (0.0..=HIGH_WATERMARK_UPPER_BOUND).contains(&ratio) {
        Ok(())
    } else {
        Err(HeapSettingsError::InvalidHighWatermark(ratio))
    }
}

/// `setLowWatermarkRatio`'s check: `0 <= ratio <= high` (`<= 2.0` when the
/// high watermark is disabled).
pub fn check_low_watermark(ratio: f64, high: f64) -> Result<(), HeapSettingsError> {
    let limit = if high == 0.0 {
        HIGH_WATERMARK_UPPER_BOUND
    } else {
        high
    };
    if (0.0..=limit).contains(&ratio) {
        Ok(())
    } else {
        Err(HeapSettingsError::InvalidLowWatermark(ratio))
    }
}

/// The verbosity of a `strtol` value: its low 32 bits, all kept (PyTorch's
/// `uint32_t m_debug_verbosity`). The five known bits select the messages;
/// any non-zero value also prints "Initializing ..." and "Attempting to
/// release ...".
pub fn debug_from_strtol(value: i64) -> DebugVerbosity {
    DebugVerbosity::from_bits_retain(value as u32)
}

/// A heap allocator setting that is refused.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum HeapSettingsError {
    /// PyTorch's "invalid high watermark ratio {r}" (valid: `[0, 2.0]`).
    #[error("invalid high watermark ratio {}", ostream_double(*.0))]
    InvalidHighWatermark(f64),
    /// PyTorch's "invalid low watermark ratio {r}" (valid: `[0, high]`).
    #[error("invalid low watermark ratio {}", ostream_double(*.0))]
    InvalidLowWatermark(f64),
}
