//! A one-namespace lab for packet-level tests and benchmarks of XDP programs run with
//! BPF_PROG_TEST_RUN. Its interfaces, routes and static neighbours make `bpf_fib_lookup`
//! answer as it would on a real balancer:
//!
//! ```text
//!   in0  10.1.0.1/24  fd01::1/64   frames "arrive" here; backends .101-.110 resolved,
//!                                  .199 routed but with no neighbour entry
//!   out0 10.2.0.1/24  fd02::1/64   a second interface: backend .101 behind it (redirect)
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};

use crate::bpffs::{self, BPFFS_ROOT};
use crate::netns::Netns;
use crate::process::Registry;
use crate::tempdir::TempDir;
use crate::topology::next_id;

/// The interface test frames arrive on.
pub const INGRESS: &str = "in0";
/// The second interface, for redirect cases.
pub const EGRESS: &str = "out0";
/// Backends with a resolved neighbour on [`INGRESS`]: `10.1.0.101..=110`, `fd01::101..=110`.
pub const RESOLVED_BACKENDS: std::ops::RangeInclusive<u8> = 101..=110;
/// MTU of both interfaces.
pub const MTU: u16 = 1500;

/// Backend `n` (101..=110) on the ingress subnet.
pub fn backend4(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, 0, n)
}

pub fn backend6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, 0x100 + u16::from(n - 100))
}

/// A routed backend with no neighbour entry.
pub const UNRESOLVED4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 199);
pub const UNRESOLVED6: Ipv6Addr = Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, 0x199);
/// A backend behind [`EGRESS`].
pub const BEHIND_EGRESS4: Ipv4Addr = Ipv4Addr::new(10, 2, 0, 101);
pub const BEHIND_EGRESS6: Ipv6Addr = Ipv6Addr::new(0xfd02, 0, 0, 0, 0, 0, 0, 0x101);
/// The lab's own addresses (the balancer's outer source).
pub const LOCAL4: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 1);
pub const LOCAL6: Ipv6Addr = Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, 1);

/// The MAC the lab's neighbour table holds for a resolved backend.
pub fn neighbour_mac(addr: IpAddr) -> Option<[u8; 6]> {
    let (subnet, last) = match addr {
        IpAddr::V4(a) => (a.octets()[2], a.octets()[3]),
        IpAddr::V6(a) => (a.octets()[7], (a.segments()[7] - 0x100 + 100) as u8),
    };
    match subnet {
        0 if RESOLVED_BACKENDS.contains(&last) => Some([0x02, 0xbe, 0, 1, 0, last]),
        2 if last == 101 => Some([0x02, 0xbe, 0, 2, 0, last]),
        _ => None,
    }
}

pub struct PacketLab {
    netns: Netns,
    pin_dir: Mutex<Option<PathBuf>>,
    _registry: Arc<Registry>,
    _tempdir: TempDir,
    /// Last: gone before a test that runs alone may start (see `alone`).
    _shared: crate::alone::Shared,
}

impl PacketLab {
    pub fn build() -> Result<PacketLab> {
        let shared = crate::alone::shared()?;
        let id = next_id();
        let tempdir = TempDir::create(std::env::temp_dir().join(&id))?;
        let registry = Arc::new(Registry::new(tempdir.path().to_owned()));
        let netns = Netns::create("pkt", format!("{id}-pkt"), Arc::clone(&registry))?;
        let lab = PacketLab { netns, pin_dir: Mutex::new(None), _registry: registry, _tempdir: tempdir, _shared: shared };
        lab.configure().context("configuring the packet lab")?;
        Ok(lab)
    }

    fn configure(&self) -> Result<()> {
        let ns = &self.netns;
        ns.run(&["ip", "link", "set", "lo", "up"])?;
        for (dev, peer, v4, v6) in [(INGRESS, "in1", "10.1.0.1/24", "fd01::1/64"), (EGRESS, "out1", "10.2.0.1/24", "fd02::1/64")] {
            ns.run(&["ip", "link", "add", dev, "mtu", &MTU.to_string(), "type", "veth", "peer", "name", peer, "mtu", &MTU.to_string()])?;
            ns.run(&["ip", "addr", "add", v4, "dev", dev])?;
            ns.run(&["ip", "addr", "add", v6, "dev", dev, "nodad"])?;
            ns.run(&["ip", "link", "set", dev, "up"])?;
            ns.run(&["ip", "link", "set", peer, "up"])?;
        }
        ns.sysctl("net.ipv4.conf.all.forwarding", "1")?;
        ns.sysctl("net.ipv6.conf.all.forwarding", "1")?;
        let mut neighbours: Vec<(IpAddr, &str)> = Vec::new();
        for n in RESOLVED_BACKENDS {
            neighbours.push((backend4(n).into(), INGRESS));
            neighbours.push((backend6(n).into(), INGRESS));
        }
        neighbours.push((BEHIND_EGRESS4.into(), EGRESS));
        neighbours.push((BEHIND_EGRESS6.into(), EGRESS));
        for (addr, dev) in neighbours {
            let mac = neighbour_mac(addr).expect("lab backends have MACs");
            let mac = mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
            ns.run(&["ip", "neigh", "replace", &addr.to_string(), "lladdr", &mac, "nud", "permanent", "dev", dev])?;
        }
        Ok(())
    }

    /// Runs `f` on a thread inside the lab's namespace (test runs resolve interfaces and
    /// routes in the caller's namespace).
    pub fn in_lab<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        self.netns.in_netns(f)
    }

    pub fn netns(&self) -> &Netns {
        &self.netns
    }

    /// A fresh directory on bpffs for maps two objects share (mounting bpffs if needed).
    /// The same path on every call; removed with everything pinned in it on drop.
    pub fn pin_dir(&self) -> Result<PathBuf> {
        let mut pin_dir = self.pin_dir.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = &*pin_dir {
            return Ok(dir.clone());
        }
        bpffs::ensure_mounted()?;
        let dir = Path::new(BPFFS_ROOT).join(self.netns.name());
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        *pin_dir = Some(dir.clone());
        Ok(dir)
    }

    /// Index of interface `dev` in the lab.
    pub fn ifindex(&self, dev: &str) -> Result<u32> {
        // sysfs shows the namespace it was mounted in, so ask `ip` inside the lab.
        let out = self.netns.run(&["ip", "-o", "link", "show", "dev", dev])?;
        let index = out.split(':').next().unwrap_or_default().trim();
        index.parse().with_context(|| format!("parsing the index of {dev} from {out:?}"))
    }

    /// MAC address of interface `dev` in the lab.
    pub fn mac(&self, dev: &str) -> Result<[u8; 6]> {
        self.netns.mac(dev)
    }
}

impl Drop for PacketLab {
    fn drop(&mut self) {
        let pin_dir = self.pin_dir.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(dir) = pin_dir.take()
            && let Err(err) = std::fs::remove_dir_all(&dir)
        {
            eprintln!("spillway-harness: cannot remove {}: {err}", dir.display());
        }
    }
}
