//! Shared setup of the fleet scenarios: the fleet, the same desired state on every
//! balancer, and what the router and the balancers' BIRDs see.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use spillway_announce::bird::{Bird, RouteInfo};
use spillway_harness::cluster::{Binaries, TCP_PORT, XdpMode};
use spillway_harness::fleet::{Balancer, Fleet, FleetConfig, HTTP_PORT};
pub use spillway_harness::support::{reason_count, vip_json};
use spillway_harness::{Host, VIP4};

/// How often `lbd` decides its announcements (`daemon::announce::INTERVAL`).
pub const ROUND: Duration = spillway_daemon::announce::INTERVAL;

/// The fleet's two VIPs share one address, so one host route: long-lived echo streams on
/// one, HTTP requests (one connection each) on the other.
pub fn echo_vip() -> String {
    format!("{VIP4}:{TCP_PORT}/tcp")
}

pub fn http_vip() -> String {
    format!("{VIP4}:{HTTP_PORT}/tcp")
}

/// A fleet of `balancers` (short hold: 2 s degraded before a withdrawal), `backends` and
/// `clients`, each balancer with `lbd_args` too.
pub fn start(balancers: usize, backends: usize, clients: usize, lbd_args: &[&str]) -> Fleet {
    let bins = Binaries::beside(env!("CARGO_BIN_EXE_lbd"));
    let mut args: Vec<String> = vec!["--announce-hold-s".into(), "2".into()];
    args.extend(lbd_args.iter().map(|a| a.to_string()));
    let config = FleetConfig { balancers, backends, clients, mode: XdpMode::Native, lbd_args: args };
    Fleet::start(bins, config).expect("starting the fleet")
}

/// The fleet's desired state, as every balancer gets it: both VIPs with the backends
/// `backends` (indexes), written as a configuration file.
pub fn fleet_file(fleet: &Fleet, backends: &[usize]) -> PathBuf {
    let mut toml = String::from("# The fleet's desired state: lbctl apply -f on every balancer.\n");
    for vip in [echo_vip(), http_vip()] {
        toml.push_str(&format!("\n[[vips]]\nvip = \"{vip}\"\n"));
        for &i in backends {
            toml.push_str(&format!("\n[[vips.backends]]\naddress = \"{}\"\n", fleet.backends()[i].ipv4()));
        }
    }
    let path = fleet.tempdir().join(format!("fleet-{}.toml", backends.iter().map(|i| i.to_string()).collect::<Vec<_>>().join("-")));
    std::fs::write(&path, toml).unwrap();
    path
}

/// Applies the fleet's state with `backends` to `balancer` (`lbctl apply -f`).
pub fn apply(fleet: &Fleet, balancer: &Balancer, backends: &[usize]) {
    let file = fleet_file(fleet, backends);
    balancer.lbctl(&["apply", "-f", &file.display().to_string()]).unwrap();
}

/// Every backend, in order.
pub fn all(fleet: &Fleet) -> Vec<usize> {
    (0..fleet.backends().len()).collect()
}

/// Waits until the router's route to the VIP goes exactly through `balancers`.
pub fn wait_for_next_hops(fleet: &Fleet, balancers: &[&Balancer], timeout: Duration) -> Duration {
    wait_for_route(fleet, VIP4, balancers.iter().map(|b| b.ipv4()).collect(), || fleet.router_next_hops(VIP4), timeout)
}

/// Waits until `hops` (the router's next hops to `vip`, of either family) are exactly `want`.
pub fn wait_for_route<A: Ord + std::fmt::Debug>(
    fleet: &Fleet,
    vip: impl std::fmt::Display,
    mut want: Vec<A>,
    hops: impl Fn() -> Vec<A>,
    timeout: Duration,
) -> Duration {
    want.sort();
    fleet
        .wait_for(timeout, &format!("router's route to {vip} via {want:?}"), || {
            let mut now = hops();
            now.sort();
            Ok(now == want)
        })
        .unwrap_or_else(|e| panic!("{e:#}; the router has {:?}", hops()))
}

/// The router's BGP paths to the VIP (from its own BIRD).
pub fn router_paths(fleet: &Fleet) -> Vec<RouteInfo> {
    Bird::connect(&fleet.router_bird_socket()).and_then(|mut b| b.routes("master4", IpAddr::V4(VIP4))).unwrap_or_default()
}

/// The announcement state of the VIP's address on `balancer` (`announced`, ...).
pub fn announcement(balancer: &Balancer) -> String {
    vip_json(balancer, &echo_vip())["announcement"]["state"].as_str().unwrap_or("none").to_owned()
}

/// `balancer`'s announcements as `lbctl status` sums them up, and its text line.
pub fn status_announcements(balancer: &Balancer) -> (Value, String) {
    let json = balancer.lbctl_json(&["status"]).unwrap()["announcements"].clone();
    let text = balancer.lbctl(&["status"]).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("announcements")).unwrap_or_else(|| panic!("no announcements line in {text}"));
    (json, line.trim().to_owned())
}

/// Packets of `vip` `balancer` has seen (`lbctl stats`).
pub fn vip_packets(balancer: &Balancer, vip: &str) -> u64 {
    let stats = balancer.lbctl_json(&["stats"]).unwrap();
    stats["vips"].as_array().unwrap().iter().find(|v| v["vip"] == vip).and_then(|v| v["packets"].as_u64()).unwrap_or(0)
}

/// `count` new connections to the echo VIP from each client, one after the other; the
/// backends that answered, failures as errors.
pub fn connect_all(fleet: &Fleet, count: usize) -> spillway_harness::Tally {
    connect_all_to(fleet, spillway_harness::fleet::vip_target(TCP_PORT), count)
}

/// [`connect_all`] to `target`.
pub fn connect_all_to(fleet: &Fleet, target: std::net::SocketAddr, count: usize) -> spillway_harness::Tally {
    let mut total = spillway_harness::Tally::default();
    for client in fleet.clients() {
        let tally = client.in_netns(|| spillway_harness::run_connections(target, count, Duration::ZERO, Duration::from_secs(3)));
        for (name, n) in tally.by_backend {
            *total.by_backend.entry(name).or_default() += n;
        }
        total.failures += tally.failures;
        total.errors.extend(tally.errors);
    }
    total
}

/// The client hosts, for load generators.
pub fn client(fleet: &Fleet, i: usize) -> &Host {
    &fleet.clients()[i]
}

/// `per_client` long-lived connections to the echo VIP from every client, each answered once.
pub fn open_streams(fleet: &Fleet, per_client: usize) -> Vec<spillway_harness::Stream> {
    let mut streams = Vec::new();
    for client in fleet.clients() {
        for _ in 0..per_client {
            let target = spillway_harness::fleet::vip_target(TCP_PORT);
            let mut stream = client.in_netns(|| spillway_harness::Stream::open(target, Duration::from_secs(10))).unwrap();
            stream.ping().unwrap();
            streams.push(stream);
        }
    }
    streams
}
