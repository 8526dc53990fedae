//! Flows that survive a balancer: ECMP moves a dead balancer's flows to the others, which
//! have no table entry for them; Maglev gives them the same backend (the backend set is the
//! same), so long-lived connections carry on and only requests in flight during the
//! routing convergence are lost. Adding a balancer moves flows the same way and breaks none.

use std::time::{Duration, Instant};

use spillway_harness::cluster::TCP_PORT;
use spillway_harness::fleet::{Fleet, HTTP_PORT, vip_target};
use spillway_harness::{Load, LoadConfig, LoadReport, Signal, Stream, StreamChecker};

use crate::support::{self, all, echo_vip, http_vip, wait_for_next_hops};

/// Streams per client; their source ports spread them over the balancers.
const STREAMS_PER_CLIENT: usize = 8;
/// A ping may wait this long: TCP retransmits across the convergence (a few seconds)
/// until the route points at a live balancer.
const PING_TIMEOUT: Duration = Duration::from_secs(20);
const PING_EVERY: Duration = Duration::from_millis(200);
const LOAD_PER_S: u32 = 100;

fn open_streams(fleet: &Fleet) -> Vec<StreamChecker> {
    let mut checkers = Vec::new();
    for client in fleet.clients() {
        for _ in 0..STREAMS_PER_CLIENT {
            let stream = client.in_netns(|| Stream::open(vip_target(TCP_PORT), PING_TIMEOUT)).unwrap();
            checkers.push(StreamChecker::start(stream, PING_EVERY));
        }
    }
    checkers
}

/// Connection-table entries of the echo VIP on `balancer`: the streams it carries.
fn streams_on(balancer: &spillway_harness::fleet::Balancer) -> usize {
    let list = balancer.lbctl_json(&["flows", "list", "--vip", &echo_vip()]).unwrap();
    list["entries"].as_array().unwrap().len()
}

/// Requests lost per second of the run (`failed`), printed as a line.
fn print_load(report: &LoadReport, events: &[(&str, Duration)]) {
    let lost: Vec<String> = report.buckets.iter().enumerate().map(|(s, b)| format!("{s}s:{}/{}", b.failed, b.attempted)).collect();
    println!("requests failed/attempted per second: {}", lost.join(" "));
    for (what, at) in events {
        println!("  {what} at {:.1}s", at.as_secs_f64());
    }
}

#[test]
fn losing_a_balancer_then_adding_one_breaks_no_established_connection() {
    let mut fleet = support::start(2, 4, 3, &[]);
    let (lb1, lb2) = (fleet.balancer(1), fleet.balancer(2));
    for b in [lb1, lb2] {
        support::apply(&fleet, b, &all(&fleet));
    }
    wait_for_next_hops(&fleet, &[lb1, lb2], Duration::from_secs(20));
    let streams = open_streams(&fleet);
    let on_lb1 = streams_on(lb1);
    println!("{} streams, {on_lb1} through lb1", streams.len());
    assert!(on_lb1 > 0 && on_lb1 < streams.len(), "the streams must be spread over both balancers");
    let load =
        Load::start(support::client(&fleet, 0), LoadConfig::new(vip_target(HTTP_PORT), LOAD_PER_S, Duration::from_secs(40))).unwrap();
    std::thread::sleep(Duration::from_secs(4));
    let requests_on_lb1 = support::vip_packets(lb1, &http_vip());
    println!("lb1 saw {requests_on_lb1} packets of requests, lb2 {}", support::vip_packets(lb2, &http_vip()));
    assert!(requests_on_lb1 > 0, "the requests must be spread over both balancers");

    // lb1 dies: its link first (no FIN leaves, the router notices by BFD), then its lbd and
    // BIRD.
    let killed_at = load.elapsed();
    lb1.set_link(false).unwrap();
    lb1.stop_lbd(Signal::SIGKILL).unwrap();
    lb1.stop_bird(Signal::SIGKILL).unwrap();
    let converged = wait_for_next_hops(&fleet, &[lb2], Duration::from_secs(20));
    let converged_at = killed_at + converged;
    println!("the router dropped lb1 {converged:?} after it died");
    std::thread::sleep(Duration::from_secs(4));

    // A fresh balancer joins with the same state: about half the flows move to it.
    let joined = Instant::now();
    fleet.add_balancer().unwrap();
    let (lb2, lb3) = (fleet.balancer(2), fleet.balancer(3));
    support::apply(&fleet, lb3, &all(&fleet));
    wait_for_next_hops(&fleet, &[lb2, lb3], Duration::from_secs(20));
    let added_at = load.elapsed();
    println!("lb3 carries traffic {:?} after it was started", joined.elapsed());
    std::thread::sleep(Duration::from_secs(6));

    let report = load.stop().unwrap();
    let reports: Vec<_> = streams.into_iter().map(StreamChecker::stop).collect();
    print_load(&report, &[("lb1 killed", killed_at), ("route converged", converged_at), ("lb3 routed", added_at)]);
    let lost = report.totals.failed + report.totals.not_sent;
    println!("requests lost: {lost} of {} ({} during the convergence)", report.totals.attempted, report.totals.failed);
    for r in &reports {
        assert_eq!(r.failures, 0, "a long-lived connection to {} broke: {:?}", r.backend, r.errors);
        assert!(r.pings > 10, "{r:?}");
    }
    // New connections succeed once the route converged (a second of margin for requests
    // started just before), and while lb3 joins.
    let settled = (converged_at + Duration::from_secs(1)).as_secs() as usize + 1;
    for (second, bucket) in report.buckets.iter().enumerate().skip(settled) {
        assert_eq!(bucket.failed + bucket.not_sent, 0, "second {second}: {bucket:?}; {:?}", report.errors);
    }
    assert!(support::vip_packets(lb3, &http_vip()) > 0, "lb3 carried no request");
    assert!(streams_on(lb3) > 0, "no stream moved to lb3 (this proves nothing then)");
}
