//! The reconciler against the in-memory model of the maps (`testing::FakeMaps`), which
//! also checks the ordering guarantees on every write.

use std::collections::HashMap;

use spillway_common::limits::MAX_RING_SIZE;

use super::*;
use crate::{model::DEFAULT_WEIGHT, testing::FakeMaps};

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
    for id in maps.active_table(&vip_key(&vip())) {
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
    let three = maps.active_table(&vip_key(&vip()));
    // The other half is unknown until the first flip, so this change writes it fully.
    assert_eq!(r.apply(&mut maps, &set(4)).unwrap().slots_written, 4099);
    // From now on only slots that differ from the inactive half's contents are written.
    let report = r.apply(&mut maps, &set(5)).unwrap();
    let five = maps.active_table(&vip_key(&vip()));
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

#[test]
fn vip_filter_holds_exactly_the_vip_addresses() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    let (word, bit) = spillway_common::hash::vip_filter_slot(&to_words(vip().addr).0);
    assert_eq!(maps.filter.iter().map(|w| w.count_ones()).sum::<u32>(), 1);
    assert_eq!(maps.filter[word as usize], bit);
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    assert!(maps.filter.iter().all(|&w| w == 0));
}

#[test]
fn reused_ids_start_with_zeroed_counters() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    let be = r.backend_id(&vip(), &"10.0.0.101".parse().unwrap()).unwrap();
    let old = spillway_common::types::Traffic { packets: 5, bytes: 500 };
    maps.vip_traffic.insert(0, old);
    maps.backend_traffic.insert(be, old);
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.102", 100)])).unwrap();
    assert_eq!(r.backend_id(&vip(), &"10.0.0.102".parse().unwrap()), Some(be));
    assert!(maps.vip_traffic.is_empty() && maps.backend_traffic.is_empty());
}
