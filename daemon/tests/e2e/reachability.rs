//! With XDP attached and VIPs configured, the balancer host itself stays reachable.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use spillway_harness::cluster::{TCP_PORT, XdpMode};
use spillway_harness::{LB4, LB6, echo_binary, ping, tcp_ask};

use crate::in_both_modes;
use crate::support::*;

fn host_stays_reachable(mode: XdpMode) {
    let c = start(mode, 3);
    vip_with_all_backends(&c, &tcp_vip(false), false);
    vip_with_all_backends(&c, &tcp_vip(true), true);
    // The balancer host's own service (TCP only: it holds no VIP to answer UDP from).
    let lb = c.topo.lb();
    let bin = echo_binary().unwrap();
    let server = lb
        .spawn(&[
            bin.as_os_str(),
            "--name".as_ref(),
            "lb".as_ref(),
            "--tcp".as_ref(),
            "0.0.0.0:80".as_ref(),
            "--tcp".as_ref(),
            "[::]:80".as_ref(),
        ])
        .unwrap();
    server.wait_for_output("ready", Duration::from_secs(10)).unwrap();
    let client = &c.topo.clients()[0];
    for addr in [IpAddr::V4(LB4), IpAddr::V6(LB6)] {
        client.in_netns(|| ping(addr, Duration::from_secs(2))).unwrap_or_else(|e| panic!("ping {addr}: {e:#}"));
        let name = client.in_netns(|| tcp_ask(SocketAddr::new(addr, TCP_PORT), CONNECT_TIMEOUT)).unwrap();
        assert_eq!(name, "lb");
    }
    // And the VIP still works next to it.
    assert_eq!(connections(&c, tcp_target(false), 20).failures, 0);
}
in_both_modes!(host_stays_reachable);
