//! Shared setup for the end-to-end scenarios.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

use spillway_harness::cluster::{Binaries, Cluster, ClusterConfig, TCP_PORT, UDP_PORT, XdpMode};
pub use spillway_harness::support::{reason_count, vip_json};
use spillway_harness::{Host, Tally, TopologyConfig, VIP4, VIP6, run_connections};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a failed backend may stay in the table: `interval × fall + timeout` with the
/// default health settings (1 s, 2, 1 s), and 2 s for the test's own polling (each poll runs
/// `lbctl`; a loaded 2-core machine once took 4.03 s with 1 s).
pub const DETECTION_BOUND: Duration = Duration::from_secs(5);

pub fn start(mode: XdpMode, backends: usize) -> Cluster {
    start_with(mode, backends, 1, &[])
}

/// A cluster whose `lbd` gets `lbd_args` too.
pub fn start_with(mode: XdpMode, backends: usize, clients: usize, lbd_args: &[&str]) -> Cluster {
    start_configured(mode, backends, clients, lbd_args, &[])
}

/// A cluster whose `lbd` gets `lbd_args` and whose agents get `agent_args` too.
pub fn start_configured(mode: XdpMode, backends: usize, clients: usize, lbd_args: &[&str], agent_args: &[&str]) -> Cluster {
    let bins = Binaries::beside(env!("CARGO_BIN_EXE_lbd"));
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect();
    let config =
        ClusterConfig { topology: TopologyConfig { backends, clients }, mode, lbd_args: owned(lbd_args), agent_args: owned(agent_args) };
    Cluster::start(bins, config).expect("starting the cluster")
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

/// An even share for each of `names`.
pub fn even(names: &[&'static str]) -> BTreeMap<&'static str, f64> {
    names.iter().map(|n| (*n, 1.0 / names.len() as f64)).collect()
}

/// Asserts no failures and that each named backend got `share` of `total` within ±40%
/// of the expected count: about 3 standard deviations for a share of 1/4 at 200
/// connections, 1/2 at 60, 1/3 at 100; smaller samples flake.
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

/// Polls `check` every 100 ms until it holds; panics with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !check() {
        assert!(started.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Backend `addr` of `vip` as `lbctl backends list -o json` shows it.
pub fn backend_json(c: &Cluster, vip: &str, addr: &str) -> serde_json::Value {
    let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    list["backends"].as_array().unwrap().iter().find(|b| b["address"] == addr).cloned().unwrap_or_else(|| panic!("{addr} not in {list}"))
}

/// `lbctl vips list` and `backends list` without what changes by itself from one moment to
/// the next (how long a state has lasted, probe latency, why): what a change must not touch.
pub fn stable_view(c: &Cluster, vip: &str) -> (Value, Value) {
    let mut backends = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    for b in backends["backends"].as_array_mut().unwrap() {
        let b = b.as_object_mut().unwrap();
        for volatile in ["state_for_s", "latency_ms", "reason", "unknown_probes"] {
            b.remove(volatile);
        }
    }
    (c.lbctl_json(&["vips", "list"]).unwrap(), backends)
}

/// Every backend of `vip` is healthy and carries its configured weight.
pub fn all_healthy(c: &Cluster, vip: &str) -> bool {
    let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    list["backends"].as_array().unwrap().iter().all(|b| b["health"] == "healthy" && b["effective_weight"] == b["weight"])
}

/// The metrics endpoint's classic text (what curl and promtool get), fetched inside `host`.
pub fn scrape(host: &Host, addr: &str) -> String {
    let addr: SocketAddr = addr.parse().unwrap();
    let (status, body) = host.in_netns(|| spillway_harness::http_get(addr, "/metrics", Duration::from_secs(5))).expect("scraping");
    assert_eq!(status, 200, "{body}");
    body
}

/// The value of the series `name` whose labels include `labels`.
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let series = spillway_harness::promql::series(line).pop()?;
        let matches = series.name == name && labels.iter().all(|(k, v)| series.labels.iter().any(|(sk, sv)| sk == k && sv == v));
        matches.then(|| line.rsplit(' ').next()?.parse().ok()).flatten()
    })
}

/// Kills `lbd` (SIGKILL) while c1 opens a new connection every 20 ms for 10 s beside a
/// long-lived one, and starts it again: asserts that no connection failed or broke.
pub fn restart_under_load(c: &Cluster) {
    const CONNECTIONS: usize = 500;
    const INTERVAL: Duration = Duration::from_millis(20);
    let stream = c.topo.clients()[0].in_netns(|| spillway_harness::Stream::open(tcp_target(false), CONNECT_TIMEOUT)).unwrap();
    let checker = spillway_harness::StreamChecker::start(stream, Duration::from_millis(50));
    let client = c.topo.clients()[0].netns();
    let tally = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| client.in_netns(|| run_connections(tcp_target(false), CONNECTIONS, INTERVAL, CONNECT_TIMEOUT)));
        std::thread::sleep(Duration::from_secs(2));
        c.stop_lbd(spillway_harness::Signal::SIGKILL).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        c.start_lbd().expect("restarting lbd");
        traffic.join().unwrap()
    });
    let report = checker.stop();
    assert_eq!(tally.failures, 0, "connections failed across the restart: {:?}", tally.errors);
    assert_eq!(tally.successes(), CONNECTIONS);
    assert_eq!(report.failures, 0, "the long-lived connection broke: {:?}", report.errors);
}
