//! The `layers` kind: a transformer's training loop.

use super::{Gen, GIB};
use crate::oracle_trace::AllocId;

/// The model and training loop of the `layers` kind (see
/// `Gen::layer_shape`).
struct LayerShape {
    /// Bytes per element.
    dtype: u64,
    hidden: u64,
    seq: u64,
    batch: u64,
    nlayers: u64,
    vocab: u64,
    /// Whether the optimizer keeps state (Adam).
    adam: bool,
    /// Whether `zero_grad` frees the gradients.
    set_to_none: bool,
    /// The chance of an `empty_cache()` per step.
    e_p: f64,
    /// Bytes the run may keep live.
    budget: u64,
    /// Bytes of one activation, of one attention matrix, of the logits.
    act: u64,
    attn: u64,
    logits: u64,
}

impl Gen {
    /// A transformer's training loop: parameters, then per step the
    /// activations saved layer by layer and freed in reverse.
    pub(super) fn layers(&mut self) {
        let sh = self.layer_shape();
        let (params, state_ok) = self.layer_params(&sh);
        let mut grads: Vec<AllocId> = Vec::new();
        let mut states_made = false;
        let mut step = 0u64;
        while !self.done() {
            step += 1;
            // forward
            let input = self.alloc(sh.batch * sh.seq * 8);
            let saved = self.layers_forward(&sh);
            let lg = self.alloc(sh.logits);
            let loss = self.alloc(4);
            let stats = self.alloc(sh.batch * sh.seq * 4);
            // backward
            let dlg = self.alloc(sh.logits);
            self.free_id(lg);
            self.free_id(stats);
            self.free_id(dlg);
            self.layers_backward(&sh, saved);
            self.free_id(loss);
            self.free_id(input);
            // gradients (kept until zero_grad) and the optimizer step
            if grads.is_empty() {
                for &(_, b) in &params {
                    grads.push(self.alloc(b));
                }
            }
            if sh.adam && state_ok && !states_made {
                for &(_, b) in &params {
                    self.alloc(b);
                    self.alloc(b);
                }
                states_made = true;
            }
            for &(_, b) in params.iter().take(64) {
                let t = self.alloc(b);
                self.free_id(t);
            }
            if sh.set_to_none {
                for id in std::mem::take(&mut grads) {
                    self.free_id(id);
                }
            }
            if self.r.chance(sh.e_p) {
                self.empty_cache();
            }
            let _ = step;
        }
    }

    /// The model and training loop of the `layers` kind, drawn at random,
    /// the batch and sequence shrunk until what is saved for backward fits
    /// well inside the device.
    fn layer_shape(&mut self) -> LayerShape {
        let dtype = *self.r.pick(&[2u64, 2, 4]);
        let hidden = *self.r.pick(&[256u64, 512, 768, 1024, 1536, 2048, 4096]);
        let mut seq = *self.r.pick(&[64u64, 128, 256, 512, 1024, 2048]);
        let mut batch = *self.r.pick(&[1u64, 2, 4, 8, 16, 32]);
        let nlayers = self.r.range(2, 24);
        let heads = *self.r.pick(&[4u64, 8, 16]);
        let vocab = *self.r.pick(&[32000u64, 50257, 30522, 8192]);
        let adam = self.r.chance(0.5);
        let set_to_none = self.r.chance(0.6);
        let e_p = *self.r.pick(&[0.0, 0.05, 0.2]);
        // Keep everything saved for backward well inside the device.
        let share = *self.r.pick(&[4u64, 6, 8]);
        let budget = self.limit / 10 * share;
        loop {
            let act = batch * seq * hidden * dtype;
            let attn = batch * heads * seq * seq * dtype;
            let saved = nlayers * (9 * act + 2 * attn) + batch * seq * vocab * dtype * 2;
            if saved <= budget / 2 || (batch == 1 && seq <= 64) {
                break;
            }
            if batch > 1 {
                batch /= 2;
            } else {
                seq /= 2;
            }
        }
        LayerShape {
            dtype,
            hidden,
            seq,
            batch,
            nlayers,
            adam,
            set_to_none,
            e_p,
            budget,
            act: batch * seq * hidden * dtype,
            attn: batch * heads * seq * seq * dtype,
            logits: batch * seq * vocab * dtype,
            vocab,
        }
    }

    /// The parameters of the `layers` kind (embedding, per layer qkv / out /
    /// fc1 / fc2 / norms / biases), as many as fit in half the budget, and
    /// whether the optimizer state fits as well.
    fn layer_params(&mut self, sh: &LayerShape) -> (Vec<(AllocId, u64)>, bool) {
        let (hidden, dtype, budget) = (sh.hidden, sh.dtype, sh.budget);
        let mut params: Vec<(AllocId, u64)> = Vec::new();
        let mut param_sizes = vec![sh.vocab * hidden * dtype];
        for _ in 0..sh.nlayers {
            param_sizes.extend_from_slice(&[
                3 * hidden * hidden * dtype,
                3 * hidden * dtype,
                hidden * hidden * dtype,
                hidden * dtype,
                4 * hidden * hidden * dtype,
                4 * hidden * dtype,
                4 * hidden * hidden * dtype,
                hidden * dtype,
                hidden * dtype,
                hidden * dtype,
            ]);
        }
        let param_total: u64 = param_sizes.iter().sum();
        let mut state_ok = param_total * 4 <= budget / 2;
        for &b in &param_sizes {
            if self.live_bytes + b > budget / 2 {
                state_ok = false;
                break;
            }
            let id = self.alloc(b);
            params.push((id, b));
        }
        (params, state_ok)
    }

    /// The forward of one step of the `layers` kind: the blocks saved for
    /// backward, the input's first, then each layer's.
    fn layers_forward(&mut self, sh: &LayerShape) -> Vec<Vec<AllocId>> {
        let (act, attn) = (sh.act, sh.attn);
        let mut saved: Vec<Vec<AllocId>> = Vec::new();
        let x = self.alloc(act);
        saved.push(vec![x]);
        for _ in 0..sh.nlayers {
            let mut keep = Vec::new();
            keep.push(self.alloc(act)); // norm out
            keep.push(self.alloc(3 * act)); // qkv
            if attn <= 2 * GIB {
                let scores = self.alloc(attn);
                let probs = self.alloc(attn);
                self.free_id(scores);
                keep.push(probs);
            }
            let ctx = self.alloc(act);
            keep.push(ctx);
            let tb = *self
                .r
                .pick(&[sh.hidden * sh.dtype, sh.batch * sh.seq * 4, 512, act]);
            let t = self.alloc(tb);
            self.free_id(t);
            keep.push(self.alloc(act)); // attn out + residual
            keep.push(self.alloc(4 * act)); // fc1
            keep.push(self.alloc(4 * act)); // gelu
            keep.push(self.alloc(act)); // fc2
            if self.r.chance(0.3) {
                let mask = self.alloc(sh.batch * sh.seq);
                keep.push(mask);
            }
            saved.push(keep);
        }
        saved
    }

    /// The backward through the layers of the `layers` kind: a gradient
    /// per saved block, the saved blocks freed in reverse.
    fn layers_backward(&mut self, sh: &LayerShape, saved: Vec<Vec<AllocId>>) {
        let mut dx = self.alloc(sh.act);
        for keep in saved.into_iter().rev() {
            for id in keep.into_iter().rev() {
                let g = self.alloc(sh.act);
                self.free_id(id);
                if self.r.chance(0.5) {
                    let tb = *self
                        .r
                        .pick(&[sh.hidden * sh.dtype, 4 * sh.hidden * sh.dtype]);
                    let t = self.alloc(tb);
                    self.free_id(t);
                }
                self.free_id(dx);
                dx = g;
            }
        }
        self.free_id(dx);
    }
}
