//! Health checks: a backend whose service dies leaves the table within
//! `interval × fall + timeout + 1 s`, and new connections then all succeed. Native mode only.

use std::time::{Duration, Instant};

use spillway_harness::cluster::XdpMode;

use crate::support::*;

#[test]
fn dead_backend_leaves_the_table() {
    let c = start(XdpMode::Native, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    let dead = backend_addr(&c.topo.backends()[0], false);
    // Every backend passes its probes first (rise 2: within ~3 s).
    let started = Instant::now();
    loop {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        let backends = list["backends"].as_array().unwrap();
        if backends.iter().all(|b| b["health"] == "healthy" && b["effective_weight"] == b["weight"]) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "backends never became healthy: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(connections(&c, tcp_target(false), 60).failures, 0);
    // Probes on a LAN take a fraction of a millisecond: measured in microseconds, never 0
    // (whole milliseconds showed 0 for every backend here).
    let measured = || {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        list["backends"].as_array().unwrap().iter().map(|b| b["latency_ms"].as_f64()).collect::<Option<Vec<f64>>>()
    };
    wait_until(Duration::from_secs(5), "a probe latency for every backend", || measured().is_some());
    let latencies = measured().unwrap();
    assert!(latencies.iter().all(|&ms| ms > 0.0 && ms < 1000.0), "probe latencies {latencies:?} ms");

    c.stop_echo(0).unwrap();
    let killed = Instant::now();
    loop {
        let b = backend_json(&c, &vip, &dead);
        if b["health"] == "unhealthy" && b["effective_weight"] == 0 {
            break;
        }
        assert!(killed.elapsed() < DETECTION_BOUND, "b1 still in the table {:?} after its service died: {b}", killed.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The configured weight is untouched: the operator's state is not the health check's.
    assert_eq!(backend_json(&c, &vip, &dead)["weight"], 100);

    let tally = connections(&c, tcp_target(false), 100);
    assert_eq!(tally.failures, 0, "new connections failed after b1 left the table: {:?}", tally.errors);
    assert_eq!(tally.by_backend.get("b1"), None, "new flows reached the dead b1: {:?}", tally.by_backend);
    let table = c.lbctl(&["backends", "list", "--vip", &vip]).unwrap();
    assert!(table.contains("HEALTH") && table.contains("unhealthy"), "{table}");
}
