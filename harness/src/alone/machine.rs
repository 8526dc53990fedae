//! The gate of [`super`] across processes (`crate::lock_file`): a test that measures rates
//! must also wait for the topologies of other test binaries. Every topology holds a shared
//! lock on one file, a test that runs alone an exclusive one.
//!
//! flock lets new shared holders in while an exclusive one waits, so a busy binary could
//! keep a lone test waiting until it ends. A second file is the turnstile: a shared holder
//! passes it on the way in, a lone test keeps it, and newcomers queue behind the lone test.

use std::fs::File;
use std::path::Path;

use anyhow::Result;
use nix::fcntl::Flock;

use crate::lock_file::{How, lock};

/// Held while a topology exists or a test runs alone; dropping it unlocks.
#[derive(Debug)]
pub(super) struct MachineLock {
    _locks: Vec<Flock<File>>,
}

/// Waits while a test of another process runs alone (or waits to), then holds the machine
/// shared.
pub(super) fn shared(dir: &Path) -> Result<MachineLock> {
    let turnstile = lock(dir, "alone-turnstile", How::LockExclusive)?;
    let machine = lock(dir, "alone-machine", How::LockShared)?;
    drop(turnstile);
    Ok(MachineLock { _locks: vec![machine] })
}

/// Waits until no topology of any process exists, and keeps new ones from being built
/// until dropped.
pub(super) fn exclusive(dir: &Path) -> Result<MachineLock> {
    let turnstile = lock(dir, "alone-turnstile", How::LockExclusive)?;
    let machine = lock(dir, "alone-machine", How::LockExclusive)?;
    Ok(MachineLock { _locks: vec![machine, turnstile] })
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::TempDir;

    /// Two open files of one lock conflict like two processes would: a lone holder waits for
    /// the shared one, and a shared holder that comes after the lone one queues behind it.
    #[test]
    fn a_lone_holder_waits_for_shared_ones_and_newcomers_wait_for_it() {
        let dir = TempDir::new("machine-lock");
        let first = shared(dir.path()).unwrap();
        let (lone_tx, lone_rx) = mpsc::channel();
        let (path, lone_path) = (dir.path().to_owned(), dir.path().to_owned());
        let lone = std::thread::spawn(move || {
            let held = exclusive(&lone_path).unwrap();
            lone_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        assert!(lone_rx.recv_timeout(Duration::from_millis(300)).is_err(), "the lone holder did not wait for the shared one");
        let (late_tx, late_rx) = mpsc::channel();
        let late = std::thread::spawn(move || {
            let held = shared(&path).unwrap();
            late_tx.send(()).unwrap();
            drop(held);
        });
        assert!(late_rx.recv_timeout(Duration::from_millis(300)).is_err(), "a newcomer passed the waiting lone holder");
        drop(first);
        lone_rx.recv_timeout(Duration::from_secs(5)).expect("the lone holder gets the machine once the shared one is gone");
        assert!(late_rx.try_recv().is_err(), "a newcomer came in while the lone holder held the machine");
        late_rx.recv_timeout(Duration::from_secs(5)).expect("the newcomer comes in after the lone holder");
        lone.join().unwrap();
        late.join().unwrap();
    }
}
