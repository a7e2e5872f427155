//! LLM inference with a growing KV cache (see [`LlmInfer`]).

use super::{
    check_dims, parse_bool, parse_dtype, parse_u64, Builder, ParamInfo, WorkloadError, WorkloadKind,
};
use crate::oracle_trace::{AllocId, Op};
use reservoir::rng::SplitMix64;

const MIB: u64 = 1 << 20;

/// Split-K partition length of the decode attention kernel (vLLM's paged
/// attention v2 splits sequences longer than this).
const PARTITION: u64 = 512;

/// The site of the attention kernels' allocations (scores, softmax,
/// outputs and partial sums).
const ATTENTION: &str = "attention";

/// The site of the key/value cache's blocks (or contiguous tensors).
const KV_CACHE: &str = "KV cache";

/// A LLaMA-style decoder (RMSNorm, rotary embeddings, grouped-query
/// attention, SwiGLU MLP, untied output head) serving a stream of requests
/// with continuous batching, as an eager PyTorch serving loop allocates it.
///
/// With `H = hidden`, `KV = kv_heads * hidden / heads`, `F = ffn`,
/// `V = vocab`, `d = dtype` bytes and `n` tokens in a forward pass:
///
/// **Once, at the start.** The weights, one allocation each: embedding
/// `V*H*d`; per layer the input norm (`H*d`, small pool), the Q, K, V and
/// output projections (`H*H*d`, `H*KV*d`), the post-attention norm, the gate,
/// up and down projections (`H*F*d`); the final norm and the output head.
/// The cuBLAS workspace is allocated at the first matrix multiply and kept.
///
/// **Requests.** `requests` requests, with prompt lengths drawn log-uniformly
/// in `prompt_min..=prompt_max` and output lengths uniformly in
/// `gen_min..=gen_max`, arrive on average every `interval` decode steps
/// (`seed` fixes the draws). At every step, waiting requests that have
/// arrived are admitted while fewer than `max_batch` run; each admitted
/// request gets an output-token buffer and is prefilled on its own (one
/// forward over its prompt, which also samples its first token). Then one
/// decode forward runs over all running requests, one token each. A request
/// that has produced all its tokens frees its KV cache and output buffer.
///
/// **A forward over `n` tokens.** Input ids and positions (`n*8`, small),
/// the embedding output, the rotary cos/sin tables (kept for the whole
/// forward); per layer: RMSNorm computed in fp32 as Hugging Face does
/// (upcast, square, mean, rsqrt, scale, downcast, weight: a burst of
/// `n*H*4` and `n*4` temporaries), the Q, K, V projections, rotary outputs,
/// the KV-cache update, attention, the head transpose and output projection,
/// the residual add (a new tensor, the old residual freed), the second norm,
/// gate, up, SiLU and product (`n*F*d` each, freed as soon as used), down
/// projection, residual add. Then the final norm, the last token's logits
/// (`V*d` per request), their fp32 upcast, temperature scaling, softmax and
/// sampled ids.
///
/// **KV cache.** With `block > 0` (paged, vLLM-style) the cache of each
/// request and layer is a list of blocks of `block` tokens, one allocation
/// for keys and one for values (`block*KV*d` each); a block is added when the
/// last one is full; each decode step also builds small block-table,
/// slot-mapping and length tensors. With `block = 0` (Hugging Face
/// `DynamicCache`-style) the cache of a request and layer is one key and one
/// value tensor, re-allocated one token larger at every decode step
/// (`torch.cat`: allocate the new, free the old), the worst case for
/// fragmentation.
///
/// **Attention.** Prefill is eager when `flash = 0`: `heads*n*n*d` scores,
/// the causal-masked copy, the fp32 softmax and its downcast, and with
/// grouped-query attention the keys and values repeated to all heads; with
/// `flash = 1` a fused kernel writes the output and a `heads*n*4`
/// log-sum-exp. Decode with a paged cache reads the blocks in place (paged
/// attention) and, for sequences over 512 tokens, allocates split-K
/// partials; decode with a contiguous cache is eager over the batch padded to
/// its longest sequence.
///
/// Only the weights and the workspace are allocated at the end of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LlmInfer {
    /// Decoder layers. Key `layers`.
    pub layers: u64,
    /// Model width. Key `hidden`.
    pub hidden: u64,
    /// Query heads (`hidden` must be a multiple). Key `heads`.
    pub heads: u64,
    /// Key/value heads (grouped-query attention); 0 means `heads`.
    /// Key `kv_heads`.
    pub kv_heads: u64,
    /// MLP width. Key `ffn`.
    pub ffn: u64,
    /// Vocabulary size. Key `vocab`.
    pub vocab: u64,
    /// Bytes per element of weights, activations and cache. Key `dtype`.
    pub dtype: u64,
    /// Tokens per KV-cache block; 0: one contiguous tensor per request and
    /// layer, re-allocated every step. Key `block`.
    pub block: u64,
    /// Most requests decoded together. Key `max_batch`.
    pub max_batch: u64,
    /// Requests served. Key `requests`.
    pub requests: u64,
    /// Shortest prompt, tokens. Key `prompt_min`.
    pub prompt_min: u64,
    /// Longest prompt, tokens. Key `prompt_max`.
    pub prompt_max: u64,
    /// Fewest tokens generated per request (at least 1). Key `gen_min`.
    pub gen_min: u64,
    /// Most tokens generated per request. Key `gen_max`.
    pub gen_max: u64,
    /// Mean decode steps between arrivals (0: all requests arrive at once).
    /// Key `interval`.
    pub interval: u64,
    /// Fused (flash) attention for prefill instead of eager. Key `flash`.
    pub flash: bool,
    /// Seed of the request draws. Key `seed`.
    pub seed: u64,
    /// cuBLAS workspace, bytes (0: none). Key `workspace`.
    pub workspace: u64,
}

impl Default for LlmInfer {
    /// The `llm-infer` preset: a small model, quick to replay, using both
    /// pools (64 KiB cache blocks, MiB-sized prefill activations).
    fn default() -> Self {
        LlmInfer {
            layers: 4,
            hidden: 512,
            heads: 8,
            kv_heads: 0,
            ffn: 1536,
            vocab: 8192,
            dtype: 2,
            block: 64,
            max_batch: 8,
            requests: 24,
            prompt_min: 16,
            prompt_max: 512,
            gen_min: 8,
            gen_max: 128,
            interval: 2,
            flash: false,
            seed: 1,
            workspace: 32 * MIB,
        }
    }
}

impl LlmInfer {
    /// The parameter keys.
    pub const PARAMS: &'static [ParamInfo] = &[
        ParamInfo {
            key: "layers",
            help: "decoder layers",
        },
        ParamInfo {
            key: "hidden",
            help: "model width",
        },
        ParamInfo {
            key: "heads",
            help: "query heads (hidden must be a multiple)",
        },
        ParamInfo {
            key: "kv_heads",
            help: "key/value heads (0 = heads)",
        },
        ParamInfo {
            key: "ffn",
            help: "MLP width",
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
            key: "block",
            help: "tokens per KV-cache block (0 = contiguous, re-allocated)",
        },
        ParamInfo {
            key: "max_batch",
            help: "most requests decoded together",
        },
        ParamInfo {
            key: "requests",
            help: "requests served",
        },
        ParamInfo {
            key: "prompt_min",
            help: "shortest prompt (tokens)",
        },
        ParamInfo {
            key: "prompt_max",
            help: "longest prompt (tokens)",
        },
        ParamInfo {
            key: "gen_min",
            help: "fewest generated tokens (>= 1)",
        },
        ParamInfo {
            key: "gen_max",
            help: "most generated tokens",
        },
        ParamInfo {
            key: "interval",
            help: "mean decode steps between arrivals (0 = all at once)",
        },
        ParamInfo {
            key: "flash",
            help: "fused attention for prefill (0 = eager)",
        },
        ParamInfo {
            key: "seed",
            help: "seed of the request draws",
        },
        ParamInfo {
            key: "workspace",
            help: "cuBLAS workspace in bytes (0 = none)",
        },
    ];

    /// LLaMA-2 7B in fp16: 32 requests, batch up to 16, 256-token blocks,
    /// flash prefill.
    pub fn llama_7b() -> LlmInfer {
        LlmInfer {
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 0,
            ffn: 11008,
            vocab: 32000,
            dtype: 2,
            block: 256,
            max_batch: 16,
            requests: 32,
            prompt_min: 128,
            prompt_max: 2048,
            gen_min: 64,
            gen_max: 512,
            interval: 8,
            flash: true,
            seed: 7,
            workspace: 32 * MIB,
        }
    }

    /// LLaMA-2 13B in fp16: 32 requests, batch up to 8.
    pub fn llama_13b() -> LlmInfer {
        LlmInfer {
            layers: 40,
            hidden: 5120,
            heads: 40,
            ffn: 13824,
            max_batch: 8,
            requests: 24,
            seed: 13,
            ..LlmInfer::llama_7b()
        }
    }

    /// Mistral-7B-style: grouped-query attention with 8 KV heads, MLP 14336.
    pub fn mistral_7b() -> LlmInfer {
        LlmInfer {
            kv_heads: 8,
            ffn: 14336,
            seed: 17,
            ..LlmInfer::llama_7b()
        }
    }

    /// Key/value heads in force.
    pub fn kv_head_count(&self) -> u64 {
        if self.kv_heads == 0 {
            self.heads
        } else {
            self.kv_heads
        }
    }

    /// The number of weight tensors (allocations made once at the start,
    /// besides the workspace).
    pub fn weight_count(&self) -> u64 {
        9 * self.layers + 3
    }

    /// Set one parameter from its text value.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), WorkloadError> {
        let slot = match key {
            "layers" => &mut self.layers,
            "hidden" => &mut self.hidden,
            "heads" => &mut self.heads,
            "kv_heads" => &mut self.kv_heads,
            "ffn" => &mut self.ffn,
            "vocab" => &mut self.vocab,
            "block" => &mut self.block,
            "max_batch" => &mut self.max_batch,
            "requests" => &mut self.requests,
            "prompt_min" => &mut self.prompt_min,
            "prompt_max" => &mut self.prompt_max,
            "gen_min" => &mut self.gen_min,
            "gen_max" => &mut self.gen_max,
            "interval" => &mut self.interval,
            "seed" => &mut self.seed,
            "workspace" => &mut self.workspace,
            "dtype" => {
                self.dtype = parse_dtype(key, value)?;
                return Ok(());
            }
            "flash" => {
                self.flash = parse_bool(key, value)?;
                return Ok(());
            }
            _ => {
                return Err(WorkloadError::UnknownParam {
                    kind: WorkloadKind::LlmInfer,
                    key: key.to_string(),
                })
            }
        };
        *slot = parse_u64(key, value)?;
        Ok(())
    }

    /// Every parameter and its value, in [`LlmInfer::PARAMS`] order.
    pub fn values(&self) -> Vec<(&'static str, String)> {
        vec![
            ("layers", self.layers.to_string()),
            ("hidden", self.hidden.to_string()),
            ("heads", self.heads.to_string()),
            ("kv_heads", self.kv_heads.to_string()),
            ("ffn", self.ffn.to_string()),
            ("vocab", self.vocab.to_string()),
            ("dtype", self.dtype.to_string()),
            ("block", self.block.to_string()),
            ("max_batch", self.max_batch.to_string()),
            ("requests", self.requests.to_string()),
            ("prompt_min", self.prompt_min.to_string()),
            ("prompt_max", self.prompt_max.to_string()),
            ("gen_min", self.gen_min.to_string()),
            ("gen_max", self.gen_max.to_string()),
            ("interval", self.interval.to_string()),
            ("flash", if self.flash { "1" } else { "0" }.to_string()),
            ("seed", self.seed.to_string()),
            ("workspace", self.workspace.to_string()),
        ]
    }

    /// Check the dimensions.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let positive = [
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
            ("max_batch", self.max_batch),
            ("requests", self.requests),
            ("prompt_min", self.prompt_min),
            ("gen_min", self.gen_min),
        ];
        check_dims(&positive, self.hidden, self.heads)?;
        if self.heads % self.kv_head_count() != 0 {
            return Err(WorkloadError::Invalid(format!(
                "heads ({}) must be a multiple of kv_heads ({})",
                self.heads,
                self.kv_head_count()
            )));
        }
        if self.prompt_min > self.prompt_max {
            return Err(WorkloadError::Invalid(format!(
                "prompt_min ({}) is above prompt_max ({})",
                self.prompt_min, self.prompt_max
            )));
        }
        if self.gen_min > self.gen_max {
            return Err(WorkloadError::Invalid(format!(
                "gen_min ({}) is above gen_max ({})",
                self.gen_min, self.gen_max
            )));
        }
        let longest = (self.prompt_max + self.gen_max) as u128;
        let scores = self.heads as u128 * longest * longest * 8;
        let act = self.max_batch as u128 * longest * (self.ffn.max(self.vocab) as u128) * 8;
        let tokens = self.requests as u128 * longest;
        if scores.max(act) > (1u128 << 50) || tokens > (1 << 32) {
            return Err(WorkloadError::Invalid(
                "the requests are too long for the model's tensors".into(),
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

/// One request as drawn.
#[derive(Clone, Copy, Debug)]
struct Request {
    arrival: u64,
    prompt: u64,
    gen: u64,
}

/// The requests of a run in arrival order, each drawn when first looked at
/// (the draws are those of drawing them all at once, in order).
struct Requests {
    rng: SplitMix64,
    /// The arrival of the next request to draw.
    t: u64,
    /// Requests not drawn yet.
    left: u64,
    /// The next request, drawn and not taken yet.
    next: Option<Request>,
}

impl Requests {
    /// The next request, if any is left.
    fn peek(&mut self, w: &LlmInfer) -> Option<Request> {
        if self.next.is_none() && self.left > 0 {
            self.left -= 1;
            let r = Request {
                arrival: self.t,
                prompt: self.rng.log_uniform(w.prompt_min, w.prompt_max),
                gen: self.rng.range(w.gen_min, w.gen_max),
            };
            if w.interval > 0 {
                self.t += self.rng.range(0, 2 * w.interval);
            }
            self.next = Some(r);
        }
        self.next
    }

    /// Take the next request (after [`peek`](Self::peek) returned it).
    fn take(&mut self) -> Option<Request> {
        self.next.take()
    }
}

/// The KV cache of one request and layer.
#[derive(Debug)]
enum LayerCache {
    /// Key and value blocks, in token order.
    Paged { k: Vec<AllocId>, v: Vec<AllocId> },
    /// One key and one value tensor.
    Contiguous { k: AllocId, v: AllocId },
}

/// A request being decoded.
#[derive(Debug)]
struct Running {
    /// Tokens in its cache.
    len: u64,
    /// Tokens still to generate.
    remaining: u64,
    cache: Vec<LayerCache>,
    out: AllocId,
}

struct Gen<'a> {
    w: &'a LlmInfer,
    b: Builder,
    workspace_done: bool,
}

impl<'a> Gen<'a> {
    fn new(w: &'a LlmInfer, b: Builder) -> Self {
        Gen {
            w,
            b,
            workspace_done: false,
        }
    }

    fn d(&self) -> u64 {
        self.w.dtype
    }

    /// Key (or value) bytes of one token in one layer.
    fn kv_token_bytes(&self) -> u64 {
        self.w.kv_head_count() * (self.w.hidden / self.w.heads) * self.w.dtype
    }

    fn matmul(&mut self) {
        if !self.workspace_done {
            self.workspace_done = true;
            if self.w.workspace > 0 {
                self.b.alloc_as(self.w.workspace, "cuBLAS workspace");
            }
        }
    }

    /// The requests, drawn one at a time as they are needed (a workload
    /// of 10^12 requests is refused by counting its ops, not by drawing
    /// them all first).
    fn requests(&self) -> Requests {
        Requests {
            rng: SplitMix64::new(self.w.seed),
            t: 0,
            left: self.w.requests,
            next: None,
        }
    }

    fn run(mut self) -> Builder {
        let w = self.w;
        let (h, d) = (w.hidden, w.dtype);
        let kvdim = self.kv_token_bytes() / d;
        // weights
        self.b.at("weights");
        self.b.alloc(w.vocab * h * d);
        for _ in 0..w.layers {
            if self.b.full() {
                return self.b;
            }
            self.b.alloc(h * d);
            self.b.alloc(h * h * d);
            self.b.alloc(h * kvdim * d);
            self.b.alloc(h * kvdim * d);
            self.b.alloc(h * h * d);
            self.b.alloc(h * d);
            self.b.alloc(h * w.ffn * d);
            self.b.alloc(h * w.ffn * d);
            self.b.alloc(w.ffn * h * d);
        }
        self.b.alloc(h * d);
        self.b.alloc(w.vocab * h * d);

        let mut reqs = self.requests();
        let mut running: Vec<Running> = Vec::new();
        let mut t = 0u64;
        loop {
            if self.b.full() {
                break;
            }
            while (running.len() as u64) < w.max_batch
                && reqs.peek(w).is_some_and(|r| r.arrival <= t)
                && !self.b.full()
            {
                let Some(req) = reqs.take() else { break };
                let r = self.prefill(req);
                if r.remaining == 0 {
                    self.finish(r);
                } else {
                    running.push(r);
                }
            }
            if running.is_empty() {
                match reqs.peek(w) {
                    None => break,
                    Some(r) => t = t.max(r.arrival),
                }
                continue;
            }
            self.decode(&mut running);
            let mut i = 0;
            while i < running.len() {
                if running[i].remaining == 0 {
                    let r = running.remove(i);
                    self.finish(r);
                } else {
                    i += 1;
                }
            }
            t += 1;
        }
        self.b
    }

    /// Free a finished request's cache and output buffer.
    fn finish(&mut self, r: Running) {
        for c in r.cache {
            match c {
                LayerCache::Paged { k, v } => {
                    for (a, b) in k.into_iter().zip(v) {
                        self.b.free(a);
                        self.b.free(b);
                    }
                }
                LayerCache::Contiguous { k, v } => {
                    self.b.free(k);
                    self.b.free(v);
                }
            }
        }
        self.b.free(r.out);
    }

    /// RMSNorm over `n` tokens as Hugging Face computes it (fp32 upcast).
    /// Returns the normalized activations.
    fn rms_norm(&mut self, n: u64) -> AllocId {
        let (h, d) = (self.w.hidden, self.d());
        let h32 = self.b.alloc(n * h * 4);
        let sq = self.b.alloc(n * h * 4);
        let var = self.b.alloc(n * 4);
        self.b.free(sq);
        let r = self.b.alloc(n * 4);
        self.b.free(var);
        let n32 = self.b.alloc(n * h * 4);
        self.b.free(h32);
        self.b.free(r);
        let down = self.b.alloc(n * h * d);
        self.b.free(n32);
        let out = self.b.alloc(n * h * d);
        self.b.free(down);
        out
    }

    /// Eager attention core: scores, mask, fp32 softmax, downcast, output.
    /// `rows` query rows against `cols` keys, over all heads; with
    /// grouped-query attention, `kv_tokens` keys and values are repeated to
    /// all heads first.
    fn eager_attention(&mut self, rows: u64, cols: u64, kv_tokens: u64) -> AllocId {
        let w = self.w;
        let d = self.d();
        let gqa = w.kv_head_count() != w.heads;
        let rep = if gqa {
            Some([
                self.b.alloc_as(kv_tokens * w.hidden * d, ATTENTION),
                self.b.alloc_as(kv_tokens * w.hidden * d, ATTENTION),
            ])
        } else {
            None
        };
        let elems = w.heads * rows * cols;
        let s = self.b.alloc_as(elems * d, ATTENTION);
        let m = self.b.alloc_as(elems * d, ATTENTION);
        self.b.free(s);
        let p32 = self.b.alloc_as(elems * 4, ATTENTION);
        self.b.free(m);
        let p = self.b.alloc_as(elems * d, ATTENTION);
        self.b.free(p32);
        let o = self.b.alloc_as(rows * w.hidden * d, ATTENTION);
        self.b.free(p);
        if let Some(ids) = rep {
            for id in ids {
                self.b.free(id);
            }
        }
        o
    }

    /// The layers of one forward over `n` tokens, its activations for the
    /// site `activations`; `attend` writes the new
    /// keys and values into the caches and returns the attention output
    /// (given the layer index and the new keys and values, which it frees or
    /// keeps).
    fn forward(
        &mut self,
        n: u64,
        activations: &'static str,
        mut attend: impl FnMut(&mut Self, usize, AllocId, AllocId) -> AllocId,
        last_tokens: u64,
    ) {
        let w = self.w;
        let (h, d) = (w.hidden, w.dtype);
        let kvb = self.kv_token_bytes();
        let hd = h / w.heads;
        self.b.at(activations);
        let ids = self.b.alloc(n * 8);
        let pos = self.b.alloc(n * 8);
        let mut x = self.b.alloc(n * h * d);
        self.b.free(ids);
        let cos = self.b.alloc(n * hd * d);
        let sin = self.b.alloc(n * hd * d);
        self.b.free(pos);
        for l in 0..w.layers as usize {
            if self.b.full() {
                break;
            }
            let hn = self.rms_norm(n);
            self.matmul();
            let q = self.b.alloc(n * h * d);
            let k = self.b.alloc(n * kvb);
            let v = self.b.alloc(n * kvb);
            self.b.free(hn);
            let qr = self.b.alloc(n * h * d);
            self.b.free(q);
            let kr = self.b.alloc(n * kvb);
            self.b.free(k);
            let o = attend(self, l, kr, v);
            self.b.free(qr);
            let ot = self.b.alloc(n * h * d);
            self.b.free(o);
            let proj = self.b.alloc(n * h * d);
            self.b.free(ot);
            let x1 = self.b.alloc(n * h * d);
            self.b.free(proj);
            self.b.free(x);
            x = x1;
            let hn2 = self.rms_norm(n);
            let gate = self.b.alloc(n * w.ffn * d);
            let up = self.b.alloc(n * w.ffn * d);
            self.b.free(hn2);
            let act = self.b.alloc(n * w.ffn * d);
            self.b.free(gate);
            let prod = self.b.alloc(n * w.ffn * d);
            self.b.free(act);
            self.b.free(up);
            let down = self.b.alloc(n * h * d);
            self.b.free(prod);
            let x2 = self.b.alloc(n * h * d);
            self.b.free(down);
            self.b.free(x);
            x = x2;
        }
        self.b.free(cos);
        self.b.free(sin);
        let hn = self.rms_norm(n);
        self.b.free(x);
        let last = if last_tokens != n {
            let l = self.b.alloc(last_tokens * h * d);
            self.b.free(hn);
            l
        } else {
            hn
        };
        self.b.at("logits and sampling");
        let logits = self.b.alloc(last_tokens * w.vocab * d);
        self.b.free(last);
        let l32 = self.b.alloc(last_tokens * w.vocab * 4);
        self.b.free(logits);
        let scaled = self.b.alloc(last_tokens * w.vocab * 4);
        self.b.free(l32);
        let probs = self.b.alloc(last_tokens * w.vocab * 4);
        self.b.free(scaled);
        let next = self.b.alloc(last_tokens * 8);
        self.b.free(probs);
        self.b.free(next);
    }

    /// Admit a request: its output buffer, then one forward over its prompt.
    fn prefill(&mut self, r: Request) -> Running {
        let w = self.w;
        let p = r.prompt;
        let kvb = self.kv_token_bytes();
        let out = self.b.alloc_as(r.gen * 8, "generated tokens");
        let mut cache = Vec::with_capacity(w.layers.min(1 << 12) as usize);
        let block = w.block;
        let flash = w.flash;
        let (h, d, heads) = (w.hidden, w.dtype, w.heads);
        self.forward(
            p,
            "prefill activations",
            |g, _l, kr, v| {
                if block > 0 {
                    let nb = p.div_ceil(block);
                    let mut ks = Vec::with_capacity(nb.min(1 << 12) as usize);
                    let mut vs = Vec::with_capacity(nb.min(1 << 12) as usize);
                    for _ in 0..nb {
                        if g.b.full() {
                            break;
                        }
                        ks.push(g.b.alloc_as(block * kvb, KV_CACHE));
                        vs.push(g.b.alloc_as(block * kvb, KV_CACHE));
                    }
                    cache.push(LayerCache::Paged { k: ks, v: vs });
                }
                let o = if flash {
                    let o = g.b.alloc_as(p * h * d, ATTENTION);
                    let lse = g.b.alloc_as(heads * p * 4, ATTENTION);
                    g.b.free(lse);
                    o
                } else {
                    g.eager_attention(p, p, p)
                };
                if block > 0 {
                    g.b.free(kr);
                    g.b.free(v);
                } else {
                    // the new keys and values become the cache
                    cache.push(LayerCache::Contiguous { k: kr, v });
                }
                o
            },
            1,
        );
        Running {
            len: p,
            remaining: r.gen - 1,
            cache,
            out,
        }
    }

    /// One decode step: one token for every running request.
    fn decode(&mut self, running: &mut [Running]) {
        let w = self.w;
        let n = running.len() as u64;
        let kvb = self.kv_token_bytes();
        let (h, d, heads, block) = (w.hidden, w.dtype, w.heads, w.block);
        let hd = h / heads;
        let lmax = running.iter().map(|r| r.len + 1).max().unwrap_or(1);
        let meta = if block > 0 {
            let blocks_max = lmax.div_ceil(block);
            Some([
                self.b
                    .alloc_as(n * blocks_max * 4, "paged attention metadata"),
                self.b.alloc_as(n * 8, "paged attention metadata"),
                self.b.alloc_as(n * 4, "paged attention metadata"),
            ])
        } else {
            None
        };
        self.forward(
            n,
            "decode activations",
            |g, l, kr, v| {
                for r in running.iter_mut() {
                    match &mut r.cache[l] {
                        LayerCache::Paged { k, v } => {
                            if r.len + 1 > k.len() as u64 * block {
                                k.push(g.b.alloc_as(block * kvb, KV_CACHE));
                                v.push(g.b.alloc_as(block * kvb, KV_CACHE));
                            }
                        }
                        LayerCache::Contiguous { k, v } => {
                            let nk = g.b.alloc_as((r.len + 1) * kvb, KV_CACHE);
                            g.b.free(*k);
                            *k = nk;
                            let nv = g.b.alloc_as((r.len + 1) * kvb, KV_CACHE);
                            g.b.free(*v);
                            *v = nv;
                        }
                    }
                }
                g.b.free(kr);
                g.b.free(v);
                if block > 0 {
                    let o = g.b.alloc_as(n * h * d, ATTENTION);
                    if lmax > PARTITION {
                        let parts = lmax.div_ceil(PARTITION);
                        let tmp = g.b.alloc_as(n * heads * parts * hd * 4, ATTENTION);
                        let sums = g.b.alloc_as(n * heads * parts * 4, ATTENTION);
                        let maxl = g.b.alloc_as(n * heads * parts * 4, ATTENTION);
                        g.b.free(tmp);
                        g.b.free(sums);
                        g.b.free(maxl);
                    }
                    o
                } else {
                    g.eager_attention(n, lmax, n * lmax)
                }
            },
            n,
        );
        if let Some(ids) = meta {
            for id in ids {
                self.b.free(id);
            }
        }
        for r in running.iter_mut() {
            r.len += 1;
            r.remaining -= 1;
        }
    }
}
