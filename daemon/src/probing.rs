//! The health task of `lbd`: probes sent at the times the policy's schedule gives, and how
//! many at once; and the VIP path kept whole.
//!
//! Every target the core hands out (see `super::health_checks`) is probed with its spec (see
//! [`spillway_probe`]) at the times [`next_probe_at`] gives (own phase plus jitter per
//! backend), each probe bounded by the VIP's `timeout_ms`, at most [`MAX_IN_FLIGHT`] at once.
//! A probe through the tunnel is two at the same time (to the VIP through the probe path, and
//! to the backend's own address), within the same timeout; when only the first fails, the
//! probe path is checked for the balancer's own trouble before the backend is blamed.
//!
//! The policy (what outcomes mean for weights) is `crate::health`; the core
//! ([`super::core::Core::health_round`]) feeds it and programs the effective weights. The task
//! takes the core's lock only inside `spawn_blocking`, like neighbour upkeep, and never while
//! a probe is in flight.

use spillway_logging::error_chain;
use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{sync::Semaphore, task::JoinSet};

use super::{
    core::{Counters, ProbeResult, ProbeTarget},
    health_checks::{LocalCause, ProbeRoute},
    server::{self, SharedCore},
};
use crate::store::Store;
use spillway_dataplane::vip_path::VipPath;
use spillway_logging::event;
use spillway_model::{ProbeOutcome, ProbeSpec};
use spillway_policy::health::{ProbeKey, next_probe_at};
use spillway_probe as probe;
use spillway_reconcile::Maps;

/// The probe path as `lbd` set it up, or why it could not.
pub type ProbePathState = Result<VipPath, String>;

/// Most probes in flight at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// How often the task looks for due probes and hands results to the core.
const ROUND: Duration = Duration::from_millis(100);

/// Probes on schedule and hands the outcomes to the core every [`ROUND`], forever.
pub async fn health_task<M, S>(core: SharedCore<M, S>, seed: u64, vip_path: Arc<ProbePathState>)
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
                    Err(e) => event!(warn, "probe_task_failed", error = e),
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
                event!(warn, "health_program_failed", error = error_chain(&e));
                continue;
            }
            Err(e) => {
                event!(warn, "health_round_failed", error = e);
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
            let vip_path = vip_path.clone();
            in_flight.spawn(async move {
                let (outcome, local_cause) = match target.route {
                    ProbeRoute::Direct(addr) => (probe::run(&target.spec, addr, None, timeout).await, None),
                    ProbeRoute::Tunnel { vip, backend_id, generation, direct } => {
                        probe_through_tunnel(vip_path, &target.spec, vip, (backend_id, generation), direct, timeout).await
                    }
                };
                drop(permit);
                ProbeResult { key, outcome, local_cause }
            });
        }
    }
}

/// A probe of `vip` through the tunnel to the backend in `slot` (id, generation), with a direct
/// probe of `direct` beside it (see [`probe::diagnose`]). `Unknown` with the cause when the
/// balancer's probe path is at fault.
pub async fn probe_through_tunnel(
    vip_path: Arc<ProbePathState>,
    spec: &ProbeSpec,
    vip: SocketAddr,
    (backend_id, generation): (u32, u32),
    direct: SocketAddr,
    timeout: Duration,
) -> (ProbeOutcome, Option<LocalCause>) {
    let path = match vip_path.as_ref() {
        Ok(path) => path,
        Err(why) => return (ProbeOutcome::Unknown, Some(LocalCause::VipPath(format!("the probe path is not set up: {why}")))),
    };
    if let Some(why) = path.unroutable(vip.ip()) {
        return (ProbeOutcome::Unknown, Some(LocalCause::VipPath(why)));
    }
    let mark = path.mark(backend_id, generation);
    // Without the probe path, a marked socket takes whatever route is left (the main
    // table, back into the balancer to any backend), and its answer says nothing about this
    // backend: the path must be whole before the probe and still after it.
    let unknown = |why| (ProbeOutcome::Unknown, Some(LocalCause::VipPath(why)));
    if let Some(why) = path_check(&vip_path, move |path| path.broken_for(vip.ip())).await {
        return unknown(why);
    }
    let (tunnel, direct) = tokio::join!(probe::run(spec, vip, Some(mark), timeout), probe::run(spec, direct, None, timeout));
    let diagnosis = probe::diagnose(tunnel, &direct);
    if !matches!(diagnosis, ProbeOutcome::VipPathFailed { .. }) {
        return match path_check(&vip_path, move |path| path.broken_for(vip.ip())).await {
            Some(why) => unknown(why),
            None => (diagnosis, None),
        };
    }
    // Only the tunnel failed: rule out this balancer before blaming the backend.
    match path_check(&vip_path, move |path| path.local_problem(vip.ip(), backend_id)).await {
        None => (diagnosis, None),
        Some(why) => unknown(why),
    }
}

/// Runs `check` of the probe path off the async workers (it asks the kernel).
async fn path_check(vip_path: &Arc<ProbePathState>, check: impl FnOnce(&VipPath) -> Option<String> + Send + 'static) -> Option<String> {
    let vip_path = vip_path.clone();
    let checked = tokio::task::spawn_blocking(move || match vip_path.as_ref() {
        Ok(path) => check(path),
        Err(why) => Some(why.clone()),
    });
    checked.await.unwrap_or_else(|e| Some(format!("checking the probe path: {e}")))
}

/// How often a running `lbd` checks its probe path (and restores what is gone of it).
pub const PATH_UPKEEP: Duration = Duration::from_secs(1);

/// Checks the probe path every [`PATH_UPKEEP`] and restores what another process (an
/// operator's `ip link del`, a cleanup) removed; until then, probes through it are unknown.
/// A path that is not there (not installed at start, or not restored) is an ALERT in the
/// core's alerts (`lbctl status`) for as long as it lasts.
pub async fn path_upkeep<M, S>(core: SharedCore<M, S>, vip_path: Arc<ProbePathState>)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let alert = |why: &str| format!("ALERT: no probe path ({why}): probes through the tunnel count as unknown");
    if let Err(why) = vip_path.as_ref() {
        server::lock(&core).set_probe_path_alert(Some(alert(why)));
        return;
    }
    let mut tick = tokio::time::interval(PATH_UPKEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A failure that lasts is logged when it starts or changes, not every second.
    let mut last_failure = None;
    loop {
        tick.tick().await;
        let path = vip_path.clone();
        let repaired = tokio::task::spawn_blocking(move || path.as_ref().as_ref().ok().map(VipPath::repair)).await;
        let failure = match repaired {
            Ok(None) => return,
            Ok(Some(Ok(_))) => None,
            Ok(Some(Err(e))) => Some(error_chain(&e)),
            Err(e) => Some(e.to_string()),
        };
        server::lock(&core).set_probe_path_alert(failure.as_deref().map(alert));
        if failure.is_some() && failure != last_failure {
            event!(
                error,
                "probe_path_restore_failed",
                error = failure.as_deref().unwrap_or_default(),
                message = "ALERT: probes through the tunnel count as unknown"
            );
        }
        last_failure = failure;
    }
}

/// A seed for the probe schedule that differs between balancers (and restarts).
pub fn schedule_seed() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    nanos ^ u64::from(std::process::id()).rotate_left(32)
}
