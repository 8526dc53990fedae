//! Long-running processes (balancer daemon, echo servers) owned by a topology.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::cmd::command_line;

/// How long a daemon gets to exit after SIGTERM before it is SIGKILLed.
const TERM_GRACE: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(10);

/// Every process a topology started, so that dropping the topology stops the
/// ones whose [`Daemon`] guard is still alive elsewhere (or was leaked).
#[derive(Debug)]
pub(crate) struct Registry {
    log_dir: PathBuf,
    next_log: AtomicUsize,
    procs: Mutex<Vec<Arc<Proc>>>,
}

impl Registry {
    pub(crate) fn new(log_dir: PathBuf) -> Registry {
        Registry { log_dir, next_log: AtomicUsize::new(1), procs: Mutex::new(Vec::new()) }
    }

    /// Starts `cmd` with stdout and stderr in a fresh log file named after `label`.
    pub(crate) fn spawn(&self, label: &str, mut cmd: Command) -> Result<Daemon> {
        let seq = self.next_log.fetch_add(1, Ordering::Relaxed);
        let log_path = self.log_dir.join(format!("{label}-{seq}.log"));
        let log = File::create(&log_path).with_context(|| format!("creating log file {}", log_path.display()))?;
        let line = command_line(&cmd);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("duplicating log file handle")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawning `{line}`"))?;
        let proc = Arc::new(Proc { pid: child.id(), child: Mutex::new(child) });
        lock(&self.procs).push(Arc::clone(&proc));
        Ok(Daemon { proc, line, log_path })
    }

    /// Stops every process still running (SIGTERM, then SIGKILL).
    pub(crate) fn stop_all(&self) {
        for proc in lock(&self.procs).drain(..) {
            proc.stop();
        }
    }
}

/// The child plus its pid, shared between the [`Daemon`] guard and the
/// [`Registry`]. The child is only reaped under the lock, so while
/// `try_wait` says it is running its pid cannot have been reused, and
/// signalling it is safe.
#[derive(Debug)]
struct Proc {
    pid: u32,
    child: Mutex<Child>,
}

impl Proc {
    fn exit_status(&self) -> Result<Option<ExitStatus>> {
        lock(&self.child).try_wait().with_context(|| format!("waiting for pid {}", self.pid))
    }

    fn signal(&self, signal: Signal) -> Result<()> {
        let mut child = lock(&self.child);
        if let Some(status) = child.try_wait()? {
            bail!("cannot send {signal} to pid {}: it already exited ({status})", self.pid);
        }
        kill(pid_of(&child), signal).with_context(|| format!("sending {signal} to pid {}", self.pid))
    }

    fn wait_with_timeout(&self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exit_status()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGTERM, then SIGKILL after [`TERM_GRACE`]. Runs from `Drop`, so
    /// failures are printed, not returned.
    fn stop(&self) {
        // Signalling fails only if the process exited meanwhile, which is the
        // goal anyway. SIGCONT because a SIGSTOPped process (fault tests)
        // cannot act on SIGTERM.
        let _ = self.signal(Signal::SIGTERM).and_then(|()| self.signal(Signal::SIGCONT));
        if let Ok(Some(_)) = self.wait_with_timeout(TERM_GRACE) {
            return;
        }
        let mut child = lock(&self.child);
        if let Err(err) = child.kill().and_then(|()| child.wait()) {
            eprintln!("spillway-harness: cannot kill pid {}: {err}", self.pid);
        }
    }
}

/// A process started by [`crate::Netns::spawn`]; stopped (SIGTERM, up to 2 s,
/// then SIGKILL) when dropped, or when its topology is dropped.
#[derive(Debug)]
pub struct Daemon {
    proc: Arc<Proc>,
    line: String,
    log_path: PathBuf,
}

impl Daemon {
    /// The process id (of the program itself: `nsenter` execs it).
    pub fn pid(&self) -> u32 {
        self.proc.pid
    }

    /// Sends `signal`, e.g. SIGKILL, SIGSTOP or SIGCONT in fault tests.
    /// Fails if the process has already exited.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        self.proc.signal(signal)
    }

    /// Whether the process has not exited yet (a SIGSTOPped one still counts
    /// as running).
    pub fn is_running(&self) -> bool {
        matches!(self.proc.exit_status(), Ok(None))
    }

    /// Waits up to `timeout` for the process to exit; `None` if it is still
    /// running then.
    pub fn wait_with_timeout(&self, timeout: Duration) -> Result<Option<ExitStatus>> {
        self.proc.wait_with_timeout(timeout)
    }

    /// The file holding the process's stdout and stderr. It lives in the
    /// topology's temporary directory, so it is gone once the topology is.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The output so far (stdout and stderr interleaved), for failure messages.
    pub fn log(&self) -> String {
        std::fs::read(&self.log_path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_else(|err| format!("<cannot read {}: {err}>", self.log_path.display()))
    }

    /// Waits up to `timeout` for a line of output containing `needle` (e.g.
    /// "ready"). Fails early if the process exits first; the error carries
    /// the log.
    pub fn wait_for_output(&self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.log().lines().any(|line| line.contains(needle)) {
                return Ok(());
            }
            if let Some(status) = self.proc.exit_status()? {
                bail!("`{}` exited ({status}) before printing {needle:?}; output:\n{}", self.line, self.log());
            }
            if Instant::now() >= deadline {
                bail!("`{}` did not print {needle:?} within {timeout:?}; output:\n{}", self.line, self.log());
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.proc.stop();
    }
}

fn pid_of(child: &Child) -> Pid {
    Pid::from_raw(i32::try_from(child.id()).expect("pids fit in i32"))
}

/// Locks `mutex`, ignoring poisoning: a test that panicked while holding it
/// must not stop cleanup from running.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A binary of this crate (`name`): `$env` when set, else the one cargo built next to the
/// running test (`target/<profile>/`, one level above `deps/`).
pub fn harness_binary(name: &str, env: &str) -> Result<std::path::PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(std::path::PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating the running executable")?;
    let candidates = exe.ancestors().skip(1).take(2).map(|dir| dir.join(name));
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!("{name} not found near {}; build it with `cargo build -p spillway-harness --bins` or set {env}", exe.display())
}
