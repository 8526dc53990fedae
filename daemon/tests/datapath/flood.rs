//! The connection table under a spoofed-SYN flood: flows that completed their handshake keep
//! their entries, and so their backend across a change of the backend set, however many
//! SYNs from spoofed sources arrive.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

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
const CAPACITY: Capacity = Capacity { vips: 8, backends: 64, flows: 4096, ring_slots: 8 * 2 * 4099, fragments: 1024 };

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
        let (confirmed, unconfirmed) = env.flow_entries();
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
        assert_eq!(env.balancer.maps.unremembered_flows().unwrap(), 2, "both of flow 5's packets found the table full");
    });
}

#[test]
fn an_unconfirmed_entry_gives_way_to_a_new_flow() {
    let tiny = Capacity { flows: 2, ..CAPACITY };
    with_env_sized(tiny, |env| {
        env.add_vip(vip(&format!("{VIP}/tcp")), &[packet_lab::backend4(101).into()]);
        let d = sock(VIP);
        let client = |port: u16| sock(&format!("192.168.10.20:{port}"));
        for port in 1..=3 {
            env.expect(&frames::tcp(client(port), d, true, &[]), XDP_TX, Reason::Tx);
            env.expect(&frames::tcp(client(port), d, false, &[]), XDP_TX, Reason::Tx);
        }
        // A SYN nobody followed up, then a new flow: it takes the SYN's way.
        env.expect(&frames::tcp(client(4), d, true, &[]), XDP_TX, Reason::Tx);
        env.expect(&frames::tcp(client(6), d, true, &[]), XDP_TX, Reason::Tx);
        assert!(env.pinned_backend(&flow_key(client(6), d, PROTO_TCP)).is_some());
        assert_eq!(env.pinned_backend(&flow_key(client(4), d, PROTO_TCP)), None);
        assert_eq!(env.balancer.maps.unremembered_flows().unwrap(), 0);
    });
}

/// Regression (hostile senders): a blind sender confirmed entries with spoofed SYN+ACK
/// pairs, confirmed entries were never evicted, and packets of connections the full table
/// could not remember were charged to the VIP's budget: a connection established after the
/// flood lost 18 of its 20 packets. Now nothing but a new flow is charged, and a spoofed
/// handshake holds its way only while its sender keeps sending on it.
#[test]
fn spoofed_handshakes_hold_entries_only_while_they_keep_sending() {
    use spillway_common::limits::{FLOW_HOLD_TICKS, FLOW_TICK_SHIFT, FLOW_TOUCH_TICKS};
    use spillway_model::{LimitConfig, RateSpec};
    let tiny = Capacity { flows: 2, ..CAPACITY };
    with_env_sized(tiny, |env| {
        let v = vip(&format!("{VIP}/tcp"));
        env.add_vip(v, &[packet_lab::backend4(101).into()]);
        let d = sock(VIP);
        let spoofed = |n: u16| sock(&format!("198.51.100.{n}:4000"));
        for n in 1..=4 {
            env.expect(&frames::tcp(spoofed(n), d, true, &[]), XDP_TX, Reason::Tx);
            env.expect(&frames::tcp(spoofed(n), d, false, &[]), XDP_TX, Reason::Tx);
        }
        // A budget of one new flow a second, spent by the next SYN.
        env.update(|s| {
            s.set_limits(Some(&v), LimitConfig { vip_budget: Some(RateSpec { per_s: 1, burst: 0 }), ..LimitConfig::default() }).unwrap()
        });
        let honest = sock("192.168.10.20:5000");
        env.expect(&frames::tcp(honest, d, true, &[]), XDP_TX, Reason::Tx);
        for i in 0..20 {
            let out = env.run(&frames::tcp(honest, d, false, format!("segment {i}").as_bytes()));
            assert_eq!(out.action, XDP_TX, "packet {i} of a connection the full table could not remember");
        }
        assert_eq!(env.reasons()[Reason::DropVipBudget as usize], 0, "a packet past the handshake was charged to the budget");
        assert_eq!(env.pinned_backend(&flow_key(honest, d, PROTO_TCP)), None);
        assert!(env.balancer.maps.unremembered_flows().unwrap() >= 1, "the full table was not counted");
        env.update(|s| s.clear_limits(Some(&v)).unwrap());

        // The sender keeps paying for two entries only (a packet after the touch interval,
        // before the hold), and a new flow then takes the way of one it stopped paying for.
        let tick = |ticks: u32| std::time::Duration::from_nanos(u64::from(ticks) << FLOW_TICK_SHIFT);
        std::thread::sleep(tick(FLOW_TOUCH_TICKS) + std::time::Duration::from_millis(200));
        for n in 1..=2 {
            env.expect(&frames::tcp(spoofed(n), d, false, b"paying"), XDP_TX, Reason::Tx);
        }
        std::thread::sleep(tick(FLOW_HOLD_TICKS - FLOW_TOUCH_TICKS) + std::time::Duration::from_millis(300));
        let newcomers = [sock("192.168.10.20:5001"), sock("192.168.10.20:5002"), sock("192.168.10.20:5003")];
        for c in newcomers {
            env.expect(&frames::tcp(c, d, true, &[]), XDP_TX, Reason::Tx);
            env.expect(&frames::tcp(c, d, false, &[]), XDP_TX, Reason::Tx);
        }
        let held = |c| env.pinned_backend(&flow_key(c, d, PROTO_TCP)).is_some();
        assert!(held(spoofed(1)) && held(spoofed(2)), "entries their sender kept paying for");
        assert!(!held(spoofed(3)) && !held(spoofed(4)), "entries idle past the hold");
        assert!(held(newcomers[0]) && held(newcomers[1]), "new flows took the stale ways");
        assert!(!held(newcomers[2]), "the third found every way held again (and its sender's entries were younger than the hold)");
    });
}
