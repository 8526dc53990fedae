//! The binaries a task runs, built by the task itself: `lbd` and `lbctl`, and the harness's
//! servers (`spillway-echo`, `spillway-capacity`) that a cluster starts on its backends. A
//! task must work on a clean clone, before any test has built anything.

use std::{path::PathBuf, process::Command};

use anyhow::{Result, ensure};
use spillway_harness::cluster::Binaries;

/// Builds `lbd` and `lbctl` (`release`: optimized, as deployed) and the harness's servers,
/// and returns the paths of the first two. The servers are built in this task's own
/// profile: the harness finds them next to the running executable.
pub fn build(release: bool) -> Result<Binaries> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let own_profile_release = cfg!(not(debug_assertions));
    cargo_build(&["-p", "spillway-harness", "--bins"], own_profile_release)?;
    cargo_build(&["-p", "spillway-daemon", "-p", "spillway-cli", "--bins"], release)?;
    let dir = target.join(if release { "release" } else { "debug" });
    Ok(Binaries { lbd: dir.join("lbd"), lbctl: dir.join("lbctl") })
}

fn cargo_build(what: &[&str], release: bool) -> Result<()> {
    let mut cargo = Command::new(env!("CARGO"));
    cargo.args(["build", "--quiet"]).args(what);
    if release {
        cargo.arg("--release");
    }
    ensure!(cargo.status()?.success(), "cargo build {} failed", what.join(" "));
    Ok(())
}
