//! A 60-second chaos soak of the fleet (`spillway_harness::soak`): a fixed seed's schedule
//! of backend changes, rules, files, flapping servers, restarted agents and SIGKILLed
//! `lbd`s, BIRDs and balancers, under streams and a connection-per-request load, every
//! invariant checked. `cargo xtask soak --seed S --minutes N` runs any seed for longer.

use std::time::Duration;

use spillway_harness::cluster::Binaries;
use spillway_harness::soak::{self, SoakConfig};

/// Fixed, so a failure here replays with `cargo xtask soak --seed 2026 --minutes 1`.
const SEED: u64 = 2026;

#[test]
fn a_minute_of_seeded_chaos_keeps_every_invariant() {
    let bins = Binaries::beside(env!("CARGO_BIN_EXE_lbd"));
    println!("soak seed {SEED}");
    let report = soak::run(bins, &SoakConfig::new(SEED, Duration::from_secs(60))).unwrap_or_else(|e| panic!("{e:#}"));
    println!("{report}");
    assert!(report.steps >= 5, "too few steps to prove anything: {report}");
    assert!(report.requests.ok > 0 && report.stream_pings > 0, "{report}");
}
