//! Probes through the tunnel: a backend whose host is up but which does not serve the VIP
//! (VIP missing from its `lo`, decapsulation detached) fails with `vip_path_failed` and
//! leaves the table, within the ejection cap and panic; the balancer's own trouble on the
//! probe path is `Unknown` with an alert; `--probe-path direct` is kept per VIP and backend.
//! Native mode only: the probe path is `lbd`'s, not the XDP program's.

use std::time::{Duration, Instant};

use spillway_harness::cluster::{Cluster, XdpMode};
use spillway_harness::{Host, Signal, VIP4, VIP6, start_capacity_servers};

use crate::support::*;

/// Slow start for the scenarios that watch a backend come back.
const SLOW_START: &str = "slow_start_ms=4000";

/// A cluster of `backends` with the IPv4 TCP VIP on all of them (its health settings
/// `settings`, as `--set` takes them), once every backend is healthy at full weight.
fn healthy_cluster(backends: usize, settings: &[&str]) -> (Cluster, String) {
    let c = start(XdpMode::Native, backends);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    for setting in settings {
        c.lbctl(&["vips", "health", &vip, "--set", setting]).unwrap();
    }
    wait_until(Duration::from_secs(15), "backends healthy", || all_healthy(&c, &vip));
    (c, vip)
}

fn vip_addr(v6: bool) -> String {
    if v6 { format!("{VIP6}/128") } else { format!("{VIP4}/32") }
}

/// Takes the VIP off the backend's `lo`: the host and its service stay up.
fn remove_vip(host: &Host, v6: bool) {
    host.run(&["ip", "addr", "del", &vip_addr(v6), "dev", "lo"]).unwrap();
}

fn restore_vip(host: &Host, v6: bool) {
    let addr = vip_addr(v6);
    let mut args = vec!["ip", "addr", "add", &addr, "dev", "lo"];
    args.extend(v6.then_some("nodad"));
    host.run(&args).unwrap();
}

fn reason(c: &Cluster, vip: &str, backend: &str) -> String {
    backend_json(c, vip, backend)["reason"].as_str().unwrap_or_default().to_owned()
}

/// Waits (bounded by [`DETECTION_BOUND`] from `since`) until `backend` is out of `vip`'s table
/// for a broken VIP path, and returns how long it took.
fn wait_vip_path_failed(c: &Cluster, vip: &str, backend: &str, since: Instant) -> Duration {
    loop {
        let b = backend_json(c, vip, backend);
        if b["health"] == "unhealthy" && b["effective_weight"] == 0 {
            let reason = b["reason"].as_str().unwrap();
            assert!(reason.starts_with("vip_path_failed "), "{backend} failed, but not for its VIP path: {b}");
            return since.elapsed();
        }
        assert!(since.elapsed() < DETECTION_BOUND, "{backend} still in {vip}'s table {:?} after its VIP path broke: {b}", since.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `backend` is back through slow start (seen ramping, then healthy).
fn wait_back_through_slow_start(c: &Cluster, vip: &str, backend: &str) {
    wait_until(Duration::from_secs(8), "back in slow start", || {
        let b = backend_json(c, vip, backend);
        b["health"] == "slow_start" && b["effective_weight"].as_u64().unwrap() < b["weight"].as_u64().unwrap()
    });
    wait_until(Duration::from_secs(10), "healthy at full weight again", || all_healthy(c, vip));
}

/// The `event=health_state` lines `lbd` logged for `backend` going unhealthy.
fn unhealthy_lines(c: &Cluster, backend: &str) -> Vec<String> {
    let needle = format!("backend={backend} ");
    c.lbd_log()
        .lines()
        .filter(|l| l.contains("event=health_state") && l.contains(&needle) && l.contains("to=unhealthy"))
        .map(str::to_owned)
        .collect()
}

/// New connections from c1 all succeed and none reaches `host` (named b1, b2, ...).
fn all_succeed_elsewhere(c: &Cluster, target: std::net::SocketAddr, host: &str) {
    let tally = connections(c, target, 100);
    assert_eq!(tally.failures, 0, "new connections failed: {:?}", tally.errors);
    assert_eq!(tally.by_backend.get(host), None, "new flows reached {host}: {:?}", tally.by_backend);
}

#[test]
fn a_vip_missing_from_a_backend_fails_its_vip_path_and_it_returns_through_slow_start() {
    let (c, vip) = healthy_cluster(3, &[SLOW_START]);
    assert_eq!(connections(&c, tcp_target(false), 60).failures, 0);
    let b1 = &c.topo.backends()[0];
    let addr = b1.ipv4().to_string();

    remove_vip(b1, false);
    let took = wait_vip_path_failed(&c, &vip, &addr, Instant::now());
    println!("b1 out {took:?} after its VIP was removed");
    let why = reason(&c, &vip, &addr);
    assert!(why.contains(r#"tunnel="timeout""#) && why.contains("direct=passed"), "{why}");
    all_succeed_elsewhere(&c, tcp_target(false), "b1");
    let table = c.lbctl(&["backends", "list", "--vip", &vip]).unwrap();
    assert!(table.lines().any(|l| l.starts_with(&addr) && l.contains("unhealthy") && l.contains("vip_path_failed")), "{table}");
    assert!(!table.contains("ALERT"), "not the balancer's fault: {table}");
    let lines = unhealthy_lines(&c, &addr);
    assert_eq!(lines.len(), 1, "logged once: {lines:?}");
    assert!(lines[0].contains("reason=vip_path_failed"), "{}", lines[0]);
    assert_eq!(vip_json(&c, &vip)["health"]["vip_path_failed"], 1);

    restore_vip(b1, false);
    wait_back_through_slow_start(&c, &vip, &addr);
    let tally = connections(&c, tcp_target(false), 90);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    assert!(tally.by_backend.get("b1").copied().unwrap_or(0) > 0, "b1 takes new flows again: {:?}", tally.by_backend);
}

#[test]
fn a_backend_with_its_decapsulation_detached_fails_its_vip_path() {
    let (mut c, vip) = healthy_cluster(3, &[SLOW_START]);
    let addr = c.topo.backends()[1].ipv4().to_string();

    c.detach_decap(1).unwrap();
    let took = wait_vip_path_failed(&c, &vip, &addr, Instant::now());
    println!("b2 out {took:?} after its decapsulation was detached");
    all_succeed_elsewhere(&c, tcp_target(false), "b2");
    assert_eq!(unhealthy_lines(&c, &addr).len(), 1);

    c.restart_agent(1).unwrap();
    wait_back_through_slow_start(&c, &vip, &addr);
}

#[test]
fn a_service_that_stops_listening_is_refused_through_the_tunnel_as_directly() {
    let (c, vip) = healthy_cluster(3, &[]);
    let addr = c.topo.backends()[2].ipv4().to_string();
    c.stop_echo(2).unwrap();
    wait_until(DETECTION_BOUND, "b3 out", || backend_json(&c, &vip, &addr)["effective_weight"] == 0);
    let why = reason(&c, &vip, &addr);
    assert!(why.starts_with("consecutive_failures ") && why.contains(r#"last="refused""#), "{why}");
}

#[test]
fn a_vip_missing_on_every_backend_is_kept_in_by_panic_and_then_by_the_ejection_cap() {
    let (c, vip) = healthy_cluster(3, &[]);
    for b in c.topo.backends() {
        remove_vip(b, false);
    }
    let all_failed = |c: &Cluster| {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        list["backends"].as_array().unwrap().iter().all(|b| b["reason"].as_str().unwrap().starts_with("vip_path_failed"))
    };
    // Panic (below half healthy, fail open): the table stays as it was.
    wait_until(DETECTION_BOUND + Duration::from_secs(1), "every backend failing its VIP path, kept in by panic", || {
        all_failed(&c) && effective(&c, &vip) == [100, 100, 100]
    });
    let health = &vip_json(&c, &vip)["health"];
    assert_eq!((health["panic"].as_bool(), health["vip_path_failed"].as_u64()), (Some(true), Some(3)), "{health}");
    assert!(c.lbd_log().contains("event=health_panic_entered"));
    let table = c.lbctl(&["vips", "list"]).unwrap();
    assert!(table.contains("PANIC") && table.contains("3 vip_path_failed"), "{table}");

    // Without panic, the cap: half the weight at most, the oldest failure first.
    c.lbctl(&["vips", "health", &vip, "--set", "panic_threshold=0"]).unwrap();
    wait_until(Duration::from_secs(3), "one backend ejected", || effective(&c, &vip).iter().filter(|w| **w == 0).count() == 1);
    let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
    let kept = list["backends"].as_array().unwrap().iter().filter(|b| b["kept_in"] == true).count();
    assert_eq!(kept, 2, "{list}");
    assert_eq!(vip_json(&c, &vip)["health"]["ejection_capped"], true);
}

fn effective(c: &Cluster, vip: &str) -> Vec<u64> {
    let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    list["backends"].as_array().unwrap().iter().map(|b| b["effective_weight"].as_u64().unwrap()).collect()
}

#[test]
fn ipv6_vips_and_ipv4_vips_on_ipv6_backends_are_probed_through_their_tunnels() {
    let c = start(XdpMode::Native, 3);
    let (vip6, vip4in6) = (tcp_vip(true), tcp_vip(false));
    vip_with_all_backends(&c, &vip6, true);
    // IPv4 VIP, backends by their IPv6 addresses: IPv4 in IPv6.
    vip_with_all_backends(&c, &vip4in6, true);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip6) && all_healthy(&c, &vip4in6));
    let (b1, b2) = (&c.topo.backends()[0], &c.topo.backends()[1]);

    remove_vip(b1, true);
    remove_vip(b2, false);
    let since = Instant::now();
    wait_vip_path_failed(&c, &vip6, &b1.ipv6().to_string(), since);
    wait_vip_path_failed(&c, &vip4in6, &b2.ipv6().to_string(), since);
    // Each VIP's path is its own: b1 still serves the IPv4 VIP, b2 the IPv6 one.
    for (vip, host) in [(&vip6, b2), (&vip4in6, b1)] {
        assert_eq!(backend_json(&c, vip, &host.ipv6().to_string())["health"], "healthy", "{vip}");
    }
    all_succeed_elsewhere(&c, tcp_target(true), "b1");
    all_succeed_elsewhere(&c, tcp_target(false), "b2");
}

#[test]
fn udp_and_http_probes_go_through_the_tunnel() {
    const HTTP_PORT: u16 = 8080;
    let c = start(XdpMode::Native, 2);
    let _servers = start_capacity_servers(c.topo.backends(), HTTP_PORT, 50, 1).unwrap();
    let udp = udp_vip();
    let http = format!("{VIP4}:{HTTP_PORT}/tcp");
    c.lbctl(&["vips", "add", &udp]).unwrap();
    c.lbctl(&["vips", "health", &udp, "--probe", "udp", "--payload", "70696e67"]).unwrap();
    c.lbctl(&["vips", "add", &http]).unwrap();
    c.lbctl(&["vips", "health", &http, "--probe", "http", "--path", "/health"]).unwrap();
    for b in c.topo.backends() {
        for vip in [&udp, &http] {
            c.lbctl(&["backends", "add", "--vip", vip, &b.ipv4().to_string()]).unwrap();
        }
    }
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &udp) && all_healthy(&c, &http));
    let b1 = &c.topo.backends()[0];
    remove_vip(b1, false);
    let since = Instant::now();
    for vip in [&udp, &http] {
        wait_vip_path_failed(&c, vip, &b1.ipv4().to_string(), since);
        assert_eq!(backend_json(&c, vip, &c.topo.backends()[1].ipv4().to_string())["health"], "healthy");
    }
}

#[test]
fn direct_probes_are_kept_per_vip_and_per_backend() {
    let c = start(XdpMode::Native, 2);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    c.lbctl(&["vips", "health", &vip, "--probe-path", "direct"]).unwrap();
    let (b1, b2) = (&c.topo.backends()[0], &c.topo.backends()[1]);
    let (a1, a2) = (b1.ipv4().to_string(), b2.ipv4().to_string());
    c.lbctl(&["backends", "options", "--vip", &vip, &a2, "--probe-path", "tunnel"]).unwrap();
    let err = c.lbctl_output(&["backends", "options", "--vip", &vip, &a2, "--probe-path", "both"]).unwrap();
    assert!(!err.status.success() && String::from_utf8_lossy(&err.stderr).contains("--probe-path"));
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));

    remove_vip(b1, false);
    remove_vip(b2, false);
    wait_vip_path_failed(&c, &vip, &a2, Instant::now());
    // b1 is probed directly: its missing VIP is invisible to that probe, as the operator chose.
    let b = backend_json(&c, &vip, &a1);
    assert_eq!((b["health"].as_str(), b["probe_path"].as_str()), (Some("healthy"), Some("direct")), "{b}");
    assert_eq!(backend_json(&c, &vip, &a2)["probe_path"], "tunnel");

    // Both choices are part of the desired state.
    c.stop_lbd(Signal::SIGTERM).unwrap();
    c.start_lbd().unwrap();
    assert_eq!(vip_json(&c, &vip)["health"]["probe_path"], "direct");
    assert_eq!(backend_json(&c, &vip, &a2)["options"]["probe_path"], "tunnel");
}

/// The backends list's alerts, joined.
fn alerts(c: &Cluster, vip: &str) -> String {
    let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    list["alerts"].as_array().map(|a| a.iter().filter_map(|s| s.as_str()).collect::<Vec<_>>().join("\n")).unwrap_or_default()
}

/// Every backend of `vip` has had more probes count as unknown than it takes to fail one
/// (`fall`), and none changed state or weight for it: the balancer's trouble is its own.
fn nobody_blamed(c: &Cluster, vip: &str) {
    let unknown = |b: &serde_json::Value| b["unknown_probes"].as_u64().unwrap_or(0);
    wait_until(Duration::from_secs(6), "every backend's probes unknown", || {
        let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
        list["backends"].as_array().unwrap().iter().all(|b| unknown(b) > 2)
    });
    let list = c.lbctl_json(&["backends", "list", "--vip", vip]).unwrap();
    for b in list["backends"].as_array().unwrap() {
        assert_eq!((b["health"].as_str(), b["effective_weight"].as_u64()), (Some("healthy"), b["weight"].as_u64()), "{b}");
    }
}

fn probe_link(c: &Cluster) -> std::path::PathBuf {
    c.lbd_pin_dir().unwrap().join(format!("v{}", spillway_common::limits::PIN_VERSION)).join("probe_link")
}

/// The probe device's name: derived from the cluster's pin directory.
fn probe_device(c: &Cluster) -> String {
    spillway_dataplane::vip_path::ProbeNames::for_pin_dir(&c.lbd_pin_dir().unwrap()).device
}

/// Puts a bridge in the probe device's place (a running lbd restores a path merely removed,
/// but takes no device that is not an ifb; the swap is retried should it restore the device
/// in between). Returns the device's name.
fn break_the_probe_path_for_good(c: &Cluster) -> String {
    let device = probe_device(c);
    let swap = format!("ip link del dev {device} && ip link add {device} type bridge");
    wait_until(Duration::from_secs(5), "the probe device swapped for a bridge", || c.topo.lb().run(&["sh", "-c", &swap]).is_ok());
    device
}

#[test]
fn a_probe_that_cannot_take_the_probe_path_is_unknown_not_passed() {
    let (c, vip) = healthy_cluster(2, &[]);
    // Another way to the VIP that answers (as a router announcing it would give): straight
    // to b2, which serves it. Probes that fell back to it would pass for every backend.
    let b2 = c.topo.backends()[1].ipv4().to_string();
    c.topo.lb().run(&["ip", "route", "add", &format!("{VIP4}/32"), "via", &b2, "dev", "eth0"]).unwrap();
    break_the_probe_path_for_good(&c);
    nobody_blamed(&c, &vip);
    assert!(alerts(&c, &vip).starts_with("ALERT: this balancer cannot probe through the tunnel"), "{}", alerts(&c, &vip));
}

#[test]
fn the_balancers_own_probe_path_trouble_is_unknown_with_an_alert() {
    let (c, vip) = healthy_cluster(2, &[]);
    let lb = c.topo.lb();

    // The probe device replaced by one lbd must not take: the program is detached, lbd
    // cannot restore the path, and probes through the tunnel count as unknown while the
    // direct ones pass.
    let device = break_the_probe_path_for_good(&c);
    wait_until(Duration::from_secs(6), "the alert", || alerts(&c, &vip).contains("not attached"));
    nobody_blamed(&c, &vip);
    assert!(alerts(&c, &vip).starts_with("ALERT: this balancer cannot probe through the tunnel"), "{}", alerts(&c, &vip));
    assert!(c.lbctl(&["vips", "list"]).unwrap().starts_with("ALERT"));
    assert!(c.lbd_log().contains("event=lb_probe_alert cause=vip_path"), "logged");
    assert!(c.lbd_log().contains("event=probe_path_restore_failed"), "logged");
    // Every ALERT is in status: the path that cannot be restored, as long as it lasts.
    let status = c.lbctl_json(&["status"]).unwrap();
    let listed = status["alerts"].as_array().unwrap().iter().filter_map(|a| a.as_str()).any(|a| a.starts_with("ALERT: no probe path ("));
    assert!(listed, "{status}");

    // A restarted lbd attaches it again.
    c.stop_lbd(Signal::SIGTERM).unwrap();
    lb.run(&["ip", "link", "del", "dev", &device]).unwrap();
    c.start_lbd().unwrap();
    assert!(c.lbd_log().contains("event=probe_path_attached"), "{}", c.lbd_log());
    wait_until(Duration::from_secs(6), "probes through the tunnel pass again", || {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        list["backends"].as_array().unwrap().iter().all(|b| b["unknown_probes"].is_null()) && alerts(&c, &vip).is_empty()
    });
    let status = c.lbctl_json(&["status"]).unwrap();
    assert!(status["alerts"].as_array().is_none_or(Vec::is_empty), "the probe path's ALERT ends with the path whole: {status}");

    // Strict reverse-path filtering: the balancer has no route to the VIP, so it drops the
    // backends' replies (source: the VIP) itself.
    for key in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth0.rp_filter"] {
        lb.sysctl(key, "1").unwrap();
    }
    wait_until(Duration::from_secs(6), "the rp_filter alert", || alerts(&c, &vip).contains("rp_filter"));
    nobody_blamed(&c, &vip);
    for key in ["net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth0.rp_filter"] {
        lb.sysctl(key, "0").unwrap();
    }
    wait_until(Duration::from_secs(6), "probes pass again", || {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        list["backends"].as_array().unwrap().iter().all(|b| b["unknown_probes"].is_null())
    });
    assert!(all_healthy(&c, &vip));
}

#[test]
fn a_probe_device_that_is_not_lbds_is_refused_and_left_alone() {
    // eth0 is a veth: lbd must neither take it nor delete it.
    let c = start_with(XdpMode::Native, 1, 1, &["--probe-device", "eth0"]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(6), "the alert", || alerts(&c, &vip).contains("is not an ifb device"));
    nobody_blamed(&c, &vip);
    assert!(c.lbd_log().contains("event=probe_path_unavailable"));
    c.stop_lbd(Signal::SIGTERM).unwrap();
    let pin_dir = c.lbd_pin_dir().unwrap();
    let out = c.lbd_once(&["--cleanup", "--pin-dir", pin_dir.to_str().unwrap(), "--probe-device", "eth0"]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    c.topo.lb().run(&["ip", "link", "show", "eth0"]).expect("eth0 is still there");
}

#[test]
fn a_restarted_lbd_takes_the_probe_path_over_and_cleanup_removes_it() {
    let (c, vip) = healthy_cluster(2, &[]);
    let lb = c.topo.lb();
    let names = spillway_dataplane::vip_path::ProbeNames::for_pin_dir(&c.lbd_pin_dir().unwrap());
    let device = std::ffi::CString::new(names.device.clone()).unwrap();
    let programs = || lb.in_netns(|| aya::programs::SchedClassifier::query_tcx(&device, aya::programs::TcAttachType::Egress)).unwrap().1;
    assert_eq!(programs().len(), 1);
    let before = programs()[0].id();

    c.stop_lbd(Signal::SIGKILL).unwrap();
    c.start_lbd().unwrap();
    assert!(c.lbd_log().contains(&format!("event=probe_path_took_over device={} link={}", names.device, probe_link(&c).display())));
    let after = programs();
    assert_eq!(after.len(), 1, "the program is replaced in its link, not added");
    assert_ne!(after[0].id(), before, "the new lbd's program runs");
    // And it works: a broken VIP path is still seen.
    let b1 = &c.topo.backends()[0];
    remove_vip(b1, false);
    wait_vip_path_failed(&c, &vip, &b1.ipv4().to_string(), Instant::now());

    c.stop_lbd(Signal::SIGTERM).unwrap();
    let pin_dir = c.lbd_pin_dir().unwrap();
    let out = c.lbd_once(&["--cleanup", "--pin-dir", pin_dir.to_str().unwrap()]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(lb.run(&["ip", "link", "show", &names.device]).is_err(), "the probe device is gone");
    // As `ip rule` prints it (%#x).
    let mark = format!("fwmark {:#x}/", u32::from(names.mark) << 24);
    for family in ["-4", "-6"] {
        let rules = lb.run(&["ip", family, "rule", "show"]).unwrap();
        assert!(!rules.contains(&mark), "{family} rules left: {rules}");
    }
    assert!(lb.run(&["ip", "route", "show", "table", &names.table.to_string()]).map_or(true, |r| r.trim().is_empty()));
}
