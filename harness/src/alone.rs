//! Tests that measure rates against what the machine can do (goodput, load) run alone in
//! their test binary: a topology that another test builds meanwhile waits for them to end,
//! and they wait for the topologies built before them to go. Their figures then depend on
//! the machine, not on which other test happened to share its two cores.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Topologies alive in this process, and whether a test runs alone.
struct Gate {
    state: Mutex<(usize, bool)>,
    changed: Condvar,
}

static GATE: Gate = Gate { state: Mutex::new((0, false)), changed: Condvar::new() };

thread_local! {
    /// This thread's test runs alone: its own topologies do not wait for it.
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

impl Gate {
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
}

/// Held while a test runs alone (see the module docs).
pub struct Alone(());

/// Waits until no other test's topology exists, then keeps others from building one until
/// the returned guard is dropped.
pub fn alone() -> Alone {
    let mut state = GATE.wait_while(GATE.lock(), |(_, alone)| *alone);
    state.1 = true;
    drop(GATE.wait_while(state, |(shared, _)| *shared > 0));
    ALONE.with(|a| a.set(true));
    Alone(())
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE.with(|a| a.set(false));
        GATE.lock().1 = false;
        GATE.changed.notify_all();
    }
}

/// Held by every topology; waits while a test of another thread runs alone.
#[derive(Debug)]
pub(crate) struct Shared(bool);

pub(crate) fn shared() -> Shared {
    if ALONE.with(|a| a.get()) {
        return Shared(false);
    }
    let mut state = GATE.wait_while(GATE.lock(), |(_, alone)| *alone);
    state.0 += 1;
    Shared(true)
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.0 {
            GATE.lock().0 -= 1;
            GATE.changed.notify_all();
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
    #[test]
    fn a_test_that_runs_alone_shares_the_machine_with_no_other() {
        static BUILT: AtomicBool = AtomicBool::new(false);
        let earlier = shared();
        let (tx, rx) = std::sync::mpsc::channel();
        let lone = std::thread::spawn(move || {
            let guard = alone();
            tx.send(()).unwrap();
            // Its own topologies are not held up.
            drop(shared());
            std::thread::sleep(Duration::from_millis(300));
            assert!(!BUILT.load(Ordering::SeqCst), "another thread's topology was built while a test ran alone");
            drop(guard);
        });
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "a test ran alone beside a topology");
        drop(earlier);
        rx.recv_timeout(Duration::from_secs(5)).expect("the lone test starts once the topology is gone");
        let other = std::thread::spawn(|| {
            let _topology = shared();
            BUILT.store(true, Ordering::SeqCst);
        });
        lone.join().unwrap();
        other.join().unwrap();
        assert!(BUILT.load(Ordering::SeqCst));
    }
}
