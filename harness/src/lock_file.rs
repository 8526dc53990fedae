//! Locks that the machine's test processes share: `flock(2)` on files in one directory under
//! /run. `cargo xtask test` runs test binaries side by side, so what must happen one at a time
//! (or not beside something else) must be agreed across processes, not only between threads.
//! A process that dies releases its locks with its file descriptors: a killed run leaves
//! nothing held.

use std::fs::{File, OpenOptions};
use std::path::Path;

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::fcntl::Flock;
/// Shared or exclusive.
pub(crate) use nix::fcntl::FlockArg as How;

/// Where the lock files live.
pub(crate) const LOCK_DIR: &str = "/run/spillway-harness";

/// Opens (creating) `dir/name` and locks it `how`, waiting as long as it takes. Every call
/// opens the file anew, so two calls of one process exclude each other as two processes would.
pub(crate) fn lock(dir: &Path, name: &str, how: How) -> Result<Flock<File>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    let mut file =
        OpenOptions::new().create(true).truncate(false).write(true).open(&path).with_context(|| format!("opening {}", path.display()))?;
    loop {
        match Flock::lock(file, how) {
            Ok(locked) => return Ok(locked),
            Err((back, Errno::EINTR)) => file = back,
            Err((_, errno)) => return Err(errno).with_context(|| format!("locking {}", path.display())),
        }
    }
}
