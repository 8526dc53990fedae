//! The privileges a shipped systemd unit gives its root service, read from the unit file
//! (and drop-ins) so a test runs the real binary with exactly those: PID 1 here is not
//! systemd, so the unit itself cannot be started. [`setpriv_wrapper`] gives the
//! capabilities; [`SyscallFilter`] builds the seccomp filter systemd would install for the
//! unit's `SystemCallFilter=`, `SystemCallErrorNumber=`, `SystemCallArchitectures=native`
//! and `RestrictNamespaces=` (the system call groups as `systemd-analyze syscall-filter`
//! lists them). The mount sandbox (`ProtectSystem=`, `ReadWritePaths=` ...) is not played.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

/// A file of `deploy/systemd/` (a unit or a drop-in shipped beside it).
pub fn deploy_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd").join(name)
}

/// `setpriv` and its arguments (up to `--`) that give a command run as root what `files` (a
/// unit, then its drop-ins, in systemd's order) leave a root service: the bounding set
/// (`CapabilityBoundingSet=`; root's permitted and effective sets become exactly it at
/// exec), the ambient and inheritable sets (`AmbientCapabilities=`) and `NoNewPrivileges=`.
pub fn setpriv_wrapper(files: &[PathBuf]) -> Result<Vec<String>> {
    let mut bounding: Option<BTreeSet<String>> = None;
    let mut ambient = BTreeSet::new();
    let mut no_new_privs = false;
    for (key, value) in settings(files)? {
        match key.as_str() {
            "CapabilityBoundingSet" => {
                let (inverted, caps) = capabilities(&value);
                bounding = Some(match (bounding.take(), inverted) {
                    _ if caps.is_empty() => BTreeSet::new(),
                    (None, false) => caps,
                    (Some(mut set), false) => {
                        set.extend(caps);
                        set
                    }
                    (Some(mut set), true) => {
                        set.retain(|c| !caps.contains(c));
                        set
                    }
                    (None, true) => bail!("{files:?}: a ~ list before any list of capabilities is not supported"),
                });
            }
            "AmbientCapabilities" => match capabilities(&value) {
                (false, caps) if caps.is_empty() => ambient.clear(),
                (false, caps) => ambient.extend(caps),
                (true, caps) => ambient.retain(|c| !caps.contains(c)),
            },
            "NoNewPrivileges" => no_new_privs = matches!(value.as_str(), "yes" | "true" | "on" | "1"),
            _ => {}
        }
    }
    let Some(bounding) = bounding else { bail!("{files:?} set no CapabilityBoundingSet=: the service would keep every capability") };
    let list = |set: &BTreeSet<String>| set.iter().map(|c| format!(",+{c}")).collect::<String>();
    let mut wrapper = vec![
        "setpriv".to_owned(),
        format!("--bounding-set=-all{}", list(&bounding)),
        format!("--inh-caps=-all{}", list(&ambient)),
        format!("--ambient-caps=-all{}", list(&ambient)),
    ];
    if no_new_privs {
        wrapper.push("--no-new-privs".to_owned());
    }
    wrapper.push("--".to_owned());
    Ok(wrapper)
}

/// The `key=value` settings of `files`, in order.
fn settings(files: &[PathBuf]) -> Result<Vec<(String, String)>> {
    let mut all = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let lines = text.lines().filter(|l| !l.trim_start().starts_with(['#', ';', '[']));
        all.extend(lines.filter_map(|l| l.split_once('=')).map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())));
    }
    Ok(all)
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "x86_64")]
const SYSCALL_HEADER: &str = "/usr/include/x86_64-linux-gnu/asm/unistd_64.h";
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "aarch64")]
const SYSCALL_HEADER: &str = "/usr/include/asm-generic/unistd.h";
/// x32 system calls on x86_64 (`__X32_SYSCALL_BIT`): not the native ABI.
const X32_BIT: u32 = 0x4000_0000;
/// RestrictNamespaces= names and their CLONE_NEW* flags.
const NAMESPACES: [(&str, u32); 7] = [
    ("cgroup", 0x0200_0000),
    ("ipc", 0x0800_0000),
    ("net", 0x4000_0000),
    ("mnt", 0x0002_0000),
    ("pid", 0x2000_0000),
    ("user", 0x1000_0000),
    ("uts", 0x0400_0000),
];

/// A unit's system call filter as classic BPF over `struct seccomp_data`, as systemd builds
/// it: other ABIs refused; in an allow list (with `@default`, which systemd always permits)
/// or out of a deny list, each call by number, anything else failing with
/// `SystemCallErrorNumber=`; unshare/clone refused (EPERM) for a namespace type not allowed,
/// setns for one not allowed or unnamed (0), and clone3, whose flags a filter cannot read,
/// failing with ENOSYS (the C library then falls back to clone).
pub struct SyscallFilter {
    program: Vec<libc::sock_filter>,
}

impl SyscallFilter {
    /// The filter `files` (a unit, then its drop-ins) set. A `~` list after an allow list
    /// removes its calls whatever comes after it (systemd applies the lines in order; no unit
    /// here adds a call back).
    pub fn read(files: &[PathBuf]) -> Result<SyscallFilter> {
        let (mut allow, mut names, mut errno, mut namespaces) = (None, BTreeSet::new(), libc::EPERM, None::<u32>);
        let every_namespace = NAMESPACES.iter().fold(0, |all, (_, flag)| all | flag);
        for (key, value) in settings(files)? {
            match key.as_str() {
                "SystemCallFilter" => {
                    let (inverted, list) = value.strip_prefix('~').map_or((false, value.as_str()), |rest| (true, rest));
                    let listed: BTreeSet<String> = list.split_whitespace().map(str::to_owned).collect();
                    if listed.is_empty() {
                        (allow, names) = (None, BTreeSet::new());
                        continue;
                    }
                    let allowing = *allow.get_or_insert(!inverted);
                    if allowing == !inverted {
                        names.extend(listed);
                    } else {
                        names.extend(listed.iter().map(|n| format!("~{n}")));
                    }
                }
                "SystemCallErrorNumber" => {
                    errno = match value.as_str() {
                        "EPERM" => libc::EPERM,
                        "EACCES" => libc::EACCES,
                        "ENOSYS" => libc::ENOSYS,
                        other => bail!("SystemCallErrorNumber={other} is not supported here"),
                    }
                }
                "SystemCallArchitectures" => ensure!(value == "native", "SystemCallArchitectures={value} is not supported here"),
                "RestrictNamespaces" => {
                    let (inverted, list) = value.strip_prefix('~').map_or((false, value.as_str()), |rest| (true, rest));
                    let flags = |list: &str| -> Result<u32> {
                        list.split_whitespace().try_fold(0, |all, name| {
                            let flag = NAMESPACES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f);
                            Ok(all | flag.with_context(|| format!("RestrictNamespaces: unknown namespace type {name}"))?)
                        })
                    };
                    namespaces = match (list, inverted) {
                        ("yes" | "true", false) => Some(0),
                        ("no" | "false" | "", false) => None,
                        (list, false) => Some(namespaces.unwrap_or(0) | flags(list)?),
                        (list, true) => Some(namespaces.unwrap_or(every_namespace) & !flags(list)?),
                    };
                }
                _ => {}
            }
        }
        let allow = allow.context("the unit sets no SystemCallFilter=")?;
        let groups = syscall_groups()?;
        let numbers = syscall_numbers()?;
        let mut calls = BTreeSet::new();
        if allow {
            expand("@default", &groups, &mut calls, 0)?;
        }
        let (removed, added): (Vec<&String>, Vec<&String>) = names.iter().partition(|n| n.starts_with('~'));
        for name in added {
            expand(name, &groups, &mut calls, 0)?;
        }
        let mut gone = BTreeSet::new();
        for name in removed {
            expand(&name[1..], &groups, &mut gone, 0)?;
        }
        // Names the kernel's table lacks (other architectures' calls) are skipped, as systemd does.
        let listed: BTreeSet<u32> = calls.difference(&gone).filter_map(|name| numbers.get(name.as_str()).copied()).collect();
        let number = |name: &str| numbers.get(name).copied().with_context(|| format!("no system call {name} in {SYSCALL_HEADER}"));
        Ok(SyscallFilter { program: program(&listed, allow, errno, namespaces.map(|ok| every_namespace & !ok), number)? })
    }

    /// Sets `cmd` up to run in the network namespace `netns` under the filter: it joins the
    /// namespace first, as systemd sets a unit's namespaces up before its filters.
    pub fn apply(&self, cmd: &mut Command, netns: File) {
        let program = self.program.clone();
        // SAFETY: the hook runs in the child between fork and exec and makes only syscalls
        // (setns, prctl, seccomp) on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fprog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr().cast_mut() };
                if libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) != 0 || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, &raw const fprog) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// The filter's instructions: `listed` are the calls allowed (or, `!allow`, refused);
/// `refused_namespaces` the CLONE_NEW* flags that unshare, clone and setns may not use.
fn program(
    listed: &BTreeSet<u32>,
    allow: bool,
    errno: i32,
    refused_namespaces: Option<u32>,
    number: impl Fn(&str) -> Result<u32>,
) -> Result<Vec<libc::sock_filter>> {
    let op = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter { code: code as u16, jt, jf, k };
    let load = |offset: u32| op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset, 0, 0);
    let ret = |k: u32| op(libc::BPF_RET | libc::BPF_K, k, 0, 0);
    let jeq = |k: u32, jt: u8, jf: u8| op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, k, jt, jf);
    let refuse = |errno: i32| ret(libc::SECCOMP_RET_ERRNO | errno as u32);
    // seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8i (the low word first, little-endian).
    let (nr, arch, arg) = (0, 4, |i: u32| 16 + 8 * i);
    let mut p = vec![load(arch), jeq(AUDIT_ARCH, 1, 0), refuse(libc::EPERM), load(nr)];
    p.extend([op(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, X32_BIT, 0, 1), refuse(libc::EPERM)]);
    if let Some(refused) = refused_namespaces.filter(|r| *r != 0) {
        let jset = |k: u32, jt: u8| op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, k, jt, 0);
        // Each: the call's flags refused, or on to the lists with the number loaded again.
        p.extend([jeq(number("setns")?, 0, 6), load(arg(1)), jeq(0, 3, 0), jset(refused, 2), load(nr)]);
        p.extend([op(libc::BPF_JMP | libc::BPF_JA, 1, 0, 0), refuse(libc::EPERM)]);
        for call in ["unshare", "clone"] {
            p.extend([jeq(number(call)?, 0, 5), load(arg(0)), jset(refused, 2), load(nr)]);
            p.extend([op(libc::BPF_JMP | libc::BPF_JA, 1, 0, 0), refuse(libc::EPERM)]);
        }
        p.extend([jeq(number("clone3")?, 0, 1), refuse(libc::ENOSYS)]);
    }
    let (hit, miss) = if allow { (ret(libc::SECCOMP_RET_ALLOW), refuse(errno)) } else { (refuse(errno), ret(libc::SECCOMP_RET_ALLOW)) };
    for &call in listed {
        p.extend([jeq(call, 0, 1), hit]);
    }
    p.push(miss);
    ensure!(p.len() <= 4096, "{} instructions: more than a filter may hold", p.len());
    Ok(p)
}

/// The system call groups (`@name`: calls and groups) as `systemd-analyze syscall-filter`
/// lists them.
fn syscall_groups() -> Result<HashMap<String, Vec<String>>> {
    let out = Command::new("systemd-analyze").arg("syscall-filter").output().context("running systemd-analyze syscall-filter")?;
    ensure!(out.status.success(), "systemd-analyze syscall-filter: {}", String::from_utf8_lossy(&out.stderr));
    let mut groups: HashMap<String, Vec<String>> = HashMap::new();
    let mut current = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match line.trim() {
            "" => current = None,
            entry if entry.starts_with('#') => {}
            group if !line.starts_with(' ') => current = Some(groups.entry(group.to_owned()).or_default()),
            entry => current.as_mut().context("a system call outside any group")?.push(entry.to_owned()),
        }
    }
    Ok(groups)
}

/// Adds `name` (a call, or a group and every group it names) to `calls`.
fn expand(name: &str, groups: &HashMap<String, Vec<String>>, calls: &mut BTreeSet<String>, depth: usize) -> Result<()> {
    ensure!(depth < 16, "system call groups nested too deep at {name}");
    if !name.starts_with('@') {
        calls.insert(name.to_owned());
        return Ok(());
    }
    for entry in groups.get(name).with_context(|| format!("no system call group {name}"))? {
        expand(entry, groups, calls, depth + 1)?;
    }
    Ok(())
}

/// This architecture's system call numbers, from the kernel's header (`#define __NR_x N`).
fn syscall_numbers() -> Result<HashMap<String, u32>> {
    let header = std::fs::read_to_string(SYSCALL_HEADER).with_context(|| format!("reading {SYSCALL_HEADER} (linux-libc-dev)"))?;
    let numbers = header.lines().filter_map(|line| {
        let mut words = line.strip_prefix("#define __NR_")?.split_whitespace();
        Some((words.next()?.to_owned(), words.next()?.parse().ok()?))
    });
    Ok(numbers.collect())
}

/// A capability list (`~CAP_A CAP_B`): whether it is inverted, and the names as `setpriv`
/// takes them (`a`, `b`).
fn capabilities(value: &str) -> (bool, BTreeSet<String>) {
    let value = value.trim();
    let (inverted, list) = value.strip_prefix('~').map_or((false, value), |rest| (true, rest));
    (inverted, list.split_whitespace().map(|c| c.trim_start_matches("CAP_").to_lowercase()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `args` under the filter of a unit whose [Service] holds `service`; its exit code.
    fn exit_code_under(service: &str, args: &[&str]) -> Option<i32> {
        let dir = std::env::temp_dir().join(format!("spw-filter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let unit = dir.join("x.service");
        std::fs::write(&unit, format!("[Service]\n{service}")).unwrap();
        let filter = SyscallFilter::read(&[unit]);
        std::fs::remove_dir_all(&dir).unwrap();
        let mut cmd = Command::new(args[0]);
        cmd.args(&args[1..]).stderr(std::process::Stdio::null());
        filter.unwrap().apply(&mut cmd, File::open("/proc/self/ns/net").unwrap());
        cmd.status().unwrap().code()
    }

    #[test]
    fn the_filter_refuses_what_the_unit_does_not_allow() {
        let service = "SystemCallFilter=@system-service\nSystemCallFilter=~@resources\nSystemCallErrorNumber=EPERM\n";
        assert_eq!(exit_code_under(service, &["true"]), Some(0));
        // sched_setaffinity(2) is in @resources.
        assert_eq!(exit_code_under("SystemCallFilter=@system-service\n", &["taskset", "-c", "0", "true"]), Some(0));
        assert_ne!(exit_code_under(service, &["taskset", "-c", "0", "true"]), Some(0));
        assert_ne!(exit_code_under("SystemCallFilter=~@resources\n", &["taskset", "-c", "0", "true"]), Some(0));
        // Namespaces: a new network namespace only where allowed.
        let unshare = ["unshare", "--net", "true"];
        assert_eq!(exit_code_under(&format!("{service}RestrictNamespaces=net\n"), &unshare), Some(0));
        assert_ne!(exit_code_under(&format!("{service}RestrictNamespaces=yes\n"), &unshare), Some(0));
        assert_ne!(exit_code_under(&format!("{service}RestrictNamespaces=~net\n"), &unshare), Some(0));
        assert_eq!(exit_code_under(&format!("{service}RestrictNamespaces=~user\n"), &unshare), Some(0));
    }

    #[test]
    fn lists_merge_in_order_and_a_drop_in_can_add_and_remove() {
        let dir = std::env::temp_dir().join(format!("spw-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (unit, drop_in) = (dir.join("x.service"), dir.join("x.conf"));
        std::fs::write(&unit, "[Service]\nCapabilityBoundingSet=CAP_BPF CAP_NET_ADMIN\nNoNewPrivileges=yes\n").unwrap();
        std::fs::write(
            &drop_in,
            "[Service]\nCapabilityBoundingSet=CAP_SYS_ADMIN\nCapabilityBoundingSet=~CAP_BPF\nAmbientCapabilities=CAP_NET_ADMIN\n",
        )
        .unwrap();
        let wrapper = setpriv_wrapper(&[unit.clone(), drop_in]).unwrap();
        let unit_only = setpriv_wrapper(&[unit]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            wrapper,
            [
                "setpriv",
                "--bounding-set=-all,+net_admin,+sys_admin",
                "--inh-caps=-all,+net_admin",
                "--ambient-caps=-all,+net_admin",
                "--no-new-privs",
                "--"
            ]
        );
        assert_eq!(unit_only.unwrap()[1], "--bounding-set=-all,+bpf,+net_admin");
    }
}
