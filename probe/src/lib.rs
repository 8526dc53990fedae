//! Health probes: a TCP connect, an HTTP(S) GET expecting a status, a UDP request expecting a
//! reply. Each is bounded as a whole by its timeout and closes its socket so that it leaves
//! nothing behind on the balancer: TCP sockets are closed with an RST (`SO_LINGER 0`, no
//! TIME_WAIT), UDP sockets have no TIME_WAIT, and every socket is dropped when the probe ends.
//! The number in flight is bounded by the caller (`spillway_daemon::probing`).
//!
//! What a probe is ([`ProbeSpec`]) and what it found out ([`ProbeOutcome`]) are declared in
//! the model; this module performs probes.
//!
//! A probe through the tunnel ([`ProbePath::Tunnel`](spillway_model::ProbePath::Tunnel)) is
//! addressed to the VIP and carries a socket mark that routes it into the probe path
//! (`spillway_dataplane::vip_path`); it runs together with a direct probe of the backend's own address,
//! and [`diagnose`] tells from the pair whether the backend is down or only its VIP path is
//! broken.

mod classify;
mod http;
mod tcp;
mod tls;
mod udp;

use std::{
    io,
    net::SocketAddr,
    time::{Duration, Instant},
};

use spillway_model::{ProbeOutcome, ProbeSpec};

/// One probe of `target` from sockets marked `mark` (if any), all of it within `timeout`;
/// `Success` carries the time from the start to the backend's answer. `spec` is taken as
/// valid ([`ProbeSpec::validate`]).
pub async fn run(spec: &ProbeSpec, target: SocketAddr, mark: Option<u32>, timeout: Duration) -> ProbeOutcome {
    let started = Instant::now();
    let probe = async {
        match spec {
            ProbeSpec::Tcp {} => tcp::probe(target, mark).await,
            ProbeSpec::Http { path, expect_status, host, tls } => {
                http::probe(target, mark, path, *expect_status, host.as_deref(), *tls).await
            }
            ProbeSpec::Udp { payload, expect } => udp::probe(target, mark, &payload.0, expect.as_ref().map(|e| e.0.as_slice())).await,
        }
    };
    match tokio::time::timeout(timeout, probe).await {
        Ok(Ok(answered)) => ProbeOutcome::Success { latency_us: answered.duration_since(started).as_micros() as u64 },
        Ok(Err(Fail::Io(e))) => classify::classify(&e),
        Ok(Err(Fail::Backend(reason))) => ProbeOutcome::Failure { reason },
        Err(_) => ProbeOutcome::Timeout,
    }
}

/// A probe through the tunnel (`tunnel`, to the VIP) read together with a direct probe of the
/// same backend's own address (`direct`, made at the same time): when only the tunnel failed,
/// the backend is up but the VIP path is broken ([`ProbeOutcome::VipPathFailed`]); otherwise
/// the tunnel's outcome stands (a backend down fails both ways, and is reported as such).
pub fn diagnose(tunnel: ProbeOutcome, direct: &ProbeOutcome) -> ProbeOutcome {
    let failed = match &tunnel {
        ProbeOutcome::Failure { reason } => reason.clone(),
        ProbeOutcome::Timeout => "timeout".to_owned(),
        ProbeOutcome::Success { .. } | ProbeOutcome::Unknown | ProbeOutcome::VipPathFailed { .. } => return tunnel,
    };
    match direct {
        ProbeOutcome::Success { .. } => ProbeOutcome::VipPathFailed { tunnel: failed },
        _ => tunnel,
    }
}

/// Why a probe did not pass: an error of the socket (classified: it may be the balancer's own)
/// or a wrong answer from the backend.
#[derive(Debug)]
enum Fail {
    Io(io::Error),
    Backend(String),
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        Fail::Io(e)
    }
}

impl Fail {
    fn backend(reason: &str) -> Self {
        Fail::Backend(reason.to_owned())
    }
}

/// A socket the kernel connected to itself reached no backend: on a local target where nothing
/// listens, its ephemeral port can happen to be the target's port (TCP simultaneous open, or a
/// UDP socket receiving its own datagram). Nothing listening is a refusal.
fn refuse_self_connection(local: SocketAddr, target: SocketAddr) -> io::Result<()> {
    if local == target { Err(io::Error::from_raw_os_error(libc::ECONNREFUSED)) } else { Ok(()) }
}

/// When the backend answered (the socket is closed after that, outside the latency).
type Answered = Result<Instant, Fail>;

#[cfg(test)]
mod tests;
