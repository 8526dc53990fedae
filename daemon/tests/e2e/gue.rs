//! GUE end to end: real TCP through real `lbd` (VIPs and backends with `encap = gue`, set
//! with `lbctl`) to agents that decapsulate GUE on their port; a switch between the two
//! tunnels breaks no connection; a backend whose agent does not take GUE fails its probes
//! through the tunnel, loses the connections sent to it in GUE, and serves again once given
//! IPIP.

use std::time::Duration;

use spillway_harness::cluster::XdpMode;
use spillway_harness::{Stream, StreamChecker, run_connections};

use crate::in_both_modes;
use crate::support::*;

fn gue_tunnels(mode: XdpMode) {
    // No slow start: a backend back in service takes its share at once.
    let mut c = start_with(mode, 3, 1, &["--health-slow-start-ms", "0"]);
    for v6 in [false, true] {
        let vip = tcp_vip(v6);
        c.lbctl(&["vips", "add", &vip, "--encap", "gue"]).unwrap();
        for b in c.topo.backends() {
            c.lbctl(&["backends", "add", "--vip", &vip, &backend_addr(b, v6)]).unwrap();
        }
        assert_eq!(vip_json(&c, &vip)["encap"], "gue");
        assert_eq!(backend_json(&c, &vip, &backend_addr(&c.topo.backends()[0], v6))["encap"], "gue");
        wait_until(Duration::from_secs(30), "every backend healthy through GUE", || all_healthy(&c, &vip));
        assert_shares(&connections(&c, tcp_target(v6), 300), &even(&["b1", "b2", "b3"]), 300);
    }

    // The agents take both tunnels: switching the VIP's breaks no connection.
    let vip = tcp_vip(false);
    let stream = c.topo.clients()[0].in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).unwrap();
    let first_backend = stream.backend().to_owned();
    let checker = StreamChecker::start(stream, Duration::from_millis(10));
    for encap in ["ipip", "gue"] {
        c.lbctl(&["vips", "encap", &vip, encap]).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    let report = checker.stop();
    assert_eq!(report.failures, 0, "the connection broke on a switch of tunnel: {:?}", report.errors);
    assert_eq!(report.backend, first_backend);
    assert!(report.pings > 10);

    // GUE is what the wire carries: b1's agent without GUE (--gue-port 0) leaves its tunnels
    // to its kernel, which has no socket on the port. Its probes through the tunnel fail
    // while its direct ones pass...
    let b1 = backend_addr(&c.topo.backends()[0], false);
    c.stop_agent(0).unwrap();
    c.restart_agent_with(0, &["--gue-port", "0"]).unwrap();
    wait_until(Duration::from_secs(30), "b1 failing through the GUE tunnel only", || {
        backend_json(&c, &vip, &b1)["reason"].as_str().is_some_and(|r| r.starts_with("vip_path_failed"))
    });
    // ... and once probed directly it is healthy again, but the connections it is given,
    // in GUE, never reach its service.
    c.lbctl(&["vips", "health", &vip, "--probe-path", "direct"]).unwrap();
    wait_until(Duration::from_secs(30), "b1 healthy when probed directly", || all_healthy(&c, &vip));
    let short = Duration::from_millis(500);
    let tally = c.topo.clients()[0].in_netns(|| run_connections(tcp_target(false), 30, Duration::ZERO, short));
    assert!(tally.failures > 0 && !tally.by_backend.contains_key("b1"), "b1 took GUE without decapsulating it: {tally:?}");
    // Its own encap, IPIP, makes it serve again; the others keep GUE.
    c.lbctl(&["backends", "options", "--vip", &vip, &b1, "--encap", "ipip"]).unwrap();
    assert_eq!(backend_json(&c, &vip, &b1)["encap"], "ipip");
    assert_eq!(backend_json(&c, &vip, &backend_addr(&c.topo.backends()[1], false))["encap"], "gue");
    assert_shares(&connections(&c, tcp_target(false), 300), &even(&["b1", "b2", "b3"]), 300);
}
in_both_modes!(gue_tunnels);
