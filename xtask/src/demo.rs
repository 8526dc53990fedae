//! `cargo xtask demo`: the balancer doing its job in a sandbox. A client, the balancer and
//! four backends live in network namespaces on one bridge; the real XDP program forwards
//! real TCP connections to the VIP, backends decapsulate with the real agent program and
//! answer the client directly. Shares are shown live while a backend is added and another
//! drained. Everything is removed on exit or Ctrl-C.

use std::{
    net::{IpAddr, SocketAddr},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::{
    Ebpf,
    maps::HashMap,
    programs::XdpMode,
};
use spillway::{
    dataplane::{self, Balancer, LoadOptions},
    model::{DEFAULT_WEIGHT, DesiredState, Vip},
    objects,
    reconcile::Reconciler,
};
use spillway_common::{
    addr::to_words,
    limits::{DEFAULT_RING_SIZE, DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S, map_names, program_names},
    types::{AddrKey, LbConfig},
};
use spillway_harness::{Host, Topology, TopologyConfig, VIP4, run_connections};

const HTTP_PORT: u16 = 80;
const UDP_PORT: u16 = 5353;
/// How long each phase drives traffic, and how many connections per sample.
const PHASE: Duration = Duration::from_secs(4);
const SAMPLE_CONNECTIONS: usize = 60;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

struct Balancing {
    balancer: Balancer,
    reconciler: Reconciler,
    state: DesiredState,
}

impl Balancing {
    fn apply(&mut self, edit: impl FnOnce(&mut DesiredState) -> Result<(), spillway::model::ModelError>) -> Result<()> {
        let mut next = self.state.clone();
        edit(&mut next)?;
        self.reconciler.apply(&mut self.balancer.maps, &next)?;
        self.state = next;
        Ok(())
    }
}

pub fn run() -> Result<()> {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_interrupt as *const () as libc::sighandler_t);
    }
    println!("Building the sandbox: client c1, balancer lb, backends b1-b4 on one bridge...");
    let topo = Topology::build(TopologyConfig { backends: 4, clients: 1 })?;
    let _servers = topo.start_echo_servers(HTTP_PORT, UDP_PORT)?;
    let _agents: Vec<Ebpf> = topo.backends().iter().map(start_agent).collect::<Result<_>>()?;
    let mut lb = start_balancer(&topo)?;

    let vip: Vip = format!("{VIP4}:{HTTP_PORT}/tcp").parse()?;
    let addr = |host: &Host| IpAddr::V4(host.ipv4());
    let b = topo.backends();
    lb.apply(|s| {
        s.add_vip(vip, DEFAULT_RING_SIZE)?;
        b[..3].iter().try_for_each(|h| s.add_backend(&vip, addr(h), DEFAULT_WEIGHT))
    })?;
    println!("VIP {vip} -> b1, b2, b3 (weight {DEFAULT_WEIGHT} each)\n");
    drive(&topo, &lb, "3 backends")?;

    lb.apply(|s| s.add_backend(&vip, addr(&b[3]), DEFAULT_WEIGHT))?;
    println!("\n+ added b4: it takes about a quarter of new connections\n");
    drive(&topo, &lb, "b4 added")?;

    lb.apply(|s| s.set_weight(&vip, addr(&b[1]), 0))?;
    println!("\n~ drained b2 (weight 0): existing flows stay, new ones go elsewhere\n");
    drive(&topo, &lb, "b2 draining")?;

    println!("\nData-path counters:");
    for (reason, count) in lb.balancer.maps.reasons()? {
        if count > 0 {
            println!("  {:<20} {count}", reason.label());
        }
    }
    println!("\nCleaning up (namespaces, programs, maps).");
    Ok(())
}

/// Loads the balancer in the lb namespace and attaches it to eth0.
fn start_balancer(topo: &Topology) -> Result<Balancing> {
    let lb = topo.lb();
    // Resolve the backends' neighbours first, as lbd does, so the first packets need no
    // kernel fallback.
    for b in topo.backends() {
        lb.in_netns(|| spillway_harness::ping(IpAddr::V4(b.ipv4()), Duration::from_secs(1)))?;
    }
    lb.in_netns(|| -> Result<Balancing> {
        let mut balancer = Balancer::load(&LoadOptions::default())?;
        let (outer_src_v4, _) = to_words(IpAddr::V4(lb.ipv4()));
        let (outer_src_v6, _) = to_words(IpAddr::V6(lb.ipv6()));
        balancer.maps.set_config(&LbConfig {
            outer_src_v4: outer_src_v4[0],
            outer_src_v6,
            tcp_idle_timeout_s: DEFAULT_TCP_IDLE_TIMEOUT_S,
            udp_idle_timeout_s: DEFAULT_UDP_IDLE_TIMEOUT_S,
            ..LbConfig::default()
        })?;
        let ifindex = nix::net::if_::if_nametoindex("eth0").context("eth0 in lb")?;
        balancer.maps.tx_ports.insert(ifindex, ifindex, None, 0)?;
        balancer.program()?.attach(ifindex, XdpMode::Driver)?;
        let reconciler = Reconciler::adopt(&balancer.maps)?;
        Ok(Balancing { balancer, reconciler, state: DesiredState::default() })
    })
}

/// The backend agent's job: decapsulate tunnels addressed to this host.
fn start_agent(host: &Host) -> Result<Ebpf> {
    host.in_netns(|| -> Result<Ebpf> {
        let mut ebpf = dataplane::load_simple(objects::DECAP, "spillway-decap", program_names::DECAP)?;
        {
            let mut local: HashMap<_, AddrKey, u32> =
                HashMap::try_from(ebpf.map_mut(map_names::LOCAL_ADDRS).context("local address map")?)?;
            for addr in [IpAddr::V4(host.ipv4()), IpAddr::V6(host.ipv6())] {
                let (addr, family) = to_words(addr);
                local.insert(&AddrKey { addr, family, _pad: [0; 3] }, &1, 0)?;
            }
        }
        let ifindex = nix::net::if_::if_nametoindex("eth0")?;
        dataplane::xdp(&mut ebpf, program_names::DECAP)?.attach(ifindex, XdpMode::Driver)?;
        Ok(ebpf)
    })
}

/// Opens connections from c1 to the VIP for one phase, printing each backend's share.
fn drive(topo: &Topology, lb: &Balancing, phase: &str) -> Result<()> {
    let client = &topo.clients()[0];
    let target = SocketAddr::new(IpAddr::V4(VIP4), HTTP_PORT);
    let started = Instant::now();
    while started.elapsed() < PHASE && !INTERRUPTED.load(Ordering::Relaxed) {
        let tally = client.in_netns(|| run_connections(target, SAMPLE_CONNECTIONS, Duration::ZERO, Duration::from_secs(2)));
        let shares: Vec<String> = topo
            .backends()
            .iter()
            .map(|b| {
                let n = tally.by_backend.get(b.name()).copied().unwrap_or(0);
                format!("{} {:>3.0}%", b.name(), 100.0 * n as f64 / SAMPLE_CONNECTIONS as f64)
            })
            .collect();
        let tx = lb.balancer.maps.reasons()?.iter().map(|(_, n)| n).sum::<u64>();
        println!("[{phase:<12}] {}   failed {}   packets seen by XDP {tx}", shares.join("  "), tally.failures);
    }
    anyhow::ensure!(!INTERRUPTED.load(Ordering::Relaxed), "interrupted");
    Ok(())
}
