//! Announcing: every balancer announces the VIP, the router spreads clients over all of
//! them, and withdrawals follow the data path only.

use std::time::{Duration, Instant};

use spillway_harness::fleet::{Balancer, HTTP_PORT, vip_target};
use spillway_harness::{Load, LoadConfig, Signal, VIP4};

use crate::support::{self, all, echo_vip, wait_for_next_hops};

#[test]
fn both_balancers_announce_and_carry_new_flows() {
    let fleet = support::start(2, 3, 3, &[]);
    for b in fleet.balancers() {
        support::apply(&fleet, b, &all(&fleet));
    }
    let took = wait_for_next_hops(&fleet, &[fleet.balancer(1), fleet.balancer(2)], Duration::from_secs(20));
    println!("the router has both paths {took:?} after the VIPs were configured");
    let tally = support::connect_all(&fleet, 40);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    for b in fleet.balancers() {
        let packets = support::vip_packets(b, &echo_vip());
        println!("{}: {packets} packets of {}", b.name(), echo_vip());
        assert!(packets > 0, "{} carried no flow", b.name());
        assert_eq!(support::announcement(b), "announced");
        // Both VIPs share one address: one host route.
        let (json, line) = support::status_announcements(b);
        assert_eq!((json["state"].as_str(), json["addresses"]["announced"].as_u64()), (Some("announcing"), Some(1)), "{json}");
        assert_eq!(line, "announcing: 1 announced");
    }
    // lb1's BIRD stops: its route reaches no router, and status says why.
    let lb1 = fleet.balancer(1);
    lb1.stop_bird(Signal::SIGTERM).unwrap();
    fleet
        .wait_for(Duration::from_secs(5), "lb1's status says BIRD is not answering", || {
            Ok(support::status_announcements(lb1).0["reason"].as_str().is_some_and(|r| r.starts_with("BIRD: ")))
        })
        .unwrap();
    let (json, line) = support::status_announcements(lb1);
    assert_eq!(json["state"].as_str(), Some("degraded"), "{json}");
    assert!(line.starts_with("degraded (BIRD: "), "{line}");
}

/// The routes of the VIP the router's BIRD has from `name` (its BGP session to it), with
/// whether each carries GRACEFUL_SHUTDOWN.
fn router_paths_from(fleet: &spillway_harness::fleet::Fleet, name: &str) -> Vec<bool> {
    support::router_paths(fleet).iter().filter(|r| r.protocol == name).map(|r| r.communities.contains(&(65535, 0))).collect()
}

/// A metric's value from `balancer`'s real metrics endpoint (`lbd`'s default listener).
fn metric(balancer: &Balancer, series: &str) -> Option<f64> {
    let addr: std::net::SocketAddr = "127.0.0.1:9476".parse().unwrap();
    let (_, body) = balancer.host().in_netns(|| spillway_harness::http_get(addr, "/metrics", Duration::from_secs(2))).unwrap();
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn withdrawals_follow_the_data_path_never_load_nor_lbd_and_never_pass_the_floor() {
    let fleet = support::start(2, 3, 1, &[]);
    let (lb1, lb2) = (fleet.balancer(1), fleet.balancer(2));
    for b in fleet.balancers() {
        support::apply(&fleet, b, &all(&fleet));
    }
    wait_for_next_hops(&fleet, &[lb1, lb2], Duration::from_secs(20));
    let prefix = r#"{prefix="10.100.0.1/32",state="announced"}"#;
    assert_eq!(metric(lb1, &format!("spillway_announcement_state{prefix}")), Some(1.0));
    assert_eq!(metric(lb1, "spillway_bird_up"), Some(1.0));

    // At its budget, shedding: still announced.
    lb1.lbctl(&["ratelimit", "budget", "--vip", &support::http_vip(), "--new-flows", "5", "--burst", "5"]).unwrap();
    let load = Load::start(support::client(&fleet, 0), LoadConfig::new(vip_target(HTTP_PORT), 200, Duration::from_secs(3))).unwrap();
    let report = load.wait().unwrap();
    let shed = support::reason_count(lb1, "drop_vip_budget");
    println!("lb1 shed {shed} packets at its budget; the load saw {:?}", report.totals);
    assert!(shed > 0, "lb1 did not shed");
    assert_eq!(support::announcement(lb1), "announced");
    assert_eq!(fleet.router_next_hops(VIP4).len(), 2, "a balancer at its budget must keep announcing");
    lb1.lbctl(&["ratelimit", "clear", "--vip", &support::http_vip()]).unwrap();

    // lbd killed: nothing is withdrawn, and its restart takes over without a change.
    let include = std::fs::read_to_string(lb1.include()).unwrap();
    lb1.stop_lbd(Signal::SIGKILL).unwrap();
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(3) {
        assert_eq!(fleet.router_next_hops(VIP4).len(), 2, "a path went while lbd was dead");
        std::thread::sleep(Duration::from_millis(50));
    }
    lb1.start_lbd().unwrap();
    assert!(lb1.lbd_log().contains("event=took_over"), "{}", lb1.lbd_log());
    std::thread::sleep(support::ROUND * 2);
    assert_eq!(support::announcement(lb1), "announced");
    assert_eq!(std::fs::read_to_string(lb1.include()).unwrap(), include);
    assert!(!lb1.lbd_log().contains("event=withdraw"), "{}", lb1.lbd_log());
    assert_eq!(fleet.router_next_hops(VIP4).len(), 2);

    // The program detached: degraded at once (routers prefer lb2), withdrawn after the hold
    // since lb2 announces normally.
    lb1.detach_program().unwrap();
    let took = fleet
        .wait_for(Duration::from_secs(10), "lb1's path degraded at the router", || Ok(router_paths_from(&fleet, "lb1") == [true]))
        .unwrap();
    println!("lb1's path carries GRACEFUL_SHUTDOWN {took:?} after its program was detached");
    wait_for_next_hops(&fleet, &[lb2], Duration::from_secs(5));
    let took = fleet.wait_for(Duration::from_secs(15), "lb1 withdrawn", || Ok(router_paths_from(&fleet, "lb1").is_empty())).unwrap();
    println!("lb1 withdrawn {took:?} later");
    let a = &support::vip_json(lb1, &echo_vip())["announcement"];
    assert_eq!((a["state"].as_str(), a["reason"].as_str(), a["peers"].as_u64()), (Some("withdrawn"), Some("program_detached"), Some(1)));
    let log = lb1.lbd_log();
    assert!(log.contains("event=announce_degraded prefix=10.100.0.1/32 reason=program_detached"), "{log}");
    assert!(log.contains("event=withdraw prefix=10.100.0.1/32 reason=program_detached from=degraded peers=1 floor=1"), "{log}");
    assert_eq!(metric(lb1, r#"spillway_announcement_state{prefix="10.100.0.1/32",state="withdrawn"}"#), Some(1.0));
    // The cause leads, then what it did to the announcement.
    let vips = lb1.lbctl(&["vips", "list"]).unwrap();
    assert!(vips.starts_with("ALERT: the balancer does not drive eth0 (its link was detached by something other than lbd"), "{vips}");
    assert!(vips.lines().any(|l| l.starts_with("ALERT: 10.100.0.1/32 is withdrawn (program_detached")), "{vips}");
    let (json, line) = support::status_announcements(lb1);
    assert_eq!((json["state"].as_str(), json["reason"].as_str()), (Some("withdrawn"), Some("program_detached")), "{json}");
    assert_eq!(line, "withdrawn (program_detached): 1 withdrawn");

    // lb2 detached too: no other balancer announces normally, so neither leaves: lb2 stays
    // (degraded, held by the floor) and lb1 comes back degraded; the VIP is never unrouted.
    lb2.detach_program().unwrap();
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        assert!(!fleet.router_next_hops(VIP4).is_empty(), "the VIP lost its last route");
        std::thread::sleep(Duration::from_millis(50));
    }
    let a = &support::vip_json(lb2, &echo_vip())["announcement"];
    assert_eq!((a["state"].as_str(), a["held"].as_bool(), a["peers"].as_u64()), (Some("degraded"), Some(true), Some(0)), "{a}");
    assert!(lb2.lbd_log().contains("event=withdraw_held prefix=10.100.0.1/32 reason=program_detached peers=0 floor=1"));
    assert_eq!(support::announcement(lb1), "degraded");
    let (json, line) = support::status_announcements(lb2);
    assert_eq!((json["state"].as_str(), json["reason"].as_str()), (Some("degraded"), Some("program_detached")), "{json}");
    assert_eq!(line, "degraded (program_detached): 1 degraded");
    wait_for_next_hops(&fleet, &[lb1, lb2], Duration::from_secs(5));

    // Repaired (a restarted lbd attaches again): announced normally, preferred again.
    lb1.stop_lbd(Signal::SIGTERM).unwrap();
    lb1.start_lbd().unwrap();
    wait_for_next_hops(&fleet, &[lb1], Duration::from_secs(10));
    assert_eq!(support::announcement(lb1), "announced");
    let tally = support::connect_all(&fleet, 10);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
}
