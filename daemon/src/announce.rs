//! `lbd`'s side of announcing: every second, whether the data path can forward (on some
//! interface of the balancer: its pinned link drives it, it is up, it forwards the family), the VIP
//! addresses from the core, one [`Announcer`] round, and its outcome back to the core.

use spillway_logging::error_chain;
use std::time::{Duration, Instant};

use spillway_policy::announce::Fault;

use super::{
    core::Counters,
    server::{self, SharedCore},
};
use crate::store::Store;
use spillway_announce::{AnnounceConfig, Announcer};
use spillway_dataplane::forwarding;
use spillway_dataplane::netif;
use spillway_dataplane::pins::{self, PinLayout};
use spillway_logging::event;
use spillway_reconcile::Maps;

/// How often the data path is checked and BIRD asked: a dead data path is degraded within
/// this, and other balancers' changes are seen within this.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Why VIP packets cannot be forwarded, per family (IPv4, IPv6); `None`: they can.
type Faults = (Option<Fault>, Option<Fault>);

/// What the data path's health is read from: the balancer's pinned links.
#[derive(Clone, Debug)]
pub struct DataPath {
    pub layout: PinLayout,
    /// Attached nowhere (`--xdp-attach none`): the operator's root program carries the
    /// balancer, which `lbd` cannot see, so no link is looked for.
    pub unattached: bool,
}

impl DataPath {
    /// Why VIP packets of each family cannot be forwarded now on any of `uplinks`: none
    /// while one interface carries the family (a router whose uplink is down has lost its
    /// session with us anyway); otherwise the first interface's fault.
    fn faults(&self, uplinks: &[String]) -> Faults {
        let each: Vec<Faults> = uplinks.iter().map(|iface| self.faults_of(iface)).collect();
        let family = |of: fn(&Faults) -> Option<Fault>| {
            if each.iter().any(|f| of(f).is_none()) { None } else { Some(each.first().and_then(of).unwrap_or(Fault::ProgramDetached)) }
        };
        (family(|f| f.0), family(|f| f.1))
    }

    /// Why VIP packets of each family cannot be forwarded on `iface`, if they cannot.
    fn faults_of(&self, iface: &str) -> Faults {
        if !self.unattached && !link_attached(&self.layout.balancer_link(iface), iface) {
            return (Some(Fault::ProgramDetached), Some(Fault::ProgramDetached));
        }
        if !netif::is_running(iface).unwrap_or(false) {
            return (Some(Fault::InterfaceDown), Some(Fault::InterfaceDown));
        }
        match forwarding::disabled(iface) {
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
fn link_attached(link: &std::path::Path, iface: &str) -> bool {
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
            let uplinks = server::lock(&round_core).wanted_uplinks();
            let (v4, v6) = data_path.faults(&uplinks);
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
        let data_path = DataPath { layout: PinLayout::new(std::path::Path::new("/nonexistent/spillway")), unattached: false };
        let detached = (Some(Fault::ProgramDetached), Some(Fault::ProgramDetached));
        assert_eq!(data_path.faults(&["lo".to_owned()]), detached);
        assert_eq!(data_path.faults(&["lo".to_owned(), "no-such-if".to_owned()]), detached);
        assert_eq!(data_path.faults(&[]), detached);
    }
}
