//! A backend's agent seen from the balancer: one that stops answering is shown in
//! `backends list` and raised as an ALERT (in `status` too) while its backend keeps
//! serving, and clears when it answers again; one whose reports cannot be checked (a
//! report key mismatch) leaves a stale report that says why.

use std::time::Duration;

use spillway_harness::cluster::{XdpMode, write_report_key};

use crate::support::*;

/// `lbctl status -o json`'s alerts.
fn status_alerts(c: &spillway_harness::cluster::Cluster) -> Vec<String> {
    let status = c.lbctl_json(&["status"]).unwrap();
    status["alerts"].as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

#[test]
fn a_stopped_agent_is_shown_and_alerted_and_a_mismatched_key_says_why_its_report_is_stale() {
    let mut c = start(XdpMode::Generic, 2);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let b1 = c.topo.backends()[0].ipv4().to_string();
    // No BIRD: announcements are off, and nothing is alerted.
    let status = c.lbctl_json(&["status"]).unwrap();
    assert_eq!((status["announcements"]["state"].as_str(), status["alerts"].as_array()), (Some("off"), None), "{status}");
    assert!(c.lbctl(&["status"]).unwrap().contains("\nannouncements off (no BIRD configured)\n"));
    // lbctl ports fails while there is no report.
    wait_until(Duration::from_secs(10), "b1's agent answered", || c.lbctl(&["ports", "--host", &b1]).is_ok());

    // The agent stops; decapsulation goes on through its pinned link.
    c.stop_agent(0).unwrap();
    let stopped = |c: &spillway_harness::cluster::Cluster| {
        status_alerts(c).iter().any(|a| a.starts_with(&format!("ALERT: {b1}'s agent has not answered for")))
    };
    wait_until(Duration::from_secs(10), "the stopped agent's ALERT in lbctl status", || stopped(&c));
    let entry = backend_json(&c, &vip, &b1);
    assert!(entry["agent_unreachable_s"].is_u64(), "{entry}");
    assert_eq!((entry["health"].as_str(), entry["effective_weight"].as_u64()), (Some("healthy"), Some(100)), "health unchanged: {entry}");
    let list = c.lbctl(&["backends", "list", "--vip", &vip]).unwrap();
    assert!(list.starts_with(&format!("ALERT: {b1}'s agent has not answered")), "{list}");
    let row = list.lines().find(|l| l.starts_with(&format!("{b1} "))).unwrap();
    assert!(row.contains("agent unreachable"), "{list}");
    let tally = connections(&c, tcp_target(false), 40);
    assert_eq!(tally.failures, 0, "b1 keeps serving: {:?}", tally.errors);
    assert!(tally.by_backend.get("b1").copied().unwrap_or(0) > 0, "{:?}", tally.by_backend);
    let logged = |c: &spillway_harness::cluster::Cluster, event: &str| {
        c.lbd_log().lines().filter(|l| l.contains(&format!("event={event} backend={b1}"))).count()
    };
    // Several polls later it was still logged once.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(logged(&c, "agent_unreachable"), 1, "{}", c.lbd_log());

    // Back: the ALERT clears, once logged.
    c.restart_agent(0).unwrap();
    wait_until(Duration::from_secs(10), "the ALERT cleared", || !stopped(&c));
    assert!(backend_json(&c, &vip, &b1).get("agent_unreachable_s").is_none());
    assert_eq!(logged(&c, "agent_unreachable_cleared"), 1, "{}", c.lbd_log());
    wait_until(Duration::from_secs(10), "b1's report fresh", || {
        c.lbctl_json(&["ports", "--host", &b1]).is_ok_and(|v| v["age_s"].as_u64().is_some_and(|age| age < 3))
    });

    // The agent restarted with another key: its answers are ignored, the last good report
    // is kept and says why it is stale, and status has the ALERT backends list has.
    c.stop_agent(0).unwrap();
    let key = c.topo.tempdir().join("report.key");
    std::fs::remove_file(&key).unwrap();
    write_report_key(&key).unwrap();
    c.restart_agent(0).unwrap();
    let ignored = format!("ALERT: the port report from {b1}'s agent was ignored: its signature does not hold");
    wait_until(Duration::from_secs(10), "the ignored report's ALERT in lbctl status", || {
        status_alerts(&c).iter().any(|a| a.starts_with(&ignored))
    });
    assert!(!stopped(&c), "an agent that answers is not unreachable: {:?}", status_alerts(&c));
    let ports = c.lbctl(&["ports", "--host", &b1]).unwrap();
    let stale = ports.lines().nth(1).unwrap_or_default();
    assert!(
        stale.starts_with("stale: last good report ") && stale.contains(" s ago; since then: answers ignored, its signature does not hold"),
        "{ports}"
    );
}
