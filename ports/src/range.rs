//! A namespace's ephemeral port range (`net.ipv4.ip_local_port_range`, minus
//! `ip_local_reserved_ports`), read from a thread in that namespace: /proc/sys/net follows
//! the reading thread's network namespace.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use spillway_model::ports_report::NetnsPorts;

use super::PortsError;

const RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
const RESERVED_FILE: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// Reads the calling thread's namespace's port range.
pub fn read_current() -> std::io::Result<NetnsPorts> {
    let range = std::fs::read_to_string(RANGE_FILE)?;
    // Absent on kernels without it: nothing reserved.
    let reserved = std::fs::read_to_string(RESERVED_FILE).unwrap_or_default();
    NetnsPorts::parse(&range, &reserved).ok_or_else(|| std::io::Error::other(format!("unparsable {RANGE_FILE}: {range:?}")))
}

/// Inode of a network namespace file (`/run/netns/x`, `/proc/<pid>/ns/net`), the number
/// the kernel side keys by.
pub fn netns_inode(path: &Path) -> std::io::Result<u32> {
    // Namespace inodes are 32-bit (`ns_common.inum`).
    Ok(std::fs::metadata(path)?.ino() as u32)
}

/// Reads the ranges of the namespace at `path` (see [`in_netns`]).
pub fn read_netns_ports(path: &Path) -> Result<NetnsPorts, PortsError> {
    let file = File::open(path).map_err(|source| PortsError::Netns { path: path.to_owned(), source })?;
    in_netns(&file, read_current).and_then(|read| read).map_err(|source| PortsError::Netns { path: path.to_owned(), source })
}

/// Runs `f` in the network namespace `file` names: on this thread when it is already there,
/// else on a short-lived thread that joins it first. Joining one, even one's own, needs
/// CAP_SYS_ADMIN: a watcher of its own namespace must do without (the units grant it only
/// for `--all-netns`). The outer error is the join's (EINVAL: `file` is no network
/// namespace), the inner `f`'s.
pub(super) fn in_netns<T: Send>(file: &File, f: impl FnOnce() -> std::io::Result<T> + Send) -> std::io::Result<std::io::Result<T>> {
    let (target, own) = (file.metadata()?, std::fs::metadata("/proc/thread-self/ns/net")?);
    if (target.dev(), target.ino()) == (own.dev(), own.ino()) {
        return Ok(f());
    }
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // SAFETY: setns on a valid fd affects only this thread, which exits after `f`.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// Maps namespace inodes to their port ranges: finds a file for each inode among the
/// named namespaces (`/run/netns`) and the processes' (`/proc/<pid>/ns/net`), reads it
/// once and caches the answer (call [`NetnsResolver::forget`] to re-read, e.g. each
/// minute: the sysctl may change).
#[derive(Debug, Default)]
pub struct NetnsResolver {
    cache: HashMap<u32, Option<NetnsPorts>>,
    /// Namespaces whose file is known in advance: one no name or process leads to, such as
    /// a thread's own unnamed namespace.
    known: HashMap<u32, PathBuf>,
}

impl NetnsResolver {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn forget(&mut self) {
        self.cache.clear();
    }

    /// Namespace `inode` can be joined through `path`.
    pub fn know(&mut self, inode: u32, path: PathBuf) {
        self.known.insert(inode, path);
    }

    /// A file to join namespace `inode` by, if it still exists.
    pub fn path(&self, inode: u32) -> Option<PathBuf> {
        self.known.get(&inode).cloned().or_else(|| find_netns(inode))
    }

    /// The ranges of namespace `inode`, `None` if no file for it is found (the namespace
    /// is gone) or it cannot be read.
    pub fn ports(&mut self, inode: u32) -> Option<NetnsPorts> {
        if let Some(known) = self.cache.get(&inode) {
            return *known;
        }
        let found = self.path(inode).and_then(|path| read_netns_ports(&path).ok());
        self.cache.insert(inode, found);
        found
    }
}

/// A file for network namespace `inode`: a named one (`/run/netns`) or a process's.
fn find_netns(inode: u32) -> Option<PathBuf> {
    netns_files().find(|path| netns_inode(path).is_ok_and(|i| i == inode))
}

/// Every network namespace on the host that has a name or a process, once each, with a
/// file to join it by.
pub(super) fn all_netns() -> Vec<(u32, PathBuf)> {
    let mut seen = HashMap::new();
    for path in netns_files() {
        if let Ok(inode) = netns_inode(&path) {
            seen.entry(inode).or_insert(path);
        }
    }
    seen.into_iter().collect()
}

fn netns_files() -> impl Iterator<Item = PathBuf> {
    let named = std::fs::read_dir("/run/netns").into_iter().flatten().flatten().map(|e| e.path());
    let procs = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .map(|e| e.path().join("ns/net"));
    named.chain(procs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_namespace() {
        let own = netns_inode(Path::new("/proc/self/ns/net")).unwrap();
        let mut resolver = NetnsResolver::new();
        let ports = resolver.ports(own).expect("own namespace found");
        assert_eq!(ports, read_current().unwrap());
        assert!(ports.usable() > 0);
    }
}
