//! GUE (variant 1): the balancer's tunnel to a backend whose encap is `gue` carries a UDP
//! header (source port from the flow hash, destination the fleet's GUE port, checksum 0)
//! between the outer and the inner IP header; the agent strips it from the balancers only,
//! on its port only; second chance works with either tunnel in GUE.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};

use spillway_common::{
    hash::{FLOW_SEED, flow_hash, gue_source_port},
    limits::DEFAULT_GUE_PORT,
    types::{DecapReason, FlowKey, PROTO_TCP, Reason},
};
use spillway_harness::{frames, packet_lab};
use spillway_model::{BackendOptions, Encap};
use spillway_reconcile::vip_key;

use crate::{
    decap::{backend_host, run_decap},
    second_chance::one_hop_less,
    support::*,
};

const PORT: u16 = DEFAULT_GUE_PORT;

/// The outer source the test config gives `backend`'s family.
fn local_of(backend: IpAddr) -> IpAddr {
    if backend.is_ipv4() { packet_lab::LOCAL4.into() } else { packet_lab::LOCAL6.into() }
}

/// The flow hash the outer headers take their entropy from (the table seed's).
fn outer_hash(env: &Env, key: &FlowKey) -> u32 {
    flow_hash(key, env.balancer.maps.config().unwrap().table_seed)
}

/// The GUE frame the balancer must send for `input` (14 bytes of Ethernet first) to
/// `backend`, built here from the same hash.
fn expected_gue(env: &Env, key: &FlowKey, backend: IpAddr, input: &[u8]) -> Vec<u8> {
    let hash = outer_hash(env, key);
    frames::gue_tunnel(local_of(backend), backend, (gue_source_port(hash), PORT), hash, &input[14..])
}

/// Adds `v` with `backends`, the VIP's encap `gue`.
fn add_gue_vip(env: &mut Env, v: spillway_model::Vip, backends: &[IpAddr]) {
    env.update(|s| {
        s.add_vip(v, 4099).unwrap();
        s.set_encap(&v, Encap::Gue).unwrap();
        for b in backends {
            s.add_backend(&v, *b, 100).unwrap();
        }
    });
}

fn udp_source_port(frame: &[u8]) -> u16 {
    let at = if frame[12..14] == [0x08, 0x00] { 14 + 20 } else { 14 + 40 };
    u16::from_be_bytes([frame[at], frame[at + 1]])
}

#[test]
fn gue_tunnels_are_written_byte_for_byte() {
    let four: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend4(n).into()).collect();
    let six: Vec<IpAddr> = (101..=103).map(|n| packet_lab::backend6(n).into()).collect();
    // GUE over IPv4, over IPv6, and IPv4 inside GUE over IPv6.
    for (client, vip_addr, backends) in [
        ("192.168.10.20:40000", "10.200.1.1:80", &four),
        ("[2001:db8::20]:40000", "[2001:db8:100::1]:443", &six),
        ("192.168.10.20:40001", "10.200.1.1:80", &six),
    ] {
        with_env(|env| {
            let v = vip(&format!("{vip_addr}/tcp"));
            add_gue_vip(env, v, backends);
            let (c, d) = (sock(client), sock(vip_addr));
            let key = flow_key(c, d, PROTO_TCP);
            let backend = env.predicted_backend(&v, &key);
            // A new flow, then a connection-table hit: the same tunnel.
            for frame in [frames::tcp(c, d, true, &[]), frames::tcp(c, d, false, b"GET / HTTP/1.1\r\n\r\n")] {
                let out = env.expect(&frame, XDP_TX, Reason::Tx).frame;
                let expected = expected_gue(env, &key, backend, &frame);
                assert_eq!(out[..6], packet_lab::neighbour_mac(backend).unwrap(), "to the next hop");
                assert_eq!(out[12..], expected[12..], "{client} -> {vip_addr} via {backend}: the GUE frame");
                assert!(udp_source_port(&out) >= 49152, "an ephemeral source port");
            }
        });
    }
}

#[test]
fn the_gue_source_port_follows_the_flow_and_spreads_flows() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        add_gue_vip(env, v, &[packet_lab::backend4(101).into()]);
        let d = sock("10.200.1.1:80");
        let mut ports = std::collections::BTreeSet::new();
        for p in 40000..40200u16 {
            let syn = frames::tcp(sock(&format!("192.168.10.20:{p}")), d, true, &[]);
            let first = udp_source_port(&env.expect(&syn, XDP_TX, Reason::Tx).frame);
            let again = udp_source_port(&env.expect(&syn, XDP_TX, Reason::Tx).frame);
            assert_eq!(first, again, "every packet of a flow takes one port");
            assert!(first >= 49152, "port {first} is not in the dynamic range");
            ports.insert(first);
        }
        // One backend, one outer address pair: the source port alone spreads its RSS.
        assert!(ports.len() >= 190, "200 flows took only {} source ports", ports.len());
    });
}

#[test]
fn a_backends_encap_overrides_its_vips_and_changes_take_effect() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        let b: IpAddr = packet_lab::backend4(101).into();
        let ipip = BackendOptions { encap: Some(Encap::Ipip), ..BackendOptions::default() };
        env.update(|s| {
            s.add_vip(v, 4099).unwrap();
            s.set_encap(&v, Encap::Gue).unwrap();
            s.add_backend_with(&v, b, spillway_model::Backend { weight: 100, options: ipip, ..Default::default() }).unwrap();
        });
        let (c, d) = (sock("192.168.10.20:40000"), sock("10.200.1.1:80"));
        let key = flow_key(c, d, PROTO_TCP);
        let syn = frames::tcp(c, d, true, &[]);
        // The backend says IPIP: IPIP, whatever the VIP says.
        expect_encap(&env.expect(&syn, XDP_TX, Reason::Tx).frame, &syn, 14, b, None);
        // Without its own setting it takes the VIP's, from the next packet on.
        env.update(|s| s.set_backend_options(&v, b, BackendOptions::default()).unwrap());
        let out = env.expect(&syn, XDP_TX, Reason::Tx).frame;
        assert_eq!(out[12..], expected_gue(env, &key, b, &syn)[12..]);
        // And the VIP's change too.
        env.update(|s| s.set_encap(&v, Encap::Ipip).unwrap());
        expect_encap(&env.expect(&syn, XDP_TX, Reason::Tx).frame, &syn, 14, b, None);
    });
}

#[test]
fn gue_takes_eight_bytes_more_of_the_egress_mtu() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        add_gue_vip(env, v, &[packet_lab::backend4(101).into()]);
        // Outer IPv4 and UDP, inner IPv4 and TCP.
        let room = packet_lab::MTU as usize - 20 - 8 - 40;
        let (c, d) = (sock("192.168.10.20:40000"), sock("10.200.1.1:80"));
        let fits = frames::tcp(c, d, false, &vec![0u8; room]);
        env.expect(&fits, XDP_TX, Reason::Tx);
        // One byte more is answered (DF is set) with the MTU that leaves room for GUE
        // (after an untagged Ethernet header).
        let over = frames::tcp(c, d, false, &vec![0u8; room + 1]);
        let answer = env.expect(&over, XDP_TX, Reason::TxPacketTooBig);
        frames::check_packet_too_big(&answer.frame, &over, 14, u32::from(packet_lab::MTU) - 28).unwrap_or_else(|e| panic!("{e:#}"));
        // The same packet fits in IPIP.
        env.update(|s| s.set_encap(&v, Encap::Ipip).unwrap());
        env.expect(&over, XDP_TX, Reason::Tx);
    });
}

#[test]
fn second_chance_carries_either_tunnel_in_gue() {
    with_env(|env| {
        let v = vip_gaining_a_fourth_backend(env);
        let d = sock("10.200.1.1:80");
        let key = |port: u16| flow_key(sock(&format!("192.168.10.20:{port}")), d, PROTO_TCP);
        let prior = |env: &Env, k: &FlowKey| {
            let table = env.balancer.maps.vips.get(&vip_key(&v)).unwrap().prior;
            env.balancer.maps.rings.choice(table, flow_hash(k, FLOW_SEED)).map(|id| env.backend_addr(id))
        };
        let port = (40000..41000).find(|&p| prior(env, &key(p)) != Some(env.predicted_backend(&v, &key(p)))).unwrap();
        let (now, before) = (env.predicted_backend(&v, &key(port)), prior(env, &key(port)).unwrap());
        let ack = frames::tcp(sock(&format!("192.168.10.20:{port}")), d, false, b"data");
        let hash = outer_hash(env, &key(port));
        let gue = |to: IpAddr, inner: &[u8]| frames::gue_tunnel(local_of(to), to, (gue_source_port(hash), PORT), hash, inner);
        let ipip = |to: IpAddr, inner: &[u8]| frames::tunnel(local_of(to), to, inner);
        let set = |env: &mut Env, backend: IpAddr, encap: Encap| {
            let options = BackendOptions { encap: Some(encap), ..BackendOptions::default() };
            env.update(|s| s.set_backend_options(&v, backend, options).unwrap());
        };

        // The outer tunnel in GUE, the middle one in IPIP.
        set(env, now, Encap::Gue);
        let out = env.expect(&ack, XDP_TX, Reason::Tx).frame;
        assert_eq!(out[12..], gue(now, &ipip(before, &ack[14..])[14..])[12..], "GUE around IPIP");
        // The middle one in GUE (as the second candidate's agent takes it), the outer in IPIP.
        set(env, now, Encap::Ipip);
        set(env, before, Encap::Gue);
        let out = env.expect(&ack, XDP_TX, Reason::Tx).frame;
        assert_eq!(out[12..], ipip(now, &gue(before, &ack[14..])[14..])[12..], "IPIP around GUE");
        // Both.
        set(env, now, Encap::Gue);
        let out = env.expect(&ack, XDP_TX, Reason::Tx).frame;
        assert_eq!(out[12..], gue(now, &gue(before, &ack[14..])[14..])[12..], "GUE around GUE");
        assert_eq!(env.pinned_backend(&key(port)), None, "still remembered by nobody");
    });
}

/// The agent's host (`decap::backend_host`) with GUE on the default port.
fn gue_agent(env: &mut Env) {
    backend_host(env);
    env.decap_gue_port(PORT);
}

#[test]
fn the_agent_strips_gue_from_the_balancers_on_its_port_only() {
    with_env(|env| {
        gue_agent(env);
        let inner4 = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, b"hi");
        let inner6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, b"hi");
        let cases = [("10.9.0.1", "10.1.0.1", &inner4), ("fd09::1", "fd01::1", &inner6), ("fd09::1", "fd01::1", &inner4)];
        for (outer_src, outer_dst, inner) in cases {
            let gue = frames::gue_tunnel(ip(outer_src), ip(outer_dst), (50123, PORT), 0x12345, &inner[14..]);
            let out = run_decap(env, &gue, XDP_PASS, DecapReason::Decapsulated);
            assert_eq!(out[0..12], gue[0..12], "MACs kept");
            assert_eq!(out[12..], inner[12..], "{outer_src} -> {outer_dst}: the inner packet with its EtherType");
        }
        let gue4 = frames::gue_tunnel(ip("10.9.0.1"), ip("10.1.0.1"), (50123, PORT), 0, &inner4[14..]);
        let tagged = frames::with_vlan(&gue4, 9);
        assert_eq!(
            run_decap(env, &tagged, XDP_PASS, DecapReason::Decapsulated),
            frames::with_vlan(&[&gue4[..12], &inner4[12..]].concat(), 9)
        );

        // UDP to another port is no tunnel, even from a balancer: the kernel's.
        let other_port = frames::gue_tunnel(ip("10.9.0.1"), ip("10.1.0.1"), (50123, PORT + 1), 0, &inner4[14..]);
        assert_eq!(run_decap(env, &other_port, XDP_PASS, DecapReason::PassNotTunnel), other_port);
        // A GUE header of variant 0 (first two bits 00) is not what the balancer sends.
        let mut variant0 = gue4.clone();
        variant0[14 + 20 + 8] = 0x00;
        assert_eq!(run_decap(env, &variant0, XDP_PASS, DecapReason::PassMalformed), variant0);
        // GUE to an address that is not the host's.
        let elsewhere = frames::gue_tunnel(ip("10.9.0.1"), ip("10.1.0.77"), (50123, PORT), 0, &inner4[14..]);
        assert_eq!(run_decap(env, &elsewhere, XDP_PASS, DecapReason::PassNotLocal), elsewhere);
        // With GUE off (--gue-port 0), the same frame is plain UDP, and IPIP still works.
        env.decap_gue_port(0);
        assert_eq!(run_decap(env, &gue4, XDP_PASS, DecapReason::PassNotTunnel), gue4);
        let ipip = frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &inner4[14..]);
        run_decap(env, &ipip, XDP_PASS, DecapReason::Decapsulated);
    });
}

#[test]
fn gue_from_anyone_but_the_balancers_is_dropped() {
    with_env(|env| {
        gue_agent(env);
        let inner4 = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, b"hi");
        let inner6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, b"hi");
        // An attacker's own source, one next to the balancer's, the other family's: without
        // the allow-list each would be a packet into the host past its firewall's view.
        for (outer_src, outer_dst, inner) in
            [("203.0.113.7", "10.1.0.1", &inner4), ("10.9.0.2", "10.1.0.1", &inner4), ("fd09:1::1", "fd01::1", &inner6)]
        {
            let spoofed = frames::gue_tunnel(ip(outer_src), ip(outer_dst), (50123, PORT), 0, &inner[14..]);
            run_decap(env, &spoofed, XDP_DROP, DecapReason::DropNotAllowed);
            // Whatever it carries: the port is the tunnels'.
            let mut junk = spoofed.clone();
            let at = if outer_src.contains(':') { 14 + 40 + 8 } else { 14 + 20 + 8 };
            junk[at] = 0;
            run_decap(env, &junk, XDP_DROP, DecapReason::DropNotAllowed);
        }
        // From a balancer, but for somebody else: the host is no relay.
        let inner = frames::tcp(sock("192.168.10.20:40000"), sock("192.0.2.1:22"), true, b"hi");
        let relay = frames::gue_tunnel(ip("10.9.0.1"), ip("10.1.0.1"), (50123, PORT), 0, &inner[14..]);
        run_decap(env, &relay, XDP_DROP, DecapReason::DropInnerNotLocal);
    });
}

#[test]
fn the_agent_keeps_or_sends_on_second_chance_packets_in_gue() {
    with_env(|env| {
        env.decap_local(&[packet_lab::LOCAL4.into(), packet_lab::LOCAL6.into()]);
        env.decap_allow(&["10.9.0.1/32", "fd09::1/128"]);
        env.decap_gue_port(PORT);
        let lb = IpAddr::from([10, 9, 0, 1]);
        let here: IpAddr = packet_lab::LOCAL4.into();
        let other: IpAddr = packet_lab::backend4(102).into();
        let listener = TcpListener::bind(SocketAddr::new(here, 0)).unwrap();
        let server = listener.local_addr().unwrap();
        let client = TcpStream::connect(server).unwrap();
        let _accepted = listener.accept().unwrap();
        let gue = |src: IpAddr, to: IpAddr, inner: &[u8]| frames::gue_tunnel(src, to, (50123, PORT), 0, inner);
        let ipip = |src: IpAddr, to: IpAddr, inner: &[u8]| frames::tunnel(src, to, inner);
        type Wrap<'a> = &'a dyn Fn(IpAddr, IpAddr, &[u8]) -> Vec<u8>;
        let kinds: [(&str, Wrap, Wrap); 3] =
            [("GUE around IPIP", &gue, &ipip), ("IPIP around GUE", &ipip, &gue), ("GUE around GUE", &gue, &gue)];
        for (kind, outer, middle) in kinds {
            // The connection is this host's: both headers stripped.
            let inner = frames::tcp(client.local_addr().unwrap(), server, false, b"data");
            let m = middle(lb, other, &inner[14..]);
            let frame = outer(lb, here, &m[14..]);
            let out = run_decap(env, &frame, XDP_PASS, DecapReason::SecondChanceLocal);
            assert_eq!(out, [&frame[..12], &inner[12..]].concat(), "{kind}: both tunnels stripped");
            // It is not: the middle tunnel back to the hop it came from, one hop less.
            let inner = frames::tcp(sock("192.168.10.20:2"), server, false, b"data");
            let m = middle(lb, other, &inner[14..]);
            let frame = outer(lb, here, &m[14..]);
            let out = run_decap(env, &frame, XDP_TX, DecapReason::SecondChanceForwarded);
            assert_eq!((&out[..6], &out[6..12]), (&frame[6..12], &frame[..6]), "{kind}: back to the sender");
            assert_eq!(out[12..], one_hop_less(&m)[12..], "{kind}: the middle tunnel, TTL 63");
            // A middle header the balancer did not write is not sent on.
            let forged = outer(lb, here, &middle(ip("198.51.100.80"), other, &inner[14..])[14..]);
            run_decap(env, &forged, XDP_DROP, DecapReason::DropSecondChanceSource);
        }
        // A client's UDP datagram to a VIP of this host on the GUE port is its packet, not a
        // middle tunnel.
        let datagram = frames::udp(sock("192.168.10.20:40000"), SocketAddr::new(here, PORT), b"q");
        let frame = ipip(lb, here, &datagram[14..]);
        assert_eq!(run_decap(env, &frame, XDP_PASS, DecapReason::Decapsulated)[12..], datagram[12..]);
    });
}
