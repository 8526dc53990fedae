//! Removing what killed earlier runs left behind.
//!
//! Everything the harness creates is named `spw-<pid>-<seq>[-<host>]`, where
//! `<pid>` is the test process. An entry whose `<pid>` is no longer running
//! belongs to a run that died without unwinding (SIGKILL, abort, power
//! cut); entries of live processes, including concurrent test binaries, are
//! never touched.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::bpffs::BPFFS_ROOT;
use crate::cmd;
use crate::netns::NETNS_DIR;

/// Prefix of every namespace, pin directory and temporary directory.
pub(crate) const NAME_PREFIX: &str = "spw-";

/// Deletes leftover namespaces (killing processes still inside them, such
/// as echo servers of the dead run), bpffs pin directories and temporary
/// directories whose owning process is gone. Tries every entry and reports
/// all failures together.
pub fn sweep_stale() -> Result<()> {
    let mut failures = Vec::new();
    for netns in stale_entries(Path::new(NETNS_DIR))? {
        if let Err(err) = delete_netns(&netns) {
            failures.push(format!("{err:#}"));
        }
    }
    for root in [Path::new(BPFFS_ROOT), &std::env::temp_dir()] {
        for dir in stale_entries(root)? {
            if let Err(err) = std::fs::remove_dir_all(&dir) {
                failures.push(format!("removing {}: {err}", dir.display()));
            }
        }
    }
    if !failures.is_empty() {
        bail!("cannot remove stale test leftovers: {}", failures.join("; "));
    }
    Ok(())
}

/// Entries of `dir` named `spw-<pid>-...` whose `<pid>` is not running.
fn stale_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err).with_context(|| format!("listing {}", dir.display())),
    };
    let mut stale = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        if owner_pid(&name.to_string_lossy()).is_some_and(|pid| !is_running(pid)) {
            stale.push(entry.path());
        }
    }
    Ok(stale)
}

/// The `<pid>` of a name `spw-<pid>-<rest>`.
fn owner_pid(name: &str) -> Option<u32> {
    let (pid, _rest) = name.strip_prefix(NAME_PREFIX)?.split_once('-')?;
    pid.parse().ok()
}

fn is_running(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

fn delete_netns(path: &Path) -> Result<()> {
    let name = path.file_name().context("namespace path without a name")?.to_string_lossy();
    let pids = cmd::run(Command::new("ip").args(["netns", "pids", &name]))?;
    for pid in pids.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()) {
        // Best effort: the process may have exited since it was listed.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    cmd::run(Command::new("ip").args(["netns", "del", &name]))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn owner_pid_parses_harness_names_only() {
        assert_eq!(owner_pid("spw-1234-7-b1"), Some(1234));
        assert_eq!(owner_pid("spw-1234-7"), Some(1234));
        assert_eq!(owner_pid("spw-x-7"), None);
        assert_eq!(owner_pid("spw-1234"), None);
        assert_eq!(owner_pid("other-1234-7"), None);
    }
}
