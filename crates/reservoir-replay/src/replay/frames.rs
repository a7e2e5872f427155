//! What an allocation's recorded frames say: whether a frame is PyTorch's or
//! Python's own ([`is_internal`]), and the phase (forward, backward,
//! optimizer) and, when they name it, the role of the allocation
//! ([`hint_of`]). Read by the sites ([`super::sites`]) and the roles
//! ([`super::roles`]), which decides each role from these and the lifetime.

use reservoir::observe::trace::Frame;

/// Is `f` one of PyTorch's or Python's own frames?
pub fn is_internal(f: &Frame) -> bool {
    let file = f.filename.as_str();
    let native = [".c", ".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh", ".so"]
        .iter()
        .any(|x| file.ends_with(x));
    native
        || file.is_empty()
        || file == "??"
        || file.starts_with('<')
        || file.contains("/torch/")
        || file.starts_with("torch/")
        || ["c10::", "at::", "torch::", "std::"]
            .iter()
            .any(|p| f.name.starts_with(p))
}

/// What an allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Model weights (module construction, `.to()`, `load_state_dict`).
    Parameters,
    /// Weight gradients (made in backward, living past it).
    Gradients,
    /// Optimizer state (made in the optimizer step, living across steps).
    OptimizerState,
    /// Activations saved for backward (made in forward, freed in backward).
    Activations,
    /// Temporaries (freed within the phase that made them).
    Temporaries,
    /// Inputs and caches (data batches, KV caches).
    Inputs,
    /// Anything else (workspaces, blocks allocated before the trace).
    Other,
}

impl Role {
    /// Every role, in the order reports list them.
    pub const ALL: [Role; 7] = [
        Role::Parameters,
        Role::Gradients,
        Role::OptimizerState,
        Role::Activations,
        Role::Temporaries,
        Role::Inputs,
        Role::Other,
    ];

    /// The role's JSON key: `parameters`, `gradients`, `optimizer_state`,
    /// `activations`, `temporaries`, `inputs`, `other`.
    pub fn key(self) -> &'static str {
        match self {
            Role::Parameters => "parameters",
            Role::Gradients => "gradients",
            Role::OptimizerState => "optimizer_state",
            Role::Activations => "activations",
            Role::Temporaries => "temporaries",
            Role::Inputs => "inputs",
            Role::Other => "other",
        }
    }

    /// The role of a JSON key ([`Role::key`]).
    pub fn from_key(key: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.key() == key)
    }

    /// The role in words, for reports.
    pub fn words(self) -> &'static str {
        match self {
            Role::Parameters => "parameters",
            Role::Gradients => "gradients",
            Role::OptimizerState => "optimizer state",
            Role::Activations => "activations saved for backward",
            Role::Temporaries => "temporaries",
            Role::Inputs => "inputs and caches",
            Role::Other => "other",
        }
    }
}

/// How sure a role is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// The frames name the role (`AccumulateGrad`, module construction, a
    /// cache, a data loader).
    Frames,
    /// The frames name the phase (forward, backward, optimizer) and the
    /// lifetime decides the role.
    PhaseAndLifetime,
    /// The lifetime alone (no telling frame, or no stack at all).
    Lifetime,
}

/// The phase an allocation was made in, from its frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Phase {
    /// No stack recorded: the phase is not known (it does not start a run).
    #[default]
    Unknown,
    /// A stack with no forward, backward or optimizer frame.
    Outside,
    /// A module's forward.
    Forward,
    /// The autograd engine (backward).
    Backward,
    /// `torch/optim`.
    Optimizer,
}

/// What the frames of one allocation say: its phase and, when they name
/// it, its role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Hint {
    /// The phase.
    pub phase: Phase,
    /// The role the frames name (gradients, parameters, inputs and caches),
    /// if any.
    pub role: Option<Role>,
}

impl Hint {
    /// A hint of phase `phase` naming no role.
    pub const fn phase(phase: Phase) -> Hint {
        Hint { phase, role: None }
    }

    /// A hint naming `role`, made in `phase`.
    pub const fn role(phase: Phase, role: Role) -> Hint {
        Hint {
            phase,
            role: Some(role),
        }
    }
}

fn any(frames: &[Frame], f: impl Fn(&Frame) -> bool) -> bool {
    frames.iter().any(f)
}

/// The hint of a recorded stack (innermost frame first); see the module
/// documentation for the rules.
pub fn hint_of(frames: &[Frame]) -> Hint {
    if frames.is_empty() {
        return Hint::default();
    }
    if any(frames, |f| f.name.contains("AccumulateGrad")) {
        return Hint::role(Phase::Backward, Role::Gradients);
    }
    let backward = any(frames, |f| {
        f.name.contains("torch::autograd::Engine::")
            || f.name.contains("_backward_impl")
            || f.name.contains("CompiledFunctionBackward")
            || (f.filename.ends_with("torch/autograd/__init__.py")
                && (f.name == "backward" || f.name == "grad" || f.name == "_make_grads"))
            || f.name == "_engine_run_backward"
    });
    if backward {
        return Hint::phase(Phase::Backward);
    }
    if any(frames, |f| f.filename.contains("torch/optim/")) {
        return Hint::phase(Phase::Optimizer);
    }
    let forward = any(frames, |f| {
        f.name == "forward"
            || (f.name == "_call_impl" && f.filename.ends_with("torch/nn/modules/module.py"))
    });
    let phase = if forward {
        Phase::Forward
    } else {
        Phase::Outside
    };
    // The innermost user frame's function and file (lower case): a
    // wrapper further out (`train_batch`, `generate_with_cache`) names
    // everything under it, not what this allocation is for.
    let innermost = frames.iter().find(|f| !is_internal(f)).map(|f| {
        let file = f.filename.rsplit(['/', '\\']).next().unwrap_or("");
        (f.name.to_ascii_lowercase(), file.to_ascii_lowercase())
    });
    let names = |pred: &dyn Fn(&str) -> bool| {
        innermost
            .as_ref()
            .is_some_and(|(name, file)| pred(name) || pred(file))
    };
    let cache_file = any(frames, |f| f.filename.ends_with("cache_utils.py"));
    if cache_file
        || names(&|s| s.contains("cache") || s.contains("kv_") || s.contains("past_key_values"))
    {
        return Hint::role(phase, Role::Inputs);
    }
    let param = any(frames, |f| {
        f.filename.ends_with("torch/nn/init.py")
            || f.filename.ends_with("torch/nn/parameter.py")
            || f.name == "reset_parameters"
            || (f.filename.ends_with("torch/nn/modules/module.py")
                && matches!(
                    f.name.as_str(),
                    "_apply" | "to" | "cuda" | "load_state_dict" | "_load_from_state_dict"
                ))
    });
    if param {
        return Hint::role(phase, Role::Parameters);
    }
    if forward {
        return Hint::phase(Phase::Forward);
    }
    if any(frames, |f| f.filename.contains("torch/utils/data/"))
        || names(&|s| s.contains("batch") || s.contains("data") || s.contains("loader"))
    {
        return Hint::role(Phase::Outside, Role::Inputs);
    }
    Hint::phase(Phase::Outside)
}
