//! Flows that survive a balancer *and* a change of the backend set: a backend is added while
//! one balancer is down, so the survivor's table gives some of the dead balancer's flows
//! another backend than theirs. Without second chance they would be reset; with it, their
//! packets reach the new backend inside a tunnel to their own, which the new backend sends on.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use spillway_harness::Signal;
use spillway_harness::fleet::Balancer;

use crate::support::{self, echo_vip, wait_for_next_hops};

const STREAMS_PER_CLIENT: usize = 16;

/// The client ends of `balancer`'s entries for the echo VIP.
fn clients_on(balancer: &Balancer) -> Vec<SocketAddr> {
    let list = balancer.lbctl_json(&["flows", "list", "--vip", &echo_vip(), "--limit", "1000"]).unwrap();
    list["entries"].as_array().unwrap().iter().map(|e| e["client"].as_str().unwrap().parse().unwrap()).collect()
}

/// The backend `balancer`'s table gives a new flow from `client` now, and the second
/// candidate its packets carry (`lbctl flows get`).
fn candidates(balancer: &Balancer, client: SocketAddr) -> (IpAddr, Option<IpAddr>) {
    let answer = balancer.lbctl_json(&["flows", "get", "--vip", &echo_vip(), &client.to_string()]).unwrap();
    let addr = |field: &str| answer[field].as_str().map(|a| a.parse().unwrap());
    (addr("maglev").unwrap(), addr("second_chance"))
}

/// A counter of `host`'s metrics endpoint at `port` (127.0.0.1 in its namespace), fresh:
/// the listener serves the same body for a second.
fn metric(host: &spillway_harness::Host, port: u16, series: &str) -> f64 {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    std::thread::sleep(Duration::from_millis(1100));
    let (_, body) = host.in_netns(|| spillway_harness::http_get(addr, "/metrics", Duration::from_secs(2))).unwrap();
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

#[test]
fn a_backend_added_while_a_balancer_is_down_keeps_that_balancers_flows() {
    // The change must replace the second-chance table: the configuration settles first.
    let fleet = support::start(2, 4, 3, &["--second-chance-settle-s", "2"]);
    let (lb1, lb2) = (fleet.balancer(1), fleet.balancer(2));
    for b in [lb1, lb2] {
        support::apply(&fleet, b, &[0, 1, 2]);
    }
    wait_for_next_hops(&fleet, &[lb1, lb2], Duration::from_secs(20));
    // Long-lived connections, quiet while the balancer dies and the backend is added.
    let mut streams = support::open_streams(&fleet, STREAMS_PER_CLIENT);
    let on_lb1 = clients_on(lb1);
    assert!(!on_lb1.is_empty() && on_lb1.len() < streams.len(), "{} of {} streams on lb1", on_lb1.len(), streams.len());
    std::thread::sleep(Duration::from_secs(3));

    lb1.set_link(false).unwrap();
    lb1.stop_lbd(Signal::SIGKILL).unwrap();
    lb1.stop_bird(Signal::SIGKILL).unwrap();
    wait_for_next_hops(&fleet, &[lb2], Duration::from_secs(20));
    // The fleet's file gains the fourth backend; applied to the balancer that is up.
    support::apply(&fleet, lb2, &[0, 1, 2, 3]);

    // Which of lb1's connections lb2's new table sends elsewhere than their backend: reset
    // without second chance.
    let names: BTreeMap<String, IpAddr> = fleet.backends().iter().map(|b| (b.name().to_owned(), IpAddr::V4(b.ipv4()))).collect();
    let mut would_break = 0;
    for stream in streams.iter().filter(|s| on_lb1.contains(&s.local_addr().unwrap())) {
        let own = names[stream.backend()];
        let (first, second) = candidates(lb2, stream.local_addr().unwrap());
        if first != own {
            would_break += 1;
            assert_eq!(second, Some(own), "flows get of a moved connection names its backend as the second chance");
        }
    }
    println!("{would_break} of lb1's {} connections would have been reset without second chance", on_lb1.len());
    assert!(would_break > 0, "no connection of lb1 moved: this proves nothing");

    let sent_before = metric(lb2.host(), 9476, "spillway_second_chance_packets_total");
    for stream in &mut streams {
        for _ in 0..3 {
            stream.ping().unwrap_or_else(|e| panic!("{e:#}"));
        }
    }
    let sent = metric(lb2.host(), 9476, "spillway_second_chance_packets_total") - sent_before;
    let forwarded = metric(&fleet.backends()[3], 9478, r#"spillway_decap_packets_total{reason="second_chance_forwarded"}"#);
    println!("every connection survived: lb2 sent {sent} packets with a second candidate, b4 sent {forwarded} on");
    assert!(sent >= 3.0 * would_break as f64, "{sent} second-chance packets for {would_break} moved connections");
    assert!(forwarded >= 3.0 * would_break as f64, "{forwarded} forwarded by b4 for {would_break} moved connections");
    // New connections reach the new backend.
    let tally = support::connect_all(&fleet, 20);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    assert!(tally.by_backend.contains_key("b4"), "{:?}", tally.by_backend);
}
