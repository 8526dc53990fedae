//! New flows and connection-table hits, per family and encapsulation.

use spillway_common::types::{PROTO_TCP, PROTO_UDP, Reason};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

fn syn_then_ack(client: &str, vip_addr: &str, backends: &[std::net::IpAddr]) {
    with_env(|env| {
        let v = vip(&format!("{vip_addr}/tcp"));
        env.add_vip(v, backends);
        let (c, d) = (sock(client), sock(vip_addr));
        let key = flow_key(c, d, PROTO_TCP);
        let expected = env.predicted_backend(&v, &key);

        let syn = frames::tcp(c, d, true, &[]);
        let out = env.expect(&syn, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &syn, 14, expected, packet_lab::neighbour_mac(expected));
        assert_eq!(out.frame[6..12], env.ingress_mac, "source MAC is the egress interface's");
        assert_eq!(env.pinned_backend(&key), Some(expected), "SYN creates the connection entry");

        // Change the backend set: the ACK still follows the connection table.
        let extra = if expected.is_ipv4() { packet_lab::backend4(110).into() } else { packet_lab::backend6(110).into() };
        env.update(|s| s.add_backend(&v, extra, 10_000).unwrap());
        let ack = frames::tcp(c, d, false, b"GET / HTTP/1.1\r\n\r\n");
        let out = env.expect(&ack, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &ack, 14, expected, packet_lab::neighbour_mac(expected));

        // One new flow (the SYN), counted on the VIP and on its backend; the hit is not one.
        let id = env.reconciler.vip_id(&v).unwrap();
        let traffic = env.balancer.maps.vip_traffic(id).unwrap();
        assert_eq!((traffic.packets, traffic.new_flows), (2, 1));
        let be = env.reconciler.backend_id(&v, &expected).unwrap();
        let traffic = env.balancer.maps.backend_traffic(be).unwrap();
        assert_eq!((traffic.packets, traffic.bytes, traffic.new_flows), (2, (syn.len() + ack.len()) as u64, 1));
    });
}

fn resolved4() -> Vec<std::net::IpAddr> {
    (101..=103).map(|n| packet_lab::backend4(n).into()).collect()
}

fn resolved6() -> Vec<std::net::IpAddr> {
    (101..=103).map(|n| packet_lab::backend6(n).into()).collect()
}

#[test]
fn tcp_syn_then_ack_ipip() {
    syn_then_ack("192.168.10.20:40000", "10.200.1.1:80", &resolved4());
}

#[test]
fn tcp_syn_then_ack_ip6ip6() {
    syn_then_ack("[2001:db8::20]:40000", "[2001:db8:100::1]:443", &resolved6());
}

#[test]
fn ipv4_vip_on_ipv6_backends() {
    syn_then_ack("192.168.10.20:40001", "10.200.1.1:80", &resolved6());
}

#[test]
fn udp_is_balanced_and_pinned() {
    with_env(|env| {
        let v = vip("10.200.1.1:53/udp");
        env.add_vip(v, &resolved4());
        let (c, d) = (sock("192.168.10.20:5000"), sock("10.200.1.1:53"));
        let key = flow_key(c, d, PROTO_UDP);
        let expected = env.predicted_backend(&v, &key);
        for _ in 0..2 {
            let f = frames::udp(c, d, b"query");
            let out = env.expect(&f, XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &f, 14, expected, packet_lab::neighbour_mac(expected));
        }
        assert_eq!(env.pinned_backend(&key), Some(expected));
    });
}

#[test]
fn any_port_vip_takes_every_port_but_exact_vip_wins() {
    with_env(|env| {
        let any = vip("10.200.1.1:0/tcp");
        let exact = vip("10.200.1.1:80/tcp");
        env.add_vip(any, &[packet_lab::backend4(101).into()]);
        env.add_vip(exact, &[packet_lab::backend4(102).into()]);
        for port in [1, 22, 8080, 65535] {
            let f = frames::tcp(sock("192.168.10.20:40000"), sock(&format!("10.200.1.1:{port}")), true, &[]);
            let out = env.expect(&f, XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &f, 14, packet_lab::backend4(101).into(), None);
        }
        let f = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        let out = env.expect(&f, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &f, 14, packet_lab::backend4(102).into(), None);
        // UDP to the TCP any-port VIP's address is served by no VIP.
        env.expect(&frames::udp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), b"x"), XDP_DROP, Reason::DropNoService);
    });
}

#[test]
fn vlan_tagged_and_ipv4_options_frames_are_forwarded_with_inner_untouched() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        env.add_vip(v, &resolved4());
        let (c, d) = (sock("192.168.10.20:40000"), sock("10.200.1.1:80"));
        let expected = env.predicted_backend(&v, &flow_key(c, d, PROTO_TCP));
        let plain = frames::tcp(c, d, true, &[]);

        let tagged = frames::with_vlan(&plain, 42);
        let out = env.expect(&tagged, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &tagged, 18, expected, None);

        for words in [1, 4, 10] {
            let with_opts = frames::with_ipv4_options(&plain, words);
            let out = env.expect(&with_opts, XDP_TX, Reason::Tx);
            // Same 5-tuple, same backend: the ports were found behind the options.
            expect_encap(&out.frame, &with_opts, 14, expected, None);
        }
    });
}

#[test]
fn outer_source_takes_host_bits_from_the_flow_hash() {
    with_env(|env| {
        let mut cfg = default_config();
        // 10.1.0.0/24: the last octet comes from the hash.
        cfg.outer_src_v4_hostmask = u32::from_ne_bytes([0, 0, 0, 0xff]);
        env.balancer.maps.set_config(&cfg).unwrap();
        env.add_vip(vip("10.200.1.1:80/tcp"), &resolved4());
        let mut sources = std::collections::BTreeSet::new();
        for port in 40000..40064u16 {
            let f = frames::tcp(sock(&format!("192.168.10.20:{port}")), sock("10.200.1.1:80"), true, &[]);
            let out = env.expect(&f, XDP_TX, Reason::Tx);
            let dst: std::net::IpAddr = std::net::Ipv4Addr::from(<[u8; 4]>::try_from(&out.frame[30..34]).unwrap()).into();
            let src = expect_encap(&out.frame, &f, 14, dst, None);
            let std::net::IpAddr::V4(src) = src else { panic!("v4 outer") };
            assert_eq!(src.octets()[..3], [10, 1, 0], "outer source outside its prefix");
            sources.insert(src);
        }
        assert!(sources.len() > 32, "only {} distinct sources for 64 flows", sources.len());
    });
}
