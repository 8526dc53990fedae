//! `lbd`'s side of announcing: every second, whether the data path can forward (the pinned
//! link still drives the interface, the interface is up, it forwards each family), the VIP
//! addresses from the core, one [`Announcer`] round, and its outcome back to the core.

use spillway_logging::error_chain;
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use spillway_policy::announce::Fault;

use super::{
    core::Counters,
    server::{self, SharedCore},
};
use crate::store::Store;
use spillway_announce::{AnnounceConfig, Announcer};
use spillway_dataplane::forwarding;
use spillway_dataplane::netif;
use spillway_dataplane::pins;
use spillway_logging::event;
use spillway_reconcile::Maps;

/// How often the data path is checked and BIRD asked: a dead data path is degraded within
/// this, and other balancers' changes are seen within this.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// What the data path's health is read from.
#[derive(Clone, Debug)]
pub struct DataPath {
    pub iface: String,
    /// The balancer's pinned link; `None` when it is attached nowhere (`--xdp-attach none`:
    /// the operator's root program carries it, which `lbd` cannot see).
    pub link: Option<PathBuf>,
}

impl DataPath {
    /// Why VIP packets of each family cannot be forwarded now, if they cannot.
    fn faults(&self) -> (Option<Fault>, Option<Fault>) {
        if self.link.as_deref().is_some_and(|link| !link_attached(link, &self.iface)) {
            return (Some(Fault::ProgramDetached), Some(Fault::ProgramDetached));
        }
        if !netif::is_running(&self.iface).unwrap_or(false) {
            return (Some(Fault::InterfaceDown), Some(Fault::InterfaceDown));
        }
        match forwarding::disabled(&self.iface) {
            Ok(off) => {
                let family = |f: &str| off.iter().any(|s| s.name.contains(f)).then_some(Fault::ForwardingDisabled);
                (family(".ipv4."), family(".ipv6."))
            }
            // Unreadable sysctls say nothing about forwarding: no fault.
            Err(_) => (None, None),
        }
    }
}

/// The pinned link exists and drives `iface`.
fn link_attached(link: &Path, iface: &str) -> bool {
    match (pins::pinned_link_ifindex(link), netif::ifindex(iface)) {
        (Some(pinned), Ok(wanted)) => pinned == wanted,
        _ => false,
    }
}

pub async fn announce_task<M, S>(core: SharedCore<M, S>, config: AnnounceConfig, data_path: DataPath)
where
    M: Maps + Counters + Send + 'static,
    S: Store + Send + 'static,
{
    let started = Instant::now();
    let now_ms = move || started.elapsed().as_millis() as u64;
    let mut announcer = match Announcer::start(config, now_ms()) {
        Ok(announcer) => announcer,
        Err(e) => {
            let why = error_chain(&e);
            event!(error, "announcer_not_started", error = why, effect = "nothing is announced or withdrawn");
            server::lock(&core).set_announcer_down(format!("it did not start: {why}"));
            return;
        }
    };
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (round_core, data_path) = (core.clone(), data_path.clone());
        // BIRD and the sysctls are blocking I/O; the announcer travels with the round.
        let round = tokio::task::spawn_blocking(move || {
            let (v4, v6) = data_path.faults();
            let wanted = server::lock(&round_core).announce_wanted();
            let view = announcer.step(&wanted, &|addr| if addr.is_ipv4() { v4 } else { v6 }, now_ms());
            server::lock(&round_core).set_announcements(view);
            announcer
        });
        match round.await {
            Ok(back) => announcer = back,
            Err(e) => {
                event!(error, "announcer_failed", error = e, effect = "nothing is announced or withdrawn until lbd restarts");
                server::lock(&core).set_announcer_down(format!("it failed: {e}"));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_pinned_link_is_a_detached_program_for_both_families() {
        let data_path = DataPath { iface: "lo".into(), link: Some(PathBuf::from("/nonexistent/spillway/link")) };
        assert_eq!(data_path.faults(), (Some(Fault::ProgramDetached), Some(Fault::ProgramDetached)));
    }
}
