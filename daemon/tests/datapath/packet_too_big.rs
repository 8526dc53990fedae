//! "Packet too big": a packet that would exceed the egress MTU once encapsulated is answered
//! with ICMP "fragmentation needed" / ICMPv6 "packet too big" advising the MTU that fits,
//! rate-limited per source and in all; ICMP errors, fragments, IPv4 without DF and sources
//! no host has are dropped unanswered.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use spillway_common::{
    limits::{PTB_GLOBAL_BURST, PTB_GLOBAL_PER_S, PTB_SOURCE_BURST, PTB_SOURCE_ENTRIES, PTB_SOURCE_PER_S},
    types::{PROTO_TCP, Reason},
};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

const MTU: usize = packet_lab::MTU as usize;

/// A TCP segment from `client` to `vip` whose IP packet is `l3_len` bytes (DF as given).
fn segment(client: SocketAddr, vip: SocketAddr, l3_len: usize, df: bool) -> Vec<u8> {
    let header = if client.is_ipv4() { 20 + 20 } else { 40 + 20 };
    let f = frames::tcp(client, vip, false, &vec![0x5a; l3_len - header]);
    if client.is_ipv4() { frames::with_dont_fragment(&f, df) } else { f }
}

fn expect_answer(out: &[u8], input: &[u8], l2_len: usize, mtu: usize) {
    frames::check_packet_too_big(out, input, l2_len, mtu as u32).unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn an_oversize_packet_is_answered_with_the_mtu_that_fits() {
    with_env(|env| {
        // (client, VIP, backend, outer header): IPIP, IP6IP6 and IPv4 in IPv6.
        for (n, (client, v, backend, outer)) in [
            ("192.168.10.20:40000", "10.200.1.1:80", std::net::IpAddr::from(packet_lab::backend4(101)), 20),
            ("[2001:db8::20]:40000", "[2001:db8:100::1]:80", packet_lab::backend6(101).into(), 40),
            ("192.168.10.21:40000", "10.200.1.2:80", packet_lab::backend6(102).into(), 40),
        ]
        .into_iter()
        .enumerate()
        {
            env.add_vip(vip(&format!("{v}/tcp")), &[backend]);
            let (client, v) = (sock(client), sock(v));
            let fits = segment(client, v, MTU - outer, true);
            env.expect(&fits, XDP_TX, Reason::Tx);
            let over = segment(client, v, MTU - outer + 1, true);
            let out = env.expect(&over, XDP_TX, Reason::TxPacketTooBig);
            expect_answer(&out.frame, &over, 14, MTU - outer);
            // Tagged: the answer keeps the tag, so it goes back on the client's VLAN.
            let tagged = frames::with_vlan(&over, 7 + n as u16);
            let out = env.expect(&tagged, XDP_TX, Reason::TxPacketTooBig);
            expect_answer(&out.frame, &tagged, 18, MTU - outer);
        }
    });
}

#[test]
fn a_second_chance_packet_is_advised_room_for_both_tunnels() {
    with_env(|env| {
        let v = vip_gaining_a_fourth_backend(env);
        let d = sock("10.200.1.1:80");
        let client = |port: u16| sock(&format!("192.168.10.20:{port}"));
        let key = |port| flow_key(client(port), d, PROTO_TCP);
        let prior = env.balancer.maps.vips.get(&spillway_reconcile::vip_key(&v)).unwrap().prior;
        let moved = (40000..41000)
            .find(|&p| {
                let before =
                    env.balancer.maps.rings.choice(prior, spillway_common::hash::flow_hash(&key(p), spillway_common::hash::FLOW_SEED));
                before.map(|id| env.backend_addr(id)) != Some(env.predicted_backend(&v, &key(p)))
            })
            .unwrap();
        let sent = env.balancer.maps.second_chance_packets().unwrap();
        // Two IPv4 tunnels: 40 bytes of overhead.
        env.expect(&segment(client(moved), d, MTU - 40, true), XDP_TX, Reason::Tx);
        assert_eq!(env.balancer.maps.second_chance_packets().unwrap(), sent + 1, "sent with both candidates");
        let over = segment(client(moved), d, MTU - 40 + 1, true);
        let out = env.expect(&over, XDP_TX, Reason::TxPacketTooBig);
        expect_answer(&out.frame, &over, 14, MTU - 40);
    });
}

#[test]
fn errors_fragments_no_df_and_bogus_sources_are_dropped_unanswered() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        env.add_vip(vip("[2001:db8:100::1]:80/tcp"), &[packet_lab::backend6(101).into()]);
        let (client, v) = (sock("192.168.10.20:40000"), sock("10.200.1.1:80"));
        let over = segment(client, v, MTU - 20 + 1, true);
        // IPv4 without DF: its sender did not ask for path MTU discovery.
        env.expect(&frames::with_dont_fragment(&over, false), XDP_DROP, Reason::DropOversize);
        // An ICMP error is never answered, however big.
        let mut error = frames::icmp_frag_needed(ip("192.168.10.1"), v, client, 1400);
        error.resize(over.len(), 0);
        frames::fit_ipv4_length(&mut error);
        env.expect(&frames::with_dont_fragment(&error, true), XDP_DROP, Reason::DropOversize);
        let mut error6 = frames::icmp6_packet_too_big(ip("2001:db8::1"), sock("[2001:db8:100::1]:80"), sock("[2001:db8::20]:40000"), 1400);
        error6.resize(14 + MTU - 40 + 1, 0);
        frames::fit_ipv6_length(&mut error6);
        env.expect(&error6, XDP_DROP, Reason::DropOversize);
        // Fragments, first or not, are dropped before (no ports to place them by).
        env.expect(&frames::as_ipv4_fragment(&over, true, 0), XDP_DROP, Reason::DropFragment);
        env.expect(&frames::as_ipv4_fragment(&over, false, 185), XDP_DROP, Reason::DropFragment);
        let over6 = segment(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), MTU - 40 + 1, true);
        env.expect(&frames::as_ipv6_fragment(&over6), XDP_DROP, Reason::DropFragment);
        // Sources no host has: an answer would go to a group, to this host or nowhere.
        for bogus in ["127.0.0.1:40000", "0.1.2.3:40000", "224.0.0.5:40000", "255.255.255.255:40000"] {
            env.expect(&segment(sock(bogus), v, MTU - 20 + 1, true), XDP_DROP, Reason::DropOversize);
        }
        for bogus in ["[ff02::1]:40000", "[::1]:40000", "[::]:40000"] {
            env.expect(&segment(sock(bogus), sock("[2001:db8:100::1]:80"), MTU - 40 + 1, true), XDP_DROP, Reason::DropOversize);
        }
        // Still answered: the same packet with DF, from a host.
        env.expect(&over, XDP_TX, Reason::TxPacketTooBig);
    });
}

/// Runs `frames`; how many were answered (each is answered or limited).
fn answered(env: &Env, frames: impl Iterator<Item = Vec<u8>>) -> u64 {
    answered_or_limited(env, frames, Reason::TxPacketTooBig, Reason::DropOversizeLimited)
}

#[test]
fn a_spoofed_flood_from_one_source_gets_at_most_its_limit_of_answers() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        env.add_vip(vip("[2001:db8:100::1]:80/tcp"), &[packet_lab::backend6(101).into()]);
        // (the victim's addresses, another source, VIP, outer header). IPv6 sources share a
        // bucket per /64: the attacker's other addresses in it buy nothing.
        let v4: fn(u32) -> std::net::IpAddr = |_| "192.168.10.66".parse().unwrap();
        let v6: fn(u32) -> std::net::IpAddr = |i| format!("2001:db8:6::{:x}", i + 1).parse().unwrap();
        let cases = [(v4, "192.168.10.67:40000", "10.200.1.1:80", 20), (v6, "[2001:db8:7::1]:40000", "[2001:db8:100::1]:80", 40)];
        for (victim, other, v, outer) in cases {
            let start = Instant::now();
            let flood = (0..2000u32).map(|i| segment(SocketAddr::new(victim(i), 1024 + i as u16), sock(v), MTU - outer + 1, true));
            let got = answered(env, flood);
            let limit = allowance(PTB_SOURCE_PER_S, PTB_SOURCE_BURST, start.elapsed());
            println!("{}: {got} answers to 2000 oversize packets in {:?} (at most {limit})", victim(0), start.elapsed());
            assert!(got >= 1 && got <= limit, "{got} answers, the limit allows {limit}");
            // Another source is still answered: the flood spent only its own bucket.
            env.expect(&segment(sock(other), sock(v), MTU - outer + 1, true), XDP_TX, Reason::TxPacketTooBig);
        }
    });
}

#[test]
fn a_flood_from_many_sources_gets_at_most_the_global_limit_of_answers() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        // More sources than the source table holds: the LRU forgets some, which only gives
        // them a full bucket again.
        let sources = PTB_SOURCE_ENTRIES + 1000;
        let start = Instant::now();
        let flood = (0..sources).map(|i| {
            let from = SocketAddr::from(([100, 64 + (i >> 16) as u8, (i >> 8) as u8, i as u8], 40000));
            segment(from, sock("10.200.1.1:80"), MTU - 20 + 1, true)
        });
        let got = answered(env, flood);
        let limit = allowance(PTB_GLOBAL_PER_S, PTB_GLOBAL_BURST, start.elapsed());
        println!("{got} answers to {sources} sources in {:?} (at most {limit})", start.elapsed());
        assert!(got > PTB_GLOBAL_BURST as u64 / 2 && got <= limit, "{got} answers, the limit allows {limit}");
        // Once the global bucket has refilled a little, an honest client is answered again:
        // the flood held nothing it needs.
        std::thread::sleep(Duration::from_millis(100));
        env.expect(&segment(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), MTU - 20 + 1, true), XDP_TX, Reason::TxPacketTooBig);
    });
}
