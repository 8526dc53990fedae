//! The whole test network: a bridge namespace, the balancer, clients and
//! backends, all cleaned up on drop (including during a panic).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use crate::addrs::{self, LB4, LB6, MAX_BACKENDS, MAX_CLIENTS};
use crate::bpffs::{self, BPFFS_ROOT};
use crate::cleanup::{NAME_PREFIX, sweep_stale};
use crate::echo;
use crate::host::{Host, HostSpec, Role};
use crate::icmp::ping;
use crate::netns::Netns;
use crate::process::{Daemon, Registry};
use crate::tempdir::TempDir;

/// Distinguishes topologies built by one process (tests run in parallel).
static NEXT_TOPOLOGY: AtomicU32 = AtomicU32::new(1);

/// `spw-<pid>-<seq>`: a fresh prefix that [`sweep_stale`] recognises.
pub(crate) fn next_id() -> String {
    format!("{NAME_PREFIX}{}-{}", std::process::id(), NEXT_TOPOLOGY.fetch_add(1, Ordering::Relaxed))
}

/// Reachability check after building: tries per target, each waiting this long.
const CHECK_ATTEMPTS: usize = 5;
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// What to build.
#[derive(Clone, Debug)]
pub struct TopologyConfig {
    /// Number of backends, `b1..bN` (more can be added with [`Topology::add_backend`]).
    pub backends: usize,
    /// Number of clients, `c1..cN`; at least one, used to check reachability.
    pub clients: usize,
}

impl Default for TopologyConfig {
    fn default() -> Self {
        TopologyConfig { backends: 3, clients: 1 }
    }
}

/// A built test network. Dropping it stops its daemons, deletes its
/// namespaces (and with them all veths), its bpffs pin directory and its
/// temporary directory.
#[derive(Debug)]
pub struct Topology {
    id: String,
    registry: Arc<Registry>,
    // Field order is drop order: namespaces go after `Drop::drop` has stopped
    // the daemons living in them, the temporary directory (logs) last.
    bridge: Netns,
    lb: Host,
    clients: Vec<Host>,
    backends: Vec<Host>,
    pin_dir: Mutex<Option<PathBuf>>,
    tempdir: TempDir,
    /// Last: the topology is gone before a test that runs alone may start.
    _shared: crate::alone::Shared,
}

impl Topology {
    /// Creates the namespaces, links and addresses, then checks that c1
    /// reaches the balancer and every backend over IPv4 and IPv6.
    ///
    /// First removes leftovers of earlier, killed runs ([`sweep_stale`]).
    pub fn build(config: TopologyConfig) -> Result<Topology> {
        ensure!((1..=MAX_CLIENTS).contains(&config.clients), "clients must be 1..={MAX_CLIENTS}, not {}", config.clients);
        ensure!(config.backends <= MAX_BACKENDS, "at most {MAX_BACKENDS} backends, not {}", config.backends);
        let shared = crate::alone::shared()?;
        if let Err(err) = sweep_stale() {
            eprintln!("spillway-harness: {err:#}");
        }
        let id = next_id();
        let tempdir = TempDir::create(std::env::temp_dir().join(&id))?;
        let registry = Arc::new(Registry::new(tempdir.path().to_owned()));
        let bridge = build_bridge(&id, &registry)?;
        let lb =
            Host::create(HostSpec { name: "lb".into(), role: Role::Balancer, ipv4: LB4, ipv6: LB6 }, &id, &bridge, Arc::clone(&registry))?;
        let clients = (1..=config.clients)
            .map(|n| {
                let spec = HostSpec { name: format!("c{n}"), role: Role::Client, ipv4: addrs::client4(n), ipv6: addrs::client6(n) };
                Host::create(spec, &id, &bridge, Arc::clone(&registry))
            })
            .collect::<Result<Vec<_>>>()?;
        let mut topology =
            Topology { id, registry, bridge, lb, clients, backends: Vec::new(), pin_dir: Mutex::new(None), tempdir, _shared: shared };
        topology.check_reachable(&topology.lb)?;
        for _ in 0..config.backends {
            topology.add_backend()?;
        }
        Ok(topology)
    }

    /// Adds backend `b<N+1>` (same settings as the others) and checks that
    /// c1 reaches it. Start its echo server with [`echo::start_echo`].
    pub fn add_backend(&mut self) -> Result<&Host> {
        let n = self.backends.len() + 1;
        ensure!(n <= MAX_BACKENDS, "at most {MAX_BACKENDS} backends");
        let spec = HostSpec { name: format!("b{n}"), role: Role::Backend, ipv4: addrs::backend4(n), ipv6: addrs::backend6(n) };
        let backend = Host::create(spec, &self.id, &self.bridge, Arc::clone(&self.registry))?;
        self.check_reachable(&backend)?;
        self.backends.push(backend);
        Ok(self.backends.last().expect("just pushed"))
    }

    /// `spw-<pid>-<seq>`: the prefix of every namespace of this topology.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The balancer host `lb` (10.0.0.2, fd00::2).
    pub fn lb(&self) -> &Host {
        &self.lb
    }

    /// Clients `c1..`, in order.
    pub fn clients(&self) -> &[Host] {
        &self.clients
    }

    /// Backends `b1..`, in order.
    pub fn backends(&self) -> &[Host] {
        &self.backends
    }

    /// The namespace holding `br0` and the `p-<host>` veth peers, e.g. for
    /// `tcpdump -i p-lb`.
    pub fn bridge(&self) -> &Netns {
        &self.bridge
    }

    /// A per-topology directory for state files and sockets; removed on drop.
    pub fn tempdir(&self) -> &Path {
        self.tempdir.path()
    }

    /// A fresh directory on bpffs, `/sys/fs/bpf/<id>`, for the daemon under
    /// test to pin into (mounting bpffs first if needed). The same path on
    /// every call; removed with everything pinned in it on drop.
    pub fn pin_dir(&self) -> Result<PathBuf> {
        let mut pin_dir = self.pin_dir.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = &*pin_dir {
            return Ok(dir.clone());
        }
        bpffs::ensure_mounted()?;
        let dir = Path::new(BPFFS_ROOT).join(&self.id);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        *pin_dir = Some(dir.clone());
        Ok(dir)
    }

    /// Starts `spillway-echo` on every backend, named after it (see
    /// [`echo::start_echo`]). Keep the returned guards alive while needed;
    /// the servers also stop when the topology is dropped.
    pub fn start_echo_servers(&self, tcp_port: u16, udp_port: u16) -> Result<Vec<Daemon>> {
        self.backends.iter().map(|backend| echo::start_echo(backend, tcp_port, udp_port)).collect()
    }

    /// Pings `target` from c1 over both families, a few times each, because
    /// the first packets wait for neighbour resolution.
    fn check_reachable(&self, target: &Host) -> Result<()> {
        let client = &self.clients[0];
        for addr in [IpAddr::from(target.ipv4()), IpAddr::from(target.ipv6())] {
            let mut last = None;
            for _ in 0..CHECK_ATTEMPTS {
                match client.in_netns(|| ping(addr, CHECK_TIMEOUT)) {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(err) => last = Some(err),
                }
            }
            if let Some(err) = last {
                bail!(
                    "topology {} is broken: {} cannot ping {} at {addr} \
                     ({CHECK_ATTEMPTS} attempts): {err:#}",
                    self.id,
                    client.name(),
                    target.name()
                );
            }
        }
        Ok(())
    }

    /// On a failing test, shows what the daemons printed before their logs
    /// are deleted with the temporary directory.
    fn dump_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.tempdir.path()) else {
            return;
        };
        for path in entries.flatten().map(|entry| entry.path()) {
            if path.extension().is_some_and(|ext| ext == "log") {
                let log = std::fs::read_to_string(&path).unwrap_or_default();
                eprintln!("---- {} ----\n{log}", path.display());
            }
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.registry.stop_all();
        if std::thread::panicking() {
            self.dump_logs();
        }
        let pin_dir = self.pin_dir.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = pin_dir.take()
            && let Err(err) = std::fs::remove_dir_all(&dir)
        {
            eprintln!("spillway-harness: cannot remove {}: {err}", dir.display());
        }
    }
}

/// The bridge namespace with `br0`, a plain learning switch.
fn build_bridge(id: &str, registry: &Arc<Registry>) -> Result<Netns> {
    build_bridge_named(id, "br", registry)
}

/// A namespace `<id>-<label>` holding `br0`, a plain learning switch.
pub(crate) fn build_bridge_named(id: &str, label: &str, registry: &Arc<Registry>) -> Result<Netns> {
    let bridge = Netns::create(label, format!("{id}-{label}"), Arc::clone(registry))?;
    // Snooping only adds group state and timers that could filter the
    // solicited-node multicast IPv6 neighbour discovery needs; flood instead.
    bridge.run(&["ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0"])?;
    bridge.run(&["ip", "link", "set", "br0", "up"])?;
    // br_netfilter (built into some kernels) would run bridged frames through
    // iptables and may drop malformed-looking ones; this is a dumb switch.
    for family in ["iptables", "ip6tables", "arptables"] {
        let key = format!("net.bridge.bridge-nf-call-{family}");
        let file = Path::new("/proc/sys").join(key.replace('.', "/"));
        if bridge.in_netns(|| file.exists()) {
            bridge.sysctl(&key, "0")?;
        }
    }
    Ok(bridge)
}
