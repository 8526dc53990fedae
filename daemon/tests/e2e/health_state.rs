//! Health state that outlives a moment: slowness measured by real probes, a restart of
//! `lbd` that keeps what it knew, and a drain deadline. Native mode only.

use std::time::{Duration, Instant};

use spillway_harness::cluster::XdpMode;
use spillway_harness::{Signal, VIP4, start_capacity_servers};

use crate::support::*;

const HTTP_PORT: u16 = 8080;

#[test]
fn a_slow_backend_is_turned_down_gradually_never_ejected_and_recovers() {
    let c = start(XdpMode::Native, 3);
    let servers = start_capacity_servers(c.topo.backends(), HTTP_PORT, 100, 1).unwrap();
    let vip = format!("{VIP4}:{HTTP_PORT}/tcp");
    c.lbctl(&["vips", "add", &vip]).unwrap();
    c.lbctl(&["vips", "health", &vip, "--probe", "http", "--path", "/health"]).unwrap();
    for b in c.topo.backends() {
        c.lbctl(&["backends", "add", "--vip", &vip, &b.ipv4().to_string()]).unwrap();
    }
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let b1 = c.topo.backends()[0].ipv4().to_string();

    // SIGUSR1: b1's health answers take 200 ms from now on (its peers answer in ~1 ms).
    servers[0].signal(Signal::SIGUSR1).unwrap();
    let mut weights = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(14) {
        let b = backend_json(&c, &vip, &b1);
        weights.push(b["effective_weight"].as_u64().unwrap());
        assert_ne!(b["health"], "unhealthy", "slowness is not a failure: {b}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let b = backend_json(&c, &vip, &b1);
    println!("b1 weight while slow: {weights:?}; {b}");
    assert_eq!(b["health"], "slow");
    assert!(b["reason"].as_str().unwrap().contains("slower_than_peers"), "{b}");
    assert!(weights.windows(2).all(|w| w[1] <= w[0]), "the weight only goes down while slow: {weights:?}");
    assert!(weights.iter().all(|w| *w >= 25), "never below the floor (25%): {weights:?}");
    assert!(weights.iter().filter(|w| **w < 100 && **w > 25).count() >= 3, "stepped down, not cut: {weights:?}");
    assert_eq!(*weights.last().unwrap(), 25);
    let others = effective_weights_of(&c, &vip);
    assert_eq!(&others[1..], [100, 100], "its peers are untouched");

    servers[0].signal(Signal::SIGUSR1).unwrap();
    wait_until(Duration::from_secs(20), "b1 back to healthy at full weight", || all_healthy(&c, &vip));
}

fn effective_weights_of(c: &spillway_harness::cluster::Cluster, vip: &str) -> Vec<u64> {
    let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    list["backends"].as_array().unwrap().iter().map(|b| b["effective_weight"].as_u64().unwrap()).collect()
}

#[test]
fn a_restart_keeps_serving_backends_at_full_weight_and_failed_ones_out() {
    let c = start(XdpMode::Native, 3);
    let vip = tcp_vip(false);
    c.lbctl(&["vips", "add", &vip]).unwrap();
    // A slow start long enough to tell "restored" from "started again" (the cluster's
    // default is none).
    c.lbctl(&["vips", "health", &vip, "--set", "slow_start_ms=60000"]).unwrap();
    for b in c.topo.backends() {
        c.lbctl(&["backends", "add", "--vip", &vip, &b.ipv4().to_string()]).unwrap();
    }
    c.stop_echo(0).unwrap();
    let b1 = c.topo.backends()[0].ipv4().to_string();
    wait_until(Duration::from_secs(5), "b1 unhealthy", || backend_json(&c, &vip, &b1)["health"] == "unhealthy");
    // b2 and b3 are 5+ s into their minute-long ramp.
    std::thread::sleep(Duration::from_secs(3));
    let ramp_before: Vec<u64> = effective_weights_of(&c, &vip)[1..].to_vec();

    c.stop_lbd(Signal::SIGTERM).unwrap();
    c.start_lbd().unwrap();
    let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
    let backends = list["backends"].as_array().unwrap();
    assert_eq!((backends[0]["health"].as_str(), backends[0]["effective_weight"].as_u64()), (Some("unhealthy"), Some(0)), "{list}");
    for (b, before) in backends[1..].iter().zip(&ramp_before) {
        assert_eq!(b["health"], "slow_start", "{list}");
        assert_eq!(b["reason"], "restored", "{list}");
        assert!(b["effective_weight"].as_u64().unwrap() >= *before, "the ramp resumes, it does not restart: {before} then {b}");
    }
}

#[test]
fn a_drain_deadline_removes_the_backend_and_survives_a_restart() {
    let c = start(XdpMode::Native, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    let b3 = c.topo.backends()[2].ipv4().to_string();
    let out = c.lbctl(&["backends", "drain", "--vip", &vip, &b3, "--deadline", "4s"]).unwrap();
    assert!(out.contains("removed in 4 s"), "{out}");
    let b = backend_json(&c, &vip, &b3);
    assert_eq!((b["state"].as_str(), b["effective_weight"].as_u64()), (Some("draining"), Some(0)), "{b}");
    assert!(b["drain_deadline_in_s"].as_u64().is_some_and(|s| s <= 4), "{b}");
    c.stop_lbd(Signal::SIGTERM).unwrap();
    c.start_lbd().unwrap();
    // Upkeep runs every 5 s: removed within deadline + 5 s.
    wait_until(Duration::from_secs(12), "b3 removed", || {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        list["backends"].as_array().unwrap().len() == 2
    });
    assert!(c.lbd_log().contains("reason=drain_deadline"), "the removal is logged");
    let tally = connections(&c, tcp_target(false), 30);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    assert_eq!(tally.by_backend.get("b3"), None);
}
