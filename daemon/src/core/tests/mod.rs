//! The API's behaviour against in-memory maps and a real state file.

mod apply;
mod health;

use std::fs;

use spillway_common::{limits::MAX_BACKENDS_PER_VIP, maglev::MAX_WEIGHT, types::Reason};

use super::*;
use crate::{
    store::StateFile,
    testing::{FakeMaps, TempDir, VIP, ip, vip},
};
use spillway_api::{BackendState, VipEntry, VipList};
use spillway_model::{Encap, HashMode};
use spillway_model::{Vip, host::Host};
use spillway_reconcile::table_digest;

/// A core on fake maps with a real state file (also for `apply_tests`).
/// Adds `vip` with every option at its default but the ring size.
fn plain_vip(vip: Vip, ring_size: Option<u32>) -> Request {
    Request::AddVip { vip, ring_size, force: false, quic: None, encap: Encap::Ipip, hash: HashMode::FiveTuple, source_prefix: None }
}

pub(super) struct Fixture {
    pub(super) core: Core<FakeMaps, StateFile>,
    pub(super) tmp: TempDir,
}

impl Fixture {
    pub(super) fn new() -> Self {
        let tmp = TempDir::new("core");
        let store = StateFile::open(tmp.path()).unwrap();
        let (core, _) = Core::start(FakeMaps::default(), store, DesiredState::default(), None).unwrap();
        Self { core, tmp }
    }

    fn ok(&mut self, request: Request) -> Reply {
        self.core.handle(request.clone()).unwrap_or_else(|e| panic!("{request:?}: {e}"))
    }

    pub(super) fn saved(&self) -> Option<DesiredState> {
        StateFile::open(self.tmp.path()).unwrap().load().unwrap()
    }

    fn file_bytes(&self) -> Option<Vec<u8>> {
        fs::read(self.tmp.path().join(crate::store::STATE_FILE)).ok()
    }

    pub(super) fn with_two_backends() -> Self {
        let mut f = Self::new();
        f.ok(plain_vip(vip(VIP), Some(251)));
        f.ok(Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.1"), weight: None, options: Default::default() });
        f.ok(Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.2"), weight: Some(50), options: Default::default() });
        f
    }

    fn backends(&mut self) -> Vec<(IpAddr, u32, BackendState)> {
        match self.ok(Request::ListBackends { vip: vip(VIP) }) {
            Reply::Backends(list) => list.backends.into_iter().map(|b| (b.address, b.weight, b.state)).collect(),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn mutations_apply_persist_and_list() {
    let mut f = Fixture::new();
    let reply = f.ok(plain_vip(vip(VIP), Some(251)));
    assert_eq!(reply, Reply::Done { slots_written: 251, tables_flipped: 1 });
    f.ok(Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.1"), weight: None, options: Default::default() });
    f.ok(Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.2"), weight: Some(50), options: Default::default() });
    let Reply::Vips(mut list) = f.ok(Request::ListVips) else { panic!("not a VIP list") };
    let digest = list.vips[0].table_digest.take();
    let table = f.core.reconciler.active_table(&vip(VIP)).unwrap();
    assert_eq!(digest, Some(table_digest(f.core.maps.lb_config().unwrap().flow_seed, None, &table)));
    assert_eq!(
        list,
        VipList {
            vips: vec![VipEntry {
                vip: vip(VIP),
                ring_size: 251,
                encap: Encap::Ipip,
                hash: HashMode::FiveTuple,
                source_prefix: None,
                backends: 2,
                health: None,
                effective_budget: None,
                announcement: None,
                table_digest: None
            }],
            alerts: vec![]
        }
    );
    assert_eq!(f.backends(), [(ip("10.0.0.1"), DEFAULT_WEIGHT, BackendState::Active), (ip("10.0.0.2"), 50, BackendState::Active)]);
    assert_eq!(f.saved().as_ref(), Some(f.core.state()));

    f.ok(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.2"), deadline_s: None, force: false });
    assert_eq!(f.backends()[1], (ip("10.0.0.2"), 0, BackendState::Draining));
    f.ok(Request::SetWeight { vip: vip(VIP), backend: ip("10.0.0.2"), weight: 7 });
    assert_eq!(f.backends()[1], (ip("10.0.0.2"), 7, BackendState::Active));
    f.ok(Request::RemoveBackend { vip: vip(VIP), backend: ip("10.0.0.1") });
    assert_eq!(f.backends(), [(ip("10.0.0.2"), 7, BackendState::Active)]);
    // A VIP with backends goes only when forced, as `apply` needs --allow-vip-removal.
    let err = f.core.handle(Request::RemoveVip { vip: vip(VIP), force: false }).unwrap_err().to_string();
    assert_eq!(
        err,
        "VIP 10.100.0.1:80/tcp has 1 backends and 0 live connections (connection-table entries used in the last 900 s, \
         the idle timeout), which would break; drain and remove its backends first, or remove it with --force"
    );
    assert_eq!(f.backends().len(), 1);
    f.ok(Request::RemoveVip { vip: vip(VIP), force: true });
    assert_eq!(f.ok(Request::ListVips), Reply::Vips(VipList { vips: vec![], alerts: vec![] }));
    assert_eq!(f.saved(), Some(DesiredState::default()));
    assert!(f.core.maps().vips.is_empty());
}

#[test]
fn refused_requests_name_the_problem_and_change_nothing() {
    let mut f = Fixture::with_two_backends();
    let unknown: Vip = "10.9.9.9:80/tcp".parse().unwrap();
    let v6: Vip = "[fd00::1]:0/udp".parse().unwrap();
    f.ok(plain_vip(v6, None));
    let (state, maps, file) = (f.core.state().clone(), f.core.maps().clone(), f.file_bytes());
    let cases = [
        (plain_vip(vip(VIP), None), "already exists"),
        (plain_vip(unknown, Some(100)), "ring size 100"),
        (
            Request::AddVip {
                vip: unknown,
                ring_size: None,
                force: false,
                quic: None,
                encap: Encap::Ipip,
                hash: HashMode::Source,
                source_prefix: Some(33),
            },
            "VIP 10.9.9.9:80/tcp source_prefix: 33 is out of range for an IPv4 VIP (1..=32)",
        ),
        (Request::RemoveVip { vip: unknown, force: false }, "unknown VIP 10.9.9.9:80/tcp"),
        (Request::ListBackends { vip: unknown }, "unknown VIP"),
        (Request::AddBackend { vip: unknown, backend: ip("10.0.0.3"), weight: None, options: Default::default() }, "unknown VIP"),
        (
            Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.1"), weight: None, options: Default::default() },
            "backend 10.0.0.1 already exists",
        ),
        (
            Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.3"), weight: Some(0), options: Default::default() },
            "weight 0 is out of range",
        ),
        (
            Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.3"), weight: Some(MAX_WEIGHT + 1), options: Default::default() },
            "out of range",
        ),
        (Request::AddBackend { vip: vip(VIP), backend: ip("0.0.0.0"), weight: None, options: Default::default() }, "not usable"),
        (Request::AddBackend { vip: v6, backend: ip("10.0.0.3"), weight: None, options: Default::default() }, "needs an IPv6 backend"),
        (Request::RemoveBackend { vip: vip(VIP), backend: ip("10.0.0.9") }, "backend 10.0.0.9 is not in VIP"),
        (Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.9"), deadline_s: None, force: false }, "is not in VIP"),
        (Request::SetWeight { vip: vip(VIP), backend: ip("10.0.0.1"), weight: 0 }, "out of range"),
    ];
    assert_all_refused(&mut f, cases, (&state, &maps, &file));
}

#[test]
fn a_source_hash_vip_is_listed_persisted_and_flagged() {
    let mut f = Fixture::with_two_backends();
    let v6: Vip = "[fd00::1]:443/tcp".parse().unwrap();
    f.ok(Request::AddVip {
        vip: v6,
        ring_size: Some(13),
        force: false,
        quic: None,
        encap: Encap::Ipip,
        hash: HashMode::Source,
        source_prefix: Some(64),
    });
    let listed = |f: &mut Fixture| {
        let Reply::Vips(list) = f.ok(Request::ListVips) else { panic!("not a VIP list") };
        list.vips.iter().map(|v| (v.vip, v.hash, v.source_prefix)).collect::<Vec<_>>()
    };
    assert_eq!(listed(&mut f), [(vip(VIP), HashMode::FiveTuple, None), (v6, HashMode::Source, Some(64))]);
    assert_eq!(f.saved().unwrap().vips[&v6].source_prefix_len(&v6), Some(64));
    let flags = f.core.maps().vips[&spillway_reconcile::vip_key(&v6)].flags;
    assert_eq!(flags & spillway_common::types::VIP_SOURCE_HASH_BITS, spillway_common::types::vip_source_hash_flags(64));
}

#[test]
fn too_many_backends_in_a_vip_is_refused() {
    let tmp = TempDir::new("core-full");
    let mut state = DesiredState::default();
    state.add_vip(vip(VIP), 65537).unwrap();
    for i in 0..MAX_BACKENDS_PER_VIP {
        state.add_backend(&vip(VIP), IpAddr::from([10, 1, (i >> 8) as u8, i as u8]), 1).unwrap();
    }
    let (mut core, _) = Core::start(FakeMaps::default(), StateFile::open(tmp.path()).unwrap(), state, None).unwrap();
    let err =
        core.handle(Request::AddBackend { vip: vip(VIP), backend: ip("10.2.0.1"), weight: None, options: Default::default() }).unwrap_err();
    assert!(err.to_string().contains("too many backends"), "{err}");
}

#[test]
fn failed_apply_rolls_the_maps_back() {
    let mut f = Fixture::with_two_backends();
    let (state, file) = (f.core.state().clone(), f.file_bytes());
    let active = f.core.maps().vips.clone();
    f.core.maps.fail_next_write = true;
    let err = f
        .core
        .handle(Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.3"), weight: None, options: Default::default() })
        .unwrap_err();
    assert!(matches!(err, CoreError::Apply(_)), "{err:?}");
    assert_eq!(err.to_api().kind, ErrorKind::Internal);
    assert!(err.to_api().message.contains("injected failure"), "{}", err.to_api().message);
    assert_eq!(f.core.state(), &state);
    assert_eq!(f.file_bytes(), file);
    // Packets still read the same table, and the backend that was being added is freed.
    assert_eq!(f.core.maps().vips, active);
    let in_use = f.core.maps().backends.values().filter(|b| b.state == spillway_common::types::BACKEND_ACTIVE).count();
    assert_eq!(in_use, 2);
    // And the next change works.
    f.ok(Request::AddBackend { vip: vip(VIP), backend: ip("10.0.0.3"), weight: None, options: Default::default() });
    assert_eq!(f.backends().len(), 3);
}

struct BrokenStore;

impl Store for BrokenStore {
    fn save(&mut self, _: &DesiredState) -> Result<(), StoreError> {
        Err(StoreError::Write { path: "/nowhere/state.json".into(), source: std::io::ErrorKind::StorageFull.into() })
    }

    fn save_health(&mut self, _: &HealthSnapshot) -> Result<(), StoreError> {
        Err(StoreError::Write { path: "/nowhere/health.json".into(), source: std::io::ErrorKind::StorageFull.into() })
    }

    fn save_config_mark(&mut self, _: &crate::store::ConfigMark) -> Result<(), StoreError> {
        Err(StoreError::Write { path: "/nowhere/config-applied.json".into(), source: std::io::ErrorKind::StorageFull.into() })
    }
}

#[test]
fn failed_persist_rolls_the_maps_back() {
    let (mut core, _) = Core::start(FakeMaps::default(), BrokenStore, DesiredState::default(), None).unwrap();
    let err = core.handle(plain_vip(vip(VIP), Some(13))).unwrap_err();
    assert!(matches!(err, CoreError::Persist(_)));
    assert!(err.to_api().message.contains("/nowhere/state.json"), "{}", err.to_api().message);
    assert_eq!(core.state(), &DesiredState::default());
    assert!(core.maps().vips.is_empty() && core.maps().addrs.is_empty());
}

#[test]
fn restart_with_the_same_state_writes_nothing_and_unchanged_edits_are_free() {
    let mut f = Fixture::with_two_backends();
    let state = f.core.state().clone();
    let maps = f.core.maps().clone();
    let (_, report) = Core::start(maps, StateFile::open(f.tmp.path()).unwrap(), state, None).unwrap();
    assert_eq!(report, ApplyReport::default());
    f.ok(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.2"), deadline_s: None, force: false });
    let again = f.ok(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.2"), deadline_s: None, force: false });
    assert_eq!(again, Reply::Done { slots_written: 0, tables_flipped: 0 });
}

#[test]
fn stats_follow_the_reconciler_ids() {
    let mut f = Fixture::with_two_backends();
    let vip_id = f.core.reconciler.vip_id(&vip(VIP)).unwrap();
    let be_id = f.core.reconciler.backend_id(&vip(VIP), &ip("10.0.0.2")).unwrap();
    f.core.maps.vip_traffic.insert(vip_id, Traffic { packets: 3, bytes: 300, new_flows: 0 });
    f.core.maps.backend_traffic.insert(be_id, Traffic { packets: 2, bytes: 200, new_flows: 0 });
    let Reply::Stats(stats) = f.ok(Request::Stats) else { panic!() };
    assert_eq!(stats.vips.len(), 1);
    assert_eq!((stats.vips[0].packets, stats.vips[0].bytes), (3, 300));
    let b: Vec<_> = stats.vips[0].backends.iter().map(|b| (b.address, b.packets, b.bytes)).collect();
    assert_eq!(b, [(ip("10.0.0.1"), 0, 0), (ip("10.0.0.2"), 2, 200)]);
    let labels: Vec<&str> = stats.reasons.iter().map(|r| r.reason.as_str()).collect();
    assert_eq!(labels, Reason::ALL.iter().map(|r| r.label()).collect::<Vec<_>>());
    assert_eq!(stats.reasons[1].packets, 1);
}

#[test]
fn backend_addrs_cover_every_vip() {
    let mut f = Fixture::with_two_backends();
    let v6: Vip = "[fd00::1]:0/udp".parse().unwrap();
    f.ok(plain_vip(v6, Some(13)));
    f.ok(Request::AddBackend { vip: v6, backend: ip("fd00::2"), weight: None, options: Default::default() });
    f.ok(Request::DrainBackend { vip: vip(VIP), backend: ip("10.0.0.1"), deadline_s: None, force: false });
    let addrs: Vec<IpAddr> = f.core.backend_addrs().into_iter().collect();
    assert_eq!(addrs, [ip("10.0.0.1"), ip("10.0.0.2"), ip("fd00::2")]);
}

// --- Rate limits, rules, top sources ---

use spillway_common::{
    limits::Capacity,
    types::{Bucket, RuleState, SourceKey, SourceState},
};

use spillway_api::{LimitOrigin, LimitPart, RuleActionKind, Scope};
use spillway_model::{RateSpec, RuleMatch};

fn set_rate(scope: Scope, per_s: u32) -> Request {
    Request::SetRateLimit { scope, per_s, burst: None, source_prefix_v4: None, source_prefix_v6: None, observe: false }
}

fn set_rule(cidr: &str, vip: Option<Vip>, action: RuleActionKind, per_s: Option<u32>) -> Request {
    Request::SetRule { cidr: cidr.parse().unwrap(), vip, action, per_s, burst: None, observe: false }
}

#[test]
fn rate_limits_are_set_listed_persisted_and_cleared() {
    let mut f = Fixture::with_two_backends();
    let v6: Vip = "[fd00::1]:0/udp".parse().unwrap();
    f.ok(plain_vip(v6, Some(13)));
    f.ok(Request::SetRateLimit {
        scope: Scope::Default,
        per_s: 100,
        burst: Some(300),
        source_prefix_v4: Some(24),
        source_prefix_v6: None,
        observe: true,
    });
    f.ok(Request::SetBudget { scope: Scope::Vip(vip(VIP)), per_s: 5000, burst: None, observe: false });
    assert_eq!(f.saved().as_ref(), Some(f.core.state()));
    let Reply::RateLimits(list) = f.ok(Request::ListRateLimits) else { panic!() };
    let default = list.default.per_source.clone().unwrap();
    assert_eq!((default.rate, default.source_prefix_v4, default.source_prefix_v6), (RateSpec { per_s: 100, burst: 300 }, 24, 64));
    assert!(default.observe && list.default.vip_budget.is_none());
    assert_eq!(list.vips.len(), 2);
    let own = &list.vips[0];
    assert_eq!(own.vip, vip(VIP));
    assert_eq!(own.effective.per_source.as_ref().unwrap().from, LimitOrigin::Default);
    let budget = own.effective.vip_budget.as_ref().unwrap();
    assert_eq!((budget.rate, budget.observe, budget.from), (RateSpec::new(5000, None), false, LimitOrigin::Vip));
    assert_eq!(list.vips[1].effective, list.default, "a VIP without limits of its own has the default's");
    // The maps carry it.
    let vip_id = f.core.reconciler.vip_id(&vip(VIP)).unwrap();
    assert_eq!(f.core.maps().limits[&Capacity::DEFAULT.default_limit_slot()].per_source.burst, 300);
    assert_eq!(f.core.maps().limits[&vip_id].vip_budget.per_s, 5000);

    f.ok(Request::ClearRateLimit { scope: Scope::Vip(vip(VIP)), part: LimitPart::PerSource });
    assert!(f.core.state().vip(&vip(VIP)).unwrap().limits.is_some(), "clearing what the VIP does not set keeps its budget");
    f.ok(Request::ClearRateLimit { scope: Scope::Vip(vip(VIP)), part: LimitPart::Budget });
    assert_eq!(f.core.state().vip(&vip(VIP)).unwrap().limits, None);
    f.ok(Request::ClearRateLimit { scope: Scope::Default, part: LimitPart::All });
    let Reply::RateLimits(list) = f.ok(Request::ListRateLimits) else { panic!() };
    assert!(list.default.per_source.is_none() && list.vips.iter().all(|v| v.effective.per_source.is_none()));
    assert_eq!(f.saved(), Some(f.core.state().clone()));
    assert_eq!(f.core.maps().limits[&Capacity::DEFAULT.default_limit_slot()].configured, 0);
}

#[test]
fn rules_are_listed_with_their_counters() {
    let mut f = Fixture::with_two_backends();
    f.ok(set_rule("192.0.2.0/24", None, RuleActionKind::Block, None));
    f.ok(Request::SetRule {
        cidr: "10.20.0.0/16".parse().unwrap(),
        vip: Some(vip(VIP)),
        action: RuleActionKind::Limit,
        per_s: Some(500),
        burst: Some(1000),
        observe: true,
    });
    let scoped = RuleMatch { cidr: "10.20.0.0/16".parse().unwrap(), vip: Some(vip(VIP)) };
    let id = f.core.reconciler.rule_id(&scoped).unwrap();
    f.core.maps.rule_state.insert(id, RuleState { bucket: Bucket { tat_ns: 1 }, hits: 40, dropped: 3, would_drop: 5 });
    let Reply::Rules(list) = f.ok(Request::ListRules) else { panic!() };
    let rows: Vec<_> =
        list.rules.iter().map(|r| (r.cidr.to_string(), r.vip, r.action, r.rate, r.observe, r.hits, r.dropped, r.would_drop)).collect();
    assert_eq!(
        rows,
        [
            ("10.20.0.0/16".to_owned(), Some(vip(VIP)), RuleActionKind::Limit, Some(RateSpec { per_s: 500, burst: 1000 }), true, 40, 3, 5),
            ("192.0.2.0/24".to_owned(), None, RuleActionKind::Block, None, false, 0, 0, 0),
        ]
    );
    f.ok(Request::RemoveRule { cidr: "10.20.0.0/16".parse().unwrap(), vip: Some(vip(VIP)) });
    assert_eq!(f.core.state().rules.len(), 1);
    assert_eq!(f.saved().unwrap().rules.len(), 1);
    // Removing the VIP takes its rules along; the global one stays.
    f.ok(set_rule("10.30.0.0/16", Some(vip(VIP)), RuleActionKind::Exempt, None));
    f.ok(Request::RemoveVip { vip: vip(VIP), force: true });
    let left: Vec<String> = f.core.state().rules.keys().map(ToString::to_string).collect();
    assert_eq!(left, ["192.0.2.0/24"]);
    assert_eq!(f.core.maps().rules.len(), 1);
}

#[test]
fn refused_limit_and_rule_requests_name_the_problem_and_change_nothing() {
    let mut f = Fixture::with_two_backends();
    let unknown: Vip = "10.9.9.9:80/tcp".parse().unwrap();
    let v6: Vip = "[fd00::1]:0/udp".parse().unwrap();
    f.ok(plain_vip(v6, Some(13)));
    f.ok(set_rate(Scope::Default, 10));
    f.ok(set_rule("192.0.2.0/24", None, RuleActionKind::Block, None));
    let (state, maps, file) = (f.core.state().clone(), f.core.maps().clone(), f.file_bytes());
    let cases = [
        (set_rate(Scope::Vip(vip(VIP)), 0), "per_source: 0 new flows per second is out of range"),
        (set_rate(Scope::Vip(unknown), 5), "unknown VIP 10.9.9.9:80/tcp"),
        (Request::SetBudget { scope: Scope::Default, per_s: 0, burst: Some(4), observe: true }, "vip_budget: 0 new flows"),
        (
            Request::SetRateLimit {
                scope: Scope::Default,
                per_s: 1,
                burst: None,
                source_prefix_v4: Some(33),
                source_prefix_v6: None,
                observe: false,
            },
            "source_prefix_v4: prefix length 33 is out of range (1..=32)",
        ),
        (
            Request::SetRateLimit {
                scope: Scope::Default,
                per_s: 1,
                burst: None,
                source_prefix_v4: None,
                source_prefix_v6: Some(0),
                observe: false,
            },
            "source_prefix_v6: prefix length 0",
        ),
        (Request::ClearRateLimit { scope: Scope::Vip(unknown), part: LimitPart::All }, "unknown VIP"),
        (set_rule("2001:db8::/32", Some(vip(VIP)), RuleActionKind::Block, None), "an IPv6 CIDR never matches clients of the IPv4 VIP"),
        (set_rule("10.0.0.0/8", Some(v6), RuleActionKind::Block, None), "an IPv4 CIDR never matches"),
        (set_rule("10.0.0.0/8", Some(unknown), RuleActionKind::Block, None), "unknown VIP"),
        (set_rule("10.0.0.0/8", None, RuleActionKind::Limit, Some(0)), "limit: 0 new flows"),
        (set_rule("10.0.0.0/8", None, RuleActionKind::Limit, None), "a limit needs a rate"),
        (set_rule("10.0.0.0/8", None, RuleActionKind::Block, Some(5)), "only a limit takes a rate"),
        (
            Request::SetRule {
                cidr: "10.0.0.0/8".parse().unwrap(),
                vip: None,
                action: RuleActionKind::Exempt,
                per_s: None,
                burst: Some(1),
                observe: false,
            },
            "only a limit takes a burst",
        ),
        (Request::RemoveRule { cidr: "10.0.0.0/8".parse().unwrap(), vip: None }, "no rule for 10.0.0.0/8 on every VIP"),
        (Request::RemoveRule { cidr: "192.0.2.0/24".parse().unwrap(), vip: Some(vip(VIP)) }, "no rule for 192.0.2.0/24 on VIP"),
        (Request::TopSources { vip: unknown, limit: None }, "unknown VIP"),
        (Request::TopSources { vip: vip(VIP), limit: Some(0) }, "limit must be at least 1"),
    ];
    assert_all_refused(&mut f, cases, (&state, &maps, &file));
}

#[test]
fn a_failed_rule_write_rolls_back() {
    let mut f = Fixture::with_two_backends();
    f.ok(set_rule("192.0.2.0/24", None, RuleActionKind::Block, None));
    let (state, file) = (f.core.state().clone(), f.file_bytes());
    f.core.maps.fail_next_rule = true;
    let err = f.core.handle(set_rule("198.51.100.0/24", Some(vip(VIP)), RuleActionKind::Exempt, None)).unwrap_err();
    assert!(matches!(err, CoreError::Apply(_)), "{err:?}");
    assert_eq!(f.core.state(), &state);
    assert_eq!(f.file_bytes(), file);
    assert_eq!(f.core.maps().rules.len(), 1);
    f.ok(set_rule("198.51.100.0/24", Some(vip(VIP)), RuleActionKind::Exempt, None));
    assert_eq!(f.core.maps().rules.len(), 2);
}

#[test]
fn top_sources_sort_by_dropped_then_admitted_with_the_configured_prefix() {
    let mut f = Fixture::with_two_backends();
    f.ok(Request::SetRateLimit {
        scope: Scope::Vip(vip(VIP)),
        per_s: 10,
        burst: None,
        source_prefix_v4: Some(24),
        source_prefix_v6: Some(48),
        observe: false,
    });
    let id = f.core.reconciler.vip_id(&vip(VIP)).unwrap();
    let v4 = |a: [u8; 4]| ([u32::from_ne_bytes(a), 0, 0, 0], 4);
    let v6 = spillway_common::addr::to_words("2001:db8:1::".parse().unwrap());
    for ((prefix, family), admitted, dropped, vip_id) in [
        (v4([10, 0, 1, 0]), 5, 0, id),
        (v4([10, 0, 2, 0]), 1, 9, id),
        (v4([10, 0, 3, 0]), 7, 9, id),
        (v6, 100, 2, id),
        (v4([10, 0, 4, 0]), 1000, 1000, id + 1),
    ] {
        let key = SourceKey { vip_id, family, _pad: [0; 3], prefix };
        f.core.maps.sources.insert(key, SourceState { bucket: Bucket::default(), admitted, dropped });
    }
    let Reply::TopSources(top) = f.ok(Request::TopSources { vip: vip(VIP), limit: Some(3) }) else { panic!() };
    assert_eq!((top.vip, top.tracked), (vip(VIP), 4));
    let rows: Vec<(String, u64, u64)> = top.sources.iter().map(|s| (s.prefix.to_string(), s.admitted, s.dropped)).collect();
    assert_eq!(rows, [("10.0.3.0/24".to_owned(), 7, 9), ("10.0.2.0/24".to_owned(), 1, 9), ("2001:db8:1::/48".to_owned(), 100, 2)]);
    let Reply::TopSources(all) = f.ok(Request::TopSources { vip: vip(VIP), limit: None }) else { panic!() };
    assert_eq!(all.sources.len(), 4);

    // Under the per-source limit the counts are exact, but for the sources a rule matches
    // (the data path samples those): one inside 10.0.2.0/24, one on 10.0.3.0/24 and one
    // holding no source.
    let estimated = |f: &mut Fixture| {
        let Reply::TopSources(top) = f.ok(Request::TopSources { vip: vip(VIP), limit: None }) else { panic!() };
        top.sources.iter().filter(|s| s.estimated).map(|s| s.prefix.to_string()).collect::<Vec<_>>()
    };
    assert!(estimated(&mut f).is_empty());
    f.ok(set_rule("10.0.2.128/25", Some(vip(VIP)), RuleActionKind::Block, None));
    f.ok(set_rule("10.0.3.0/24", None, RuleActionKind::Exempt, None));
    f.ok(set_rule("10.0.8.0/24", None, RuleActionKind::Block, None));
    assert_eq!(estimated(&mut f), ["10.0.3.0/24", "10.0.2.0/24"]);
    // Without a per-source limit every count is a sample's.
    f.ok(Request::ClearRateLimit { scope: Scope::Vip(vip(VIP)), part: LimitPart::All });
    assert_eq!(estimated(&mut f).len(), 4);
}

#[test]
fn stats_carry_the_observed_counters() {
    let mut f = Fixture::with_two_backends();
    let Reply::Stats(stats) = f.ok(Request::Stats) else { panic!() };
    let labels: Vec<&str> = stats.observed.iter().map(|o| o.reason.as_str()).collect();
    assert_eq!(labels, spillway_common::types::Observed::ALL.iter().map(|o| o.label()).collect::<Vec<_>>());
    assert_eq!(stats.observed[1].packets, 11);
}

/// Every request is refused as invalid with a message containing its expected text, and
/// nothing changes: state, maps and the state file stay as `before`.
fn assert_all_refused<'a>(
    f: &mut Fixture,
    cases: impl IntoIterator<Item = (Request, &'a str)>,
    before: (&DesiredState, &FakeMaps, &Option<Vec<u8>>),
) {
    for (request, expected) in cases {
        let err = f.core.handle(request.clone()).expect_err(&format!("{request:?} accepted"));
        let api = err.to_api();
        assert_eq!(api.kind, ErrorKind::Invalid, "{request:?}");
        assert!(api.message.contains(expected), "{request:?}: {:?} lacks {expected:?}", api.message);
    }
    assert_eq!(f.core.state(), before.0);
    assert_eq!(f.core.maps(), before.1);
    assert_eq!(&f.file_bytes(), before.2);
}

#[test]
fn the_last_active_backend_is_drained_only_when_forced() {
    let mut f = Fixture::with_two_backends();
    let drain = |backend: &str, force| Request::DrainBackend { vip: vip(VIP), backend: ip(backend), deadline_s: None, force };
    f.ok(drain("10.0.0.2", false));
    let before = (f.core.state().clone(), f.saved());
    let err = f.core.handle(drain("10.0.0.1", false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "backend 10.0.0.1 is the last active backend of VIP 10.100.0.1:80/tcp: drained, there is nowhere else for new \
         flows, and new connections to the VIP fail (drop_no_backend); add or undrain another backend first, or drain \
         with --force"
    );
    assert_eq!(err.to_api().kind, ErrorKind::Invalid);
    assert_eq!((f.core.state().clone(), f.saved()), before);
    // Draining one that is drained already changes nothing and needs nothing.
    f.ok(drain("10.0.0.2", false));
    f.ok(drain("10.0.0.1", true));
    assert_eq!(f.backends()[0], (ip("10.0.0.1"), 0, BackendState::Draining));
}

#[test]
fn what_the_host_cannot_serve_is_refused_and_changes_nothing() {
    let mut f = Fixture::with_two_backends();
    f.core.set_info(DaemonInfo {
        host: Host { addresses: vec![("eth0".into(), ip("10.77.0.2"))], outer_v4: true, outer_v6: false, iface: "eth0".into() },
        ..DaemonInfo::default()
    });
    let own: Vip = "10.77.0.2:22/tcp".parse().unwrap();
    let before = (f.core.state().clone(), f.saved(), f.core.maps().vips.clone());
    let err = f.core.handle(plain_vip(own, None)).unwrap_err();
    assert!(err.to_string().starts_with("VIP 10.77.0.2:22/tcp: 10.77.0.2 is an address of this balancer (eth0)"), "{err}");
    assert!(err.to_string().ends_with("add it with lbctl vips add --force (in a file: allow_local_address = true)"), "{err}");
    let err = f.core.handle(Request::AddBackend { vip: vip(VIP), backend: ip("fd00::5"), weight: None, options: Default::default() });
    let err = err.unwrap_err().to_string();
    assert!(err.starts_with("backend fd00::5 of VIP 10.100.0.1:80/tcp: no IPv6 outer source is configured"), "{err}");
    // The file gets the same guards, on the field they are about.
    let file = |extra: &str| {
        let text = format!("[[vips]]\nvip = \"10.100.0.1:80/tcp\"\nring_size = 251\n[[vips.backends]]\naddress = \"10.0.0.1\"\n{extra}");
        Request::Apply { config: text, source: "f.toml".into(), dry_run: false, allow_vip_removal: true, allow_backend_removal: false }
    };
    let err = f.core.handle(file("[[vips.backends]]\naddress = \"fd00::5\"\n")).unwrap_err().to_string();
    assert!(err.starts_with("f.toml:7:11: vips[0].backends[1].address: backend fd00::5 of VIP"), "{err}");
    let err = f.core.handle(file("[[vips]]\nvip = \"10.77.0.2:22/tcp\"\n")).unwrap_err().to_string();
    assert!(err.starts_with("f.toml:7:7: vips[1].vip: VIP 10.77.0.2:22/tcp: 10.77.0.2 is an address"), "{err}");
    assert_eq!((f.core.state().clone(), f.saved(), f.core.maps().vips.clone()), before);
    // Forced, the VIP is kept as allowed: an export applies again as it is.
    f.ok(Request::AddVip {
        vip: own,
        ring_size: None,
        force: true,
        quic: None,
        encap: Encap::Ipip,
        hash: HashMode::FiveTuple,
        source_prefix: None,
    });
    let Reply::Exported(exported) = f.ok(Request::Export) else { panic!() };
    assert!(exported.config.contains("allow_local_address = true"), "{}", exported.config);
    f.ok(Request::RemoveVip { vip: own, force: false });
    f.ok(Request::Apply {
        config: exported.config,
        source: "export".into(),
        dry_run: false,
        allow_vip_removal: false,
        allow_backend_removal: false,
    });
    assert!(f.core.state().vips[&own].allow_local_address);
}
