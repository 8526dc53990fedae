//! The data path's clock (jiffies, calibrated by the loader) reads as the coarse clock
//! userspace judges entries with: an entry stamped now is idle for about nothing, and ages
//! at the rate of the wall.

use std::time::Duration;

use spillway_common::types::{PROTO_TCP, Reason};
use spillway_dataplane::clock::coarse_now_ns;
use spillway_harness::{frames, packet_lab};

use crate::support::*;

/// An entry's idle time is counted in table ticks (`FLOW_TICK_SHIFT`, ~1 ms) of a clock
/// with a jiffy's resolution (1-10 ms): a few of either is the error allowed.
const SLACK: Duration = Duration::from_millis(25);

#[test]
fn entries_are_stamped_on_the_clock_userspace_reads() {
    with_env(|env| {
        env.add_vip(vip("10.200.1.1:80/tcp"), &[packet_lab::backend4(101).into()]);
        let (client, d) = (sock("192.168.10.20:4321"), sock("10.200.1.1:80"));
        env.expect(&frames::tcp(client, d, true, &[]), XDP_TX, Reason::Tx);
        env.expect(&frames::tcp(client, d, false, &[]), XDP_TX, Reason::Tx);
        // Times taken right after the packet and right before each reading, so a test
        // thread the scheduler delays (a loaded machine) changes nothing.
        let stamped = coarse_now_ns();
        let key = flow_key(client, d, PROTO_TCP);
        let idle_at = |env: &Env, now: u64| Duration::from_nanos(env.balancer.maps.flow(&key).expect("the flow's entry").idle_ns(now));
        let fresh = idle_at(env, stamped);
        assert!(fresh <= SLACK, "an entry stamped just now is idle for {fresh:?}");
        std::thread::sleep(Duration::from_millis(600));
        let now = coarse_now_ns();
        let (aged, elapsed) = (idle_at(env, now), Duration::from_nanos(now - stamped));
        assert!(aged.abs_diff(elapsed) <= SLACK, "{elapsed:?} after the packet the entry is idle for {aged:?}");
    });
}
