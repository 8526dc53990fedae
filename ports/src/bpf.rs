//! The watcher's BPF side: the sockwatch object (`sockwatch-ebpf/`) loaded in one of the
//! two BPF modes, and its maps read back.
//!
//! - [`Mode::Btf`]: `tp_btf/inet_sock_set_state` for TCP, the CLOSE_WAIT table walked by a
//!   map iterator (which also reads each socket's inode), UDP sockets kept by cgroup
//!   socket hooks and summed by a second iterator.
//! - [`Mode::Tracepoint`]: the classic `sock/inet_sock_set_state` tracepoint runs the same
//!   counting; the CLOSE_WAIT table is read from userspace (the value holds the
//!   connection; the inode comes from sock_diag), and UDP comes from sock_diag.
//!
//! In both, the syscall tracepoints of bind/connect count the failures TCP's hook cannot
//! see; a kernel without them loses only that part. Every map is read with batched
//! lookups.

use std::os::fd::AsFd;
use std::time::Duration;

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{Array, HashMap, Map, MapData, MapError},
    programs::{BtfTracePoint, CgroupAttachMode, CgroupSock, Iter, ProgramError, TracePoint},
};

use super::cgroup;
use super::error::PortsError;
use super::iter::MapIterator;
use super::maps::{CloseWaitRecord, CloseWaitValue, FailKey, PortCounts, PortKey, STAT_NAMES, STAT_UDP_KEY_TABLE_FULL};
use super::tracefs;
use spillway_dataplane::objects;
use spillway_dataplane::without_signals;
use spillway_logging::error_chain;
use spillway_model::ports_report::{Mode, WatcherStatus, parts};

/// How often one program ran and for how long in total, since it was loaded (counted
/// only while BPF statistics are enabled: `kernel.bpf_stats_enabled` or BPF_ENABLE_STATS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramStats {
    pub name: &'static str,
    pub runs: u64,
    pub run_time: Duration,
}

const MAP_PORTS: &str = "sw_ports";
const MAP_FAILURES: &str = "sw_failures";
const MAP_STATS: &str = "sw_stats";
const MAP_CLOSE_WAIT: &str = "sw_close_wait";
const MAP_UDP_SOCKS: &str = "sw_udp_socks";
const MAP_UDP_PORTS: &str = "sw_udp_ports";

const SET_STATE_BTF: &str = "sockwatch_set_state";
const SET_STATE_TP: &str = "sockwatch_set_state_tp";
/// Both forms hook this tracepoint (category `sock`).
const SET_STATE_HOOK: &str = "inet_sock_set_state";
const UDP_CREATE: &str = "sockwatch_udp_create";
const UDP_RELEASE: &str = "sockwatch_udp_release";
const UDP_SUM: &str = "sockwatch_udp_sum";
const CLOSE_WAIT: &str = "sockwatch_close_wait";
/// bind()/connect() failing for want of a port: (program, tracepoint in the `syscalls`
/// category). Each enter stashes the call per thread, its exit counts it.
const SYSCALL_HOOKS: [(&str, &str); 4] = [
    ("sockwatch_bind_enter", "sys_enter_bind"),
    ("sockwatch_bind_exit", "sys_exit_bind"),
    ("sockwatch_connect_enter", "sys_enter_connect"),
    ("sockwatch_connect_exit", "sys_exit_connect"),
];
/// Every program, for [`BpfWatch::program_stats`] (those not loaded in a mode are skipped).
pub const PROGRAMS: [&str; 10] = [
    SET_STATE_BTF,
    SET_STATE_TP,
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

/// What one read of the maps gives.
pub(super) struct BpfRead {
    pub destinations: Vec<(PortKey, PortCounts)>,
    pub failures: Vec<(FailKey, u64)>,
    /// Every socket in CLOSE_WAIT; `inode` is 0 unless the iterator read it.
    pub close_wait: Vec<CloseWaitRecord>,
    /// The UDP sums, when the kernel keeps the UDP sockets (btf mode).
    pub udp: Option<Vec<(PortKey, u64)>>,
    pub stats: [u64; STAT_NAMES.len()],
}

/// The loaded and attached object; dropping it detaches everything.
pub(super) struct BpfWatch {
    /// Owns the programs, their links and the maps.
    ebpf: Ebpf,
    /// Btf mode: walks the CLOSE_WAIT table in the kernel.
    close_wait: Option<MapIterator>,
    /// Btf mode with the cgroup hooks attached: sums the UDP sockets.
    udp_sum: Option<MapIterator>,
}

impl BpfWatch {
    /// Loads the object and attaches `mode`'s programs (CO-RE relocations against the
    /// running kernel's BTF), recording in `status` what is watched and how. Fails when the
    /// mode's TCP hook (and, for btf, its iterator) cannot load: the caller then tries the
    /// next mode. Parts that fail alone (syscall tracepoints, the UDP hooks) are recorded as
    /// not watched, or watched another way.
    pub(super) fn load(mode: Mode, status: &mut WatcherStatus) -> Result<BpfWatch, PortsError> {
        let object = objects::SOCKWATCH;
        if object.is_empty() {
            return Err(PortsError::ObjectNotBuilt);
        }
        let btf = Btf::from_sys_fs().map_err(PortsError::Btf)?;
        let mut ebpf = EbpfLoader::new().btf(&btf).load(object).map_err(|e| PortsError::Load(Box::new(e)))?;
        let (tcp_hook, close_wait, close_wait_how) = match mode {
            Mode::Btf => {
                attach_btf_tracepoint(&mut ebpf, &btf)?;
                let iterator = map_iterator(&mut ebpf, &btf, CLOSE_WAIT, MAP_CLOSE_WAIT)?;
                ("tp_btf/inet_sock_set_state", Some(iterator), "tp_btf/inet_sock_set_state, iter/bpf_map_elem")
            }
            Mode::Tracepoint => {
                tracefs::ensure_mounted().map_err(PortsError::Tracefs)?;
                let hook_err = hook_err("tracepoint/sock/inet_sock_set_state", SET_STATE_TP);
                let program: &mut TracePoint = program(&mut ebpf, SET_STATE_TP)?.try_into().map_err(&hook_err)?;
                without_signals(|| program.load()).map_err(&hook_err)?;
                program.attach("sock", SET_STATE_HOOK).map_err(&hook_err)?;
                (
                    "tracepoint/sock/inet_sock_set_state",
                    None,
                    "tracepoint/sock/inet_sock_set_state, batched map read, inodes from sock_diag",
                )
            }
            Mode::SockDiag => unreachable!("sock_diag mode loads no BPF"),
        };
        status.watch(parts::TCP_PORTS, tcp_hook);
        status.watch(parts::CONNECT_FAILURES, tcp_hook);
        status.watch(parts::OPENS, tcp_hook);
        status.watch(parts::CLOSE_WAIT, close_wait_how);
        match attach_syscalls(&mut ebpf) {
            Ok(()) => status.watch(parts::BIND_FAILURES, "tracepoint/syscalls/sys_{enter,exit}_{bind,connect}"),
            Err(e) => status.skip(parts::BIND_FAILURES, error_chain(&e)),
        }
        let udp_sum = match mode {
            Mode::Btf => match attach_udp(&mut ebpf, &btf) {
                Ok(iterator) => {
                    status.watch(parts::UDP_PORTS, "cgroup/sock_create, cgroup/sock_release, iter/bpf_map_elem");
                    Some(iterator)
                }
                Err(e) => {
                    status.watch(parts::UDP_PORTS, format!("sock_diag (the cgroup hooks failed: {})", error_chain(&e)));
                    None
                }
            },
            _ => {
                status.watch(parts::UDP_PORTS, "sock_diag");
                None
            }
        };
        Ok(BpfWatch { ebpf, close_wait, udp_sum })
    }

    /// Reads the per-destination counts and failures, the CLOSE_WAIT table (through the
    /// iterator, or directly), the UDP sums (btf mode) and the drop counters. `&mut`: one
    /// iterator run at a time owns the UDP sums.
    pub(super) fn read(&mut self) -> Result<BpfRead, PortsError> {
        let udp = if self.udp_sum.is_some() { Some(self.sum_udp()?) } else { None };
        let close_wait = match &self.close_wait {
            Some(iterator) => {
                CloseWaitRecord::parse_all(&iterator.run().map_err(|source| PortsError::IterRun { program: CLOSE_WAIT, source })?)
            }
            None => self.lookup_all::<u64, CloseWaitValue>(MAP_CLOSE_WAIT)?.into_iter().map(|(_, value)| value.record(0)).collect(),
        };
        let destinations = self.lookup_all(MAP_PORTS)?;
        let failures = self.lookup_all(MAP_FAILURES)?;
        let stats_map: Array<_, u64> = Array::try_from(self.map(MAP_STATS)?).map_err(map_err(MAP_STATS))?;
        let mut stats = [0; STAT_NAMES.len()];
        for (index, slot) in (0u32..).zip(stats.iter_mut()) {
            *slot = stats_map.get(&index, 0).map_err(map_err(MAP_STATS))?;
        }
        Ok(BpfRead { destinations, failures, close_wait, udp, stats })
    }

    /// Run counts and times of every loaded program (see [`ProgramStats`]).
    pub(super) fn program_stats(&self) -> Result<Vec<ProgramStats>, PortsError> {
        let mut stats = Vec::new();
        for name in PROGRAMS {
            let Some(program) = self.ebpf.program(name) else {
                return Err(PortsError::MissingProgram { program: name });
            };
            // A program this mode did not load has no info.
            let Ok(info) = program.info() else { continue };
            stats.push(ProgramStats { name, runs: info.run_count(), run_time: info.run_time() });
        }
        Ok(stats)
    }

    /// Empties the sums, runs the UDP iterator (which fills them) and reads them.
    fn sum_udp(&mut self) -> Result<Vec<(PortKey, u64)>, PortsError> {
        let mut stats: Array<_, u64> = Array::try_from(self.map_mut(MAP_STATS)?).map_err(map_err(MAP_STATS))?;
        stats.set(STAT_UDP_KEY_TABLE_FULL, &0, 0).map_err(map_err(MAP_STATS))?;
        let stale: Vec<(PortKey, u64)> = self.lookup_all(MAP_UDP_PORTS)?;
        let mut sums: HashMap<_, PortKey, u64> = HashMap::try_from(self.map_mut(MAP_UDP_PORTS)?).map_err(map_err(MAP_UDP_PORTS))?;
        for (key, _) in &stale {
            sums.remove(key).map_err(map_err(MAP_UDP_PORTS))?;
        }
        let iterator = self.udp_sum.as_ref().expect("sum_udp runs only with the UDP iterator");
        iterator.run().map_err(|source| PortsError::IterRun { program: UDP_SUM, source })?;
        self.lookup_all(MAP_UDP_PORTS)
    }

    /// Every entry of hash map `name`, in batches.
    fn lookup_all<K: aya::Pod, V: aya::Pod>(&self, name: &'static str) -> Result<Vec<(K, V)>, PortsError> {
        let data = map_data(self.map(name)?, name)?;
        spillway_dataplane::map_batch::lookup_all(data).map_err(|source| PortsError::MapRead { name, source })
    }

    fn map(&self, name: &'static str) -> Result<&Map, PortsError> {
        self.ebpf.map(name).ok_or(PortsError::Map { name, source: MapError::InvalidName { name: name.to_owned() } })
    }

    fn map_mut(&mut self, name: &'static str) -> Result<&mut Map, PortsError> {
        self.ebpf.map_mut(name).ok_or(PortsError::Map { name, source: MapError::InvalidName { name: name.to_owned() } })
    }
}

fn map_data<'a>(map: &'a Map, name: &'static str) -> Result<&'a MapData, PortsError> {
    match map {
        Map::HashMap(data) => Ok(data),
        _ => Err(PortsError::Map { name, source: MapError::InvalidName { name: name.to_owned() } }),
    }
}

fn attach_btf_tracepoint(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), PortsError> {
    let hook_err = hook_err("tp_btf/inet_sock_set_state", SET_STATE_BTF);
    let program: &mut BtfTracePoint = program(ebpf, SET_STATE_BTF)?.try_into().map_err(&hook_err)?;
    without_signals(|| program.load(SET_STATE_HOOK, btf)).map_err(&hook_err)?;
    program.attach().map_err(&hook_err)?;
    Ok(())
}

/// The bind/connect syscall tracepoints (needs tracefs and CONFIG_FTRACE_SYSCALLS): all
/// four or none, since an enter without its exit would only fill the pending table.
fn attach_syscalls(ebpf: &mut Ebpf) -> Result<(), PortsError> {
    tracefs::ensure_mounted().map_err(PortsError::Tracefs)?;
    let attached = SYSCALL_HOOKS.iter().try_for_each(|&(name, tracepoint)| {
        let hook_err = hook_err(&format!("tracepoint/syscalls/{tracepoint}"), name);
        let program: &mut TracePoint = program(ebpf, name)?.try_into().map_err(&hook_err)?;
        without_signals(|| program.load()).map_err(&hook_err)?;
        program.attach("syscalls", tracepoint).map_err(&hook_err)?;
        Ok(())
    });
    if attached.is_err() {
        for (name, _) in SYSCALL_HOOKS {
            if let Some(Ok(program)) = ebpf.program_mut(name).map(<&mut TracePoint>::try_from) {
                // Unloading detaches; a program that never loaded has nothing to undo.
                let _ = program.unload();
            }
        }
    }
    attached
}

/// The UDP socket hooks on the cgroup2 root (every process on the host, whatever its
/// cgroup) and the iterator that sums their table.
fn attach_udp(ebpf: &mut Ebpf, btf: &Btf) -> Result<MapIterator, PortsError> {
    let (cgroup, root) = cgroup::open_root()?;
    for (name, hook) in [(UDP_CREATE, "sock_create"), (UDP_RELEASE, "sock_release")] {
        let hook_err = hook_err(&format!("cgroup/{hook} on {root}"), name);
        let program: &mut CgroupSock = program(ebpf, name)?.try_into().map_err(&hook_err)?;
        without_signals(|| program.load()).map_err(&hook_err)?;
        // aya attaches with a bpf_link (5.7+), which always runs alongside the cgroup's
        // other programs (systemd's, another watcher's) and refuses attach flags.
        program.attach(&cgroup, CgroupAttachMode::Single).map_err(&hook_err)?;
    }
    map_iterator(ebpf, btf, UDP_SUM, MAP_UDP_SOCKS)
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
    without_signals(|| iter.load(MAP_ITERATOR, btf)).map_err(&hook_err)?;
    let program_fd = iter.fd().map_err(&hook_err)?.try_clone().map_err(|source| PortsError::IterLink { program: name, map, source })?;
    let map_fd = map_data(ebpf.map(map).ok_or(PortsError::MissingMap { map })?, map)?.fd().as_fd();
    MapIterator::attach(program_fd.as_fd(), map_fd).map_err(|source| PortsError::IterLink { program: name, map, source })
}
