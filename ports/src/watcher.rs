//! The watcher: picks its mode when it loads (see [`super::mode`]), and turns what that
//! mode can read into snapshots and reports.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::bpf::{BpfWatch, ProgramStats};
use super::diag::{self, Namespaces};
use super::error::PortsError;
use super::leaks::socket_owners;
use super::maps::monotonic_secs;
use super::mode::WatcherMode;
use super::range::{NetnsResolver, all_netns, netns_inode};
use super::report::build_report;
use super::snapshot::Snapshot;
use spillway_logging::error_chain;
use spillway_model::ports_report::{Mode, Refusal, WatcherStatus, parts};
use spillway_model::ports_report::{PortsReport, Thresholds};

/// How long a namespace's port range is trusted before it is read again: an operator who
/// shrinks or widens `ip_local_port_range` sees the new utilisation within this (a read is
/// a short thread joining the namespace and two small files, ~0.1 ms each).
const PORT_RANGES_TTL: Duration = Duration::from_secs(5);
/// Which network namespaces a watcher reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// The namespace of the thread that loads the watcher only (a host reports its own).
    #[default]
    Own,
    /// Every namespace of the host (hosts running containers; tests).
    All,
}

/// How to load a watcher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchOptions {
    pub mode: WatcherMode,
    pub scope: Scope,
}

/// The namespace a watcher of [`Scope::Own`] reports, held open so any thread can join it
/// (through `/proc/self/fd/N`), whichever namespace that thread is in.
struct OwnNetns {
    inode: u32,
    _file: std::fs::File,
    path: PathBuf,
}

impl OwnNetns {
    fn open() -> Result<OwnNetns, PortsError> {
        let at = std::path::Path::new("/proc/thread-self/ns/net");
        let error = |source| PortsError::Netns { path: at.to_owned(), source };
        let file = std::fs::File::open(at).map_err(error)?;
        let inode = netns_inode(at).map_err(error)?;
        let path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&file)));
        Ok(OwnNetns { inode, _file: file, path })
    }
}

/// The loaded watcher; dropping it detaches everything it attached.
pub struct SockWatch {
    /// `None` in sock_diag mode.
    bpf: Option<BpfWatch>,
    status: WatcherStatus,
    /// The reported namespace (`None`: all).
    own: Option<OwnNetns>,
    resolver: NetnsResolver,
    resolved_at: Instant,
    /// sock_diag mode: when each CLOSE_WAIT socket was first seen, by (netns, cookie).
    close_wait_seen: HashMap<(u32, u64), u32>,
}

impl SockWatch {
    /// Loads the watcher in the best of `options.mode`'s candidate modes the kernel allows,
    /// logging the choice once (and every better mode it refused, with the reason). Needs
    /// root: CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN for the BPF modes, CAP_SYS_ADMIN to mount
    /// tracefs or a private cgroup2 when missing.
    pub fn load(options: WatchOptions) -> Result<SockWatch, PortsError> {
        let own = match options.scope {
            Scope::Own => Some(OwnNetns::open()?),
            Scope::All => None,
        };
        let mut refused = Vec::new();
        let mut last_error = None;
        for &mode in options.mode.candidates() {
            let mut status = WatcherStatus::new(mode);
            let loaded = match mode {
                Mode::SockDiag => diag::probe().map(|()| {
                    sock_diag_coverage(&mut status);
                    None
                }),
                _ => BpfWatch::load(mode, &mut status).map(Some),
            };
            match loaded {
                Ok(bpf) => {
                    status.refused = refused;
                    for refusal in &status.refused {
                        spillway_logging::event!(warn, "sockwatch_mode_refused", mode = refusal.mode, reason = refusal.reason);
                    }
                    spillway_logging::event!(info, "sockwatch_mode", mode = mode, coverage = status.summary());
                    let mut resolver = NetnsResolver::new();
                    if let Some(own) = &own {
                        resolver.know(own.inode, own.path.clone());
                    }
                    return Ok(SockWatch { bpf, status, own, resolver, resolved_at: Instant::now(), close_wait_seen: HashMap::new() });
                }
                Err(error) => {
                    refused.push(Refusal::new(mode, &error_chain(&error)));
                    last_error = Some(error);
                }
            }
        }
        Err(last_error.expect("every option has a candidate mode"))
    }

    /// The mode in use and what it watches.
    pub fn status(&self) -> &WatcherStatus {
        &self.status
    }

    /// Reads everything the mode sees in the watcher's scope.
    pub fn snapshot(&mut self) -> Result<Snapshot, PortsError> {
        if self.resolved_at.elapsed() >= PORT_RANGES_TTL {
            self.resolver.forget();
            self.resolved_at = Instant::now();
        }
        let now = monotonic_secs();
        let own = self.own.as_ref().map(|own| (own.inode, own.path.clone()));
        let namespaces = || -> Namespaces {
            match &own {
                Some(own) => vec![own.clone()],
                None => all_netns(),
            }
        };
        let mut snapshot = match &mut self.bpf {
            Some(bpf) => {
                let read = bpf.read()?;
                let mut close_wait = read.close_wait;
                if let Some((inode, _)) = &own {
                    // Out of scope: no sock_diag dump in other namespaces for them.
                    close_wait.retain(|r| r.key.netns == *inode);
                }
                let udp = match read.udp {
                    Some(udp) => udp,
                    None => {
                        // The tracepoint could not read the inodes; sock_diag can.
                        diag::fill_inodes(&mut close_wait, &self.resolver)?;
                        diag::udp_sums(&namespaces(), &mut self.resolver)?
                    }
                };
                Snapshot {
                    destinations: read.destinations.iter().map(|(key, counts)| (*key, counts.at(now))).collect(),
                    udp,
                    failures: read.failures,
                    close_wait,
                    stats: read.stats,
                    now,
                }
            }
            None => {
                let namespaces = namespaces();
                Snapshot {
                    destinations: diag::tcp_counts(&namespaces, &mut self.resolver)?,
                    udp: diag::udp_sums(&namespaces, &mut self.resolver)?,
                    close_wait: diag::close_wait(&namespaces, &mut self.close_wait_seen, now)?,
                    now,
                    ..Snapshot::default()
                }
            }
        };
        if let Some(own) = &self.own {
            snapshot.retain_netns(own.inode);
        }
        Ok(snapshot)
    }

    /// A report of the watcher's scope; the owners of leak suspects are looked up in /proc
    /// only when there are suspects.
    pub fn report(&mut self, thresholds: Thresholds) -> Result<PortsReport, PortsError> {
        let snapshot = self.snapshot()?;
        let resolver = &mut self.resolver;
        let mut report = build_report(&snapshot, |netns| resolver.ports(netns), socket_owners, thresholds);
        report.watcher = Some(self.status.clone());
        Ok(report)
    }

    /// Run counts and times of the programs this mode loaded (none in sock_diag mode).
    pub fn program_stats(&self) -> Result<Vec<ProgramStats>, PortsError> {
        self.bpf.as_ref().map_or(Ok(Vec::new()), BpfWatch::program_stats)
    }
}

fn sock_diag_coverage(status: &mut WatcherStatus) {
    status.watch(parts::TCP_PORTS, "sock_diag");
    status.watch(parts::UDP_PORTS, "sock_diag");
    status.watch(parts::CLOSE_WAIT, "sock_diag, aged from the first report that saw each socket");
    let needs_bpf = "needs BPF: the kernel refused the BPF modes, or sock_diag was chosen";
    status.skip(parts::CONNECT_FAILURES, needs_bpf);
    status.skip(parts::BIND_FAILURES, needs_bpf);
    status.skip(parts::OPENS, needs_bpf);
}
