//! `cargo xtask soak --minutes N --seed S`: the seeded chaos soak of a fleet
//! (`spillway_harness::soak`), with the `lbd` the tests run. A failure prints its seed and
//! step; the same seed replays the same schedule.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use clap::Args;
use spillway_harness::soak::{self, SoakConfig};

#[derive(Args)]
pub struct SoakArgs {
    /// How long steps are started for.
    #[arg(long, default_value_t = 30)]
    minutes: u64,
    /// The schedule's seed [default: from the clock, printed].
    #[arg(long)]
    seed: Option<u64>,
}

pub fn run(args: &SoakArgs) -> Result<()> {
    let bins = crate::bins::build(false)?;
    let seed = args.seed.unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64));
    println!("soak: seed {seed}, {} minutes", args.minutes);
    let report = soak::run(bins, &SoakConfig::new(seed, Duration::from_secs(args.minutes * 60)))?;
    println!("{report}");
    Ok(())
}
