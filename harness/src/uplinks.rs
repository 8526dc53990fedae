//! An edge host with two uplinks: the balancer `lb` has `eth0` to router `r1` and `eth1` to
//! router `r2`. Both routers sit on the clients' network (`edge`: r1 is the clients' default
//! gateway, r2 the other one a test switches them to) and on the backends' network
//! (`core`), so every packet may come in, and go out, by either uplink:
//!
//! ```text
//! c1..cN --edge-- r1 --(eth0) lb (eth1)-- r2 --edge
//!            b1..bN --core-- r1, r2
//! ```
//!
//! `lb` reaches the backends over both uplinks (an equal-cost route), and its own address
//! ([`LB_LOOPBACK4`], the outer source) is routed to it by both routers. Real `lbd` with
//! `--iface eth0 --iface eth1`, agents on the backends, echo servers. IPv4.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, ensure};

use crate::addrs::{self, ROUTER_EDGE4, ROUTER4, VIP4_NET};
use crate::bpffs::{self, BPFFS_ROOT};
use crate::cleanup::sweep_stale;
use crate::cluster::{Binaries, TCP_PORT, UDP_PORT, XdpMode, spawn_agent, trust_args, write_report_key};
use crate::host::{Host, HostSpec, Role, wire_iface};
use crate::lbctl::Lbctl;
use crate::netns::Netns;
use crate::process::{Daemon, Registry};
use crate::tempdir::TempDir;
use crate::{echo, ping, xdp_pass};

/// The balancer's own address, on `lo`: its outer source, which both routers route to it.
pub const LB_LOOPBACK4: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
/// r2's addresses (r1 has the fleet router's: [`ROUTER4`], [`ROUTER_EDGE4`]).
pub const ROUTER2_CORE4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
pub const ROUTER2_EDGE4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 2);
const CORE4_NET: &str = "10.0.0.0/24";
const EDGE4_NET: &str = "10.1.0.0/24";

/// The point-to-point link of uplink `n` (0, 1): the router's and the balancer's address.
fn uplink_addrs(n: usize) -> (String, String) {
    (format!("10.2.{}.1", n + 1), format!("10.2.{}.2", n + 1))
}

/// The balancer's interface names, uplink by uplink.
pub const UPLINKS: [&str; 2] = ["eth0", "eth1"];

pub struct TwoUplinks {
    // Field order is drop order: processes first, namespaces after, the directory last.
    lbd: Mutex<Option<Daemon>>,
    _agents: Vec<Daemon>,
    _echo: Vec<Daemon>,
    _router_xdp: Vec<OwnedFd>,
    bins: Binaries,
    registry: Arc<Registry>,
    lb: Netns,
    routers: Vec<Netns>,
    clients: Vec<Host>,
    backends: Vec<Host>,
    _core: Netns,
    _edge: Netns,
    pin_dir: PathBuf,
    report_key: PathBuf,
    tempdir: TempDir,
    _shared: crate::alone::Shared,
}

impl TwoUplinks {
    /// Builds the network, starts the backends' echo servers and agents (not `lbd`).
    pub fn build(bins: Binaries, clients: usize, backends: usize) -> Result<TwoUplinks> {
        let shared = crate::alone::shared()?;
        if let Err(err) = sweep_stale() {
            eprintln!("spillway-harness: {err:#}");
        }
        let id = crate::topology::next_id();
        let tempdir = TempDir::create(std::env::temp_dir().join(&id))?;
        let registry = Arc::new(Registry::new(tempdir.path().to_owned()));
        let core = crate::topology::build_bridge_named(&id, "core", &registry)?;
        let edge = crate::topology::build_bridge_named(&id, "edge", &registry)?;
        let lb = Netns::create("lb", format!("{id}-lb"), Arc::clone(&registry))?;
        let mut router_xdp = Vec::new();
        let mut routers = Vec::new();
        for n in 0..2 {
            let (router, xdp) = build_router(&id, n, &registry, &core, &edge, &lb)?;
            routers.push(router);
            router_xdp.extend(xdp);
        }
        configure_balancer(&lb)?;
        let clients = (1..=clients)
            .map(|n| {
                let spec =
                    HostSpec { name: format!("c{n}"), role: Role::EdgeClient, ipv4: addrs::edge_client4(n), ipv6: addrs::edge_client6(n) };
                Host::create(spec, &id, &edge, Arc::clone(&registry))
            })
            .collect::<Result<Vec<_>>>()?;
        let backends = (1..=backends)
            .map(|n| {
                let spec = HostSpec { name: format!("b{n}"), role: Role::Backend, ipv4: addrs::backend4(n), ipv6: addrs::backend6(n) };
                let host = Host::create(spec, &id, &core, Arc::clone(&registry))?;
                // Replies go straight back to the clients (DSR) and to the balancer, by r1.
                host.run(&["ip", "route", "add", "default", "via", &ROUTER4.to_string()])?;
                Ok(host)
            })
            .collect::<Result<Vec<_>>>()?;
        bpffs::ensure_mounted()?;
        let pin_dir = Path::new(BPFFS_ROOT).join(&id);
        std::fs::create_dir(&pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
        let report_key = tempdir.path().join("report.key");
        write_report_key(&report_key)?;
        let mut net = TwoUplinks {
            lbd: Mutex::new(None),
            _agents: Vec::new(),
            _echo: Vec::new(),
            _router_xdp: router_xdp,
            bins,
            registry,
            lb,
            routers,
            clients,
            backends,
            _core: core,
            _edge: edge,
            pin_dir,
            report_key,
            tempdir,
            _shared: shared,
        };
        net.start_backends()?;
        Ok(net)
    }

    fn start_backends(&mut self) -> Result<()> {
        let trust = trust_args(&[IpAddr::V4(LB_LOOPBACK4)], &self.report_key);
        for b in &self.backends {
            self._echo.push(echo::start_echo(b, TCP_PORT, UDP_PORT)?);
            let pin_dir = self.pin_dir.join(format!("agent-{}", b.name()));
            self._agents.push(spawn_agent(b, &self.bins.lbd, XdpMode::Native, &pin_dir, &trust)?);
        }
        Ok(())
    }

    /// Starts `lbd` on the uplinks `ifaces` with `extra` arguments; returns once its API
    /// answers.
    pub fn start_lbd(&self, ifaces: &[&str], extra: &[&str]) -> Result<()> {
        let mut slot = self.lbd.lock().unwrap_or_else(|p| p.into_inner());
        ensure!(slot.as_ref().is_none_or(|d| !d.is_running()), "lbd is already running");
        for b in &self.backends {
            self.lb.in_netns(|| ping(IpAddr::V4(b.ipv4()), Duration::from_secs(1)))?;
        }
        let (api, state, pin_dir) = (self.api_socket(), self.tempdir.path().join("state"), self.pin_dir.join("lb"));
        let mut args: Vec<String> = vec![self.bins.lbd.display().to_string()];
        for iface in ifaces {
            args.extend(["--iface".to_owned(), (*iface).to_owned()]);
        }
        #[rustfmt::skip]
        args.extend([
            "--api", &api.display().to_string(), "--state-dir", &state.display().to_string(),
            "--pin-dir", &pin_dir.display().to_string(), "--outer-src", &LB_LOOPBACK4.to_string(),
            "--health-slow-start-ms", "0", "--report-key", &self.report_key.display().to_string(),
        ].map(str::to_owned));
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        *slot = Some(self.lb.spawn(&args)?);
        drop(slot);
        let running = || self.lbd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(Daemon::is_running);
        self.ctl().wait_for_lbd(&running, &|| self.lbd_log())
    }

    /// Signals `lbd` and waits for it to exit.
    pub fn stop_lbd(&self, signal: crate::Signal) -> Result<()> {
        let slot = self.lbd.lock().unwrap_or_else(|p| p.into_inner());
        let lbd = slot.as_ref().context("lbd was never started")?;
        lbd.signal(signal)?;
        ensure!(lbd.wait_with_timeout(crate::lbctl::STOP_TIMEOUT)?.is_some(), "lbd still runs after {signal}");
        Ok(())
    }

    pub fn signal_lbd(&self, signal: crate::Signal) -> Result<()> {
        self.lbd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().context("lbd was never started")?.signal(signal)
    }

    pub fn lbd_log(&self) -> String {
        self.lbd.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(Daemon::log).unwrap_or_default()
    }

    pub fn api_socket(&self) -> PathBuf {
        self.tempdir.path().join("api.sock")
    }

    /// A file in the network's temporary directory (a configuration file, say).
    pub fn file(&self, name: &str) -> PathBuf {
        self.tempdir.path().join(name)
    }

    pub fn ctl(&self) -> Lbctl {
        Lbctl::new(self.bins.lbctl.clone(), self.api_socket())
    }

    pub fn lb(&self) -> &Netns {
        &self.lb
    }

    /// Router `r<n+1>` (the router of uplink `n`).
    pub fn router(&self, n: usize) -> &Netns {
        &self.routers[n]
    }

    pub fn clients(&self) -> &[Host] {
        &self.clients
    }

    pub fn backends(&self) -> &[Host] {
        &self.backends
    }

    /// Sends `client`'s VIP traffic to the balancer by uplink `n` (its router), as a router
    /// fabric moving it would.
    pub fn route_by(&self, client: &Host, n: usize) -> Result<()> {
        let gateway = [ROUTER_EDGE4, ROUTER2_EDGE4][n].to_string();
        client.run(&["ip", "route", "replace", VIP4_NET, "via", &gateway]).map(drop)
    }

    /// Routes the balancer's own traffic and its tunnels by uplink `n` alone, as its routing
    /// daemon would once the other uplink is gone (deleting an interface deletes the
    /// equal-cost routes through it).
    pub fn route_balancer_by(&self, n: usize) -> Result<()> {
        let (router, _) = uplink_addrs(n);
        for net in [CORE4_NET, EDGE4_NET] {
            self.lb.run(&["ip", "route", "replace", net, "src", &LB_LOOPBACK4.to_string(), "via", &router, "dev", UPLINKS[n]])?;
        }
        Ok(())
    }

    /// Frames router `r<n+1>` has sent to the balancer (its uplink's transmit counter).
    pub fn frames_to_balancer(&self, n: usize) -> Result<u64> {
        let text = self.routers[n].run(&["ip", "-j", "-s", "link", "show", "dev", "eth2"])?;
        let json: serde_json::Value = serde_json::from_str(&text).context("parsing ip -j link")?;
        json[0]["stats64"]["tx"]["packets"].as_u64().context("no stats64.tx.packets in ip -j -s link")
    }
}

impl Drop for TwoUplinks {
    fn drop(&mut self) {
        self.registry.stop_all();
        if std::thread::panicking() {
            eprintln!("---- lbd ----\n{}", self.lbd_log());
        }
        if let Err(err) = std::fs::remove_dir_all(&self.pin_dir) {
            eprintln!("spillway-harness: cannot remove {}: {err}", self.pin_dir.display());
        }
    }
}

/// Router `r<n+1>`: `eth0` on the core network, `eth1` on the edge, `eth2` to the
/// balancer's uplink `n` (whose end it creates in `lb`, as `eth<n>`). Its end of the uplink
/// runs XDP_PASS, so the balancer's XDP_TX and redirects into the veth are delivered.
fn build_router(id: &str, n: usize, registry: &Arc<Registry>, core: &Netns, edge: &Netns, lb: &Netns) -> Result<(Netns, Vec<OwnedFd>)> {
    let label = format!("r{}", n + 1);
    let router = Netns::create(&label, format!("{id}-{label}"), Arc::clone(registry))?;
    let mut xdp = vec![
        wire_iface(&router, "eth0", &format!("p-{label}"), 1600, core)?,
        wire_iface(&router, "eth1", &format!("e-{label}"), 1600, edge)?,
    ];
    let uplink = UPLINKS[n];
    router.run(&["ip", "link", "add", "eth2", "mtu", "1600", "type", "veth", "peer", "name", uplink, "mtu", "1600", "netns", lb.name()])?;
    let (core4, edge4) = [(ROUTER4, ROUTER_EDGE4), (ROUTER2_CORE4, ROUTER2_EDGE4)][n];
    let (own, balancer) = uplink_addrs(n);
    router.run(&["ip", "link", "set", "lo", "up"])?;
    for (ifname, addr) in [("eth0", format!("{core4}/24")), ("eth1", format!("{edge4}/24")), ("eth2", format!("{own}/30"))] {
        router.run(&["ip", "link", "set", ifname, "up"])?;
        router.run(&["ip", "addr", "add", &addr, "dev", ifname])?;
        router.run(&["ethtool", "-K", ifname, "tx", "off"])?;
    }
    let other_core = [ROUTER2_CORE4, ROUTER4][n].to_string();
    // The VIPs and the balancer's address by its uplink; the balancer's address by the other
    // router while this uplink is down.
    router.run(&["ip", "route", "add", VIP4_NET, "via", &balancer, "metric", "10"])?;
    router.run(&["ip", "route", "add", &format!("{LB_LOOPBACK4}/32"), "via", &balancer, "metric", "10"])?;
    router.run(&["ip", "route", "add", &format!("{LB_LOOPBACK4}/32"), "via", &other_core, "metric", "20"])?;
    // The other uplink's link (the health probes' source is the balancer's first interface's
    // address) by the other router.
    router.run(&["ip", "route", "add", &format!("10.2.{}.0/30", 2 - n), "via", &other_core])?;
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
        ("net.ipv4.conf.all.ignore_routes_with_linkdown", "1"),
        ("net.ipv4.ping_group_range", "0 2147483647"),
    ] {
        router.sysctl(key, value)?;
    }
    for ifname in ["eth0", "eth1", "eth2"] {
        router.sysctl(&format!("net.ipv4.conf.{ifname}.rp_filter"), "0")?;
    }
    let ifindex = router.in_netns(|| nix::net::if_::if_nametoindex("eth2")).context("index of eth2")?;
    xdp.push(router.in_netns(|| xdp_pass::attach(ifindex))?);
    Ok((router, xdp))
}

/// The balancer: both uplinks up and forwarding, its address on `lo`, the backends and the
/// clients by both routers at equal cost.
fn configure_balancer(lb: &Netns) -> Result<()> {
    lb.run(&["ip", "link", "set", "lo", "up"])?;
    lb.run(&["ip", "addr", "add", &format!("{LB_LOOPBACK4}/32"), "dev", "lo"])?;
    for (n, ifname) in UPLINKS.iter().enumerate() {
        let (_, own) = uplink_addrs(n);
        lb.run(&["ip", "link", "set", ifname, "up"])?;
        lb.run(&["ip", "addr", "add", &format!("{own}/30"), "dev", ifname])?;
        lb.run(&["ethtool", "-K", ifname, "tx", "off"])?;
    }
    let (r1, _) = uplink_addrs(0);
    let (r2, _) = uplink_addrs(1);
    // Its own packets (probes, the agents' polls) leave from its address, which the others
    // route back to it.
    let src = LB_LOOPBACK4.to_string();
    for net in [CORE4_NET, EDGE4_NET] {
        #[rustfmt::skip]
        lb.run(&["ip", "route", "add", net, "src", &src, "nexthop", "via", &r1, "dev", UPLINKS[0], "nexthop", "via", &r2, "dev", UPLINKS[1]])?;
    }
    for (key, value) in [
        ("net.ipv4.ip_forward", "1"),
        ("net.ipv6.conf.all.forwarding", "1"),
        ("net.ipv4.conf.all.rp_filter", "0"),
        ("net.ipv4.conf.default.rp_filter", "0"),
        ("net.ipv4.conf.all.ignore_routes_with_linkdown", "1"),
        ("net.ipv4.fib_multipath_hash_policy", "1"),
        ("net.ipv4.ping_group_range", "0 2147483647"),
    ] {
        lb.sysctl(key, value)?;
    }
    for ifname in UPLINKS {
        lb.sysctl(&format!("net.ipv4.conf.{ifname}.accept_local"), "1")?;
        lb.sysctl(&format!("net.ipv4.conf.{ifname}.rp_filter"), "0")?;
    }
    Ok(())
}
