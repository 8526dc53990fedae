//! Named network namespaces, and running commands, closures and daemons inside them.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use nix::sched::{CloneFlags, setns};

use crate::cmd;
use crate::process::{Daemon, Registry};

/// Where `ip netns add` bind-mounts named namespaces.
pub(crate) const NETNS_DIR: &str = "/run/netns";

/// A named network namespace (`/run/netns/<name>`), deleted on drop.
///
/// Deleting the namespace also destroys the veth ends inside it, which takes
/// their peers with them, so nothing is left in any other namespace.
#[derive(Debug)]
pub struct Netns {
    label: String,
    name: String,
    path: PathBuf,
    registry: Arc<Registry>,
}

impl Netns {
    /// Creates namespace `name`; `label` is the short name used in logs ("b1").
    pub(crate) fn create(label: &str, name: String, registry: Arc<Registry>) -> Result<Netns> {
        cmd::run(Command::new("ip").args(["netns", "add", &name])).with_context(|| format!("creating namespace for {label}"))?;
        Ok(Netns { label: label.to_owned(), path: Path::new(NETNS_DIR).join(&name), name, registry })
    }

    /// The short name used in logs and errors, e.g. `b1` or `br`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The namespace's name as `ip netns list` shows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace file, for `nsenter --net=` or `setns(2)`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A command that runs `program` inside this namespace.
    ///
    /// Uses `nsenter --net=` rather than `ip netns exec`: the latter also
    /// remounts /sys in a private mount namespace, which hides the host's
    /// /sys/fs/bpf where the balancer pins its maps.
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path.display())).arg("--").arg(program);
        cmd
    }

    /// Runs `args` (program first) inside the namespace to completion and
    /// returns its stdout; fails on a non-zero exit, naming the command.
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<String> {
        let Some((program, rest)) = args.split_first() else {
            bail!("empty command for {}", self.label);
        };
        cmd::run(self.cmd(program).args(rest)).with_context(|| format!("in {}", self.label))
    }

    /// Runs `f` on a fresh thread that has first joined this namespace, and
    /// returns its result. Sockets created by `f` belong to the namespace and
    /// keep working from any thread afterwards.
    ///
    /// A panic in `f` is re-raised here, so assertions inside work as usual.
    pub fn in_netns<T, F>(&self, f: F) -> T
    where
        F: FnOnce() -> T + Send,
        T: Send,
    {
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name(format!("netns-{}", self.label))
                .spawn_scoped(scope, || {
                    if let Err(err) = self.enter() {
                        panic!("{err:#}");
                    }
                    f()
                })
                .expect("spawning a thread");
            thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Sets `key` (dotted, as for `sysctl`) to `value` inside the namespace.
    ///
    /// Writes /proc/sys from a thread inside the namespace: /proc/sys/net
    /// follows the writing thread's namespace, and this needs no `sysctl`
    /// binary.
    /// MAC address of interface `dev` in this namespace.
    pub fn mac(&self, dev: &str) -> Result<[u8; 6]> {
        let out = self.run(&["ip", "-o", "link", "show", "dev", dev])?;
        let text = out.split("link/ether ").nth(1).and_then(|s| s.split_whitespace().next()).context("no MAC")?;
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(text.split(':')) {
            *byte = u8::from_str_radix(part, 16)?;
        }
        Ok(mac)
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        let file = Path::new("/proc/sys").join(key.replace('.', "/"));
        self.in_netns(|| std::fs::write(&file, value)).with_context(|| format!("sysctl {key}={value} in {}", self.label))
    }

    /// Starts a long-running process inside the namespace; `args` is the
    /// program and its arguments. Output goes to a log file in the topology's
    /// temporary directory. See [`Daemon`].
    pub fn spawn<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<Daemon> {
        let Some((program, rest)) = args.split_first() else {
            bail!("empty command for {}", self.label);
        };
        let program = Path::new(program);
        let label = program.file_name().unwrap_or(program.as_os_str());
        let mut cmd = self.cmd(program);
        cmd.args(rest);
        self.spawn_command(&label.to_string_lossy(), cmd)
    }

    /// Like [`Netns::spawn`] for a command built with [`Netns::cmd`], e.g.
    /// to set environment variables; `label` names its log file.
    pub fn spawn_command(&self, label: &str, cmd: Command) -> Result<Daemon> {
        self.registry.spawn(&format!("{}-{label}", self.label), cmd).with_context(|| format!("in {}", self.label))
    }

    fn enter(&self) -> Result<()> {
        let file = File::open(&self.path).with_context(|| format!("opening {} for {}", self.path.display(), self.label))?;
        setns(&file, CloneFlags::CLONE_NEWNET).with_context(|| format!("entering namespace of {}", self.label))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(err) = cmd::run(Command::new("ip").args(["netns", "del", &self.name])) {
            eprintln!("spillway-harness: cannot delete namespace: {err:#}");
        }
    }
}
