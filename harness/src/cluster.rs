//! A running Spillway in a [`Topology`]: the real `lbd` on the balancer host, `lbd agent` on
//! every backend, echo servers, and the real `lbctl` to drive it. Used by the end-to-end
//! tests and the demo; the binaries' paths are passed in (tests get them from cargo).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use crate::lbctl::{Lbctl, START_TIMEOUT, STOP_TIMEOUT};
use crate::{Daemon, Host, Signal, Topology, TopologyConfig, ping, start_echo};

/// Port the echo servers listen on for TCP, and for UDP.
pub const TCP_PORT: u16 = 80;
pub const UDP_PORT: u16 = 5353;

/// Where the daemon's binaries are.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub lbd: PathBuf,
    pub lbctl: PathBuf,
}

impl Binaries {
    /// `lbd` (a test's `env!("CARGO_BIN_EXE_lbd")`) and `lbctl` beside it. `lbctl` is another
    /// package's binary (`spillway-cli`, which links no kernel code), so cargo names no path
    /// for it in `spillway-daemon`'s tests; `cargo test` of the workspace and `./x test` build
    /// it into the same directory.
    pub fn beside(lbd: &str) -> Binaries {
        let lbd = PathBuf::from(lbd);
        let lbctl = lbd.with_file_name("lbctl");
        assert!(lbctl.exists(), "{} is missing: build it first (cargo build -p spillway-cli)", lbctl.display());
        Binaries { lbd, lbctl }
    }
}

/// Writes a fresh random report key (`lbd --report-key`, `lbd agent --report-key`) to
/// `path`, root's alone (mode 0600), as an operator would with `head -c 32 /dev/urandom`.
pub fn write_report_key(path: &Path) -> Result<()> {
    use std::io::Read;
    let mut secret = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut secret)?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    write_secret_file(path, &hex)
}

/// Writes `text` and a newline to a new file at `path`, root's alone (mode 0600) from its
/// creation, as the daemons want their key files.
pub fn write_secret_file(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(file, "{text}").with_context(|| format!("writing {}", path.display()))
}

/// What every agent is told of its balancers: their outer sources (`--allow-from`) and the
/// key file their reports are signed with.
pub(crate) fn trust_args(balancers: &[IpAddr], report_key: &Path) -> Vec<String> {
    let mut args: Vec<String> = balancers.iter().flat_map(|b| ["--allow-from".to_owned(), b.to_string()]).collect();
    args.extend(["--report-key".to_owned(), report_key.display().to_string()]);
    args
}

/// The command line of `lbd agent` on a harness host (`eth0`, pinning under `pin_dir`), then
/// `extra`: the agent's own options, the balancers it trusts among them (`--allow-from`).
pub fn agent_command(lbd: &Path, mode: XdpMode, pin_dir: &Path, extra: &[&str]) -> Vec<String> {
    let fixed = [lbd.display().to_string(), "agent".into(), "--iface".into(), "eth0".into(), "--xdp-mode".into(), mode.flag().into()];
    fixed.into_iter().chain(["--pin-dir".into(), pin_dir.display().to_string()]).chain(extra.iter().map(|a| (*a).to_owned())).collect()
}

/// Starts `lbd agent` on backend `host` (pinning under `pin_dir`, with `extra` arguments,
/// which must name the balancers: see [`trust_args`]) and waits until it is ready.
pub(crate) fn spawn_agent(host: &Host, lbd: &Path, mode: XdpMode, pin_dir: &Path, extra: &[String]) -> Result<Daemon> {
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let agent = host.spawn(&agent_command(lbd, mode, pin_dir, &extra))?;
    agent.wait_for_output("event=ready", START_TIMEOUT).with_context(|| format!("agent on {}:\n{}", host.name(), agent.log()))?;
    Ok(agent)
}

/// How the balancer is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    Native,
    Generic,
}

impl XdpMode {
    pub const fn flag(self) -> &'static str {
        match self {
            XdpMode::Native => "native",
            XdpMode::Generic => "generic",
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub topology: TopologyConfig,
    pub mode: XdpMode,
    /// More `lbd` arguments (e.g. `--zone a`), after the cluster's own; a later
    /// `--health-slow-start-ms` overrides the cluster's 0.
    pub lbd_args: Vec<String>,
    /// More arguments for every `lbd agent` (e.g. `--watcher-mode sock_diag`).
    pub agent_args: Vec<String>,
}

pub struct Cluster {
    // Field order is drop order: processes before the topology that hosts them.
    lbd: Mutex<Option<Daemon>>,
    agents: Vec<Daemon>,
    echo: Vec<Daemon>,
    bins: Binaries,
    mode: XdpMode,
    lbd_args: Vec<String>,
    agent_args: Vec<String>,
    /// The cluster's report key (`--report-key` of `lbd` and of every agent).
    report_key: PathBuf,
    pub topo: Topology,
}

impl Cluster {
    /// Builds the topology and starts echo servers, agents and `lbd`.
    pub fn start(bins: Binaries, config: ClusterConfig) -> Result<Cluster> {
        let cluster = Cluster::start_without_lbd(bins, config)?;
        cluster.start_lbd()?;
        Ok(cluster)
    }

    /// [`Cluster::start`] but for `lbd`: the backends with their echo servers and agents
    /// (trusting the balancer's addresses), for something else to balance onto them (the
    /// bench's cheapest XDP hop). [`Cluster::start_lbd`] starts `lbd` later if wanted.
    pub fn start_without_lbd(bins: Binaries, config: ClusterConfig) -> Result<Cluster> {
        let topo = Topology::build(config.topology)?;
        let report_key = topo.tempdir().join("report.key");
        write_report_key(&report_key)?;
        let mut agent_args = trust_args(&[crate::LB4.into(), crate::LB6.into()], &report_key);
        agent_args.extend(config.agent_args);
        let mut cluster = Cluster {
            lbd: Mutex::new(None),
            agents: Vec::new(),
            echo: Vec::new(),
            bins,
            mode: config.mode,
            lbd_args: config.lbd_args,
            agent_args,
            report_key,
            topo,
        };
        for i in 0..cluster.topo.backends().len() {
            cluster.start_backend(i)?;
        }
        Ok(cluster)
    }

    /// Adds backend host `b<N+1>` with its echo server and agent (not yet in any VIP).
    pub fn add_backend_host(&mut self) -> Result<&Host> {
        self.topo.add_backend()?;
        let i = self.topo.backends().len() - 1;
        self.start_backend(i)?;
        Ok(&self.topo.backends()[i])
    }

    fn start_backend(&mut self, i: usize) -> Result<()> {
        self.echo.push(start_echo(&self.topo.backends()[i], TCP_PORT, UDP_PORT)?);
        let agent = self.spawn_agent(i)?;
        self.agents.push(agent);
        Ok(())
    }

    fn agent_pin_dir(&self, i: usize) -> Result<PathBuf> {
        Ok(self.topo.pin_dir()?.join(format!("agent-{}", self.topo.backends()[i].name())))
    }

    fn spawn_agent(&self, i: usize) -> Result<Daemon> {
        spawn_agent(&self.topo.backends()[i], &self.bins.lbd, self.mode, &self.agent_pin_dir(i)?, &self.agent_args)
    }

    /// Stops backend `index`'s agent; its decapsulation goes on through the pinned link,
    /// its ports endpoint is gone.
    pub fn stop_agent(&self, index: usize) -> Result<()> {
        let agent = self.agents.get(index).with_context(|| format!("no backend {index}"))?;
        agent.signal(Signal::SIGTERM)?;
        ensure!(agent.wait_with_timeout(STOP_TIMEOUT)?.is_some(), "agent of backend {index} still runs");
        Ok(())
    }

    /// Stops backend `index`'s agent and removes its pinned link, which detaches its
    /// decapsulation: the host and its service stay up, tunnelled packets are no longer opened.
    pub fn detach_decap(&self, index: usize) -> Result<()> {
        self.stop_agent(index)?;
        let link = self.agent_pin_dir(index)?.join("agent").join("link");
        std::fs::remove_file(&link).with_context(|| format!("removing {}", link.display()))
    }

    /// Starts backend `index`'s agent again (after [`Self::detach_decap`]).
    pub fn restart_agent(&mut self, index: usize) -> Result<()> {
        ensure!(index < self.agents.len(), "no backend {index}");
        self.agents[index] = self.spawn_agent(index)?;
        Ok(())
    }

    /// Starts backend `index`'s agent again (after [`Self::stop_agent`]) with `extra` after
    /// the cluster's agent arguments; later restarts take the cluster's arguments alone.
    pub fn restart_agent_with(&mut self, index: usize, extra: &[&str]) -> Result<()> {
        ensure!(index < self.agents.len(), "no backend {index}");
        let args: Vec<String> = self.agent_args.iter().cloned().chain(extra.iter().map(|a| (*a).to_owned())).collect();
        self.agents[index] = spawn_agent(&self.topo.backends()[index], &self.bins.lbd, self.mode, &self.agent_pin_dir(index)?, &args)?;
        Ok(())
    }

    /// Stops backend `index`'s echo server (SIGKILL), as a crashed service would: its host
    /// and agent stay up, so connections to it are refused.
    pub fn stop_echo(&self, index: usize) -> Result<()> {
        let echo = self.echo.get(index).with_context(|| format!("no backend {index}"))?;
        echo.signal(Signal::SIGKILL)?;
        ensure!(echo.wait_with_timeout(STOP_TIMEOUT)?.is_some(), "echo server of backend {index} still runs");
        Ok(())
    }

    /// Sends `signal` to backend `index`'s echo server (SIGSTOP hangs it: the kernel still
    /// completes TCP handshakes into its backlog, but nothing is answered).
    pub fn signal_echo(&self, index: usize, signal: Signal) -> Result<()> {
        self.echo.get(index).with_context(|| format!("no backend {index}"))?.signal(signal)
    }

    /// Connections the backends' echo servers accepted from `client` so far.
    pub fn accepted_from(&self, client: IpAddr) -> usize {
        let line = format!("accepted {client}");
        self.echo.iter().map(|d| d.log().lines().filter(|l| *l == line).count()).sum()
    }

    pub fn api_socket(&self) -> PathBuf {
        self.topo.tempdir().join("api.sock")
    }

    /// Where `lbd` persists its state.
    pub fn state_dir(&self) -> PathBuf {
        self.topo.tempdir().join("state")
    }

    /// Adds `args` to every later start of `lbd` (for options naming what a test made after
    /// [`Cluster::start_without_lbd`], such as pins of its own).
    pub fn add_lbd_args(&mut self, args: &[&str]) {
        self.lbd_args.extend(args.iter().map(|a| (*a).to_owned()));
    }

    /// Starts `lbd` (again); returns once its API answers. Takes `&self` so a test can
    /// restart it while other threads drive traffic through the topology.
    pub fn start_lbd(&self) -> Result<()> {
        self.spawn_lbd_with(&[], &[])?;
        self.wait_for_lbd()
    }

    /// Starts `lbd` (again) without waiting for it: run by the `wrapper` command when there
    /// is one (e.g. `ip netns exec ...`), with `env` added to its environment.
    pub fn spawn_lbd_with(&self, wrapper: &[&std::ffi::OsStr], env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
        self.spawn_lbd(wrapper, env, None)
    }

    /// Starts `lbd` (again) without waiting for it, with only what the unit `files` grant
    /// (capabilities and system calls: see [`crate::unit`]), with `env` added.
    pub fn spawn_lbd_as_unit(&self, files: &[PathBuf], env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
        let wrapper = crate::unit::setpriv_wrapper(files)?;
        let wrapper: Vec<&std::ffi::OsStr> = wrapper.iter().map(std::ffi::OsStr::new).collect();
        self.spawn_lbd(&wrapper, env, Some(&crate::unit::SyscallFilter::read(files)?))
    }

    fn spawn_lbd(
        &self,
        wrapper: &[&std::ffi::OsStr],
        env: &[(&str, &std::ffi::OsStr)],
        filter: Option<&crate::unit::SyscallFilter>,
    ) -> Result<()> {
        let mut slot = self.lbd.lock().unwrap_or_else(|p| p.into_inner());
        ensure!(slot.as_ref().is_none_or(|d| !d.is_running()), "lbd is already running");
        let lb = self.topo.lb();
        // Neighbours of the backends resolve through lbd's own upkeep; pinging first only
        // makes the first connections of a test independent of its timing.
        for b in self.topo.backends() {
            lb.in_netns(|| ping(IpAddr::V4(b.ipv4()), Duration::from_secs(1)))?;
        }
        let (api, state, pin_dir) = (self.api_socket(), self.state_dir(), self.lbd_pin_dir()?);
        let mut args: Vec<&std::ffi::OsStr> = wrapper.to_vec();
        args.extend([
            self.bins.lbd.as_os_str(),
            "--iface".as_ref(),
            "eth0".as_ref(),
            "--xdp-mode".as_ref(),
            self.mode.flag().as_ref(),
            "--api".as_ref(),
            api.as_os_str(),
            "--state-dir".as_ref(),
            state.as_os_str(),
            "--pin-dir".as_ref(),
            pin_dir.as_os_str(),
            // Health checks stay on; without slow start a backend added by a test takes its
            // full share at once, as the distribution tests expect.
            "--health-slow-start-ms".as_ref(),
            "0".as_ref(),
            "--report-key".as_ref(),
            self.report_key.as_os_str(),
        ]);
        args.extend(self.lbd_args.iter().map(std::ffi::OsStr::new));
        let (program, rest) = args.split_first().context("no lbd command")?;
        let mut cmd = match filter {
            Some(filter) => {
                let mut cmd = Command::new(program);
                filter.apply(&mut cmd, std::fs::File::open(lb.netns().path())?);
                cmd
            }
            None => lb.cmd(program),
        };
        cmd.args(rest).envs(env.iter().copied());
        *slot = Some(lb.spawn_command("lbd", cmd)?);
        Ok(())
    }

    /// Waits until the `lbd` just spawned answers on its API.
    pub fn wait_for_lbd(&self) -> Result<()> {
        let running = || self.lbd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(Daemon::is_running);
        self.ctl().wait_for_lbd(&running, &|| self.lbd_log())
    }

    fn ctl(&self) -> Lbctl {
        Lbctl { bin: self.bins.lbctl.clone(), api: self.api_socket() }
    }

    /// The bpffs directory `lbd` pins under (for `lbd --cleanup --pin-dir`).
    pub fn lbd_pin_dir(&self) -> Result<PathBuf> {
        Ok(self.topo.pin_dir()?.join("lb"))
    }

    /// Runs `lbd` with `args` on the balancer host to completion (`--cleanup`), not as the
    /// daemon.
    pub fn lbd_once(&self, args: &[&str]) -> Result<Output> {
        self.topo.lb().cmd(&self.bins.lbd).args(args).output().with_context(|| format!("running lbd {}", args.join(" ")))
    }

    /// Everything the running (or last) `lbd` logged.
    pub fn lbd_log(&self) -> String {
        self.lbd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(Daemon::log).unwrap_or_default()
    }

    /// The running `lbd`'s process id.
    pub fn lbd_pid(&self) -> Option<u32> {
        self.lbd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().filter(|d| d.is_running()).map(Daemon::pid)
    }

    /// Sends `signal` to `lbd` and waits (bounded) for it to exit.
    pub fn stop_lbd(&self, signal: Signal) -> Result<()> {
        let slot = self.lbd.lock().unwrap_or_else(|p| p.into_inner());
        let lbd = slot.as_ref().context("lbd was never started")?;
        lbd.signal(signal)?;
        let exited = lbd.wait_with_timeout(STOP_TIMEOUT)?;
        ensure!(exited.is_some(), "lbd still runs {STOP_TIMEOUT:?} after {signal}");
        Ok(())
    }

    /// Sends `signal` to the running `lbd` and returns at once (SIGHUP: it reloads).
    pub fn signal_lbd(&self, signal: Signal) -> Result<()> {
        let slot = self.lbd.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref().filter(|d| d.is_running()).context("lbd is not running")?.signal(signal)
    }

    /// Runs `lbctl` with `args`, `input` as its standard input.
    pub fn lbctl_with_input(&self, args: &[&str], input: &str) -> Result<Output> {
        use std::io::Write;
        let mut child = Command::new(&self.bins.lbctl)
            .arg("--api")
            .arg(self.api_socket())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("running lbctl {}", args.join(" ")))?;
        child.stdin.take().context("lbctl's stdin")?.write_all(input.as_bytes())?;
        Ok(child.wait_with_output()?)
    }

    /// Runs `lbctl` with `args` against this cluster's API.
    pub fn lbctl_output(&self, args: &[&str]) -> Result<Output> {
        self.ctl().output(args)
    }

    /// Starts `lbctl` with `args` without waiting for it (see [`Cluster::lbctl_wait`]).
    pub fn lbctl_spawn(&self, args: &[&str]) -> Result<std::process::Child> {
        Command::new(&self.bins.lbctl)
            .arg("--api")
            .arg(self.api_socket())
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .with_context(|| format!("running lbctl {}", args.join(" ")))
    }

    /// Waits for an `lbctl` from [`Cluster::lbctl_spawn`]; fails with its stderr on a
    /// non-zero exit.
    pub fn lbctl_wait(&self, child: std::process::Child) -> Result<()> {
        let out = child.wait_with_output().context("waiting for lbctl")?;
        ensure!(out.status.success(), "lbctl failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
        Ok(())
    }

    /// Runs `lbctl` and returns its stdout; fails with its stderr on a non-zero exit.
    pub fn lbctl(&self, args: &[&str]) -> Result<String> {
        self.ctl().run(args)
    }

    /// Runs `lbctl ... -o json` and parses the output.
    pub fn lbctl_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        self.ctl().json(args)
    }
}
