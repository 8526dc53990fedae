//! Ping a VIP: an ICMP or ICMPv6 echo request to a VIP address is answered in place while a
//! VIP at the address has a backend taking new flows, rate-limited per source and in all;
//! anything else to the address that is not TCP or UDP stays dropped (`drop_no_service`).

use std::net::IpAddr;
use std::time::Instant;

use spillway_common::{
    limits::{DEFAULT_ECHO_PER_SOURCE, DEFAULT_ECHO_TOTAL, ECHO_SOURCE_ENTRIES},
    types::{EchoConfig, Reason},
};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

const VIP4: &str = "10.200.1.1";
const VIP6: &str = "2001:db8:100::1";
const CLIENT4: &str = "192.168.10.20";
const CLIENT6: &str = "2001:db8::20";

/// `ping`'s request: 56 bytes of payload.
fn ping(client: &str, vip: &str) -> Vec<u8> {
    frames::echo_request(ip(client), ip(vip), 0x1234, 1, &[0xa5; 56])
}

/// A TCP VIP on port 80 of each family's VIP address, one backend each; answers at `rates`.
fn serving(env: &mut Env, rates: EchoConfig) {
    env.add_vip(vip(&format!("{VIP4}:80/tcp")), &[packet_lab::backend4(101).into()]);
    env.add_vip(vip(&format!("[{VIP6}]:80/tcp")), &[packet_lab::backend6(101).into()]);
    env.balancer.maps.set_echo_config(&rates).unwrap();
}

fn defaults() -> EchoConfig {
    EchoConfig::new(DEFAULT_ECHO_PER_SOURCE, DEFAULT_ECHO_TOTAL)
}

fn expect_reply(env: &Env, request: &[u8], l2_len: usize) {
    let out = env.expect(request, XDP_TX, Reason::TxEchoReply);
    frames::check_echo_reply(&out.frame, request, l2_len).unwrap_or_else(|e| panic!("{e:#}"));
}

#[test]
fn a_ping_to_a_serving_vip_is_answered_in_place() {
    with_env(|env| {
        serving(env, defaults());
        for (client, v) in [(CLIENT4, VIP4), (CLIENT6, VIP6)] {
            // Empty, ping's and a large payload: the reply is the request turned around.
            for size in [0, 56, 1400] {
                let request = frames::echo_request(ip(client), ip(v), 7, size as u16, &vec![0x5a; size]);
                expect_reply(env, &request, 14);
            }
            // Tagged: the reply keeps the tag, so it goes back on the client's VLAN.
            let tagged = frames::with_vlan(&ping(client, v), 7);
            expect_reply(env, &tagged, 18);
            // Ethernet padding after the packet stays padding: the frame does not grow.
            let mut padded = ping(client, v);
            padded.extend_from_slice(&[0; 8]);
            expect_reply(env, &padded, 14);
        }
        // TCP to the VIP still goes to its backend, and another port is no service.
        env.expect(&frames::tcp(sock(&format!("{CLIENT4}:40000")), sock(&format!("{VIP4}:80")), true, &[]), XDP_TX, Reason::Tx);
        env.expect(&frames::udp(sock(&format!("{CLIENT4}:40000")), sock(&format!("{VIP4}:53")), &[0; 8]), XDP_DROP, Reason::DropNoService);
        // A ping to an address no VIP uses is the host's.
        env.expect(&ping(CLIENT4, "10.200.9.9"), XDP_PASS, Reason::PassNotVip);
    });
}

#[test]
fn a_vip_whose_backends_are_all_out_is_not_answered() {
    with_env(|env| {
        serving(env, defaults());
        let (v4, v6) = (vip(&format!("{VIP4}:80/tcp")), vip(&format!("[{VIP6}]:80/tcp")));
        let (b4, b6): (IpAddr, IpAddr) = (packet_lab::backend4(101).into(), packet_lab::backend6(101).into());
        let (p4, p6) = (ping(CLIENT4, VIP4), ping(CLIENT6, VIP6));
        // Drained (weight 0, as the health policy programs a failed backend).
        env.update(|s| {
            s.set_weight(&v4, b4, 0).unwrap();
            s.set_weight(&v6, b6, 0).unwrap();
        });
        env.expect(&p4, XDP_DROP, Reason::DropNoService);
        env.expect(&p6, XDP_DROP, Reason::DropNoService);
        // Back in service: answered again.
        env.update(|s| {
            s.set_weight(&v4, b4, 100).unwrap();
            s.set_weight(&v6, b6, 100).unwrap();
        });
        expect_reply(env, &p4, 14);
        expect_reply(env, &p6, 14);
        // Removed: no backend at all.
        env.update(|s| {
            s.remove_backend(&v4, b4).unwrap();
            s.remove_backend(&v6, b6).unwrap();
        });
        env.expect(&p4, XDP_DROP, Reason::DropNoService);
        env.expect(&p6, XDP_DROP, Reason::DropNoService);
        // Another VIP at the same address with a backend: the address serves again.
        env.add_vip(vip(&format!("{VIP4}:53/udp")), &[packet_lab::backend4(102).into()]);
        expect_reply(env, &p4, 14);
        env.expect(&p6, XDP_DROP, Reason::DropNoService);
    });
}

/// `request`'s IPv4 header's total length set to `total` (the frame keeps its bytes).
fn with_ipv4_total_length(request: &[u8], total: u16) -> Vec<u8> {
    let mut f = request.to_vec();
    f[16..18].copy_from_slice(&total.to_be_bytes());
    f[24..26].copy_from_slice(&[0, 0]);
    let sum = frames::ipv4_checksum(&f[14..34]);
    f[24..26].copy_from_slice(&sum.to_be_bytes());
    f
}

#[test]
fn odd_requests_are_dropped_unanswered() {
    with_env(|env| {
        serving(env, defaults());
        let (p4, p6) = (ping(CLIENT4, VIP4), ping(CLIENT6, VIP6));
        // IPv4 options would have to be echoed or cut; IPv6 extension headers likewise: only
        // a plain request is answered.
        env.expect(&frames::with_ipv4_options(&p4, 2), XDP_DROP, Reason::DropNoService);
        // A hop-by-hop options header (0) in front of the ICMPv6 header.
        env.expect(&frames::with_ipv6_extension_headers(&p6, &[0]), XDP_DROP, Reason::DropNoService);
        // Fragments never reach the answer (no ports: dropped as every fragment to a VIP).
        env.expect(&frames::as_ipv4_fragment(&p4, true, 0), XDP_DROP, Reason::DropFragment);
        env.expect(&frames::as_ipv6_fragment(&p6), XDP_DROP, Reason::DropFragment);
        // An ICMP header that lies past the IP packet's stated length.
        env.expect(&with_ipv4_total_length(&p4, 24), XDP_DROP, Reason::DropNoService);
        // Other ICMP: a reply, a timestamp request, an echo request with another code.
        for (kind, code) in [(0, 0), (13, 0), (8, 1)] {
            let mut f = p4.clone();
            (f[34], f[35]) = (kind, code);
            env.expect(&f, XDP_DROP, Reason::DropNoService);
        }
        for (kind, code) in [(129, 0), (128, 1)] {
            let mut f = p6.clone();
            (f[54], f[55]) = (kind, code);
            env.expect(&f, XDP_DROP, Reason::DropNoService);
        }
        // Another protocol (GRE) to the VIP address.
        let mut gre = p4.clone();
        gre[23] = 47;
        gre[24..26].copy_from_slice(&[0, 0]);
        let sum = frames::ipv4_checksum(&gre[14..34]);
        gre[24..26].copy_from_slice(&sum.to_be_bytes());
        env.expect(&gre, XDP_DROP, Reason::DropNoService);
        // Sources no host has: a reply would go to a group, to this host or nowhere.
        for bogus in ["127.0.0.1", "0.1.2.3", "224.0.0.5", "255.255.255.255"] {
            env.expect(&ping(bogus, VIP4), XDP_DROP, Reason::DropNoService);
        }
        for bogus in ["ff02::1", "::1", "::"] {
            env.expect(&ping(bogus, VIP6), XDP_DROP, Reason::DropNoService);
        }
        // Truncated headers are the kernel's to refuse, as any.
        env.expect(&p4[..14 + 20 + 4], XDP_PASS, Reason::PassMalformed);
        // Still answered: the plain request.
        expect_reply(env, &p4, 14);
        expect_reply(env, &p6, 14);
        // A zero rate answers nothing (`lbd --echo-total 0`, or a config not yet written).
        env.balancer.maps.set_echo_config(&EchoConfig::new(DEFAULT_ECHO_PER_SOURCE, 0)).unwrap();
        env.expect(&p4, XDP_DROP, Reason::DropNoService);
        env.balancer.maps.set_echo_config(&EchoConfig::new(0, DEFAULT_ECHO_TOTAL)).unwrap();
        env.expect(&p6, XDP_DROP, Reason::DropNoService);
    });
}

/// Runs `requests`; how many were answered (each is answered or limited).
fn answered(env: &Env, requests: impl Iterator<Item = Vec<u8>>) -> u64 {
    answered_or_limited(env, requests, Reason::TxEchoReply, Reason::DropEchoLimited)
}

#[test]
fn a_flood_from_one_source_gets_at_most_its_limit_of_answers() {
    with_env(|env| {
        let (per_source, total) = (5, 100_000);
        serving(env, EchoConfig::new(per_source, total));
        // (the flooding source's addresses, another source, VIP). IPv6 sources share a bucket
        // per /64: the attacker's other addresses in it buy nothing.
        let v4: fn(u32) -> String = |_| CLIENT4.to_owned();
        let v6: fn(u32) -> String = |i| format!("2001:db8:6::{:x}", i + 1);
        let cases = [(v4, "192.168.10.21", VIP4), (v6, "2001:db8:7::1", VIP6)];
        for (flooder, other, v) in cases {
            let start = Instant::now();
            let got = answered(env, (0..500u32).map(|i| frames::echo_request(ip(&flooder(i)), ip(v), 1, i as u16, &[0; 56])));
            let limit = allowance(per_source, per_source, start.elapsed());
            println!("{}: {got} answers to 500 requests in {:?} (at most {limit})", flooder(0), start.elapsed());
            assert!(got >= 1 && got <= limit, "{got} answers, the limit allows {limit}");
            // Another source is still answered: the flood spent only its own bucket.
            expect_reply(env, &ping(other, v), 14);
        }
    });
}

#[test]
fn spoofed_sources_get_at_most_the_total_limit_and_take_nothing_from_the_service() {
    with_env(|env| {
        let total = 50;
        serving(env, EchoConfig::new(DEFAULT_ECHO_PER_SOURCE, total));
        // More sources than the source table holds: the LRU forgets some, which only gives
        // them a full bucket again; the total bounds what they all get.
        let sources = ECHO_SOURCE_ENTRIES + 1000;
        let start = Instant::now();
        let flood = (0..sources).map(|i| {
            let from = IpAddr::from([100, 64 + (i >> 16) as u8, (i >> 8) as u8, i as u8]);
            frames::echo_request(from, ip(VIP4), 1, 1, &[0; 56])
        });
        let got = answered(env, flood);
        let limit = allowance(total, total, start.elapsed());
        println!("{got} answers to {sources} sources in {:?} (at most {limit})", start.elapsed());
        assert!(got >= 1 && got <= limit, "{got} answers, the limit allows {limit}");
        // The service itself is untouched: a new connection goes to its backend at once.
        env.expect(&frames::tcp(sock(&format!("{CLIENT4}:40001")), sock(&format!("{VIP4}:80")), true, &[]), XDP_TX, Reason::Tx);
        // And once the total bucket refills a little, an honest client is answered again
        // (polled: each try is either answered or limited, and the bucket refills in time).
        let request = ping(CLIENT4, VIP4);
        let replied = (0..500).any(|_| {
            let out = env.run(&request);
            out.action == XDP_TX || {
                std::thread::sleep(std::time::Duration::from_millis(10));
                false
            }
        });
        assert!(replied, "an honest ping is answered once the total refills");
    });
}
