//! Reservoir's fastest configuration: real settings of the same
//! `CachingAllocator` (core code unchanged), chosen by callgrind
//! instruction count on the random sequences (64 live blocks, one and two
//! streams). It is PyTorch-exact only against a PyTorch run with the same
//! `PYTORCH_CUDA_ALLOC_CONF`, and it rounds sizes up more than the
//! default, so it trades memory for speed.
//!
//! Measured on `--quick`'s "random, 64 live" (instructions per call,
//! 2 replays): default 768; `roundup_power2_divisions:2` about 2.5 % fewer;
//! with `max_split_size_mb:20` as well, about 3.5 % fewer; divisions 8 or
//! `[1:1,>:4]`, garbage collection, plain rounding: within 1 %;
//! `expandable_segments:True` +24 %; the cross-stream reuse policy
//! +7.6 % on "two streams". History recording is already off by default and
//! the statistics have no cheaper setting, so this is the fastest
//! configuration there is.

use reservoir::AllocatorConfig;

/// The settings string of the fastest configuration.
pub const FASTEST_SETTINGS: &str = "roundup_power2_divisions:2,max_split_size_mb:20";

/// The fastest configuration measured: [`FASTEST_SETTINGS`] parsed as
/// `PYTORCH_CUDA_ALLOC_CONF` (Reservoir's own policies off).
pub fn fastest_config() -> AllocatorConfig {
    AllocatorConfig::parse(FASTEST_SETTINGS).expect("FASTEST_SETTINGS is a valid settings string")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differs_from_pytorch_defaults_only_in_its_two_settings() {
        let c = fastest_config();
        let d = AllocatorConfig::default();
        assert_eq!(c.max_split_size, 20 << 20);
        assert_eq!(c.roundup_power2_divisions[0], 2);
        assert_ne!(c.roundup_power2_divisions, d.roundup_power2_divisions);
        assert_eq!(c.policy, d.policy);
        assert_eq!(c.expandable_segments, d.expandable_segments);
    }
}
