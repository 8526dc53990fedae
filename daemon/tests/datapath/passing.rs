//! Traffic that is not ours passes untouched; malformed and fragmented input is counted.

use spillway_common::types::Reason;
use spillway_harness::frames;

use crate::support::*;

fn with_vip(body: impl FnOnce(&mut Env) + Send) {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[ip("10.1.0.101")]);
        env.add_vip(vip("[2001:db8:100::1]:80/tcp"), &[ip("fd01::101")]);
        body(env);
    });
}

#[test]
fn not_ours_passes_unchanged() {
    with_vip(|env| {
        let cases: Vec<(&str, Vec<u8>, Reason)> = vec![
            ("non-VIP TCP", frames::tcp(sock("192.168.10.20:40000"), sock("10.1.0.1:22"), true, &[]), Reason::PassNotVip),
            ("non-VIP UDP v6", frames::udp(sock("[2001:db8::20]:5000"), sock("[fd01::1]:53"), b"q"), Reason::PassNotVip),
            ("ARP", frames::arp_request([10, 1, 0, 9], [10, 1, 0, 1]), Reason::PassNotIp),
            ("ND", frames::neighbour_solicitation(ip("fe80::1"), "fd01::1".parse().unwrap()), Reason::PassNotVip),
            (
                "IPIP to the host",
                frames::tunnel(
                    ip("10.9.0.1"),
                    ip("10.1.0.1"),
                    &frames::tcp(sock("192.168.10.20:1"), sock("10.200.1.1:80"), true, &[])[14..],
                ),
                Reason::PassNotVip,
            ),
            ("ICMP echo to the host", icmp_echo("10.1.0.1"), Reason::PassNotVip),
        ];
        for (name, frame, reason) in cases {
            let out = env.expect(&frame, XDP_PASS, reason);
            assert_eq!(out.frame, frame, "{name} was modified");
        }
    });
}

/// Regression (hostile senders): the balancer does not own VIP addresses, so the kernel
/// routed what no VIP serves back to the router, which sent it here again (one ping arrived
/// 34 times). Dropped and counted instead, whatever the protocol; the host's own addresses
/// are untouched (above).
#[test]
fn what_no_vip_serves_on_a_vip_address_is_dropped_not_routed_back() {
    with_vip(|env| {
        let mut other_proto = frames::udp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), b"x");
        other_proto[23] = 47; // GRE
        let cases = [
            ("another port", frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:81"), true, &[])),
            ("another protocol (UDP)", frames::udp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), b"x")),
            ("neither TCP nor UDP", other_proto),
            ("ICMP echo", icmp_echo("10.200.1.1")),
            ("IPv6, another port", frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:81"), true, &[])),
            (
                "ICMP error quoting another port",
                frames::icmp_frag_needed(ip("192.168.1.1"), sock("10.200.1.1:81"), sock("192.168.10.20:1"), 1400),
            ),
        ];
        for (name, frame) in cases {
            let before = env.reasons()[Reason::DropNoService as usize];
            env.expect(&frame, XDP_DROP, Reason::DropNoService);
            assert_eq!(env.reasons()[Reason::DropNoService as usize], before + 1, "{name}");
        }
    });
}

fn icmp_echo(dst: &str) -> Vec<u8> {
    // An ICMP error type the balancer does not route: echo request (type 8).
    let mut f = frames::icmp_frag_needed(ip("192.168.10.20"), sock(&format!("{dst}:80")), sock("192.168.10.20:1"), 1400);
    f[34] = 8;
    f[35] = 0;
    f
}

#[test]
fn truncated_headers_at_every_layer_pass_as_malformed() {
    with_vip(|env| {
        for full in [
            frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]),
            frames::udp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), b""),
            frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, &[]),
            frames::with_vlan(&frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]), 7),
        ] {
            // A NIC never hands XDP less than an Ethernet header (test runs refuse it too).
            for len in frames::ETH_LEN..full.len() {
                let cut = &full[..len];
                let out = env.run(cut);
                assert_eq!(out.action, XDP_PASS, "cut at {len}");
                assert_eq!(out.frame, cut, "cut at {len} modified");
            }
        }
        // Consistent lengths, short L4: still malformed, not forwarded.
        let full = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        for len in 34..54 {
            let mut cut = full[..len].to_vec();
            frames::fit_ipv4_length(&mut cut);
            env.expect(&cut, XDP_PASS, Reason::PassMalformed);
        }
        let full6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, &[]);
        for len in 54..74 {
            let mut cut = full6[..len].to_vec();
            frames::fit_ipv6_length(&mut cut);
            env.expect(&cut, XDP_PASS, Reason::PassMalformed);
        }
        // An IHL below 5 and an IPv4 length beyond the frame.
        let mut bad_ihl = full.clone();
        bad_ihl[14] = 0x44;
        env.expect(&bad_ihl, XDP_PASS, Reason::PassMalformed);
        let mut long = full;
        long[16..18].copy_from_slice(&2000u16.to_be_bytes());
        env.expect(&long, XDP_PASS, Reason::PassMalformed);
        // A VLAN tag cut short.
        env.expect(&frames::with_vlan(&full6, 3)[..16], XDP_PASS, Reason::PassMalformed);
    });
}

#[test]
fn fragments_to_a_vip_are_dropped_and_others_pass() {
    with_vip(|env| {
        let to_vip = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, b"payload!");
        env.expect(&frames::as_ipv4_fragment(&to_vip, true, 0), XDP_DROP, Reason::DropFragment);
        env.expect(&frames::as_ipv4_fragment(&to_vip, false, 185), XDP_DROP, Reason::DropFragment);
        let to_vip6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, b"payload!");
        env.expect(&frames::as_ipv6_fragment(&to_vip6), XDP_DROP, Reason::DropFragment);

        let to_host = frames::tcp(sock("192.168.10.20:40000"), sock("10.1.0.1:22"), true, b"payload!");
        env.expect(&frames::as_ipv4_fragment(&to_host, true, 0), XDP_PASS, Reason::PassNotVip);
        let to_host6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[fd01::1]:22"), true, b"payload!");
        env.expect(&frames::as_ipv6_fragment(&to_host6), XDP_PASS, Reason::PassNotVip);
    });
}
