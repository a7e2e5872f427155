//! Where settings come from: PyTorch 2.15's three readers. At start-up the
//! backend scan and the CUDA keys read `PYTORCH_CUDA_ALLOC_CONF` (else
//! `PYTORCH_ALLOC_CONF`), then the common keys read the first set of
//! `PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`
//! (spec error 6); at run time `_set_allocator_settings` reads the common
//! keys, then the CUDA keys (spec error 7).

use super::cuda;
use super::error::{ConfigError, ConfigWarning};
use super::keys;
use super::policy::{policy_and_release, ReservoirPolicy, POLICY_KEY};
use super::settings::AllocatorConfig;
use super::tokenizer::Tokens;
use super::torch_release::TorchRelease;

/// The environment variable PyTorch reads first (it wins even when empty).
pub const ENV_CUDA_ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
/// The ROCm spelling; a CUDA build reads it for the common keys only.
pub const ENV_HIP_ALLOC_CONF: &str = "PYTORCH_HIP_ALLOC_CONF";
/// The device-generic variable, read when `PYTORCH_CUDA_ALLOC_CONF` is unset.
pub const ENV_ALLOC_CONF: &str = "PYTORCH_ALLOC_CONF";

impl AllocatorConfig {
    /// Parses a settings string as PyTorch reads `PYTORCH_CUDA_ALLOC_CONF`
    /// at start-up: the backend scan, then the CUDA keys, then the common
    /// keys, each against PyTorch's defaults. Same result as
    /// [`AllocatorConfig::from_env_with`] with only that variable set, except
    /// that errors are not wrapped in [`ConfigError::Env`].
    pub fn parse(s: &str) -> Result<AllocatorConfig, ConfigError> {
        Self::parse_with_warnings(s).map(|(cfg, _)| cfg)
    }

    /// [`AllocatorConfig::parse`], also returning the warnings PyTorch would
    /// print (it prints them on stderr and carries on).
    pub fn parse_with_warnings(
        s: &str,
    ) -> Result<(AllocatorConfig, Vec<ConfigWarning>), ConfigError> {
        let mut warnings = Vec::new();
        let src = Some((s, None));
        let cfg = startup_parse(TorchRelease::NEWEST, src, src, &mut warnings)?;
        Ok((cfg, warnings))
    }

    /// Reads the settings from the process environment, as PyTorch does at
    /// start-up (see [`AllocatorConfig::from_env_with`]). Values that are not
    /// valid Unicode are read lossily.
    pub fn from_env() -> Result<AllocatorConfig, ConfigError> {
        Self::from_env_with(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// Reads the settings through `lookup` (a variable name to its value, or
    /// `None` when unset), with PyTorch 2.15's priorities:
    ///
    /// * backend and CUDA keys: `PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_ALLOC_CONF`;
    /// * common keys (and [`AllocatorConfig::last_settings`]):
    ///   `PYTORCH_CUDA_ALLOC_CONF`, else `PYTORCH_HIP_ALLOC_CONF`, else
    ///   `PYTORCH_ALLOC_CONF`.
    ///
    /// A variable set to the empty string counts as set. Errors name the
    /// variable ([`ConfigError::Env`]).
    pub fn from_env_with<F>(lookup: F) -> Result<AllocatorConfig, ConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        Self::from_env_with_warnings(lookup).map(|(cfg, _)| cfg)
    }

    /// [`AllocatorConfig::from_env_with`], also returning PyTorch's warnings.
    pub fn from_env_with_warnings<F>(
        mut lookup: F,
    ) -> Result<(AllocatorConfig, Vec<ConfigWarning>), ConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        let cuda = lookup(ENV_CUDA_ALLOC_CONF);
        let hip = lookup(ENV_HIP_ALLOC_CONF);
        let generic = lookup(ENV_ALLOC_CONF);
        let cuda_src = match (&cuda, &generic) {
            (Some(v), _) => Some((v.as_str(), Some(ENV_CUDA_ALLOC_CONF))),
            (None, Some(v)) => Some((v.as_str(), Some(ENV_ALLOC_CONF))),
            (None, None) => None,
        };
        let common_src = match (&cuda, &hip, &generic) {
            (Some(v), _, _) => Some((v.as_str(), Some(ENV_CUDA_ALLOC_CONF))),
            (None, Some(v), _) => Some((v.as_str(), Some(ENV_HIP_ALLOC_CONF))),
            (None, None, Some(v)) => Some((v.as_str(), Some(ENV_ALLOC_CONF))),
            (None, None, None) => None,
        };
        let mut warnings = Vec::new();
        let cfg = startup_parse(TorchRelease::NEWEST, cuda_src, common_src, &mut warnings)?;
        Ok((cfg, warnings))
    }

    /// Applies a settings string at run time, as
    /// `torch.cuda.memory._set_allocator_settings` (2.15:
    /// `torch._C._accelerator_setAllocatorSettings`) does: first
    /// `max_split_size`, `roundup_power2_divisions` and
    /// `garbage_collection_threshold` go back to their defaults and
    /// `max_non_split_rounding_size` to `large_segment_size`; then the common
    /// keys and the CUDA keys of `s` are applied. Everything else keeps its
    /// value; `backend` may only repeat the start-up backend.
    ///
    /// On error `self` is left unchanged (PyTorch would leave it half-applied).
    pub fn apply_runtime(&mut self, s: &str) -> Result<(), ConfigError> {
        self.apply_runtime_with_warnings(s).map(|_| ())
    }

    /// [`AllocatorConfig::apply_runtime`], also returning PyTorch's warnings.
    pub fn apply_runtime_with_warnings(
        &mut self,
        s: &str,
    ) -> Result<Vec<ConfigWarning>, ConfigError> {
        let mut warnings = Vec::new();
        let mut next = self.clone();
        let tokens = Tokens::new(s)?;
        keys::accelerator_keys(&mut next, &tokens, &mut warnings)?;
        next.last_settings = s.to_owned();
        keys::cuda_keys(&mut next, &tokens, &mut warnings)?;
        *self = next;
        Ok(warnings)
    }
}

impl AllocatorConfig {
    /// A settings string with, besides PyTorch's keys, Reservoir-only
    /// `policy:NAME` entries (see [`ReservoirPolicy::named`]; the last one
    /// wins). `policy:pytorch-2.11` ... `policy:pytorch-2.15` name PyTorch
    /// mode of one release ([`AllocatorConfig::torch_release`]); every other
    /// name means the newest release, and a key the named release does not
    /// have is refused as that release refuses it. The entries are taken
    /// out and the rest is read by [`AllocatorConfig::parse`], so a string
    /// without them reads exactly as in PyTorch. `policy:reservoir` also
    /// turns on expandable segments.
    pub fn parse_with_policy(s: &str) -> Result<AllocatorConfig, ConfigError> {
        super::tokenizer::check_len(s)?;
        let mut policy = None;
        let mut rest = Vec::new();
        for entry in s.split(',') {
            let named = entry
                .split_once(':')
                .filter(|(k, _)| k.trim() == POLICY_KEY)
                .map(|(_, v)| v.trim());
            match named {
                Some(name) => policy = Some(policy_and_release(name)?),
                None => rest.push(entry),
            }
        }
        let rest = rest.join(",");
        let release = policy.map(|(_, r)| r).unwrap_or_default();
        let mut cfg = if rest.trim().is_empty() {
            AllocatorConfig {
                torch_release: release,
                ..AllocatorConfig::default()
            }
        } else {
            let src = Some((rest.as_str(), None));
            startup_parse(release, src, src, &mut Vec::new())?
        };
        if let Some((p, _)) = policy {
            cfg.expandable_segments |= p == ReservoirPolicy::Reservoir;
            cfg.policy = p;
        }
        Ok(cfg)
    }
}

/// A settings string and, when it came from the environment, its variable.
type Source<'a> = Option<(&'a str, Option<&'static str>)>;

/// Start-up parsing in PyTorch's order, as PyTorch `release` reads it: the
/// backend scan and the CUDA keys of `cuda_src`, then the common keys of
/// `common_src`.
fn startup_parse(
    release: TorchRelease,
    cuda_src: Source<'_>,
    common_src: Source<'_>,
    warnings: &mut Vec<ConfigWarning>,
) -> Result<AllocatorConfig, ConfigError> {
    fn wrap(var: Option<&'static str>) -> impl Fn(ConfigError) -> ConfigError {
        move |e| match var {
            Some(var) => ConfigError::Env {
                var,
                error: Box::new(e),
            },
            None => e,
        }
    }
    let mut cfg = AllocatorConfig {
        torch_release: release,
        ..AllocatorConfig::default()
    };
    if let Some((src, var)) = cuda_src {
        let tokens = Tokens::new(src).map_err(wrap(var))?;
        cfg.backend = cuda::backend_scan(&tokens).map_err(wrap(var))?;
        keys::cuda_keys(&mut cfg, &tokens, warnings).map_err(wrap(var))?;
    }
    if let Some((src, var)) = common_src {
        let tokens = Tokens::new(src).map_err(wrap(var))?;
        keys::accelerator_keys(&mut cfg, &tokens, warnings).map_err(wrap(var))?;
        cfg.last_settings = src.to_owned();
    }
    Ok(cfg)
}
