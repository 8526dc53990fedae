//! Distribution, adding, draining and removing backends, for IPv4 and IPv6 VIPs.

use std::collections::BTreeMap;
use std::time::Duration;

use spillway_harness::cluster::{UDP_PORT, XdpMode};
use spillway_harness::{Stream, StreamChecker, VIP4, udp_ask};

use crate::in_both_modes;
use crate::support::*;

fn distribution(mode: XdpMode) {
    let c = start(mode, 3);
    vip_with_all_backends(&c, &tcp_vip(false), false);
    assert_shares(&connections(&c, tcp_target(false), 300), &even(&["b1", "b2", "b3"]), 300);

    vip_with_all_backends(&c, &udp_vip(), false);
    let target = std::net::SocketAddr::new(VIP4.into(), UDP_PORT);
    let mut names = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let name = c.topo.clients()[0].in_netns(|| udp_ask(target, CONNECT_TIMEOUT)).expect("UDP request/response");
        names.insert(name);
    }
    assert!(names.len() >= 2, "UDP flows all went to {names:?}");
}
in_both_modes!(distribution);

fn adding_a_backend(mode: XdpMode) {
    added_backend_takes_a_quarter(mode, false);
}
in_both_modes!(adding_a_backend);

fn ipv6_adding_a_backend(mode: XdpMode) {
    added_backend_takes_a_quarter(mode, true);
}
in_both_modes!(ipv6_adding_a_backend);

fn added_backend_takes_a_quarter(mode: XdpMode, v6: bool) {
    let mut c = start(mode, 3);
    let vip = tcp_vip(v6);
    vip_with_all_backends(&c, &vip, v6);
    assert_shares(&connections(&c, tcp_target(v6), 300), &even(&["b1", "b2", "b3"]), 300);
    let stream = c.topo.clients()[0].in_netns(|| Stream::open(tcp_target(v6), CONNECT_TIMEOUT)).unwrap();
    let first_backend = stream.backend().to_owned();
    let checker = StreamChecker::start(stream, Duration::from_millis(10));

    let b4 = backend_addr(c.add_backend_host().unwrap(), v6);
    c.lbctl(&["backends", "add", "--vip", &vip, &b4]).unwrap();
    assert_shares(&connections(&c, tcp_target(v6), 400), &even(&["b1", "b2", "b3", "b4"]), 400);

    let report = checker.stop();
    assert_eq!(report.failures, 0, "long-lived connection broke: {:?}", report.errors);
    assert_eq!(report.backend, first_backend, "long-lived connection moved");
    assert!(report.pings > 10);
}

fn removing_and_draining(mode: XdpMode) {
    let c = start(mode, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    // Long-lived connections until every backend holds at least two.
    let mut streams: BTreeMap<String, Vec<Stream>> = BTreeMap::new();
    for _ in 0..60 {
        let s = c.topo.clients()[0].in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).unwrap();
        streams.entry(s.backend().to_owned()).or_default().push(s);
        if streams.len() == 3 && streams.values().all(|v| v.len() >= 2) {
            break;
        }
    }
    assert_eq!(streams.len(), 3, "could not open flows to every backend");
    let [b1, b2, _] = [0, 1, 2].map(|i| backend_addr(&c.topo.backends()[i], false));

    c.lbctl(&["backends", "drain", "--vip", &vip, &b1]).unwrap();
    let tally = connections(&c, tcp_target(false), 150);
    assert_eq!(tally.by_backend.get("b1"), None, "new flows reached the draining b1: {:?}", tally.by_backend);
    assert_eq!(tally.failures, 0);
    for s in streams.values_mut().flatten() {
        s.ping().unwrap_or_else(|e| panic!("flow on {} broke after draining b1: {e:#}", s.backend()));
    }

    c.lbctl(&["backends", "remove", "--vip", &vip, &b2]).unwrap();
    for (backend, list) in &mut streams {
        if backend != "b2" {
            for s in list {
                s.ping().unwrap_or_else(|e| panic!("flow on {backend} broke when b2 was removed: {e:#}"));
            }
        }
    }
    let tally = connections(&c, tcp_target(false), 100);
    assert_eq!(tally.by_backend.keys().collect::<Vec<_>>(), ["b3"], "only b3 takes new flows");
}
in_both_modes!(removing_and_draining);
