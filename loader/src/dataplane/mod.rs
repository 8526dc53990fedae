//! The balancer's kernel side: loading the object, pinning and reusing its maps, and typed
//! access to every map. Only this module (and `agent`'s decap loader) talk to the kernel.

mod flows;
mod maps;
mod probe;
pub mod test_run;

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    programs::{ProgramError, Xdp},
};
pub use maps::{BalancerMaps, MapOccupancy};
pub use probe::ProbeMaps;
use spillway_common::limits::{map_names, program_names};

use crate::objects;

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
    #[error("reading the number of possible CPUs")]
    Cpus(#[source] std::io::Error),
    #[error("pin path {path}")]
    Pin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where the maps live: in memory only (tests, benchmarks) or pinned for reuse.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Directory on bpffs for the maps; an existing map there is reused when its shape
    /// matches and refused otherwise.
    pub map_pin_dir: Option<PathBuf>,
}

/// The loaded balancer object: its program (loaded, not attached) and its maps.
pub struct Balancer {
    ebpf: Ebpf,
    pub maps: BalancerMaps,
}

/// Maps pinned for reuse across restarts (the next-hop cache refills itself and is not).
/// Maps added later are created (and pinned) the first time an `lbd` that knows them starts.
const PINNED_MAPS: [&str; 23] = [
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
    map_names::RULE_STATS,
    map_names::RULE_COUNT,
    map_names::OBSERVED,
    map_names::VIP_NEW_FLOWS,
    map_names::BACKEND_NEW_FLOWS,
    map_names::PRIOR_RINGS,
    map_names::PRIOR_SIZE,
    map_names::SECOND_CHANCE,
];

impl Balancer {
    /// Loads the balancer object and its program; maps are created, or reused from
    /// `options.map_pin_dir`.
    pub fn load(options: &LoadOptions) -> Result<Self, DataplaneError> {
        let object = objects::check(objects::BALANCER, "spillway-lb")?;
        let mut loader = EbpfLoader::new();
        if let Some(dir) = &options.map_pin_dir {
            std::fs::create_dir_all(dir).map_err(|source| DataplaneError::Pin { path: dir.clone(), source })?;
            for name in PINNED_MAPS {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let mut ebpf = loader.load(object).map_err(|source| DataplaneError::Load {
            name: "spillway-lb",
            pin_dir: options.map_pin_dir.clone(),
            source: Box::new(source),
        })?;
        load_xdp(&mut ebpf, program_names::BALANCER)?;
        let maps = BalancerMaps::take(&mut ebpf)?;
        Ok(Self { ebpf, maps })
    }

    pub fn program(&mut self) -> Result<&mut Xdp, DataplaneError> {
        xdp(&mut self.ebpf, program_names::BALANCER)
    }

    /// The loaded program, for test runs.
    pub fn program_ref(&self) -> Result<&Xdp, DataplaneError> {
        let name = program_names::BALANCER;
        let program = self.ebpf.program(name).ok_or(DataplaneError::MissingProgram { name })?;
        program.try_into().map_err(|source| DataplaneError::Program { name, source })
    }
}

/// Loads a single-program object that needs no map setup (decap, floor) and returns it.
pub fn load_simple(object: &'static [u8], object_name: &'static str, program: &'static str) -> Result<Ebpf, DataplaneError> {
    let object = objects::check(object, object_name)?;
    let mut ebpf =
        Ebpf::load(object).map_err(|source| DataplaneError::Load { name: object_name, pin_dir: None, source: Box::new(source) })?;
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
