//! `cargo xtask demo`: Spillway doing its job in a sandbox. A client, the balancer and
//! backends are network namespaces on one bridge; the real `lbd` attaches the XDP balancer,
//! `lbd agent` decapsulates on every backend, and everything is configured with the real
//! `lbctl`. Live shares and counters are shown while a backend is added and another
//! drained. Everything is removed on exit or Ctrl-C.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use spillway_harness::{
    TopologyConfig, VIP4,
    cluster::{Cluster, ClusterConfig, TCP_PORT, XdpMode},
    run_connections,
};

/// How long each phase drives traffic, and how often it reports.
const PHASE: Duration = Duration::from_secs(5);
const TICK: Duration = Duration::from_secs(1);
/// New connections per tick: a steady rate that leaves the client's ephemeral ports (held
/// in TIME_WAIT for a minute) far from exhaustion.
const CONNECTIONS_PER_TICK: usize = 200;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

pub fn run() -> Result<()> {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_interrupt as *const () as libc::sighandler_t);
    }
    let bins = crate::bins::build(false)?;
    println!("Building the sandbox: client c1, balancer lb (lbd), backends b1-b3 (lbd agent)...");
    let config = ClusterConfig {
        topology: TopologyConfig { backends: 3, clients: 1 },
        mode: XdpMode::Native,
        lbd_args: Vec::new(),
        agent_args: Vec::new(),
    };
    let mut cluster = Cluster::start(bins, config)?;
    let vip = format!("{VIP4}:{TCP_PORT}/tcp");

    lbctl(&cluster, &["vips", "add", &vip])?;
    for b in cluster.topo.backends() {
        lbctl(&cluster, &["backends", "add", "--vip", &vip, &b.ipv4().to_string()])?;
    }
    drive(&cluster, "3 backends")?;

    let b4 = cluster.add_backend_host()?.ipv4().to_string();
    lbctl(&cluster, &["backends", "add", "--vip", &vip, &b4])?;
    println!("  b4 joins: it takes about a quarter of new connections");
    drive(&cluster, "b4 added")?;

    let b2 = cluster.topo.backends()[1].ipv4().to_string();
    lbctl(&cluster, &["backends", "drain", "--vip", &vip, &b2])?;
    println!("  b2 drains: its open flows stay, new ones go elsewhere");
    drive(&cluster, "b2 draining")?;

    cluster.stop_echo(2)?;
    println!("  b3's service crashes: health checks take it out within ~3 s, no new connection fails after");
    drive(&cluster, "b3 crashed")?;

    lbctl(&cluster, &["vips", "list"])?;
    lbctl(&cluster, &["backends", "list", "--vip", &vip])?;
    lbctl(&cluster, &["stats"])?;
    println!("Cleaning up: lbd, agents, namespaces, pinned programs and maps.");
    Ok(())
}

/// Builds `lbd` and `lbctl` (same profile as this task) and returns their paths.
/// Runs and echoes an `lbctl` command, as an operator would type it.
fn lbctl(cluster: &Cluster, args: &[&str]) -> Result<()> {
    println!("$ lbctl {}", args.join(" "));
    let out = cluster.lbctl(args)?;
    for line in out.lines() {
        println!("  {line}");
    }
    Ok(())
}

/// Opens connections from c1 to the VIP for one phase, printing each second which backend
/// answered them and what the data path counted per backend.
fn drive(cluster: &Cluster, phase: &str) -> Result<()> {
    let client = &cluster.topo.clients()[0];
    let target = SocketAddr::new(IpAddr::V4(VIP4), TCP_PORT);
    let started = Instant::now();
    while started.elapsed() < PHASE {
        ensure!(!INTERRUPTED.load(Ordering::Relaxed), "interrupted");
        let tick = Instant::now();
        let spacing = TICK / CONNECTIONS_PER_TICK as u32;
        let tally = client.in_netns(|| run_connections(target, CONNECTIONS_PER_TICK, spacing, CONNECT_TIMEOUT));
        std::thread::sleep(TICK.saturating_sub(tick.elapsed()));
        let total = tally.successes().max(1);
        let shares: Vec<String> = cluster
            .topo
            .backends()
            .iter()
            .map(|b| {
                let n = tally.by_backend.get(b.name()).copied().unwrap_or(0);
                format!("{} {:>3.0}%", b.name(), 100.0 * n as f64 / total as f64)
            })
            .collect();
        let packets = backend_packets(cluster)?;
        println!(
            "[{phase:<11}] {:>4} conn/s  {}  failed {}  | XDP packets per backend {packets:?}",
            tally.successes(),
            shares.join("  "),
            tally.failures
        );
    }
    Ok(())
}

/// Packets the data path sent to each backend so far, from `lbctl stats -o json`.
fn backend_packets(cluster: &Cluster) -> Result<BTreeMap<String, u64>> {
    let stats = cluster.lbctl_json(&["stats"])?;
    let mut packets = BTreeMap::new();
    for vip in stats["vips"].as_array().context("stats: vips")? {
        for b in vip["backends"].as_array().context("stats: backends")? {
            let address = b["address"].as_str().context("stats: address")?;
            let name = cluster.topo.backends().iter().find(|h| h.ipv4().to_string() == address).map_or(address, |h| h.name());
            packets.insert(name.to_owned(), b["packets"].as_u64().context("stats: packets")?);
        }
    }
    Ok(packets)
}
