//! A kernel that refuses tracing programs, played for one process tree. Some machines of
//! Spillway's kind refuse every `BPF_PROG_TYPE_TRACING` program (tp_btf, fentry, iterators)
//! with EPERM before verification while running every other type; tests need that kernel
//! on any machine. [`refuse_tracing_programs`] gives a command a seccomp filter that stops
//! each `bpf(BPF_PROG_LOAD)` of it and its children in the kernel and hands it to a
//! supervisor thread here (seccomp user notification). The supervisor reads the program
//! type from the caller's memory and answers EPERM for tracing programs; every other load
//! continues untouched, as if nothing were watching. Nothing outside that process tree is
//! affected.

use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::cmsg_space;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};

// include/uapi/linux/bpf.h
const BPF_PROG_LOAD: u32 = 5;
const BPF_PROG_TYPE_TRACING: u32 = 26;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64

/// The supervisor of one process tree's program loads; stops when dropped.
pub struct TracingRefused {
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl TracingRefused {
    /// Tracing programs refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for TracingRefused {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sets `cmd` up so that it, and everything it starts, runs as if on a kernel that refuses
/// tracing programs. Call [`Armed::supervise`] right after spawning it.
pub fn refuse_tracing_programs(cmd: &mut Command) -> Result<Armed> {
    let (ours, theirs) = UnixStream::pair().context("socketpair")?;
    let filter = filter();
    let child_end = theirs.as_raw_fd();
    // SAFETY: the hook runs in the child between fork and exec and makes only syscalls
    // (prctl, seccomp, sendmsg, close) on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let listener = install(&filter)?;
            send_fd(child_end, listener)?;
            libc::close(listener);
            libc::close(child_end);
            Ok(())
        });
    }
    Ok(Armed { ours, _theirs: theirs })
}

/// A command set up by [`refuse_tracing_programs`], not yet supervised.
pub struct Armed {
    ours: UnixStream,
    /// Kept open until the child has it (it is duplicated into the child at fork).
    _theirs: UnixStream,
}

impl Armed {
    /// Takes the spawned child's seccomp listener and answers its program loads from a
    /// thread until dropped.
    pub fn supervise(self) -> Result<TracingRefused> {
        self.ours.set_read_timeout(Some(Duration::from_secs(10)))?;
        let listener = receive_fd(&self.ours).context("receiving the seccomp listener from the child")?;
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicU64::new(0));
        let (stop_flag, count) = (Arc::clone(&stop), Arc::clone(&refused));
        let thread = std::thread::spawn(move || answer(&listener, &stop_flag, &count));
        Ok(TracingRefused { stop, refused, thread: Some(thread) })
    }
}

/// Classic BPF over `struct seccomp_data`: notify on bpf(BPF_PROG_LOAD, ...), allow the rest.
fn filter() -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jeq = |k: u32, jt: u8, jf: u8| libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt, jf, k };
    let load = |offset: u32| stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset);
    vec![
        load(4), // arch
        jeq(AUDIT_ARCH, 0, 4),
        load(0), // nr
        jeq(libc::SYS_bpf as u32, 0, 2),
        load(16), // args[0], low word (little-endian)
        jeq(BPF_PROG_LOAD, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_USER_NOTIF),
    ]
}

/// In the child: installs the filter and returns its listener descriptor.
fn install(filter: &[libc::sock_filter]) -> std::io::Result<RawFd> {
    let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
    // SAFETY: plain syscalls on a filter that outlives them.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd =
            libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, libc::SECCOMP_FILTER_FLAG_NEW_LISTENER, &raw const program);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd as RawFd)
    }
}

/// In the child: sends `fd` over the Unix socket `socket` (SCM_RIGHTS), without allocating.
fn send_fd(socket: RawFd, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    #[repr(C)]
    struct Control {
        header: libc::cmsghdr,
        fd: RawFd,
    }
    // SAFETY: a zeroed msghdr/cmsghdr is valid; every pointer refers to a local that
    // outlives the call.
    unsafe {
        let mut control: Control = std::mem::zeroed();
        control.header.cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        control.header.cmsg_level = libc::SOL_SOCKET;
        control.header.cmsg_type = libc::SCM_RIGHTS;
        control.fd = fd;
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = (&raw mut control).cast();
        msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as _;
        if libc::sendmsg(socket, &raw const msg, 0) != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn receive_fd(socket: &UnixStream) -> Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = cmsg_space!(RawFd);
    let msg = recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = cmsg
            && let Some(&fd) = fds.first()
        {
            // SAFETY: a descriptor the kernel just gave this process.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    bail!("the child sent no descriptor (did it fail to install the filter?)")
}

/// Answers notifications until `stop`, or until no process uses the filter any more.
fn answer(listener: &OwnedFd, stop: &AtomicBool, refused: &AtomicU64) {
    let fd = listener.as_raw_fd();
    while !stop.load(Ordering::Relaxed) {
        let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&raw mut poll, 1, 100) };
        if ready <= 0 {
            continue;
        }
        if poll.revents & libc::POLLHUP != 0 {
            return;
        }
        // SAFETY: the kernel fills the zeroed struct of its documented size.
        let mut notif: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &raw mut notif) } != 0 {
            continue; // interrupted, or the caller died meanwhile
        }
        let tracing = program_type(notif.pid, notif.data.args[1]) == Some(BPF_PROG_TYPE_TRACING);
        let mut response = libc::seccomp_notif_resp {
            id: notif.id,
            val: 0,
            error: if tracing { -libc::EPERM } else { 0 },
            flags: if tracing { 0 } else { libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32 },
        };
        // SAFETY: a response to the notification just received; fails harmlessly if its
        // caller died.
        if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &raw mut response) } == 0 && tracing {
            refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `attr->prog_type` of a bpf(BPF_PROG_LOAD) call of `pid`: the first word at `attr`.
fn program_type(pid: u32, attr: u64) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut word = [0u8; 4];
    mem.read_exact_at(&mut word, attr).ok()?;
    Some(u32::from_ne_bytes(word))
}
