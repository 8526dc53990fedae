//! Traffic lost on the way out while everything else reports green: native XDP on a veth
//! whose peer runs no XDP program drops every frame the balancer sends (the data path counts
//! them as sent, probes leave through the kernel's stack and pass). `lbd` warns at start
//! that a veth needs a program on its peer, and raises an ALERT as soon as the interface
//! counts frames dropped on the way out, cleared once they stop. Native mode only.

use std::time::Duration;

use spillway_harness::cluster::XdpMode;

use crate::support::*;

fn alerts(c: &spillway_harness::cluster::Cluster) -> Vec<String> {
    let list = c.lbctl_json(&["vips", "list"]).unwrap();
    list["alerts"].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

#[test]
fn frames_dropped_on_the_way_out_raise_an_alert() {
    let c = start(XdpMode::Native, 2);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    assert!(c.lbd_log().contains("event=xdp_tx_on_veth"), "the start-up warning: {}", c.lbd_log());
    assert_eq!(connections(&c, tcp_target(false), 20).failures, 0);
    assert!(alerts(&c).iter().all(|a| !a.contains("tx_dropped")), "{:?}", alerts(&c));

    // The balancer's peer loses its XDP program: the veth drops what XDP_TX sends.
    c.topo.lb().detach_peer_xdp();
    // The kernel releases the peer's link on its own time (a loaded suite once connected 5
    // times before it had): from the first connection lost, every one is.
    wait_until(Duration::from_secs(5), "the peer's program gone", || connections(&c, tcp_target(false), 1).failures == 1);
    let lost = connections(&c, tcp_target(false), 5);
    assert_eq!(lost.failures, 5, "every connection fails: {lost:?}");
    wait_until(Duration::from_secs(6), "the ALERT", || alerts(&c).iter().any(|a| a.contains("tx_dropped")));
    let alert = alerts(&c).into_iter().find(|a| a.contains("tx_dropped")).unwrap();
    assert!(alert.starts_with("ALERT: eth0 dropped") && alert.contains("its peer runs an XDP program"), "{alert}");
    assert!(c.lbctl(&["vips", "list"]).unwrap().starts_with("ALERT"), "loud in the table too");
    assert!(c.lbd_log().contains("event=tx_drops"), "logged: {}", c.lbd_log());
    assert!(all_healthy(&c, &vip), "health checks stay green: the alert is the only signal");
}
