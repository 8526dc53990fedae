//! Next-hop resolution: TX, redirect, unresolved neighbours, MTU.

use spillway_common::types::Reason;
use spillway_harness::{frames, packet_lab};

use crate::support::*;

#[test]
fn unresolved_neighbour_hands_the_encapsulated_packet_to_the_kernel() {
    with_env(|env| {
        for (v, backend, client) in [
            ("10.200.1.1:80", std::net::IpAddr::from(packet_lab::UNRESOLVED4), "192.168.10.20:40000"),
            ("[2001:db8:100::1]:80", packet_lab::UNRESOLVED6.into(), "[2001:db8::20]:40000"),
        ] {
            env.add_vip(vip(&format!("{v}/tcp")), &[backend]);
            let f = frames::tcp(sock(client), sock(v), true, &[]);
            let out = env.expect(&f, XDP_PASS, Reason::KernelNoNeigh);
            // Addressed as it arrived, so the kernel accepts and forwards it.
            expect_encap(&out.frame, &f, 14, backend, Some(frames::LB_MAC));
            assert_eq!(out.frame[6..12], frames::CLIENT_MAC);
        }
    });
}

#[test]
fn backend_behind_another_interface_is_redirected() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::BEHIND_EGRESS4.into()]);
        env.add_vip(vip("[2001:db8:100::1]:80/tcp"), &[packet_lab::BEHIND_EGRESS6.into()]);
        for (client, v, backend) in [
            ("192.168.10.20:40000", "10.200.1.1:80", std::net::IpAddr::from(packet_lab::BEHIND_EGRESS4)),
            ("[2001:db8::20]:40000", "[2001:db8:100::1]:80", packet_lab::BEHIND_EGRESS6.into()),
        ] {
            let f = frames::tcp(sock(client), sock(v), true, &[]);
            let out = env.expect(&f, XDP_REDIRECT, Reason::Redirect);
            expect_encap(&out.frame, &f, 14, backend, packet_lab::neighbour_mac(backend));
        }
        // Without the egress in the redirect map the kernel forwards it instead.
        let egress = env.balancer.tx_ports.keys().next().unwrap().unwrap();
        env.balancer.tx_ports.remove(egress).unwrap();
        let f = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        let out = env.expect(&f, XDP_PASS, Reason::KernelNoTxPort);
        expect_encap(&out.frame, &f, 14, packet_lab::BEHIND_EGRESS4.into(), Some(frames::LB_MAC));
    });
}

/// Without DF: its sender did not ask for path MTU discovery, so nothing answers it (with DF
/// it is answered, `packet_too_big.rs`).
#[test]
fn encapsulated_packet_over_the_egress_mtu_without_df_is_dropped() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        let room = packet_lab::MTU as usize - 20 - 40;
        let fits = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), false, &vec![0u8; room]);
        env.expect(&fits, XDP_TX, Reason::Tx);
        let full = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), false, &vec![0u8; room + 1]);
        let full = frames::with_dont_fragment(&full, false);
        env.expect(&full, XDP_DROP, Reason::DropOversize);
    });
}

#[test]
fn static_next_hop_skips_the_fib() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::UNRESOLVED4.into()]);
        let cfg = static_next_hop(env);
        let f = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        let out = env.expect(&f, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &f, 14, packet_lab::UNRESOLVED4.into(), Some(cfg.static_dst_mac));
    });
}

#[test]
fn next_hop_is_cached_per_cpu_and_refreshed_after_its_ttl() {
    let lab = spillway_harness::packet_lab::PacketLab::build().unwrap();
    with_env_in(&lab, |env| {
        // The cache is per CPU: stay on one so every run sees the same cache.
        let mut one_cpu = nix::sched::CpuSet::new();
        one_cpu.set(0).unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &one_cpu).unwrap();
        let backend: std::net::IpAddr = packet_lab::backend4(101).into();
        env.add_vip(vip("10.200.1.1:80/tcp"), &[backend]);
        let f = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        let out = env.expect(&f, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &f, 14, backend, packet_lab::neighbour_mac(backend));

        let moved = [0x02, 0xbe, 0xee, 0, 0, 1];
        lab.netns()
            .run(&[
                "ip",
                "neigh",
                "replace",
                &backend.to_string(),
                "lladdr",
                "02:be:ee:00:00:01",
                "nud",
                "permanent",
                "dev",
                packet_lab::INGRESS,
            ])
            .unwrap();
        // Within the TTL this CPU still uses what it cached...
        let out = env.expect(&f, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &f, 14, backend, packet_lab::neighbour_mac(backend));
        // ...and after it, the new neighbour.
        std::thread::sleep(
            std::time::Duration::from_nanos(spillway_common::limits::NEXTHOP_CACHE_TTL_NS) + std::time::Duration::from_millis(200),
        );
        let out = env.expect(&f, XDP_TX, Reason::Tx);
        expect_encap(&out.frame, &f, 14, backend, Some(moved));
    });
}

#[test]
fn an_ingress_interface_that_does_not_forward_drops_under_its_own_reason() {
    let lab = spillway_harness::packet_lab::PacketLab::build().unwrap();
    with_env_in(&lab, |env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        env.add_vip(vip("[2001:db8:100::1]:80/tcp"), &[packet_lab::backend6(101).into()]);
        let v4 = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        let v6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, &[]);
        // Nothing cached yet: the next hop comes from bpf_fib_lookup, which refuses.
        for family in ["ipv4", "ipv6"] {
            lab.netns().sysctl(&format!("net.{family}.conf.{}.forwarding", packet_lab::INGRESS), "0").unwrap();
        }
        env.expect(&v4, XDP_DROP, Reason::DropForwardingDisabled);
        env.expect(&v6, XDP_DROP, Reason::DropForwardingDisabled);
        for family in ["ipv4", "ipv6"] {
            lab.netns().sysctl(&format!("net.{family}.conf.{}.forwarding", packet_lab::INGRESS), "1").unwrap();
        }
        env.expect(&v4, XDP_TX, Reason::Tx);
        env.expect(&v6, XDP_TX, Reason::Tx);
    });
}
