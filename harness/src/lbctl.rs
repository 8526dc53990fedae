//! The real `lbctl` against one `lbd`'s API socket, and waiting for that `lbd` to answer.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// How long `lbd` may take to come up (load, attach, restore), and to exit after a signal.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
pub const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The `lbctl` binary aimed at one `lbd`'s API socket.
pub struct Lbctl {
    pub(crate) bin: PathBuf,
    pub(crate) api: PathBuf,
}

impl Lbctl {
    /// `bin` against the API socket `api`.
    pub fn new(bin: impl Into<PathBuf>, api: impl Into<PathBuf>) -> Lbctl {
        Lbctl { bin: bin.into(), api: api.into() }
    }

    /// Runs `lbctl` with `args`.
    pub fn output(&self, args: &[&str]) -> Result<Output> {
        Command::new(&self.bin).arg("--api").arg(&self.api).args(args).output().with_context(|| format!("running lbctl {}", args.join(" ")))
    }

    /// Runs `lbctl` and returns its stdout; fails with its stderr on a non-zero exit.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let out = self.output(args)?;
        ensure!(out.status.success(), "lbctl {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `lbctl ... -o json` and parses the output.
    pub fn json(&self, args: &[&str]) -> Result<serde_json::Value> {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        let out = self.run(&full)?;
        serde_json::from_str(&out).with_context(|| format!("lbctl {} printed non-JSON: {out}", args.join(" ")))
    }

    /// Waits until the `lbd` just spawned answers on the API; fails with its log (`log`)
    /// when it exits first (`running`) or takes longer than [`START_TIMEOUT`].
    pub fn wait_for_lbd(&self, running: &dyn Fn() -> bool, log: &dyn Fn() -> String) -> Result<()> {
        let started = Instant::now();
        loop {
            if !running() {
                bail!("lbd exited while starting:\n{}", log());
            }
            if self.api.exists() && self.output(&["vips", "list"]).is_ok_and(|o| o.status.success()) {
                return Ok(());
            }
            if started.elapsed() > START_TIMEOUT {
                bail!("lbd did not answer within {START_TIMEOUT:?}:\n{}", log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
