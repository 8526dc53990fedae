//! Shared setup for the end-to-end scenarios.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use spillway_harness::cluster::{Binaries, Cluster, ClusterConfig, TCP_PORT, UDP_PORT, XdpMode};
use spillway_harness::{Host, Tally, TopologyConfig, VIP4, VIP6, run_connections};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

pub fn start(mode: XdpMode, backends: usize) -> Cluster {
    let bins = Binaries { lbd: env!("CARGO_BIN_EXE_lbd").into(), lbctl: env!("CARGO_BIN_EXE_lbctl").into() };
    Cluster::start(bins, ClusterConfig { topology: TopologyConfig { backends, clients: 1 }, mode }).expect("starting the cluster")
}

pub fn tcp_vip(v6: bool) -> String {
    if v6 { format!("[{VIP6}]:{TCP_PORT}/tcp") } else { format!("{VIP4}:{TCP_PORT}/tcp") }
}

pub fn udp_vip() -> String {
    format!("{VIP4}:{UDP_PORT}/udp")
}

pub fn tcp_target(v6: bool) -> SocketAddr {
    let ip: IpAddr = if v6 { VIP6.into() } else { VIP4.into() };
    SocketAddr::new(ip, TCP_PORT)
}

pub fn backend_addr(host: &Host, v6: bool) -> String {
    if v6 { host.ipv6().to_string() } else { host.ipv4().to_string() }
}

/// Adds `vip` with every backend host of the cluster.
pub fn vip_with_all_backends(c: &Cluster, vip: &str, v6: bool) {
    c.lbctl(&["vips", "add", vip]).unwrap();
    for b in c.topo.backends() {
        c.lbctl(&["backends", "add", "--vip", vip, &backend_addr(b, v6)]).unwrap();
    }
}

/// `count` new connections from c1, one after the other.
pub fn connections(c: &Cluster, target: SocketAddr, count: usize) -> Tally {
    c.topo.clients()[0].in_netns(|| run_connections(target, count, Duration::ZERO, CONNECT_TIMEOUT))
}

/// Asserts no failures and that each named backend got `share` of `total` within ±40%
/// of the expected count (several standard deviations at these sizes).
pub fn assert_shares(tally: &Tally, expected: &BTreeMap<&str, f64>, total: usize) {
    assert_eq!(tally.failures, 0, "failed connections: {:?}", tally.errors);
    for (name, share) in expected {
        let want = share * total as f64;
        let got = tally.by_backend.get(*name).copied().unwrap_or(0) as f64;
        assert!((got - want).abs() <= want * 0.4 + 1.0, "{name}: {got} of {total}, expected about {want:.0}; all: {:?}", tally.by_backend);
    }
    let unexpected: Vec<_> = tally.by_backend.keys().filter(|k| !expected.contains_key(k.as_str())).collect();
    assert!(unexpected.is_empty() || expected.values().all(|s| *s > 0.0), "unexpected backends {unexpected:?}");
}
