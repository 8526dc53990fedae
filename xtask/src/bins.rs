//! `lbd` and `lbctl`, built for the tasks that run them.

use std::{path::PathBuf, process::Command};

use anyhow::{Result, ensure};
use spillway_harness::cluster::Binaries;

/// Builds `lbd` and `lbctl` (`release`: optimized, as deployed) and returns their paths.
pub fn build(release: bool) -> Result<Binaries> {
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "--quiet", "-p", "spillway-loader", "--bins"]);
    if release {
        cargo.arg("--release");
    }
    ensure!(cargo.status()?.success(), "building lbd and lbctl failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join(if release { "release" } else { "debug" });
    Ok(Binaries { lbd: dir.join("lbd"), lbctl: dir.join("lbctl") })
}
