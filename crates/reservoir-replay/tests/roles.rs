//! Memory by role (issue 41 item 1) on a real snapshot: a CS336 Transformer
//! LM's full training step (forward, backward, AdamW step), recorded with
//! C++ and Python frames. The classifier must find its optimizer state (the
//! AdamW moments, made under `torch/optim` and kept), its gradients (made
//! by the autograd engine and kept past backward) and activations saved for
//! backward (made in a module's forward, freed by the engine), and every
//! live byte at the peak must have exactly one role.
//!
//! Skipped (with a message) when `../shared/traces` is absent.

use reservoir::sim::DEFAULT_CAPACITY;
use reservoir_replay::input::{self, AddressKind};
use reservoir_replay::replay::explain::explain;
use reservoir_replay::replay::recorded::{convert, replay_recorded};
use reservoir_replay::replay::roles::{Basis, Role, Roles};
use reservoir_replay::replay::ReplayOptions;
use reservoir_replay::torch_release::recorded_setting_as;
use reservoir_testkit::traces::shared_trace;

const GIB: u64 = 1 << 30;

#[test]
fn a_real_full_step_has_optimizer_state_gradients_and_activations() {
    let rel = "cs336-kkaitlyn111/332e0bb4_memory_ctx128_fullstep_.pickle";
    let Some(path) = shared_trace(rel) else {
        eprintln!("skipped: ../shared/traces/{rel} not found (set RESERVOIR_TRACES)");
        return;
    };
    let loaded = input::load(&path).unwrap();
    let input = loaded.to_trace_input();
    let (setting, _) = recorded_setting_as(&loaded, &input, None);
    let config = setting.allocator_config().unwrap();
    let dev = &input.devices[0];
    let rec = convert(dev, &config, input.addresses == AddressKind::Synthetic).unwrap();
    let options = ReplayOptions {
        capacity: rec.capacity.unwrap_or(DEFAULT_CAPACITY),
        ..ReplayOptions::default()
    };
    let (report, _) = replay_recorded(&rec, &setting, &options, false, &mut |_| {}).unwrap();
    let ex = explain(
        &rec.trace,
        Some(&rec.start),
        &setting,
        &options,
        &report,
        &rec.sites,
        &[],
    )
    .unwrap();
    let peak = ex.peak.expect("a peak");
    eprintln!("roles at the peak (op {}): {:?}", peak.op, peak.roles);
    eprintln!("by basis: {:?}", peak.role_basis);
    // Every live byte has one role.
    assert_eq!(peak.roles.values().sum::<u64>(), peak.allocated);
    assert_eq!(peak.roles.len(), Role::ALL.len());
    // The 2 x 13 GB AdamW moments of this model and its gradients.
    assert!(peak.roles["optimizer_state"] > 20 * GIB, "{:?}", peak.roles);
    assert!(peak.roles["gradients"] > 5 * GIB, "{:?}", peak.roles);
    // The peak is in AdamW's first step, after backward: no activation is
    // live. The parameters were allocated before the recording began (no
    // frames here): other, by lifetime; each has a gradient of its size.
    assert_eq!(peak.roles["activations"], 0);
    let params = peak.role_basis["other"].lifetime;
    let grads = peak.roles["gradients"];
    assert!(params.abs_diff(grads) < grads / 100, "{params} vs {grads}");
    // Every allocation of the trace was made under a telling frame: none
    // is decided by the lifetime alone.
    let roles = Roles::classify(&rec.trace, &rec.sites);
    let mut lifetime_only = 0;
    let mut activations = 0;
    for op in &rec.trace.ops {
        if let reservoir_replay::oracle_trace::Op::Alloc { id, bytes, .. } = op {
            let (role, basis) = roles.role(*id);
            if basis == Basis::Lifetime {
                lifetime_only += bytes;
            }
            if role == Role::Activations {
                activations += bytes;
            }
        }
    }
    eprintln!("lifetime only {lifetime_only} B, activations made {activations} B");
    assert!(activations > GIB);
}
