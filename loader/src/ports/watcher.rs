//! Loading and attaching the sockwatch object, and reading its maps.

use std::path::PathBuf;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapError},
    programs::{BtfTracePoint, ProgramError},
};

use super::maps::{FailKey, PortCounts, PortKey, STAT_NAMES, monotonic_secs};
use super::range::NetnsResolver;
use super::report::{PortsReport, Thresholds, build_report};
use crate::objects;

const OBJECT: &str = "spillway-sockwatch";
const MAP_PORTS: &str = "sw_ports";
const MAP_FAILURES: &str = "sw_failures";
const MAP_STATS: &str = "sw_stats";

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

/// The one program and the tracepoint it attaches to. fentry/fexit and kprobes are refused
/// (EPERM, no CONFIG_KPROBES) on the target kernel, so nothing depends on them; see the C
/// source for what each transition means.
const PROGRAM: &str = "sockwatch_set_state";
const TRACEPOINT: &str = "inet_sock_set_state";

fn map_err(name: &'static str) -> impl Fn(MapError) -> PortsError {
    move |source| PortsError::Map { name, source }
}

/// One read of the maps: what the kernel counted, and when (for the TIME_WAIT window).
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Per destination key, its counts.
    pub destinations: Vec<(PortKey, PortCounts)>,
    /// Per (destination, process), failed connects for lack of a port.
    pub failures: Vec<(FailKey, u64)>,
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
}

/// The loaded and attached watcher; dropping it detaches.
pub struct SockWatch {
    /// Owns the program and its link.
    ebpf: Ebpf,
}

impl SockWatch {
    /// Loads the object (CO-RE relocations against the running kernel's BTF) and attaches
    /// it. Needs root (CAP_BPF + CAP_PERFMON) and Linux >= 5.5 with BTF.
    pub fn load() -> Result<SockWatch, PortsError> {
        let object = objects::SOCKWATCH;
        if object.is_empty() {
            return Err(PortsError::ObjectNotBuilt);
        }
        let btf = Btf::from_sys_fs().map_err(PortsError::Btf)?;
        let mut ebpf = EbpfLoader::new().btf(&btf).load(object).map_err(|e| PortsError::Load(Box::new(e)))?;
        let hook_err = |source| PortsError::Hook { hook: TRACEPOINT.to_owned(), program: PROGRAM, source };
        let program: &mut BtfTracePoint =
            ebpf.program_mut(PROGRAM).ok_or(PortsError::MissingProgram { program: PROGRAM })?.try_into().map_err(hook_err)?;
        program.load(TRACEPOINT, &btf).map_err(hook_err)?;
        program.attach().map_err(hook_err)?;
        Ok(SockWatch { ebpf })
    }

    /// Reads the per-destination counts, per-process failures and drop counters.
    pub fn snapshot(&self) -> Result<Snapshot, PortsError> {
        let ports: HashMap<_, PortKey, PortCounts> = HashMap::try_from(self.map(MAP_PORTS)?).map_err(map_err(MAP_PORTS))?;
        let destinations = ports.iter().collect::<Result<Vec<_>, _>>().map_err(map_err(MAP_PORTS))?;
        let failures: HashMap<_, FailKey, u64> = HashMap::try_from(self.map(MAP_FAILURES)?).map_err(map_err(MAP_FAILURES))?;
        let failures = failures.iter().collect::<Result<Vec<_>, _>>().map_err(map_err(MAP_FAILURES))?;
        let stats_map: Array<_, u64> = Array::try_from(self.map(MAP_STATS)?).map_err(map_err(MAP_STATS))?;
        let mut stats = [0; STAT_NAMES.len()];
        for (index, slot) in (0u32..).zip(stats.iter_mut()) {
            *slot = stats_map.get(&index, 0).map_err(map_err(MAP_STATS))?;
        }
        Ok(Snapshot { destinations, failures, stats, now: monotonic_secs() })
    }

    /// A report with each namespace's port range from `resolver`.
    pub fn report(&self, resolver: &mut NetnsResolver, thresholds: Thresholds) -> Result<PortsReport, PortsError> {
        let snapshot = self.snapshot()?;
        Ok(build_report(&snapshot, |netns| resolver.ports(netns), thresholds))
    }

    fn map(&self, name: &'static str) -> Result<&aya::maps::Map, PortsError> {
        self.ebpf.map(name).ok_or(PortsError::Map { name, source: MapError::InvalidName { name: name.to_owned() } })
    }
}
