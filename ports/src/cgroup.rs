//! The cgroup2 root the UDP hook attaches to: the mounted hierarchy if there is one, else a
//! private mount of it (hosts with only cgroup v1 mounted, or a process with its own /sys,
//! as under `ip netns exec`). The cgroup2 hierarchy always exists; every process is in it.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};

use super::PortsError;

/// An open cgroup2 root directory and where it was found (for messages).
pub(super) fn open_root() -> Result<(File, String), PortsError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|source| PortsError::Cgroup { path: "/proc/self/mountinfo".into(), source })?;
    if let Some(root) = parse_cgroup2_mount(&mountinfo) {
        let file = File::open(&root).map_err(|source| PortsError::Cgroup { path: root.clone(), source })?;
        return Ok((file, root.display().to_string()));
    }
    let file = private_mount().map_err(|source| PortsError::Cgroup { path: "cgroup2 (private mount)".into(), source })?;
    Ok((file, "a private cgroup2 mount".to_owned()))
}

/// Mounts cgroup2 in a mount namespace of a short-lived thread, so nothing outside sees
/// it, and keeps only the open root (which keeps the mount alive).
fn private_mount() -> std::io::Result<File> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                // CLONE_FS too: a thread sharing its fs_struct cannot leave the namespace.
                unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_FS)?;
                mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
                let dir = std::env::temp_dir();
                mount(Some("cgroup2"), &dir, Some("cgroup2"), MsFlags::empty(), None::<&str>)?;
                let root = File::open(&dir);
                umount2(&dir, MntFlags::MNT_DETACH)?;
                root
            })
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The first cgroup2 mount point in a mountinfo text (`ID PARENT DEV ROOT MOUNT_POINT ...
/// - FSTYPE ...`).
fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mount_point = mount.split(' ').nth(4)?;
        (fs.split(' ').next()? == "cgroup2").then(|| Path::new(&unescape_octal(mount_point)).to_owned())
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        match rest.get(at + 1..at + 4).and_then(|o| u8::from_str_radix(o, 8).ok()) {
            Some(byte) => {
                out.push(char::from(byte));
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn finds_the_cgroup2_mount() {
        let hybrid = "\
25 1 0:23 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 25 0:31 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(parse_cgroup2_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let escaped = "33 25 0:31 / /mnt/my\\040cgroups rw shared:9 - cgroup2 none rw\n";
        assert_eq!(parse_cgroup2_mount(escaped), Some(PathBuf::from("/mnt/my cgroups")));
        assert_eq!(parse_cgroup2_mount("26 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw\n"), None);
    }

    /// Needs root (CAP_SYS_ADMIN), as the watcher does.
    #[test]
    fn a_private_mount_is_the_same_hierarchy_and_leaves_nothing_mounted() {
        // Other tests of the suite mount and unmount network namespaces under /run/netns meanwhile:
        // only the other mounts must stay as they were.
        let mounts = || {
            let all = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            all.lines().filter(|line| !line.contains(" /run/netns")).collect::<Vec<_>>().join("\n")
        };
        let before = mounts();
        let private = private_mount().expect("mounting cgroup2 privately");
        assert_eq!(mounts(), before);
        let cgroup_procs =
            |dir: &File| std::fs::read_to_string(format!("/proc/self/fd/{}/cgroup.procs", std::os::fd::AsRawFd::as_raw_fd(dir)));
        assert!(cgroup_procs(&private).is_ok(), "a cgroup2 directory");
        if let Some(mounted) = parse_cgroup2_mount(&before) {
            let (a, b) = (private.metadata().unwrap(), std::fs::metadata(mounted).unwrap());
            assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the same root");
        }
    }
}
