//! Memory by role (issue 41 item 1): what each allocation of a replayed
//! trace is for (parameters, gradients, optimizer state, activations saved
//! for backward, temporaries, inputs and caches, other), decided from its
//! recorded frames and its lifetime, with how sure the decision is
//! ([`Basis`]).
//!
//! # From the frames: a hint
//!
//! Each recorded stack gives a [`Hint`] ([`hint_of`]): the *phase* it was
//! made in, and sometimes the role itself.
//!
//! | frames (any of the stack) | phase / role |
//! |---|---|
//! | `AccumulateGrad` (a C++ frame) | backward, **gradients** |
//! | `torch::autograd::Engine::`, `torch/autograd/__init__.py` (`backward`), `_backward_impl` / `CompiledFunctionBackward` (compiled backward) | backward |
//! | a file under `torch/optim/` | optimizer |
//! | `cache_utils.py` (Hugging Face caches), or an innermost user frame whose function or file names a cache (`cache`, `kv_`, `past_key_values`) | **inputs and caches** |
//! | `torch/nn/init.py`, `torch/nn/parameter.py`, `reset_parameters`, `Module._apply` / `to` / `cuda` / `load_state_dict` | **parameters** |
//! | a function named `forward`, `Module._call_impl` | forward |
//! | `torch/utils/data/`, or an innermost user frame whose function or file names data (`batch`, `data`, `loader`) | **inputs and caches** |
//! | none of these | outside every phase |
//! | no stack recorded | unknown (does not change the phase) |
//!
//! The first row that matches wins, in this order (the engine thread's
//! backward runs a module's `forward` code in compiled backward, so backward
//! is checked before forward).
//!
//! # From the lifetime: the phase runs
//!
//! One pass over the trace cuts it into *phase runs*: a new run starts at
//! each allocation whose phase (forward, backward, optimizer, outside)
//! differs from the previous allocation's (allocations of unknown phase
//! belong to the run they fall in). An allocation is then freed in its own
//! run, freed in a later run (and whether that run is a backward one), or
//! never freed (it lives to the end of the trace):
//!
//! | hint | freed in its own run | freed in a later run | never freed |
//! |---|---|---|---|
//! | forward | temporaries | activations when freed in a backward run; other when a later forward run began first (it lived across steps); else activations (kept past its forward: what the autograd graph keeps) | other when a later forward or backward run followed (a workspace), else activations (the recording ends before any backward) |
//! | backward | temporaries | gradients | gradients |
//! | optimizer | temporaries | optimizer state | optimizer state |
//! | outside / unknown | temporaries | temporaries | other |
//!
//! A role named by the frames themselves (gradients from `AccumulateGrad`,
//! parameters, inputs and caches) holds whatever the lifetime. Blocks
//! already allocated when the trace began have no frames here: other, by
//! lifetime (they live across the recording).
//!
//! Everything is one pass over the ops and a hash map lookup per
//! allocation: linear in the trace.

use rustc_hash::FxHashMap;

use crate::oracle_trace::{AllocId, Op, Trace};

pub use super::frames::{hint_of, Basis, Hint, Phase, Role};
use super::sites::Sites;

/// The role of each allocation of a trace, and how sure it is.
#[derive(Clone, Debug, Default)]
pub struct Roles {
    of: FxHashMap<AllocId, (Role, Basis)>,
}

/// Bytes of one role at one moment, and how sure.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RoleBytes {
    /// Bytes whose role the frames name.
    pub frames: u64,
    /// Bytes whose phase the frames name and whose role the lifetime decides.
    pub phase_and_lifetime: u64,
    /// Bytes whose role the lifetime alone decides.
    pub lifetime: u64,
}

impl RoleBytes {
    /// All the bytes.
    pub fn total(&self) -> u64 {
        self.frames + self.phase_and_lifetime + self.lifetime
    }

    fn add(&mut self, basis: Basis, bytes: u64) {
        match basis {
            Basis::Frames => self.frames += bytes,
            Basis::PhaseAndLifetime => self.phase_and_lifetime += bytes,
            Basis::Lifetime => self.lifetime += bytes,
        }
    }
}

/// Live bytes by role at one moment: `bytes` (role key -> bytes, every role
/// listed) and `basis` (role key -> bytes by how sure).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoleUsage {
    by: [RoleBytes; 7],
}

impl RoleUsage {
    /// Count `bytes` of an allocation of `role` decided on `basis`.
    pub fn add(&mut self, role: Role, basis: Basis, bytes: u64) {
        self.by[role as usize].add(basis, bytes);
    }

    /// The bytes of `role`.
    pub fn bytes(&self, role: Role) -> u64 {
        self.by[role as usize].total()
    }

    /// The bytes of `role` by how sure.
    pub fn detail(&self, role: Role) -> &RoleBytes {
        &self.by[role as usize]
    }

    /// Every role's bytes (JSON `roles`: role key -> bytes).
    pub fn bytes_by_key(&self) -> std::collections::BTreeMap<&'static str, u64> {
        Role::ALL
            .iter()
            .map(|&r| (r.key(), self.bytes(r)))
            .collect()
    }

    /// Every role's bytes by how sure (JSON `role_basis`).
    pub fn basis_by_key(&self) -> std::collections::BTreeMap<&'static str, RoleBytes> {
        Role::ALL
            .iter()
            .map(|&r| (r.key(), self.detail(r).clone()))
            .collect()
    }

    /// The roles holding bytes, largest first (ties in [`Role::ALL`] order).
    pub fn largest(&self) -> Vec<(Role, u64)> {
        let mut v: Vec<(Role, u64)> = Role::ALL
            .iter()
            .map(|&r| (r, self.bytes(r)))
            .filter(|&(_, b)| b > 0)
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }
}

/// The roles of a JSON `roles` map holding bytes, largest first (ties in
/// [`Role::ALL`] order).
pub fn largest(roles: &std::collections::BTreeMap<&'static str, u64>) -> Vec<(Role, u64)> {
    let mut usage = RoleUsage::default();
    for (k, &b) in roles {
        if let Some(r) = Role::from_key(k) {
            usage.add(r, Basis::Frames, b);
        }
    }
    usage.largest()
}

/// How a role's bytes were mostly decided, in words: `frames`,
/// `phase+lifetime` or `lifetime only`.
pub fn basis_words(b: &RoleBytes) -> &'static str {
    if b.frames >= b.phase_and_lifetime && b.frames >= b.lifetime {
        "frames"
    } else if b.phase_and_lifetime >= b.lifetime {
        "phase+lifetime"
    } else {
        "lifetime only"
    }
}

/// Where an allocation was freed relative to its phase run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Freed in the run that made it.
    SameRun,
    /// Freed in a later run: a backward one or not, and whether a forward
    /// run began after its own (it lived into the next step).
    LaterRun {
        in_backward: bool,
        next_forward: bool,
    },
    /// Never freed: whether a backward run followed its own, and whether a
    /// forward run did.
    Never {
        backward_follows: bool,
        next_forward: bool,
    },
}

impl Roles {
    /// Classify every allocation of `trace` from the hints in `sites` and
    /// the lifetimes in one pass.
    pub fn classify(trace: &Trace, sites: &Sites) -> Roles {
        // Per live allocation: its hint and its run.
        let mut open: FxHashMap<AllocId, (Hint, u32)> = FxHashMap::default();
        let mut of = FxHashMap::default();
        let mut run: u32 = 0;
        let mut phase = Phase::Unknown;
        // The latest backward and forward runs begun.
        let mut last_backward: u32 = 0;
        let mut last_forward: u32 = 0;
        for op in &trace.ops {
            match op {
                Op::Alloc { id, .. } => {
                    let h = sites.hint(*id);
                    if h.phase != Phase::Unknown && h.phase != phase {
                        run += 1;
                        phase = h.phase;
                        match phase {
                            Phase::Backward => last_backward = run,
                            Phase::Forward => last_forward = run,
                            _ => {}
                        }
                    }
                    open.insert(*id, (h, run));
                }
                Op::Free { id } => {
                    if let Some((h, r)) = open.remove(id) {
                        let fate = if r == run {
                            Fate::SameRun
                        } else {
                            Fate::LaterRun {
                                in_backward: phase == Phase::Backward,
                                next_forward: last_forward > r,
                            }
                        };
                        of.insert(*id, decide(h, fate));
                    }
                }
                _ => {}
            }
        }
        for (id, (h, r)) in open {
            let fate = Fate::Never {
                backward_follows: last_backward > r,
                next_forward: last_forward > r,
            };
            of.insert(id, decide(h, fate));
        }
        Roles { of }
    }

    /// The role of allocation `id` and how sure; blocks allocated before the
    /// trace (no entry) are other, by lifetime.
    pub fn role(&self, id: AllocId) -> (Role, Basis) {
        self.of
            .get(&id)
            .copied()
            .unwrap_or((Role::Other, Basis::Lifetime))
    }
}

/// The role of an allocation of hint `h` whose lifetime ended as `fate`.
fn decide(h: Hint, fate: Fate) -> (Role, Basis) {
    if let Some(role) = h.role {
        return (role, Basis::Frames);
    }
    let basis = match h.phase {
        Phase::Unknown | Phase::Outside => Basis::Lifetime,
        _ => Basis::PhaseAndLifetime,
    };
    let role = match (h.phase, fate) {
        (_, Fate::SameRun) => Role::Temporaries,
        (
            Phase::Forward,
            Fate::LaterRun {
                in_backward: true, ..
            },
        ) => Role::Activations,
        // Lived into the next forward: across steps (a workspace).
        (
            Phase::Forward,
            Fate::LaterRun {
                next_forward: true, ..
            }
            | Fate::Never {
                next_forward: true, ..
            },
        ) => Role::Other,
        // Kept past its forward by something other than backward.
        (
            Phase::Forward,
            Fate::Never {
                backward_follows: true,
                ..
            },
        ) => Role::Other,
        // Kept past its forward with no backward recorded after it: what
        // the autograd graph keeps (or the forward's outputs).
        (Phase::Forward, _) => Role::Activations,
        (Phase::Backward, _) => Role::Gradients,
        (Phase::Optimizer, _) => Role::OptimizerState,
        (_, Fate::LaterRun { .. }) => Role::Temporaries,
        _ => Role::Other,
    };
    (role, basis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reservoir::observe::trace::Frame;

    fn frame(file: &str, name: &str) -> Frame {
        Frame {
            name: name.into(),
            filename: file.into(),
            line: 1,
        }
    }

    #[test]
    fn frames_name_the_phase_or_the_role() {
        let fwd = [
            frame("/p/torch/nn/functional.py", "linear"),
            frame("/home/u/model.py", "forward"),
            frame("/p/torch/nn/modules/module.py", "_call_impl"),
        ];
        assert_eq!(hint_of(&fwd), Hint::phase(Phase::Forward));
        let engine = [
            frame("??", "at::empty"),
            frame("??", "torch::autograd::Engine::evaluate_function(x)"),
        ];
        assert_eq!(hint_of(&engine), Hint::phase(Phase::Backward));
        let acc = [frame(
            "??",
            "torch::autograd::AccumulateGrad::accumulateGrad",
        )];
        assert_eq!(hint_of(&acc), Hint::role(Phase::Backward, Role::Gradients));
        // Compiled backward runs the module's forward code.
        let compiled = [
            frame("/tmp/torchinductor/ab.py", "call"),
            frame("/home/u/model.py", "forward"),
            frame(
                "/p/torch/_functorch/_aot_autograd/runtime_wrappers.py",
                "_backward_impl",
            ),
        ];
        assert_eq!(hint_of(&compiled), Hint::phase(Phase::Backward));
        let optim = [
            frame("/home/u/optimizer.py", "step"),
            frame("/p/torch/optim/optimizer.py", "wrapper"),
        ];
        assert_eq!(hint_of(&optim), Hint::phase(Phase::Optimizer));
        let init = [
            frame("/p/torch/nn/init.py", "normal_"),
            frame("/home/u/model.py", "__init__"),
        ];
        assert_eq!(hint_of(&init), Hint::role(Phase::Outside, Role::Parameters));
        let kv = [
            frame("/p/transformers/cache_utils.py", "update"),
            frame("/p/transformers/llama.py", "forward"),
        ];
        assert_eq!(hint_of(&kv), Hint::role(Phase::Forward, Role::Inputs));
        let wrapped = [
            frame("/home/u/model.py", "update"),
            frame("/home/u/agent.py", "batch_step"),
        ];
        assert_eq!(hint_of(&wrapped), Hint::phase(Phase::Outside));
        let data = [frame("/home/u/train.py", "get_batch")];
        assert_eq!(hint_of(&data), Hint::role(Phase::Outside, Role::Inputs));
        assert_eq!(
            hint_of(&[frame("/home/u/train.py", "main")]),
            Hint::phase(Phase::Outside)
        );
        assert_eq!(hint_of(&[]), Hint::default());
    }

    /// A forward, a backward and an optimizer step, by hand.
    #[test]
    fn the_lifetime_decides_within_a_phase() {
        let mut sites = Sites::new();
        let text = "a 1 100\na 2 10\nf 2\na 3 20\na 4 30\nf 3\na 5 40\na 6 50\nf 5\na 7 60\n";
        let trace = Trace::parse(text).unwrap();
        let h = [
            (1, Hint::role(Phase::Outside, Role::Parameters)),
            (2, Hint::phase(Phase::Forward)),
            (3, Hint::phase(Phase::Forward)),
            (4, Hint::phase(Phase::Backward)),
            (5, Hint::phase(Phase::Optimizer)),
            (6, Hint::phase(Phase::Optimizer)),
            (7, Hint::default()),
        ];
        for (id, hint) in h {
            sites.name(id, "x");
            sites.set_hint(id, hint);
        }
        let roles = Roles::classify(&trace, &sites);
        assert_eq!(roles.role(1), (Role::Parameters, Basis::Frames));
        assert_eq!(roles.role(2), (Role::Temporaries, Basis::PhaseAndLifetime));
        assert_eq!(roles.role(3), (Role::Activations, Basis::PhaseAndLifetime));
        assert_eq!(roles.role(4), (Role::Gradients, Basis::PhaseAndLifetime));
        assert_eq!(roles.role(5), (Role::Temporaries, Basis::PhaseAndLifetime));
        assert_eq!(
            roles.role(6),
            (Role::OptimizerState, Basis::PhaseAndLifetime)
        );
        assert_eq!(roles.role(7), (Role::Other, Basis::Lifetime));
        assert_eq!(roles.role(99), (Role::Other, Basis::Lifetime));
    }
}

/// The classifier against built-in workloads, whose roles are known by
/// construction. Workloads carry no frames: each allocation's hint is the
/// phase its workload site stands for ([`site_hint`]), with the role named
/// only for parameters, data and KV caches (as module construction, a data
/// loader and a cache's frames would name them); gradients, optimizer
/// state, activations and temporaries are decided by the lifetime alone.
///
/// [`site_hint`]: crate::workload::site_hint
#[cfg(test)]
mod workload_tests {
    use super::*;
    use crate::workload::Workload;

    /// Each allocation's role as the workload made it, from its site and,
    /// for the tensors of a forward, whether backward consumed them (freed
    /// after a backward allocation began: saved for backward, else a
    /// temporary).
    fn truth(trace: &Trace, sites: &Sites) -> FxHashMap<AllocId, Role> {
        let backward = |s: &str| {
            matches!(
                s,
                "layer backward" | "embedding backward" | "logits and loss backward"
            )
        };
        let step_end = |s: &str| {
            matches!(
                s,
                "gradient clipping" | "optimizer step" | "optimizer state (AdamW)"
            )
        };
        let fixed = |s: &str| match s {
            "parameters" | "weights" => Some(Role::Parameters),
            "optimizer state (AdamW)" => Some(Role::OptimizerState),
            "input batch" | "KV cache" | "generated tokens" => Some(Role::Inputs),
            "cuBLAS workspace" => Some(Role::Other),
            _ => None,
        };
        // Op index of each allocation, of the latest backward allocation,
        // and of the latest start of an optimizer phase.
        let mut alloc_at: FxHashMap<AllocId, usize> = FxHashMap::default();
        let mut last_backward: Option<usize> = None;
        let mut last_step_end: Option<usize> = None;
        let mut in_step_end = false;
        let mut out = FxHashMap::default();
        let after = |x: Option<usize>, a: usize| x.is_some_and(|b| b > a);
        for (i, op) in trace.ops.iter().enumerate() {
            match op {
                Op::Alloc { id, .. } => {
                    alloc_at.insert(*id, i);
                    let s = sites.site(*id);
                    if backward(s) || s == "weight gradients" {
                        last_backward = Some(i);
                    }
                    if step_end(s) && !in_step_end {
                        last_step_end = Some(i);
                    }
                    in_step_end = step_end(s);
                }
                Op::Free { id } => {
                    let s = sites.site(*id);
                    let a = alloc_at[id];
                    let role = fixed(s).unwrap_or_else(|| {
                        if site_is_forward(s) && after(last_backward, a) {
                            // Saved for backward: freed once backward began.
                            Role::Activations
                        } else if (backward(s) || s == "weight gradients")
                            && after(last_step_end, a)
                        {
                            // A parameter's `.grad` when the optimizer ran.
                            Role::Gradients
                        } else {
                            Role::Temporaries
                        }
                    });
                    out.insert(*id, role);
                }
                _ => {}
            }
        }
        for (id, _) in alloc_at {
            out.entry(id).or_insert_with(|| {
                let s = sites.site(id);
                fixed(s).unwrap_or(if backward(s) || s == "weight gradients" {
                    Role::Gradients
                } else {
                    Role::Other
                })
            });
        }
        out
    }

    fn site_is_forward(s: &str) -> bool {
        s.starts_with("layer forward") || s == "embedding forward" || s == "logits and loss"
    }

    /// Bytes by role, classified and true, and the allocations that differ.
    fn compare(spec: &str) -> (Vec<(Role, u64, u64)>, Vec<String>) {
        let w = Workload::parse(spec).unwrap();
        let (trace, sites) = w.trace_and_sites();
        let roles = Roles::classify(&trace, &sites);
        let truth = truth(&trace, &sites);
        let mut bytes: FxHashMap<AllocId, u64> = FxHashMap::default();
        for op in &trace.ops {
            if let Op::Alloc { id, bytes: b, .. } = op {
                bytes.insert(*id, *b);
            }
        }
        let mut by = [(0u64, 0u64); 7];
        let mut wrong = Vec::new();
        let mut ids: Vec<_> = truth.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let t = truth[&id];
            let (r, _) = roles.role(id);
            by[r as usize].0 += bytes[&id];
            by[t as usize].1 += bytes[&id];
            if r != t {
                wrong.push(format!("{id} {}: {r:?} != {t:?}", sites.site(id)));
            }
        }
        let v = Role::ALL
            .iter()
            .map(|&r| (r, by[r as usize].0, by[r as usize].1))
            .collect();
        (v, wrong)
    }

    /// Every allocation of workload `spec` has the role it was built with,
    /// and every role its bytes.
    fn assert_roles_match_construction(spec: &str) {
        let (by, wrong) = compare(spec);
        assert!(
            wrong.is_empty(),
            "{spec}: {} wrong: {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(20)]
        );
        for (role, got, want) in by {
            assert_eq!(got, want, "{spec}: {role:?}");
        }
    }

    #[test]
    fn gpt_training_roles_match_construction() {
        assert_roles_match_construction("gpt-train:layers=2,steps=3");
        assert_roles_match_construction("gpt2-small-ddp-train:layers=2,steps=2");
    }

    #[test]
    fn llm_inference_roles_match_construction() {
        assert_roles_match_construction("llm-infer");
    }
}
