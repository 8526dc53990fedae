//! Spillway's userspace: the data-plane loader, the reconciler that turns desired state into
//! map updates, the daemon (`lbd`) and the CLI (`lbctl`). The binaries are thin wrappers.

pub mod agent;
pub mod announce;
pub mod cli;
pub mod daemon;
pub mod docs;
pub mod metrics;
pub mod store;
pub mod tx_drops;
pub mod wall_clock;

#[cfg(test)]
mod testing;
