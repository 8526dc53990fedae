//! IPv6: a VIP6 announced by every balancer over IPv6 BGP sessions becomes one ECMP route
//! at the router, and losing a balancer's BGP session leaves it to the others.

use std::net::SocketAddr;
use std::time::Duration;

use spillway_harness::cluster::TCP_PORT;
use spillway_harness::fleet::{Balancer, Fleet};
use spillway_harness::{Signal, VIP6};

use crate::support;

fn vip6() -> String {
    format!("[{VIP6}]:{TCP_PORT}/tcp")
}

/// The IPv6 echo VIP with every backend (by its IPv6 address), applied to `balancer`.
fn apply6(fleet: &Fleet, balancer: &Balancer) {
    let mut toml = format!("[[vips]]\nvip = \"{}\"\n", vip6());
    for b in fleet.backends() {
        toml.push_str(&format!("\n[[vips.backends]]\naddress = \"{}\"\n", b.ipv6()));
    }
    let path = fleet.tempdir().join("fleet6.toml");
    std::fs::write(&path, toml).unwrap();
    balancer.lbctl(&["apply", "-f", &path.display().to_string()]).unwrap();
}

/// Waits until the router's route to VIP6 goes exactly through `balancers`.
fn wait_for_next_hops6(fleet: &Fleet, balancers: &[&Balancer], timeout: Duration) -> Duration {
    support::wait_for_route(fleet, VIP6, balancers.iter().map(|b| b.ipv6()).collect(), || fleet.router_next_hops6(VIP6), timeout)
}

#[test]
fn an_ipv6_vip_is_ecmp_routed_over_both_balancers_and_survives_one() {
    let fleet = support::start(2, 3, 3, &[]);
    let (lb1, lb2) = (fleet.balancer(1), fleet.balancer(2));
    for b in fleet.balancers() {
        apply6(&fleet, b);
    }
    let took = wait_for_next_hops6(&fleet, &[lb1, lb2], Duration::from_secs(20));
    println!("the router has both IPv6 paths {took:?} after the VIP was configured");
    let target = SocketAddr::new(VIP6.into(), TCP_PORT);
    let tally = support::connect_all_to(&fleet, target, 40);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    for b in fleet.balancers() {
        let packets = support::vip_packets(b, &vip6());
        println!("{}: {packets} packets of {}", b.name(), vip6());
        assert!(packets > 0, "{} carried no IPv6 flow", b.name());
        assert_eq!(support::vip_json(b, &vip6())["announcement"]["state"], "announced");
    }

    // lb1's BIRD dies: its sessions end (BFD), the router routes VIP6 via lb2 only, and
    // every new connection goes there.
    lb1.stop_bird(Signal::SIGKILL).unwrap();
    let took = wait_for_next_hops6(&fleet, &[lb2], Duration::from_secs(10));
    println!("lb1's IPv6 path left the router {took:?} after its BIRD died");
    let before = (support::vip_packets(lb1, &vip6()), support::vip_packets(lb2, &vip6()));
    let tally = support::connect_all_to(&fleet, target, 20);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    let after = (support::vip_packets(lb1, &vip6()), support::vip_packets(lb2, &vip6()));
    println!("packets of {} (lb1, lb2): {before:?} before, {after:?} after", vip6());
    assert_eq!(after.0, before.0, "lb1 is no longer routed, yet carried packets");
    assert!(after.1 > before.1, "lb2 carried none of the new connections");
}
