//! # Reservoir replay
//!
//! The player: runs recorded and generated allocation sequences through the
//! [`reservoir`] caching allocator on a simulated device and measures what
//! it did. The allocator library itself compiles none of this.
//!
//! * [`replay`] is the replay engine: an oracle [`Trace`](oracle_trace::Trace)
//!   replayed once per setting into a [`ReplayReport`](replay::ReplayReport);
//!   [`replay::recorded`] replays a recorded PyTorch snapshot from its
//!   recorded start state and reports its fidelity.
//! * [`input`] reads the recorded files: PyTorch memory snapshots (every
//!   layout) and the other supported allocation logs, decoded into replay
//!   input; [`pickle`] is the hardened pickle reader it uses.
//! * [`placement`] finds the least memory any allocator that cannot move
//!   allocations could use for a trace (an offline placement and its
//!   bounds): the yardstick of the fragmentation tax.
//! * [`compare`] puts policies side by side on many inputs (`reservoir
//!   compare`).
//! * [`oracle_trace`] is the text trace format of the PyTorch oracle and the
//!   seeded golden-trace generator; [`workload`] generates the allocation
//!   sequences of realistic deep-learning programs.
//!
//! ```
//! use reservoir_replay::replay::{replay, ReplayOptions, ReplaySetting};
//! use reservoir_replay::workload;
//!
//! let trace = workload::generate("gpt-train:layers=2,steps=2").unwrap();
//! let setting = ReplaySetting::from_config("");
//! let report = replay(&trace, &setting, &ReplayOptions::default()).unwrap();
//! assert_eq!(report.ooms, 0);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod compare;
pub mod diff;
pub mod input;
pub mod oracle_trace;
pub mod pickle;
pub mod placement;
pub mod predict;
pub mod recorder;
pub mod replay;
pub mod torch_release;
pub mod workload;
