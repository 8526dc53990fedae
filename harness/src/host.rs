//! One host of the topology: a namespace with an `eth0` veth plugged into the
//! bridge, addresses, and the settings its role needs.

use std::ffi::OsStr;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::sync::Arc;

use std::os::fd::OwnedFd;

use anyhow::{Context, Result};

use crate::addrs::{HOST_PREFIX4, HOST_PREFIX6, LB4, LB6, ROUTER_EDGE4, ROUTER_EDGE6, VIP4, VIP4_NET, VIP6, VIP6_NET};
use crate::netns::Netns;
use crate::process::{Daemon, Registry};
use crate::xdp_pass;

/// MTU of the balancer's and backends' links: the balancer forwards
/// client-sized (1500) packets with an extra 20/40-byte IPIP header.
pub(crate) const TUNNEL_MTU: u32 = 1600;
pub(crate) const CLIENT_MTU: u32 = 1500;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Client,
    Balancer,
    Backend,
    /// A client of a fleet (`crate::fleet`): behind the router, which it routes everything to.
    EdgeClient,
}

/// What to create: name ("b1"), role and addresses.
pub(crate) struct HostSpec {
    pub(crate) name: String,
    pub(crate) role: Role,
    pub(crate) ipv4: Ipv4Addr,
    pub(crate) ipv6: Ipv6Addr,
}

/// A host namespace (client, balancer or backend). Its namespace is deleted
/// when the host is dropped, i.e. with its [`crate::Topology`].
#[derive(Debug)]
pub struct Host {
    netns: Netns,
    ipv4: Ipv4Addr,
    ipv6: Ipv6Addr,
    /// Keeps `XDP_PASS` attached to the bridge-side peer (see [`xdp_pass`]) until
    /// [`Host::detach_peer_xdp`].
    peer_xdp: std::sync::Mutex<Option<OwnedFd>>,
}

impl Host {
    /// Creates the namespace, wires `eth0` to `br0` in `bridge`, and applies
    /// the role's settings. On error the half-built namespace is deleted
    /// (the `Netns` is dropped).
    pub(crate) fn create(spec: HostSpec, ns_prefix: &str, bridge: &Netns, registry: Arc<Registry>) -> Result<Host> {
        let name = &spec.name;
        let netns = Netns::create(name, format!("{ns_prefix}-{name}"), registry)?;
        let peer_xdp = wire(&netns, spec.role, bridge).with_context(|| format!("wiring host {name}"))?;
        let host = Host { netns, ipv4: spec.ipv4, ipv6: spec.ipv6, peer_xdp: std::sync::Mutex::new(Some(peer_xdp)) };
        host.configure(spec.role).with_context(|| format!("setting up host {name}"))?;
        Ok(host)
    }

    /// Removes the `XDP_PASS` program from the bridge-side peer of `eth0`: frames this host
    /// sends with XDP_TX are then dropped by the veth, as on a misconfigured host.
    pub fn detach_peer_xdp(&self) {
        drop(self.peer_xdp.lock().unwrap_or_else(|p| p.into_inner()).take());
    }

    /// The short name: `lb`, `c1`, `b3`...
    pub fn name(&self) -> &str {
        self.netns.label()
    }

    /// The host's own IPv4 address on `eth0`.
    pub fn ipv4(&self) -> Ipv4Addr {
        self.ipv4
    }

    /// The host's own IPv6 address on `eth0`.
    pub fn ipv6(&self) -> Ipv6Addr {
        self.ipv6
    }

    /// The host's namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// See [`Netns::cmd`].
    pub fn cmd(&self, program: impl AsRef<OsStr>) -> Command {
        self.netns.cmd(program)
    }

    /// See [`Netns::run`].
    pub fn run<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<String> {
        self.netns.run(args)
    }

    /// See [`Netns::in_netns`].
    pub fn in_netns<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        self.netns.in_netns(f)
    }

    /// See [`Netns::sysctl`].
    pub fn sysctl(&self, key: &str, value: &str) -> Result<()> {
        self.netns.sysctl(key, value)
    }

    /// See [`Netns::spawn`].
    pub fn spawn<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<Daemon> {
        self.netns.spawn(args)
    }

    /// See [`Netns::spawn_command`].
    pub fn spawn_command(&self, label: &str, cmd: Command) -> Result<Daemon> {
        self.netns.spawn_command(label, cmd)
    }

    fn configure(&self, role: Role) -> Result<()> {
        let v4 = format!("{}/{HOST_PREFIX4}", self.ipv4);
        let v6 = format!("{}/{HOST_PREFIX6}", self.ipv6);
        self.run(&["ip", "link", "set", "lo", "up"])?;
        self.run(&["ip", "link", "set", "eth0", "up"])?;
        self.run(&["ip", "addr", "add", &v4, "dev", "eth0"])?;
        // nodad: usable at once instead of "tentative" for a second or more.
        self.run(&["ip", "-6", "addr", "add", &v6, "dev", "eth0", "nodad"])?;
        // Locally generated packets leave with CHECKSUM_PARTIAL; an XDP
        // program that forwards them (XDP_TX) would send them with a bogus
        // checksum. Computing checksums in software avoids that.
        self.run(&["ethtool", "-K", "eth0", "tx", "off"])?;
        // Lets unprivileged-style ICMP "ping sockets" work for root too, so the
        // harness checks reachability in-process without a `ping` binary.
        self.sysctl("net.ipv4.ping_group_range", "0 2147483647")?;
        match role {
            Role::Client => self.route_vips_via_balancer(),
            Role::Balancer => self.enable_forwarding(),
            Role::Backend => self.accept_vips_for_dsr(),
            Role::EdgeClient => self.route_default_via_router(),
        }
    }

    fn route_default_via_router(&self) -> Result<()> {
        let (gw4, gw6) = (ROUTER_EDGE4.to_string(), ROUTER_EDGE6.to_string());
        self.run(&["ip", "route", "add", "default", "via", &gw4])?;
        self.run(&["ip", "-6", "route", "add", "default", "via", &gw6])?;
        Ok(())
    }

    fn route_vips_via_balancer(&self) -> Result<()> {
        let (lb4, lb6) = (LB4.to_string(), LB6.to_string());
        self.run(&["ip", "route", "add", VIP4_NET, "via", &lb4])?;
        self.run(&["ip", "-6", "route", "add", VIP6_NET, "via", &lb6])?;
        Ok(())
    }

    /// The balancer hands packets whose next hop is not resolved yet to the kernel, already
    /// encapsulated with its own address as source: the kernel must forward them, and must
    /// not drop them as "martian" for carrying a local source address.
    fn enable_forwarding(&self) -> Result<()> {
        self.sysctl("net.ipv4.ip_forward", "1")?;
        self.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        self.sysctl("net.ipv4.conf.eth0.accept_local", "1")
    }

    /// Direct server return: the backend owns the VIPs (on `lo`, so it
    /// accepts and answers from them) but must not answer ARP for them, or
    /// clients would bypass the balancer; and packets arriving with a client
    /// source on an unexpected interface must not be dropped by rp_filter.
    fn accept_vips_for_dsr(&self) -> Result<()> {
        let (vip4, vip6) = (format!("{VIP4}/32"), format!("{VIP6}/128"));
        self.run(&["ip", "addr", "add", &vip4, "dev", "lo"])?;
        self.run(&["ip", "-6", "addr", "add", &vip6, "dev", "lo", "nodad"])?;
        for (key, value) in [
            ("net.ipv4.conf.all.arp_ignore", "1"),
            ("net.ipv4.conf.eth0.arp_ignore", "1"),
            ("net.ipv4.conf.all.arp_announce", "2"),
            ("net.ipv4.conf.eth0.arp_announce", "2"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.eth0.rp_filter", "0"),
            ("net.ipv4.conf.lo.rp_filter", "0"),
        ] {
            self.sysctl(key, value)?;
        }
        Ok(())
    }
}

/// Creates the `eth0` veth of `netns` with its peer `p-<name>` directly in the bridge
/// namespace (nothing ever appears in the root namespace), plugs the peer into `br0`, and
/// attaches `XDP_PASS` to the peer so frames the host bounces with XDP_TX are delivered.
fn wire(netns: &Netns, role: Role, bridge: &Netns) -> Result<OwnedFd> {
    let mtu = match role {
        Role::Client | Role::EdgeClient => CLIENT_MTU,
        Role::Balancer | Role::Backend => TUNNEL_MTU,
    };
    wire_iface(netns, "eth0", &format!("p-{}", netns.label()), mtu, bridge)
}

/// Creates veth `ifname` in `netns` with its peer `peer` in `bridge`'s namespace, plugged
/// into its `br0` (see [`wire`]).
pub(crate) fn wire_iface(netns: &Netns, ifname: &str, peer: &str, mtu: u32, bridge: &Netns) -> Result<OwnedFd> {
    let mtu = mtu.to_string();
    #[rustfmt::skip]
    netns.run(&[
        "ip", "link", "add", ifname, "mtu", &mtu, "type", "veth",
        "peer", "name", peer, "mtu", &mtu, "netns", bridge.name(),
    ])?;
    bridge.run(&["ip", "link", "set", peer, "master", "br0", "up"])?;
    bridge.in_netns(|| {
        let ifindex = nix::net::if_::if_nametoindex(peer).with_context(|| format!("index of {peer}"))?;
        xdp_pass::attach(ifindex)
    })
}
