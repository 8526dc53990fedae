//! Fragmented datagrams to UDP VIPs: the first fragment is placed as its flow and records
//! its backend; the later ones follow the record, so a whole datagram reaches one backend.
//! A later fragment without a record is dropped, never guessed; fragments to TCP VIPs are
//! dropped and those to other addresses pass, as before; a source records a bounded share of
//! datagrams, and a flood of fragments evicts no connection.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use spillway_common::{
    limits::{Capacity, FLOW_WAYS, FRAGMENT_SOURCE_BURST, FRAGMENT_SOURCE_PER_S},
    types::{DecapReason, PROTO_TCP, PROTO_UDP, Reason},
};
use spillway_harness::{frames, packet_lab, rng::Rng};

use crate::decap::{backend_host, run_decap};
use crate::support::*;

/// UDP bytes per fragment: an IPv4 fragment of 1,420 bytes, in an IPv6 tunnel, fits the
/// lab's 1,500-byte MTU.
const CHUNK: usize = 1400;
/// UDP payload of a 4,000-byte datagram: three fragments.
const PAYLOAD: usize = 4000 - 8;

const VIP4: &str = "10.200.1.1:53";
const VIP6: &str = "[2001:db8:100::1]:53";

/// A 4,000-byte datagram from `client` to `vip`, fragmented (identification `id`).
fn datagram(client: SocketAddr, vip: SocketAddr, id: u32) -> Vec<Vec<u8>> {
    let payload: Vec<u8> = (0..PAYLOAD).map(|i| (i as u32 ^ id) as u8).collect();
    let fragments = frames::udp_fragments(client, vip, &payload, CHUNK, id);
    assert_eq!(fragments.len(), 3);
    fragments
}

/// The two UDP VIPs (one per family), each on three backends of its family.
fn udp_vips(env: &mut Env) -> [(SocketAddr, Vec<IpAddr>); 2] {
    let v4: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend4(n).into()).collect();
    let v6: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend6(n).into()).collect();
    env.add_vip(vip(&format!("{VIP4}/udp")), &v4);
    env.add_vip(vip(&format!("{VIP6}/udp")), &v6);
    [(sock(VIP4), v4), (sock(VIP6), v6)]
}

/// Client `n` of `vip`'s family.
fn client(vip: SocketAddr, n: u16) -> SocketAddr {
    if vip.is_ipv4() { sock(&format!("192.168.10.20:{}", 40000 + n)) } else { sock(&format!("[2001:db8::20]:{}", 40000 + n)) }
}

/// Sends every fragment of `fragments`, each forwarded to `backend` unchanged inside its
/// tunnel.
fn expect_whole_at(env: &Env, fragments: &[Vec<u8>], l2_len: usize, backend: IpAddr) {
    for (i, f) in fragments.iter().enumerate() {
        let out = env.expect(f, XDP_TX, Reason::Tx);
        frames::check_encap(&out.frame, f, l2_len, backend, None).unwrap_or_else(|e| panic!("fragment {i}: {e:#}"));
    }
}

#[test]
fn every_fragment_follows_its_first_to_the_backend_its_flow_has() {
    with_env(|env| {
        for (v, backends) in udp_vips(env) {
            let service = vip(&format!("{v}/udp"));
            let mut used = HashSet::new();
            for n in 0..30 {
                let c = client(v, n);
                let backend = env.predicted_backend(&service, &flow_key(c, v, PROTO_UDP));
                expect_whole_at(env, &datagram(c, v, 7 + u32::from(n)), 14, backend);
                // The flow's next datagram, unfragmented, goes where its entry says: the same.
                let small = frames::udp(c, v, b"small");
                expect_encap(&env.expect(&small, XDP_TX, Reason::Tx).frame, &small, 14, backend, None);
                used.insert(backend);
            }
            assert_eq!(used.len(), backends.len(), "{v}: datagrams spread over every backend as their flows are");
            // Tagged: the fragments keep their VLAN tag's room, and follow as well.
            let c = client(v, 99);
            let tagged: Vec<Vec<u8>> = datagram(c, v, 5).iter().map(|f| frames::with_vlan(f, 3)).collect();
            expect_whole_at(env, &tagged, 18, env.predicted_backend(&service, &flow_key(c, v, PROTO_UDP)));
        }
    });
}

#[test]
fn a_fragment_ahead_of_its_first_is_dropped_and_never_guessed() {
    with_env(|env| {
        for (v, _) in udp_vips(env) {
            let c = client(v, 1);
            let backend = env.predicted_backend(&vip(&format!("{v}/udp")), &flow_key(c, v, PROTO_UDP));
            let [first, middle, last] = <[Vec<u8>; 3]>::try_from(datagram(c, v, 0x1234)).unwrap();
            // Ahead of the first: no record yet, so dropped (the datagram is lost, as it would
            // be at a backend that never saw the first).
            env.expect(&middle, XDP_DROP, Reason::DropFragmentUnmatched);
            env.expect(&last, XDP_DROP, Reason::DropFragmentUnmatched);
            // The first, then the others in any order, follow it.
            expect_whole_at(env, &[first, last, middle], 14, backend);
            // Another datagram of the same client is another record.
            let other = datagram(c, v, 0x1235);
            env.expect(&other[2], XDP_DROP, Reason::DropFragmentUnmatched);
            expect_whole_at(env, &other, 14, backend);
        }
    });
}

#[test]
fn a_record_whose_backend_left_is_not_followed() {
    with_env(|env| {
        let (v, a, b) = (sock(VIP4), IpAddr::from(packet_lab::backend4(101)), IpAddr::from(packet_lab::backend4(102)));
        let service = vip(&format!("{VIP4}/udp"));
        env.add_vip(service, &[a]);
        let c = client(v, 1);
        let fragments = datagram(c, v, 9);
        expect_whole_at(env, &fragments[..1], 14, a);
        let id = env.balancer.maps.flow(&flow_key(c, v, PROTO_UDP)).unwrap().backend_id;
        // The backend leaves and another takes its id: the record names the old generation.
        env.update(|s| s.remove_backend(&service, a).unwrap());
        env.update(|s| s.add_backend(&service, b, 100).unwrap());
        assert_eq!(env.backend_addr(id), b, "the new backend reuses the id");
        env.expect(&fragments[1], XDP_DROP, Reason::DropFragmentUnmatched);
    });
}

#[test]
fn fragments_to_a_tcp_vip_are_dropped_and_to_other_addresses_pass_as_before() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        env.add_vip(vip("[2001:db8:100::1]:80/tcp"), &[packet_lab::backend6(101).into()]);
        env.add_vip(vip("10.200.1.2:53/udp"), &[packet_lab::backend4(101).into()]);
        for (c, tcp_vip) in
            [(sock("192.168.10.20:40000"), sock("10.200.1.1:80")), (sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"))]
        {
            // TCP fragments to a TCP VIP, first and later.
            let segment = frames::tcp(c, tcp_vip, false, &[0x5a; 64]);
            if c.is_ipv4() {
                env.expect(&frames::as_ipv4_fragment(&segment, true, 0), XDP_DROP, Reason::DropFragment);
                env.expect(&frames::as_ipv4_fragment(&segment, false, 185), XDP_DROP, Reason::DropFragment);
            } else {
                env.expect(&frames::as_ipv6_fragment(&segment), XDP_DROP, Reason::DropFragment);
            }
            // UDP to the TCP VIP's port: no UDP VIP serves it. Its later fragments cannot say
            // which port they are for: without a record, unmatched.
            let udp = datagram(c, tcp_vip, 3);
            env.expect(&udp[0], XDP_DROP, Reason::DropFragment);
            env.expect(&udp[1], XDP_DROP, Reason::DropFragmentUnmatched);
            // To an address no VIP uses: the host's, passed whole to its kernel.
            let host = if c.is_ipv4() { sock("10.1.0.1:53") } else { sock("[fd01::1]:53") };
            for f in datagram(c, host, 4) {
                assert_eq!(env.expect(&f, XDP_PASS, Reason::PassNotVip).frame, f);
            }
        }
        // A UDP VIP's address, another port.
        let other_port = datagram(sock("192.168.10.20:40000"), sock("10.200.1.2:54"), 5);
        env.expect(&other_port[0], XDP_DROP, Reason::DropFragment);
    });
}

/// Sends `n` first fragments from `source` (fresh identifications) and returns the
/// identifications recorded and refused, checking each was one or the other, and how long
/// sending took. One test run each, the counters read once: the faster they go, the more
/// the bucket must refuse.
fn first_fragments(env: &Env, source: impl Fn(u32) -> SocketAddr, v: SocketAddr, n: u32) -> (Vec<u32>, Vec<u32>, Duration) {
    let frames: Vec<Vec<u8>> = (0..n).map(|id| datagram(source(id), v, 1000 + id).swap_remove(0)).collect();
    let before = env.reasons();
    let start = Instant::now();
    let (mut recorded, mut refused) = (Vec::new(), Vec::new());
    for (id, frame) in (0..).zip(&frames) {
        if env.run(frame).action == XDP_TX { recorded.push(id) } else { refused.push(id) }
    }
    let elapsed = start.elapsed();
    let after = env.reasons();
    let counted = |r: Reason| after[r as usize] - before[r as usize];
    assert_eq!((counted(Reason::Tx), counted(Reason::DropFragmentLimited)), (recorded.len() as u64, refused.len() as u64));
    (recorded, refused, elapsed)
}

#[test]
fn a_source_records_at_most_its_share_of_datagrams() {
    with_env(|env| {
        for (v, _) in udp_vips(env) {
            // IPv6 sources share a bucket per /64: the sender's other addresses buy nothing.
            let source = move |i: u32| {
                if v.is_ipv4() {
                    sock("192.168.10.66:4000")
                } else {
                    SocketAddr::new(format!("2001:db8:6::{:x}", i + 1).parse().unwrap(), 4000)
                }
            };
            let entries_before = env.flow_entries();
            let (recorded, refused, elapsed) = first_fragments(env, source, v, 5000);
            let limit = allowance(FRAGMENT_SOURCE_PER_S, FRAGMENT_SOURCE_BURST, elapsed);
            let n = recorded.len() as u64;
            println!("{v}: {n} of 5000 datagrams recorded in {elapsed:?} (at most {limit})");
            assert!(n > u64::from(FRAGMENT_SOURCE_BURST) && n <= limit, "{n} recorded, the limit allows {limit}");
            // A refused first fragment took no connection-table entry: the IPv4 source's one
            // flow holds one, and each IPv6 address one per recorded datagram at most.
            let (confirmed, unconfirmed) = env.flow_entries();
            let added = (confirmed + unconfirmed) - (entries_before.0 + entries_before.1);
            assert!(added as u64 <= if v.is_ipv4() { 1 } else { n }, "{added} entries for {n} recorded datagrams");
            // A refused datagram's later fragments find no record; a recorded one's follow.
            let id = refused[0];
            env.expect(&datagram(source(id), v, 1000 + id)[1], XDP_DROP, Reason::DropFragmentUnmatched);
            let id = recorded[0];
            env.expect(&datagram(source(id), v, 1000 + id)[1], XDP_TX, Reason::Tx);
            // Another source is unaffected: it spent only its own share.
            let other = client(v, 7);
            expect_whole_at(
                env,
                &datagram(other, v, 77),
                14,
                env.predicted_backend(&vip(&format!("{v}/udp")), &flow_key(other, v, PROTO_UDP)),
            );
        }
    });
}

#[test]
fn a_flood_of_spoofed_fragments_evicts_no_connection() {
    // A small table: 2,048 buckets of four entries, and 1,024 fragment records.
    let capacity = Capacity { vips: 8, backends: 64, flows: 4096, ring_slots: 8 * 2 * 4099, fragments: 1024 };
    with_env_sized(capacity, |env| {
        let [(v, _), _] = udp_vips(env);
        let tcp_vip = sock("10.200.1.1:80");
        env.add_vip(vip("10.200.1.1:80/tcp"), &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<IpAddr>>());
        // Honest connections: TCP past its handshake, UDP with a second packet (confirmed).
        let mut honest = Vec::new();
        for i in 0..200u16 {
            let (c, tcp, udp) = (sock(&format!("192.168.10.20:{}", 20_000 + i)), frames::tcp, frames::udp);
            env.expect(&tcp(c, tcp_vip, true, &[]), XDP_TX, Reason::Tx);
            env.expect(&tcp(c, tcp_vip, false, &[]), XDP_TX, Reason::Tx);
            env.expect(&udp(c, v, b"one"), XDP_TX, Reason::Tx);
            env.expect(&udp(c, v, b"two"), XDP_TX, Reason::Tx);
            for (d, proto) in [(tcp_vip, PROTO_TCP), (v, PROTO_UDP)] {
                honest.push((c, d, proto, env.pinned_backend(&flow_key(c, d, proto)).unwrap()));
            }
        }
        assert_eq!(env.flow_entries(), (honest.len(), 0));

        let mut rng = Rng::new(0xf7a9);
        let mut spoofed = || {
            let n = rng.next_u64() as u32;
            let [_, b, c, d] = n.to_be_bytes();
            (SocketAddr::from(([172, 16 + (b & 15), c, d], 1024 + (n % 50_000) as u16)), rng.next_u64() as u32)
        };
        // Later fragments with random identifications, four times as many as the records:
        // none has a record, none takes anything.
        let before = env.reasons()[Reason::DropFragmentUnmatched as usize];
        for _ in 0..4 * capacity.fragments {
            let (from, id) = spoofed();
            env.run(&datagram(from, v, id)[1]);
        }
        assert_eq!(env.reasons()[Reason::DropFragmentUnmatched as usize] - before, u64::from(4 * capacity.fragments));
        assert_eq!(env.flow_entries(), (honest.len(), 0), "unmatched fragments took no entry");

        // First fragments, each a new flow from a new spoofed source, twice as many as the
        // table has entries: each takes what an unfragmented packet of its flow would, an
        // unconfirmed entry, and their records churn only each other.
        let entries = capacity.flow_buckets() * FLOW_WAYS;
        let before = env.reasons()[Reason::Tx as usize];
        for _ in 0..2 * entries {
            let (from, id) = spoofed();
            env.run(&datagram(from, v, id)[0]);
        }
        assert_eq!(env.reasons()[Reason::Tx as usize] - before, u64::from(2 * entries), "every spoofed first fragment was placed");
        let (confirmed, unconfirmed) = env.flow_entries();
        assert_eq!(confirmed, honest.len(), "every honest connection kept its entry");
        assert!(unconfirmed > entries as usize / 2, "the flood filled the rest of the table: {unconfirmed} of {entries}");
        for (c, d, proto, backend) in &honest {
            assert_eq!(env.pinned_backend(&flow_key(*c, *d, *proto)), Some(*backend), "{c} -> {d}");
        }
        // An honest datagram still arrives whole where its flow is.
        let (c, _, _, backend) = honest[1];
        expect_whole_at(env, &datagram(c, v, 4242), 14, backend);
    });
}

#[test]
fn the_backend_strips_each_fragments_tunnel_and_passes_the_fragment() {
    with_env(|env| {
        backend_host(env);
        for (outer_src, outer_dst, c, v) in
            [("10.9.0.1", "10.1.0.1", client(sock(VIP4), 1), sock(VIP4)), ("fd09::1", "fd01::1", client(sock(VIP6), 1), sock(VIP6))]
        {
            for fragment in datagram(c, v, 11) {
                let tunnel = frames::tunnel(ip(outer_src), ip(outer_dst), &fragment[14..]);
                let out = run_decap(env, &tunnel, XDP_PASS, DecapReason::Decapsulated);
                assert_eq!(out[12..], fragment[12..], "{outer_src}: the fragment, unchanged, for the kernel to reassemble");
            }
        }
        // A later fragment whose payload happens to read as a UDP header to the GUE port is
        // no tunnel: sent to an address the host does not have, it is refused as any packet.
        env.decap_gue_port(6080);
        let c = client(sock(VIP4), 2);
        let mut payload = vec![0u8; PAYLOAD];
        payload[CHUNK - 8..CHUNK - 4].copy_from_slice(&[0x17, 0xc0, 0x17, 0xc0]);
        let later = &frames::udp_fragments(c, sock("10.200.9.9:53"), &payload, CHUNK, 12)[1];
        run_decap(env, &frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &later[14..]), XDP_DROP, DecapReason::DropInnerNotLocal);
    });
}
