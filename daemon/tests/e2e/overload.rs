//! Overload protection with real traffic: a flooding client against a well-behaved one,
//! operator rules at runtime, the VIP budget, observe mode. Native mode only: the limits
//! live in the same program either way.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use spillway_harness::cluster::{Cluster, XdpMode};
use spillway_harness::{FloodReport, Stream, StreamChecker, TopologyConfig, flood, run_connections};

use crate::support::*;

/// New flows per second the flooder may open, and what it tries.
const LIMIT: u32 = 100;
const BURST: u32 = 20;
const FLOOD_RATE: u32 = 800;

fn cluster() -> Cluster {
    let bins = spillway_harness::cluster::Binaries::beside(env!("CARGO_BIN_EXE_lbd"));
    let config = spillway_harness::cluster::ClusterConfig {
        topology: TopologyConfig { backends: 3, clients: 2 },
        mode: XdpMode::Native,
        lbd_args: Vec::new(),
        agent_args: Vec::new(),
    };
    let c = Cluster::start(bins, config).expect("starting the cluster");
    vip_with_all_backends(&c, &tcp_vip(false), false);
    c
}

fn flooder_ip(c: &Cluster) -> IpAddr {
    c.topo.clients()[0].ipv4().into()
}

/// Floods from c1 in the background while `during` runs on this thread.
fn flooding<T: Send>(c: &Cluster, rate: u32, duration: Duration, during: impl FnOnce() -> T + Send) -> (FloodReport, T) {
    let flooder = c.topo.clients()[0].netns();
    std::thread::scope(|scope| {
        let flood = scope.spawn(|| flooder.in_netns(|| flood(tcp_target(false), rate, duration)));
        let result = during();
        (flood.join().unwrap().expect("flooding"), result)
    })
}

#[test]
fn flooder_is_held_to_its_limit_while_others_connect() {
    let c = cluster();
    let vip = tcp_vip(false);
    c.lbctl(&["ratelimit", "set", "--vip", &vip, "--per-source", &LIMIT.to_string(), "--burst", &BURST.to_string()]).unwrap();
    let flooder = flooder_ip(&c);
    let polite = &c.topo.clients()[1];
    let window = Duration::from_secs(5);
    let (report, (polite_tally, admitted)) = flooding(&c, FLOOD_RATE, window + Duration::from_secs(2), || {
        // Skip the first second (the burst), then measure at the backends over 5 s.
        std::thread::sleep(Duration::from_secs(1));
        let start = c.accepted_from(flooder);
        let t0 = Instant::now();
        let tally = polite.in_netns(|| run_connections(tcp_target(false), 100, Duration::from_millis(45), CONNECT_TIMEOUT));
        std::thread::sleep(window.saturating_sub(t0.elapsed()));
        let admitted = c.accepted_from(flooder) - start;
        (tally, admitted as f64 / t0.elapsed().as_secs_f64())
    });
    assert!(report.attempts as f64 > FLOOD_RATE as f64 * 6.0, "the flood was too weak: {report:?}");
    assert!((admitted - LIMIT as f64).abs() <= LIMIT as f64 * 0.1, "flooder admitted {admitted:.1}/s, limit {LIMIT}/s; {report:?}");
    assert!(polite_tally.failures as f64 <= polite_tally.successes() as f64 * 0.01, "polite client: {polite_tally:?}");
    assert!(reason_count(&c, "drop_source_limit") > 0);
    // top-sources names the flooder first.
    let top = c.lbctl_json(&["top-sources", "--vip", &vip]).unwrap();
    let first = top.as_array().and_then(|a| a.first()).or_else(|| top["sources"].as_array().and_then(|a| a.first())).cloned();
    let first = first.unwrap_or_else(|| panic!("top-sources is empty: {top}"));
    assert!(first.to_string().contains(&flooder.to_string()), "top source {first} is not the flooder {flooder}");
}

#[test]
fn rules_take_effect_at_runtime_without_cutting_established_flows() {
    let c = cluster();
    let flooder = flooder_ip(&c);
    let cidr = format!("{flooder}/32");
    let stream = c.topo.clients()[0].in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).unwrap();
    let checker = StreamChecker::start(stream, Duration::from_millis(20));
    let (_, (blocked_admissions, restored)) = flooding(&c, 300, Duration::from_secs(6), || {
        std::thread::sleep(Duration::from_secs(1));
        assert!(c.accepted_from(flooder) > 100, "the flood is not getting through before the rule");
        c.lbctl(&["rules", "add", &cidr, "--block"]).unwrap();
        // Within 1 s of the change, nothing new from the flooder reaches a backend.
        std::thread::sleep(Duration::from_secs(1));
        let at_block = c.accepted_from(flooder);
        std::thread::sleep(Duration::from_secs(2));
        let blocked_admissions = c.accepted_from(flooder) - at_block;
        c.lbctl(&["rules", "remove", &cidr]).unwrap();
        std::thread::sleep(Duration::from_secs(1));
        let before = c.accepted_from(flooder);
        std::thread::sleep(Duration::from_millis(500));
        (blocked_admissions, c.accepted_from(flooder) - before)
    });
    assert_eq!(blocked_admissions, 0, "new flows got through a block rule");
    assert!(restored > 50, "removing the rule did not restore the default ({restored} admitted in 0.5 s)");
    let report = checker.stop();
    assert_eq!(report.failures, 0, "the flooder's established connection was cut: {:?}", report.errors);
    let rules = c.lbctl_json(&["rules", "list"]).unwrap();
    assert!(rules.to_string().contains("[]") || !rules.to_string().contains(&cidr), "rule still listed: {rules}");
}

#[test]
fn vip_budget_sheds_exactly_the_refused_new_flows_and_spares_established_ones() {
    let c = cluster();
    let vip = tcp_vip(false);
    let streams: Vec<Stream> =
        (0..3).map(|_| c.topo.clients()[1].in_netns(|| Stream::open(tcp_target(false), CONNECT_TIMEOUT)).unwrap()).collect();
    let checkers: Vec<StreamChecker> = streams.into_iter().map(|s| StreamChecker::start(s, Duration::from_millis(20))).collect();
    c.lbctl(&["ratelimit", "budget", "--vip", &vip, "--new-flows", "50", "--burst", "10"]).unwrap();
    let shed_before = reason_count(&c, "drop_vip_budget");
    let (report, ()) = flooding(&c, 400, Duration::from_secs(3), || ());
    let shed = reason_count(&c, "drop_vip_budget") - shed_before;
    assert!(report.timed_out > 0, "nothing was shed: {report:?}");
    assert_eq!(shed, report.timed_out, "shed count differs from refused attempts: {report:?}");
    assert!((report.connected as f64 - (50.0 * 3.0 + 11.0)).abs() < 50.0 * 3.0 * 0.15, "admitted {report:?}");
    for checker in checkers {
        let r = checker.stop();
        assert_eq!(r.failures, 0, "an established connection suffered: {:?}", r.errors);
    }
}

#[test]
fn observe_mode_drops_nothing_and_counts_the_excess() {
    let c = cluster();
    let vip = tcp_vip(false);
    c.lbctl(&["ratelimit", "set", "--vip", &vip, "--per-source", &LIMIT.to_string(), "--burst", &BURST.to_string(), "--observe"]).unwrap();
    let seconds = 3.0;
    let (report, ()) = flooding(&c, 400, Duration::from_secs_f64(seconds), || ());
    assert_eq!((report.timed_out, report.refused), (0, 0), "observe mode dropped: {report:?}");
    assert_eq!(reason_count(&c, "drop_source_limit"), 0);
    let would = reason_count(&c, "would_drop_source_limit") as f64;
    let expected = report.attempts as f64 - (LIMIT as f64 * seconds + BURST as f64 + 1.0);
    assert!((would - expected).abs() <= expected * 0.1, "would-drop {would}, expected about {expected:.0}; {report:?}");
}

/// Regression (day two): a rule-limited class showed `DROPPED 0` in `top-sources` while the
/// rule had dropped 47, and `rules list` added what the rule would have dropped in observe
/// mode to what it dropped (`DROPPED 23` against `drop_rule_limit 2`). The class is observed,
/// then enforced: the rule's drops and would-drops are apart and match `lbctl stats`, and
/// the flooder's source shows its drops (a 1-in-16 sample's estimate, marked so).
#[test]
fn a_rule_limited_class_shows_its_drops_by_source_and_would_drops_apart() {
    let c = cluster();
    let vip = tcp_vip(false);
    let flooder = flooder_ip(&c);
    let cidr = format!("{flooder}/32");
    let rule = |observe: bool| {
        let mut args = vec!["rules", "add", &cidr, "--vip", &vip, "--limit", "20", "--burst", "5"];
        if observe {
            args.push("--observe");
        }
        c.lbctl(&args).unwrap();
    };
    rule(true);
    let (observed, ()) = flooding(&c, 200, Duration::from_secs(2), || ());
    assert_eq!((observed.timed_out, observed.refused), (0, 0), "observe mode dropped: {observed:?}");
    rule(false);
    let (enforced, ()) = flooding(&c, 200, Duration::from_secs(2), || ());
    assert!(enforced.timed_out > 0, "nothing was dropped: {enforced:?}");
    // Refused SYNs are retried until the flood's connect timeout: let the last ones land.
    std::thread::sleep(Duration::from_secs(1));
    let (dropped, would) = (reason_count(&c, "drop_rule_limit"), reason_count(&c, "would_drop_rule_limit"));
    assert!(would > 0, "observe mode counted nothing");
    let rules = c.lbctl_json(&["rules", "list"]).unwrap();
    let row = &rules["rules"][0];
    assert_eq!((row["dropped"].as_u64(), row["would_drop"].as_u64()), (Some(dropped), Some(would)), "{rules}");
    let table = c.lbctl(&["rules", "list"]).unwrap();
    assert!(table.lines().next().unwrap().ends_with("HITS  DROPPED  WOULD-DROP"), "{table}");
    assert!(table.lines().nth(1).unwrap().ends_with(&format!("{dropped}  {would:>10}")), "{table}");
    let top = c.lbctl_json(&["top-sources", "--vip", &vip]).unwrap();
    let first = &top["sources"][0];
    assert_eq!((first["prefix"].as_str(), first["estimated"].as_bool()), (Some(&*cidr), Some(true)), "{top}");
    // ~700 drops sampled 1 in 16 (standard deviation ~100).
    let estimate = first["dropped"].as_u64().unwrap();
    assert!(estimate.is_multiple_of(16) && estimate.abs_diff(dropped) <= dropped / 2, "top-sources {estimate}, the rule {dropped}: {top}");
    let table = c.lbctl(&["top-sources", "--vip", &vip]).unwrap();
    assert!(table.contains(&format!("~{estimate}")), "{table}");
}
