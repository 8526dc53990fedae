//! QUIC VIPs: short headers go by the server id in their destination connection id, long
//! headers and ids that name no backend by the 5-tuple (Maglev), the latter counted.

use std::net::{IpAddr, SocketAddr};

use spillway_common::{
    hash::{connection_id_hash, gue_source_port, quic_server_home},
    limits::{Capacity, DEFAULT_GUE_PORT},
    quic_lb::{MAX_CID_LEN, ServerId, encode},
    types::{PROTO_UDP, QuicRouting, Reason},
};
use spillway_harness::{frames, packet_lab};
use spillway_model::{DEFAULT_WEIGHT, Encap, QuicConfig, Vip, server_id_of};

use crate::support::*;

const CONFIG: QuicConfig = QuicConfig { config_id: 1, server_id_len: 2, nonce_len: 6, self_len: false, key_file: None };

/// A QUIC VIP with the lab's backends `ns`.
fn quic_vip(env: &mut Env, vip_text: &str, backends: &[IpAddr]) -> Vip {
    let v = vip(vip_text);
    env.add_vip(v, backends);
    env.update(|s| s.set_quic(&v, Some(CONFIG)).unwrap());
    v
}

/// 10.200.1.1:443/udp, QUIC, on the lab's backends 101-103: those, the VIP, its address.
fn three_backend_vip(env: &mut Env) -> (Vec<IpAddr>, Vip, SocketAddr) {
    let backends: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend4(n).into()).collect();
    let v = quic_vip(env, "10.200.1.1:443/udp", &backends);
    (backends, v, sock("10.200.1.1:443"))
}

/// A connection id under `CONFIG` naming `server_id`, its nonce and low bits from `seed`.
fn cid(server_id: &ServerId, seed: u64) -> Vec<u8> {
    cid_under(&CONFIG, server_id, seed)
}

/// [`cid`] under `config`.
fn cid_under(config: &QuicConfig, server_id: &ServerId, seed: u64) -> Vec<u8> {
    let mut out = [0u8; MAX_CID_LEN];
    let nonce = seed.to_be_bytes();
    let len = encode(&config.to_lb(), server_id, &nonce[8 - usize::from(config.nonce_len)..], nonce[7], &mut out).unwrap();
    out[..len].to_vec()
}

/// A 1-RTT (short header) packet to `dcid`: first byte, id, packet number and a payload
/// (as long as a real packet's AEAD tag and sample need).
pub(crate) fn short_header(dcid: &[u8]) -> Vec<u8> {
    let mut p = vec![0x40 | 0x01];
    p.extend_from_slice(dcid);
    p.extend_from_slice(&[0x17, 0x2a]);
    p.extend_from_slice(&[0x5c; 24]);
    p
}

/// An Initial (long header) packet of QUIC v1 with destination id `dcid`.
fn initial(dcid: &[u8]) -> Vec<u8> {
    let mut p = vec![0xc0 | 0x03, 0, 0, 0, 1, dcid.len() as u8];
    p.extend_from_slice(dcid);
    p.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8, 0]);
    p.extend_from_slice(&[0x44, 0x10]);
    p.extend_from_slice(&[0x5c; 40]);
    p
}

pub(crate) fn routing(env: &Env) -> [u64; 2] {
    let counts = env.balancer.maps.quic_routing().unwrap();
    let get = |what: QuicRouting| counts.iter().find(|(r, _)| *r == what).unwrap().1;
    [get(QuicRouting::ByConnectionId), get(QuicRouting::Fallback)]
}

/// Sends `payload` from `client` to `to` and returns the backend it was encapsulated to.
pub(crate) fn sent_to(env: &Env, client: SocketAddr, to: SocketAddr, payload: &[u8]) -> IpAddr {
    let f = frames::udp(client, to, payload);
    let out = env.expect(&f, XDP_TX, Reason::Tx);
    let backend_ip = outer_destination(&out.frame);
    expect_encap(&out.frame, &f, 14, backend_ip, None);
    backend_ip
}

/// The outer (tunnel) destination of an encapsulated frame.
pub(crate) fn outer_destination(frame: &[u8]) -> IpAddr {
    match frame[12..14] {
        [0x08, 0x00] => IpAddr::from(<[u8; 4]>::try_from(&frame[14 + 16..14 + 20]).unwrap()),
        _ => IpAddr::from(<[u8; 16]>::try_from(&frame[14 + 24..14 + 40]).unwrap()),
    }
}

pub(crate) fn clients(n: u16) -> impl Iterator<Item = SocketAddr> {
    (0..n).map(|i| sock(&format!("192.168.{}.{}:{}", 10 + i % 7, 20 + i % 50, 40000 + i)))
}

#[test]
fn a_short_header_goes_to_the_backend_its_connection_id_names_whatever_its_5_tuple() {
    with_env(|env| {
        let (backends, v, d) = three_backend_vip(env);
        let mut moved = 0;
        for (i, client) in clients(60).enumerate() {
            let named = backends[i % 3];
            let id = cid(&server_id_of(named, CONFIG.server_id_len), i as u64);
            let before = routing(env);
            assert_eq!(sent_to(env, client, d, &short_header(&id)), named, "{client}: the backend its connection id names");
            assert_eq!(routing(env), [before[0] + 1, before[1]]);
            // No entry needed, none made.
            assert_eq!(env.pinned_backend(&flow_key(client, d, PROTO_UDP)), None);
            moved += usize::from(env.predicted_backend(&v, &flow_key(client, d, PROTO_UDP)) != named);
        }
        // Most of these 5-tuples hash elsewhere: the id, not the tuple, chose.
        assert!(moved >= 20, "only {moved} of 60 clients hash to another backend");

        // The same packets to a UDP VIP that is not QUIC go by the 5-tuple.
        env.update(|s| s.set_quic(&v, None).unwrap());
        let before = routing(env);
        for (i, client) in clients(60).enumerate() {
            let id = cid(&server_id_of(backends[i % 3], CONFIG.server_id_len), i as u64);
            let maglev = env.predicted_backend(&v, &flow_key(client, d, PROTO_UDP));
            assert_eq!(sent_to(env, client, d, &short_header(&id)), maglev);
        }
        assert_eq!(routing(env), before);
    });
}

#[test]
fn an_ipv6_short_header_goes_by_its_connection_id_too() {
    with_env(|env| {
        let backends: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend6(n).into()).collect();
        let v = quic_vip(env, "[fd00:200::1]:443/udp", &backends);
        let d = sock("[fd00:200::1]:443");
        for i in 0..30u16 {
            let client = sock(&format!("[fd00:10::{:x}]:{}", 20 + i, 40000 + i));
            let named = backends[usize::from(i) % 3];
            let id = cid(&server_id_of(named, CONFIG.server_id_len), u64::from(i));
            assert_eq!(sent_to(env, client, d, &short_header(&id)), named, "{client} to {v}");
        }
        assert_eq!(routing(env), [30, 0]);
    });
}

/// The balancer reads a connection id's first 16 octets as two words: a server id that runs
/// into the second is read whole. Twelve-octet ids of IPv6 backends that differ only in their
/// last octet (the id's twelfth, in the second word) each go to their own backend.
#[test]
fn a_server_id_past_the_eighth_octet_is_read_whole() {
    const LONG: QuicConfig = QuicConfig { config_id: 2, server_id_len: 12, nonce_len: 4, self_len: false, key_file: None };
    with_env(|env| {
        let backends: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend6(n).into()).collect();
        let v = vip("[fd00:200::1]:443/udp");
        env.add_vip(v, &backends);
        env.update(|s| s.set_quic(&v, Some(LONG)).unwrap());
        let d = sock("[fd00:200::1]:443");
        for i in 0..30u16 {
            let client = sock(&format!("[fd00:10::{:x}]:{}", 20 + i, 40000 + i));
            let named = backends[usize::from(i) % 3];
            let id = cid_under(&LONG, &server_id_of(named, LONG.server_id_len), u64::from(i));
            assert_eq!(sent_to(env, client, d, &short_header(&id)), named, "{client} to {v}");
        }
        assert_eq!(routing(env), [30, 0]);
    });
}

#[test]
fn a_long_header_is_placed_by_maglev_and_remembered() {
    with_env(|env| {
        let (backends, v, d) = three_backend_vip(env);
        let mut named_elsewhere = 0;
        for (i, client) in clients(30).enumerate() {
            // Even a (client-chosen) Initial id that happens to name a backend is not read.
            let named = backends[i % 3];
            let id = cid(&server_id_of(named, CONFIG.server_id_len), i as u64);
            let key = flow_key(client, d, PROTO_UDP);
            let maglev = env.predicted_backend(&v, &key);
            named_elsewhere += usize::from(maglev != named);
            assert_eq!(sent_to(env, client, d, &initial(&id)), maglev, "{client}");
            assert_eq!(env.pinned_backend(&key), Some(maglev));
        }
        assert!(named_elsewhere >= 10);
        assert_eq!(routing(env), [0, 0], "long headers are not counted");
    });
}

#[test]
fn a_connection_id_that_names_no_backend_falls_back_to_the_5_tuple_and_is_counted() {
    with_env(|env| {
        let (backends, v, d) = three_backend_vip(env);
        let nobody = ServerId::new(&[0xee, 0xee]).unwrap();
        let mut other_config = cid(&server_id_of(backends[0], CONFIG.server_id_len), 7);
        other_config[0] = (other_config[0] & 0x1f) | 2 << 5;
        let mut unroutable = cid(&server_id_of(backends[0], CONFIG.server_id_len), 8);
        unroutable[0] |= 0xe0;
        let undecodable: [(&str, Vec<u8>); 4] = [
            ("a server id no backend has", short_header(&cid(&nobody, 1))),
            ("an unknown config id", short_header(&other_config)),
            ("the unroutable config id", short_header(&unroutable)),
            ("a packet too short for an id", vec![0x41, 0x20, 0x00]),
        ];
        for (n, (what, payload)) in undecodable.iter().enumerate() {
            let client = sock(&format!("192.168.10.20:{}", 41000 + n));
            let key = flow_key(client, d, PROTO_UDP);
            let maglev = env.predicted_backend(&v, &key);
            let before = routing(env);
            assert_eq!(sent_to(env, client, d, payload), maglev, "{what}: by the 5-tuple");
            assert_eq!(routing(env), [before[0], before[1] + 1], "{what}: counted as a fallback");
            assert_eq!(env.pinned_backend(&key), Some(maglev), "{what}: remembered as any UDP flow");
        }
        // A backend removed: its id is no one's, and its clients fall back rather than drop.
        let gone = backends[1];
        env.update(|s| s.remove_backend(&v, gone).unwrap());
        let client = sock("192.168.10.30:42000");
        let id = cid(&server_id_of(gone, CONFIG.server_id_len), 9);
        let maglev = env.predicted_backend(&v, &flow_key(client, d, PROTO_UDP));
        let before = routing(env);
        assert_eq!(sent_to(env, client, d, &short_header(&id)), maglev);
        assert_eq!(routing(env), [before[0], before[1] + 1]);
    });
}

/// A packet sent by its connection id takes its outer header's entropy from the id, not
/// its 5-tuple: every packet naming one id leaves in the same GUE tunnel (source port, and
/// so the backend's RSS queue) from whatever client address, byte for byte as computed here;
/// another id of the same backend, another tunnel.
#[test]
fn an_ids_packets_take_one_tunnel_whatever_their_5_tuple() {
    with_env(|env| {
        let backend: IpAddr = packet_lab::backend4(101).into();
        let v = quic_vip(env, "10.200.1.1:443/udp", &[backend]);
        env.update(|s| s.set_encap(&v, Encap::Gue).unwrap());
        let d = sock("10.200.1.1:443");
        let seed = env.balancer.maps.config().unwrap().table_seed;
        let mut ports = std::collections::BTreeSet::new();
        for n in 0..16u64 {
            let id = cid(&server_id_of(backend, CONFIG.server_id_len), n);
            let mut first16 = [0u8; 16];
            first16[..id.len()].copy_from_slice(&id);
            let (low, high) = (u64::from_le_bytes(first16[..8].try_into().unwrap()), u64::from_le_bytes(first16[8..].try_into().unwrap()));
            let hash = connection_id_hash(low, high, id.len() as u32, seed);
            ports.insert(gue_source_port(hash));
            for client in clients(3) {
                let f = frames::udp(client, d, &short_header(&id));
                let out = env.expect(&f, XDP_TX, Reason::Tx);
                let want =
                    frames::gue_tunnel(packet_lab::LOCAL4.into(), backend, (gue_source_port(hash), DEFAULT_GUE_PORT), hash, &f[14..]);
                assert_eq!(out.frame[12..], want[12..], "id {n} from {client}");
            }
        }
        assert!(ports.len() >= 12, "16 ids of one backend took only {} tunnels", ports.len());
    });
}

/// A short header reads its backend's entry from the server id's slot, a copy the loader
/// keeps: a backend's changed tunnel reaches its short headers with the same apply as its
/// other packets (IPIP, then GUE), and they still go by id.
#[test]
fn a_backends_changed_tunnel_reaches_its_short_headers_at_once() {
    with_env(|env| {
        let (backends, v, d) = three_backend_vip(env);
        let outer_protocol = |frame: &[u8]| frame[14 + 9];
        for (encap, protocol) in [(Encap::Ipip, 4), (Encap::Gue, PROTO_UDP), (Encap::Ipip, 4)] {
            env.update(|s| s.set_encap(&v, encap).unwrap());
            for (n, client) in clients(6).enumerate() {
                let named = backends[n % 3];
                let id = cid(&server_id_of(named, CONFIG.server_id_len), n as u64);
                let before = routing(env);
                let out = env.expect(&frames::udp(client, d, &short_header(&id)), XDP_TX, Reason::Tx);
                assert_eq!((outer_destination(&out.frame), outer_protocol(&out.frame)), (named, protocol), "{encap:?}, {client}");
                assert_eq!(routing(env), [before[0] + 1, before[1]], "{encap:?}, {client}: by its id");
            }
        }
    });
}

/// The configuration lives in the VIP's slot: changing it takes effect with the next packet,
/// ids issued under the old one falling back (counted) and ids under the new one going by id.
#[test]
fn a_changed_configuration_takes_effect_at_once() {
    with_env(|env| {
        let (backends, v, d) = three_backend_vip(env);
        let changed = QuicConfig { config_id: 2, server_id_len: 3, nonce_len: 5, self_len: true, key_file: None };
        env.update(|s| s.set_quic(&v, Some(changed.clone())).unwrap());
        for (i, client) in clients(9).enumerate() {
            let named = backends[i % 3];
            let before = routing(env);
            let new = cid_under(&changed, &server_id_of(named, changed.server_id_len), i as u64);
            assert_eq!(sent_to(env, client, d, &short_header(&new)), named, "{client}: by an id of the new configuration");
            assert_eq!(routing(env), [before[0] + 1, before[1]]);
            let old = cid(&server_id_of(named, CONFIG.server_id_len), i as u64);
            let other_client = SocketAddr::new(client.ip(), client.port() + 1000);
            let maglev = env.predicted_backend(&v, &flow_key(other_client, d, PROTO_UDP));
            assert_eq!(sent_to(env, other_client, d, &short_header(&old)), maglev, "{client}: an old id by the 5-tuple");
            assert_eq!(routing(env), [before[0] + 1, before[1] + 1]);
        }
    });
}

#[test]
fn ids_sharing_a_home_slot_are_each_found_and_one_that_misses_falls_back() {
    // Four backends' worth of maps: an index of 8 slots, so of the lab's ten backends two
    // have server ids of one home; the second of them lies a probe past it.
    let capacity = Capacity { backends: 4, ..Capacity::DEFAULT };
    with_env_sized(capacity, |env| {
        let lab: Vec<IpAddr> = packet_lab::RESOLVED_BACKENDS.map(|n| packet_lab::backend4(n).into()).collect();
        let v = quic_vip(env, "10.200.1.1:443/udp", &lab[..1]);
        let vip_id = env.reconciler.vip_id(&v).unwrap();
        let mask = capacity.quic_server_slots() - 1;
        let home = |id: &ServerId| quic_server_home(vip_id, &id.words(), mask);
        let sid = |addr: IpAddr| server_id_of(addr, CONFIG.server_id_len);
        let (a, b) = lab
            .iter()
            .enumerate()
            .find_map(|(i, &a)| lab[i + 1..].iter().find(|&&b| home(&sid(a)) == home(&sid(b))).map(|&b| (a, b)))
            .expect("ten ids in eight homes: two share one");
        env.update(|s| {
            if a != lab[0] {
                s.add_backend(&v, a, DEFAULT_WEIGHT).unwrap();
                s.remove_backend(&v, lab[0]).unwrap();
            }
            s.add_backend(&v, b, DEFAULT_WEIGHT).unwrap();
        });
        let d = sock("10.200.1.1:443");
        for (i, (named, client)) in [a, b].into_iter().cycle().zip(clients(8)).enumerate() {
            let before = routing(env);
            assert_eq!(sent_to(env, client, d, &short_header(&cid(&sid(named), i as u64))), named, "{named}: by its id");
            assert_eq!(routing(env), [before[0] + 1, before[1]]);
        }
        // An id no backend has, homed where both are: read, compared, missed, counted.
        let nobody = (0..=u16::MAX)
            .map(|n| ServerId::new(&n.to_be_bytes()).unwrap())
            .find(|id| home(id) == home(&sid(a)) && *id != sid(a) && *id != sid(b))
            .unwrap();
        let client = sock("192.168.10.20:43000");
        let maglev = env.predicted_backend(&v, &flow_key(client, d, PROTO_UDP));
        let before = routing(env);
        assert_eq!(sent_to(env, client, d, &short_header(&cid(&nobody, 3))), maglev);
        assert_eq!(routing(env), [before[0], before[1] + 1]);
    });
}

#[test]
fn an_icmp_error_about_a_quic_flow_goes_to_the_flows_backend_uncounted() {
    with_env(|env| {
        let backends: Vec<IpAddr> = (101..=105).map(|n| packet_lab::backend4(n).into()).collect();
        quic_vip(env, "10.200.1.1:443/udp", &backends);
        let (c, d) = (sock("192.168.10.20:40000"), sock("10.200.1.1:443"));
        let pinned = sent_to(env, c, d, &initial(&[7; 8]));
        assert_eq!(env.pinned_backend(&flow_key(c, d, PROTO_UDP)), Some(pinned));
        // The bytes where a short header's first octet and id would be are the quoted IP
        // header's: read as an id, they would be counted (and could name a backend).
        let before = routing(env);
        let icmp = frames::icmp_frag_needed_udp(ip("192.168.1.1"), d, c, 1400);
        let out = env.expect(&icmp, XDP_TX, Reason::Tx);
        assert_eq!(outer_destination(&out.frame), pinned);
        assert_eq!(routing(env), before, "an ICMP error is no short header");
    });
}

#[test]
fn a_quic_vip_hashed_by_source_routes_short_headers_by_id_and_the_rest_by_client() {
    with_env(|env| {
        let (backends, v, d) = three_backend_vip(env);
        env.update(|s| s.set_hash(&v, spillway_model::HashMode::Source, None).unwrap());
        for (i, client) in clients(30).enumerate() {
            // Short headers: the backend the id names, whatever the client's hash says.
            let named = backends[i % 3];
            let id = cid(&server_id_of(named, CONFIG.server_id_len), i as u64);
            assert_eq!(sent_to(env, client, d, &short_header(&id)), named, "{client}: the backend its connection id names");
            // Initials from any port of the client: its one backend by the source hash.
            let by_source: std::collections::BTreeSet<IpAddr> =
                (0..4u16).map(|p| sent_to(env, SocketAddr::new(client.ip(), 50000 + 17 * p + i as u16), d, &initial(&id))).collect();
            assert_eq!(by_source.len(), 1, "{client}'s Initials went to {by_source:?}");
            assert_eq!(by_source.first(), Some(&env.predicted_backend(&v, &flow_key(client, d, PROTO_UDP))));
        }
    });
}
