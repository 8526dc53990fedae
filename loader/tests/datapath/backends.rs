//! Backend set changes: empty VIPs, draining, removal.

use std::collections::BTreeSet;

use spillway_common::types::{PROTO_TCP, Reason};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

#[test]
fn vip_without_backends_drops_and_counts() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[]);
        let f = frames::tcp(sock("192.168.10.20:40000"), sock("10.200.1.1:80"), true, &[]);
        env.expect(&f, XDP_DROP, Reason::DropNoBackend);
        // Draining the only backend leaves nothing for new flows either.
        let b = packet_lab::backend4(101).into();
        env.update(|s| s.add_backend(&vip("10.200.1.1:80/tcp"), b, 0).unwrap());
        env.expect(&f, XDP_DROP, Reason::DropNoBackend);
    });
}

#[test]
fn draining_backend_keeps_its_flows_and_gets_no_new_ones() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        env.add_vip(v, &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<_>>());
        let d = sock("10.200.1.1:80");
        // Open flows until every backend has one.
        let mut open = Vec::new();
        for port in 40000..40100u16 {
            let c = sock(&format!("192.168.10.20:{port}"));
            env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
            open.push((c, env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap()));
        }
        let drained = open[0].1;
        env.update(|s| s.set_weight(&v, drained, 0).unwrap());
        for (c, backend) in &open {
            let out = env.expect(&frames::tcp(*c, d, false, b"more"), XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &frames::tcp(*c, d, false, b"more"), 14, *backend, None);
        }
        let mut new_targets = BTreeSet::new();
        for port in 50000..50200u16 {
            let c = sock(&format!("192.168.10.20:{port}"));
            env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
            new_targets.insert(env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap());
        }
        assert!(!new_targets.contains(&drained), "a new flow went to the draining backend");
        assert_eq!(new_targets.len(), 2);
    });
}

#[test]
fn removed_backends_flows_are_rehashed_and_others_stay() {
    with_env(|env| {
        let v = vip("10.200.1.1:80/tcp");
        env.add_vip(v, &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<_>>());
        let d = sock("10.200.1.1:80");
        let mut open = Vec::new();
        for port in 40000..40060u16 {
            let c = sock(&format!("192.168.10.20:{port}"));
            env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
            open.push((c, env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap()));
        }
        let removed = open[0].1;
        env.update(|s| s.remove_backend(&v, removed).unwrap());
        for (c, before) in &open {
            let f = frames::tcp(*c, d, false, b"more");
            let out = env.expect(&f, XDP_TX, Reason::Tx);
            let now = env.pinned_backend(&flow_key(*c, d, PROTO_TCP)).unwrap();
            if *before == removed {
                assert_ne!(now, removed, "flow still on the removed backend");
            } else {
                assert_eq!(now, *before, "a surviving backend's flow moved");
            }
            expect_encap(&out.frame, &f, 14, now, None);
        }
    });
}
