//! GPT-style transformer training (see [`GptTrain`]).

use super::{
    check_dims, parse_bool, parse_dtype, parse_u64, Builder, ParamInfo, WorkloadError, WorkloadKind,
};
use crate::oracle_trace::{AllocId, Op, StreamName};
use reservoir::rng::SplitMix64;

const MIB: u64 = 1 << 20;

/// A GPT-2-style decoder (pre-layer-norm blocks of causal self-attention and
/// a GELU MLP, tied input and output embeddings) trained for a few steps with
/// AdamW, as eager PyTorch allocates it.
///
/// With `T = batch * seq` tokens, `H = hidden`, `A = heads`, `F = ffn`,
/// `V = vocab`, `d = dtype` bytes, the trace is:
///
/// **Once, at the start.** Every parameter is its own allocation, in module
/// order: the token embedding `V*H*d` and position embedding `seq*H*d`, per
/// layer layer-norm weight and bias (`H*d`, small pool), fused QKV weight
/// `H*3H*d` and bias, output projection, second layer norm, MLP up (`H*F*d`)
/// and down (`F*H*d`) weights and biases, then the final layer norm.
///
/// **Every step.**
///
/// 1. `zero_grad(set_to_none=True)`: the previous step's gradients are freed.
/// 2. The batch arrives: token ids and targets (`T*8` bytes each). With
///    `seq_min`, the sequence length (and so `T` and every activation size)
///    is drawn anew for each step, as with dynamic padding.
/// 3. Forward. Embedding lookup and position add (temporaries), embedding
///    dropout (mask kept). Per layer, what autograd saves for backward stays
///    allocated until backward consumes it: the layer-norm outputs (`T*H*d`)
///    and their mean/rstd (`T*4`, small pool), the fused QKV output
///    (`3*T*H*d`), the softmax output (`B*A*S*S*d`), attention-dropout mask
///    (`B*A*S*S` bytes) and dropped probabilities, the merged heads (the
///    output projection's input), the residual stream, the MLP input and GELU
///    output (`T*F*d`) and the dropout masks (`T*H` bytes). Temporaries are
///    freed as soon as the next op has consumed them: raw attention scores
///    and the masked scores (`masked_fill` is out of place), the per-head
///    attention output before the transpose, projection outputs before
///    dropout and the residual add. The cuBLAS workspace (`workspace` bytes)
///    is allocated at the first matrix multiply and never freed, as
///    PyTorch's per-handle workspace is. Then the final layer norm, the
///    logits (`T*V*d`), their fp32 upcast and `log_softmax` (`T*V*4`, kept
///    for backward) and the loss.
/// 4. Backward, in reverse: the loss gradient, the `log_softmax` and
///    upcast gradients (`T*V*4`), the logits gradient, then per layer the
///    gradients of each saved activation (each freed once the next one is
///    computed, with autograd's out-of-place accumulation where the residual
///    stream branches) while the saved tensors are freed as they are used.
///    Weight gradients are allocated as they are produced and live until the
///    next `zero_grad`; the tied embedding's two gradients are summed into a
///    new tensor. With `ddp`, gradients are copied into flat buckets of
///    about `bucket` bytes as they become ready; each bucket is all-reduced
///    on the `comm` stream (`wait_stream`, kernel, `record_stream`) and
///    freed at once, so its block waits for the communication stream; the
///    default stream waits for `comm` before the optimizer.
/// 5. With `clip`, `clip_grad_norm_` (foreach): one norm per gradient (small
///    tensors), their stack, the total norm and the clip coefficients.
/// 6. AdamW (`foreach`, PyTorch 2's default on CUDA): on the first step only,
///    `exp_avg` and `exp_avg_sq` for every parameter (`zeros_like`, same
///    dtype); every step, `_foreach_sqrt(exp_avg_sq)` allocates one
///    temporary per parameter, freed at the end of the step; the other
///    updates are in place.
/// 7. `loss.item()`: a device synchronization, then the batch, the loss and
///    the total norm are freed.
///
/// The parameters, optimizer state, last gradients and workspace are still
/// allocated at the end of the trace, as in a program that goes on training.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GptTrain {
    /// Transformer blocks. Key `layers`.
    pub layers: u64,
    /// Model width. Key `hidden`.
    pub hidden: u64,
    /// Attention heads (`hidden` must be a multiple). Key `heads`.
    pub heads: u64,
    /// Sequence length (the longest, with `seq_min`). Key `seq`.
    pub seq: u64,
    /// With `0 < seq_min < seq`, each step's batch is padded to a length
    /// drawn uniformly in `seq_min..=seq` and rounded up to a multiple of 8
    /// (fine-tuning with dynamic padding); 0: every step uses `seq`.
    /// Key `seq_min`.
    pub seq_min: u64,
    /// Sequences per step. Key `batch`.
    pub batch: u64,
    /// Vocabulary size. Key `vocab`.
    pub vocab: u64,
    /// Bytes per element of parameters, activations, gradients and optimizer
    /// state (2 for bf16/fp16, 4 for fp32). Key `dtype`.
    pub dtype: u64,
    /// MLP width; 0 means `4 * hidden`. Key `ffn`.
    pub ffn: u64,
    /// Optimizer steps. Key `steps`.
    pub steps: u64,
    /// Dropout on embeddings, attention probabilities and residual branches
    /// (masks saved for backward). Key `dropout`.
    pub dropout: bool,
    /// Gradient-norm clipping before the optimizer step. Key `clip`.
    pub clip: bool,
    /// DDP-style gradient buckets all-reduced on a `comm` stream. Key `ddp`.
    pub ddp: bool,
    /// Bucket size for `ddp`, bytes. Key `bucket` (default 25M).
    pub bucket: u64,
    /// cuBLAS workspace, bytes (0: none). Key `workspace` (default 32M, the
    /// CUDA 12 default `:4096:8` on Hopper).
    pub workspace: u64,
    /// Seed of the per-step sequence lengths (`seq_min`). Key `seed`.
    pub seed: u64,
}

impl Default for GptTrain {
    /// The `gpt-train` preset: small enough that a replay takes milliseconds,
    /// big enough to use both pools.
    fn default() -> Self {
        GptTrain {
            layers: 4,
            hidden: 512,
            heads: 8,
            seq: 256,
            seq_min: 64,
            batch: 8,
            vocab: 8192,
            dtype: 4,
            ffn: 0,
            steps: 5,
            dropout: true,
            clip: true,
            ddp: false,
            bucket: 25 * MIB,
            workspace: 32 * MIB,
            seed: 1,
        }
    }
}

impl GptTrain {
    /// The parameter keys.
    pub const PARAMS: &'static [ParamInfo] = &[
        ParamInfo {
            key: "layers",
            help: "transformer blocks",
        },
        ParamInfo {
            key: "hidden",
            help: "model width",
        },
        ParamInfo {
            key: "heads",
            help: "attention heads (hidden must be a multiple)",
        },
        ParamInfo {
            key: "seq",
            help: "sequence length (the longest, with seq_min)",
        },
        ParamInfo {
            key: "seq_min",
            help: "shortest padded length per step (0 = always seq)",
        },
        ParamInfo {
            key: "batch",
            help: "sequences per step",
        },
        ParamInfo {
            key: "vocab",
            help: "vocabulary size",
        },
        ParamInfo {
            key: "dtype",
            help: "bytes per element (or fp32/bf16/fp16/fp8)",
        },
        ParamInfo {
            key: "ffn",
            help: "MLP width (0 = 4 * hidden)",
        },
        ParamInfo {
            key: "steps",
            help: "optimizer steps",
        },
        ParamInfo {
            key: "dropout",
            help: "dropout layers (masks kept for backward)",
        },
        ParamInfo {
            key: "clip",
            help: "clip_grad_norm_ before each step",
        },
        ParamInfo {
            key: "ddp",
            help: "DDP gradient buckets all-reduced on a comm stream",
        },
        ParamInfo {
            key: "bucket",
            help: "DDP bucket size in bytes",
        },
        ParamInfo {
            key: "workspace",
            help: "cuBLAS workspace in bytes (0 = none)",
        },
        ParamInfo {
            key: "seed",
            help: "seed of the per-step lengths",
        },
    ];

    /// GPT-2 small (124M parameters), bf16, seq 1024, batch 8.
    pub fn gpt2_small() -> GptTrain {
        GptTrain {
            layers: 12,
            hidden: 768,
            heads: 12,
            seq: 1024,
            seq_min: 0,
            batch: 8,
            vocab: 50257,
            dtype: 2,
            steps: 3,
            ..GptTrain::default()
        }
    }

    /// GPT-2 medium (350M parameters), bf16, seq 1024, batch 8.
    pub fn gpt2_medium() -> GptTrain {
        GptTrain {
            layers: 24,
            hidden: 1024,
            heads: 16,
            ..GptTrain::gpt2_small()
        }
    }

    /// A GPT-3 XL-sized model (1.3B parameters), bf16, seq 2048, batch 4,
    /// no dropout.
    pub fn gpt_1_3b() -> GptTrain {
        GptTrain {
            layers: 24,
            hidden: 2048,
            heads: 16,
            seq: 2048,
            batch: 4,
            dropout: false,
            ..GptTrain::gpt2_small()
        }
    }

    /// The MLP width in force.
    pub fn ffn_width(&self) -> u64 {
        if self.ffn == 0 {
            4 * self.hidden
        } else {
            self.ffn
        }
    }

    /// The padded sequence length of the next step.
    fn step_seq(&self, rng: &mut SplitMix64) -> u64 {
        if self.seq_min == 0 || self.seq_min >= self.seq {
            return self.seq;
        }
        let s = rng.range(self.seq_min, self.seq);
        s.div_ceil(8).saturating_mul(8).min(self.seq)
    }

    /// GPT-2 medium fine-tuned with dynamic padding: sequences of 128 to
    /// 1024 tokens, 6 steps.
    pub fn gpt2_medium_finetune() -> GptTrain {
        GptTrain {
            seq_min: 128,
            steps: 6,
            ..GptTrain::gpt2_medium()
        }
    }

    /// The number of parameter tensors (allocations made once at the start).
    pub fn param_count(&self) -> u64 {
        12 * self.layers + 4
    }

    /// Set one parameter from its text value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), WorkloadError> {
        match key {
            "layers" => self.layers = parse_u64(key, value)?,
            "hidden" => self.hidden = parse_u64(key, value)?,
            "heads" => self.heads = parse_u64(key, value)?,
            "seq" => self.seq = parse_u64(key, value)?,
            "seq_min" => self.seq_min = parse_u64(key, value)?,
            "batch" => self.batch = parse_u64(key, value)?,
            "vocab" => self.vocab = parse_u64(key, value)?,
            "dtype" => self.dtype = parse_dtype(key, value)?,
            "ffn" => self.ffn = parse_u64(key, value)?,
            "steps" => self.steps = parse_u64(key, value)?,
            "dropout" => self.dropout = parse_bool(key, value)?,
            "clip" => self.clip = parse_bool(key, value)?,
            "ddp" => self.ddp = parse_bool(key, value)?,
            "bucket" => self.bucket = parse_u64(key, value)?,
            "workspace" => self.workspace = parse_u64(key, value)?,
            "seed" => self.seed = parse_u64(key, value)?,
            _ => {
                return Err(WorkloadError::UnknownParam {
                    kind: WorkloadKind::GptTrain,
                    key: key.to_string(),
                })
            }
        }
        Ok(())
    }

    /// Every parameter and its value, in [`GptTrain::PARAMS`] order.
    pub fn values(&self) -> Vec<(&'static str, String)> {
        let b = |x: bool| if x { "1" } else { "0" }.to_string();
        vec![
            ("layers", self.layers.to_string()),
            ("hidden", self.hidden.to_string()),
            ("heads", self.heads.to_string()),
            ("seq", self.seq.to_string()),
            ("seq_min", self.seq_min.to_string()),
            ("batch", self.batch.to_string()),
            ("vocab", self.vocab.to_string()),
            ("dtype", self.dtype.to_string()),
            ("ffn", self.ffn.to_string()),
            ("steps", self.steps.to_string()),
            ("dropout", b(self.dropout)),
            ("clip", b(self.clip)),
            ("ddp", b(self.ddp)),
            ("bucket", self.bucket.to_string()),
            ("workspace", self.workspace.to_string()),
            ("seed", self.seed.to_string()),
        ]
    }

    /// Check the dimensions.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let positive = [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("seq", self.seq),
            ("batch", self.batch),
            ("vocab", self.vocab),
            ("steps", self.steps),
        ];
        check_dims(&positive, self.hidden, self.heads)?;
        if self.ddp && self.bucket == 0 {
            return Err(WorkloadError::Invalid(
                "bucket must be positive with ddp".into(),
            ));
        }
        // The largest tensor (attention scores or logits) must fit in 64 bits
        // with a wide margin.
        let scores =
            (self.batch as u128) * self.heads as u128 * self.seq as u128 * self.seq as u128 * 8;
        let logits = (self.batch as u128) * self.seq as u128 * self.vocab as u128 * 8;
        let ffn = (self.batch as u128) * self.seq as u128 * self.ffn_width() as u128 * 8;
        if scores.max(logits).max(ffn) > (1u128 << 50) {
            return Err(WorkloadError::Invalid(
                "the model's tensors would exceed 1 PiB".into(),
            ));
        }
        Ok(())
    }

    /// Generate the ops.
    pub fn ops(&self) -> Vec<Op> {
        self.build_with(Builder::default()).ops
    }

    /// Generate the ops and the site of each allocation.
    pub(super) fn build_with(&self, b: Builder) -> Builder {
        Gen::new(self, b).run()
    }
}

/// One parameter: its allocation, element count and current gradient.
struct Param {
    numel: u64,
    grad: Option<AllocId>,
    exp_avg: Option<(AllocId, AllocId)>,
}

/// Indices of one layer's parameters in `Gen::params`.
#[derive(Clone, Copy)]
struct LayerParams {
    ln1_w: usize,
    ln1_b: usize,
    qkv_w: usize,
    qkv_b: usize,
    proj_w: usize,
    proj_b: usize,
    ln2_w: usize,
    ln2_b: usize,
    fc_w: usize,
    fc_b: usize,
    fc2_w: usize,
    fc2_b: usize,
}

/// What the backward of the final layer norm, logits and loss needs.
struct Head {
    /// The final layer norm's output.
    lnf: AllocId,
    /// Its mean and rstd.
    lnf_stats: [AllocId; 2],
    /// The log-probabilities.
    logp: AllocId,
    /// The loss, freed after `loss.item()`.
    loss: AllocId,
}

/// What one layer's forward leaves for its backward.
struct Saved {
    /// The layer input (owned by the previous layer's output or the embedding).
    x: AllocId,
    ln1: AllocId,
    ln1_stats: [AllocId; 2],
    qkv: AllocId,
    probs: AllocId,
    attn_mask: Option<AllocId>,
    probs_drop: Option<AllocId>,
    ctx: AllocId,
    proj_mask: Option<AllocId>,
    x1: AllocId,
    ln2: AllocId,
    ln2_stats: [AllocId; 2],
    fc: AllocId,
    act: AllocId,
    fc2_mask: Option<AllocId>,
}

struct Gen<'a> {
    w: &'a GptTrain,
    b: Builder,
    params: Vec<Param>,
    layers: Vec<LayerParams>,
    wte: usize,
    wpe: usize,
    lnf_w: usize,
    lnf_b: usize,
    workspace_done: bool,
    comm: StreamName,
    default_stream: StreamName,
    bucket_bytes: u64,
    /// This step's (padded) sequence length.
    seq: u64,
}

impl<'a> Gen<'a> {
    fn new(w: &'a GptTrain, b: Builder) -> Self {
        Gen {
            w,
            b,
            params: Vec::new(),
            layers: Vec::new(),
            wte: 0,
            wpe: 0,
            lnf_w: 0,
            lnf_b: 0,
            workspace_done: false,
            comm: StreamName::new("comm"),
            default_stream: StreamName::default_stream(),
            bucket_bytes: 0,
            seq: w.seq,
        }
    }

    fn d(&self) -> u64 {
        self.w.dtype
    }

    fn param(&mut self, numel: u64) -> usize {
        self.b.alloc_as(numel * self.w.dtype, "parameters");
        self.params.push(Param {
            numel,
            grad: None,
            exp_avg: None,
        });
        self.params.len() - 1
    }

    /// A matrix multiply: the first one allocates the cuBLAS workspace.
    fn matmul(&mut self) {
        if !self.workspace_done {
            self.workspace_done = true;
            if self.w.workspace > 0 {
                self.b.alloc_as(self.w.workspace, "cuBLAS workspace");
            }
        }
    }

    /// A weight gradient produced by backward (kept until `zero_grad`).
    fn grad(&mut self, p: usize) {
        let bytes = self.params[p].numel * self.d();
        let id = self.b.alloc_as(bytes, "weight gradients");
        debug_assert!(self.params[p].grad.is_none());
        self.params[p].grad = Some(id);
        if self.w.ddp {
            self.bucket_bytes += bytes;
            if self.bucket_bytes >= self.w.bucket {
                self.flush_bucket();
            }
        }
    }

    /// All-reduce the ready gradients: a flat staging buffer used by the
    /// communication stream.
    fn flush_bucket(&mut self) {
        if self.bucket_bytes == 0 {
            return;
        }
        let bucket = self.b.alloc_as(self.bucket_bytes, "DDP gradient bucket");
        self.bucket_bytes = 0;
        let (comm, def) = (self.comm.clone(), self.default_stream.clone());
        self.b.wait(&comm, &def);
        self.b.kernel(&comm, vec![bucket]);
        self.b.record_stream(bucket, &comm);
        self.b.free(bucket);
    }

    fn run(mut self) -> Builder {
        let w = self.w;
        let (h, f, v, s) = (w.hidden, w.ffn_width(), w.vocab, w.seq);
        self.wte = self.param(v * h);
        self.wpe = self.param(s * h);
        for _ in 0..w.layers {
            if self.b.full() {
                return self.b;
            }
            let lp = LayerParams {
                ln1_w: self.param(h),
                ln1_b: self.param(h),
                qkv_w: self.param(h * 3 * h),
                qkv_b: self.param(3 * h),
                proj_w: self.param(h * h),
                proj_b: self.param(h),
                ln2_w: self.param(h),
                ln2_b: self.param(h),
                fc_w: self.param(h * f),
                fc_b: self.param(f),
                fc2_w: self.param(f * h),
                fc2_b: self.param(h),
            };
            self.layers.push(lp);
        }
        self.lnf_w = self.param(h);
        self.lnf_b = self.param(h);
        let mut rng = SplitMix64::new(w.seed);
        for step in 0..w.steps {
            if self.b.full() {
                break;
            }
            self.seq = w.step_seq(&mut rng);
            self.step(step == 0);
        }
        self.b
    }

    /// One training step: zero_grad, forward, backward, gradient clipping,
    /// AdamW, `loss.item()`.
    fn step(&mut self, first: bool) {
        let t = self.w.batch * self.seq;
        // 1. zero_grad(set_to_none=True)
        for i in 0..self.params.len() {
            if let Some(g) = self.params[i].grad.take() {
                self.b.free(g);
            }
        }
        // 2. the batch
        self.b.at("input batch");
        let idx = self.b.alloc(t * 8);
        let targets = self.b.alloc(t * 8);
        // 3. forward
        let (mut x, emb_mask) = self.embedding_forward();
        let mut saved = Vec::with_capacity(self.layers.len());
        for _ in 0..self.layers.len() {
            if self.b.full() {
                break;
            }
            let (sv, out) = self.layer_forward(x);
            x = out;
            saved.push(sv);
        }
        let head = self.head_forward();
        // 4. backward
        let mut g = self.head_backward(&head, x);
        for (l, sv) in saved.into_iter().enumerate().rev() {
            g = self.layer_backward(l, sv, g);
        }
        self.embedding_backward(g, emb_mask);
        // 5. clip_grad_norm_ (foreach)
        let total_norm = self.clip_grad_norm();
        // 6. AdamW (foreach)
        self.adamw(first);
        // 7. loss.item()
        self.b.sync();
        self.b.free(idx);
        self.b.free(targets);
        self.b.free(head.loss);
        if let Some(t) = total_norm {
            self.b.free(t);
        }
    }

    /// The embeddings' forward: the first layer's input, and the dropout
    /// mask when there is one.
    fn embedding_forward(&mut self) -> (AllocId, Option<AllocId>) {
        let w = self.w;
        let d = self.d();
        let t = w.batch * self.seq;
        let e = t * w.hidden * d;
        self.b.at("embedding forward");
        let tok = self.b.alloc(e);
        let pos = self.b.alloc(self.seq * w.hidden * d);
        let x0 = self.b.alloc(e);
        self.b.free(tok);
        self.b.free(pos);
        if w.dropout {
            let mask = self.b.alloc(t * w.hidden);
            let xd = self.b.alloc(e);
            self.b.free(x0);
            (xd, Some(mask))
        } else {
            (x0, None)
        }
    }

    /// Final layer norm, logits and loss: what their backward needs.
    fn head_forward(&mut self) -> Head {
        let w = self.w;
        let d = self.d();
        let t = w.batch * self.seq;
        let e = t * w.hidden * d;
        self.b.at("logits and loss");
        let lnf = self.b.alloc(e);
        let lnf_stats = [self.b.alloc(t * 4), self.b.alloc(t * 4)];
        self.matmul();
        let logits = self.b.alloc(t * w.vocab * d);
        let logits32 = self.b.alloc(t * w.vocab * 4);
        self.b.free(logits);
        let logp = self.b.alloc(t * w.vocab * 4);
        self.b.free(logits32);
        let loss = self.b.alloc(4);
        Head {
            lnf,
            lnf_stats,
            logp,
            loss,
        }
    }

    /// Backward through the loss, logits and final layer norm, whose input
    /// was `x` (the last layer's output): the gradient of `x`.
    fn head_backward(&mut self, head: &Head, x: AllocId) -> AllocId {
        let w = self.w;
        let d = self.d();
        let t = w.batch * self.seq;
        let e = t * w.hidden * d;
        self.b.at("logits and loss backward");
        let gloss = self.b.alloc(4);
        let glogp = self.b.alloc(t * w.vocab * 4);
        self.b.free(gloss);
        let glogits32 = self.b.alloc(t * w.vocab * 4);
        self.b.free(glogp);
        self.b.free(head.logp);
        let glogits = self.b.alloc(t * w.vocab * d);
        self.b.free(glogits32);
        let glnf = self.b.alloc(e);
        self.grad(self.wte);
        self.b.free(glogits);
        self.b.free(head.lnf);
        let g = self.b.alloc(e);
        self.grad(self.lnf_w);
        self.grad(self.lnf_b);
        self.b.free(glnf);
        for id in head.lnf_stats {
            self.b.free(id);
        }
        // `x` is the last layer's output, saved by the final layer norm
        self.b.free(x);
        g
    }

    /// The embeddings' backward from the first layer's input gradient `g`
    /// (through the dropout `emb_mask` when there is one), and the last
    /// gradient bucket.
    fn embedding_backward(&mut self, g: AllocId, emb_mask: Option<AllocId>) {
        let w = self.w;
        let d = self.d();
        let e = w.batch * self.seq * w.hidden * d;
        self.b.at("embedding backward");
        let g_emb = if let Some(mask) = emb_mask {
            let gd = self.b.alloc(e);
            self.b.free(mask);
            self.b.free(g);
            gd
        } else {
            g
        };
        self.grad(self.wpe);
        // the tied embedding: its lookup gradient is summed with the LM-head
        // gradient into a new tensor
        let wte_bytes = self.params[self.wte].numel * d;
        let gemb = self.b.alloc(wte_bytes);
        self.b.free(g_emb);
        let sum = self.b.alloc(wte_bytes);
        if let Some(old) = self.params[self.wte].grad.replace(sum) {
            self.b.free(old);
        }
        self.b.free(gemb);
        if w.ddp {
            // the tied embedding's summed gradient goes into the last bucket
            self.bucket_bytes += wte_bytes;
            self.flush_bucket();
            let (comm, def) = (self.comm.clone(), self.default_stream.clone());
            self.b.wait(&def, &comm);
        }
    }

    /// `clip_grad_norm_` (foreach), when the workload clips: the total norm,
    /// freed after `loss.item()`.
    fn clip_grad_norm(&mut self) -> Option<AllocId> {
        let d = self.d();
        self.b.at("gradient clipping");
        if !self.w.clip {
            return None;
        }
        let mut norms: Vec<AllocId> = (0..self.params.len()).map(|_| self.b.alloc(d)).collect();
        let stacked = self.b.alloc(self.params.len() as u64 * d);
        let total = self.b.alloc(d);
        self.b.free(stacked);
        let t1 = self.b.alloc(d);
        let coef = self.b.alloc(d);
        self.b.free(t1);
        let clamped = self.b.alloc(d);
        self.b.free(coef);
        self.b.free(clamped);
        self.b.free_all(&mut norms);
        Some(total)
    }

    /// AdamW (foreach): its state allocated at the `first` step, then the
    /// step's temporaries.
    fn adamw(&mut self, first: bool) {
        let d = self.d();
        if first {
            for i in 0..self.params.len() {
                let bytes = self.params[i].numel * d;
                let m = self.b.alloc_as(bytes, "optimizer state (AdamW)");
                let v2 = self.b.alloc_as(bytes, "optimizer state (AdamW)");
                self.params[i].exp_avg = Some((m, v2));
            }
        }
        debug_assert!(self.params.iter().all(|p| p.exp_avg.is_some()));
        self.b.at("optimizer step");
        let mut sqrt: Vec<AllocId> = (0..self.params.len())
            .map(|i| self.b.alloc(self.params[i].numel * d))
            .collect();
        self.b.free_all(&mut sqrt);
    }

    /// Forward through one layer whose input is `x`: what backward needs, and
    /// the layer's output.
    fn layer_forward(&mut self, x: AllocId) -> (Saved, AllocId) {
        let w = self.w;
        let d = self.d();
        let t = w.batch * self.seq;
        let e = t * w.hidden * d;
        let sc = w.batch * w.heads * self.seq * self.seq;
        let ff = t * w.ffn_width() * d;
        self.b.at("layer forward: attention");
        let ln1 = self.b.alloc(e);
        let ln1_stats = [self.b.alloc(t * 4), self.b.alloc(t * 4)];
        self.matmul();
        let qkv = self.b.alloc(3 * e);
        let scores = self.b.alloc(sc * d);
        let masked = self.b.alloc(sc * d);
        self.b.free(scores);
        let probs = self.b.alloc(sc * d);
        self.b.free(masked);
        let (attn_mask, probs_drop) = if w.dropout {
            (Some(self.b.alloc(sc)), Some(self.b.alloc(sc * d)))
        } else {
            (None, None)
        };
        let ctx_heads = self.b.alloc(e);
        let ctx = self.b.alloc(e);
        self.b.free(ctx_heads);
        let proj = self.b.alloc(e);
        let (proj_mask, proj_out) = if w.dropout {
            let m = self.b.alloc(t * w.hidden);
            let pd = self.b.alloc(e);
            self.b.free(proj);
            (Some(m), pd)
        } else {
            (None, proj)
        };
        let x1 = self.b.alloc(e);
        self.b.free(proj_out);
        self.b.at("layer forward: MLP");
        let ln2 = self.b.alloc(e);
        let ln2_stats = [self.b.alloc(t * 4), self.b.alloc(t * 4)];
        let fc = self.b.alloc(ff);
        let act = self.b.alloc(ff);
        let fc2 = self.b.alloc(e);
        let (fc2_mask, fc2_out) = if w.dropout {
            let m = self.b.alloc(t * w.hidden);
            let fd = self.b.alloc(e);
            self.b.free(fc2);
            (Some(m), fd)
        } else {
            (None, fc2)
        };
        let x2 = self.b.alloc(e);
        self.b.free(fc2_out);
        let saved = Saved {
            x,
            ln1,
            ln1_stats,
            qkv,
            probs,
            attn_mask,
            probs_drop,
            ctx,
            proj_mask,
            x1,
            ln2,
            ln2_stats,
            fc,
            act,
            fc2_mask,
        };
        (saved, x2)
    }

    /// Backward through layer `l`; `g` is the gradient of its output (freed
    /// here). Returns the gradient of its input.
    fn layer_backward(&mut self, l: usize, sv: Saved, g: AllocId) -> AllocId {
        let w = self.w;
        let lp = self.layers[l];
        let d = self.d();
        let t = w.batch * self.seq;
        let e = t * w.hidden * d;
        let sc = w.batch * w.heads * self.seq * self.seq * d;
        let ff = t * w.ffn_width() * d;
        self.b.at("layer backward");
        // MLP down projection (after its dropout)
        let gfd = match sv.fc2_mask {
            Some(m) => {
                let gd = self.b.alloc(e);
                self.b.free(m);
                Some(gd)
            }
            None => None,
        };
        let gact = self.b.alloc(ff);
        self.grad(lp.fc2_w);
        self.grad(lp.fc2_b);
        self.b.free(sv.act);
        if let Some(gd) = gfd {
            self.b.free(gd);
        }
        // GELU
        let gfc = self.b.alloc(ff);
        self.b.free(gact);
        self.b.free(sv.fc);
        // MLP up projection
        let gln2 = self.b.alloc(e);
        self.grad(lp.fc_w);
        self.grad(lp.fc_b);
        self.b.free(gfc);
        self.b.free(sv.ln2);
        // second layer norm
        let gx1p = self.b.alloc(e);
        self.grad(lp.ln2_w);
        self.grad(lp.ln2_b);
        self.b.free(gln2);
        for id in sv.ln2_stats {
            self.b.free(id);
        }
        self.b.free(sv.x1);
        // residual branch: autograd sums the two gradients of x1
        let g1 = self.b.alloc(e);
        self.b.free(g);
        self.b.free(gx1p);
        // output projection (after its dropout)
        let gpd = match sv.proj_mask {
            Some(m) => {
                let gd = self.b.alloc(e);
                self.b.free(m);
                Some(gd)
            }
            None => None,
        };
        let gctx = self.b.alloc(e);
        self.grad(lp.proj_w);
        self.grad(lp.proj_b);
        self.b.free(sv.ctx);
        if let Some(gd) = gpd {
            self.b.free(gd);
        }
        let gctx_heads = self.b.alloc(e);
        self.b.free(gctx);
        // probs @ v
        let gpdrop = self.b.alloc(sc);
        let gv = self.b.alloc(e);
        self.b.free(gctx_heads);
        if let Some(pd) = sv.probs_drop {
            self.b.free(pd);
        }
        let gprobs = match sv.attn_mask {
            Some(m) => {
                let gp = self.b.alloc(sc);
                self.b.free(gpdrop);
                self.b.free(m);
                gp
            }
            None => gpdrop,
        };
        // softmax, masked_fill
        let gmasked = self.b.alloc(sc);
        self.b.free(gprobs);
        self.b.free(sv.probs);
        let gscores = self.b.alloc(sc);
        self.b.free(gmasked);
        // q @ k^T
        let gq = self.b.alloc(e);
        let gk = self.b.alloc(e);
        self.b.free(gscores);
        let gqkv = self.b.alloc(3 * e);
        self.b.free(gq);
        self.b.free(gk);
        self.b.free(gv);
        self.b.free(sv.qkv);
        // QKV projection
        let gln1 = self.b.alloc(e);
        self.grad(lp.qkv_w);
        self.grad(lp.qkv_b);
        self.b.free(gqkv);
        self.b.free(sv.ln1);
        // first layer norm
        let gxp = self.b.alloc(e);
        self.grad(lp.ln1_w);
        self.grad(lp.ln1_b);
        self.b.free(gln1);
        for id in sv.ln1_stats {
            self.b.free(id);
        }
        // the layer input was saved by the first layer norm (the embedding
        // output for layer 0, else the previous layer's output)
        self.b.free(sv.x);
        // residual branch again
        let g0 = self.b.alloc(e);
        self.b.free(g1);
        self.b.free(gxp);
        g0
    }
}
