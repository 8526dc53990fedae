//! Spillway's userspace: the data-plane loader, the reconciler that turns desired state into
//! map updates, the daemon (`lbd`) and the CLI (`lbctl`). The binaries are thin wrappers.

pub mod agent;
pub mod announce;
pub mod api;
pub mod cli;
pub mod daemon;
pub mod dataplane;
pub mod docs;
pub mod errors;
pub mod forwarding;
pub mod logging;
pub mod map_batch;
pub mod metrics;
pub mod neighbours;
pub mod netif;
pub mod objects;
pub mod pins;
pub mod ports;
pub mod probe;
pub mod reconcile;
pub mod rtnl;
pub mod store;
pub mod tx_drops;
pub mod vip_path;
pub mod wall_clock;

#[cfg(test)]
mod testing;
