//! Backend set changes: empty VIPs, draining, removal.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use spillway_model::Vip;

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

/// A VIP on three lab backends, and one SYN from each of `ports`: the flows and the backend
/// each was given.
fn three_backends_with_flows(env: &mut Env, ports: std::ops::Range<u16>) -> (Vip, SocketAddr, Vec<(SocketAddr, IpAddr)>) {
    let v = vip("10.200.1.1:80/tcp");
    env.add_vip(v, &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<_>>());
    let d = sock("10.200.1.1:80");
    let open = new_flows(env, d, ports);
    (v, d, open)
}

fn new_flows(env: &Env, d: SocketAddr, ports: std::ops::Range<u16>) -> Vec<(SocketAddr, IpAddr)> {
    ports
        .map(|port| {
            let c = sock(&format!("192.168.10.20:{port}"));
            env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
            (c, env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap())
        })
        .collect()
}

#[test]
fn draining_backend_keeps_its_flows_and_gets_no_new_ones() {
    with_env(|env| {
        // Enough flows that every backend has some.
        let (v, d, open) = three_backends_with_flows(env, 40000..40100);
        let drained = open[0].1;
        env.update(|s| s.set_weight(&v, drained, 0).unwrap());
        for (c, backend) in &open {
            let out = env.expect(&frames::tcp(*c, d, false, b"more"), XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &frames::tcp(*c, d, false, b"more"), 14, *backend, None);
        }
        let new_targets: BTreeSet<IpAddr> = new_flows(env, d, 50000..50200).into_iter().map(|(_, b)| b).collect();
        assert!(!new_targets.contains(&drained), "a new flow went to the draining backend");
        assert_eq!(new_targets.len(), 2);
    });
}

/// Regression (found by the router-overload replay): a client reusing a port sent its new
/// connection's SYN to the tuple's old backend even after that backend was drained or
/// ejected (weight 0), so reused ports kept failing against a dead backend.
#[test]
fn a_syn_reusing_a_known_tuple_is_placed_afresh() {
    with_env(|env| {
        let (v, d, open) = three_backends_with_flows(env, 40000..40100);
        let drained = open[0].1;
        env.update(|s| s.set_weight(&v, drained, 0).unwrap());
        let reused: Vec<SocketAddr> = open.iter().filter(|(_, b)| *b == drained).map(|(c, _)| *c).collect();
        assert!(!reused.is_empty());
        for c in reused {
            env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
            let now = env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap();
            assert_ne!(now, drained, "the SYN of a new connection on {c} went to the drained backend");
        }
    });
}

/// Regression (hostile senders): a SYN on a tuple with a live entry was placed afresh, so an
/// off-path sender who knew a client's address and port moved its connection to the current
/// Maglev choice, which resets it after any change. Such a SYN goes where the entry says
/// while that backend takes new flows (and is not charged twice: it went through the limits).
#[test]
fn a_syn_on_a_live_entry_goes_where_the_entry_says() {
    with_env(|env| {
        let (v, d, open) = three_backends_with_flows(env, 40000..40100);
        for (c, _) in &open {
            env.expect(&frames::tcp(*c, d, false, b"confirm"), XDP_TX, Reason::Tx);
        }
        env.update(|s| s.add_backend(&v, packet_lab::backend4(104).into(), 100).unwrap());
        let moved: Vec<&(SocketAddr, IpAddr)> =
            open.iter().filter(|(c, b)| env.predicted_backend(&v, &flow_key(*c, d, PROTO_TCP)) != *b).collect();
        assert!(!moved.is_empty(), "the new backend moved no flow's Maglev choice");
        for (c, backend) in moved {
            let syn = frames::tcp(*c, d, true, &[]);
            let out = env.expect(&syn, XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &syn, 14, *backend, None);
            let data = frames::tcp(*c, d, false, b"still mine");
            let out = env.expect(&data, XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &data, 14, *backend, None);
        }
    });
}

#[test]
fn removed_backends_flows_are_rehashed_and_others_stay() {
    with_env(|env| {
        let (v, d, open) = three_backends_with_flows(env, 40000..40060);
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
