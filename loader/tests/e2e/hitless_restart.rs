//! SIGKILL lbd mid-traffic and start it again: no connection fails, none breaks.

use std::time::Duration;

use spillway_harness::cluster::XdpMode;
use spillway_harness::{Signal, Stream, StreamChecker, run_connections};

use crate::in_both_modes;
use crate::support::*;

/// A new connection every 20 ms for 10 s.
const CONNECTIONS: usize = 500;
const INTERVAL: Duration = Duration::from_millis(20);

fn hitless_restart(mode: XdpMode) {
    let c = start(mode, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let before = stable_view(&c, &vip);

    let stream = c.topo.clients()[0].in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).unwrap();
    let checker = StreamChecker::start(stream, Duration::from_millis(50));
    let client = c.topo.clients()[0].netns();
    let tally = std::thread::scope(|scope| {
        let traffic = scope.spawn(|| client.in_netns(|| run_connections(tcp_target(false), CONNECTIONS, INTERVAL, CONNECT_TIMEOUT)));
        std::thread::sleep(Duration::from_secs(2));
        c.stop_lbd(Signal::SIGKILL).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        c.start_lbd().expect("restarting lbd");
        traffic.join().unwrap()
    });
    let report = checker.stop();
    assert_eq!(tally.failures, 0, "connections failed across the restart: {:?}", tally.errors);
    assert_eq!(tally.successes(), CONNECTIONS);
    assert_eq!(report.failures, 0, "the long-lived connection broke: {:?}", report.errors);
    let after = stable_view(&c, &vip);
    assert_eq!(after, before, "state differs after the restart");
}
in_both_modes!(hitless_restart);
