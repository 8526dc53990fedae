//! The reconciler against an in-memory model of the maps, which also checks the ordering
//! guarantees on every write.

use std::collections::HashMap;

use spillway_common::{limits::MAX_RING_SIZE, maglev::EMPTY_SLOT};

use super::*;
use crate::model::DEFAULT_WEIGHT;

#[derive(Default)]
struct FakeMaps {
    vips: HashMap<VipKey, VipMeta>,
    addrs: Vec<AddrKey>,
    rings: HashMap<u32, u32>,
    backends: HashMap<u32, BackendInfo>,
    slot_writes: usize,
}

impl FakeMaps {
    fn active_table(&self, vip: &Vip) -> Vec<u32> {
        let meta = self.vips[&vip_key(vip)];
        self.read_ring(meta.id, meta.active_half, meta.ring_size).unwrap()
    }

    /// Every slot any VIP's active table names is an active backend of that VIP.
    fn assert_consistent(&self) {
        for meta in self.vips.values() {
            for id in self.read_ring(meta.id, meta.active_half, meta.ring_size).unwrap() {
                if id != EMPTY_SLOT {
                    let b = self.backends[&id];
                    assert_eq!((b.state, b.vip_id), (BACKEND_ACTIVE, meta.id), "slot names backend {id}");
                }
            }
        }
    }
}

impl Maps for FakeMaps {
    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, DataplaneError> {
        Ok(self.vips.iter().map(|(k, v)| (*k, *v)).collect())
    }
    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        self.vips.insert(*key, *meta);
        self.assert_consistent();
        Ok(())
    }
    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError> {
        self.vips.remove(key);
        Ok(())
    }
    fn vip_addrs(&self) -> Result<Vec<AddrKey>, DataplaneError> {
        Ok(self.addrs.clone())
    }
    fn set_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        self.addrs.push(*key);
        Ok(())
    }
    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        self.addrs.retain(|k| k != key);
        Ok(())
    }
    fn write_slots(&mut self, vip_id: u32, half: u32, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        // Writing the half packets read would expose a half-written table.
        assert!(!self.vips.values().any(|m| m.id == vip_id && m.active_half == half), "wrote the active table");
        let mut n = 0;
        for (slot, owner) in slots {
            self.rings.insert(VipMeta::ring_base(vip_id, half) + slot, owner);
            n += 1;
        }
        self.slot_writes += n;
        Ok(n)
    }
    fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError> {
        let base = VipMeta::ring_base(vip_id, half);
        Ok((base..base + size).map(|i| self.rings.get(&i).copied().unwrap_or(0)).collect())
    }
    fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        Ok(self.backends.get(&id).copied().unwrap_or_default())
    }
    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        self.backends.insert(id, *info);
        if info.state == BACKEND_FREE {
            self.assert_consistent();
        }
        Ok(())
    }
}

fn vip() -> Vip {
    "10.100.0.1:80/tcp".parse().unwrap()
}

fn state(backends: &[(&str, u32)]) -> DesiredState {
    let mut s = DesiredState::default();
    s.add_vip(vip(), 4099).unwrap();
    for (addr, weight) in backends {
        s.add_backend(&vip(), addr.parse().unwrap(), *weight).unwrap();
    }
    s
}

fn owners(maps: &FakeMaps) -> HashMap<u32, usize> {
    let mut c = HashMap::new();
    for id in maps.active_table(&vip()) {
        *c.entry(id).or_default() += 1;
    }
    c
}

#[test]
fn new_vip_gets_full_table_and_flips_once() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let report = r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    assert_eq!(report, ApplyReport { slots_written: 4099, tables_flipped: 1 });
    assert_eq!(owners(&maps).len(), 2);
    assert_eq!(maps.addrs.len(), 1);
}

#[test]
fn same_state_again_writes_nothing() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let s = state(&[("10.0.0.101", 100)]);
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(r.apply(&mut maps, &s).unwrap(), ApplyReport::default());
}

#[test]
fn changes_write_only_slots_that_differ_from_the_inactive_table() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let b = ["10.0.0.101", "10.0.0.102", "10.0.0.103", "10.0.0.104", "10.0.0.105"];
    let set = |n: usize| state(&b[..n].iter().map(|a| (*a, 100)).collect::<Vec<_>>());
    r.apply(&mut maps, &set(3)).unwrap(); // half 0: the 3-backend table
    let three = maps.active_table(&vip());
    // The other half is unknown until the first flip, so this change writes it fully.
    assert_eq!(r.apply(&mut maps, &set(4)).unwrap().slots_written, 4099);
    // From now on only slots that differ from the inactive half's contents are written.
    let report = r.apply(&mut maps, &set(5)).unwrap();
    let five = maps.active_table(&vip());
    let differing = three.iter().zip(&five).filter(|(a, b)| a != b).count();
    assert_eq!(report, ApplyReport { slots_written: differing, tables_flipped: 1 });
    assert!(differing < 4099 / 2, "{differing} slots changed for two added backends");
    // The inactive half still holds the 4-backend table: going back is a flip, no writes.
    assert_eq!(r.apply(&mut maps, &set(4)).unwrap(), ApplyReport { slots_written: 0, tables_flipped: 1 });
}

#[test]
fn draining_backend_keeps_its_id_but_owns_no_slots() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    let id = r.backend_id(&vip(), &"10.0.0.102".parse().unwrap()).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 0)])).unwrap();
    assert_eq!(r.backend_id(&vip(), &"10.0.0.102".parse().unwrap()), Some(id));
    assert_eq!(maps.backends[&id].state, BACKEND_ACTIVE);
    assert!(!owners(&maps).contains_key(&id));
}

#[test]
fn removed_backend_is_freed_with_a_new_generation() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    let id = r.backend_id(&vip(), &"10.0.0.102".parse().unwrap()).unwrap();
    let generation = maps.backends[&id].generation;
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    assert_eq!(maps.backends[&id].state, BACKEND_FREE);
    assert_eq!(maps.backends[&id].generation, generation + 1);
    // Re-adding reuses the id with the bumped generation: old flows re-hash.
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.103", 100)])).unwrap();
    let reused = r.backend_id(&vip(), &"10.0.0.103".parse().unwrap()).unwrap();
    assert_eq!(reused, id);
    assert_eq!(maps.backends[&id].generation, generation + 1);
}

#[test]
fn removing_a_vip_frees_everything() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", DEFAULT_WEIGHT)])).unwrap();
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    assert!(maps.vips.is_empty());
    assert!(maps.addrs.is_empty());
    assert!(maps.backends.values().all(|b| b.state == BACKEND_FREE));
}

#[test]
fn adopting_existing_maps_writes_nothing_for_the_same_state() {
    let mut maps = FakeMaps::default();
    let s = state(&[("10.0.0.101", 100), ("fd00::102", 50)]);
    Reconciler::adopt(&maps).unwrap().apply(&mut maps, &s).unwrap();
    let mut restarted = Reconciler::adopt(&maps).unwrap();
    assert_eq!(restarted.apply(&mut maps, &s).unwrap(), ApplyReport::default());
    // And it can still change things afterwards.
    let report = restarted.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    assert_eq!(report.tables_flipped, 1);
}

#[test]
fn ring_size_change_flips_to_a_full_table_of_the_new_size() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    let mut bigger = state(&[("10.0.0.101", 100)]);
    bigger.vips.get_mut(&vip()).unwrap().ring_size = MAX_RING_SIZE;
    let report = r.apply(&mut maps, &bigger).unwrap();
    assert_eq!(report.slots_written, MAX_RING_SIZE as usize);
    assert_eq!(maps.vips[&vip_key(&vip())].ring_size, MAX_RING_SIZE);
}

#[test]
fn orphaned_backends_are_freed() {
    let mut maps = FakeMaps::default();
    maps.backends.insert(7, BackendInfo { state: BACKEND_ACTIVE, family: 4, vip_id: 9, addr: [1, 0, 0, 0], ..Default::default() });
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    assert_eq!(maps.backends[&7].state, BACKEND_FREE);
}
