//! Port pressure: the balancer's own (from its socket watcher) and each backend host's
//! (polled from its `lbd agent`), kept for `lbctl ports` and turned into a [`Pressure`]
//! the health policy applies within its ejection and panic rules. An agent's report counts
//! only when its signature proves it the agent's (`ports::auth`); one that does not is
//! ignored, kept as an ALERT until the agent's next authentic report.

use spillway_logging::error_chain;
use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{sync::Semaphore, task::JoinSet};

use super::{
    core::Counters,
    ports_book::{AgentPoll, LB_PORTS_CRITICAL_ALERT},
    server::{self, SharedCore},
};
use crate::store::Store;
use spillway_logging::event;
use spillway_model::ports_report::{Level, Thresholds};
use spillway_ports::{
    SockWatch,
    auth::ReportKey,
    endpoint::{self, Signed},
};
use spillway_reconcile::Maps;

/// How often the balancer's watcher is read and the agents are polled.
pub const POLL: Duration = Duration::from_secs(2);
/// One agent poll may take this long.
const AGENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Agents polled at once.
const MAX_POLLS_IN_FLIGHT: usize = 16;
/// How often a lasting alert about the balancer's own ports is logged again.
const ALERT_REPEAT: Duration = Duration::from_secs(60);

/// Polls the agent at `addr`: its report counts only if signed with `key` for this poll.
async fn poll_agent(addr: SocketAddr, key: Option<&ReportKey>) -> AgentPoll {
    match endpoint::fetch_report(addr, AGENT_TIMEOUT, key).await {
        Ok((report, Signed::Verified)) => AgentPoll::Report(Box::new(report)),
        Ok((_, signed)) => AgentPoll::Unauthenticated(signed.problem().unwrap_or_default().to_owned()),
        Err(e) => AgentPoll::Failed(error_chain(&e)),
    }
}

/// Reads the balancer's own watcher (if it loaded) and polls every backend's agent on
/// `agent_port` (0: not polled) with `key`, every [`POLL`], forever.
pub async fn pressure_task<M, S>(core: SharedCore<M, S>, watch: Result<SockWatch, String>, agent_port: u16, key: Option<Arc<ReportKey>>)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let watch = Arc::new(std::sync::Mutex::new(watch));
    let limit = Arc::new(Semaphore::new(MAX_POLLS_IN_FLIGHT));
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When the balancer's own critical port level was last logged (`None`: not critical).
    let mut lb_critical_logged: Option<Instant> = None;
    loop {
        tick.tick().await;
        let local = {
            let watch = watch.clone();
            tokio::task::spawn_blocking(move || {
                let mut watch = watch.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match &mut *watch {
                    Ok(w) => w.report(Thresholds::default()).map_err(|e| error_chain(&e)),
                    Err(e) => Err(e.clone()),
                }
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
        };
        let critical = local.as_ref().is_ok_and(|r| r.level() == Level::Critical);
        match (critical, lb_critical_logged) {
            (true, Some(at)) if at.elapsed() < ALERT_REPEAT => {}
            (true, _) => {
                event!(warn, "lb_ports_critical", message = LB_PORTS_CRITICAL_ALERT);
                lb_critical_logged = Some(Instant::now());
            }
            (false, Some(_)) => {
                event!(info, "lb_ports_critical_cleared");
                lb_critical_logged = None;
            }
            (false, None) => {}
        }
        let backends = {
            let core = core.clone();
            tokio::task::spawn_blocking(move || server::lock(&core).record_local_ports(local)).await.unwrap_or_default()
        };
        if agent_port == 0 {
            continue;
        }
        let mut polls = JoinSet::new();
        for backend in backends {
            let (limit, key) = (limit.clone(), key.clone());
            polls.spawn(async move {
                let _permit = limit.acquire_owned().await;
                (backend, poll_agent(SocketAddr::new(backend, agent_port), key.as_deref()).await)
            });
        }
        let results: Vec<(IpAddr, AgentPoll)> = polls.join_all().await;
        let core = core.clone();
        let recorded = tokio::task::spawn_blocking(move || {
            let mut core = server::lock(&core);
            for (backend, report) in results {
                if let Err(e) = core.record_agent_ports(backend, report) {
                    event!(warn, "port_pressure_failed", backend = backend, error = error_chain(&e));
                }
            }
        })
        .await;
        if let Err(e) = recorded {
            event!(info, "port_pressure_round_failed", error = e);
        }
    }
}
