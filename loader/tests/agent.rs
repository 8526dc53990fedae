//! `lbd agent`'s local addresses: it decapsulates for every address of its host up to
//! `--max-local-addrs`, raises an ALERT naming the addresses left out when there are more
//! (a backend with many VIPs on `lo` would silently lose some), and says so when they fit
//! again. Needs root; everything lives in the harness's namespaces.

use std::collections::BTreeSet;
use std::time::Duration;

use spillway_harness::{Host, Topology, TopologyConfig};

/// The distinct addresses `ip` shows on `host` (what the agent reads, as netlink gives it).
fn addresses(host: &Host) -> BTreeSet<String> {
    let out = host.run(&["ip", "-o", "addr", "show"]).unwrap();
    out.lines().filter_map(|l| l.split_whitespace().nth(3)).filter_map(|cidr| cidr.split('/').next()).map(str::to_owned).collect()
}

#[test]
fn local_addresses_beyond_the_map_raise_an_alert_that_clears() {
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
    let backend = &topology.backends()[0];
    let pin_dir = topology.pin_dir().unwrap();
    // Room for every routable address and one more (link-local ones are the first left
    // out, and never alerted about: no tunnel is addressed to them).
    let room = addresses(backend).iter().filter(|a| !a.starts_with("fe80:")).count() + 1;
    let max = room.to_string();
    let args = [
        env!("CARGO_BIN_EXE_lbd"),
        "agent",
        "--iface",
        "eth0",
        "--xdp-mode",
        "generic",
        "--pin-dir",
        pin_dir.to_str().unwrap(),
        "--ports-listen",
        "off",
        "--metrics-listen",
        "off",
        "--max-local-addrs",
        &max,
        "--allow-from",
        "10.0.0.2/32",
    ];
    let agent = backend.spawn(&args).unwrap();
    agent.wait_for_output("event=ready", Duration::from_secs(20)).unwrap();
    assert!(!agent.log().contains("local_addrs_alert"), "every address fits: {}", agent.log());

    // Two VIPs more on lo: one more than the map holds is left out (the agent re-reads
    // every 5 s).
    for vip in ["10.100.0.50/32", "10.100.0.51/32"] {
        backend.run(&["ip", "addr", "add", vip, "dev", "lo"]).unwrap();
    }
    agent.wait_for_output("event=local_addrs_alert", Duration::from_secs(12)).unwrap();
    let log = agent.log();
    let alert = log.lines().find(|l| l.contains("event=local_addrs_alert")).unwrap();
    assert!(alert.contains(&format!("max={room}")) && alert.contains("ALERT") && alert.contains("--max-local-addrs"), "{alert}");
    let named = alert.split_whitespace().find_map(|kv| kv.strip_prefix("left_out=")).unwrap();
    assert!(!named.contains(',') && addresses(backend).contains(named), "names the one address left out: {alert}");

    backend.run(&["ip", "addr", "del", "10.100.0.51/32", "dev", "lo"]).unwrap();
    agent.wait_for_output("event=local_addrs_fit", Duration::from_secs(12)).unwrap();
    assert_eq!(agent.log().matches("event=local_addrs_alert").count(), 1, "one alert per change: {}", agent.log());
    assert!(agent.is_running());
}
