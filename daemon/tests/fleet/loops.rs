//! Traffic to a VIP address that no VIP serves, through the router: the balancer does not
//! own VIP addresses, so its kernel routed such packets back to the router, which sent them
//! to a balancer again until their TTL ran out (one ping arrived 34 times). Each now arrives
//! once and is dropped, counted as `drop_no_service`; a ping, which the balancer answers for
//! a VIP address with a backend taking new flows, arrives once and is answered once.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use spillway_harness::{VIP4, ping};

use crate::support::{self, all, reason_count, wait_for_next_hops};

#[test]
fn what_no_vip_serves_arrives_once_and_goes_no_further() {
    let fleet = support::start(1, 1, 1, &[]);
    let lb = fleet.balancer(1);
    support::apply(&fleet, lb, &all(&fleet));
    wait_for_next_hops(&fleet, &[lb], Duration::from_secs(20));
    let client = support::client(&fleet, 0);
    // Only this count: BGP and BFD to the balancer's own address pass all the time.
    let dropped = || reason_count(lb, "drop_no_service");

    let (before, replies) = (dropped(), reason_count(lb, "tx_echo_reply"));
    let answered = client.in_netns(|| ping(VIP4.into(), Duration::from_millis(500)));
    assert!(answered.is_ok(), "the balancer answers a ping to a served VIP address");
    let after = dropped();
    println!("one ping (TTL 64) to {VIP4}: answered {} times", reason_count(lb, "tx_echo_reply") - replies);
    assert_eq!(reason_count(lb, "tx_echo_reply"), replies + 1, "a ping to a VIP address arrived other than once");
    assert_eq!(after, before, "a ping to a served VIP address was dropped");

    // A SYN to a port no VIP serves: the one SYN sent before the connect gives up.
    let unserved = SocketAddr::from((VIP4, 9));
    let refused = client.in_netns(|| TcpStream::connect_timeout(&unserved, Duration::from_millis(300)));
    assert!(refused.is_err(), "something answered {unserved}");
    let last = dropped();
    println!("one SYN to {unserved}: arrived and was dropped {} times", last - after);
    assert_eq!(last, after + 1, "a SYN to an unserved port arrived other than once");
}
