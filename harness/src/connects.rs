//! Connection attempts that fail in chosen ways (refused, timed out, abandoned), as an
//! application calling a dependency that is down makes them. Call inside the caller's
//! namespace.

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, connect, getsockopt, socket, sockopt};

/// A TCP socket with a non-blocking `connect()` to `dst` under way (EINPROGRESS), giving
/// up after `syn_retries` retransmitted SYNs (TCP_SYNCNT, at least 1: ETIMEDOUT ~3 s on).
pub fn start_connect(dst: SocketAddr, syn_retries: i32) -> Result<OwnedFd> {
    let family = if dst.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let socket = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK, None).context("socket")?;
    // SAFETY: an int option on a socket we own, its size passed.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_SYNCNT,
            (&raw const syn_retries).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    ensure!(set == 0, "TCP_SYNCNT {syn_retries}: {}", std::io::Error::last_os_error());
    match connect(socket.as_raw_fd(), &SockaddrStorage::from(dst)) {
        Err(Errno::EINPROGRESS) => Ok(socket),
        other => anyhow::bail!("a non-blocking connect to {dst} ended at once: {other:?}"),
    }
}

/// How each connect in `sockets` ended (its SO_ERROR; 0 for connected or still pending),
/// waiting up to `timeout` for all to end.
pub fn outcomes(sockets: &[OwnedFd], timeout: Duration) -> Vec<Errno> {
    let deadline = Instant::now() + timeout;
    let mut polls: Vec<libc::pollfd> =
        sockets.iter().map(|s| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLOUT, revents: 0 }).collect();
    while Instant::now() < deadline {
        for p in &mut polls {
            p.revents = 0;
        }
        // SAFETY: valid pollfds for the duration of the call.
        unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 100) };
        if polls.iter().all(|p| p.revents != 0) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sockets.iter().map(|s| Errno::from_raw(getsockopt(s, sockopt::SocketError).unwrap_or(libc::EBADF))).collect()
}

/// What [`call_dead_dependency`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeadCalls {
    /// Connects refused (the dependency's port is closed).
    pub refused: u64,
    /// Non-blocking connects to a silent address, closed after `MAX_PENDING` newer ones or
    /// when the caller stops: timed out by then, or abandoned while still in SYN_SENT.
    pub silent: u64,
    /// Connects that ended any other way (they should not happen).
    pub other: u64,
}

/// Connects a caller keeps open to the silent address at once.
const MAX_PENDING: usize = 200;

/// Until `until`, calls a dependency that is down the two ways one is: `refused` answers
/// every SYN with a reset, `silent` answers nothing (each attempt is left to time out or
/// abandoned). About 100 attempts a second of each.
pub fn call_dead_dependency(refused: SocketAddr, silent: SocketAddr, until: Instant) -> DeadCalls {
    let mut calls = DeadCalls::default();
    let mut pending = std::collections::VecDeque::new();
    while Instant::now() < until {
        match TcpStream::connect_timeout(&refused, Duration::from_secs(1)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => calls.refused += 1,
            _ => calls.other += 1,
        }
        match start_connect(silent, 1) {
            Ok(socket) => pending.push_back(socket),
            Err(_) => calls.other += 1,
        }
        if pending.len() > MAX_PENDING {
            pending.pop_front();
            calls.silent += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    calls.silent += pending.len() as u64;
    calls
}
