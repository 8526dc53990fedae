//! A fleet of balancers on real routing: a router namespace running BIRD learns the VIPs
//! over BGP from every balancer (each with its own BIRD and the real `lbd`), installs them
//! as ECMP routes with L4 hashing, and routes the clients behind it to them; backends with
//! agents answer the clients directly (DSR, through the router).
//!
//! ```text
//!  c1 10.1.0.11 ─┐                       ┌─ lb1 10.0.0.2 (lbd + BIRD, AS 65001)
//!  c2 10.1.0.12 ─┼─ edge ─ router ─ core ┼─ lb2 10.0.0.3 ...
//!               ...   10.1.0.1  10.0.0.1 ├─ b1 10.0.0.101 (agent, echo :80, capacity :8080)
//!                      (BIRD, AS 65000)  └─ ...
//! ```
//!
//! IPv6 VIPs take sessions of their own between the IPv6 addresses (fd00::1, fd00::1+n).
//! Every BGP session runs BFD (100 ms × 3), so a dead balancer is gone from the router in
//! about 0.3 s; BGP's own timers are short as well (hold 3 s, reconnect and restart after
//! 1 to 2 s), so a balancer that comes back is routed again within seconds. Everything
//! (processes, namespaces, pins, files) is removed on drop, also when a test panics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::addrs::{
    EDGE4_NET, EDGE6_NET, MAX_FLEET_BALANCERS, ROUTER_EDGE4, ROUTER_EDGE6, ROUTER4, ROUTER6, VIP4, backend4, backend6, balancer4,
    balancer6, edge_client4, edge_client6,
};
use crate::cleanup::sweep_stale;
use crate::cluster::{Binaries, TCP_PORT, UDP_PORT, XdpMode, spawn_agent, trust_args, write_report_key};
use crate::host::{CLIENT_MTU, Host, HostSpec, Role, TUNNEL_MTU, wire_iface};
use crate::lbctl::{Lbctl, START_TIMEOUT, STOP_TIMEOUT};
use crate::netns::Netns;
use crate::process::{Daemon, Registry};
use crate::tempdir::TempDir;
use crate::topology::next_id;
use crate::{bpffs, capacity, echo, ping};

/// The router's and the balancers' AS numbers (the balancers share one, as fleets do).
pub const ROUTER_AS: u32 = 65000;
pub const BALANCER_AS: u32 = 65001;
/// Port of the capacity servers (HTTP load) on the backends; the echo servers have
/// [`TCP_PORT`].
pub const HTTP_PORT: u16 = 8080;

#[derive(Clone, Debug)]
pub struct FleetConfig {
    /// Balancers started at once, `lb1..`; more with [`Fleet::add_balancer`].
    pub balancers: usize,
    pub backends: usize,
    pub clients: usize,
    pub mode: XdpMode,
    /// More `lbd` arguments for every balancer, after the fleet's own.
    pub lbd_args: Vec<String>,
}

pub struct Fleet {
    // Field order is drop order: processes stop (Drop) before their namespaces go.
    balancers: Vec<Balancer>,
    /// Per backend: its echo and capacity servers, then its agent (each stoppable).
    servers: Vec<BackendProcs>,
    router_bird: Daemon,
    bins: Binaries,
    mode: XdpMode,
    lbd_args: Vec<String>,
    clients: Vec<Host>,
    backends: Vec<Host>,
    /// Keeps XDP_PASS on the router's veth peers (see `xdp_pass`).
    _router_xdp: [OwnedFd; 2],
    router: Netns,
    _edge: Netns,
    core: Netns,
    registry: Arc<Registry>,
    pin_dir: PathBuf,
    tempdir: TempDir,
    /// Last: gone before a test that runs alone may start (see `alone`).
    _shared: crate::alone::Shared,
}

impl Fleet {
    /// Builds the network, starts the router's BIRD, the backends (servers and agents) and
    /// the first balancers, and waits until the router has a BGP session to each of them.
    pub fn start(bins: Binaries, config: FleetConfig) -> Result<Fleet> {
        ensure!((1..=MAX_FLEET_BALANCERS).contains(&config.balancers), "1..={MAX_FLEET_BALANCERS} balancers");
        bird_binary()?;
        let shared = crate::alone::shared()?;
        if let Err(err) = sweep_stale() {
            eprintln!("spillway-harness: {err:#}");
        }
        let id = next_id();
        let tempdir = TempDir::create(std::env::temp_dir().join(&id))?;
        let registry = Arc::new(Registry::new(tempdir.path().to_owned()));
        let core = crate::topology::build_bridge_named(&id, "core", &registry)?;
        let edge = crate::topology::build_bridge_named(&id, "edge", &registry)?;
        let router = Netns::create("router", format!("{id}-router"), Arc::clone(&registry))?;
        let router_xdp =
            [wire_iface(&router, "eth0", "p-router", TUNNEL_MTU, &core)?, wire_iface(&router, "eth1", "p-router", CLIENT_MTU, &edge)?];
        configure_router(&router)?;
        bpffs::ensure_mounted()?;
        let pin_dir = Path::new(bpffs::BPFFS_ROOT).join(&id);
        std::fs::create_dir(&pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
        let router_bird = start_bird(&router, &tempdir.path().join("router"), &router_bird_config())?;
        let host = |name: String, role, ipv4, ipv6, bridge: &Netns| {
            Host::create(HostSpec { name, role, ipv4, ipv6 }, &id, bridge, Arc::clone(&registry))
        };
        let backends = (1..=config.backends)
            .map(|n| {
                let b = host(format!("b{n}"), Role::Backend, backend4(n), backend6(n), &core)?;
                b.run(&["ip", "route", "add", EDGE4_NET, "via", &ROUTER4.to_string()])?;
                b.run(&["ip", "-6", "route", "add", EDGE6_NET, "via", &ROUTER6.to_string()])?;
                Ok(b)
            })
            .collect::<Result<Vec<_>>>()?;
        let clients = (1..=config.clients)
            .map(|n| host(format!("c{n}"), Role::EdgeClient, edge_client4(n), edge_client6(n), &edge))
            .collect::<Result<Vec<_>>>()?;
        let mut fleet = Fleet {
            balancers: Vec::new(),
            servers: Vec::new(),
            router_bird,
            bins,
            mode: config.mode,
            lbd_args: config.lbd_args,
            clients,
            backends,
            _router_xdp: router_xdp,
            router,
            _edge: edge,
            core,
            registry,
            pin_dir,
            tempdir,
            _shared: shared,
        };
        fleet.check_reachable()?;
        write_report_key(&fleet.report_key())?;
        for i in 0..fleet.backends.len() {
            fleet.start_backend(i)?;
        }
        for _ in 0..config.balancers {
            fleet.add_balancer()?;
        }
        Ok(fleet)
    }

    /// Adds balancer `lb<N+1>`: its host, BIRD and `lbd` (no VIPs yet: give it the fleet's
    /// state), once the router has a session to it.
    pub fn add_balancer(&mut self) -> Result<&Balancer> {
        let n = self.balancers.len() + 1;
        ensure!(n <= MAX_FLEET_BALANCERS, "at most {MAX_FLEET_BALANCERS} balancers");
        let id = self.core.name().trim_end_matches("-core").to_owned();
        let spec = HostSpec { name: format!("lb{n}"), role: Role::Balancer, ipv4: balancer4(n), ipv6: balancer6(n) };
        let host = Host::create(spec, &id, &self.core, Arc::clone(&self.registry))?;
        // A NIC drops frames for other MACs before XDP sees them; a veth does not. Without
        // this, the frames the router still sends a dead balancer's MAC are flooded to the
        // live balancers, whose XDP program serves them, hiding every loss.
        self.core.run(&["ip", "link", "set", "dev", &format!("p-lb{n}"), "type", "bridge_slave", "flood", "off"])?;
        let dir = self.tempdir.path().join(format!("lb{n}"));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let balancer = Balancer {
            n,
            host,
            pin_dir: self.pin_dir.join(format!("lb{n}")),
            dir,
            bins: self.bins.clone(),
            mode: self.mode,
            lbd_args: self.lbd_args.clone(),
            report_key: self.report_key(),
            bird: Mutex::new(None),
            lbd: Mutex::new(None),
        };
        for b in &self.backends {
            balancer.host.in_netns(|| ping(IpAddr::V4(b.ipv4()), Duration::from_secs(1)))?;
        }
        balancer.start_bird()?;
        balancer.start_lbd()?;
        self.balancers.push(balancer);
        let name = format!("lb{n}");
        self.wait_for(START_TIMEOUT, &format!("the router's session to {name}"), || Ok(self.router_session_up(&name)))?;
        Ok(self.balancers.last().expect("just pushed"))
    }

    fn start_backend(&mut self, i: usize) -> Result<()> {
        let servers = self.spawn_servers(i)?;
        let agent = self.spawn_agent(i)?;
        self.servers.push(BackendProcs { servers: Some(servers), agent: Some(agent) });
        Ok(())
    }

    fn spawn_servers(&self, i: usize) -> Result<[Daemon; 2]> {
        let host = &self.backends[i];
        // Plenty of room: the fleet tests measure routing, not backend capacity.
        Ok([echo::start_echo(host, TCP_PORT, UDP_PORT)?, capacity::start_capacity_server(host, HTTP_PORT, 2000, 1)?])
    }

    fn spawn_agent(&self, i: usize) -> Result<Daemon> {
        let host = &self.backends[i];
        let pin_dir = self.pin_dir.join(format!("agent-{}", host.name()));
        // Every balancer the fleet may grow to sends tunnels (and second-chance packets).
        let balancers: Vec<IpAddr> = (1..=MAX_FLEET_BALANCERS).flat_map(|n| [IpAddr::V4(balancer4(n)), IpAddr::V6(balancer6(n))]).collect();
        spawn_agent(host, &self.bins.lbd, self.mode, &pin_dir, &trust_args(&balancers, &self.report_key()))
    }

    /// Sends `signal` to backend `i`'s echo and capacity servers and waits for them to exit:
    /// its connections die and its health checks fail (the agent stays).
    pub fn stop_servers(&mut self, i: usize, signal: crate::Signal) -> Result<()> {
        let name = self.backends[i].name().to_owned();
        let servers = self.servers[i].servers.take().with_context(|| format!("the servers of {name} are not running"))?;
        for daemon in &servers {
            daemon.signal(signal)?;
            ensure!(daemon.wait_with_timeout(STOP_TIMEOUT)?.is_some(), "a server of {name} still runs {STOP_TIMEOUT:?} after {signal}");
        }
        Ok(())
    }

    /// Starts backend `i`'s servers again (after [`Self::stop_servers`]).
    pub fn start_servers(&mut self, i: usize) -> Result<()> {
        ensure!(self.servers[i].servers.is_none(), "the servers of {} already run", self.backends[i].name());
        self.servers[i].servers = Some(self.spawn_servers(i)?);
        Ok(())
    }

    /// Sends `signal` to backend `i`'s agent and waits for it to exit; its decapsulation goes
    /// on through the pinned link.
    pub fn stop_agent(&mut self, i: usize, signal: crate::Signal) -> Result<()> {
        let name = self.backends[i].name().to_owned();
        let agent = self.servers[i].agent.take().with_context(|| format!("the agent of {name} is not running"))?;
        agent.signal(signal)?;
        ensure!(agent.wait_with_timeout(STOP_TIMEOUT)?.is_some(), "the agent of {name} still runs {STOP_TIMEOUT:?} after {signal}");
        Ok(())
    }

    /// Starts backend `i`'s agent again (after [`Self::stop_agent`]); it adopts its pins.
    pub fn start_agent(&mut self, i: usize) -> Result<()> {
        ensure!(self.servers[i].agent.is_none(), "the agent of {} already runs", self.backends[i].name());
        self.servers[i].agent = Some(self.spawn_agent(i)?);
        Ok(())
    }

    /// The fleet's report key file (written when the fleet starts).
    fn report_key(&self) -> PathBuf {
        self.tempdir.path().join("report.key")
    }

    /// The router reaches every backend, and c1 reaches the router's edge side.
    fn check_reachable(&self) -> Result<()> {
        for b in &self.backends {
            self.router.in_netns(|| retry_ping(IpAddr::V4(b.ipv4())))?;
        }
        if let Some(c) = self.clients.first() {
            c.in_netns(|| retry_ping(IpAddr::V4(ROUTER_EDGE4)))?;
            c.in_netns(|| retry_ping(IpAddr::V6(ROUTER_EDGE6)))?;
        }
        Ok(())
    }

    pub fn balancers(&self) -> &[Balancer] {
        &self.balancers
    }

    pub fn balancer(&self, n: usize) -> &Balancer {
        &self.balancers[n - 1]
    }

    pub fn clients(&self) -> &[Host] {
        &self.clients
    }

    pub fn backends(&self) -> &[Host] {
        &self.backends
    }

    pub fn router(&self) -> &Netns {
        &self.router
    }

    /// A directory for the test's files (say, the fleet's configuration); removed on drop.
    pub fn tempdir(&self) -> &Path {
        self.tempdir.path()
    }

    /// The router BIRD's control socket (for `show route`).
    pub fn router_bird_socket(&self) -> PathBuf {
        self.tempdir.path().join("router").join("bird.ctl")
    }

    /// Whether the router's BGP session to `lb<n>` is established.
    pub fn router_session_up(&self, name: &str) -> bool {
        birdc(&self.router_bird_socket(), &format!("show protocols {name}")).is_ok_and(|out| out.contains("Established"))
    }

    /// The next hops of the router's kernel route to `addr` (ECMP: several), empty when it
    /// has none.
    pub fn router_next_hops(&self, addr: Ipv4Addr) -> Vec<Ipv4Addr> {
        let out = self.router.run(&["ip", "-4", "route", "show", &format!("{addr}/32")]).unwrap_or_default();
        let words: Vec<&str> = out.split_whitespace().collect();
        words.windows(2).filter(|w| w[0] == "via").filter_map(|w| w[1].parse().ok()).collect()
    }

    /// [`Fleet::router_next_hops`] for an IPv6 address (its /128 route).
    pub fn router_next_hops6(&self, addr: Ipv6Addr) -> Vec<Ipv6Addr> {
        let out = self.router.run(&["ip", "-6", "route", "show", &format!("{addr}/128")]).unwrap_or_default();
        let words: Vec<&str> = out.split_whitespace().collect();
        words.windows(2).filter(|w| w[0] == "via").filter_map(|w| w[1].parse().ok()).collect()
    }

    /// Polls `check` every 50 ms until it holds; fails naming `what` after `timeout`.
    pub fn wait_for(&self, timeout: Duration, what: &str, mut check: impl FnMut() -> Result<bool>) -> Result<Duration> {
        let started = Instant::now();
        loop {
            if check()? {
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                bail!("{what}: not within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ends the router BIRD's process (for tests of the harness itself).
    pub fn router_bird(&self) -> &Daemon {
        &self.router_bird
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for path in std::fs::read_dir(self.tempdir.path()).into_iter().flatten().flatten().map(|e| e.path()) {
                if path.extension().is_some_and(|ext| ext == "log") {
                    eprintln!("---- {} ----\n{}", path.display(), std::fs::read_to_string(&path).unwrap_or_default());
                }
            }
        }
        self.registry.stop_all();
        self.balancers.clear();
        if let Err(err) = std::fs::remove_dir_all(&self.pin_dir) {
            eprintln!("spillway-harness: cannot remove {}: {err}", self.pin_dir.display());
        }
    }
}

/// A backend's processes; `None` while stopped.
struct BackendProcs {
    servers: Option<[Daemon; 2]>,
    agent: Option<Daemon>,
}

/// One balancer of a fleet: its host, BIRD and `lbd`, each stoppable and restartable.
pub struct Balancer {
    // Field order is drop order: the processes before their host's namespace.
    bird: Mutex<Option<Daemon>>,
    lbd: Mutex<Option<Daemon>>,
    n: usize,
    host: Host,
    dir: PathBuf,
    pin_dir: PathBuf,
    bins: Binaries,
    mode: XdpMode,
    lbd_args: Vec<String>,
    /// The fleet's report key.
    report_key: PathBuf,
}

impl Balancer {
    /// `lb1`, `lb2`...
    pub fn name(&self) -> &str {
        self.host.name()
    }

    pub fn host(&self) -> &Host {
        &self.host
    }

    pub fn ipv4(&self) -> Ipv4Addr {
        self.host.ipv4()
    }

    pub fn ipv6(&self) -> Ipv6Addr {
        self.host.ipv6()
    }

    pub fn api_socket(&self) -> PathBuf {
        self.dir.join("api.sock")
    }

    pub fn bird_socket(&self) -> PathBuf {
        self.dir.join("bird").join("bird.ctl")
    }

    /// The BIRD include `lbd` writes.
    pub fn include(&self) -> PathBuf {
        self.dir.join("vips.conf")
    }

    /// The pinned XDP link on eth0 (see `spillway_dataplane::pins`).
    pub fn pinned_link(&self) -> Result<PathBuf> {
        self.pinned("links/eth0")
    }

    /// The pinned map `name`.
    pub fn pinned_map(&self, name: &str) -> Result<PathBuf> {
        self.pinned(&format!("maps/{name}"))
    }

    /// `<pin-dir>/v<N>/<rest>`: the one versioned directory `lbd` made.
    fn pinned(&self, rest: &str) -> Result<PathBuf> {
        let versioned = std::fs::read_dir(&self.pin_dir)
            .with_context(|| format!("listing {}", self.pin_dir.display()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('v')))
            .with_context(|| format!("no versioned directory in {}", self.pin_dir.display()))?;
        Ok(versioned.join(rest))
    }

    /// Starts this balancer's BIRD (again) and waits for its control socket.
    pub fn start_bird(&self) -> Result<()> {
        let mut slot = lock(&self.bird);
        ensure!(slot.as_ref().is_none_or(|d| !d.is_running()), "BIRD of {} already runs", self.name());
        let config = balancer_bird_config(self.n, &self.include());
        *slot = Some(start_bird(self.host.netns(), &self.dir.join("bird"), &config)?);
        Ok(())
    }

    /// Starts `lbd` (again); returns once its API answers.
    pub fn start_lbd(&self) -> Result<()> {
        let mut slot = lock(&self.lbd);
        ensure!(slot.as_ref().is_none_or(|d| !d.is_running()), "lbd of {} already runs", self.name());
        let (state, bird, include) = (self.dir.join("state"), self.bird_socket(), self.include());
        let api = self.api_socket();
        let mut args: Vec<&std::ffi::OsStr> = vec![
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
            self.pin_dir.as_os_str(),
            "--health-slow-start-ms".as_ref(),
            "0".as_ref(),
            "--flow-hash-seed".as_ref(),
            FLEET_SEED.as_ref(),
            "--bird-socket".as_ref(),
            bird.as_os_str(),
            "--bird-include".as_ref(),
            include.as_os_str(),
            "--report-key".as_ref(),
            self.report_key.as_os_str(),
        ];
        args.extend(self.lbd_args.iter().map(std::ffi::OsStr::new));
        let daemon = self.host.spawn(&args)?;
        self.ctl().wait_for_lbd(&|| daemon.is_running(), &|| daemon.log()).with_context(|| format!("lbd of {}", self.name()))?;
        *slot = Some(daemon);
        Ok(())
    }

    fn ctl(&self) -> Lbctl {
        Lbctl { bin: self.bins.lbctl.clone(), api: self.api_socket() }
    }

    /// Sends `signal` to `lbd` and waits (bounded) for it to exit.
    pub fn stop_lbd(&self, signal: crate::Signal) -> Result<()> {
        stop(&lock(&self.lbd), signal, "lbd", self.name())
    }

    /// Sends `signal` to BIRD and waits (bounded) for it to exit.
    pub fn stop_bird(&self, signal: crate::Signal) -> Result<()> {
        stop(&lock(&self.bird), signal, "BIRD", self.name())
    }

    /// Takes the balancer's link down (as a crash or a cut cable would: the router's BFD
    /// session to it then fails, which ends its BGP session) or brings it back up.
    pub fn set_link(&self, up: bool) -> Result<()> {
        self.host.run(&["ip", "link", "set", "eth0", if up { "up" } else { "down" }]).map(drop)
    }

    /// Detaches the balancer's XDP program (BPF_LINK_DETACH on its pinned link) while
    /// everything else keeps running.
    pub fn detach_program(&self) -> Result<()> {
        crate::bpf_link::detach(&self.pinned_link()?)
    }

    /// The pid of the running `lbd`, `None` while it is stopped.
    pub fn lbd_pid(&self) -> Option<u32> {
        lock(&self.lbd).as_ref().filter(|d| d.is_running()).map(Daemon::pid)
    }

    /// Everything the running (or last) `lbd` logged.
    pub fn lbd_log(&self) -> String {
        lock(&self.lbd).as_ref().map(Daemon::log).unwrap_or_default()
    }

    pub fn lbctl_output(&self, args: &[&str]) -> Result<Output> {
        self.ctl().output(args)
    }

    /// Runs `lbctl` and returns its stdout; fails with its stderr on a non-zero exit.
    pub fn lbctl(&self, args: &[&str]) -> Result<String> {
        self.ctl().run(args).with_context(|| format!("on {}", self.name()))
    }

    /// Runs `lbctl ... -o json` and parses the output.
    pub fn lbctl_json(&self, args: &[&str]) -> Result<serde_json::Value> {
        self.ctl().json(args).with_context(|| format!("on {}", self.name()))
    }
}

fn stop(slot: &Option<Daemon>, signal: crate::Signal, what: &str, name: &str) -> Result<()> {
    let daemon = slot.as_ref().with_context(|| format!("{what} of {name} was never started"))?;
    daemon.signal(signal)?;
    ensure!(daemon.wait_with_timeout(STOP_TIMEOUT)?.is_some(), "{what} of {name} still runs {STOP_TIMEOUT:?} after {signal}");
    Ok(())
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Addresses, forwarding with L4 multipath hashing, no reverse-path filtering (replies from
/// backends carry the VIP as source and arrive from the backends' side).
fn configure_router(router: &Netns) -> Result<()> {
    router.run(&["ip", "link", "set", "lo", "up"])?;
    for (ifname, v4, v6) in
        [("eth0", format!("{ROUTER4}/24"), format!("{ROUTER6}/64")), ("eth1", format!("{ROUTER_EDGE4}/24"), format!("{ROUTER_EDGE6}/64"))]
    {
        router.run(&["ip", "link", "set", ifname, "up"])?;
        router.run(&["ip", "addr", "add", &v4, "dev", ifname])?;
        router.run(&["ip", "-6", "addr", "add", &v6, "dev", ifname, "nodad"])?;
        router.run(&["ethtool", "-K", ifname, "tx", "off"])?;
    }
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv4.fib_multipath_hash_policy", "1"),
        ("net.ipv6.fib_multipath_hash_policy", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
        ("net.ipv4.conf.eth0.rp_filter", "0"),
        ("net.ipv4.conf.eth1.rp_filter", "0"),
        ("net.ipv4.ping_group_range", "0 2147483647"),
    ] {
        router.sysctl(key, value)?;
    }
    Ok(())
}

/// The fleet's flow-hash seed (an announcing `lbd` refuses the public default; a test
/// fleet's need not be secret).
const FLEET_SEED: &str = "0x2f6c3a91";

/// The BGP timers of every session: a dead peer is dropped after 3 s (without BFD), a
/// session comes back within about a second of its peer (BIRD's defaults wait 5 s to
/// connect, 120 s to retry, and 60 s doubling up to 300 s after an error, a BFD failure
/// included), and BFD tracks the peer.
const TIMERS: &str = "hold time 3; keepalive time 1; connect delay time 1; connect retry time 1; error wait time 1, 2; bfd on;";
/// BFD on every router and balancer: a peer is down after 3 missed packets 100 ms apart.
const BFD: &str = "protocol bfd { interface \"*\" { interval 100 ms; multiplier 3; }; }\n";

/// The router: one eBGP session per possible balancer, every path to a VIP installed as
/// one ECMP route, every path sent back to each balancer (ADD-PATH, so each sees who else
/// announces), GRACEFUL_SHUTDOWN honoured (such a path only serves when no other does).
fn router_bird_config() -> String {
    let mut config = format!(
        "router id {ROUTER4};\nlog stderr all;\nprotocol device {{ scan time 10; }}\n\
         {BFD}protocol kernel {{ ipv4 {{ export all; import none; }}; merge paths on; }}\n\
         protocol kernel {{ ipv6 {{ export all; import none; }}; merge paths on; }}\n\
         filter from_balancers {{ if (65535, 0) ~ bgp_community then bgp_local_pref = 0; accept; }}\n\
         template bgp balancer {{\n  local {ROUTER4} as {ROUTER_AS};\n  {TIMERS}\n  \
         ipv4 {{ import filter from_balancers; export all; add paths tx; }};\n}}\n\
         template bgp balancer6 {{\n  local {ROUTER6} as {ROUTER_AS};\n  {TIMERS}\n  \
         ipv6 {{ import filter from_balancers; export all; add paths tx; }};\n}}\n"
    );
    // IPv6 VIPs over sessions of their own between IPv6 addresses: the next hop is then the
    // balancer's IPv6 address, which the kernel routes like any (an ipv6 channel over the
    // IPv4 session would carry an IPv4-mapped next hop the kernel cannot use).
    for n in 1..=MAX_FLEET_BALANCERS {
        config.push_str(&format!("protocol bgp lb{n} from balancer {{ neighbor {} as {BALANCER_AS}; }}\n", balancer4(n)));
        config.push_str(&format!("protocol bgp lb{n}_v6 from balancer6 {{ neighbor {} as {BALANCER_AS}; }}\n", balancer6(n)));
    }
    config
}

/// A balancer: its VIPs from `lbd`'s include (a glob, so BIRD starts before the file
/// exists) in table spillway4, exported to the router; the other balancers' paths
/// imported into the same table (never into the kernel), which is how `lbd` sees them.
fn balancer_bird_config(n: usize, include: &Path) -> String {
    let (me, me6, include) = (balancer4(n), balancer6(n), include.display());
    format!(
        "router id {me};\nlog stderr all;\nipv4 table spillway4;\nipv6 table spillway6;\n\
         include \"{include}*\";\nprotocol device {{ scan time 10; }}\n{BFD}\
         protocol bgp uplink {{\n  local {me} as {BALANCER_AS};\n  neighbor {ROUTER4} as {ROUTER_AS};\n  {TIMERS}\n  \
         allow local as;\n  ipv4 {{ table spillway4; import all; export where proto = \"spillway_vips4\"; add paths rx; }};\n}}\n\
         protocol bgp uplink6 {{\n  local {me6} as {BALANCER_AS};\n  neighbor {ROUTER6} as {ROUTER_AS};\n  {TIMERS}\n  \
         allow local as;\n  ipv6 {{ table spillway6; import all; export where proto = \"spillway_vips6\"; add paths rx; }};\n}}\n"
    )
}

/// Writes `config` into `dir` and starts BIRD in the foreground in `netns`; returns once
/// its control socket answers.
pub(crate) fn start_bird(netns: &Netns, dir: &Path, config: &str) -> Result<Daemon> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (conf, socket, pid) = (dir.join("bird.conf"), dir.join("bird.ctl"), dir.join("bird.pid"));
    std::fs::write(&conf, config).with_context(|| format!("writing {}", conf.display()))?;
    let bird = bird_binary()?;
    let args = [
        bird.as_os_str(),
        "-f".as_ref(),
        "-c".as_ref(),
        conf.as_os_str(),
        "-s".as_ref(),
        socket.as_os_str(),
        "-P".as_ref(),
        pid.as_os_str(),
    ];
    let daemon = netns.spawn(&args)?;
    let started = Instant::now();
    while birdc(&socket, "show status").is_err() {
        if !daemon.is_running() {
            bail!("BIRD in {} exited:\n{}", netns.label(), daemon.log());
        }
        if started.elapsed() > START_TIMEOUT {
            bail!("BIRD in {} did not answer within {START_TIMEOUT:?}:\n{}", netns.label(), daemon.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(daemon)
}

/// `birdc -s socket command`, its output; fails when BIRD does not answer.
pub fn birdc(socket: &Path, command: &str) -> Result<String> {
    let out = Command::new("birdc").arg("-s").arg(socket).args(command.split_whitespace()).output().context("running birdc")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success() && !text.contains("Unable to connect"), "birdc {command}: {text}{}", String::from_utf8_lossy(&out.stderr));
    Ok(text)
}

/// Debian's bird2 installs it in /usr/sbin; setup (`./x`) installs the package.
pub(crate) fn bird_binary() -> Result<PathBuf> {
    ["/usr/sbin/bird", "/usr/bin/bird"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("BIRD 2 is not installed (Debian package bird2; `./x setup` installs it)")
}

fn retry_ping(addr: IpAddr) -> Result<()> {
    let mut last = None;
    for _ in 0..5 {
        match ping(addr, Duration::from_secs(1)) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried")).with_context(|| format!("pinging {addr}"))
}

/// The VIP's address as the fleet announces it.
pub fn vip_target(port: u16) -> SocketAddr {
    SocketAddr::new(VIP4.into(), port)
}
