//! `cargo xtask test`: the lints and every test, the command CI runs.

use std::process::Command;

use anyhow::{Result, ensure};

fn cargo(args: &[&str]) -> Result<()> {
    println!("+ cargo {}", args.join(" "));
    let status = Command::new(env!("CARGO")).args(args).status()?;
    ensure!(status.success(), "cargo {} failed ({status})", args.join(" "));
    Ok(())
}

pub fn run() -> Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    // The default members: every host crate. xdp-ebpf builds only for the BPF target, through
    // the loader's build script.
    cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
    cargo(&["test", "--no-fail-fast"])
}
