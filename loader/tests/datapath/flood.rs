//! The connection table under a spoofed-SYN flood: flows that completed their handshake keep
//! their entries, and so their backend across a change of the backend set, however many
//! SYNs from spoofed sources arrive.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;

use spillway_common::{
    limits::{Capacity, FLOW_WAYS},
    types::{PROTO_TCP, Reason},
};
use spillway_harness::{frames, packet_lab};

use crate::support::*;

const VIP: &str = "10.200.1.1:80";
/// Long-lived flows; enough that a backend joining moves some of their Maglev choices.
const LONG_LIVED: u16 = 200;
/// A small table (2,048 buckets of 4 entries), so a flood of twice it is quick.
const CAPACITY: Capacity = Capacity { vips: 8, backends: 64, flows: 4096, ring_slots: 8 * 2 * 4099 };

fn spoofed(n: u32) -> SocketAddr {
    let [_, b, c, d] = n.to_be_bytes();
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(172, 16 + (b & 15), c, d)), 1024 + (n % 50_000) as u16)
}

#[test]
fn long_lived_flows_keep_their_backend_through_a_spoofed_syn_flood_twice_the_table() {
    with_env_sized(CAPACITY, |env| {
        let v = vip(&format!("{VIP}/tcp"));
        env.add_vip(v, &(101..=103).map(|n| packet_lab::backend4(n).into()).collect::<Vec<IpAddr>>());
        let d = sock(VIP);
        // Handshakes completed: SYN, then an ACK confirms the entry.
        let flows: Vec<(SocketAddr, IpAddr)> = (0..LONG_LIVED)
            .map(|i| {
                let c = sock(&format!("192.168.10.20:{}", 20_000 + i));
                env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
                env.expect(&frames::tcp(c, d, false, &[]), XDP_TX, Reason::Tx);
                (c, env.pinned_backend(&flow_key(c, d, PROTO_TCP)).unwrap())
            })
            .collect();

        // A new spoofed source on every SYN, twice as many as the table has entries.
        let entries = CAPACITY.flow_buckets() * FLOW_WAYS;
        let before = env.reasons()[Reason::Tx as usize];
        for n in 0..2 * entries {
            assert_eq!(env.run(&frames::tcp(spoofed(n), d, true, &[])).action, XDP_TX, "spoofed SYN {n}");
        }
        assert_eq!(env.reasons()[Reason::Tx as usize] - before, u64::from(2 * entries), "every spoofed SYN was forwarded");
        let (mut confirmed, mut unconfirmed) = (0, 0);
        env.balancer.maps.scan_flows(|_, flow| {
            if flow.confirmed {
                confirmed += 1
            } else {
                unconfirmed += 1
            }
            ControlFlow::Continue(())
        });
        assert_eq!(confirmed, LONG_LIVED as usize, "the long-lived flows' entries");
        assert!(unconfirmed > entries as usize / 2, "the flood filled the rest of the table: {unconfirmed} of {entries}");

        // A backend joins: a flow without its entry would now go where the new table says.
        env.update(|s| s.add_backend(&v, packet_lab::backend4(104).into(), 100).unwrap());
        let moved = flows.iter().filter(|(c, b)| env.predicted_backend(&v, &flow_key(*c, d, PROTO_TCP)) != *b).count();
        assert!(moved >= LONG_LIVED as usize / 10, "only {moved} flows' Maglev choice changed: the check below would prove little");
        for (c, backend) in &flows {
            let data = frames::tcp(*c, d, false, b"still here");
            let out = env.expect(&data, XDP_TX, Reason::Tx);
            expect_encap(&out.frame, &data, 14, *backend, None);
        }
    });
}

#[test]
fn a_full_table_of_confirmed_flows_forwards_new_ones_without_remembering_them() {
    // One bucket of four entries, and a flow in either of its two (the same) buckets.
    let tiny = Capacity { flows: 2, ..CAPACITY };
    assert_eq!(tiny.flow_buckets() * FLOW_WAYS, 4);
    with_env_sized(tiny, |env| {
        env.add_vip(vip(&format!("{VIP}/tcp")), &[packet_lab::backend4(101).into()]);
        let d = sock(VIP);
        let client = |port: u16| sock(&format!("192.168.10.20:{port}"));
        for port in 1..=4 {
            env.expect(&frames::tcp(client(port), d, true, &[]), XDP_TX, Reason::Tx);
            env.expect(&frames::tcp(client(port), d, false, &[]), XDP_TX, Reason::Tx);
        }
        for packet in [frames::tcp(client(5), d, true, &[]), frames::tcp(client(5), d, false, b"x")] {
            env.expect(&packet, XDP_TX, Reason::Tx);
        }
        assert_eq!(env.pinned_backend(&flow_key(client(5), d, PROTO_TCP)), None, "a confirmed flow was evicted");
        for port in 1..=4 {
            assert!(env.pinned_backend(&flow_key(client(port), d, PROTO_TCP)).is_some(), "flow {port} lost its entry");
        }
        // An unconfirmed entry does give way: flow 4 starts again (a SYN), then 6 arrives.
        env.expect(&frames::tcp(client(4), d, true, &[]), XDP_TX, Reason::Tx);
        env.expect(&frames::tcp(client(6), d, true, &[]), XDP_TX, Reason::Tx);
        assert!(env.pinned_backend(&flow_key(client(6), d, PROTO_TCP)).is_some());
        assert_eq!(env.pinned_backend(&flow_key(client(4), d, PROTO_TCP)), None);
    });
}
