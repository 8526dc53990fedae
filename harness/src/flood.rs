//! A new-connection flood at a steady rate: non-blocking connects, each abandoned after a
//! timeout shorter than TCP's first SYN retransmission, so every attempt is exactly one SYN
//! and a refused attempt is exactly one dropped packet.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, connect, getsockopt, socket, sockopt};

/// Longest flood, so a mistaken call still ends by itself.
const MAX_DURATION: Duration = Duration::from_secs(60);
/// Below Linux's 1 s initial RTO: the SYN is never retransmitted.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(500);

/// What a flood did, seen from the client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FloodReport {
    pub attempts: u64,
    pub connected: u64,
    /// Attempts that got no answer within [`ATTEMPT_TIMEOUT`] (their SYN was dropped).
    pub timed_out: u64,
    /// Attempts refused outright (RST, unreachable, local errors).
    pub refused: u64,
}

struct Pending {
    fd: OwnedFd,
    deadline: Instant,
}

/// Opens `rate_per_s` connections a second to `target` for `duration`, closing each as soon
/// as it connects. Call it inside the client's namespace.
pub fn flood(target: SocketAddr, rate_per_s: u32, duration: Duration) -> Result<FloodReport> {
    ensure!(rate_per_s > 0 && duration <= MAX_DURATION, "flood of {rate_per_s}/s for {duration:?} is out of bounds");
    let spacing = Duration::from_secs(1) / rate_per_s;
    let family = if target.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let addr = SockaddrStorage::from(target);
    let start = Instant::now();
    let mut report = FloodReport::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut next = start;
    while start.elapsed() < duration || !pending.is_empty() {
        let now = Instant::now();
        while now >= next && start.elapsed() < duration {
            let fd = socket(family, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None).context("socket")?;
            report.attempts += 1;
            match connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr) {
                Ok(()) => report.connected += 1,
                Err(Errno::EINPROGRESS) => pending.push(Pending { fd, deadline: now + ATTEMPT_TIMEOUT }),
                Err(_) => report.refused += 1,
            }
            next += spacing;
        }
        settle(&mut pending, &mut report)?;
        std::thread::sleep(Duration::from_micros(200).min(next.saturating_duration_since(Instant::now())));
    }
    Ok(report)
}

/// Counts and drops the attempts that finished or ran out of time.
fn settle(pending: &mut Vec<Pending>, report: &mut FloodReport) -> Result<()> {
    if pending.is_empty() {
        return Ok(());
    }
    let mut fds: Vec<PollFd> = pending.iter().map(|p| PollFd::new(p.fd.as_fd(), PollFlags::POLLOUT)).collect();
    poll(&mut fds, PollTimeout::ZERO).context("poll")?;
    let ready: Vec<bool> = fds.iter().map(|f| f.revents().is_some_and(|r| !r.is_empty())).collect();
    drop(fds);
    let now = Instant::now();
    // In reverse, so swap_remove only moves entries already looked at.
    for (i, is_ready) in ready.into_iter().enumerate().rev() {
        if is_ready {
            match getsockopt(&pending[i].fd, sockopt::SocketError) {
                Ok(0) => report.connected += 1,
                _ => report.refused += 1,
            }
            pending.swap_remove(i);
        } else if now >= pending[i].deadline {
            report.timed_out += 1;
            pending.swap_remove(i);
        }
    }
    Ok(())
}
