//! # Reservoir testkit
//!
//! Test support shared by the crates of the workspace (not published):
//!
//! * [`conformance`]: stream-safety scenarios that drive a
//!   [`CachingAllocator`](reservoir::CachingAllocator) over any backend with
//!   the [`DeviceWork`](reservoir::backend::DeviceWork) and
//!   [`Memcpy`](reservoir::backend::Memcpy) capabilities;
//! * [`faults`]: a backend wrapper that fails the N-th call of any entry
//!   point, and the fault-injection workload and sweep run over it, for
//!   the caching allocator and the MPS heap allocator;
//! * [`traces`]: the one locator of the real traces in `../shared/traces`
//!   and of the oracle (skipping a test without it);
//! * [`run`]: a workspace binary run in a test;
//! * the workspace's one seeded generator and one checksum live in the
//!   allocator library ([`reservoir::rng::SplitMix64`],
//!   [`reservoir::checksum`]), below every crate that uses them.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
pub mod faults;
pub mod run;
pub mod traces;
