//! The connection table under a spoofed-SYN flood, through the live balancer: idle
//! long-lived connections keep their backend after SYNs from spoofed sources, twice as many
//! as the table has entries, and a backend joining.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use spillway_harness::cluster::XdpMode;
use spillway_harness::{Stream, frames, send_frames};

use crate::in_both_modes;
use crate::support::*;

/// Idle connections; a joining fourth backend takes about a quarter of their Maglev choices,
/// so if their entries were lost some would move (all stay with probability 0.75^24 = 0.1%).
const LONG_LIVED: usize = 24;
/// A small table, so twice it is quick to send: 8,192 buckets of 4 entries.
const MAX_FLOWS: &str = "16384";
/// Spoofed SYNs go out in batches small enough for the veth queues.
const BATCH: u32 = 256;
const FLOOD_TIMEOUT: Duration = Duration::from_secs(60);

fn spoofed_syn(n: u32, dst: SocketAddr, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let [_, b, c, d] = n.to_be_bytes();
    let src = SocketAddr::from((Ipv4Addr::new(172, 16 + (b & 15), c, d), 1024 + (n % 50_000) as u16));
    let mut frame = frames::tcp(src, dst, true, &[]);
    frame[..6].copy_from_slice(&macs.0);
    frame[6..12].copy_from_slice(&macs.1);
    frame
}

fn established_connections_survive_a_spoofed_syn_flood(mode: XdpMode) {
    let mut c = start_with(mode, 3, 1, &["--max-flows", MAX_FLOWS]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    let client = &c.topo.clients()[0];
    let mut streams: Vec<Stream> = (0..LONG_LIVED)
        .map(|_| client.in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).expect("a long-lived connection"))
        .collect();
    for s in &mut streams {
        s.ping().expect("a first exchange");
    }
    let backends: Vec<String> = streams.iter().map(|s| s.backend().to_owned()).collect();

    let status = c.lbctl_json(&["status"]).unwrap();
    let flows = status["maps"].as_array().unwrap().iter().find(|m| m["name"] == "spw_flows").expect("spw_flows in lbctl status");
    // One number for the table's size everywhere: the flows lbd was sized for.
    let max_flows: u32 = MAX_FLOWS.parse().unwrap();
    assert_eq!(flows["max_entries"].as_u64(), Some(u64::from(max_flows)), "{status}");
    let log = c.lbd_log();
    let line = log.lines().find(|l| l.contains("event=map_memory map=spw_flows")).expect("the table's memory line");
    assert!(line.contains(&format!("max_flows={max_flows}")) && line.contains("buckets=") && line.contains("ways=4"), "{line}");
    // It has slots for twice as many.
    let entries = spillway_common::limits::Capacity { flows: max_flows, ..Default::default() }.flow_entries();
    assert_eq!(entries, 2 * max_flows);

    // The flood: a new spoofed source per SYN until the balancer has forwarded twice the
    // table's entries (the veths drop a few; those are made up with more).
    let macs = (c.topo.lb().netns().mac("eth0").unwrap(), client.netns().mac("eth0").unwrap());
    let before = reason_count(&c, "tx");
    let started = Instant::now();
    let mut next = 0;
    while reason_count(&c, "tx") - before < u64::from(2 * entries) {
        assert!(started.elapsed() < FLOOD_TIMEOUT, "the flood did not get through within {FLOOD_TIMEOUT:?}");
        for _ in 0..64 {
            let batch = next..next + BATCH;
            next += BATCH;
            client.in_netns(|| send_frames("eth0", batch.map(|n| spoofed_syn(n, tcp_target(false), macs)))).unwrap();
            std::thread::sleep(Duration::from_micros(300));
        }
    }

    // A backend joins; every idle connection still answers, from its own backend (another
    // would reset it).
    let b4 = backend_addr(c.add_backend_host().unwrap(), false);
    c.lbctl(&["backends", "add", "--vip", &vip, &b4]).unwrap();
    for (i, s) in streams.iter_mut().enumerate() {
        s.ping().unwrap_or_else(|e| panic!("connection {i} (to {}) broke after the flood: {e:#}", backends[i]));
    }
}
in_both_modes!(established_connections_survive_a_spoofed_syn_flood);
