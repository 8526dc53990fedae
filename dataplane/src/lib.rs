//! The balancer's kernel side: loading the objects, pinning and reusing their maps, typed
//! access to every map, and the host's network state the data path depends on (links and
//! routes over rtnetlink, interfaces, neighbours, forwarding sysctls, the VIP path that
//! health probes take). It implements the reconciler's `Maps`. With the port watcher
//! (`spillway-ports`) it is the only crate that makes BPF calls.

pub mod clock;
pub mod decap;
pub mod entry;
pub mod forwarding;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod logs;
pub mod map_batch;
mod maps;
mod mmap;
pub mod neighbours;
pub mod netif;
pub mod objects;
pub mod pass_to;
pub mod pins;
mod probe_encap;
pub mod quic_keys;
pub mod rtnl;
mod tables;
pub mod test_run;
pub mod uplinks;
pub mod verifier;
pub mod vip_path;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    programs::{ProgramError, Xdp},
};
use maps::named;
pub use maps::{BalancerMaps, MapOccupancy, vip_of};
pub use probe_encap::ProbeMaps;
use spillway_common::limits::{Capacity, QUIC_DECRYPTS_PER_S, map_names, program_names};
pub use tables::{FlowSummary, FlowTable, RingPool, RuleIndex, VipIndex};

use spillway_reconcile::MapsError;

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("eBPF object {name} was not built (AYA_BUILD_SKIP was set); rebuild without it")]
    ObjectNotBuilt { name: &'static str },
    #[error("loading eBPF object {name} (pinned maps under {pin_dir:?})")]
    Load {
        name: &'static str,
        pin_dir: Option<PathBuf>,
        // Boxed: aya's error is large, and every map operation returns this enum.
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("reading the eBPF programs' log records")]
    Logs(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("program {name} missing from its object")]
    MissingProgram { name: &'static str },
    #[error("map {name} missing from the object")]
    MissingMap { name: &'static str },
    #[error("program {name}")]
    Program {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("map {name}")]
    Map {
        name: &'static str,
        #[source]
        source: aya::maps::MapError,
    },
    #[error("map {name}")]
    XdpMap {
        name: &'static str,
        #[source]
        source: aya::maps::xdp::XdpMapError,
    },
    #[error("reading map {name}")]
    Read {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the system's random number generator failed (needed for the connection table's secret seed)")]
    NoRandomness,
    #[error("reading the number of possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("map {name} holds values of {value_size} bytes, not the {expected} this build maps")]
    Layout { name: &'static str, value_size: u32, expected: usize },
    #[error("mapping map {name} into memory")]
    Mmap {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("no free slot near the key's home in the VIP, rule or QUIC server-id index")]
    IndexFull,
    #[error("the rules of one scope and family may use at most {max} distinct prefix lengths")]
    RuleLengths { max: usize },
    #[error("pin path {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A pinned map whose shape is not this build's (`DataplaneError::pinned_shape`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinnedShape {
    pub name: String,
    /// What differs (`max_entries`, `key_size`, ...).
    pub property: &'static str,
    pub expected: u64,
    pub actual: u64,
}

impl DataplaneError {
    /// The pinned map that refused this load by its shape, if that is why it failed.
    pub fn pinned_shape(&self) -> Option<PinnedShape> {
        let DataplaneError::Load { source, .. } = self else { return None };
        let aya::EbpfError::MapError(aya::maps::MapError::IncompatiblePinnedMap { name, property, expected, actual }) = source.as_ref()
        else {
            return None;
        };
        Some(PinnedShape { name: name.clone(), property, expected: *expected, actual: *actual })
    }
}

/// Fails with a clear message when the build skipped the eBPF objects (`AYA_BUILD_SKIP`).
fn check_built(object: &'static [u8], name: &'static str) -> Result<&'static [u8], DataplaneError> {
    if object.is_empty() {
        return Err(DataplaneError::ObjectNotBuilt { name });
    }
    Ok(object)
}

/// A failed map operation, as the reconciler's `Maps` trait returns it: shown as is.
impl From<DataplaneError> for MapsError {
    fn from(error: DataplaneError) -> Self {
        MapsError::new(error)
    }
}

/// Where the maps live (in memory only, for tests and benchmarks, or pinned for reuse) and
/// how big they are.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Directory on bpffs for the maps; an existing map there is reused when its shape
    /// matches and refused otherwise.
    pub map_pin_dir: Option<PathBuf>,
    pub capacity: Capacity,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { map_pin_dir: None, capacity: Capacity::DEFAULT }
    }
}

/// One map of the loaded object and the memory the kernel charges for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapMemory {
    pub name: String,
    pub kind: String,
    pub entries: u32,
    pub bytes: u64,
}

/// The loaded balancer object: its program (loaded, not attached) and its maps.
pub struct Balancer {
    ebpf: Ebpf,
    pub maps: BalancerMaps,
    /// The interfaces the program may redirect to (`uplinks` keeps it current).
    pub tx_ports: aya::maps::DevMapHash<aya::maps::MapData>,
}

/// The programs of a QUIC VIP's packets, in the order of their slots in `spw_quic_prog`.
const QUIC_PROGRAMS: [&str; 4] =
    [program_names::BALANCER_QUIC, program_names::BALANCER_QUIC_V6, program_names::BALANCER_UDP, program_names::BALANCER_UDP_V6];

/// The crypt programs, in the order of their slots in `spw_quic_crypt_prog`.
const QUIC_CRYPT_PROGRAMS: [&str; 2] = [program_names::BALANCER_QUIC_CRYPT, program_names::BALANCER_QUIC_CRYPT_V6];

/// Maps pinned for reuse across restarts (the next-hop cache refills itself and is not).
/// Maps added later are created (and pinned) the first time an `lbd` that knows them starts.
const PINNED_MAPS: [&str; 34] = [
    map_names::CONFIG,
    map_names::VIPS,
    map_names::VIP_ADDRS,
    map_names::RINGS,
    map_names::BACKENDS,
    map_names::FLOWS,
    map_names::VIP_STATS,
    map_names::BACKEND_STATS,
    map_names::REASONS,
    map_names::TX_PORTS,
    map_names::VIP_FILTER,
    map_names::LIMITS,
    map_names::BUDGET_STATE,
    map_names::SOURCES,
    map_names::RULES,
    map_names::RULE_BUCKETS,
    map_names::RULE_COUNTERS,
    map_names::RULE_WOULD_DROP,
    map_names::RULE_LENS,
    map_names::OBSERVED,
    map_names::SECOND_CHANCE,
    map_names::FLOWS_UNREMEMBERED,
    map_names::SECOND_CHANCE_PROGRAM,
    map_names::SECOND_CHANCE_HANDOVER,
    map_names::V6_PROGRAM,
    map_names::QUIC_PROGRAM,
    map_names::QUIC_HANDOVER,
    map_names::QUIC_SERVERS,
    map_names::PTB_PROGRAM,
    map_names::PTB_HANDOVER,
    map_names::PASS_TO_PROGRAM,
    map_names::PASS_TO_MISSING,
    map_names::FRAGMENT_PROGRAM,
    map_names::ECHO_PROGRAM,
];

/// The fragment programs, in the order of their slots in `spw_frag_prog`.
const FRAGMENT_PROGRAMS: [&str; 2] = [program_names::FRAGMENT, program_names::FRAGMENT_V6];

impl Balancer {
    /// Loads the balancer object and its program; maps are created, or reused from
    /// `options.map_pin_dir`.
    pub fn load(options: &LoadOptions) -> Result<Self, DataplaneError> {
        let mut ebpf = load_balancer_object(objects::BALANCER, "spillway-lb", options)?;
        load_xdp(&mut ebpf, program_names::CLOCK)?;
        load_xdp(&mut ebpf, program_names::BALANCER)?;
        load_xdp(&mut ebpf, program_names::SECOND_CHANCE)?;
        load_xdp(&mut ebpf, program_names::BALANCER_V6)?;
        load_xdp(&mut ebpf, program_names::PACKET_TOO_BIG)?;
        load_xdp(&mut ebpf, program_names::ECHO)?;
        for name in QUIC_PROGRAMS.into_iter().chain(QUIC_CRYPT_PROGRAMS).chain(FRAGMENT_PROGRAMS) {
            load_xdp(&mut ebpf, name)?;
        }
        let memory = map_memory(&ebpf);
        let clock = clock::calibrate(xdp(&mut ebpf, program_names::CLOCK)?)?;
        let mut maps = BalancerMaps::take(&mut ebpf, options.capacity, memory, clock)?;
        // The slot the balancer tail-calls: until it is filled, second chance is off.
        let name = program_names::SECOND_CHANCE;
        let second = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
        named(map_names::SECOND_CHANCE_PROGRAM, maps.second_chance_program.set(0, second, 0))?;
        // The program the balancer tail-calls for IPv6 frames: set before the balancer is
        // attached, so no IPv6 frame ever finds it missing.
        let name = program_names::BALANCER_V6;
        let v6 = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
        named(map_names::V6_PROGRAM, maps.v6_program.set(0, v6, 0))?;
        // The program the balancer tail-calls for packets too big for the egress: until it
        // is set, they are dropped unanswered.
        let name = program_names::PACKET_TOO_BIG;
        let ptb = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
        named(map_names::PTB_PROGRAM, maps.ptb_program.set(0, ptb, 0))?;
        // The program the balancer tail-calls for echo requests to a VIP address: until it is
        // set, they are dropped unanswered (as until `lbd` writes the answers' rates).
        let name = program_names::ECHO;
        let echo = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
        named(map_names::ECHO_PROGRAM, maps.echo_program.set(0, echo, 0))?;
        // The QUIC programs and their fallbacks: set before any VIP is flagged QUIC.
        for (slot, name) in (0..).zip(QUIC_PROGRAMS) {
            let quic = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
            named(map_names::QUIC_PROGRAM, maps.quic_program.set(slot, quic, 0))?;
        }
        // The crypt programs: until they are set, encrypted ids go by the 5-tuple.
        for (slot, name) in (0..).zip(QUIC_CRYPT_PROGRAMS) {
            let crypt = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
            named(map_names::QUIC_CRYPT_PROGRAM, maps.quic_crypt_program.set(slot, crypt, 0))?;
        }
        // The fragment programs: until they are set, fragments are dropped as before.
        for (slot, name) in (0..).zip(FRAGMENT_PROGRAMS) {
            let fragment = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
            named(map_names::FRAGMENT_PROGRAM, maps.fragment_program.set(slot, fragment, 0))?;
        }
        let tx_ports = maps::take(&mut ebpf, map_names::TX_PORTS)?;
        maps.quic_keys = match ebpf.map(map_names::QUIC_KEYS) {
            Some(aya::maps::Map::Array(keys)) => Some(quic_keys::QuicKeys::load(std::os::fd::AsFd::as_fd(keys.fd()))),
            _ => return Err(DataplaneError::MissingMap { name: map_names::QUIC_KEYS }),
        };
        maps.set_quic_decrypt_budget(QUIC_DECRYPTS_PER_S, QUIC_DECRYPTS_PER_S)?;
        Ok(Self { ebpf, maps, tx_ports })
    }

    pub fn program(&mut self) -> Result<&mut Xdp, DataplaneError> {
        xdp(&mut self.ebpf, program_names::BALANCER)
    }

    /// The loaded program, for test runs.
    pub fn program_ref(&self) -> Result<&Xdp, DataplaneError> {
        self.xdp_ref(program_names::BALANCER)
    }

    /// One of the object's loaded XDP programs (the balancer, the second-chance program).
    pub fn xdp_ref(&self, name: &'static str) -> Result<&Xdp, DataplaneError> {
        let program = self.ebpf.program(name).ok_or(DataplaneError::MissingProgram { name })?;
        program.try_into().map_err(|source| DataplaneError::Program { name, source })
    }

    /// The loaded object, for a reader that takes a map of it (its log records: `logs`).
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }
}

/// Loads `object`, an object with the balancer's maps (the bench's stage variants), using
/// the maps a balancer loaded with the same `options` pinned, and loads its XDP `programs`.
pub fn load_sharing_maps(
    object: &'static [u8],
    object_name: &'static str,
    options: &LoadOptions,
    programs: &[&'static str],
) -> Result<Ebpf, DataplaneError> {
    let mut ebpf = load_balancer_object(object, object_name, options)?;
    for name in programs {
        load_xdp(&mut ebpf, name)?;
    }
    Ok(ebpf)
}

/// The reason counters of a balancer [`load_other_balancer`] loaded, summed over CPUs, by
/// `Reason` index (its build's reasons: a build appends new ones at the end).
pub fn other_reasons(other: &Ebpf) -> Result<Vec<u64>, DataplaneError> {
    let name = map_names::REASONS;
    let map = other.map(name).ok_or(DataplaneError::MissingMap { name })?;
    let counters = aya::maps::PerCpuArray::<_, u64>::try_from(map).map_err(|source| DataplaneError::Map { name, source })?;
    (0..counters.len()).map(|i| named(name, counters.get(&i, 0)).map(|per_cpu| per_cpu.iter().sum())).collect()
}

/// Loads another build's balancer `object` as [`load_sharing_maps`] does, with its QUIC
/// programs in a program array of its own (with its own hand-over), so its QUIC VIPs'
/// packets run its QUIC code, not the pinned balancer's (the bench's `--against`). Its IPv6
/// frames still go to the pinned balancer's IPv6 program.
pub fn load_other_balancer(object: &'static [u8], object_name: &'static str, options: &LoadOptions) -> Result<Ebpf, DataplaneError> {
    // Its reason counters too (`spw_reasons`, read back with [`other_reasons`]): a build
    // that counts more reasons still runs on the same tables.
    let own = [map_names::QUIC_PROGRAM, map_names::QUIC_HANDOVER, map_names::REASONS];
    let mut ebpf = load_object(object, object_name, options, &own)?;
    load_xdp(&mut ebpf, program_names::BALANCER)?;
    let mut programs = Vec::with_capacity(QUIC_PROGRAMS.len());
    for name in QUIC_PROGRAMS {
        load_xdp(&mut ebpf, name)?;
        let program = xdp(&mut ebpf, name)?.fd().map_err(|source| DataplaneError::Program { name, source })?;
        programs.push(program.try_clone().map_err(|source| DataplaneError::Program { name, source: ProgramError::IOError(source) })?);
    }
    let name = map_names::QUIC_PROGRAM;
    // Borrowed, not taken: the kernel empties a program array once no fd of it is left.
    let map = ebpf.map_mut(name).ok_or(DataplaneError::MissingMap { name })?;
    let mut array = aya::maps::ProgramArray::try_from(map).map_err(|source| DataplaneError::Map { name, source })?;
    for (slot, program) in (0..).zip(&programs) {
        named(name, array.set(slot, program, 0))?;
    }
    Ok(ebpf)
}

fn load_balancer_object(object: &'static [u8], name: &'static str, options: &LoadOptions) -> Result<Ebpf, DataplaneError> {
    load_object(object, name, options, &[])
}

/// Loads `object` with the pinned maps of `options`, but those named in `own`.
fn load_object(object: &'static [u8], name: &'static str, options: &LoadOptions, own: &[&str]) -> Result<Ebpf, DataplaneError> {
    let object = check_built(object, name)?;
    let mut loader = EbpfLoader::new();
    let c = options.capacity;
    // A slot per possible CPU, by CPU id.
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| DataplaneError::Cpus(source))?.get();
    for (map, entries) in [
        (map_names::VIPS, c.vip_slots()),
        (map_names::VIP_ADDRS, c.vips),
        (map_names::RINGS, c.ring_words()),
        (map_names::BACKENDS, c.backend_slots()),
        (map_names::FLOWS, c.flow_buckets()),
        (map_names::VIP_STATS, c.vips),
        (map_names::BACKEND_STATS, c.backend_slots()),
        (map_names::NEXTHOP_CACHE, c.backend_slots()),
        (map_names::PROBE_LAST, c.backend_slots()),
        (map_names::LIMITS, c.default_limit_slot() + 1),
        (map_names::BUDGET_STATE, c.vips),
        (map_names::RULE_LENS, c.default_limit_slot() + 1),
        (map_names::QUIC_SERVERS, c.quic_server_slots()),
        (map_names::QUIC_HANDOVER, cpus),
        (map_names::QUIC_CONFIGS, c.quic_config_slots()),
        (map_names::QUIC_KEYS, c.quic_config_slots()),
        (map_names::FRAGMENTS, c.fragments),
    ] {
        loader.map_max_entries(map, entries);
    }
    // The program's view of the sizes (`xdp-ebpf/src/bin/lb/maps.rs`).
    let (flow_mask, vip_mask, default_slot) = (c.flow_buckets() - 1, c.vip_slots() - 1, c.default_limit_slot());
    loader.override_global("FLOW_BUCKET_MASK", &flow_mask, true);
    loader.override_global("VIP_SLOT_MASK", &vip_mask, true);
    loader.override_global("DEFAULT_LIMIT_SLOT", &default_slot, true);
    let quic_server_mask = c.quic_server_slots() - 1;
    loader.override_global("QUIC_SERVER_SLOT_MASK", &quic_server_mask, true);
    if let Some(dir) = &options.map_pin_dir {
        std::fs::create_dir_all(dir).map_err(|source| DataplaneError::Pin { path: dir.clone(), source })?;
        for map in PINNED_MAPS.into_iter().filter(|map| !own.contains(map)) {
            loader.map_pin_path(map, dir.join(map));
        }
    }
    loader.load(object).map_err(|source| DataplaneError::Load { name, pin_dir: options.map_pin_dir.clone(), source: Box::new(source) })
}

/// Each map of `ebpf` with the memory the kernel charges for it (`memlock` in its fdinfo).
fn map_memory(ebpf: &Ebpf) -> Vec<MapMemory> {
    use aya::maps::Map;
    let mut out: Vec<MapMemory> = ebpf
        .maps()
        .filter_map(|(name, map)| {
            let data = match map {
                Map::Array(d)
                | Map::HashMap(d)
                | Map::LruHashMap(d)
                | Map::PerCpuArray(d)
                | Map::LpmTrie(d)
                | Map::DevMapHash(d)
                | Map::RingBuf(d) => d,
                _ => return None,
            };
            let info = data.info().ok()?;
            let fd = std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(data.fd()));
            let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
            let bytes = fdinfo.lines().find_map(|l| l.strip_prefix("memlock:")?.trim().parse().ok())?;
            let kind = info.map_type().map(|t| format!("{t:?}")).unwrap_or_else(|_| "unknown".into());
            Some(MapMemory { name: name.to_owned(), kind, entries: info.max_entries(), bytes })
        })
        .collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    out
}

/// A look at a running balancer's maps through their pins (the bench watches a table flip
/// with it): its VIP index, Maglev tables and backends.
pub struct PinnedView {
    pub vips: VipIndex,
    pub rings: RingPool,
    backends: aya::maps::Array<aya::maps::MapData, spillway_common::types::BackendInfo>,
}

impl PinnedView {
    /// Opens the maps pinned in `maps_dir` (`PinLayout::balancer_maps`).
    pub fn open(maps_dir: &Path) -> Result<Self, DataplaneError> {
        let data =
            |name: &'static str| aya::maps::MapData::from_pin(maps_dir.join(name)).map_err(|source| DataplaneError::Map { name, source });
        let backends = aya::maps::Map::Array(data(map_names::BACKENDS)?);
        Ok(Self {
            vips: tables::Index { slots: mmap::Mapped::new(&data(map_names::VIPS)?, map_names::VIPS)? },
            rings: RingPool { words: mmap::Mapped::new(&data(map_names::RINGS)?, map_names::RINGS)? },
            backends: backends.try_into().map_err(|source| DataplaneError::Map { name: map_names::BACKENDS, source })?,
        })
    }

    /// The addresses of the backends `table` names.
    pub fn backends_in(
        &self,
        table: spillway_common::types::RingRef,
    ) -> Result<std::collections::BTreeSet<std::net::IpAddr>, DataplaneError> {
        let ids: std::collections::BTreeSet<u32> = self.rings.read(table).into_iter().collect();
        ids.into_iter()
            .map(|id| {
                let info = self.backends.get(&id, 0).map_err(|source| DataplaneError::Map { name: map_names::BACKENDS, source })?;
                Ok(spillway_common::addr::from_words(info.addr, info.family))
            })
            .filter_map(|r| r.transpose())
            .collect()
    }
}

/// Loads a single-program object that needs no map setup (decap, floor) and returns it.
pub fn load_simple(object: &'static [u8], object_name: &'static str, program: &'static str) -> Result<Ebpf, DataplaneError> {
    load_sized(object, object_name, program, &[])
}

/// [`load_simple`], with maps of other sizes than the object's: `(map, max_entries)`.
pub fn load_sized(
    object: &'static [u8],
    object_name: &'static str,
    program: &'static str,
    sizes: &[(&'static str, u32)],
) -> Result<Ebpf, DataplaneError> {
    let object = check_built(object, object_name)?;
    let mut loader = EbpfLoader::new();
    for &(map, entries) in sizes {
        loader.map_max_entries(map, entries);
    }
    let mut ebpf =
        loader.load(object).map_err(|source| DataplaneError::Load { name: object_name, pin_dir: None, source: Box::new(source) })?;
    load_xdp(&mut ebpf, program)?;
    Ok(ebpf)
}

pub fn xdp<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut Xdp, DataplaneError> {
    let program = ebpf.program_mut(name).ok_or(DataplaneError::MissingProgram { name })?;
    program.try_into().map_err(|source| DataplaneError::Program { name, source })
}

fn load_xdp(ebpf: &mut Ebpf, name: &'static str) -> Result<(), DataplaneError> {
    let program = xdp(ebpf, name)?;
    without_signals(|| program.load()).map_err(|source| DataplaneError::Program { name, source })
}

/// Runs `f` with every signal blocked on this thread. The verifier gives up with EAGAIN
/// when a signal is pending for the loading thread; aya retries five times, but a large
/// program verified while children exit (SIGCHLD, with a handler installed by tokio) can
/// lose every attempt. Blocked here, process signals go to another thread meanwhile.
pub fn without_signals<T>(f: impl FnOnce() -> T) -> T {
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let mut previous = SigSet::empty();
    // Blocking cannot fail with a valid `how`; if it did, loading would merely be retried.
    let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), Some(&mut previous)).is_ok();
    let result = f();
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
    }
    result
}

/// True when `path` is on a bpf filesystem.
pub fn is_bpffs(path: &Path) -> bool {
    use nix::sys::statfs::{BPF_FS_MAGIC, statfs};
    statfs(path).is_ok_and(|s| s.filesystem_type() == BPF_FS_MAGIC)
}
