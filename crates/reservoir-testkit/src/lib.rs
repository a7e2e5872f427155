//! # Reservoir testkit
//!
//! Test support shared by the crates of the workspace (not published):
//!
//! * [`conformance`]: stream-safety scenarios that drive a
//!   [`CachingAllocator`](reservoir::CachingAllocator) over any backend with
//!   the [`DeviceWork`](reservoir::backend::DeviceWork) and
//!   [`Memcpy`](reservoir::backend::Memcpy) capabilities;
//! * [`traces`]: the one locator of the real traces in `../shared/traces`;
//! * [`SplitMix64`], the workspace's one seeded generator (defined beside
//!   the golden-trace generator in `reservoir-replay`, which needs it), and
//!   the one checksum, [`reservoir::checksum`].
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
pub mod traces;

pub use reservoir_replay::oracle_trace::SplitMix64;
