//! A fleet of balancers on real routing: a router running BIRD learns the VIP from every
//! balancer's BIRD over BGP and spreads clients over them with ECMP (L4 hashing); each
//! balancer runs the real `lbd`, backends run `lbd agent` (see `spillway_harness::fleet`).
//! Timings are printed, not asserted: bounds here are generous and only where correctness
//! needs one, or where the time is the feature (BFD's sub-second failover, `bfd.rs`).
//! Needs root and BIRD 2 (`./x setup` installs bird2).

mod announce;
mod bfd;
mod failover;
mod ipv6;
mod loops;
mod second_chance;
mod slow_start;
mod soak;
mod support;
mod tables;
