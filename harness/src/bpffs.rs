//! The BPF filesystem, where the daemon under test pins its maps and links.

use std::path::Path;

use anyhow::{Context, Result};
use nix::mount::{MsFlags, mount};
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};

use crate::lock_file;

/// Where bpffs is conventionally mounted and where the daemon pins.
pub(crate) const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// Mounts bpffs at [`BPFFS_ROOT`] unless it is already there (minimal
/// containers and fresh VMs often lack it); pins on plain sysfs would fail.
pub fn ensure_mounted() -> Result<()> {
    // Concurrent tests, of this process or of another test binary, must not stack two
    // mounts: pins made in the lower one would vanish from view.
    let _mounting = lock_file::lock(Path::new(lock_file::LOCK_DIR), "bpffs-mount", lock_file::How::LockExclusive)?;
    let root = Path::new(BPFFS_ROOT);
    let fs = statfs(root).with_context(|| format!("statfs {BPFFS_ROOT}"))?;
    if fs.filesystem_type() == BPF_FS_MAGIC {
        return Ok(());
    }
    // Root only, as lbd mounts it.
    mount(Some("bpf"), root, Some("bpf"), MsFlags::empty(), Some("mode=0700")).with_context(|| format!("mounting bpffs at {BPFFS_ROOT}"))
}
