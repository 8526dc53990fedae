//! Client affinity: a VIP with `hash = "source"` places new flows by the client's address
//! (its first `source_prefix` bits) alone, so every port of a client lands on one backend
//! and clients spread; the connection table stays keyed by the 5-tuple, so a changed hash
//! moves no established flow.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use spillway_common::{
    hash::{FLOW_SEED, maglev_hash},
    types::{PROTO_TCP, PROTO_UDP, Reason},
};
use spillway_harness::{frames, packet_lab};
use spillway_model::{HashMode, Vip};
use spillway_reconcile::vip_key;

use crate::{second_chance::expect_nested, support::*};

fn backends4() -> Vec<IpAddr> {
    (101..=103).map(|n| packet_lab::backend4(n).into()).collect()
}

/// Adds `v` on `backends`, hashed by `hash` (and `source_prefix`).
fn add_hashed_vip(env: &mut Env, v: Vip, backends: &[IpAddr], hash: HashMode, source_prefix: Option<u8>) {
    env.add_vip(v, backends);
    env.update(|s| s.set_hash(&v, hash, source_prefix).unwrap());
}

/// Sends a new TCP flow (a SYN) from `client` to `vip` and returns the backend it was
/// placed on, after checking the host predicts the kernel's choice.
fn place_tcp(env: &Env, v: &Vip, client: SocketAddr, vip: SocketAddr) -> IpAddr {
    env.expect(&frames::tcp(client, vip, true, &[]), XDP_TX, Reason::Tx);
    let key = flow_key(client, vip, PROTO_TCP);
    let backend = env.pinned_backend(&key).unwrap();
    assert_eq!(env.predicted_backend(v, &key), backend, "the host's Maglev hash of {client} differs from the kernel's");
    backend
}

/// The backends each client's flows went to, `ports` flows per client.
fn placements(env: &Env, v: &Vip, vip: SocketAddr, clients: &[IpAddr], ports: u16) -> BTreeMap<IpAddr, BTreeSet<IpAddr>> {
    clients.iter().map(|c| (*c, (0..ports).map(|p| place_tcp(env, v, SocketAddr::new(*c, 40000 + 7 * p), vip)).collect())).collect()
}

#[test]
fn a_source_hash_vip_keeps_a_clients_ports_on_one_backend_and_spreads_clients() {
    with_env(|env| {
        let (sourced, tupled) = (vip("10.200.1.1:80/tcp"), vip("10.200.1.2:80/tcp"));
        add_hashed_vip(env, sourced, &backends4(), HashMode::Source, None);
        add_hashed_vip(env, tupled, &backends4(), HashMode::FiveTuple, None);
        let clients: Vec<IpAddr> = (1..=30).map(|n| ip(&format!("192.168.10.{n}"))).collect();

        let by_source = placements(env, &sourced, sock("10.200.1.1:80"), &clients, 10);
        for (client, backends) in &by_source {
            assert_eq!(backends.len(), 1, "{client}'s connections went to {backends:?}");
        }
        let used: BTreeSet<IpAddr> = by_source.values().flatten().copied().collect();
        assert_eq!(used.len(), 3, "30 clients on {used:?}");

        // The same clients on a 5-tuple VIP: their ports spread.
        let by_tuple = placements(env, &tupled, sock("10.200.1.2:80"), &clients, 10);
        let spread = by_tuple.values().filter(|b| b.len() > 1).count();
        assert!(spread > 25, "only {spread} of 30 clients spread over backends under the 5-tuple");
    });
}

#[test]
fn a_udp_client_changing_ports_stays_on_its_backend() {
    with_env(|env| {
        // Any-port UDP VIP: source and destination ports both change.
        let v = vip("10.200.1.3:0/udp");
        add_hashed_vip(env, v, &backends4(), HashMode::Source, None);
        let mut used = BTreeSet::new();
        for n in 1..=20u8 {
            let client = ip(&format!("192.168.20.{n}"));
            let backends: BTreeSet<IpAddr> = (0..8u16)
                .map(|i| {
                    let (c, d) = (SocketAddr::new(client, 5000 + 311 * i), SocketAddr::new(ip("10.200.1.3"), 27015 + i));
                    env.expect(&frames::udp(c, d, b"session"), XDP_TX, Reason::Tx);
                    env.pinned_backend(&flow_key(c, d, PROTO_UDP)).unwrap()
                })
                .collect();
            assert_eq!(backends.len(), 1, "{client}'s datagrams went to {backends:?}");
            used.extend(backends);
        }
        assert!(used.len() >= 2, "20 clients all on {used:?}");
    });
}

#[test]
fn a_source_prefix_of_64_groups_an_ipv6_clients_privacy_addresses() {
    with_env(|env| {
        let six: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend6(n).into()).collect();
        let (grouped, whole) = (vip("[2001:db8:100::1]:443/tcp"), vip("[2001:db8:100::2]:443/tcp"));
        add_hashed_vip(env, grouped, &six, HashMode::Source, Some(64));
        add_hashed_vip(env, whole, &six, HashMode::Source, None);
        // 20 networks, 6 privacy addresses each (random-looking interface ids).
        let address = |net: u16, i: u32| {
            let iid = u64::from(i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(net);
            IpAddr::V6(std::net::Ipv6Addr::from((0x2001_0db8_0001_0000_u128 | u128::from(net)) << 64 | u128::from(iid)))
        };
        let mut per_network = Vec::new();
        let mut whole_spread = 0;
        for net in 0..20u16 {
            let clients: Vec<IpAddr> = (0..6).map(|i| address(net, i)).collect();
            let backends: BTreeSet<IpAddr> =
                placements(env, &grouped, sock("[2001:db8:100::1]:443"), &clients, 3).into_values().flatten().collect();
            assert_eq!(backends.len(), 1, "the /64 of {} went to {backends:?}", clients[0]);
            per_network.extend(backends);
            // The whole address: each privacy address is a client of its own.
            let each = placements(env, &whole, sock("[2001:db8:100::2]:443"), &clients, 3);
            assert!(each.values().all(|b| b.len() == 1));
            whole_spread += usize::from(each.values().flatten().collect::<BTreeSet<_>>().len() > 1);
        }
        let networks: BTreeSet<IpAddr> = per_network.into_iter().collect();
        assert_eq!(networks.len(), 3, "20 networks on {networks:?}");
        assert!(whole_spread > 15, "only {whole_spread} of 20 networks spread without the prefix");
    });
}

#[test]
fn changing_the_hash_moves_no_established_flow() {
    with_env(|env| {
        let v = vip("10.200.1.4:80/tcp");
        add_hashed_vip(env, v, &backends4(), HashMode::FiveTuple, None);
        let d = sock("10.200.1.4:80");
        let client = ip("192.168.30.7");
        let open: Vec<(SocketAddr, IpAddr)> =
            (0..30).map(|p| SocketAddr::new(client, 41000 + p)).map(|c| (c, place_tcp(env, &v, c, d))).collect();
        assert!(open.iter().map(|(_, b)| b).collect::<BTreeSet<_>>().len() > 1, "the 5-tuple put every port on one backend");

        env.update(|s| s.set_hash(&v, HashMode::Source, None).unwrap());
        for (c, backend) in &open {
            let data = frames::tcp(*c, d, false, b"more");
            let out = env.expect(&data, XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &data, 14, *backend, None);
        }
        // New connections of the client now all go to one backend.
        let new: BTreeSet<IpAddr> = (0..10).map(|p| place_tcp(env, &v, SocketAddr::new(client, 42000 + p), d)).collect();
        assert_eq!(new.len(), 1, "new connections went to {new:?}");
    });
}

#[test]
fn second_chance_and_icmp_errors_follow_the_source_hash() {
    with_env(|env| {
        env.reconciler.set_second_chance_settle(Duration::ZERO);
        let v = vip("10.200.1.5:80/tcp");
        add_hashed_vip(env, v, &backends4(), HashMode::Source, None);
        env.update(|s| s.add_backend(&v, packet_lab::backend4(104).into(), 100).unwrap());
        let d = sock("10.200.1.5:80");
        let key = |client: IpAddr, port: u16| flow_key(SocketAddr::new(client, port), d, PROTO_TCP);
        // The backend the table before the change gave a client, by its source hash.
        let before = |client: IpAddr| {
            let meta = env.balancer.maps.vips.get(&vip_key(&v)).unwrap();
            let id = env.balancer.maps.rings.choice(meta.prior, maglev_hash(&key(client, 1), meta.flags, FLOW_SEED)).unwrap();
            env.backend_addr(id)
        };
        let moved = (1..=250u8)
            .map(|n| ip(&format!("192.168.40.{n}")))
            .find(|c| before(*c) != env.predicted_backend(&v, &key(*c, 1)))
            .expect("a client the new backend took");
        let (now, then) = (env.predicted_backend(&v, &key(moved, 1)), before(moved));
        // A connection of that client begun elsewhere, on any port: the new backend with a
        // tunnel to the old one inside.
        for port in [40001, 52777] {
            let ack = frames::tcp(SocketAddr::new(moved, port), d, false, b"data");
            expect_nested(&env.expect(&ack, XDP_TX, Reason::Tx).frame, &ack, now, then);
        }
        // An ICMP error about a flow of it without an entry: the backend its source names.
        let icmp = frames::icmp_frag_needed(ip("192.168.1.1"), d, SocketAddr::new(moved, 40002), 1400);
        expect_encap(&env.expect(&icmp, XDP_TX, Reason::Tx).frame, &icmp, 14, now, None);
    });
}
