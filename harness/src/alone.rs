//! Tests that measure rates against what the machine can do (goodput, load) run alone: a
//! topology that another test builds meanwhile waits for them to end, and they wait for the
//! topologies built before them to go. Their figures then depend on the machine, not on
//! which other test happened to share its two cores.
//!
//! The gate works inside the test binary (threads) and across the binaries that run at the
//! same time (`cargo xtask test` runs them side by side, see [`machine`]).

mod machine;

use std::cell::Cell;
use std::path::Path;
use std::sync::{Condvar, Mutex, MutexGuard};

use anyhow::Result;

use machine::MachineLock;

/// Topologies alive in this process, and whether a test runs alone.
#[derive(Debug)]
struct Gate {
    state: Mutex<(usize, bool)>,
    changed: Condvar,
    /// The lock files shared with other processes; `None` gates this process only.
    machine: Option<&'static str>,
}

static GATE: Gate = Gate::new(Some(crate::lock_file::LOCK_DIR));

thread_local! {
    /// This thread's test runs alone: its own topologies do not wait for it.
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

impl Gate {
    const fn new(machine: Option<&'static str>) -> Gate {
        Gate { state: Mutex::new((0, false)), changed: Condvar::new(), machine }
    }

    fn lock(&self) -> MutexGuard<'_, (usize, bool)> {
        // A test that panicked while holding the lock changed nothing half-way.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wait_while(
        &self,
        guard: MutexGuard<'static, (usize, bool)>,
        busy: impl Fn(&(usize, bool)) -> bool,
    ) -> MutexGuard<'static, (usize, bool)> {
        self.changed.wait_while(guard, |state| busy(state)).unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn alone(&'static self) -> Result<Alone> {
        let mut state = self.wait_while(self.lock(), |(_, alone)| *alone);
        state.1 = true;
        drop(self.wait_while(state, |(shared, _)| *shared > 0));
        // Guards first: an error below lets the other tests of this process go on.
        let mut guard = Alone { gate: self, _machine: None };
        ALONE.with(|a| a.set(true));
        guard._machine = self.machine.map(|dir| machine::exclusive(Path::new(dir))).transpose()?;
        Ok(guard)
    }

    fn shared(&'static self) -> Result<Shared> {
        if ALONE.with(|a| a.get()) {
            return Ok(Shared { gate: None, _machine: None });
        }
        let mut state = self.wait_while(self.lock(), |(_, alone)| *alone);
        state.0 += 1;
        drop(state);
        let mut guard = Shared { gate: Some(self), _machine: None };
        guard._machine = self.machine.map(|dir| machine::shared(Path::new(dir))).transpose()?;
        Ok(guard)
    }
}

/// Held while a test runs alone (see the module docs).
pub struct Alone {
    gate: &'static Gate,
    _machine: Option<MachineLock>,
}

/// Waits until no other test's topology exists, in this process or another, then keeps
/// others from building one until the returned guard is dropped. Panics if the lock files
/// under /run cannot be used: for tests, which run as root.
pub fn alone() -> Alone {
    GATE.alone().unwrap_or_else(|err| panic!("running alone: {err:#}"))
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE.with(|a| a.set(false));
        self.gate.lock().1 = false;
        self.gate.changed.notify_all();
    }
}

/// Held by every topology, and by whatever else loads the machine meanwhile (`cargo xtask
/// test` holds one while it compiles beside the tests); waits while a test of another thread
/// or process runs alone.
#[derive(Debug)]
pub struct Shared {
    /// The gate that counts it; `None` for a topology of the thread that runs alone.
    gate: Option<&'static Gate>,
    _machine: Option<MachineLock>,
}

/// Waits while a test of another thread or process runs alone, then keeps tests from
/// running alone until the returned guard is dropped.
pub fn shared() -> Result<Shared> {
    GATE.shared()
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(gate) = self.gate {
            gate.lock().0 -= 1;
            gate.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;

    /// A topology of another thread waits while a test runs alone, and one of the same thread
    /// does not; the test that wants to run alone waits for the topologies already there.
    /// (This process only: [`machine`] has its own test.)
    #[test]
    fn a_test_that_runs_alone_shares_the_machine_with_no_other() {
        static GATE: Gate = Gate::new(None);
        static BUILT: AtomicBool = AtomicBool::new(false);
        let earlier = GATE.shared().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let lone = std::thread::spawn(move || {
            let guard = GATE.alone().unwrap();
            tx.send(()).unwrap();
            // Its own topologies are not held up.
            drop(GATE.shared().unwrap());
            std::thread::sleep(Duration::from_millis(300));
            assert!(!BUILT.load(Ordering::SeqCst), "another thread's topology was built while a test ran alone");
            drop(guard);
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a test ran alone beside a topology");
        drop(earlier);
        rx.recv_timeout(Duration::from_secs(5)).expect("the lone test starts once the topology is gone");
        let other = std::thread::spawn(|| {
            let _topology = GATE.shared().unwrap();
            BUILT.store(true, Ordering::SeqCst);
        });
        lone.join().unwrap();
        other.join().unwrap();
        assert!(BUILT.load(Ordering::SeqCst));
    }
}
