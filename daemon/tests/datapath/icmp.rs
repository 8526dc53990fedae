//! ICMP "fragmentation needed" / "packet too big" about a VIP flow reach its backend.

use spillway_common::types::{PROTO_TCP, Reason};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

fn icmp_reaches_flow_backend(client: &str, vip_addr: &str, router: &str, v6: bool) {
    with_env(|env| {
        let v = vip(&format!("{vip_addr}/tcp"));
        let backends: Vec<std::net::IpAddr> = if v6 {
            (101..=105).map(|n| packet_lab::backend6(n).into()).collect()
        } else {
            (101..=105).map(|n| packet_lab::backend4(n).into()).collect()
        };
        env.add_vip(v, &backends);
        let (c, d) = (sock(client), sock(vip_addr));
        env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
        let pinned = env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap();
        // Reweight so a fresh hash would likely land elsewhere: the table must not matter.
        env.update(|s| s.set_weight(&v, pinned, 1).unwrap());

        let icmp = if v6 { frames::icmp6_packet_too_big(ip(router), d, c, 1280) } else { frames::icmp_frag_needed(ip(router), d, c, 1400) };
        let out = env.expect(&icmp, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &icmp, 14, pinned, packet_lab::neighbour_mac(pinned));
    });
}

#[test]
fn icmp_frag_needed_goes_to_the_flows_backend() {
    icmp_reaches_flow_backend("192.168.10.20:40000", "10.200.1.1:80", "192.168.1.1", false);
}

#[test]
fn icmp6_packet_too_big_goes_to_the_flows_backend() {
    icmp_reaches_flow_backend("[2001:db8::20]:40000", "[2001:db8:100::1]:80", "2001:db8::1", true);
}

#[test]
fn icmp_for_an_unknown_flow_is_hashed_like_the_flow() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        env.add_vip(v, &(101..=105).map(|n| packet_lab::backend4(n).into()).collect::<Vec<_>>());
        let (c, d) = (sock("192.168.10.20:41000"), sock("10.200.1.1:80"));
        let expected = env.predicted_backend(&v, &flow_key(c, d, PROTO_TCP));
        let icmp = frames::icmp_frag_needed(ip("192.168.1.1"), d, c, 1400);
        let out = env.expect(&icmp, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &icmp, 14, expected, None);
        assert_eq!(env.pinned_backend(&flow_key(c, d, PROTO_TCP)), None, "ICMP must not create flows");
        let id = env.reconciler.vip_id(&v).unwrap();
        let traffic = env.balancer.maps.vip_traffic(id).unwrap();
        assert_eq!((traffic.packets, traffic.new_flows), (1, 0), "nor count as a new flow");
    });
}
