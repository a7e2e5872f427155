//! Built-in workloads: deterministic allocation sequences of realistic
//! deep-learning programs, as oracle traces.
//!
//! A workload turns a handful of model dimensions into the sequence of
//! allocations and frees that an eager PyTorch program with that model makes
//! on its GPU, as an [`oracle_trace::Trace`](crate::oracle_trace::Trace).
//! The same trace can be replayed through Reservoir
//! ([`replay`](crate::replay)) or written out
//! ([`Trace::to_text`](crate::oracle_trace::Trace::to_text)) and fed to the
//! real PyTorch allocator with
//! `python3 ../shared/oracle/oracle_replay.py TRACE OUT.json`.
//!
//! Generation is fully deterministic: a trace depends only on the workload's
//! parameters (random choices use [`SplitMix64`](reservoir::rng::SplitMix64)
//! with the `seed` parameter; no hash maps, no floating point in sizes).
//!
//! # Workloads
//!
//! There are two kinds, each with named presets ([`presets`]):
//!
//! * **GPT training** ([`GptTrain`], presets `gpt-train`, `gpt2-small-train`,
//!   `gpt2-medium-train`, `gpt2-small-ddp-train`, `gpt-1.3b-train`,
//!   `gpt2-medium-finetune`): a GPT-2-style decoder trained with AdamW for
//!   a few steps, on sequences of a fixed length or padded per batch. The weights are
//!   allocated once; each step frees the previous gradients
//!   (`zero_grad(set_to_none=True)`), runs the forward pass keeping what
//!   backward needs (layer-norm outputs and statistics, the fused QKV
//!   projection, attention scores, probabilities and dropout masks, MLP
//!   inputs and activations), frees temporaries at once, runs backward
//!   (freeing saved tensors as they are consumed, allocating activation
//!   gradients that live for one layer and weight gradients that live until
//!   the next step), clips gradients, and steps a foreach AdamW (whose
//!   `exp_avg` and `exp_avg_sq` are created on the first step only). The
//!   cuBLAS workspace is allocated at the first matrix multiply and kept.
//!   See [`GptTrain`] for every allocation and why it is made.
//! * **LLM inference** ([`LlmInfer`], presets `llm-infer`, `llama-7b-infer`,
//!   `llama-13b-infer`, `mistral-7b-infer`, `llm-infer-concat`): a
//!   LLaMA-style decoder serving requests of varying prompt and generation
//!   lengths with continuous batching: requests arrive over time, are
//!   admitted up to a batch limit, prefilled, then decoded one token per step
//!   with the rest of the batch; each request's key/value cache grows block by
//!   block (or by re-allocation, `block=0`) and is freed when the request
//!   finishes. See [`LlmInfer`].
//!
//! # Naming a workload
//!
//! A workload is named by a spec string `PRESET[:key=value,...]`
//! ([`Workload::parse`]): a preset, and optionally parameters overriding its
//! dimensions, e.g. `gpt-train:layers=24,hidden=2048,batch=8` or
//! `llama-7b-infer:requests=16,block=0`. [`GptTrain::PARAMS`] and
//! [`LlmInfer::PARAMS`] list the keys. Integer values accept `K`/`M`/`G`
//! suffixes (powers of 1024, for `vocab=32K` and the like), booleans accept
//! `0/1/true/false/yes/no`, and `dtype` also accepts `fp32`, `fp16`, `bf16`,
//! `fp8`.
//!
//! ```
//! use reservoir_replay::workload::Workload;
//!
//! let w = Workload::parse("gpt-train:layers=2,steps=2").unwrap();
//! let trace = w.trace();
//! assert_eq!(trace, Workload::parse("gpt-train:layers=2,steps=2").unwrap().trace());
//! assert!(trace.ops.len() > 100);
//! ```

mod gpt_train;
mod llm_infer;

pub use gpt_train::GptTrain;
pub use llm_infer::LlmInfer;

use std::fmt;

use crate::oracle_trace::{AllocId, Op, StreamName, Trace};
use crate::replay::roles::{Hint, Phase, Role};
use crate::replay::sites::Sites;

/// Which generator a preset uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    /// [`GptTrain`].
    GptTrain,
    /// [`LlmInfer`].
    LlmInfer,
}

impl WorkloadKind {
    /// The kind's name: `gpt-train` or `llm-infer`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::GptTrain => "gpt-train",
            WorkloadKind::LlmInfer => "llm-infer",
        }
    }

    /// The parameter keys of this kind, with their descriptions.
    pub fn params(self) -> &'static [ParamInfo] {
        match self {
            WorkloadKind::GptTrain => GptTrain::PARAMS,
            WorkloadKind::LlmInfer => LlmInfer::PARAMS,
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parameter of a workload kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// The key, as written in a spec string.
    pub key: &'static str,
    /// What it sets.
    pub help: &'static str,
}

/// A named, documented preset: a workload kind with fixed dimensions.
#[derive(Clone, Copy, Debug)]
pub struct Preset {
    /// The name used in spec strings and on the command line.
    pub name: &'static str,
    /// The generator.
    pub kind: WorkloadKind,
    /// One line: what it models.
    pub description: &'static str,
    build: fn() -> WorkloadParams,
}

impl Preset {
    /// The preset's parameters.
    pub fn params(&self) -> WorkloadParams {
        (self.build)()
    }
}

impl PartialEq for Preset {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

const PRESETS: &[Preset] = &[
    Preset {
        name: "gpt-train",
        kind: WorkloadKind::GptTrain,
        description: "small GPT training, 5 AdamW steps (4 layers, hidden 512, batch 8, \
                      sequences padded to 64-256 tokens): the quick default",
        build: || WorkloadParams::GptTrain(GptTrain::default()),
    },
    Preset {
        name: "gpt2-small-train",
        kind: WorkloadKind::GptTrain,
        description: "GPT-2 small (124M) training in bf16, seq 1024, batch 8, 3 AdamW steps",
        build: || WorkloadParams::GptTrain(GptTrain::gpt2_small()),
    },
    Preset {
        name: "gpt2-medium-train",
        kind: WorkloadKind::GptTrain,
        description: "GPT-2 medium (350M) training in bf16, seq 1024, batch 8, 3 AdamW steps",
        build: || WorkloadParams::GptTrain(GptTrain::gpt2_medium()),
    },
    Preset {
        name: "gpt2-medium-finetune",
        kind: WorkloadKind::GptTrain,
        description: "GPT-2 medium fine-tuning in bf16 with dynamic padding (sequences of \
                      128-1024 tokens), batch 8, 6 AdamW steps",
        build: || WorkloadParams::GptTrain(GptTrain::gpt2_medium_finetune()),
    },
    Preset {
        name: "gpt2-small-ddp-train",
        kind: WorkloadKind::GptTrain,
        description: "GPT-2 small training with DDP-style gradient buckets all-reduced on a \
                      communication stream (record_stream, wait_stream)",
        build: || {
            WorkloadParams::GptTrain(GptTrain {
                ddp: true,
                ..GptTrain::gpt2_small()
            })
        },
    },
    Preset {
        name: "gpt-1.3b-train",
        kind: WorkloadKind::GptTrain,
        description: "GPT-3 XL-sized (1.3B) training in bf16, seq 2048, batch 4, no dropout, \
                      3 AdamW steps",
        build: || WorkloadParams::GptTrain(GptTrain::gpt_1_3b()),
    },
    Preset {
        name: "llm-infer",
        kind: WorkloadKind::LlmInfer,
        description: "small LLaMA-style serving: 24 requests, continuous batching up to 8, \
                      paged KV cache: the quick inference default",
        build: || WorkloadParams::LlmInfer(LlmInfer::default()),
    },
    Preset {
        name: "llm-infer-concat",
        kind: WorkloadKind::LlmInfer,
        description: "the llm-infer model with a contiguous KV cache re-allocated one token \
                      larger every step (torch.cat style, block=0)",
        build: || {
            WorkloadParams::LlmInfer(LlmInfer {
                block: 0,
                ..LlmInfer::default()
            })
        },
    },
    Preset {
        name: "llama-7b-infer",
        kind: WorkloadKind::LlmInfer,
        description: "LLaMA-2 7B serving in fp16: 32 requests (prompts 128-2048, outputs 64-512), \
                      batch up to 16, KV blocks of 256 tokens",
        build: || WorkloadParams::LlmInfer(LlmInfer::llama_7b()),
    },
    Preset {
        name: "llama-13b-infer",
        kind: WorkloadKind::LlmInfer,
        description: "LLaMA-2 13B serving in fp16: 24 requests, batch up to 8, KV blocks of 256 \
                      tokens",
        build: || WorkloadParams::LlmInfer(LlmInfer::llama_13b()),
    },
    Preset {
        name: "mistral-7b-infer",
        kind: WorkloadKind::LlmInfer,
        description: "Mistral-7B-style serving (grouped-query attention, 8 KV heads) in bf16, \
                      32 requests, batch up to 16",
        build: || WorkloadParams::LlmInfer(LlmInfer::mistral_7b()),
    },
];

/// The built-in presets, the quick defaults of each kind first.
pub fn presets() -> &'static [Preset] {
    PRESETS
}

/// The preset called `name`, if there is one.
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The parameters of a workload, by kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadParams {
    /// A GPT training run.
    GptTrain(GptTrain),
    /// An LLM serving run.
    LlmInfer(LlmInfer),
}

impl WorkloadParams {
    /// The kind.
    pub fn kind(&self) -> WorkloadKind {
        match self {
            WorkloadParams::GptTrain(_) => WorkloadKind::GptTrain,
            WorkloadParams::LlmInfer(_) => WorkloadKind::LlmInfer,
        }
    }

    /// Set one parameter from its text value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), WorkloadError> {
        match self {
            WorkloadParams::GptTrain(p) => p.set(key, value),
            WorkloadParams::LlmInfer(p) => p.set(key, value),
        }
    }

    /// Every parameter as `key=value`, comma-separated, in
    /// [`WorkloadKind::params`] order.
    pub fn to_spec_params(&self) -> String {
        let pairs = match self {
            WorkloadParams::GptTrain(p) => p.values(),
            WorkloadParams::LlmInfer(p) => p.values(),
        };
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Check that the dimensions make sense (e.g. `hidden` divisible by
    /// `heads`).
    pub fn validate(&self) -> Result<(), WorkloadError> {
        match self {
            WorkloadParams::GptTrain(p) => p.validate(),
            WorkloadParams::LlmInfer(p) => p.validate(),
        }
    }

    /// Generate the ops.
    pub fn ops(&self) -> Vec<Op> {
        self.build().ops
    }

    /// A lower bound of the ops, from the parameters alone: a GPT run
    /// allocates each of its `12 layers + 4` parameters once and, at every
    /// step, an AdamW temporary for each; an LLM run allocates `9 layers +
    /// 3` weights and each request's prefill makes at least one op per
    /// layer. Refuses absurd sizes at once, before counting.
    fn min_ops(&self) -> u64 {
        match self {
            WorkloadParams::GptTrain(p) => p
                .layers
                .saturating_mul(12)
                .saturating_add(4)
                .saturating_mul(p.steps.saturating_add(1)),
            WorkloadParams::LlmInfer(p) => p
                .layers
                .saturating_mul(9)
                .saturating_add(3)
                .saturating_add(p.requests.saturating_mul(p.layers.saturating_add(1))),
        }
    }

    /// Generate the ops and what each allocation is for.
    fn build(&self) -> Builder {
        self.build_with(Builder::default())
    }

    fn build_with(&self, b: Builder) -> Builder {
        match self {
            WorkloadParams::GptTrain(p) => p.build_with(b),
            WorkloadParams::LlmInfer(p) => p.build_with(b),
        }
    }

    /// The number of ops [`ops`](Self::ops) generates, counted without
    /// keeping them, or `None` when it is more than `limit` (counting stops
    /// there: the time and memory it takes are bounded by `limit`, whatever
    /// the parameters).
    pub fn count_ops(&self, limit: u64) -> Option<u64> {
        if self.min_ops() > limit {
            return None;
        }
        let b = self.build_with(Builder::counting(limit));
        match b.counting {
            Some(c) if c.ops <= c.limit => Some(c.ops),
            _ => None,
        }
    }
}

/// A workload: a preset and its (possibly overridden) parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The preset it started from.
    pub preset: &'static str,
    /// The parameters.
    pub params: WorkloadParams,
}

impl Workload {
    /// Parse a spec string `PRESET[:key=value,...]` (see the
    /// [module documentation](self)).
    pub fn parse(spec: &str) -> Result<Workload, WorkloadError> {
        let spec = spec.trim();
        let (name, overrides) = match spec.split_once(':') {
            Some((n, o)) => (n.trim(), o),
            None => (spec, ""),
        };
        let preset = preset(name).ok_or_else(|| WorkloadError::UnknownWorkload {
            name: name.to_string(),
        })?;
        let mut params = preset.params();
        for item in overrides.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (key, value) = item.split_once('=').ok_or_else(|| WorkloadError::Syntax {
                item: item.to_string(),
            })?;
            params.set(key.trim(), value.trim())?;
        }
        params.validate()?;
        Ok(Workload {
            preset: preset.name,
            params,
        })
    }

    /// The full spec string: the preset and every parameter
    /// (`Workload::parse(&w.spec()) == w`).
    pub fn spec(&self) -> String {
        format!("{}:{}", self.preset, self.params.to_spec_params())
    }

    /// Check that the trace has at most `limit` ops before generating it
    /// (see [`WorkloadParams::count_ops`]); returns the number of ops.
    /// [`Workload::trace`] itself generates whatever the parameters ask for:
    /// `gpt-train:layers=100000` asks for 100 M ops and 6 GB.
    pub fn check_size(&self, limit: u64) -> Result<u64, WorkloadError> {
        self.params
            .count_ops(limit)
            .ok_or(WorkloadError::TooLarge { limit })
    }

    /// Generate the trace. Its header names the workload ([`Workload::spec`]).
    pub fn trace(&self) -> Trace {
        Trace::from_ops(self.params.ops(), self.header())
    }

    /// Generate the trace and the site of each allocation: what the program
    /// allocates it for ("parameters", "layer forward: attention",
    /// "KV cache", ...), the workload's stand-in for the innermost user
    /// frame of a recorded trace ([`Sites`]), so that `reservoir replay`
    /// groups live memory by it.
    pub fn trace_and_sites(&self) -> (Trace, Sites) {
        let b = self.params.build();
        let mut sites = Sites::new();
        for (id, site) in b.sites.iter().enumerate() {
            sites.name(id as AllocId, site);
            sites.set_hint(id as AllocId, site_hint(site));
        }
        (Trace::from_ops(b.ops, self.header()), sites)
    }

    /// The trace's header: the workload's name and spec.
    fn header(&self) -> Vec<String> {
        vec![
            format!("reservoir workload {}", self.preset),
            format!("spec {}", self.spec()),
        ]
    }
}

/// What the frames of a recorded trace would say of an allocation made
/// at a workload's `site` ([`roles`](crate::replay::roles)): the phase for
/// every site (a module's forward, the autograd engine, `torch/optim`),
/// and the role only where frames name it too (module construction, a
/// data batch, a KV cache). Weight gradients, optimizer state, activations
/// and temporaries are left to the lifetime, as they are in a recording
/// without `AccumulateGrad` frames.
pub fn site_hint(site: &str) -> Hint {
    match site {
        "parameters" | "weights" => Hint::role(Phase::Outside, Role::Parameters),
        "input batch" | "generated tokens" => Hint::role(Phase::Outside, Role::Inputs),
        "KV cache" => Hint::role(Phase::Forward, Role::Inputs),
        "weight gradients"
        | "DDP gradient bucket"
        | "layer backward"
        | "embedding backward"
        | "logits and loss backward" => Hint::phase(Phase::Backward),
        "optimizer state (AdamW)" | "optimizer step" => Hint::phase(Phase::Optimizer),
        "cuBLAS workspace"
        | "embedding forward"
        | "logits and loss"
        | "attention"
        | "prefill activations"
        | "decode activations"
        | "paged attention metadata"
        | "logits and sampling" => Hint::phase(Phase::Forward),
        s if s.starts_with("layer forward") => Hint::phase(Phase::Forward),
        _ => Hint::phase(Phase::Outside),
    }
}

impl std::str::FromStr for Workload {
    type Err = WorkloadError;
    fn from_str(s: &str) -> Result<Workload, WorkloadError> {
        Workload::parse(s)
    }
}

/// Generate the trace of a spec string (shorthand for
/// `Workload::parse(spec)?.trace()`).
pub fn generate(spec: &str) -> Result<Trace, WorkloadError> {
    Ok(Workload::parse(spec)?.trace())
}

/// Why a workload spec is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// No preset has this name.
    #[error("unknown workload {name:?}; known workloads: {}", known_names())]
    UnknownWorkload {
        /// The name given.
        name: String,
    },
    /// An override is not `key=value`.
    #[error("cannot read {item:?}: workload parameters are written key=value, e.g. gpt-train:layers=24,hidden=2048")]
    Syntax {
        /// The offending item.
        item: String,
    },
    /// The kind has no such parameter.
    #[error("{kind} has no parameter {key:?}; its parameters are: {}", param_names(*kind))]
    UnknownParam {
        /// The workload kind.
        kind: WorkloadKind,
        /// The key given.
        key: String,
    },
    /// A value cannot be read.
    #[error("bad value {value:?} for {key}: expected {expected}")]
    BadValue {
        /// The key.
        key: String,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The parameters do not describe a model.
    #[error("invalid workload parameters: {0}")]
    Invalid(String),
    /// The workload has more ops than the limit ([`max_workload_ops`]).
    #[error(
        "the workload has more than {limit} ops, the limit on a built-in workload; raise it \
         with {MAX_WORKLOAD_OPS_ENV}=N (see docs/limits.md)"
    )]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// [`MAX_WORKLOAD_OPS_ENV`] is set to something else than a number.
    #[error("{MAX_WORKLOAD_OPS_ENV}={value:?}: expected a number of ops, e.g. 50000000")]
    BadLimit {
        /// The variable's value.
        value: String,
    },
}

/// The most ops a built-in workload may have unless
/// [`MAX_WORKLOAD_OPS_ENV`] says otherwise: 20 million, six times the
/// largest preset (`llama-13b-infer`, 3.2 M ops); about 1 GiB of trace.
pub const DEFAULT_MAX_WORKLOAD_OPS: u64 = 20_000_000;

/// The environment variable that sets the workload size limit, in ops.
pub const MAX_WORKLOAD_OPS_ENV: &str = "RESERVOIR_MAX_WORKLOAD_OPS";

/// The workload size limit: [`MAX_WORKLOAD_OPS_ENV`] when set, else
/// [`DEFAULT_MAX_WORKLOAD_OPS`].
pub fn max_workload_ops() -> Result<u64, WorkloadError> {
    match std::env::var_os(MAX_WORKLOAD_OPS_ENV) {
        None => Ok(DEFAULT_MAX_WORKLOAD_OPS),
        Some(v) => {
            let text = v.to_string_lossy();
            text.trim()
                .replace('_', "")
                .parse()
                .map_err(|_| WorkloadError::BadLimit {
                    value: text.into_owned(),
                })
        }
    }
}

/// The checks every model workload makes: the named dimensions are at least
/// 1 and `hidden` splits evenly into `heads`.
fn check_dims(positive: &[(&str, u64)], hidden: u64, heads: u64) -> Result<(), WorkloadError> {
    if let Some((k, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(WorkloadError::Invalid(format!("{k} must be at least 1")));
    }
    if hidden % heads != 0 {
        return Err(WorkloadError::Invalid(format!(
            "hidden ({hidden}) must be a multiple of heads ({heads})"
        )));
    }
    Ok(())
}

fn known_names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn param_names(kind: WorkloadKind) -> String {
    kind.params()
        .iter()
        .map(|p| p.key)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Read an integer parameter: digits with an optional `K/M/G` suffix
/// (powers of 1024).
fn parse_u64(key: &str, value: &str) -> Result<u64, WorkloadError> {
    let bad = || WorkloadError::BadValue {
        key: key.to_string(),
        value: value.to_string(),
        expected: "a non-negative integer, optionally with a K/M/G suffix",
    };
    let (digits, shift) = match value.chars().last() {
        Some('k' | 'K') => (&value[..value.len() - 1], 10),
        Some('m' | 'M') => (&value[..value.len() - 1], 20),
        Some('g' | 'G') => (&value[..value.len() - 1], 30),
        _ => (value, 0),
    };
    let v: u64 = digits.replace('_', "").parse().map_err(|_| bad())?;
    v.checked_mul(1 << shift).ok_or_else(bad)
}

fn parse_bool(key: &str, value: &str) -> Result<bool, WorkloadError> {
    match value.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(WorkloadError::BadValue {
            key: key.to_string(),
            value: value.to_string(),
            expected: "a boolean (0/1/true/false/yes/no)",
        }),
    }
}

fn parse_dtype(key: &str, value: &str) -> Result<u64, WorkloadError> {
    let v = match value.to_ascii_lowercase().as_str() {
        "fp32" | "float32" | "float" | "f32" | "4" => 4,
        "fp16" | "float16" | "half" | "f16" | "bf16" | "bfloat16" | "2" => 2,
        "fp8" | "f8" | "int8" | "1" => 1,
        "fp64" | "float64" | "double" | "f64" | "8" => 8,
        _ => {
            return Err(WorkloadError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                expected: "bytes per element (1, 2, 4, 8) or fp32/fp16/bf16/fp8",
            })
        }
    };
    Ok(v)
}

/// Builds the op list: allocation ids in order from 0, allocations on the
/// current stream unless a stream is named, each with the site set last
/// ([`Builder::at`]) or its own ([`Builder::alloc_as`]).
#[derive(Debug, Default)]
struct Builder {
    ops: Vec<Op>,
    next_id: AllocId,
    /// The site of the allocations that follow.
    site: &'static str,
    /// The site of each allocation, indexed by id.
    sites: Vec<&'static str>,
    /// Counting only ([`WorkloadParams::count_ops`]): ops and sites are
    /// counted, not kept, and the generators stop once [`Builder::full`].
    counting: Option<Counting>,
}

/// The state of a counting [`Builder`].
#[derive(Clone, Copy, Debug)]
struct Counting {
    ops: u64,
    limit: u64,
}

impl Builder {
    /// A builder that counts ops up to `limit` instead of keeping them.
    fn counting(limit: u64) -> Builder {
        Builder {
            counting: Some(Counting { ops: 0, limit }),
            ..Builder::default()
        }
    }

    /// True when counting and past the limit: the generators stop their
    /// loops (the count is then only known to exceed the limit).
    fn full(&self) -> bool {
        self.counting.is_some_and(|c| c.ops > c.limit)
    }

    fn push(&mut self, op: Op) {
        match &mut self.counting {
            Some(c) => c.ops += 1,
            None => self.ops.push(op),
        }
    }

    /// The allocations that follow are for `site`.
    fn at(&mut self, site: &'static str) {
        self.site = site;
    }

    /// Allocate `bytes` on the current stream, for the current site.
    fn alloc(&mut self, bytes: u64) -> AllocId {
        self.alloc_as(bytes, self.site)
    }

    /// Allocate `bytes` on the current stream for `site`, leaving the
    /// current site as it is.
    fn alloc_as(&mut self, bytes: u64, site: &'static str) -> AllocId {
        let id = self.next_id;
        self.next_id += 1;
        if self.counting.is_none() {
            debug_assert_eq!(self.sites.len() as AllocId, id);
            self.sites.push(site);
        }
        self.push(Op::Alloc {
            id,
            bytes,
            stream: None,
        });
        id
    }

    fn free(&mut self, id: AllocId) {
        self.push(Op::Free { id });
    }

    fn free_all(&mut self, ids: &mut Vec<AllocId>) {
        for id in ids.drain(..) {
            self.free(id);
        }
    }

    fn record_stream(&mut self, id: AllocId, stream: &StreamName) {
        self.push(Op::RecordStream {
            id,
            stream: stream.clone(),
        });
    }

    fn kernel(&mut self, stream: &StreamName, ids: Vec<AllocId>) {
        self.push(Op::Kernel {
            stream: stream.clone(),
            ids,
        });
    }

    fn wait(&mut self, waiter: &StreamName, waited: &StreamName) {
        self.push(Op::Wait {
            waiter: waiter.clone(),
            waited: waited.clone(),
        });
    }

    fn sync(&mut self) {
        self.push(Op::Sync { stream: None });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap};

    /// Every allocation of every preset has a site, and each kind of
    /// workload names the memory its program holds.
    #[test]
    fn every_allocation_has_a_site() {
        for p in presets() {
            let w = Workload::parse(p.name).unwrap();
            let (trace, sites) = w.trace_and_sites();
            assert_eq!(trace, w.trace(), "{}: the same trace with sites", p.name);
            let mut names = BTreeSet::new();
            for op in &trace.ops {
                if let Op::Alloc { id, .. } = op {
                    let site = sites.site(*id);
                    assert!(
                        !site.is_empty() && !site.starts_with('('),
                        "{}: allocation {id} has no site ({site:?})",
                        p.name
                    );
                    names.insert(site);
                }
            }
            let want: &[&str] = match w.params.kind() {
                WorkloadKind::GptTrain => &[
                    "parameters",
                    "weight gradients",
                    "optimizer state (AdamW)",
                    "layer forward: attention",
                    "layer forward: MLP",
                    "layer backward",
                    "logits and loss",
                ],
                WorkloadKind::LlmInfer => &[
                    "weights",
                    "KV cache",
                    "attention",
                    "prefill activations",
                    "decode activations",
                    "logits and sampling",
                    "generated tokens",
                ],
            };
            for site in want {
                assert!(names.contains(site), "{}: no {site:?} in {names:?}", p.name);
            }
        }
    }

    /// Every free frees a live id, every id is allocated once.
    fn check_balanced(trace: &Trace) -> usize {
        let mut live = HashMap::new();
        for (i, op) in trace.ops.iter().enumerate() {
            match op {
                Op::Alloc { id, bytes, .. } => {
                    assert!(live.insert(*id, *bytes).is_none(), "op {i}: id {id} reused");
                }
                Op::Free { id } => {
                    assert!(live.remove(id).is_some(), "op {i}: free of dead id {id}");
                }
                Op::RecordStream { id, .. } => assert!(live.contains_key(id), "op {i}"),
                _ => {}
            }
        }
        live.len()
    }

    #[test]
    fn every_preset_generates_a_balanced_trace() {
        for p in presets() {
            let mut params = p.params();
            params.validate().unwrap();
            // shrink the big ones so the test stays quick
            match &mut params {
                WorkloadParams::GptTrain(g) => g.steps = 2,
                WorkloadParams::LlmInfer(l) => l.requests = l.requests.min(6),
            }
            let w = Workload {
                preset: p.name,
                params,
            };
            let t = w.trace();
            assert!(t.ops.len() > 50, "{}", p.name);
            check_balanced(&t);
            assert_eq!(Workload::parse(&w.spec()).unwrap(), w, "{}", p.name);
        }
    }

    #[test]
    fn overrides_and_errors() {
        let w = Workload::parse("gpt-train:layers=2, hidden=256,heads=4,dtype=fp32").unwrap();
        match &w.params {
            WorkloadParams::GptTrain(g) => {
                assert_eq!((g.layers, g.hidden, g.heads, g.dtype), (2, 256, 4, 4));
            }
            other => panic!("{other:?}"),
        }
        let e = Workload::parse("gpt-tran").unwrap_err();
        assert!(e.to_string().contains("gpt-train"), "{e}");
        assert!(e.to_string().contains("llama-7b-infer"), "{e}");
        let e = Workload::parse("gpt-train:layer=3").unwrap_err();
        assert!(e.to_string().contains("layers"), "{e}");
        let e = Workload::parse("gpt-train:layers=x").unwrap_err();
        assert!(matches!(e, WorkloadError::BadValue { .. }), "{e}");
        let e = Workload::parse("gpt-train:hidden=100,heads=3").unwrap_err();
        assert!(matches!(e, WorkloadError::Invalid(_)), "{e}");
        let e = Workload::parse("llm-infer:layers").unwrap_err();
        assert!(matches!(e, WorkloadError::Syntax { .. }), "{e}");
        assert_eq!(parse_u64("vocab", "32K").unwrap(), 32768);
    }

    /// `count_ops` counts what `ops` generates, and the lower bound that
    /// refuses at once is one (issue 29, 5).
    #[test]
    fn counting_matches_generation_and_stops_at_the_limit() {
        let mut specs: Vec<String> = presets().iter().map(|p| p.name.to_string()).collect();
        specs.extend(
            [
                "gpt-train:steps=2,layers=1",
                "gpt-train:ddp=1,bucket=1M,steps=2",
                "llm-infer:interval=3,requests=40",
                "llm-infer:block=1,requests=6",
                "llm-infer:requests=3,gen_min=1,gen_max=1",
            ]
            .map(String::from),
        );
        for spec in &specs {
            let w = Workload::parse(spec).unwrap();
            let n = w.params.ops().len() as u64;
            assert_eq!(w.params.count_ops(u64::MAX), Some(n), "{spec}");
            assert_eq!(w.check_size(n).unwrap(), n, "{spec}");
            assert_eq!(w.params.count_ops(n - 1), None, "{spec}");
            assert!(
                matches!(w.check_size(n - 1), Err(WorkloadError::TooLarge { limit }) if limit == n - 1),
                "{spec}"
            );
            assert!(
                w.params.min_ops() <= n,
                "{spec}: {} > {n}",
                w.params.min_ops()
            );
        }
        // absurd sizes are refused without generating them
        for spec in [
            "gpt-train:layers=100000000000",
            "gpt-train:steps=1000000000000",
            "llm-infer:layers=1000000000000,requests=1",
            "gpt-train:layers=100000",
            "llm-infer:requests=2000000",
        ] {
            let w = Workload::parse(spec).unwrap();
            let t = std::time::Instant::now();
            let e = w.check_size(DEFAULT_MAX_WORKLOAD_OPS).unwrap_err();
            assert!(e.to_string().contains("RESERVOIR_MAX_WORKLOAD_OPS"), "{e}");
            assert!(t.elapsed().as_secs() < 30, "{spec}: {:?}", t.elapsed());
        }
    }

    #[test]
    fn gpt_train_keeps_model_state_at_the_end() {
        let t = generate("gpt-train:steps=2").unwrap();
        let live = check_balanced(&t);
        assert!(live > 0);
    }

    #[test]
    fn llm_infer_frees_every_request() {
        let w = Workload::parse("llm-infer:requests=5").unwrap();
        let WorkloadParams::LlmInfer(p) = &w.params else {
            unreachable!()
        };
        let t = w.trace();
        // only the weights (and the workspace) stay live
        assert_eq!(check_balanced(&t) as u64, p.weight_count() + 1);
        let concat = generate("llm-infer-concat:requests=5").unwrap();
        assert_eq!(check_balanced(&concat) as u64, p.weight_count() + 1);
    }
}
