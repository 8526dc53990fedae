//! The TCP-connect prober and the health task of `lbd`.
//!
//! Every backend of every probed VIP is connected to on the VIP's port, at the times
//! [`next_probe_at`] gives (own phase plus jitter per backend), each attempt bounded by the
//! VIP's `timeout_ms`, at most [`MAX_IN_FLIGHT`] at once. A probe socket is closed with
//! `SO_LINGER 0` (an RST), so probes never pile up in TIME_WAIT on the balancer.
//!
//! Not probed (their configured weights are programmed as they are): UDP VIPs (a TCP
//! connect says nothing about a UDP service) and any-port VIPs (port 0: there is no port to
//! probe). See [`probe_port`].
//!
//! The policy (what outcomes mean for weights) is `crate::health`; the core
//! ([`super::core::Core::health_round`]) feeds it and programs the effective weights. The task
//! takes the core's lock only inside `spawn_blocking`, like neighbour upkeep, and never while
//! a probe is in flight.

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    os::fd::AsFd,
    sync::Arc,
    time::{Duration, Instant},
};

use log::warn;
use nix::sys::socket::{setsockopt, sockopt};
use tokio::{net::TcpSocket, sync::Semaphore, task::JoinSet};

use super::{
    core::{Counters, ProbeResult, ProbeTarget, error_chain},
    server::{self, SharedCore},
};
use crate::{
    health::{ProbeKey, ProbeOutcome, next_probe_at},
    model::{Proto, Vip},
    reconcile::Maps,
    store::Store,
};

/// Most probes in flight at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// How often the task looks for due probes and hands results to the core.
const ROUND: Duration = Duration::from_millis(100);

/// The port a VIP's backends are probed on, or `None` when the VIP is not probed (UDP, and
/// any-port VIPs).
pub fn probe_port(vip: &Vip) -> Option<u16> {
    (vip.proto == Proto::Tcp && vip.port != 0).then_some(vip.port)
}

/// One TCP connect to `target`, bounded by `timeout`, closed with an RST.
pub async fn probe(target: SocketAddr, timeout: Duration) -> ProbeOutcome {
    let started = Instant::now();
    let socket = match if target.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() } {
        Ok(socket) => socket,
        Err(e) => return classify(&e),
    };
    if let Err(e) = setsockopt(&socket.as_fd(), sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 }) {
        return classify(&io::Error::from(e));
    }
    match tokio::time::timeout(timeout, socket.connect(target)).await {
        Ok(Ok(stream)) => {
            let latency_ms = started.elapsed().as_millis() as u64;
            drop(stream);
            ProbeOutcome::Success { latency_ms }
        }
        Ok(Err(e)) => classify(&e),
        Err(_) => ProbeOutcome::Timeout,
    }
}

/// The balancer's own trouble (no port, no buffers, no descriptors, no memory) is `Unknown`:
/// it says nothing about the backend. Anything else the connect reports is the backend's.
pub fn classify(error: &io::Error) -> ProbeOutcome {
    match error.raw_os_error() {
        Some(libc::EADDRNOTAVAIL | libc::ENOBUFS | libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EADDRINUSE) => ProbeOutcome::Unknown,
        Some(libc::ETIMEDOUT) => ProbeOutcome::Timeout,
        _ => ProbeOutcome::Failure { reason: error_kind_label(error) },
    }
}

fn error_kind_label(error: &io::Error) -> String {
    match error.raw_os_error() {
        Some(libc::ECONNREFUSED) => "refused".to_owned(),
        Some(libc::EHOSTUNREACH) => "host_unreachable".to_owned(),
        Some(libc::ENETUNREACH) => "net_unreachable".to_owned(),
        Some(libc::ECONNRESET) => "reset".to_owned(),
        _ => error.to_string().replace(' ', "_"),
    }
}

/// Probes on schedule and hands the outcomes to the core every [`ROUND`], forever.
pub async fn health_task<M, S>(core: SharedCore<M, S>, seed: u64)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let limit = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut in_flight: JoinSet<ProbeResult> = JoinSet::new();
    // Next due time of each probed (VIP, backend); a key no longer wanted is dropped.
    let mut due: BTreeMap<ProbeKey, u64> = BTreeMap::new();
    let mut results = Vec::new();
    let mut tick = tokio::time::interval(ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                match done {
                    Ok(result) => results.push(result),
                    Err(e) => warn!("a health probe failed: {e}"),
                }
                continue;
            }
        }
        // Hand the outcomes over, and learn the current targets, under the lock.
        let core2 = core.clone();
        let batch = std::mem::take(&mut results);
        let round = move || server::lock(&core2).health_round(batch);
        let (targets, now_ms) = match tokio::task::spawn_blocking(round).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                warn!("health: programming effective weights: {}", error_chain(&e));
                continue;
            }
            Err(e) => {
                warn!("health round: {e}");
                continue;
            }
        };
        let wanted: BTreeMap<ProbeKey, ProbeTarget> = targets.into_iter().map(|t| (t.key, t)).collect();
        due.retain(|key, _| wanted.contains_key(key));
        for (key, target) in wanted {
            let at = *due.entry(key).or_insert_with(|| next_probe_at(&target.config, seed, &key, now_ms));
            if at > now_ms {
                continue;
            }
            // Bounded concurrency: a probe not started now is started on a later round.
            let Ok(permit) = limit.clone().try_acquire_owned() else { break };
            due.insert(key, next_probe_at(&target.config, seed, &key, now_ms));
            let timeout = Duration::from_millis(target.config.timeout_ms);
            in_flight.spawn(async move {
                let outcome = probe(target.addr, timeout).await;
                drop(permit);
                ProbeResult { key, outcome }
            });
        }
    }
}

/// A seed for the probe schedule that differs between balancers (and restarts).
pub fn schedule_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_errors_are_unknown_and_backend_errors_are_failures() {
        for errno in [libc::EADDRNOTAVAIL, libc::ENOBUFS, libc::EMFILE, libc::ENFILE] {
            assert_eq!(classify(&io::Error::from_raw_os_error(errno)), ProbeOutcome::Unknown, "errno {errno}");
        }
        for errno in [libc::ECONNREFUSED, libc::EHOSTUNREACH, libc::ENETUNREACH] {
            assert!(matches!(classify(&io::Error::from_raw_os_error(errno)), ProbeOutcome::Failure { .. }), "errno {errno}");
        }
        assert_eq!(classify(&io::Error::from_raw_os_error(libc::ETIMEDOUT)), ProbeOutcome::Timeout);
    }

    #[test]
    fn only_tcp_vips_with_a_port_are_probed() {
        assert_eq!(probe_port(&"10.0.0.1:80/tcp".parse().unwrap()), Some(80));
        assert_eq!(probe_port(&"10.0.0.1:53/udp".parse().unwrap()), None);
        assert_eq!(probe_port(&"10.0.0.1:0/tcp".parse().unwrap()), None);
    }

    #[tokio::test]
    async fn probes_succeed_refuse_and_leave_no_time_wait() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            for _ in 0..3 {
                let _ = listener.accept().await;
            }
        });
        for _ in 0..3 {
            assert!(matches!(probe(addr, Duration::from_secs(1)).await, ProbeOutcome::Success { .. }));
        }
        accept.await.unwrap();
        // The listener is gone: refused.
        assert_eq!(probe(addr, Duration::from_secs(1)).await, ProbeOutcome::Failure { reason: "refused".to_owned() });
    }
}
