//! tracefs, which classic tracepoints need (aya finds a tracepoint's id under
//! `events/<category>/<name>/id`). Fresh hosts often have it unmounted, and a process
//! started by `ip netns exec` sees a private /sys without it: the watcher mounts it where
//! the kernel expects it, as `lbd` does with bpffs. Left mounted on exit, like bpffs.

use std::io;
use std::path::Path;

use nix::mount::{MsFlags, mount};

pub(super) const TRACEFS: &str = "/sys/kernel/tracing";
/// The older place, under debugfs; used when already mounted there.
const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// Makes tracefs visible at [`TRACEFS`] unless it already is (there or under debugfs).
/// Must run before the first tracepoint attach of the process: aya looks for tracefs once
/// and remembers the answer.
pub(super) fn ensure_mounted() -> io::Result<()> {
    if has_events(Path::new(TRACEFS)) || has_events(Path::new(DEBUGFS_TRACING)) {
        return Ok(());
    }
    mount(Some("tracefs"), TRACEFS, Some("tracefs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(|errno| io::Error::other(format!("mounting tracefs at {TRACEFS}: {errno}")))?;
    if has_events(Path::new(TRACEFS)) {
        Ok(())
    } else {
        Err(io::Error::other(format!("tracefs mounted at {TRACEFS} but it has no events/ (kernel without CONFIG_TRACING?)")))
    }
}

fn has_events(dir: &Path) -> bool {
    dir.join("events").is_dir()
}
