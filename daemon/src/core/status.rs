//! `lbctl status`: how this `lbd` runs, what its maps hold, and its alerts.

use std::collections::{BTreeMap, BTreeSet};

use super::{Core, CoreError, Counters};
use crate::store::Store;
use spillway_api::{AnnouncementsStatus, MapUsage, Status, WatcherSummary, announce::Announcements};
use spillway_reconcile::Maps;

impl<M: Maps + Counters, S: Store> Core<M, S> {
    pub(super) fn status(&mut self) -> Result<Status, CoreError> {
        self.count_flows_if_due().map_err(CoreError::Counters)?;
        let flows = self.telemetry.flow_count.entries;
        let memory = self.maps.memory();
        let state = &self.state;
        let ring_pool = self.reconciler.ring_pool();
        let backends: usize = state.vips.values().map(|c| c.backends.len()).sum();
        // Arrays and the trie hold what the state puts there; the hash maps were counted.
        let in_use = |name: &str| -> Option<u64> {
            use spillway_common::limits::map_names as n;
            let used = match name {
                n::RINGS => {
                    let (free, total) = ring_pool;
                    total - free
                }
                n::BACKENDS => backends as u64,
                n::LIMITS => state.vips.values().filter(|c| c.limits.is_some()).count() as u64 + u64::from(state.default_limits.is_some()),
                n::RULES => state.rules.len() as u64,
                n::FLOWS => flows,
                _ => return None,
            };
            Some(used)
        };
        let maps = self
            .maps
            .occupancy()
            .map_err(CoreError::Counters)?
            .into_iter()
            .map(|m| MapUsage {
                name: m.name.to_owned(),
                max_entries: m.max_entries,
                used: m.entries.or_else(|| in_use(m.name)),
                bytes: memory.iter().find(|(name, _)| *name == m.name).and_then(|(_, bytes)| *bytes),
            })
            .collect();
        let info = &self.info;
        let watcher = match &info.watcher {
            Ok(w) => WatcherSummary { state: "loaded".to_owned(), mode: Some(w.mode.to_string()), summary: Some(w.brief()), error: None },
            Err(e) => WatcherSummary { state: "not_loaded".to_owned(), mode: None, summary: None, error: Some(e.clone()) },
        };
        Ok(Status {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            uptime_s: info.started.elapsed().as_secs(),
            interfaces: self.interface_statuses(),
            entry_program: info.entry_program.as_ref().map(|p| p.display().to_string()),
            pass_to: info.pass_to.as_ref().map(|p| p.display().to_string()),
            pin_dir: info.pin_dir.display().to_string(),
            state_dir: info.state_dir.display().to_string(),
            health_checks: self.health.is_some(),
            zone: info.zone.clone(),
            config: info.config.clone(),
            vips: state.vips.len(),
            backends,
            rules: state.rules.len(),
            maps,
            watcher,
            announcements: announcements_status(self.announcements.as_ref(), self.announcer_down.as_deref()),
            alerts: self.alerts(),
        })
    }
}

/// The announcer's last round summed up: `announcements` is `None` when `lbd` does not
/// announce: no BIRD configured, or the announcer stopped (`down` says why).
fn announcements_status(announcements: Option<&Announcements>, down: Option<&str>) -> AnnouncementsStatus {
    let Some(announcements) = announcements else {
        let reason = down.map_or_else(|| "no BIRD configured".to_owned(), |why| format!("the announcer stopped: {why}"));
        return AnnouncementsStatus { state: "off".to_owned(), reason: Some(reason), addresses: BTreeMap::new() };
    };
    let routes = &announcements.routes;
    let mut addresses = BTreeMap::new();
    for route in routes {
        *addresses.entry(route.state.clone()).or_default() += 1;
    }
    // Sorted and deduplicated: one reason per fault however many addresses it hits.
    let mut faults: BTreeSet<String> = routes.iter().filter(|r| r.is_fault()).map(|r| r.reason.clone()).collect();
    match &announcements.bird_error {
        Some(error) => faults.insert(format!("BIRD: {error}")),
        // Peers are unknown only when this balancer's BIRD did not answer: its routes then
        // reach no router, whatever the last configuration it took said.
        None if routes.iter().any(|r| r.peers.is_none()) => faults.insert("BIRD: not answering".to_owned()),
        None => false,
    };
    let announced = routes.iter().any(|r| r.state != "withdrawn");
    let state = match (faults.is_empty(), announced) {
        (true, true) => "announcing",
        (false, true) => "degraded",
        (_, false) => "withdrawn",
    };
    let reason = if faults.is_empty() && !announced {
        // Nothing to carry: no VIP has a backend, or there is no VIP.
        Some(if routes.is_empty() { "no VIPs" } else { "no_backends" }.to_owned())
    } else {
        (!faults.is_empty()).then(|| faults.into_iter().collect::<Vec<_>>().join(", "))
    };
    AnnouncementsStatus { state: state.to_owned(), reason, addresses }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spillway_api::{Reply, Request, announce::AnnouncementView};

    fn route(address: &str, state: &str, reason: &str) -> AnnouncementView {
        AnnouncementView {
            address: address.parse().unwrap(),
            state: state.into(),
            reason: reason.into(),
            for_s: 3,
            peers: Some(1),
            floor: 1,
            held: false,
        }
    }

    type Summary = (String, Option<String>, Vec<(String, usize)>);

    fn summary(routes: Vec<AnnouncementView>, bird_error: Option<&str>) -> Summary {
        let a = announcements_status(Some(&Announcements { routes, bird_error: bird_error.map(str::to_owned), changes: Vec::new() }), None);
        (a.state, a.reason, a.addresses.into_iter().collect())
    }

    fn expected(state: &str, reason: Option<&str>, addresses: &[(&str, usize)]) -> Summary {
        (state.to_owned(), reason.map(str::to_owned), addresses.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect())
    }

    #[test]
    fn a_core_without_an_announcer_says_announcements_are_off() {
        let mut fixture = super::super::tests::Fixture::new();
        let Reply::Status(status) = fixture.core.handle(Request::Status).unwrap() else { panic!("not a status") };
        assert_eq!(status.announcements.state, "off");
        assert_eq!(status.announcements.reason.as_deref(), Some("no BIRD configured"));
        let announcing = Announcements { routes: vec![route("10.100.0.1", "announced", "serving")], ..Announcements::default() };
        fixture.core.set_announcements(announcing);
        let Reply::Status(status) = fixture.core.handle(Request::Status).unwrap() else { panic!("not a status") };
        assert_eq!((status.announcements.state.as_str(), status.announcements.reason), ("announcing", None));
        // An announcer that stopped is not "no BIRD configured": it says why, as an ALERT too.
        fixture.core.set_announcer_down("reading the include: permission denied".to_owned());
        let Reply::Status(status) = fixture.core.handle(Request::Status).unwrap() else { panic!("not a status") };
        assert_eq!(status.announcements.state, "off");
        assert_eq!(status.announcements.reason.as_deref(), Some("the announcer stopped: reading the include: permission denied"));
        assert!(status.alerts.iter().any(|a| a.starts_with("ALERT: lbd announces and withdraws nothing")), "{:?}", status.alerts);
    }

    #[test]
    fn the_announcement_state_sums_up_every_address_with_the_faults() {
        let serving = || route("10.100.0.1", "announced", "serving");
        assert_eq!(
            summary(vec![serving(), route("10.100.0.2", "announced", "restored")], None),
            expected("announcing", None, &[("announced", 2)])
        );
        // An address without backends is withdrawn by design, not a fault.
        assert_eq!(
            summary(vec![serving(), route("10.100.0.2", "withdrawn", "no_backends")], None),
            expected("announcing", None, &[("announced", 1), ("withdrawn", 1)])
        );
        assert_eq!(
            summary(vec![serving(), route("fd00::1", "degraded", "forwarding_disabled")], None),
            expected("degraded", Some("forwarding_disabled"), &[("announced", 1), ("degraded", 1)])
        );
        assert_eq!(
            summary(vec![serving(), route("fd00::1", "withdrawn", "forwarding_disabled")], None),
            expected("degraded", Some("forwarding_disabled"), &[("announced", 1), ("withdrawn", 1)])
        );
        assert_eq!(
            summary(vec![route("10.100.0.1", "withdrawn", "program_detached"), route("fd00::1", "withdrawn", "program_detached")], None),
            expected("withdrawn", Some("program_detached"), &[("withdrawn", 2)])
        );
        assert_eq!(
            summary(vec![serving()], Some("cannot connect to /run/bird/bird.ctl")),
            expected("degraded", Some("BIRD: cannot connect to /run/bird/bird.ctl"), &[("announced", 1)])
        );
        assert_eq!(
            summary(vec![route("10.100.0.1", "withdrawn", "no_backends")], None),
            expected("withdrawn", Some("no_backends"), &[("withdrawn", 1)])
        );
        assert_eq!(summary(Vec::new(), None), expected("withdrawn", Some("no VIPs"), &[]));
        let unknown_peers = AnnouncementView { peers: None, ..serving() };
        assert_eq!(summary(vec![unknown_peers], None), expected("degraded", Some("BIRD: not answering"), &[("announced", 1)]));
    }
}
