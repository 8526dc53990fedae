//! The backend side: tunnels from the balancers addressed to the host are stripped, tunnels
//! from anyone else to it are dropped, everything else passes.

use aya::maps::PerCpuArray;
use spillway_common::{limits::map_names, types::DecapReason};
use spillway_dataplane::test_run;
use spillway_harness::frames;

use crate::support::*;

fn decap_reasons(env: &Env) -> Vec<u64> {
    let map: PerCpuArray<_, u64> = PerCpuArray::try_from(env.decap.map(map_names::DECAP_REASONS).unwrap()).unwrap();
    DecapReason::ALL.iter().map(|r| map.get(&(*r as u32), 0).unwrap().iter().sum()).collect()
}

/// Runs the decapsulator on `frame`: its action, and that only `reason` was counted.
pub(crate) fn run_decap(env: &Env, frame: &[u8], action: u32, reason: DecapReason) -> Vec<u8> {
    let program = env.decap.program("spillway_decap").unwrap();
    let program: &aya::programs::Xdp = program.try_into().unwrap();
    let before = decap_reasons(env);
    let out = test_run::run(program, frame, env.ingress).unwrap();
    let after = decap_reasons(env);
    let counted: Vec<_> = DecapReason::ALL.iter().filter(|r| after[**r as usize] > before[**r as usize]).collect();
    assert_eq!(counted, [&reason]);
    assert_eq!(out.action, action, "{}", reason.label());
    out.frame
}

/// The host's addresses (its own and a VIP on `lo`, each family), and the balancers'.
pub(crate) fn backend_host(env: &mut Env) {
    env.decap_local(&["10.1.0.1", "fd01::1", "10.200.1.1", "2001:db8:100::1"].map(ip));
    env.decap_allow(&["10.9.0.1/32", "fd09::/64"]);
}

#[test]
fn tunnels_from_the_balancers_to_local_addresses_are_stripped() {
    with_env(|env| {
        backend_host(env);
        let inner4 = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, b"hi");
        let inner6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, b"hi");
        for (outer_src, outer_dst, inner) in
            [("10.9.0.1", "10.1.0.1", &inner4), ("fd09::1", "fd01::1", &inner6), ("fd09::1", "fd01::1", &inner4)]
        {
            let tunnel = frames::tunnel(ip(outer_src), ip(outer_dst), &inner[14..]);
            let out = run_decap(env, &tunnel, XDP_PASS, DecapReason::Decapsulated);
            assert_eq!(out[0..12], tunnel[0..12], "MACs kept");
            assert_eq!(out[12..], inner[12..], "{outer_src} -> {outer_dst}: inner packet with its EtherType");
        }
        let tagged = frames::with_vlan(&frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &inner4[14..]), 9);
        let out = run_decap(env, &tagged, XDP_PASS, DecapReason::Decapsulated);
        assert_eq!(out, frames::with_vlan(&[&tagged[..12], &inner4[12..]].concat(), 9));

        let elsewhere = frames::tunnel(ip("10.9.0.1"), ip("10.1.0.77"), &inner4[14..]);
        assert_eq!(run_decap(env, &elsewhere, XDP_PASS, DecapReason::PassNotLocal), elsewhere);
        assert_eq!(run_decap(env, &inner4, XDP_PASS, DecapReason::PassNotTunnel), inner4);
        assert_eq!(run_decap(env, &inner4[..20], XDP_PASS, DecapReason::PassMalformed), &inner4[..20]);
    });
}

#[test]
fn tunnels_from_anyone_but_the_balancers_are_dropped() {
    with_env(|env| {
        backend_host(env);
        let inner4 = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, b"hi");
        let inner6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, b"hi");
        // The attacker's own source, one next to the balancer's, and the other family's.
        for (outer_src, outer_dst, inner) in
            [("203.0.113.7", "10.1.0.1", &inner4), ("10.9.0.2", "10.1.0.1", &inner4), ("fd09:1::1", "fd01::1", &inner6)]
        {
            let tunnel = frames::tunnel(ip(outer_src), ip(outer_dst), &inner[14..]);
            run_decap(env, &tunnel, XDP_DROP, DecapReason::DropNotAllowed);
        }
        // From a balancer, but a packet for somebody else: the host is no relay.
        for inner_dst in ["10.1.0.77:80", "192.0.2.1:22"] {
            let inner = frames::tcp(sock("192.168.10.20:40000"), sock(inner_dst), true, b"hi");
            run_decap(env, &frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &inner[14..]), XDP_DROP, DecapReason::DropInnerNotLocal);
        }
        // Nor a way to loopback: the agent never lists loopback addresses, and a tunnel to
        // one is refused even if the map held it.
        let to_loopback = frames::tcp(sock("192.168.10.20:40000"), sock("127.0.0.1:6379"), true, b"hi");
        let tunnel = frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &to_loopback[14..]);
        run_decap(env, &tunnel, XDP_DROP, DecapReason::DropInnerNotLocal);
        env.decap_local(&[ip("127.0.0.1"), ip("::1")]);
        for (outer_src, outer_dst, inner) in [("10.9.0.1", "127.0.0.1", &inner4), ("fd09::1", "::1", &inner6)] {
            let tunnel = frames::tunnel(ip(outer_src), ip(outer_dst), &inner[14..]);
            assert_eq!(run_decap(env, &tunnel, XDP_PASS, DecapReason::PassNotLocal), tunnel, "not stripped");
        }
    });
}
