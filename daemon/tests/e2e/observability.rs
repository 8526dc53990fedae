//! What operators look at, against the real `lbd`, agents and XDP program: the metrics
//! endpoint (promtool, and traffic, a drop reason, a health change and a rule hit read back
//! with their labels and values), the dashboard's queries against it, `lbctl top`, and
//! `lbctl flows` against real connections. Native mode only: none of it depends on the mode.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, TcpStream};
use std::time::Duration;

use spillway_harness::cluster::{Cluster, XdpMode};
use spillway_harness::promql::{self, Series};
use spillway_harness::{Stream, run_connections};

use crate::support::*;

const METRICS: &str = "127.0.0.1:9476";
const AGENT_METRICS: &str = "127.0.0.1:9478";

fn promtool(text: &str) {
    let problems = promql::promtool_check(text);
    assert!(problems.is_empty(), "promtool check metrics: {problems}\n{text}");
}

fn backend_ip(c: &Cluster, name: &str) -> String {
    c.topo.backends().iter().find(|b| b.name() == name).map(|b| b.ipv4().to_string()).unwrap_or_else(|| panic!("no backend {name}"))
}

#[test]
fn metrics_show_traffic_drops_health_and_rules() {
    let c = start_with(XdpMode::Native, 3, 1, &["--metrics-listen", METRICS]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    c.lbctl(&["ratelimit", "budget", "--vip", &vip, "--new-flows", "10000"]).unwrap();
    wait_until(Duration::from_secs(15), "all healthy", || all_healthy(&c, &vip));
    let lb = c.topo.lb();

    // Traffic: every connection is one new flow on the backend that answered it.
    let tally = connections(&c, tcp_target(false), 60);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    std::thread::sleep(Duration::from_millis(1100));
    let text = scrape(lb, METRICS);
    promtool(&text);
    let vip_flows = value(&text, "spillway_vip_new_flows_total", &[("vip", &vip)]).unwrap();
    // A retransmitted SYN is placed afresh and counts again: never fewer, rarely more.
    assert!((60.0..=63.0).contains(&vip_flows), "new flows {vip_flows}");
    let mut placed = 0.0;
    for (name, served) in &tally.by_backend {
        let ip = backend_ip(&c, name);
        let flows = value(&text, "spillway_backend_new_flows_total", &[("vip", &vip), ("backend", &ip)]).unwrap();
        assert!(flows >= *served as f64, "{name}: {flows} new flows, served {served}");
        placed += flows;
        assert!(value(&text, "spillway_backend_packets_total", &[("vip", &vip), ("backend", &ip)]).unwrap() >= 3.0 * *served as f64);
        let healthy = value(&text, "spillway_backend_health_state", &[("vip", &vip), ("backend", &ip), ("state", "healthy")]);
        assert_eq!(healthy, Some(1.0));
    }
    assert_eq!(placed, vip_flows, "the VIP's new flows are its backends'");
    assert!(value(&text, "spillway_packets_total", &[("reason", "tx"), ("action", "tx")]).unwrap() >= 180.0);
    assert_eq!(value(&text, "spillway_vip_budget_new_flows_per_second", &[("vip", &vip)]), Some(10000.0));
    assert!(value(&text, "spillway_flow_table_entries", &[]).unwrap() >= 1.0);
    assert_eq!(
        value(&text, "spillway_flow_table_max_entries", &[]),
        Some(f64::from(spillway_common::limits::Capacity::DEFAULT.flows)),
        "the flows lbd was sized for, as the operator set them"
    );
    assert!(value(&text, "spillway_map_memory_bytes", &[("map", "spw_flows")]).unwrap() > 1e6);
    assert!(value(&text, "spillway_probes_total", &[("outcome", "success")]).unwrap() >= 3.0);
    assert!(value(&text, "spillway_reconcile_operations_total", &[("op", "add_backend"), ("outcome", "ok")]).unwrap() >= 3.0);
    assert!(value(&text, "spillway_reconcile_duration_seconds_count", &[]).unwrap() >= 5.0);
    assert!(text.contains("spillway_build_info{") && text.contains(r#"xdp_mode="native""#), "{text}");

    // A rule hit and a drop reason: the client's address blocked.
    let client = c.topo.clients()[0].ipv4().to_string();
    c.lbctl(&["rules", "add", &client, "--block"]).unwrap();
    let blocked = c.topo.clients()[0].in_netns(|| run_connections(tcp_target(false), 3, Duration::ZERO, Duration::from_millis(300)));
    assert_eq!(blocked.successes(), 0);
    std::thread::sleep(Duration::from_millis(1100));
    let text = scrape(lb, METRICS);
    let rule = [("cidr", &*format!("{client}/32")), ("vip", "*"), ("action", "block"), ("observe", "false")];
    let hits = value(&text, "spillway_rule_hits_total", &rule).unwrap();
    assert!(hits >= 3.0, "{hits}");
    assert_eq!(value(&text, "spillway_rule_drops_total", &rule), Some(hits));
    assert_eq!(value(&text, "spillway_packets_total", &[("reason", "drop_rule_block"), ("action", "drop")]), Some(hits));

    // A health change: b1's service dies; it goes unhealthy and out of the table.
    c.stop_echo(0).unwrap();
    let b1 = c.topo.backends()[0].ipv4().to_string();
    wait_until(Duration::from_secs(15), "b1 unhealthy in the metrics", || {
        let text = scrape(lb, METRICS);
        value(&text, "spillway_backend_health_state", &[("vip", &vip), ("backend", &b1), ("state", "unhealthy")]) == Some(1.0)
            && value(&text, "spillway_backend_effective_weight", &[("vip", &vip), ("backend", &b1)]) == Some(0.0)
    });
    let text = scrape(lb, METRICS);
    assert_eq!(value(&text, "spillway_backend_health_state", &[("vip", &vip), ("backend", &b1), ("state", "healthy")]), Some(0.0));
    assert_eq!(value(&text, "spillway_backend_weight", &[("vip", &vip), ("backend", &b1)]), Some(100.0));
    assert!(value(&text, "spillway_probes_total", &[("outcome", "failure")]).unwrap() >= 2.0);
    let ratio = value(&text, "spillway_vip_healthy_weight_ratio", &[("vip", &vip)]).unwrap();
    assert!((ratio - 2.0 / 3.0).abs() < 1e-6, "{ratio}");
    assert_eq!(value(&text, "spillway_vip_panic", &[("vip", &vip)]), Some(0.0));
    promtool(&text);

    // OpenMetrics for a scraper that asks for it (Prometheus does).
    let openmetrics = lb.in_netns(|| {
        let mut conn = TcpStream::connect(METRICS).unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n").unwrap();
        let mut answer = String::new();
        conn.read_to_string(&mut answer).unwrap();
        answer
    });
    assert!(openmetrics.contains("Content-Type: application/openmetrics-text") && openmetrics.ends_with("# EOF\n"), "{openmetrics}");

    // The agent's endpoint, on its own listener in the backend's namespace.
    let agent = scrape(&c.topo.backends()[1], AGENT_METRICS);
    promtool(&agent);
    assert!(value(&agent, "spillway_ports_watcher_up", &[]).is_some(), "{agent}");

    // The dashboard's queries against what the balancer and an agent serve. Without a
    // socket watcher (its hooks did not load here) the port families are only watcher_up.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/spillway.json")).unwrap())
            .unwrap();
    let mut served: Vec<Series> = promql::series(&text);
    served.extend(promql::series(&agent));
    // Nor are there announcement families: this lbd announces nothing (no BIRD).
    let watcher = value(&agent, "spillway_ports_watcher_up", &[]) == Some(1.0);
    let announces = value(&text, "spillway_bird_up", &[]).is_some();
    for (panel, expr) in promql::dashboard_queries(&dashboard) {
        let unserved = (expr.contains("spillway_ports_") && !watcher)
            || ((expr.contains("spillway_announcement_") || expr.contains("spillway_bird_up")) && !announces);
        if unserved {
            continue;
        }
        let missing = promql::missing(&expr, "spillway_", &served);
        assert!(missing.is_empty(), "panel {panel:?}: {expr}: {missing:?}");
    }
    let problems = spillway_harness::dashboard::problems(&dashboard, &served);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn flows_answer_with_the_backend_that_served_the_connection() {
    let c = start(XdpMode::Native, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(15), "all healthy", || all_healthy(&c, &vip));
    let client = &c.topo.clients()[0];
    let streams: Vec<Stream> =
        (0..12).map(|_| client.in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).expect("opening a connection")).collect();
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    for stream in &streams {
        let from = stream.local_addr().unwrap().to_string();
        let answer = c.lbctl_json(&["flows", "get", "--vip", &vip, &from]).unwrap();
        let backend = backend_ip(&c, stream.backend());
        assert_eq!(answer["entry"]["backend"], backend.as_str(), "{answer}");
        assert_eq!(answer["entry"]["in_force"], true, "{answer}");
        assert_eq!(answer["goes_to"], backend.as_str(), "{answer}");
        // Nothing changed since the SYN: Maglev still picks the backend it picked then.
        assert_eq!(answer["maglev"], backend.as_str(), "{answer}");
        assert_eq!(answer["admission"]["admitted"], true, "{answer}");
        *served.entry(backend).or_default() += 1;
    }
    let text = c.lbctl(&["flows", "get", "--vip", &vip, &streams[0].local_addr().unwrap().to_string()]).unwrap();
    assert!(text.contains("entry:") && text.contains("followed") && text.contains("new flow:  admitted"), "{text}");

    // A tuple never seen: no entry, the Maglev choice, and a block rule refusing it.
    let unseen = format!("{}:1", client.ipv4());
    let [a, b, n, _] = client.ipv4().octets();
    let class = format!("{a}.{b}.{n}.0/24");
    c.lbctl(&["rules", "add", &class, "--vip", &vip, "--block"]).unwrap();
    let answer = c.lbctl_json(&["flows", "get", "--vip", &vip, &unseen]).unwrap();
    assert!(answer.get("entry").is_none() && answer["maglev"].is_string() && answer.get("goes_to").is_none(), "{answer}");
    assert_eq!(answer["admission"]["refused_by"], "drop_rule_block", "{answer}");
    // Established connections are never refused: they still go to their backend.
    let known = c.lbctl_json(&["flows", "get", "--vip", &vip, &streams[0].local_addr().unwrap().to_string()]).unwrap();
    assert_eq!(known["goes_to"], known["entry"]["backend"], "{known}");
    assert_eq!(answer["admission"]["rule"], format!("{class} on VIP {vip}").as_str(), "{answer}");
    c.lbctl(&["rules", "remove", &class, "--vip", &vip]).unwrap();

    // The list holds the open connections (and the probes' nothing: they do not cross the VIP).
    let (busiest, count) = served.iter().max_by_key(|(_, n)| **n).map(|(b, n)| (b.clone(), *n)).unwrap();
    let list = c.lbctl_json(&["flows", "list", "--vip", &vip, "--backend", &busiest, "--limit", "1000"]).unwrap();
    let listed: Vec<&str> = list["entries"].as_array().unwrap().iter().map(|e| e["client"].as_str().unwrap()).collect();
    for stream in streams.iter().filter(|s| backend_ip(&c, s.backend()) == busiest) {
        let from = stream.local_addr().unwrap().to_string();
        assert!(listed.contains(&from.as_str()), "{from} not listed: {list}");
    }
    assert!(listed.len() >= count && list["truncated"] == false, "{list}");
    let one = c.lbctl_json(&["flows", "list", "--vip", &vip, "--limit", "1"]).unwrap();
    assert_eq!((one["entries"].as_array().unwrap().len(), &one["truncated"]), (1, &serde_json::Value::Bool(true)), "{one}");

    // Purge: refused while the backend serves, then its entries go once it is drained.
    let refused = c.lbctl_output(&["flows", "purge", "--backend", &busiest]).unwrap();
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("drain it first"), "{refused:?}");
    c.lbctl(&["backends", "drain", "--vip", &vip, &busiest]).unwrap();
    let purged = c.lbctl(&["flows", "purge", "--backend", &busiest]).unwrap();
    let removed: usize = purged.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(removed >= count, "{purged}");
    let after = c.lbctl_json(&["flows", "list", "--vip", &vip, "--backend", &busiest]).unwrap();
    assert!(after["entries"].as_array().unwrap().is_empty(), "{after}");
    let from = streams.iter().find(|s| backend_ip(&c, s.backend()) == busiest).unwrap().local_addr().unwrap().to_string();
    let moved = c.lbctl_json(&["flows", "get", "--vip", &vip, &from]).unwrap();
    assert!(moved.get("entry").is_none() && moved["goes_to"] != busiest.as_str(), "{moved}");
}

#[test]
fn top_prints_rates_as_json_and_piped_snapshots() {
    let c = start(XdpMode::Native, 2);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(15), "all healthy", || all_healthy(&c, &vip));
    // Traffic during the sample: 10 connections a second for ~3 s.
    let client = c.topo.clients()[0].netns();
    let (tally, json) = std::thread::scope(|scope| {
        let traffic =
            scope.spawn(|| client.in_netns(|| run_connections(tcp_target(false), 30, Duration::from_millis(100), CONNECT_TIMEOUT)));
        std::thread::sleep(Duration::from_millis(500));
        let json = c.lbctl(&["top", "--once", "--interval", "2", "-o", "json"]).unwrap();
        (traffic.join().unwrap(), json)
    });
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    let view: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    let v = view["vips"].as_array().unwrap().iter().find(|v| v["vip"] == vip.as_str()).unwrap();
    let rate = v["new_flows_per_s"].as_f64().unwrap();
    // 10 a second were opened, one at a time (each takes a little longer than its pause).
    assert!((4.0..=12.0).contains(&rate), "{view}");
    let shares: f64 = v["backends"].as_array().unwrap().iter().map(|b| b["share"].as_f64().unwrap()).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{view}");
    assert!(v["backends"].as_array().unwrap().iter().all(|b| b["health"] == "healthy" && b["effective_weight"] == 100), "{view}");
    assert!(view["drops_per_s"].as_array().unwrap().iter().any(|r| r["reason"] == "drop_no_backend"), "{view}");

    // Piped: one snapshot per interval, one after the other (no terminal redraws).
    let started = std::time::Instant::now();
    let piped = c.lbctl(&["top", "--count", "2", "--interval", "0.5"]).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1000), "two intervals");
    assert!(!piped.contains('\x1b'), "no escape codes when piped: {piped:?}");
    assert_eq!(piped.matches("NEW FLOWS/S").count(), 2 * 2, "a VIP and a backend table per snapshot: {piped}");
    assert_eq!(piped.matches(&*vip).count(), 4, "{piped}");
    let ip: IpAddr = c.topo.backends()[0].ipv4().into();
    assert!(piped.contains(&ip.to_string()) && piped.contains("drops/s:"), "{piped}");
}
