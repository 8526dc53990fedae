//! Ping a VIP with iputils' `ping` from a client of the harness topology: the balancer
//! answers both families' echo requests while the VIP has a backend taking new flows, and
//! answers none once its backends are drained (a ping then says the service is down).

use spillway_harness::Host;
use spillway_harness::cluster::{Cluster, XdpMode};

use crate::support::*;

/// How long `ping` waits for each reply: a bound on a lost one, far above a reply's time.
const REPLY_WAIT_S: &str = "5";

/// Runs `ping -c count` against `target` from `client`; returns how many replies came back
/// (iputils' summary line: "N packets transmitted, M received").
fn ping(client: &Host, target: &str, count: u32) -> u32 {
    let count = count.to_string();
    let out = client.cmd("ping").args(["-n", "-c", &count, "-i", "0.2", "-W", REPLY_WAIT_S, target]).output().expect("running ping");
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = text.lines().find(|l| l.contains("packets transmitted")).unwrap_or_else(|| panic!("no summary from ping: {text}"));
    summary.split(", ").find_map(|part| part.strip_suffix(" received")?.parse().ok()).unwrap_or_else(|| panic!("summary: {summary}"))
}

fn targets() -> [(bool, String); 2] {
    [false, true].map(|v6| (v6, tcp_target(v6).ip().to_string()))
}

fn ping_a_vip(mode: XdpMode) {
    let c: Cluster = start(mode, 2);
    for (v6, _) in targets() {
        vip_with_all_backends(&c, &tcp_vip(v6), v6);
    }
    wait_until(DETECTION_BOUND * 3, "backends healthy", || targets().iter().all(|(v6, _)| all_healthy(&c, &tcp_vip(*v6))));
    let client = &c.topo.clients()[0];
    let answered = reason_count(&c, "tx_echo_reply");
    for (_, target) in targets() {
        assert_eq!(ping(client, &target, 3), 3, "every ping to {target} answered");
    }
    assert!(reason_count(&c, "tx_echo_reply") >= answered + 6, "answered by the balancer");
    assert!(c.lbctl(&["stats"]).unwrap().contains("tx_echo_reply"), "lbctl stats shows the answers");

    // Every backend drained: the service takes no new connection, and no ping is answered.
    for (v6, _) in targets() {
        for b in c.topo.backends() {
            c.lbctl(&["backends", "drain", "--force", "--vip", &tcp_vip(v6), &backend_addr(b, v6)]).unwrap();
        }
    }
    let unserved = reason_count(&c, "drop_no_service");
    for (_, target) in targets() {
        assert_eq!(ping(client, &target, 2), 0, "no answer from {target} with its backends drained");
    }
    assert!(reason_count(&c, "drop_no_service") >= unserved + 4, "the requests dropped as no service");
}

crate::in_both_modes!(ping_a_vip);
