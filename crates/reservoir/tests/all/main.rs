//! One integration test binary, a module per area (spec sections cited in each test).

mod async_sim;
mod common;
mod device_allocator;
mod errors;
mod expandable;
mod faults;
mod heap;
mod heap_model;
mod model;
mod observe;
mod policy_reservoir;
mod pools;
mod private_pool_stats;
mod rules;
mod shards;
mod shards_stress;
mod streams;
mod teardown;
