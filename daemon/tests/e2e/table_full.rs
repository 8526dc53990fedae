//! A blind sender against the connection table, through the live balancer: spoofed
//! handshakes fill a small table with confirmed entries. A real connection opened after
//! them gets every packet through, none past its SYN charged to the VIP's budget (before, 18
//! of 20 were shed as `drop_vip_budget`), and the full table is an ALERT and a metric.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use spillway_harness::cluster::XdpMode;
use spillway_harness::{Stream, frames, send_frames};

use crate::support::*;

/// Spoofed tuples: more than the table's 8 entries.
const SPOOFED: u32 = 300;

fn spoofed_ack(n: u32, dst: SocketAddr, macs: ([u8; 6], [u8; 6])) -> Vec<u8> {
    let src = SocketAddr::from((Ipv4Addr::new(198, 51, 100 + (n / 250) as u8, (n % 250) as u8 + 1), 4000));
    let mut frame = frames::tcp(src, dst, false, b"ack");
    frame[..6].copy_from_slice(&macs.0);
    frame[6..12].copy_from_slice(&macs.1);
    frame
}

#[test]
fn a_table_full_of_spoofed_handshakes_sheds_no_connection_and_is_an_alert() {
    let c = start_with(XdpMode::Generic, 1, 1, &["--max-flows", "4"]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    c.lbctl(&["ratelimit", "budget", "--vip", &vip, "--new-flows", "1", "--burst", "1"]).unwrap();
    let client = &c.topo.clients()[0];
    let macs = (c.topo.lb().netns().mac("eth0").unwrap(), client.netns().mac("eth0").unwrap());
    // Two packets each: the second confirms the entry the first made.
    let pairs = (0..2 * SPOOFED).map(|i| spoofed_ack(i / 2, tcp_target(false), macs));
    client.in_netns(|| send_frames("eth0", pairs)).unwrap();
    let shed_before = reason_count(&c, "drop_vip_budget");
    let mut stream = client.in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).expect("a connection after the flood");
    for i in 0..20 {
        stream.ping().unwrap_or_else(|e| panic!("exchange {i} of a connection the full table could not remember: {e:#}"));
    }
    assert_eq!(reason_count(&c, "drop_vip_budget"), shed_before, "a packet past a handshake was charged to the VIP budget");

    let started = Instant::now();
    let alert = loop {
        if let Some(line) = c.lbd_log().lines().find(|l| l.contains("event=flow_table_full")) {
            break line.to_owned();
        }
        assert!(started.elapsed() < Duration::from_secs(15), "no event=flow_table_full in lbd's log:\n{}", c.lbd_log());
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(alert.contains("ALERT") && alert.contains("max_flows=4"), "{alert}");
    let status = c.lbctl_json(&["status"]).unwrap();
    let alerts = status["alerts"].as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect::<Vec<_>>()).unwrap_or_default();
    assert!(alerts.iter().any(|a| a.starts_with("ALERT: the connection table was full")), "lbctl status has the ALERT: {status}");
    // lbd's default metrics listener.
    let addr: SocketAddr = "127.0.0.1:9476".parse().unwrap();
    let (_, body) = c.topo.lb().in_netns(|| spillway_harness::http_get(addr, "/metrics", Duration::from_secs(2))).unwrap();
    let full: f64 = body.lines().find_map(|l| l.strip_prefix("spillway_flow_table_full_total ")?.parse().ok()).expect("the metric");
    assert!(full >= 1.0, "spillway_flow_table_full_total {full}");
}
