use std::net::IpAddr;

use super::*;
use spillway_api::announce::{AnnouncementChanges, AnnouncementView, Announcements};
use spillway_api::{
    ReasonCount, RuleActionKind,
    sample::{
        BackendSample, BuildInfo, DaemonSample, FlowTableSample, HistogramSample, MapMemory, OutcomeCount, ReconcileCount, RuleSample,
        Sample, VipHealthSample, VipSample,
    },
};
use spillway_model::RateSpec;
use spillway_model::ports_report::{DestinationUsage, Dropped, Level, Mode, PortsReport, Thresholds, WatcherStatus};

fn backend(addr: &str, health: Option<&str>) -> BackendSample {
    BackendSample {
        address: addr.parse().unwrap(),
        weight: 100,
        effective_weight: 25,
        packets: 7,
        bytes: 700,
        new_flows: 3,
        health: health.map(str::to_owned),
        latency_ms: Some(12.0),
        pressure: Some("critical".to_owned()),
    }
}

fn sample() -> Sample {
    Sample {
        at_ms: 1,
        info: BuildInfo { version: "0.1.0".into(), program_tag: "00112233aabbccdd".into(), xdp_mode: "native".into() },
        vips: vec![VipSample {
            vip: "10.100.0.1:80/tcp".parse().unwrap(),
            packets: 10,
            bytes: 1000,
            new_flows: 4,
            flow_entries: Some(2),
            health: Some(VipHealthSample { panic: true, panics_entered: 2, healthy_weight: 100, total_weight: 400 }),
            budget: Some(RateSpec::new(500, Some(50))),
            spill_per_s: 0,
            backends: vec![backend("10.0.0.101", Some("slow_start")), backend("10.0.0.102", None)],
        }],
        reasons: vec![
            ReasonCount { reason: "tx".into(), packets: 9 },
            ReasonCount { reason: "pass_not_vip".into(), packets: 5 },
            ReasonCount { reason: "drop_rule_block".into(), packets: 1 },
            ReasonCount { reason: "drop_vip_budget".into(), packets: 0 },
            ReasonCount { reason: "tx_packet_too_big".into(), packets: 2 },
        ],
        observed: vec![ReasonCount { reason: "would_drop_vip_budget".into(), packets: 6 }],
        rules: vec![RuleSample {
            cidr: "192.0.2.0/24".parse().unwrap(),
            vip: None,
            action: RuleActionKind::Block,
            observe: false,
            hits: 5,
            dropped: 3,
            would_drop: 2,
        }],
        flow_table: FlowTableSample { capacity: 1 << 20, entries: Some(2), counted_s_ago: Some(1), unremembered: 9 },
        maps: vec![MapMemory { map: "spw_flows".into(), bytes: 123_456 }],
        daemon: DaemonSample {
            reconciles: vec![ReconcileCount { op: "add_vip".into(), outcome: "ok".into(), count: 1 }],
            reconcile_seconds: HistogramSample { buckets: vec![(0.001, 1), (0.01, 1)], sum: 0.0004, count: 2 },
            probes: vec![OutcomeCount { outcome: "success".into(), count: 5 }],
            local_probe_alert: false,
            agent_polls: vec![OutcomeCount { outcome: "error".into(), count: 2 }],
        },
        second_chance_packets: 5,
        pass_to_missing: 7,
        quic: vec![ReasonCount { reason: "quic_fallback".into(), packets: 4 }],
        announcements: Some(Announcements {
            routes: vec![AnnouncementView {
                address: "10.100.0.1".parse().unwrap(),
                state: "degraded".into(),
                reason: "program_detached".into(),
                for_s: 3,
                peers: Some(2),
                floor: 1,
                held: false,
            }],
            bird_error: None,
            changes: vec![AnnouncementChanges { address: "10.100.0.1".parse().unwrap(), state: "degraded".into(), count: 1 }],
        }),
        interfaces: ["up", "gone"]
            .iter()
            .zip(["eth0", "eth1"])
            .map(|(state, name)| spillway_api::InterfaceStatus {
                name: name.into(),
                xdp_mode: "native".into(),
                attachment: "attached".into(),
                state: (*state).into(),
                forwarding_off: None,
                error: None,
            })
            .collect(),
    }
}

fn report() -> PortsReport {
    let destination = |remote: &str, in_use, utilisation| DestinationUsage {
        netns: 4026531840,
        protocol: "tcp".into(),
        local: "10.0.0.101".parse().unwrap(),
        remote: remote.parse::<IpAddr>().unwrap(),
        remote_port: 5432,
        active: in_use,
        time_wait: 0,
        in_use,
        failures: 4,
        opened: 100,
        port_range: None,
        usable_ports: Some(100),
        utilisation: Some(utilisation),
        level: if utilisation >= 0.9 { Level::Critical } else { Level::Ok },
    };
    let mut destinations = vec![destination("10.9.0.1", 95, 0.95)];
    destinations.extend((0..20).map(|i| destination(&format!("10.9.1.{i}"), 1, 0.01)));
    PortsReport {
        thresholds: Thresholds::default(),
        destinations,
        failures: Vec::new(),
        dropped: Dropped::default(),
        leak_suspects: Vec::new(),
        watcher: Some(WatcherStatus { mode: Mode::Tracepoint, watching: Vec::new(), not_watched: Vec::new(), refused: Vec::new() }),
    }
}

/// The value of the one sample line starting with `series ` (name and labels as written).
fn value(text: &str, series: &str) -> f64 {
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(&format!("{series} "))).collect();
    assert_eq!(lines.len(), 1, "{series} in:\n{text}");
    lines[0].rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn balancer_families_follow_the_conventions() {
    let text = balancer(&sample(), Err("no watcher")).openmetrics;
    assert!(text.ends_with("# EOF\n"), "{text}");
    let vip = r#"vip="10.100.0.1:80/tcp""#;
    let b1 = format!(r#"{vip},backend="10.0.0.101""#);
    assert_eq!(value(&text, &format!("spillway_vip_packets_total{{{vip}}}")), 10.0);
    assert_eq!(value(&text, r#"spillway_interface_state{interface="eth0",state="up"}"#), 1.0);
    assert_eq!(value(&text, r#"spillway_interface_state{interface="eth1",state="up"}"#), 0.0);
    assert_eq!(value(&text, r#"spillway_interface_state{interface="eth1",state="gone"}"#), 1.0);
    assert_eq!(value(&text, &format!("spillway_vip_bytes_total{{{vip}}}")), 1000.0);
    assert_eq!(value(&text, &format!("spillway_vip_new_flows_total{{{vip}}}")), 4.0);
    assert_eq!(value(&text, &format!("spillway_backend_new_flows_total{{{b1}}}")), 3.0);
    assert_eq!(value(&text, &format!("spillway_backend_bytes_total{{{b1}}}")), 700.0);
    assert_eq!(value(&text, &format!("spillway_backend_effective_weight{{{b1}}}")), 25.0);
    assert_eq!(value(&text, &format!(r#"spillway_backend_health_state{{{b1},state="slow_start"}}"#)), 1.0);
    assert_eq!(value(&text, &format!(r#"spillway_backend_health_state{{{b1},state="healthy"}}"#)), 0.0);
    assert!(!text.contains(r#"backend="10.0.0.102",state="#), "an unprobed backend has no health series");
    assert_eq!(value(&text, &format!(r#"spillway_backend_port_pressure{{{b1},level="critical"}}"#)), 1.0);
    assert_eq!(value(&text, &format!("spillway_backend_probe_latency_seconds{{{b1}}}")), 0.012);
    assert_eq!(value(&text, &format!("spillway_vip_healthy_weight_ratio{{{vip}}}")), 0.25);
    assert_eq!(value(&text, &format!("spillway_vip_panic{{{vip}}}")), 1.0);
    assert_eq!(value(&text, &format!("spillway_vip_panics_total{{{vip}}}")), 2.0);
    assert_eq!(value(&text, &format!("spillway_vip_budget_new_flows_per_second{{{vip}}}")), 500.0);
    assert_eq!(value(&text, r#"spillway_packets_total{reason="drop_rule_block",action="drop"}"#), 1.0);
    assert_eq!(value(&text, r#"spillway_packets_total{reason="pass_not_vip",action="pass"}"#), 5.0);
    assert_eq!(value(&text, r#"spillway_packets_total{reason="tx",action="tx"}"#), 9.0);
    // An answer to the client leaves with XDP_TX too.
    assert_eq!(value(&text, r#"spillway_packets_total{reason="tx_packet_too_big",action="tx"}"#), 2.0);
    assert_eq!(value(&text, r#"spillway_observed_would_drop_total{reason="drop_vip_budget"}"#), 6.0);
    assert_eq!(value(&text, r#"spillway_rule_drops_total{cidr="192.0.2.0/24",vip="*",action="block",observe="false"}"#), 3.0);
    assert_eq!(value(&text, r#"spillway_rule_observed_drops_total{cidr="192.0.2.0/24",vip="*",action="block",observe="false"}"#), 2.0);
    assert_eq!(value(&text, "spillway_flow_table_entries"), 2.0);
    assert_eq!(value(&text, r#"spillway_map_memory_bytes{map="spw_flows"}"#), 123_456.0);
    assert_eq!(value(&text, r#"spillway_reconcile_operations_total{op="add_vip",outcome="ok"}"#), 1.0);
    assert_eq!(value(&text, r#"spillway_reconcile_duration_seconds_bucket{le="0.001"}"#), 1.0);
    assert_eq!(value(&text, r#"spillway_reconcile_duration_seconds_bucket{le="+Inf"}"#), 2.0);
    assert_eq!(value(&text, "spillway_reconcile_duration_seconds_count"), 2.0);
    assert_eq!(value(&text, r#"spillway_probes_total{outcome="success"}"#), 5.0);
    assert_eq!(value(&text, r#"spillway_agent_polls_total{outcome="error"}"#), 2.0);
    assert_eq!(value(&text, r#"spillway_build_info{version="0.1.0",program_tag="00112233aabbccdd",xdp_mode="native"}"#), 1.0);
    assert_eq!(value(&text, "spillway_ports_watcher_up"), 0.0);
    let prefix = r#"prefix="10.100.0.1/32""#;
    assert_eq!(value(&text, &format!(r#"spillway_announcement_state{{{prefix},state="degraded"}}"#)), 1.0);
    assert_eq!(value(&text, &format!(r#"spillway_announcement_state{{{prefix},state="announced"}}"#)), 0.0);
    assert_eq!(value(&text, &format!("spillway_announcement_peers{{{prefix}}}")), 2.0);
    assert_eq!(value(&text, &format!("spillway_announcement_held{{{prefix}}}")), 0.0);
    assert_eq!(value(&text, &format!(r#"spillway_announcement_changes_total{{{prefix},state="degraded"}}"#)), 1.0);
    assert_eq!(value(&text, "spillway_bird_up"), 1.0);
    assert_eq!(value(&text, "spillway_second_chance_packets_total"), 5.0);
    assert_eq!(value(&text, "spillway_pass_to_missing_total"), 7.0);
    assert_eq!(value(&text, r#"spillway_quic_short_headers_total{placed="fallback"}"#), 4.0);
    assert_eq!(value(&text, "spillway_flow_table_full_total"), 9.0);
    assert!(text.contains("# TYPE spillway_vip_packets counter\n") && text.contains("# UNIT spillway_vip_bytes bytes\n"), "{text}");
}

#[test]
fn ports_keep_only_the_worst_destinations() {
    let text = ports(Ok(&report())).openmetrics;
    assert_eq!(value(&text, "spillway_ports_watcher_up"), 1.0);
    assert_eq!(value(&text, r#"spillway_ports_watcher_mode{mode="tracepoint"}"#), 1.0);
    assert_eq!(value(&text, r#"spillway_ports_level{level="critical"}"#), 1.0);
    assert_eq!(value(&text, r#"spillway_ports_level{level="ok"}"#), 0.0);
    assert_eq!(value(&text, "spillway_ports_max_utilisation_ratio"), 0.95);
    assert_eq!(value(&text, r#"spillway_ports_in_use{protocol="tcp"}"#), 115.0);
    assert_eq!(value(&text, r#"spillway_ports_failures_total{protocol="tcp"}"#), 84.0);
    let per_destination = text.lines().filter(|l| l.starts_with("spillway_ports_destination_in_use{")).count();
    assert_eq!(per_destination, ports::WORST_DESTINATIONS);
    assert!(text.contains(r#"remote="10.9.0.1",remote_port="5432"} 95"#), "{text}");
}

/// `promtool check metrics` (Debian's prometheus package) accepts what is served.
#[test]
fn promtool_accepts_the_output() {
    for exposition in [balancer(&sample(), Ok(&report())), ports(Ok(&report())), ports(Err("not loaded"))] {
        let text = exposition.text;
        let problems = spillway_harness::promql::promtool_check(&text);
        assert!(problems.is_empty(), "promtool check metrics: {problems}\n{text}");
    }
}

/// What the dashboard reads: a balancer's and an agent's endpoints.
fn served() -> Vec<spillway_harness::promql::Series> {
    let decap: Vec<_> = spillway_common::types::DecapReason::ALL.iter().map(|r| (r.label(), 1)).collect();
    let mut served = spillway_harness::promql::series(&balancer(&sample(), Ok(&report())).text);
    served.extend(spillway_harness::promql::series(&agent(Ok(&report()), &decap, 0).text));
    served
}

/// Every metric, label and exact label value the dashboard's queries use is served (the
/// e2e test checks the same against a real `lbd`).
#[test]
fn the_dashboard_queries_what_is_served() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let served = served();
    let queries = spillway_harness::promql::dashboard_queries(&dashboard);
    assert!(queries.len() >= 20, "{queries:?}");
    for (panel, expr) in queries {
        let missing = spillway_harness::promql::missing(&expr, "spillway_", &served);
        assert!(missing.is_empty(), "panel {panel:?}: {expr}: {missing:?}");
    }
}

/// Each panel's unit is that of what its queries compute, each selector narrowed to the
/// `$instance`s chosen, and each series has a legend of its own (a fleet's lines apart).
#[test]
fn the_dashboard_reads_for_a_fleet() {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let problems = spillway_harness::dashboard::problems(&dashboard, &served());
    assert!(problems.is_empty(), "{problems:#?}");
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let instance = variables.iter().find(|v| v["name"] == "instance").expect("an instance variable");
    assert!(instance["multi"] == true && instance["includeAll"] == true, "{instance}");
}

pub const DASHBOARD: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/spillway.json"));
