//! The backend side: tunnels addressed to the host are stripped, everything else passes.

use aya::maps::{HashMap, PerCpuArray};
use spillway::dataplane::test_run;
use spillway_common::{
    addr::to_words,
    limits::map_names,
    types::{AddrKey, DecapReason},
};
use spillway_harness::frames;

use crate::support::*;

fn decap_reasons(env: &Env) -> Vec<u64> {
    let map: PerCpuArray<_, u64> = PerCpuArray::try_from(env.decap.map(map_names::DECAP_REASONS).unwrap()).unwrap();
    DecapReason::ALL.iter().map(|r| map.get(&(*r as u32), 0).unwrap().iter().sum()).collect()
}

fn run_decap(env: &Env, frame: &[u8], reason: DecapReason) -> Vec<u8> {
    let program = env.decap.program("spillway_decap").unwrap();
    let program: &aya::programs::Xdp = program.try_into().unwrap();
    let before = decap_reasons(env);
    let out = test_run::run(program, frame, env.ingress).unwrap();
    let after = decap_reasons(env);
    assert_eq!(out.action, XDP_PASS);
    let counted: Vec<_> = DecapReason::ALL.iter().filter(|r| after[**r as usize] > before[**r as usize]).collect();
    assert_eq!(counted, [&reason]);
    out.frame
}

#[test]
fn tunnels_to_local_addresses_are_stripped() {
    with_env(|env| {
        {
            let mut local: HashMap<_, AddrKey, u32> = HashMap::try_from(env.decap.map_mut(map_names::LOCAL_ADDRS).unwrap()).unwrap();
            for a in ["10.1.0.1", "fd01::1"] {
                let (addr, family) = to_words(ip(a));
                local.insert(&AddrKey { addr, family, _pad: [0; 3] }, &1, 0).unwrap();
            }
        }
        let inner4 = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, b"hi");
        let inner6 = frames::tcp(sock("[2001:db8::20]:40000"), sock("[2001:db8:100::1]:80"), true, b"hi");
        for (outer_src, outer_dst, inner) in
            [("10.9.0.1", "10.1.0.1", &inner4), ("fd09::1", "fd01::1", &inner6), ("fd09::1", "fd01::1", &inner4)]
        {
            let tunnel = frames::tunnel(ip(outer_src), ip(outer_dst), &inner[14..]);
            let out = run_decap(env, &tunnel, DecapReason::Decapsulated);
            assert_eq!(out[0..12], tunnel[0..12], "MACs kept");
            assert_eq!(out[12..], inner[12..], "{outer_src} -> {outer_dst}: inner packet with its EtherType");
        }
        let tagged = frames::with_vlan(&frames::tunnel(ip("10.9.0.1"), ip("10.1.0.1"), &inner4[14..]), 9);
        let out = run_decap(env, &tagged, DecapReason::Decapsulated);
        assert_eq!(out, frames::with_vlan(&[&tagged[..12], &inner4[12..]].concat(), 9));

        let elsewhere = frames::tunnel(ip("10.9.0.1"), ip("10.1.0.77"), &inner4[14..]);
        assert_eq!(run_decap(env, &elsewhere, DecapReason::PassNotLocal), elsewhere);
        assert_eq!(run_decap(env, &inner4, DecapReason::PassNotTunnel), inner4);
        assert_eq!(run_decap(env, &inner4[..20], DecapReason::PassMalformed), &inner4[..20]);
    });
}
