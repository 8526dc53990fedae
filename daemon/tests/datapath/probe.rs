//! The probe-encapsulation program (`spillway_probe`, tc egress): a probe to a VIP leaves
//! encapsulated to the backend its mark names, byte for byte as the XDP data path sends the
//! same packet to that backend; anything else is dropped and counted.

use std::net::IpAddr;

use spillway_common::{
    limits::DEFAULT_GUE_PORT,
    types::{ProbeConfig, ProbeReason, Reason, probe_mark},
};
use spillway_dataplane::{ProbeMaps, test_run};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

const TC_ACT_SHOT: u32 = 2;
const TC_ACT_REDIRECT: u32 = 7;
const TAG: u8 = 0x53;

/// Loads the probe program next to the balancer of `env` and configures it as `lbd` does.
fn load_probe(env: &mut Env) -> ProbeMaps {
    let (_, mut maps) = env.balancer.load_probe().unwrap();
    maps.set_config(&ProbeConfig { ingress_ifindex: env.ingress, mark_tag: u32::from(TAG) }).unwrap();
    maps
}

/// The mark of a probe to `backend` of `v`.
fn mark(env: &Env, v: &str, backend: IpAddr) -> u32 {
    let id = env.reconciler.backend_id(&vip(v), &backend).unwrap();
    probe_mark(TAG, id, env.balancer.maps.backend(id).unwrap().generation)
}

/// Runs `frame` with `mark` and checks the action and that exactly `reason` was counted.
fn expect_probe(env: &mut Env, maps: &ProbeMaps, frame: &[u8], mark: u32, action: u32, reason: ProbeReason) -> Vec<u8> {
    let before = maps.reasons().unwrap();
    let ingress = env.ingress;
    let out = test_run::run_classifier(env.balancer.probe_program().unwrap(), frame, mark, ingress).unwrap();
    let after = maps.reasons().unwrap();
    let counted: Vec<ProbeReason> = before.iter().zip(&after).filter(|(b, a)| b.1 != a.1).map(|(_, a)| a.0).collect();
    assert_eq!(counted, [reason], "reasons counted for this frame");
    assert_eq!(after[reason as usize].1 - before[reason as usize].1, 1);
    assert_eq!(out.action, action, "action (reason {})", reason.label());
    out.frame
}

/// A probe from the balancer's own address to `v` (TCP SYN, or a UDP datagram).
fn probe_frame(v: &str, udp: bool) -> Vec<u8> {
    let target = sock(v.rsplit_once('/').unwrap().0);
    let src = if target.is_ipv4() { "10.1.0.1:40000" } else { "[fd01::1]:40000" };
    if udp { frames::udp(sock(src), target, b"ping") } else { frames::tcp(sock(src), target, true, &[]) }
}

#[test]
fn a_probe_to_a_gue_backend_leaves_in_gue_as_the_data_path_sends_it() {
    with_env(|env| {
        let maps = load_probe(env);
        let cases: [(&str, IpAddr, bool); 3] = [
            ("10.200.1.1:80/tcp", packet_lab::backend4(101).into(), false),
            ("[2001:db8:100::2]:53/udp", packet_lab::backend6(102).into(), true),
            ("10.200.1.3:80/tcp", packet_lab::backend6(103).into(), false),
        ];
        for (v, backend, udp) in cases {
            env.add_vip(vip(v), &[backend]);
            env.update(|s| s.set_encap(&vip(v), spillway_model::Encap::Gue).unwrap());
            let frame = probe_frame(v, udp);
            let data_path = env.expect(&frame, XDP_TX, Reason::Tx).frame;
            let probe = expect_probe(env, &maps, &frame, mark(env, v, backend), TC_ACT_REDIRECT, ProbeReason::Redirect);
            let outer_ip = if backend.is_ipv4() { 20 } else { 40 };
            assert_eq!(probe[14 + if backend.is_ipv4() { 9 } else { 6 }], 17, "{v}: an outer UDP header");
            assert_eq!(u16::from_be_bytes([probe[14 + outer_ip + 2], probe[14 + outer_ip + 3]]), DEFAULT_GUE_PORT);
            assert_eq!(probe, data_path, "{v} via {backend}: the probe differs from the data path's GUE packet");
        }
    });
}

#[test]
fn a_probe_leaves_exactly_as_the_data_path_sends_the_same_packet() {
    with_env(|env| {
        let maps = load_probe(env);
        // Outer sources with host bits from the flow hash, so the hash is checked too.
        let mut cfg = default_config();
        cfg.outer_src_v4_hostmask = 0xff00_0000;
        cfg.outer_src_v6_hostmask = 0xffff_0000;
        env.balancer.maps.set_config(&cfg).unwrap();
        let cases: [(&str, IpAddr, bool); 5] = [
            ("10.200.1.1:80/tcp", packet_lab::backend4(101).into(), false),
            ("10.200.1.2:53/udp", packet_lab::backend4(102).into(), true),
            ("[2001:db8:100::1]:443/tcp", packet_lab::backend6(101).into(), false),
            ("[2001:db8:100::2]:53/udp", packet_lab::backend6(102).into(), true),
            // IPv4 in IPv6.
            ("10.200.1.3:80/tcp", packet_lab::backend6(103).into(), false),
        ];
        for (v, backend, udp) in cases {
            // One backend: the data path must send this packet to it as well.
            env.add_vip(vip(v), &[backend]);
            let frame = probe_frame(v, udp);
            let data_path = env.expect(&frame, XDP_TX, Reason::Tx).frame;
            let m = mark(env, v, backend);
            let probe = expect_probe(env, &maps, &frame, m, TC_ACT_REDIRECT, ProbeReason::Redirect);
            expect_encap(&probe, &frame, 14, backend, packet_lab::neighbour_mac(backend));
            assert_eq!(probe, data_path, "{v} via {backend}: the probe differs from the data path's packet");
            let id = env.reconciler.backend_id(&vip(v), &backend).unwrap();
            assert_eq!(maps.last(id).unwrap(), Some(ProbeReason::Redirect));
        }
    });
}

#[test]
fn an_unresolved_neighbour_is_left_to_the_kernel_and_another_egress_is_redirected_to() {
    with_env(|env| {
        let maps = load_probe(env);
        for (v, backend) in
            [("10.200.1.1:80/tcp", IpAddr::from(packet_lab::UNRESOLVED4)), ("[2001:db8:100::1]:80/tcp", packet_lab::UNRESOLVED6.into())]
        {
            env.add_vip(vip(v), &[backend]);
            let frame = probe_frame(v, false);
            let out = expect_probe(env, &maps, &frame, mark(env, v, backend), TC_ACT_REDIRECT, ProbeReason::RedirectNeigh);
            // Encapsulated; the kernel writes the MACs when it resolves the neighbour.
            expect_encap(&out, &frame, 14, backend, Some(frames::LB_MAC));
        }
        let (v, backend) = ("10.200.1.2:80/tcp", IpAddr::from(packet_lab::BEHIND_EGRESS4));
        env.add_vip(vip(v), &[backend]);
        let frame = probe_frame(v, false);
        let out = expect_probe(env, &maps, &frame, mark(env, v, backend), TC_ACT_REDIRECT, ProbeReason::Redirect);
        expect_encap(&out, &frame, 14, backend, packet_lab::neighbour_mac(backend));
    });
}

#[test]
fn a_static_next_hop_is_used_like_the_data_path_uses_it() {
    with_env(|env| {
        let maps = load_probe(env);
        let (v, backend) = ("10.200.1.1:80/tcp", IpAddr::from(packet_lab::UNRESOLVED4));
        env.add_vip(vip(v), &[backend]);
        let cfg = static_next_hop(env);
        let frame = probe_frame(v, false);
        let out = expect_probe(env, &maps, &frame, mark(env, v, backend), TC_ACT_REDIRECT, ProbeReason::Redirect);
        expect_encap(&out, &frame, 14, backend, Some(cfg.static_dst_mac));
        assert_eq!(out[6..12], env.ingress_mac);
    });
}

#[test]
fn marks_that_name_no_live_backend_are_dropped() {
    with_env(|env| {
        let maps = load_probe(env);
        let v = "10.200.1.1:80/tcp";
        let (b1, b2) = (IpAddr::from(packet_lab::backend4(101)), IpAddr::from(packet_lab::backend4(102)));
        env.add_vip(vip(v), &[b1, b2]);
        let frame = probe_frame(v, false);
        let m = mark(env, v, b2);
        let id = env.reconciler.backend_id(&vip(v), &b2).unwrap();
        for not_ours in [0, m & 0x00ff_ffff, (m & 0x00ff_ffff) | 0x5400_0000] {
            expect_probe(env, &maps, &frame, not_ours, TC_ACT_SHOT, ProbeReason::DropNotProbe);
        }
        assert_eq!(maps.last(id).unwrap(), None, "a packet without our mark names no backend");
        // Removed: the slot is free.
        env.update(|s| s.remove_backend(&vip(v), b2).unwrap());
        expect_probe(env, &maps, &frame, m, TC_ACT_SHOT, ProbeReason::DropNoBackend);
        assert_eq!(maps.last(id).unwrap(), Some(ProbeReason::DropNoBackend));
        // Reused by another backend: the old mark's generation no longer matches.
        let b3 = IpAddr::from(packet_lab::backend4(103));
        env.update(|s| s.add_backend(&vip(v), b3, 100).unwrap());
        assert_eq!(env.reconciler.backend_id(&vip(v), &b3), Some(id), "the id is reused");
        expect_probe(env, &maps, &frame, m, TC_ACT_SHOT, ProbeReason::DropNoBackend);
        let fresh = expect_probe(env, &maps, &frame, mark(env, v, b3), TC_ACT_REDIRECT, ProbeReason::Redirect);
        expect_encap(&fresh, &frame, 14, b3, packet_lab::neighbour_mac(b3));
    });
}

#[test]
fn what_lbd_never_sends_is_refused() {
    with_env(|env| {
        let maps = load_probe(env);
        let v = "10.200.1.1:80/tcp";
        let backend = IpAddr::from(packet_lab::backend4(101));
        env.add_vip(vip(v), &[backend]);
        let m = mark(env, v, backend);
        let tcp = probe_frame(v, false);
        let mut icmp = tcp.clone();
        icmp[14 + 9] = 1;
        let with_options = frames::with_ipv4_options(&tcp, 1);
        let fragment = frames::as_ipv4_fragment(&tcp, true, 0);
        let arp = frames::arp_request([10, 1, 0, 1], [10, 1, 0, 101]);
        for frame in [icmp, with_options, fragment, arp, tcp[..14 + 20 + 2].to_vec()] {
            expect_probe(env, &maps, &frame, m, TC_ACT_SHOT, ProbeReason::DropMalformed);
        }
    });
}

#[test]
fn a_balancer_interface_that_does_not_forward_drops_the_probe_as_it_drops_traffic() {
    let lab = packet_lab::PacketLab::build().unwrap();
    with_env_in(&lab, |env| {
        let maps = load_probe(env);
        let (v, backend) = ("10.200.1.1:80/tcp", IpAddr::from(packet_lab::backend4(101)));
        env.add_vip(vip(v), &[backend]);
        let frame = probe_frame(v, false);
        lab.netns().sysctl(&format!("net.ipv4.conf.{}.forwarding", packet_lab::INGRESS), "0").unwrap();
        expect_probe(env, &maps, &frame, mark(env, v, backend), TC_ACT_SHOT, ProbeReason::DropForwardingDisabled);
        lab.netns().sysctl(&format!("net.ipv4.conf.{}.forwarding", packet_lab::INGRESS), "1").unwrap();
        expect_probe(env, &maps, &frame, mark(env, v, backend), TC_ACT_REDIRECT, ProbeReason::Redirect);
    });
}

#[test]
fn no_route_and_oversize_are_dropped() {
    with_env(|env| {
        let maps = load_probe(env);
        let (v, unrouted) = ("10.200.1.1:80/tcp", IpAddr::from([10, 9, 9, 9]));
        env.add_vip(vip(v), &[unrouted]);
        expect_probe(env, &maps, &probe_frame(v, false), mark(env, v, unrouted), TC_ACT_SHOT, ProbeReason::DropNoRoute);
        let (v, backend) = ("10.200.1.2:80/tcp", IpAddr::from(packet_lab::backend4(101)));
        env.add_vip(vip(v), &[backend]);
        let room = packet_lab::MTU as usize - 20 - 20 - 20;
        let target = sock("10.200.1.2:80");
        let fits = frames::tcp(sock("10.1.0.1:40000"), target, false, &vec![0u8; room]);
        expect_probe(env, &maps, &fits, mark(env, v, backend), TC_ACT_REDIRECT, ProbeReason::Redirect);
        let over = frames::tcp(sock("10.1.0.1:40000"), target, false, &vec![0u8; room + 1]);
        expect_probe(env, &maps, &over, mark(env, v, backend), TC_ACT_SHOT, ProbeReason::DropOversize);
    });
}
