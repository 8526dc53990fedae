//! `cargo xtask test`: the lints and every test, the command CI runs.
//!
//! `cargo test` runs its test binaries one after another, and most of the suite's time is
//! spent waiting (health intervals, BGP sessions, timeouts), not computing. So the binaries
//! are built once (`binaries`), then run side by side, the longest first and some with more
//! test threads than cores (`plan`, `schedule`); each one's output is kept and shown when it
//! ends, and a table of them closes the run (`summary`). Like `cargo test --no-fail-fast`,
//! every binary runs and the task fails at the end if one did. Plain `cargo test` still runs
//! the same tests, one binary at a time.

mod binaries;
mod plan;
mod schedule;
mod summary;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};

/// `cargo <args>`, said on the terminal.
fn cargo(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO"));
    command.args(args);
    println!("+ cargo {}", args.join(" "));
    command
}

fn run_cargo(command: &mut Command) -> Result<()> {
    let status = command.status()?;
    ensure!(status.success(), "{command:?} failed ({status})");
    Ok(())
}

pub fn run() -> Result<()> {
    run_cargo(&mut cargo(&["fmt", "--all", "--check"]))?;
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let xtask = std::env::current_exe().context("this task's own executable, to run the fuzz targets")?;
    let jobs = plan::jobs(binaries::build()?, &workspace, xtask);
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace.join("target"));
    let started = Instant::now();
    let outcomes = schedule::run(jobs, plan::AT_ONCE, &target.join("xtask-test"))?;
    summary::print(&outcomes, started.elapsed());
    let failed: Vec<&str> = outcomes.iter().filter(|o| !o.passed()).map(|o| o.name.as_str()).collect();
    if !failed.is_empty() {
        bail!("{} of {} jobs failed: {}", failed.len(), outcomes.len(), failed.join(", "));
    }
    Ok(())
}
