//! Loading and attaching the sockwatch object, and reading its maps.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapError},
    programs::{BtfTracePoint, CgroupAttachMode, CgroupSock, Iter, ProgramError, TracePoint},
};

use super::cgroup;
use super::iter::MapIterator;
use super::leaks::socket_owners;
use super::maps::{CloseWaitRecord, FailKey, PortCounts, PortKey, STAT_NAMES, STAT_UDP_KEY_TABLE_FULL, monotonic_secs};
use super::range::NetnsResolver;
use super::report::{PortsReport, Thresholds, build_report};
use crate::objects;

const OBJECT: &str = "spillway-sockwatch";
const MAP_PORTS: &str = "sw_ports";
const MAP_FAILURES: &str = "sw_failures";
const MAP_STATS: &str = "sw_stats";
const MAP_CLOSE_WAIT: &str = "sw_close_wait";
const MAP_UDP_SOCKS: &str = "sw_udp_socks";
const MAP_UDP_PORTS: &str = "sw_udp_ports";

#[derive(Debug, thiserror::Error)]
pub enum PortsError {
    #[error("eBPF object {OBJECT} was not built (AYA_BUILD_SKIP was set, or clang was missing); rebuild with clang")]
    ObjectNotBuilt,
    #[error("reading the kernel's BTF (/sys/kernel/btf/vmlinux; needs CONFIG_DEBUG_INFO_BTF)")]
    Btf(#[source] aya::BtfError),
    #[error("loading eBPF object {OBJECT}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("program {program} missing from {OBJECT}")]
    MissingProgram { program: &'static str },
    #[error("hook {hook} (program {program})")]
    Hook {
        hook: String,
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("reading the run statistics of program {program}")]
    Stats {
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("opening the cgroup2 root {path} (the UDP hooks attach there)")]
    Cgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("linking iterator {program} to map {map}")]
    IterLink {
        program: &'static str,
        map: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("running iterator {program}")]
    IterRun {
        program: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: MapError,
    },
    #[error("network namespace {path}")]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The programs and their hooks. fentry/fexit and kprobes are refused (EPERM, no
/// CONFIG_KPROBES) on the target kernel, so nothing depends on them; see the C source for
/// what each one does.
const SET_STATE: &str = "sockwatch_set_state";
const TRACEPOINT: &str = "inet_sock_set_state";
const UDP_CREATE: &str = "sockwatch_udp_create";
const UDP_RELEASE: &str = "sockwatch_udp_release";
const UDP_SUM: &str = "sockwatch_udp_sum";
const CLOSE_WAIT: &str = "sockwatch_close_wait";
/// bind()/connect() failing for want of a port: (program, tracepoint in
/// the `syscalls` category). Each enter stashes the call per thread, its exit counts it.
const SYSCALL_HOOKS: [(&str, &str); 4] = [
    ("sockwatch_bind_enter", "sys_enter_bind"),
    ("sockwatch_bind_exit", "sys_exit_bind"),
    ("sockwatch_connect_enter", "sys_enter_connect"),
    ("sockwatch_connect_exit", "sys_exit_connect"),
];
/// Every program, for [`SockWatch::program_stats`].
pub const PROGRAMS: [&str; 9] = [
    SET_STATE,
    UDP_CREATE,
    UDP_RELEASE,
    UDP_SUM,
    CLOSE_WAIT,
    SYSCALL_HOOKS[0].0,
    SYSCALL_HOOKS[1].0,
    SYSCALL_HOOKS[2].0,
    SYSCALL_HOOKS[3].0,
];
const MAP_ITERATOR: &str = "bpf_map_elem";

fn map_err(name: &'static str) -> impl Fn(MapError) -> PortsError {
    move |source| PortsError::Map { name, source }
}

/// One read of the maps: what the kernel counted, and when (for the TIME_WAIT window).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Per destination key, its TCP counts.
    pub destinations: Vec<(PortKey, PortCounts)>,
    /// Per destination key, the UDP sockets holding an ephemeral port.
    pub udp: Vec<(PortKey, u64)>,
    /// Per (destination, process), failed connects for lack of a port.
    pub failures: Vec<(FailKey, u64)>,
    /// Every socket in CLOSE_WAIT (created since the watcher was loaded).
    pub close_wait: Vec<CloseWaitRecord>,
    /// See [`STAT_NAMES`].
    pub stats: [u64; STAT_NAMES.len()],
    /// Monotonic seconds when the maps were read.
    pub now: u32,
}

impl Snapshot {
    /// The counts of destination `key` (all zero if the kernel has not seen it).
    pub fn counts(&self, key: &PortKey) -> PortCounts {
        self.destinations.iter().find(|(k, _)| k == key).map(|(_, c)| *c).unwrap_or_default()
    }

    /// The UDP sockets holding an ephemeral port towards `key`.
    pub fn udp_count(&self, key: &PortKey) -> u64 {
        self.udp.iter().find(|(k, _)| k == key).map_or(0, |(_, n)| *n)
    }
}

/// How often one program ran and for how long in total, since it was loaded (counted
/// only while BPF statistics are enabled: `kernel.bpf_stats_enabled` or BPF_ENABLE_STATS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: &'static str,
    pub runs: u64,
    pub run_time: Duration,
}

/// The loaded and attached watcher; dropping it detaches everything.
pub struct SockWatch {
    /// Owns the programs, their links and the maps.
    ebpf: Ebpf,
    udp_sum: MapIterator,
    close_wait: MapIterator,
}

impl SockWatch {
    /// Loads the object (CO-RE relocations against the running kernel's BTF) and attaches
    /// it: the TCP tracepoint, the syscall tracepoints of bind/connect
    /// (needs tracefs events, CONFIG_FTRACE_SYSCALLS), the UDP socket hooks on the cgroup2 root (so every process on
    /// the host, whatever its cgroup), and the two map iterators. Needs root (CAP_BPF +
    /// CAP_PERFMON + CAP_NET_ADMIN, and CAP_SYS_ADMIN if no cgroup2 is mounted) and Linux
    /// >= 5.9 with BTF.
    pub fn load() -> Result<SockWatch, PortsError> {
        let object = objects::SOCKWATCH;
        if object.is_empty() {
            return Err(PortsError::ObjectNotBuilt);
        }
        let btf = Btf::from_sys_fs().map_err(PortsError::Btf)?;
        let mut ebpf = EbpfLoader::new().btf(&btf).load(object).map_err(|e| PortsError::Load(Box::new(e)))?;

        let set_state: &mut BtfTracePoint = program(&mut ebpf, SET_STATE)?.try_into().map_err(hook_err(TRACEPOINT, SET_STATE))?;
        set_state.load(TRACEPOINT, &btf).map_err(hook_err(TRACEPOINT, SET_STATE))?;
        set_state.attach().map_err(hook_err(TRACEPOINT, SET_STATE))?;

        for (name, tracepoint) in SYSCALL_HOOKS {
            let hook_err = hook_err(&format!("tracepoint/syscalls/{tracepoint}"), name);
            let program: &mut TracePoint = program(&mut ebpf, name)?.try_into().map_err(&hook_err)?;
            program.load().map_err(&hook_err)?;
            program.attach("syscalls", tracepoint).map_err(&hook_err)?;
        }

        let (cgroup, root) = cgroup::open_root()?;
        for (name, hook) in [(UDP_CREATE, "sock_create"), (UDP_RELEASE, "sock_release")] {
            let hook_err = hook_err(&format!("cgroup/{hook} on {root}"), name);
            let program: &mut CgroupSock = program(&mut ebpf, name)?.try_into().map_err(&hook_err)?;
            program.load().map_err(&hook_err)?;
            // aya attaches with a bpf_link (5.7+), which always runs alongside the cgroup's
            // other programs (systemd's, another watcher's) and refuses attach flags.
            program.attach(&cgroup, CgroupAttachMode::Single).map_err(&hook_err)?;
        }

        let udp_sum = map_iterator(&mut ebpf, &btf, UDP_SUM, MAP_UDP_SOCKS)?;
        let close_wait = map_iterator(&mut ebpf, &btf, CLOSE_WAIT, MAP_CLOSE_WAIT)?;
        Ok(SockWatch { ebpf, udp_sum, close_wait })
    }

    /// Reads the per-destination counts, runs the iterators (UDP sums, CLOSE_WAIT sockets)
    /// and reads the drop counters. `&mut`: one iterator run at a time owns the UDP sums.
    pub fn snapshot(&mut self) -> Result<Snapshot, PortsError> {
        let udp = self.sum_udp()?;
        let close_wait = self.close_wait.run().map_err(|source| PortsError::IterRun { program: CLOSE_WAIT, source })?;
        let ports: HashMap<_, PortKey, PortCounts> = HashMap::try_from(self.map(MAP_PORTS)?).map_err(map_err(MAP_PORTS))?;
        let destinations = ports.iter().collect::<Result<Vec<_>, _>>().map_err(map_err(MAP_PORTS))?;
        let failures: HashMap<_, FailKey, u64> = HashMap::try_from(self.map(MAP_FAILURES)?).map_err(map_err(MAP_FAILURES))?;
        let failures = failures.iter().collect::<Result<Vec<_>, _>>().map_err(map_err(MAP_FAILURES))?;
        let stats_map: Array<_, u64> = Array::try_from(self.map(MAP_STATS)?).map_err(map_err(MAP_STATS))?;
        let mut stats = [0; STAT_NAMES.len()];
        for (index, slot) in (0u32..).zip(stats.iter_mut()) {
            *slot = stats_map.get(&index, 0).map_err(map_err(MAP_STATS))?;
        }
        let close_wait = CloseWaitRecord::parse_all(&close_wait);
        Ok(Snapshot { destinations, udp, failures, close_wait, stats, now: monotonic_secs() })
    }

    /// A report with each namespace's port range from `resolver`; the owners of leak
    /// suspects are looked up in /proc only when there are suspects.
    pub fn report(&mut self, resolver: &mut NetnsResolver, thresholds: Thresholds) -> Result<PortsReport, PortsError> {
        let snapshot = self.snapshot()?;
        Ok(build_report(&snapshot, |netns| resolver.ports(netns), socket_owners, thresholds))
    }

    /// Run counts and times of every program (see [`ProgramStats`]).
    pub fn program_stats(&self) -> Result<Vec<ProgramStats>, PortsError> {
        PROGRAMS
            .iter()
            .map(|&name| {
                let info = self
                    .ebpf
                    .program(name)
                    .ok_or(PortsError::MissingProgram { program: name })?
                    .info()
                    .map_err(|source| PortsError::Stats { program: name, source })?;
                Ok(ProgramStats { name, runs: info.run_count(), run_time: info.run_time() })
            })
            .collect()
    }

    /// Empties the sums, runs the UDP iterator (which fills them) and reads them.
    fn sum_udp(&mut self) -> Result<Vec<(PortKey, u64)>, PortsError> {
        let mut stats: Array<_, u64> = Array::try_from(self.map_mut(MAP_STATS)?).map_err(map_err(MAP_STATS))?;
        stats.set(STAT_UDP_KEY_TABLE_FULL, &0, 0).map_err(map_err(MAP_STATS))?;
        let mut sums: HashMap<_, PortKey, u64> = HashMap::try_from(self.map_mut(MAP_UDP_PORTS)?).map_err(map_err(MAP_UDP_PORTS))?;
        let stale = sums.keys().collect::<Result<Vec<_>, _>>().map_err(map_err(MAP_UDP_PORTS))?;
        for key in &stale {
            sums.remove(key).map_err(map_err(MAP_UDP_PORTS))?;
        }
        self.udp_sum.run().map_err(|source| PortsError::IterRun { program: UDP_SUM, source })?;
        let sums: HashMap<_, PortKey, u64> = HashMap::try_from(self.map(MAP_UDP_PORTS)?).map_err(map_err(MAP_UDP_PORTS))?;
        sums.iter().collect::<Result<Vec<_>, _>>().map_err(map_err(MAP_UDP_PORTS))
    }

    fn map(&self, name: &'static str) -> Result<&Map, PortsError> {
        self.ebpf.map(name).ok_or(PortsError::Map { name, source: MapError::InvalidName { name: name.to_owned() } })
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, PortsError> {
        self.ebpf.map_mut(name).ok_or(PortsError::Map { name, source: MapError::InvalidName { name: name.to_owned() } })
    }
}

fn hook_err(hook: &str, program: &'static str) -> impl Fn(ProgramError) -> PortsError + use<> {
    let hook = hook.to_owned();
    move |source| PortsError::Hook { hook: hook.clone(), program, source }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut aya::programs::Program, PortsError> {
    ebpf.program_mut(name).ok_or(PortsError::MissingProgram { program: name })
}

/// Loads iterator `name` and links it to hash map `map`.
fn map_iterator(ebpf: &mut Ebpf, btf: &Btf, name: &'static str, map: &'static str) -> Result<MapIterator, PortsError> {
    let hook_err = hook_err(&format!("iter/{MAP_ITERATOR}"), name);
    let iter: &mut Iter = program(ebpf, name)?.try_into().map_err(&hook_err)?;
    iter.load(MAP_ITERATOR, btf).map_err(&hook_err)?;
    let program_fd = iter.fd().map_err(&hook_err)?.try_clone().map_err(|source| PortsError::IterLink { program: name, map, source })?;
    let map_fd = match ebpf.map(map) {
        Some(Map::HashMap(data)) => data.fd().as_fd(),
        _ => return Err(PortsError::Map { name: map, source: MapError::InvalidName { name: map.to_owned() } }),
    };
    MapIterator::attach(program_fd.as_fd(), map_fd).map_err(|source| PortsError::IterLink { program: name, map, source })
}
