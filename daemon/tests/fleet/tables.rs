//! Identical choices: balancers given the same desired state hold the same Maglev tables
//! (as backend addresses, slot by slot, read back from their pinned maps), whatever the
//! order backends were added in, the ids they were given, and restarts.

use std::net::IpAddr;

use aya::maps::{Array, Map, MapData};
use spillway_common::{
    addr::from_words,
    limits::{RING_SLOTS_PER_WORD, map_names},
    types::{BACKEND_ACTIVE, BackendInfo, LbConfig, VipKey, VipSlot},
};
use spillway_harness::Signal;
use spillway_harness::fleet::Balancer;
use spillway_reconcile::table_digest;

use crate::support::{self, echo_vip, http_vip, vip_json};

fn pinned(balancer: &Balancer, name: &str) -> Map {
    let path = balancer.pinned_map(name).unwrap();
    Map::from_map_data(MapData::from_pin(&path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()))).unwrap()
}

/// Every VIP's active table as the data path reads it: slot → backend id → address.
fn tables(balancer: &Balancer) -> Vec<(VipKey, Vec<Option<IpAddr>>)> {
    let vips: Array<_, VipSlot> = Array::try_from(pinned(balancer, map_names::VIPS)).unwrap();
    let rings: Array<_, u64> = Array::try_from(pinned(balancer, map_names::RINGS)).unwrap();
    let backends: Array<_, BackendInfo> = Array::try_from(pinned(balancer, map_names::BACKENDS)).unwrap();
    let mut out: Vec<(VipKey, Vec<Option<IpAddr>>)> = vips
        .iter()
        .map(|slot| slot.unwrap())
        .filter(|slot| slot.key.family != 0)
        .map(|VipSlot { key, meta, .. }| {
            let table = meta.active;
            let table = (0..table.size)
                .map(|slot| {
                    // Four 16-bit backend ids a word (`RingRef`).
                    let word = rings.get(&(table.base + slot / RING_SLOTS_PER_WORD), 0).unwrap();
                    let id = (word >> (16 * (slot % RING_SLOTS_PER_WORD))) as u16 as u32;
                    let b = backends.get(&id, 0).unwrap();
                    (b.state == BACKEND_ACTIVE).then(|| from_words(b.addr, b.family)).flatten()
                })
                .collect();
            (key, table)
        })
        .collect();
    out.sort_by_key(|(k, _)| (k.addr, k.port));
    out
}

fn seed(balancer: &Balancer) -> u32 {
    let config: Array<_, LbConfig> = Array::try_from(pinned(balancer, map_names::CONFIG)).unwrap();
    config.get(&0, 0).unwrap().flow_seed
}

/// The backend ids `balancer` gave, by address (to show they differ).
fn ids(balancer: &Balancer) -> Vec<(IpAddr, u32)> {
    let backends: Array<_, BackendInfo> = Array::try_from(pinned(balancer, map_names::BACKENDS)).unwrap();
    let mut ids: Vec<(IpAddr, u32)> = (1..64u32)
        .filter_map(|id| {
            let b = backends.get(&id, 0).ok()?;
            (b.state == BACKEND_ACTIVE).then(|| Some((from_words(b.addr, b.family)?, id))).flatten()
        })
        .collect();
    ids.sort();
    ids
}

fn digests(balancer: &Balancer) -> Vec<String> {
    [echo_vip(), http_vip()].iter().map(|v| vip_json(balancer, v)["table_digest"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn the_same_state_gives_byte_identical_tables_on_every_balancer() {
    let fleet = support::start(2, 4, 1, &[]);
    let (lb1, lb2) = (fleet.balancer(1), fleet.balancer(2));
    // lb1 from the fleet's file; lb2 by hand: a backend that is removed again first (every
    // id shifts), then the others in another order.
    support::apply(&fleet, lb1, &[0, 1, 2, 3]);
    for vip in [echo_vip(), http_vip()] {
        lb2.lbctl(&["vips", "add", &vip]).unwrap();
        lb2.lbctl(&["backends", "add", "--vip", &vip, "10.0.0.250"]).unwrap();
        for i in [3, 1, 0, 2] {
            lb2.lbctl(&["backends", "add", "--vip", &vip, &fleet.backends()[i].ipv4().to_string()]).unwrap();
        }
        lb2.lbctl(&["backends", "remove", "--vip", &vip, "10.0.0.250"]).unwrap();
    }
    assert_ne!(ids(lb1), ids(lb2), "the balancers must have given different ids for this to prove anything");
    let want = tables(lb1);
    assert_eq!(want.len(), 2);
    assert!(want.iter().all(|(_, t)| t.len() == 65537 && t.iter().all(Option::is_some)));
    assert!(tables(lb2) == want, "lb2's tables differ from lb1's");
    assert_eq!(seed(lb1), seed(lb2));
    // The digests lbctl shows are those of the tables in the maps.
    let from_maps: Vec<String> = want.iter().map(|(_, t)| table_digest(seed(lb1), None, t)).collect();
    assert_eq!(digests(lb1), from_maps);
    assert_eq!(digests(lb2), from_maps);

    // Restarts, clean and killed, keep them.
    lb2.stop_lbd(Signal::SIGTERM).unwrap();
    lb2.start_lbd().unwrap();
    assert!(tables(lb2) == want, "lb2's tables changed across a restart");
    lb2.stop_lbd(Signal::SIGKILL).unwrap();
    lb2.start_lbd().unwrap();
    assert!(tables(lb2) == want, "lb2's tables changed across a SIGKILL and restart");
    assert_eq!(digests(lb2), from_maps);

    // A state that differs on one balancer shows as another digest.
    let b1 = fleet.backends()[0].ipv4().to_string();
    lb2.lbctl(&["backends", "set-weight", "--vip", &echo_vip(), &b1, "200"]).unwrap();
    assert_ne!(digests(lb2)[0], from_maps[0]);
    assert_eq!(digests(lb2)[1], from_maps[1]);
    println!("digests on both balancers: {from_maps:?}; lb1 ids {:?}, lb2 ids {:?}", ids(lb1), ids(lb2));
}
