//! The reconciler against the in-memory model of the maps (`testing::FakeMaps`), which
//! also checks the ordering guarantees on every write.

use std::collections::HashMap;

use spillway_common::limits::MAX_RING_SIZE;

use super::*;
use crate::testing::FakeMaps;
use spillway_model::testing::{VIP, vip};
use spillway_model::{BackendOptions, DEFAULT_WEIGHT, Encap};

fn state(backends: &[(&str, u32)]) -> DesiredState {
    let mut s = DesiredState::default();
    s.add_vip(vip(VIP), 4099).unwrap();
    for (addr, weight) in backends {
        s.add_backend(&vip(VIP), addr.parse().unwrap(), *weight).unwrap();
    }
    s
}

fn owners(maps: &FakeMaps) -> HashMap<u32, usize> {
    let mut c = HashMap::new();
    for id in maps.active_table(&vip_key(&vip(VIP))) {
        *c.entry(id).or_default() += 1;
    }
    c
}

#[test]
fn new_vip_gets_full_table_and_flips_once() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let report = r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    assert_eq!(report, ApplyReport { slots_written: 4099, tables_flipped: 1, ..Default::default() });
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
    let three = maps.active_table(&vip_key(&vip(VIP)));
    // The other half is unknown until the first flip, so this change writes it fully.
    assert_eq!(r.apply(&mut maps, &set(4)).unwrap().slots_written, 4099);
    // From now on only slots that differ from the inactive half's contents are written.
    let report = r.apply(&mut maps, &set(5)).unwrap();
    let five = maps.active_table(&vip_key(&vip(VIP)));
    let differing = three.iter().zip(&five).filter(|(a, b)| a != b).count();
    assert_eq!(report, ApplyReport { slots_written: differing, tables_flipped: 1, ..Default::default() });
    assert!(differing < 4099 / 2, "{differing} slots changed for two added backends");
    // The inactive half still holds the 4-backend table: going back is a flip, no writes.
    assert_eq!(r.apply(&mut maps, &set(4)).unwrap(), ApplyReport { slots_written: 0, tables_flipped: 1, ..Default::default() });
}

#[test]
fn draining_backend_keeps_its_id_but_owns_no_slots() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    let id = r.backend_id(&vip(VIP), &"10.0.0.102".parse().unwrap()).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 0)])).unwrap();
    assert_eq!(r.backend_id(&vip(VIP), &"10.0.0.102".parse().unwrap()), Some(id));
    assert_eq!(maps.backends[&id].state, BACKEND_ACTIVE);
    assert!(!owners(&maps).contains_key(&id));
}

#[test]
fn removed_backend_is_freed_with_a_new_generation() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    let id = r.backend_id(&vip(VIP), &"10.0.0.102".parse().unwrap()).unwrap();
    let generation = maps.backends[&id].generation;
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    assert_eq!(maps.backends[&id].state, BACKEND_FREE);
    assert_eq!(maps.backends[&id].generation, generation + 1);
    // Re-adding reuses the id with the bumped generation: old flows re-hash.
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.103", 100)])).unwrap();
    let reused = r.backend_id(&vip(VIP), &"10.0.0.103".parse().unwrap()).unwrap();
    assert_eq!(reused, id);
    assert_eq!(maps.backends[&id].generation, generation + 1);
}

/// The flags of the one VIP address in the maps.
fn addr_flags(maps: &FakeMaps) -> u32 {
    assert_eq!(maps.addrs.len(), 1, "one VIP address");
    maps.addrs[0].1
}

#[test]
fn an_address_answers_echo_requests_only_while_a_backend_takes_new_flows() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let serving = ADDR_F_VIP | ADDR_F_ECHO;
    // No backend yet, then one, then drained (weight 0, as health ejection programs it),
    // back, removed, and another VIP at the same address with a backend.
    for (backends, want) in [
        (&[][..], ADDR_F_VIP),
        (&[("10.0.0.101", 100)][..], serving),
        (&[("10.0.0.101", 0)][..], ADDR_F_VIP),
        (&[("10.0.0.101", 100), ("10.0.0.102", 0)][..], serving),
        (&[("10.0.0.102", 0)][..], ADDR_F_VIP),
    ] {
        r.apply(&mut maps, &state(backends)).unwrap();
        assert_eq!(addr_flags(&maps), want, "backends {backends:?}");
    }
    let mut two = state(&[("10.0.0.102", 0)]);
    let other = Vip { port: 443, ..vip(VIP) };
    two.add_vip(other, 4099).unwrap();
    two.add_backend(&other, "10.0.0.103".parse().unwrap(), 100).unwrap();
    r.apply(&mut maps, &two).unwrap();
    assert_eq!(addr_flags(&maps), serving, "another VIP at the address serves");
    // Adopted by a restarted lbd with the same state: the flags are right, nothing written.
    let mut adopted = Reconciler::adopt(&maps).unwrap();
    let before = maps.addrs.clone();
    adopted.apply(&mut maps, &two).unwrap();
    assert_eq!(maps.addrs, before);
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
fn each_backend_entry_carries_its_encap_and_a_restart_rewrites_none() {
    use spillway_common::types::{ENCAP_GUE, ENCAP_IPIP};
    use spillway_model::{BackendOptions, Encap};
    let mut maps = FakeMaps::default();
    let mut s = state(&[("10.0.0.101", 100), ("10.0.0.102", 100)]);
    s.set_encap(&vip(VIP), Encap::Gue).unwrap();
    let ipip = BackendOptions { encap: Some(Encap::Ipip), ..BackendOptions::default() };
    s.set_backend_options(&vip(VIP), "10.0.0.102".parse().unwrap(), ipip).unwrap();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let encap_of =
        |maps: &FakeMaps, r: &Reconciler, addr: &str| maps.backends[&r.backend_id(&vip(VIP), &addr.parse().unwrap()).unwrap()].encap;
    assert_eq!((encap_of(&maps, &r, "10.0.0.101"), encap_of(&maps, &r, "10.0.0.102")), (ENCAP_GUE, ENCAP_IPIP));
    // A restarted lbd adopts the entries as they are: nothing to write.
    let writes = maps.backend_writes;
    let mut restarted = Reconciler::adopt(&maps).unwrap();
    assert_eq!(restarted.apply(&mut maps, &s).unwrap(), ApplyReport::default());
    assert_eq!(maps.backend_writes, writes, "a restart rewrote backend entries");
    // The VIP's change reaches the backend that takes the VIP's, not the one with its own.
    s.set_encap(&vip(VIP), Encap::Ipip).unwrap();
    restarted.apply(&mut maps, &s).unwrap();
    assert_eq!(encap_of(&maps, &restarted, "10.0.0.101"), ENCAP_IPIP);
    s.set_backend_options(&vip(VIP), "10.0.0.102".parse().unwrap(), BackendOptions { encap: Some(Encap::Gue), ..Default::default() })
        .unwrap();
    restarted.apply(&mut maps, &s).unwrap();
    assert_eq!(encap_of(&maps, &restarted, "10.0.0.102"), ENCAP_GUE);
}

#[test]
fn ring_size_change_flips_to_a_full_table_of_the_new_size() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    let mut bigger = state(&[("10.0.0.101", 100)]);
    bigger.vips.get_mut(&vip(VIP)).unwrap().ring_size = MAX_RING_SIZE;
    let report = r.apply(&mut maps, &bigger).unwrap();
    assert_eq!(report.slots_written, MAX_RING_SIZE as usize);
    assert_eq!(maps.vips[&vip_key(&vip(VIP))].active.size, MAX_RING_SIZE);
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
    let (word, bit) = spillway_common::hash::vip_filter_slot(spillway_common::hash::vip_addr_hash(&to_words(vip(VIP).addr).0));
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
    let be = r.backend_id(&vip(VIP), &"10.0.0.101".parse().unwrap()).unwrap();
    let old = spillway_common::types::Traffic { packets: 5, bytes: 500, new_flows: 2 };
    maps.vip_traffic.insert(0, old);
    maps.backend_traffic.insert(be, old);
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.102", 100)])).unwrap();
    assert_eq!(r.backend_id(&vip(VIP), &"10.0.0.102".parse().unwrap()), Some(be));
    assert!(maps.vip_traffic.is_empty() && maps.backend_traffic.is_empty());
}

// --- New-flow limits and rules ---

use spillway_common::{
    limits::{ANY_VIP, Capacity},
    types::{Bucket, FAMILY_V4, FAMILY_V6, RuleSlotKey, RuleState, SourceKey, SourceState},
};

use spillway_model::RateSpec;

fn vip2() -> Vip {
    vip("10.100.0.2:80/tcp")
}

fn rule(s: &str) -> RuleMatch {
    s.parse().unwrap()
}

fn block() -> RuleConfig {
    RuleConfig { action: RuleAction::Block, observe: false }
}

fn limit(per_s: u32) -> RuleConfig {
    RuleConfig { action: RuleAction::Limit(RateSpec::new(per_s, None)), observe: false }
}

fn two_vips() -> DesiredState {
    let mut s = state(&[("10.0.0.101", 100)]);
    s.add_vip(vip2(), 13).unwrap();
    s
}

fn slot(maps: &FakeMaps, slot: u32) -> Limits {
    maps.limits.get(&slot).copied().unwrap_or_default()
}

/// The index entry of `rule` (there must be exactly one with its CIDR and scope).
fn entry(maps: &FakeMaps, r: &Reconciler, m: &RuleMatch) -> (RuleSlotKey, RuleValue) {
    let vip_id = m.vip.map_or(ANY_VIP, |v| r.vip_id(&v).unwrap());
    let key = rule_key(&m.cidr, vip_id);
    (key, maps.rules[&key])
}

#[test]
fn limits_slots_hold_each_vips_effective_limits_and_the_default() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let mut s = two_vips();
    s.set_per_source(None, RateSpec::new(100, Some(200)), Some(24), None, true).unwrap();
    s.set_budget(Some(&vip(VIP)), RateSpec::new(5000, None), false).unwrap();
    let report = r.apply(&mut maps, &s).unwrap();
    assert_eq!(report.limits_written, 2, "the default slot and the one VIP with its own limits");
    let (a, b) = (r.vip_id(&vip(VIP)).unwrap(), r.vip_id(&vip2()).unwrap());
    assert_eq!(slot(&maps, Capacity::DEFAULT.default_limit_slot()), s.default_limits.unwrap().to_limits());
    // VIP a: its own budget, and the default per-source limit (which it does not override).
    let want = s.effective_limits(&vip(VIP)).unwrap().to_limits();
    assert_eq!(slot(&maps, a), want);
    assert_eq!((want.per_source.per_s, want.vip_budget.per_s, want.source_prefix_v4, want.configured), (100, 5000, 24, 1));
    // VIP b has none of its own: unconfigured, so the data path reads the default slot.
    assert_eq!(slot(&maps, b).configured, 0);

    assert_eq!(r.apply(&mut maps, &s).unwrap(), ApplyReport::default(), "the same state writes nothing");
    // A new default rewrites the default slot and the VIPs that inherit a part of it.
    s.set_per_source(None, RateSpec::new(50, None), None, None, false).unwrap();
    let writes = maps.limit_writes;
    assert_eq!(r.apply(&mut maps, &s).unwrap().limits_written, 2);
    assert_eq!(maps.limit_writes, writes + 2);
    assert_eq!(slot(&maps, a).per_source.per_s, 50);
    // Clearing a VIP's own limits unconfigures its slot.
    s.clear_limits(Some(&vip(VIP))).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(slot(&maps, a), Limits::default());
    s.clear_limits(None).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(slot(&maps, Capacity::DEFAULT.default_limit_slot()), Limits::default());
}

#[test]
fn a_removed_vip_leaves_nothing_for_the_next_owner_of_its_id() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let mut s = state(&[("10.0.0.101", 100)]);
    s.set_per_source(Some(&vip(VIP)), RateSpec::new(10, None), None, None, false).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let id = r.vip_id(&vip(VIP)).unwrap();
    // What the data path left behind for this VIP.
    maps.budget.insert(id, Bucket { tat_ns: 99 });
    let source = SourceKey { vip_id: id, family: 4, _pad: [0; 3], prefix: [7, 0, 0, 0] };
    maps.sources.insert(source, SourceState { bucket: Bucket { tat_ns: 1 }, admitted: 5, dropped: 6 });
    let other = SourceKey { vip_id: id + 1, ..source };
    maps.sources.insert(other, SourceState::default());
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    assert_eq!(slot(&maps, id), Limits::default(), "the freed id's limits are cleared");
    let mut next = DesiredState::default();
    next.add_vip(vip2(), 13).unwrap();
    r.apply(&mut maps, &next).unwrap();
    assert_eq!(r.vip_id(&vip2()), Some(id));
    assert!(!maps.budget.contains_key(&id) && !maps.sources.contains_key(&source), "the reused id starts from zero");
    assert!(maps.sources.contains_key(&other), "other VIPs' sources stay");
}

#[test]
fn rules_get_stable_lowest_free_ids_and_exact_trie_entries() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let mut s = two_vips();
    s.set_rule(rule("10.1.0.0/16"), block()).unwrap();
    s.set_rule(rule("192.0.2.0/24@10.100.0.1:80/tcp"), RuleConfig { action: RuleAction::Limit(RateSpec::new(7, Some(9))), observe: true })
        .unwrap();
    s.set_rule(rule("2001:db8::/32"), RuleConfig { action: RuleAction::Exempt, observe: false }).unwrap();
    let report = r.apply(&mut maps, &s).unwrap();
    assert_eq!(report.rules_written, 3);
    assert_eq!(maps.rules.len(), 3);

    let (key, value) = entry(&maps, &r, &rule("192.0.2.0/24@10.100.0.1:80/tcp"));
    let vip_id = r.vip_id(&vip(VIP)).unwrap();
    assert_eq!((key.scope, key.family, key.prefix_len), (vip_id, FAMILY_V4, 24));
    assert_eq!(key.addr[0].to_ne_bytes(), [192, 0, 2, 0]);
    assert!(key.addr[1..].iter().all(|&w| w == 0) && key._pad == [0; 2]);
    assert_eq!((value.action, value.rate, value.flags, value.addr_prefix_len), (RULE_LIMIT, Rate::new(7, 9), LIMIT_F_OBSERVE_SOURCE, 24));
    let (key, value) = entry(&maps, &r, &rule("2001:db8::/32"));
    assert_eq!((key.prefix_len, key.scope, key.family, value.action, value.rate), (32, ANY_VIP, FAMILY_V6, RULE_EXEMPT, Rate::default()));
    assert_eq!(key.addr, to_words("2001:db8::".parse().unwrap()).0);
    assert_eq!(entry(&maps, &r, &rule("10.1.0.0/16")).1.action, RULE_BLOCK);

    // Ids follow the rules' order in the state, lowest first, and stay put.
    let ids: Vec<u32> = s.rules.keys().map(|m| r.rule_id(m).unwrap()).collect();
    assert_eq!(ids, [0, 1, 2]);
    let blocked = r.rule_id(&rule("10.1.0.0/16")).unwrap();
    maps.rule_state.insert(blocked, RuleState { bucket: Bucket::default(), hits: 10, dropped: 10, would_drop: 0 });
    // Changing a rule's action keeps its id and its counters.
    s.set_rule(rule("10.1.0.0/16"), limit(3)).unwrap();
    let report = r.apply(&mut maps, &s).unwrap();
    assert_eq!((report.rules_written, report.limits_written, report.slots_written), (1, 0, 0));
    assert_eq!(r.rule_id(&rule("10.1.0.0/16")), Some(blocked));
    assert_eq!(maps.rule_state[&blocked].hits, 10);
    assert_eq!(entry(&maps, &r, &rule("10.1.0.0/16")).1.action, RULE_LIMIT);
    assert_eq!(r.apply(&mut maps, &s).unwrap(), ApplyReport::default());

    // A removed rule's id goes to the next new rule, with zeroed counters.
    s.remove_rule(&rule("10.1.0.0/16")).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.rules.len(), 2);
    s.set_rule(rule("203.0.113.0/24@10.100.0.2:80/tcp"), block()).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(r.rule_id(&rule("203.0.113.0/24@10.100.0.2:80/tcp")), Some(blocked));
    assert!(!maps.rule_state.contains_key(&blocked));
}

#[test]
fn a_vips_rules_go_before_the_vip_and_never_reach_its_ids_next_owner() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let mut s = two_vips();
    s.set_rule(rule("10.0.0.0/8@10.100.0.1:80/tcp"), block()).unwrap();
    s.set_rule(rule("10.0.0.0/8"), block()).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let id = r.vip_id(&vip(VIP)).unwrap();
    // FakeMaps asserts that no rule is scoped to a VIP id while it is removed.
    s.remove_vip(&vip(VIP)).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.rules.len(), 1);
    assert!(maps.rules.keys().all(|k| k.scope == ANY_VIP));
    let mut again = s.clone();
    again.add_vip("10.100.0.3:80/tcp".parse().unwrap(), 13).unwrap();
    r.apply(&mut maps, &again).unwrap();
    assert_eq!(r.vip_id(&"10.100.0.3:80/tcp".parse().unwrap()), Some(id));
    assert_eq!(maps.rules.len(), 1);
}

#[test]
fn a_restarted_reconciler_adopts_rule_ids_and_limits_and_writes_nothing() {
    let mut maps = FakeMaps::default();
    let mut s = two_vips();
    s.set_per_source(None, RateSpec::new(100, None), None, None, false).unwrap();
    s.set_budget(Some(&vip2()), RateSpec::new(10, None), true).unwrap();
    for (i, cidr) in ["10.1.0.0/16", "10.2.0.0/16", "10.3.0.0/16@10.100.0.2:80/tcp", "fd00::/8"].iter().enumerate() {
        s.set_rule(rule(cidr), limit(i as u32 + 1)).unwrap();
    }
    let mut first = Reconciler::adopt(&maps).unwrap();
    first.apply(&mut maps, &s).unwrap();
    // Ids out of state order: a rule removed earlier freed a low id.
    s.remove_rule(&rule("10.1.0.0/16")).unwrap();
    first.apply(&mut maps, &s).unwrap();
    s.set_rule(rule("10.9.0.0/16"), block()).unwrap();
    first.apply(&mut maps, &s).unwrap();
    let ids: Vec<Option<u32>> = s.rules.keys().map(|m| first.rule_id(m)).collect();
    assert_eq!(first.rule_id(&rule("10.9.0.0/16")), Some(0));

    let mut restarted = Reconciler::adopt(&maps).unwrap();
    assert_eq!(s.rules.keys().map(|m| restarted.rule_id(m)).collect::<Vec<_>>(), ids);
    let (limit_writes, rule_writes) = (maps.limit_writes, maps.rule_writes);
    assert_eq!(restarted.apply(&mut maps, &s).unwrap(), ApplyReport::default());
    assert_eq!((maps.limit_writes, maps.rule_writes), (limit_writes, rule_writes));
    // And it keeps allocating around the adopted ids.
    s.set_rule(rule("10.8.0.0/16"), block()).unwrap();
    restarted.apply(&mut maps, &s).unwrap();
    let mut all: Vec<u32> = s.rules.keys().map(|m| restarted.rule_id(m).unwrap()).collect();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2, 3, 4]);
}

#[test]
fn adopted_index_entries_no_rule_owns_are_removed_and_bad_ids_replaced() {
    let mut maps = FakeMaps::default();
    let mut s = state(&[("10.0.0.101", 100)]);
    s.set_rule(rule("10.1.0.0/16"), block()).unwrap();
    s.set_rule(rule("10.2.0.0/16"), block()).unwrap();
    Reconciler::adopt(&maps).unwrap().apply(&mut maps, &s).unwrap();
    // Damage: a second entry with id 0, and entries for a VIP id and a family nobody has.
    let key = rule_key(&"10.2.0.0/16".parse().unwrap(), ANY_VIP);
    maps.rules.get_mut(&key).unwrap().id = 0;
    let stale = rule_key(&"10.3.0.0/16".parse().unwrap(), 42);
    maps.rules.insert(stale, RuleValue { id: 7, ..RuleValue::default() });
    let odd = RuleSlotKey { family: 9, ..stale };
    maps.rules.insert(odd, RuleValue { id: 8, ..RuleValue::default() });
    // Host bits set: not a key this reconciler writes.
    let unmasked = RuleSlotKey { addr: to_words("10.4.0.1".parse().unwrap()).0, ..rule_key(&"10.4.0.0/16".parse().unwrap(), ANY_VIP) };
    maps.rules.insert(unmasked, RuleValue { id: 9, ..RuleValue::default() });
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.rules.len(), 2);
    let mut ids: Vec<u32> = maps.rules.values().map(|v| v.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 1]);
}

#[test]
fn a_failed_rule_write_is_retried_by_the_next_apply() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let mut s = state(&[("10.0.0.101", 100)]);
    s.set_rule(rule("10.1.0.0/16"), block()).unwrap();
    maps.fail_next_rule = true;
    assert!(r.apply(&mut maps, &s).is_err());
    // As the daemon does: adopt again after a failure.
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.rules.len(), 1);
    assert_eq!(r.rule_id(&rule("10.1.0.0/16")), Some(0));
}

#[test]
fn a_vip_is_flagged_while_rules_are_scoped_to_it() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let mut s = two_vips();
    let flagged = |maps: &FakeMaps, v: &Vip| maps.vips[&vip_key(v)].flags & VIP_F_SCOPED_RULES != 0;
    s.set_rule(rule("192.168.0.0/16"), block()).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert!(!flagged(&maps, &vip(VIP)) && !flagged(&maps, &vip2()), "a global rule flags no VIP");
    s.set_rule(rule("10.9.0.0/16@10.100.0.2:80/tcp"), block()).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert!(!flagged(&maps, &vip(VIP)) && flagged(&maps, &vip2()));
    s.remove_rule(&rule("10.9.0.0/16@10.100.0.2:80/tcp")).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert!(!flagged(&maps, &vip2()));
    assert_eq!(maps.rules.len(), 1);
}

#[test]
fn a_change_whose_table_write_failed_is_written_when_applied_again() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    let two = state(&[("10.0.0.101", 100), ("10.0.0.102", 100)]);
    maps.fail_next_write = true;
    assert!(r.apply(&mut maps, &two).is_err());
    assert_eq!(owners(&maps).len(), 1, "the failed change reached packets");
    let report = r.apply(&mut maps, &two).unwrap();
    assert_eq!(report.tables_flipped, 1);
    assert_eq!(owners(&maps).len(), 2);
    // Unchanged VIPs next to it build nothing and write nothing.
    assert_eq!(r.apply(&mut maps, &two).unwrap(), ApplyReport::default());
}

/// The address table, read from the maps as the data path does: slot → id → address.
fn table_in_maps(maps: &FakeMaps) -> Vec<Option<IpAddr>> {
    maps.active_table(&vip_key(&vip(VIP)))
        .into_iter()
        .map(|id| maps.backend(id).ok().filter(|b| b.state == BACKEND_ACTIVE).and_then(|b| from_words(b.addr, b.family)))
        .collect()
}

#[test]
fn the_same_state_gives_the_same_table_whatever_the_history() {
    let addrs = ["10.0.0.101", "10.0.0.102", "10.0.0.103", "10.0.0.104"];
    let want = state(&addrs.iter().map(|a| (*a, 100)).collect::<Vec<_>>());

    let mut first = FakeMaps::default();
    let mut r1 = Reconciler::adopt(&first).unwrap();
    r1.apply(&mut first, &want).unwrap();

    // Another balancer: backends added one by one in another order, after one that was
    // removed again, so every address holds another id.
    let mut second = FakeMaps::default();
    let mut r2 = Reconciler::adopt(&second).unwrap();
    let mut grown = state(&[("10.0.0.250", 100)]);
    r2.apply(&mut second, &grown).unwrap();
    for addr in addrs.iter().rev() {
        grown.add_backend(&vip(VIP), addr.parse().unwrap(), 100).unwrap();
        r2.apply(&mut second, &grown).unwrap();
    }
    grown.remove_backend(&vip(VIP), "10.0.0.250".parse().unwrap()).unwrap();
    r2.apply(&mut second, &grown).unwrap();
    assert_eq!(grown, want);
    let id = |r: &Reconciler| r.backend_id(&vip(VIP), &"10.0.0.101".parse().unwrap());
    assert_ne!(id(&r1), id(&r2), "the ids must differ for this test to mean anything");

    assert_eq!(table_in_maps(&first), table_in_maps(&second));
    assert_eq!(r1.active_table(&vip(VIP)), Some(table_in_maps(&first)));
    assert_eq!(r2.active_table(&vip(VIP)), Some(table_in_maps(&second)));
    // A restarted daemon adopts the same table and digest.
    let adopted = Reconciler::adopt(&second).unwrap();
    assert_eq!(adopted.active_table(&vip(VIP)), r1.active_table(&vip(VIP)));

    let digest = |r: &Reconciler, seed| table_digest(seed, None, &r.active_table(&vip(VIP)).unwrap());
    assert_eq!(digest(&r1, 7), digest(&r2, 7));
    assert_ne!(digest(&r1, 7), digest(&r1, 8), "the seed is part of the digest");
    let table = r1.active_table(&vip(VIP)).unwrap();
    assert_ne!(table_digest(7, Some(32), &table), digest(&r1, 7), "so is the hash mode");
    assert_ne!(table_digest(7, Some(32), &table), table_digest(7, Some(24), &table), "and the source prefix");
    let mut heavier = want.clone();
    heavier.set_weight(&vip(VIP), "10.0.0.101".parse().unwrap(), 200).unwrap();
    r2.apply(&mut second, &heavier).unwrap();
    assert_ne!(digest(&r1, 7), digest(&r2, 7), "another weight is another table");
}

#[test]
fn a_change_keeps_the_table_before_it_as_the_second_chance_table() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let key = vip_key(&vip(VIP));
    let three = state(&[("10.0.0.101", 100), ("10.0.0.102", 100), ("10.0.0.103", 100)]);
    r.apply(&mut maps, &three).unwrap();
    assert!(maps.prior_table(&key).is_empty(), "a new VIP had no table before");

    // A change right after another is part of it: the VIP was just created.
    let mut four = three.clone();
    four.add_backend(&vip(VIP), "10.0.0.104".parse().unwrap(), 100).unwrap();
    let mut heavier = three.clone();
    heavier.set_weight(&vip(VIP), "10.0.0.101".parse().unwrap(), 200).unwrap();
    r.apply(&mut maps, &heavier).unwrap();
    assert!(maps.prior_table(&key).is_empty());
    let before = maps.active_table(&key);
    four.set_weight(&vip(VIP), "10.0.0.101".parse().unwrap(), 200).unwrap();
    r.set_second_chance_settle(Duration::ZERO);
    let report = r.apply(&mut maps, &four).unwrap();
    assert_eq!(maps.prior_table(&key), before);
    assert_ne!(maps.active_table(&key), before);
    // The table in force becomes the second-chance table as it is: only the new table's
    // slots that differ from the standby's (the first table, of three backends) are written.
    assert!(report.slots_written < 4099, "{report:?}");

    // A ramp of the same change (within the settle time) keeps it.
    r.set_second_chance_settle(Duration::from_secs(3600));
    let mut ramped = four.clone();
    ramped.set_weight(&vip(VIP), "10.0.0.104".parse().unwrap(), 50).unwrap();
    r.apply(&mut maps, &ramped).unwrap();
    assert_eq!(maps.prior_table(&key), before);

    // Once settled, the next change keeps the table of then.
    r.set_second_chance_settle(Duration::ZERO);
    let then = maps.active_table(&key);
    r.apply(&mut maps, &four).unwrap();
    assert_eq!(maps.prior_table(&key), then);
    assert_eq!(maps.active_table(&key).len(), 4099);

    // A restarted reconciler adopts all three tables and, not knowing when the last change
    // was, starts an episode with its first change.
    let mut adopted = Reconciler::adopt(&maps).unwrap();
    let now = maps.active_table(&key);
    adopted.apply(&mut maps, &three).unwrap();
    assert_eq!(maps.prior_table(&key), now);
    assert_eq!(adopted.ring_pool().0, r.ring_pool().0, "the adopted pool holds the same three tables");
}

#[test]
fn a_pool_without_room_for_a_third_table_reports_the_vip_without_second_chance() {
    // Room for two tables of 4099 slots (1025 words each), not three.
    let capacity = Capacity { ring_slots: 2 * 4100, ..Capacity::DEFAULT };
    let mut maps = FakeMaps { capacity, ..FakeMaps::default() };
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.set_second_chance_settle(Duration::ZERO);
    let key = vip_key(&vip(VIP));
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    let report = r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    assert_eq!((report.tables_flipped, report.second_chance_lacking), (1, 1));
    assert!(maps.prior_table(&key).is_empty());
}

#[test]
fn a_removed_vip_gives_its_tables_back_and_leaves_no_second_chance_table_to_its_id() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.set_second_chance_settle(Duration::ZERO);
    let key = vip_key(&vip(VIP));
    let empty_pool = r.ring_pool();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100)])).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    let id = maps.vips[&key].id;
    assert!(!maps.prior_table(&key).is_empty());
    r.apply(&mut maps, &DesiredState::default()).unwrap();
    assert_eq!(r.ring_pool(), empty_pool);
    let other: Vip = "10.100.0.2:80/tcp".parse().unwrap();
    let mut s = DesiredState::default();
    s.add_vip(other, 13).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.vips[&vip_key(&other)].id, id, "the id is reused");
    assert!(maps.prior_table(&vip_key(&other)).is_empty());
}

/// Regression (fleet): an id freed from a VIP went to the next backend added to the same VIP
/// while the VIP's second-chance table still named it, so that backend became the second
/// candidate of flows that had been on the id's last owner (they reset).
#[test]
fn an_id_the_second_chance_table_names_is_not_reused_by_its_vip() {
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    r.set_second_chance_settle(Duration::ZERO);
    let key = vip_key(&vip(VIP));
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100), ("10.0.0.103", 100)])).unwrap();
    let gone = r.backend_id(&vip(VIP), &"10.0.0.103".parse().unwrap()).unwrap();
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100)])).unwrap();
    assert!(maps.prior_table(&key).contains(&gone), "the second-chance table names the removed backend");
    r.apply(&mut maps, &state(&[("10.0.0.101", 100), ("10.0.0.102", 100), ("10.0.0.104", 100)])).unwrap();
    let new = r.backend_id(&vip(VIP), &"10.0.0.104".parse().unwrap()).unwrap();
    assert_ne!(new, gone, "the new backend took an id the second-chance table still names");
}

/// A QUIC VIP: its configuration and flag in its VIP slot, one server-id entry per backend (the
/// last octets of its address), the flag; all of it gone with the backend or the QUIC.
#[test]
fn quic_vips_get_their_config_server_ids_and_flag() {
    use spillway_model::{QuicConfig, server_id_of};
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let v: Vip = "10.100.0.2:443/udp".parse().unwrap();
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.101".parse().unwrap(), "10.0.1.102".parse().unwrap());
    let mut s = DesiredState::default();
    s.add_vip(v, 4099).unwrap();
    s.set_quic(&v, Some(QuicConfig::default())).unwrap();
    s.add_backend(&v, a, 100).unwrap();
    s.add_backend(&v, b, 100).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let id = r.vip_id(&v).unwrap();
    assert_eq!(maps.vips[&vip_key(&v)].quic, QuicConfig::default().to_lb());
    assert_ne!(maps.vips[&vip_key(&v)].flags & VIP_F_QUIC, 0);
    let entry = |addr: IpAddr| QuicServerKey { vip_id: id, server_id: server_id_of(addr, 2) };
    assert_eq!(maps.quic_servers.len(), 2);
    for addr in [a, b] {
        let backend_id = r.backend_id(&v, &addr).unwrap();
        assert_eq!(maps.quic_servers[&entry(addr)], QuicServer { backend_id, backend: maps.backends[&backend_id] });
    }
    // A restarted lbd adopts it all and writes nothing.
    let mut again = Reconciler::adopt(&maps).unwrap();
    let before = maps.clone();
    again.apply(&mut maps, &s).unwrap();
    assert_eq!((maps.quic_servers == before.quic_servers, maps.vips == before.vips), (true, true));

    // A backend's tunnel changed: its entry's copy follows in the same apply.
    let options = BackendOptions { encap: Some(Encap::Gue), ..BackendOptions::default() };
    s.set_backend_options(&v, a, options).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let a_id = r.backend_id(&v, &a).unwrap();
    assert_eq!(maps.quic_servers[&entry(a)].backend.encap, ENCAP_GUE);
    assert_eq!(maps.quic_servers[&entry(a)], QuicServer { backend_id: a_id, backend: maps.backends[&a_id] });

    // Removed: its entry goes before its slot is freed (the fake checks no entry names a
    // freed backend).
    s.remove_backend(&v, b).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.quic_servers.keys().collect::<Vec<_>>(), [&entry(a)]);
    s.set_quic(&v, None).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert!(maps.quic_servers.is_empty());
    assert_eq!(maps.vips[&vip_key(&v)].quic, QuicLbConfig::EMPTY);
    assert_eq!(maps.vips[&vip_key(&v)].flags & VIP_F_QUIC, 0);
}

#[test]
fn quic_backends_whose_addresses_end_alike_are_refused() {
    let v: Vip = "10.100.0.2:443/udp".parse().unwrap();
    let mut s = DesiredState::default();
    s.add_vip(v, 4099).unwrap();
    s.add_backend(&v, "10.0.0.101".parse().unwrap(), 100).unwrap();
    s.add_backend(&v, "10.0.1.101".parse().unwrap(), 100).unwrap();
    let one_octet = spillway_model::QuicConfig { server_id_len: 1, ..Default::default() };
    let err = s.set_quic(&v, Some(one_octet)).unwrap_err();
    assert!(err.to_string().contains("would both have QUIC server id 65"), "{err}");
    assert_eq!(s.vips[&v].quic, None);
    s.set_quic(&v, Some(spillway_model::QuicConfig::default())).unwrap();
    let err = s.add_backend(&v, "10.1.0.101".parse().unwrap(), 100).unwrap_err();
    assert!(matches!(err, spillway_model::ModelError::QuicServerIdTaken { .. }), "{err}");
    assert_eq!(s.vips[&v].backends.len(), 2);
}

/// Client affinity: a source-hash VIP's flag and prefix in its slot from its first
/// publication; a changed hash mode is one flags store (no table written), kept by a
/// restarted lbd, and cleared again for the 5-tuple, leaving the VIP's other flags alone.
#[test]
fn a_vips_hash_mode_reaches_its_flags() {
    use spillway_common::types::{VIP_F_SOURCE_HASH, vip_source_hash_flags, vip_source_prefix};
    use spillway_model::HashMode;
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let v6: Vip = "[fd00::1]:443/tcp".parse().unwrap();
    let mut s = state(&[("10.0.0.101", 100)]);
    s.add_vip(v6, 4099).unwrap();
    s.set_hash(&v6, HashMode::Source, Some(64)).unwrap();
    s.add_backend(&v6, "fd00:1::1".parse().unwrap(), 100).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let flags = |maps: &FakeMaps, v: &Vip| maps.vips[&vip_key(v)].flags;
    assert_eq!((flags(&maps, &v6) & VIP_F_SOURCE_HASH, vip_source_prefix(flags(&maps, &v6))), (VIP_F_SOURCE_HASH, 64));
    assert_eq!(flags(&maps, &vip(VIP)), 0, "a VIP without hash keeps the 5-tuple");

    // The IPv4 VIP, with a rule of its own, to the source hash of whole addresses.
    let rule = RuleMatch { cidr: "10.9.0.0/16".parse().unwrap(), vip: Some(vip(VIP)) };
    s.set_rule(rule, RuleConfig::from_parts(&rule, spillway_model::RuleActionKind::Block, None, None, false).unwrap()).unwrap();
    s.set_hash(&vip(VIP), HashMode::Source, None).unwrap();
    let report = r.apply(&mut maps, &s).unwrap();
    assert_eq!((report.slots_written, report.tables_flipped), (0, 0), "a hash change writes no table");
    assert_eq!(flags(&maps, &vip(VIP)), VIP_F_SCOPED_RULES | vip_source_hash_flags(32));

    // A restarted lbd adopts the flags and writes nothing.
    let mut again = Reconciler::adopt(&maps).unwrap();
    let before = maps.clone();
    again.apply(&mut maps, &s).unwrap();
    assert_eq!(maps, before);

    s.set_hash(&vip(VIP), HashMode::FiveTuple, None).unwrap();
    s.set_hash(&v6, HashMode::Source, None).unwrap();
    again.apply(&mut maps, &s).unwrap();
    assert_eq!(flags(&maps, &vip(VIP)), VIP_F_SCOPED_RULES);
    assert_eq!(vip_source_prefix(flags(&maps, &v6)), 128, "no prefix: the whole address");
}

#[test]
fn encrypted_config_ids_get_their_keys_first_and_a_rotation_retires_the_old_key_last() {
    use spillway_model::QuicConfig;
    let mut maps = FakeMaps::default();
    let mut r = Reconciler::adopt(&maps).unwrap();
    let v: Vip = "10.100.0.2:443/udp".parse().unwrap();
    let key = |n: u8| std::path::PathBuf::from(format!("/etc/spillway/quic-{n}.key"));
    let config = |n: u8| QuicConfig { config_id: n, key_file: Some(key(n)), ..QuicConfig::default() };
    let mut s = DesiredState::default();
    s.add_vip(v, 4099).unwrap();
    s.add_backend(&v, "10.0.0.101".parse().unwrap(), 100).unwrap();
    // The fake refuses a slot or a second config id naming a key not in yet.
    s.set_quic(&v, Some(config(1))).unwrap();
    r.apply(&mut maps, &s).unwrap();
    let id = r.vip_id(&v).unwrap();
    assert_eq!(maps.quic_keys, [((id, 1), key(1))].into());
    s.set_quic_next(&v, Some(config(2))).unwrap();
    r.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.quic_keys, [((id, 1), key(1)), ((id, 2), key(2))].into());
    assert_eq!(maps.quic_configs, [((id, 2), config(2).to_lb())].into());
    // A restarted lbd: keys are not readable from the kernel, so all are written again.
    let mut again = Reconciler::adopt(&maps).unwrap();
    maps.quic_keys.clear();
    maps.quic_configs.clear();
    again.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.quic_keys.len(), 2);
    // Retired: the slot names config id 2, then config id 1's key goes.
    s.retire_quic(&v).unwrap();
    again.apply(&mut maps, &s).unwrap();
    assert_eq!(maps.vips[&vip_key(&v)].quic.config_id, 2);
    assert_eq!(maps.quic_keys, [((id, 2), key(2))].into());
    assert!(maps.quic_configs.is_empty());
    // Not QUIC any more: no key left behind for the VIP id's next owner.
    s.set_quic(&v, None).unwrap();
    again.apply(&mut maps, &s).unwrap();
    assert!(maps.quic_keys.is_empty());
}
