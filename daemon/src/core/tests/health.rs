//! The core with health checks on: zones and capacity in the programmed state, per-VIP
//! settings, drain deadlines, port pressure and restarts.

use std::collections::BTreeMap;

use super::*;
use crate::ports_book::AgentPoll;
use crate::{
    store::SnapshotEntry,
    store::StateFile,
    testing::{FakeMaps, TempDir},
    testing::{VIP, ip, vip},
};
use spillway_api::{BackendEntry, VipEntry};
use spillway_model::ports_report::{DestinationUsage, Dropped, Level, Thresholds};
use spillway_model::{BackendOptions, HealthConfig, ProbeOutcome};
use spillway_policy::health::Restored;

struct Fixture {
    core: Core<FakeMaps, StateFile>,
    tmp: TempDir,
}

impl Fixture {
    fn new(zone: Option<&str>) -> Self {
        Self::restart(TempDir::new("core-health"), zone, HealthSnapshot::default())
    }

    fn restart(tmp: TempDir, zone: Option<&str>, snapshot: HealthSnapshot) -> Self {
        let store = StateFile::open(tmp.path()).unwrap();
        let state = store.load().unwrap().unwrap_or_default();
        let config = ChecksConfig { defaults: HealthConfig::default(), local_zone: zone.map(str::to_owned) };
        let (core, _) = Core::start(FakeMaps::default(), store, state, Some((config, snapshot))).unwrap();
        Self { core, tmp }
    }

    fn ok(&mut self, request: Request) -> Reply {
        self.core.handle(request.clone()).unwrap_or_else(|e| panic!("{request:?}: {e}"))
    }

    fn add(&mut self, backend: &str, zone: Option<&str>, capacity: Option<u32>) {
        let options = BackendOptions { zone: zone.map(str::to_owned), capacity_per_s: capacity, ..BackendOptions::default() };
        self.ok(Request::AddBackend { vip: vip(VIP), backend: ip(backend), weight: None, options });
    }

    fn backends(&mut self) -> Vec<BackendEntry> {
        match self.ok(Request::ListBackends { vip: vip(VIP) }) {
            Reply::Backends(list) => list.backends,
            other => panic!("{other:?}"),
        }
    }

    /// The alerts `lbctl backends list` shows.
    fn backend_alerts(&mut self) -> Vec<String> {
        match self.ok(Request::ListBackends { vip: vip(VIP) }) {
            Reply::Backends(list) => list.alerts,
            other => panic!("{other:?}"),
        }
    }

    /// The alerts `lbctl status` shows.
    fn status_alerts(&mut self) -> Vec<String> {
        match self.ok(Request::Status) {
            Reply::Status(status) => status.alerts,
            other => panic!("{other:?}"),
        }
    }

    fn effective(&mut self) -> BTreeMap<IpAddr, u32> {
        self.backends().into_iter().map(|b| (b.address, b.effective_weight.unwrap())).collect()
    }

    fn vip_entry(&mut self) -> VipEntry {
        match self.ok(Request::ListVips) {
            Reply::Vips(mut list) => list.vips.remove(0),
            other => panic!("{other:?}"),
        }
    }
}

fn serving(backends: &[&str]) -> HealthSnapshot {
    HealthSnapshot {
        backends: backends.iter().map(|b| SnapshotEntry { vip: vip(VIP), backend: ip(b), state: Restored::Serving }).collect(),
    }
}

fn weights(f: &mut Fixture) -> Vec<u32> {
    f.effective().values().copied().collect()
}

#[test]
fn new_flows_stay_in_the_local_zone_and_spill_only_the_remote_spare() {
    let mut f = Fixture::new(Some("a"));
    f.ok(plain_vip(vip(VIP), Some(13)));
    f.add("10.0.0.1", Some("a"), Some(300));
    f.add("10.0.0.2", Some("b"), Some(300));
    let mut f = Fixture::restart(f.tmp, Some("a"), serving(&["10.0.0.1", "10.0.0.2"]));
    assert_eq!(weights(&mut f), [100, 0], "local zone healthy: nothing for zone b");
    assert_eq!(f.vip_entry().effective_budget, Some(RateSpec::new(300, Some(30))), "the local capacity");

    // Zone a's only backend fails (half the weight: within the ejection cap, no panic).
    let failed = ProbeOutcome::Failure { reason: "refused".into() };
    let key = spillway_policy::health::ProbeKey { vip: vip(VIP), backend: ip("10.0.0.1") };
    let results =
        vec![ProbeResult { key, outcome: failed.clone(), local_cause: None }, ProbeResult { key, outcome: failed, local_cause: None }];
    f.core.health_round(results).unwrap();
    assert_eq!(weights(&mut f)[0], 0);
    let entry = f.vip_entry();
    assert_eq!(entry.effective_budget, Some(RateSpec::new(60, Some(6))), "zone b lends 20% of 300; the rest is shed");
    assert_eq!(entry.health.unwrap().spill_per_s, 60);
}

/// Regression: a checked VIP without backends showed `BUDGET/S 1` though no budget was set
/// (no backend read as a declared capacity of 0, and a budget of 0 is raised to 1).
#[test]
fn a_vip_without_backends_has_no_budget() {
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    assert_eq!(f.vip_entry().effective_budget, None);
    assert_eq!(f.core.sample().unwrap().vips[0].budget, None);
}

#[test]
fn health_settings_are_merged_by_field_persisted_and_refused_by_name() {
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    let set = |policy: &[(&str, serde_json::Value)]| Request::SetHealth {
        vip: vip(VIP),
        probe: None,
        probe_path: None,
        policy: policy.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        reset: false,
    };
    f.ok(set(&[("fall", 3.into())]));
    f.ok(set(&[("fail_closed", true.into())]));
    let saved = StateFile::open(f.tmp.path()).unwrap().load().unwrap().unwrap();
    let policy = &saved.vips[&vip(VIP)].health.as_ref().unwrap().policy;
    assert_eq!((policy.fall, policy.fail_closed, policy.rise), (3, true, 2));
    assert_eq!(f.vip_entry().health.unwrap().policy.fall, 3);
    for (bad, needle) in [(set(&[("fal", 3.into())]), "fal"), (set(&[("panic_threshold", 2.0.into())]), "panic_threshold")] {
        let err = f.core.handle(bad).unwrap_err().to_api().message;
        assert!(err.contains(needle), "{err}");
    }
    f.ok(Request::SetHealth { vip: vip(VIP), probe: None, probe_path: None, policy: BTreeMap::new(), reset: true });
    assert_eq!(f.vip_entry().health.unwrap().policy, HealthConfig::default());
}

#[test]
fn a_drain_deadline_survives_a_restart_and_removes_the_backend() {
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    f.add("10.0.0.1", None, None);
    f.add("10.0.0.2", None, None);
    f.ok(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.2"), deadline_s: Some(60), force: false });
    let err =
        f.core.handle(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.1"), deadline_s: Some(0), force: false }).unwrap_err();
    assert!(err.to_api().message.contains("drain deadline"), "{err}");
    assert_eq!(f.core.expire_drains(unix_ms()).unwrap(), 0);
    let in_s = f.backends()[1].drain_deadline_in_s.unwrap();
    assert!((59..=60).contains(&in_s), "{in_s}");

    let mut f = Fixture::restart(f.tmp, None, HealthSnapshot::default());
    assert_eq!(f.core.expire_drains(unix_ms() + 61_000).unwrap(), 1);
    assert_eq!(f.backends().len(), 1);
    // Undraining clears a deadline.
    f.add("10.0.0.3", None, None);
    f.ok(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.3"), deadline_s: Some(5), force: false });
    f.ok(Request::SetWeight { vip: vip(VIP), backend: ip("10.0.0.3"), weight: 100 });
    assert_eq!(f.core.expire_drains(unix_ms() + 10_000).unwrap(), 0);
}

fn report(utilisation: f64, failures: u64) -> PortsReport {
    let level = if utilisation >= 0.9 { Level::Critical } else { Level::Ok };
    PortsReport {
        thresholds: Thresholds::default(),
        destinations: vec![DestinationUsage {
            netns: 1,
            protocol: "tcp".into(),
            local: ip("10.0.0.1"),
            remote: ip("10.9.0.1"),
            remote_port: 5432,
            active: 90,
            time_wait: 0,
            in_use: 90,
            failures,
            opened: 90,
            port_range: None,
            usable_ports: Some(100),
            utilisation: Some(utilisation),
            level,
        }],
        failures: Vec::new(),
        leak_suspects: Vec::new(),
        watcher: None,
        dropped: Dropped::default(),
    }
}

#[test]
fn port_pressure_from_an_agent_cuts_only_that_backends_weight() {
    let snapshot = serving(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
    let tmp = TempDir::new("core-pressure");
    {
        let mut f = Fixture::restart(tmp, None, HealthSnapshot::default());
        f.ok(plain_vip(vip(VIP), Some(13)));
        for b in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
            f.add(b, None, None);
        }
        let mut f = Fixture::restart(f.tmp, None, snapshot);
        assert_eq!(weights(&mut f), [100, 100, 100], "restored as serving: no slow start");
        f.core.record_agent_ports(ip("10.0.0.2"), AgentPoll::Report(Box::new(report(0.95, 0)))).unwrap();
        assert_eq!(weights(&mut f), [100, 25, 100]);
        assert_eq!(f.backends()[1].pressure.as_deref(), Some("critical"));
        assert_eq!(f.backends()[1].health.as_deref(), Some("healthy"), "pressure is not a health state");
        f.core.record_agent_ports(ip("10.0.0.2"), AgentPoll::Report(Box::new(report(0.99, 7)))).unwrap();
        assert_eq!(weights(&mut f), [100, 0, 100], "failing connects: no new flows");
        // An answer that is not the agent's changes nothing and is an ALERT until the
        // agent's next authentic report.
        let forged = AgentPoll::Unauthenticated("its signature does not hold".into());
        f.core.record_agent_ports(ip("10.0.0.2"), forged).unwrap();
        assert_eq!(weights(&mut f), [100, 0, 100], "a forged report moves no weight");
        let alerts = f.backend_alerts();
        assert!(alerts.iter().any(|a| a.starts_with("ALERT: the port report from 10.0.0.2's agent was ignored")), "{alerts:?}");
        f.core.record_agent_ports(ip("10.0.0.2"), AgentPoll::Report(Box::new(report(0.95, 7)))).unwrap();
        assert!(f.backend_alerts().is_empty());
        // An agent that cannot be reached says nothing: the pressure goes back to none.
        f.core.record_agent_ports(ip("10.0.0.2"), AgentPoll::Failed("connection refused".into())).unwrap();
        assert_eq!(weights(&mut f), [100, 100, 100]);
    }
}

#[test]
fn a_stopped_agent_is_shown_and_alerted_until_it_answers_and_health_is_untouched() {
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    f.add("10.0.0.1", None, None);
    f.add("10.0.0.2", None, None);
    let b2 = ip("10.0.0.2");
    let failed = || AgentPoll::Failed("connecting to 10.0.0.2:9477: connection refused".into());
    let stopped = |alerts: &[String]| alerts.iter().any(|a| a.starts_with("ALERT: 10.0.0.2's agent has not answered for"));
    // Never heard from: shown, no ALERT (it may never have run: lbd --agent-port 0 is how
    // a fleet without agents says so).
    f.core.record_agent_ports(b2, failed()).unwrap();
    f.core.record_agent_ports(b2, failed()).unwrap();
    assert!(f.backends()[1].agent_unreachable_s.is_some());
    assert!(!stopped(&f.status_alerts()));

    f.core.record_agent_ports(b2, AgentPoll::Report(Box::new(report(0.1, 0)))).unwrap();
    assert_eq!(f.backends()[1].agent_unreachable_s, None);
    let healthy = f.backends();
    // One lost poll is no outage; two in a row are.
    f.core.record_agent_ports(b2, failed()).unwrap();
    assert!(f.backends()[1].agent_unreachable_s.is_none() && !stopped(&f.status_alerts()));
    f.core.record_agent_ports(b2, failed()).unwrap();
    let alerts = f.status_alerts();
    assert!(stopped(&alerts) && alerts.iter().any(|a| a.contains("connection refused")), "{alerts:?}");
    assert!(stopped(&f.backend_alerts()));
    let now = f.backends();
    assert!(now[1].agent_unreachable_s.is_some() && now[0].agent_unreachable_s.is_none());
    for (before, after) in healthy.iter().zip(&now) {
        assert_eq!((&before.health, before.effective_weight), (&after.health, after.effective_weight), "health unchanged");
    }
    f.core.record_agent_ports(b2, AgentPoll::Report(Box::new(report(0.1, 0)))).unwrap();
    assert!(!stopped(&f.status_alerts()) && f.backends()[1].agent_unreachable_s.is_none());
}

#[test]
fn status_lists_every_alert_and_an_ignored_report_says_why_the_kept_one_is_stale() {
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    f.add("10.0.0.1", None, None);
    let b1 = ip("10.0.0.1");
    f.core.record_agent_ports(b1, AgentPoll::Report(Box::new(report(0.1, 0)))).unwrap();
    let Reply::Ports(view) = f.ok(Request::Ports { host: Some(b1) }) else { panic!("not a ports view") };
    assert_eq!(view.stale, None);
    f.core.record_agent_ports(b1, AgentPoll::Unauthenticated("its signature does not hold".into())).unwrap();
    let alerts = f.status_alerts();
    assert!(alerts.iter().any(|a| a.starts_with("ALERT: the port report from 10.0.0.1's agent was ignored")), "{alerts:?}");
    let Reply::Ports(view) = f.ok(Request::Ports { host: Some(b1) }) else { panic!("not a ports view") };
    assert!(view.report.is_some());
    assert_eq!(view.stale.as_deref(), Some("last good report 0 s ago; since then: answers ignored, its signature does not hold"));
    // The balancer's own ports at the critical threshold: an ALERT while it lasts.
    f.core.record_local_ports(Ok(report(0.95, 0)));
    assert!(f.status_alerts().contains(&crate::ports_book::LB_PORTS_CRITICAL_ALERT.to_owned()));
    f.core.record_local_ports(Ok(report(0.1, 0)));
    assert!(!f.status_alerts().contains(&crate::ports_book::LB_PORTS_CRITICAL_ALERT.to_owned()));
    // New flows that found the connection table full: an ALERT for a while after the log.
    assert!(!f.status_alerts().contains(&super::flows::TABLE_FULL_ALERT.to_owned()));
    f.core.maps.unremembered_flows = 3;
    f.core.watch_flow_table();
    assert!(f.status_alerts().contains(&super::flows::TABLE_FULL_ALERT.to_owned()));
}

#[test]
fn probes_go_through_the_tunnel_unless_the_vip_or_the_backend_says_direct() {
    use crate::health_checks::{LocalCause, ProbeRoute};
    use spillway_model::ProbePath;
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    f.add("10.0.0.1", None, None);
    f.add("10.0.0.2", None, None);
    let target = Some("10.0.0.3:8080".parse().unwrap());
    f.ok(Request::AddBackend {
        vip: vip(VIP),
        backend: ip("10.0.0.3"),
        weight: None,
        options: BackendOptions { probe_target: target, ..Default::default() },
    });
    let routes = |f: &mut Fixture| -> BTreeMap<IpAddr, ProbeRoute> {
        let (targets, _) = f.core.health_round(Vec::new()).unwrap();
        targets.into_iter().map(|t| (t.key.backend, t.route)).collect()
    };
    let tunnel = |f: &Fixture, backend: &str, port: u16, direct: &str| {
        let (backend_id, generation) = f.core.reconciler.backend_slot(&vip(VIP), &ip(backend)).unwrap();
        ProbeRoute::Tunnel { vip: std::net::SocketAddr::new(vip(VIP).addr, port), backend_id, generation, direct: direct.parse().unwrap() }
    };
    let by_default = routes(&mut f);
    assert_eq!(by_default[&ip("10.0.0.1")], tunnel(&f, "10.0.0.1", 80, "10.0.0.1:80"));
    // A probe target's port is the VIP's probe port too; its address is the direct probe's.
    assert_eq!(by_default[&ip("10.0.0.3")], tunnel(&f, "10.0.0.3", 8080, "10.0.0.3:8080"));

    let set_path = |path| Request::SetHealth { vip: vip(VIP), probe: None, probe_path: Some(path), policy: BTreeMap::new(), reset: false };
    f.ok(set_path(ProbePath::Direct));
    let options = BackendOptions { probe_path: Some(ProbePath::Tunnel), ..Default::default() };
    f.ok(Request::SetBackendOptions { vip: vip(VIP), backend: ip("10.0.0.2"), options });
    let chosen = routes(&mut f);
    assert_eq!(chosen[&ip("10.0.0.1")], ProbeRoute::Direct("10.0.0.1:80".parse().unwrap()));
    assert_eq!(chosen[&ip("10.0.0.2")], tunnel(&f, "10.0.0.2", 80, "10.0.0.2:80"));
    let paths: Vec<Option<ProbePath>> = f.backends().iter().map(|b| b.probe_path).collect();
    assert_eq!(paths, [Some(ProbePath::Direct), Some(ProbePath::Tunnel), Some(ProbePath::Direct)]);
    let saved = StateFile::open(f.tmp.path()).unwrap().load().unwrap().unwrap();
    assert_eq!(saved.vips[&vip(VIP)].health.as_ref().unwrap().probe_path, ProbePath::Direct, "persisted");
    assert_eq!(f.vip_entry().health.unwrap().probe_path, ProbePath::Direct);

    // A broken VIP path fails the backend and is counted for its VIP; the balancer's own
    // trouble changes nothing and raises an alert naming it.
    let key = |b: &str| spillway_policy::health::ProbeKey { vip: vip(VIP), backend: ip(b) };
    let broken = ProbeOutcome::VipPathFailed { tunnel: "timeout".into() };
    let result = |b: &str, outcome: &ProbeOutcome, local_cause: Option<LocalCause>| ProbeResult {
        key: key(b),
        outcome: outcome.clone(),
        local_cause,
    };
    f.core.health_round(vec![result("10.0.0.2", &broken, None), result("10.0.0.2", &broken, None)]).unwrap();
    let b2 = f.backends().remove(1);
    assert!(b2.reason.as_deref().unwrap().starts_with("vip_path_failed failures=2"), "{b2:?}");
    assert_eq!(f.vip_entry().health.unwrap().vip_path_failed, 1);
    let health = |f: &mut Fixture| -> Vec<Option<String>> { f.backends().iter().map(|b| b.health.clone()).collect() };
    let before = health(&mut f);
    let unknown = ProbeOutcome::Unknown;
    let cause = LocalCause::VipPath("the probe program is not attached".into());
    f.core.health_round(vec![result("10.0.0.1", &unknown, Some(cause)), result("10.0.0.3", &unknown, None)]).unwrap();
    let alerts = f.core.alerts();
    assert_eq!(alerts.len(), 2, "{alerts:?}");
    assert!(alerts[0].contains("cannot open probe sockets"), "{alerts:?}");
    assert!(alerts[1].contains("cannot probe through the tunnel") && alerts[1].contains("not attached"), "{alerts:?}");
    assert_eq!(health(&mut f), before);
    // A probe in flight when its backend was removed found no backend: not the balancer's
    // trouble (a soak's removal under probing raised one).
    let mut f = Fixture::new(None);
    f.ok(plain_vip(vip(VIP), Some(13)));
    f.add("10.0.0.1", None, None);
    let cause = LocalCause::VipPath("the probe program did not send the probe on: drop_no_backend".into());
    f.core.health_round(vec![result("10.0.0.9", &unknown, Some(cause))]).unwrap();
    assert_eq!(f.core.alerts(), Vec::<String>::new());
}
