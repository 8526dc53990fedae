//! Spillway's userspace: the data-plane loader, the reconciler that turns desired state into
//! map updates, the daemon (`lbd`) and the CLI (`lbctl`). The binaries are thin wrappers.

pub mod dataplane;
pub mod model;
pub mod objects;
pub mod reconcile;
