//! Announcing: every balancer announces the VIP, the router spreads clients over all of
//! them, and withdrawals follow the data path only.

use std::time::Duration;

use crate::support::{self, all, configure, echo_vip, wait_for_next_hops};

#[test]
fn both_balancers_announce_and_carry_new_flows() {
    let fleet = support::start(2, 3, 3, &[]);
    for b in fleet.balancers() {
        configure(&fleet, b, &all(&fleet));
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
    }
}
