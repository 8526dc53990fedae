//! What can go wrong loading and reading the port watcher, and whether the kernel refused it.

use std::path::PathBuf;

use aya::maps::MapError;
use aya::programs::ProgramError;

/// The kernel's internal "not supported" (include/linux/errno.h), which bpf(2) can return.
const ENOTSUPP: i32 = 524;

#[derive(Debug, thiserror::Error)]
pub enum PortsError {
    #[error("eBPF object spillway-sockwatch was not built (AYA_BUILD_SKIP was set, or clang was missing); rebuild with clang")]
    ObjectNotBuilt,
    #[error("reading the kernel's BTF (/sys/kernel/btf/vmlinux; needs CONFIG_DEBUG_INFO_BTF)")]
    Btf(#[source] aya::BtfError),
    #[error("loading eBPF object spillway-sockwatch")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("program {program} missing from spillway-sockwatch")]
    MissingProgram { program: &'static str },
    #[error("map {map} missing from spillway-sockwatch")]
    MissingMap { map: &'static str },
    #[error("hook {hook} (program {program})")]
    Hook {
        hook: String,
        program: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("tracefs (classic tracepoints need it)")]
    Tracefs(#[source] std::io::Error),
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
    #[error("reading map {name} in batches")]
    MapRead {
        name: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("network namespace {path}")]
    Netns {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("sock_diag in network namespace {netns}")]
    SockDiag {
        netns: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PortsError {
    /// Whether the kernel refused the hook itself (EPERM, EOPNOTSUPP/ENOTSUPP or ENOSYS from
    /// loading or attaching it, as lockdown, a hardened kernel or a missing feature does)
    /// rather than something of ours failing (a verifier rejection is EACCES/EINVAL).
    pub fn is_kernel_refusal(&self) -> bool {
        let mut source: Option<&dyn std::error::Error> = Some(self);
        while let Some(error) = source {
            if let Some(io) = error.downcast_ref::<std::io::Error>()
                && matches!(io.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | libc::ENOSYS | ENOTSUPP))
            {
                return true;
            }
            source = error.source();
        }
        false
    }
}
