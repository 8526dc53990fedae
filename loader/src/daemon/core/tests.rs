//! The API's behaviour against in-memory maps and a real state file.

use std::fs;

use spillway_common::{limits::MAX_BACKENDS_PER_VIP, types::Reason};

use super::*;
use crate::{
    model::Vip,
    store::StateFile,
    testing::{FakeMaps, TempDir},
};

fn vip() -> Vip {
    "10.100.0.1:80/tcp".parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

struct Fixture {
    core: Core<FakeMaps, StateFile>,
    tmp: TempDir,
}

impl Fixture {
    fn new() -> Self {
        let tmp = TempDir::new("core");
        let store = StateFile::open(tmp.path()).unwrap();
        let (core, _) = Core::start(FakeMaps::default(), store, DesiredState::default()).unwrap();
        Self { core, tmp }
    }

    fn ok(&mut self, request: Request) -> Reply {
        self.core.handle(request.clone()).unwrap_or_else(|e| panic!("{request:?}: {e}"))
    }

    fn saved(&self) -> Option<DesiredState> {
        StateFile::open(self.tmp.path()).unwrap().load().unwrap()
    }

    fn file_bytes(&self) -> Option<Vec<u8>> {
        fs::read(self.tmp.path().join(crate::store::STATE_FILE)).ok()
    }

    fn with_two_backends() -> Self {
        let mut f = Self::new();
        f.ok(Request::AddVip { vip: vip(), ring_size: Some(251) });
        f.ok(Request::AddBackend { vip: vip(), backend: ip("10.0.0.1"), weight: None });
        f.ok(Request::AddBackend { vip: vip(), backend: ip("10.0.0.2"), weight: Some(50) });
        f
    }

    fn backends(&mut self) -> Vec<(IpAddr, u32, BackendState)> {
        match self.ok(Request::ListBackends { vip: vip() }) {
            Reply::Backends(list) => list.backends.into_iter().map(|b| (b.address, b.weight, b.state)).collect(),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn mutations_apply_persist_and_list() {
    let mut f = Fixture::new();
    let reply = f.ok(Request::AddVip { vip: vip(), ring_size: Some(251) });
    assert_eq!(reply, Reply::Done { slots_written: 251, tables_flipped: 1 });
    f.ok(Request::AddBackend { vip: vip(), backend: ip("10.0.0.1"), weight: None });
    f.ok(Request::AddBackend { vip: vip(), backend: ip("10.0.0.2"), weight: Some(50) });
    assert_eq!(f.ok(Request::ListVips), Reply::Vips(VipList { vips: vec![VipEntry { vip: vip(), ring_size: 251, backends: 2 }] }));
    assert_eq!(f.backends(), [(ip("10.0.0.1"), DEFAULT_WEIGHT, BackendState::Active), (ip("10.0.0.2"), 50, BackendState::Active)]);
    assert_eq!(f.saved().as_ref(), Some(f.core.state()));

    f.ok(Request::DrainBackend { vip: vip(), backend: ip("10.0.0.2") });
    assert_eq!(f.backends()[1], (ip("10.0.0.2"), 0, BackendState::Draining));
    f.ok(Request::SetWeight { vip: vip(), backend: ip("10.0.0.2"), weight: 7 });
    assert_eq!(f.backends()[1], (ip("10.0.0.2"), 7, BackendState::Active));
    f.ok(Request::RemoveBackend { vip: vip(), backend: ip("10.0.0.1") });
    assert_eq!(f.backends(), [(ip("10.0.0.2"), 7, BackendState::Active)]);
    f.ok(Request::RemoveVip { vip: vip() });
    assert_eq!(f.ok(Request::ListVips), Reply::Vips(VipList { vips: vec![] }));
    assert_eq!(f.saved(), Some(DesiredState::default()));
    assert!(f.core.maps().vips.is_empty());
}

#[test]
fn refused_requests_name_the_problem_and_change_nothing() {
    let mut f = Fixture::with_two_backends();
    let unknown: Vip = "10.9.9.9:80/tcp".parse().unwrap();
    let v6: Vip = "[fd00::1]:0/udp".parse().unwrap();
    f.ok(Request::AddVip { vip: v6, ring_size: None });
    let (state, maps, file) = (f.core.state().clone(), f.core.maps().clone(), f.file_bytes());
    let cases = [
        (Request::AddVip { vip: vip(), ring_size: None }, "already exists"),
        (Request::AddVip { vip: unknown, ring_size: Some(100) }, "ring size 100"),
        (Request::RemoveVip { vip: unknown }, "unknown VIP 10.9.9.9:80/tcp"),
        (Request::ListBackends { vip: unknown }, "unknown VIP"),
        (Request::AddBackend { vip: unknown, backend: ip("10.0.0.3"), weight: None }, "unknown VIP"),
        (Request::AddBackend { vip: vip(), backend: ip("10.0.0.1"), weight: None }, "backend 10.0.0.1 already exists"),
        (Request::AddBackend { vip: vip(), backend: ip("10.0.0.3"), weight: Some(0) }, "weight 0 is out of range"),
        (Request::AddBackend { vip: vip(), backend: ip("10.0.0.3"), weight: Some(MAX_WEIGHT + 1) }, "out of range"),
        (Request::AddBackend { vip: vip(), backend: ip("0.0.0.0"), weight: None }, "not usable"),
        (Request::AddBackend { vip: v6, backend: ip("10.0.0.3"), weight: None }, "needs an IPv6 backend"),
        (Request::RemoveBackend { vip: vip(), backend: ip("10.0.0.9") }, "backend 10.0.0.9 is not in VIP"),
        (Request::DrainBackend { vip: vip(), backend: ip("10.0.0.9") }, "is not in VIP"),
        (Request::SetWeight { vip: vip(), backend: ip("10.0.0.1"), weight: 0 }, "out of range"),
    ];
    for (request, expected) in cases {
        let err = f.core.handle(request.clone()).expect_err(&format!("{request:?} accepted"));
        let api = err.to_api();
        assert_eq!(api.kind, ErrorKind::Invalid, "{request:?}");
        assert!(api.message.contains(expected), "{request:?}: {:?} lacks {expected:?}", api.message);
    }
    assert_eq!(f.core.state(), &state);
    assert_eq!(f.core.maps(), &maps);
    assert_eq!(f.file_bytes(), file);
}

#[test]
fn too_many_backends_in_a_vip_is_refused() {
    let tmp = TempDir::new("core-full");
    let mut state = DesiredState::default();
    state.add_vip(vip(), 65537).unwrap();
    for i in 0..MAX_BACKENDS_PER_VIP {
        state.add_backend(&vip(), IpAddr::from([10, 1, (i >> 8) as u8, i as u8]), 1).unwrap();
    }
    let (mut core, _) = Core::start(FakeMaps::default(), StateFile::open(tmp.path()).unwrap(), state).unwrap();
    let err = core.handle(Request::AddBackend { vip: vip(), backend: ip("10.2.0.1"), weight: None }).unwrap_err();
    assert!(err.to_string().contains("too many backends"), "{err}");
}

#[test]
fn failed_apply_rolls_the_maps_back() {
    let mut f = Fixture::with_two_backends();
    let (state, file) = (f.core.state().clone(), f.file_bytes());
    let active = f.core.maps().vips.clone();
    f.core.maps.fail_next_write = true;
    let err = f.core.handle(Request::AddBackend { vip: vip(), backend: ip("10.0.0.3"), weight: None }).unwrap_err();
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
    f.ok(Request::AddBackend { vip: vip(), backend: ip("10.0.0.3"), weight: None });
    assert_eq!(f.backends().len(), 3);
}

struct BrokenStore;

impl Store for BrokenStore {
    fn save(&mut self, _: &DesiredState) -> Result<(), StoreError> {
        Err(StoreError::Write { path: "/nowhere/state.json".into(), source: std::io::ErrorKind::StorageFull.into() })
    }
}

#[test]
fn failed_persist_rolls_the_maps_back() {
    let (mut core, _) = Core::start(FakeMaps::default(), BrokenStore, DesiredState::default()).unwrap();
    let err = core.handle(Request::AddVip { vip: vip(), ring_size: Some(13) }).unwrap_err();
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
    let (_, report) = Core::start(maps, StateFile::open(f.tmp.path()).unwrap(), state).unwrap();
    assert_eq!(report, ApplyReport::default());
    f.ok(Request::DrainBackend { vip: vip(), backend: ip("10.0.0.2") });
    let again = f.ok(Request::DrainBackend { vip: vip(), backend: ip("10.0.0.2") });
    assert_eq!(again, Reply::Done { slots_written: 0, tables_flipped: 0 });
}

#[test]
fn stats_follow_the_reconciler_ids() {
    let mut f = Fixture::with_two_backends();
    let vip_id = f.core.reconciler.vip_id(&vip()).unwrap();
    let be_id = f.core.reconciler.backend_id(&vip(), &ip("10.0.0.2")).unwrap();
    f.core.maps.vip_traffic.insert(vip_id, Traffic { packets: 3, bytes: 300 });
    f.core.maps.backend_traffic.insert(be_id, Traffic { packets: 2, bytes: 200 });
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
    f.ok(Request::AddVip { vip: v6, ring_size: Some(13) });
    f.ok(Request::AddBackend { vip: v6, backend: ip("fd00::2"), weight: None });
    f.ok(Request::DrainBackend { vip: vip(), backend: ip("10.0.0.1") });
    let addrs: Vec<IpAddr> = f.core.backend_addrs().into_iter().collect();
    assert_eq!(addrs, [ip("10.0.0.1"), ip("10.0.0.2"), ip("fd00::2")]);
}
