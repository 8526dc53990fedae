//! Port exhaustion with real sockets: a backend short of ephemeral ports loses share of new
//! flows (and gets it back), with its agent's watcher in each mode (a mode the kernel
//! refuses is reported and skipped), and a balancer short of its own ports marks no backend
//! unhealthy but raises a loud alert. Native XDP mode only.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use spillway_harness::Host;
use spillway_harness::cluster::{Cluster, TCP_PORT, XdpMode};
use spillway_harness::connects::call_dead_dependency;
use spillway_model::ports_report::Mode;
use spillway_ports::{Scope, SockWatch, WatchOptions};

use crate::support::*;

/// Opens connections from `host` to `to` until `count` are open or the ports run out;
/// returns what was opened and how many connects failed with EADDRNOTAVAIL.
fn hold_ports(host: &Host, to: SocketAddr, count: usize) -> (Vec<TcpStream>, usize) {
    host.in_netns(|| {
        let mut held = Vec::new();
        let mut exhausted = 0;
        for _ in 0..count {
            match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                Ok(s) => held.push(s),
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => exhausted += 1,
                Err(e) => panic!("connecting to {to}: {e}"),
            }
        }
        (held, exhausted)
    })
}

fn set_linger_zero(stream: &TcpStream) {
    nix::sys::socket::setsockopt(stream, nix::sys::socket::sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 }).unwrap();
}

/// Connections a share is sampled from: 0.2 (the bounds the tests put on a full share of
/// 1/3 and on a cut one of 1/9) is then ~5 standard deviations from either. At 150 it was
/// 3.5, and a clean run saw a full-weight backend at exactly 0.20.
const SAMPLE: usize = 300;

fn shares(c: &Cluster) -> Vec<f64> {
    let tally = connections(c, tcp_target(false), SAMPLE);
    assert_eq!(tally.failures, 0, "{:?}", tally.errors);
    (1..=3).map(|i| tally.by_backend.get(&format!("b{i}")).copied().unwrap_or(0) as f64 / SAMPLE as f64).collect()
}

/// Whether this kernel allows watcher mode `mode` (said on stderr when it does not).
fn kernel_allows(mode: Mode) -> bool {
    match SockWatch::load(WatchOptions { mode: mode.into(), scope: Scope::Own }) {
        Ok(_) => true,
        Err(e) if e.is_kernel_refusal() => {
            eprintln!("watcher mode {mode} is refused by this kernel, not tested here: {}", spillway_logging::error_chain(&e));
            false
        }
        Err(e) => panic!("loading the watcher in mode {mode}: {}", spillway_logging::error_chain(&e)),
    }
}

/// A cluster of three healthy backends on a TCP VIP, their agents watching ports in `mode`;
/// `None` (said on stderr) where the kernel refuses the mode.
fn three_backends_watched_in(mode: Mode) -> Option<(Cluster, String)> {
    if !kernel_allows(mode) {
        return None;
    }
    let c = start_configured(XdpMode::Native, 3, 1, &[], &["--watcher-mode", mode.name()]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    Some((c, vip))
}

fn a_backend_short_of_ports_loses_share_and_gets_it_back(mode: Mode) {
    let Some((c, vip)) = three_backends_watched_in(mode) else { return };
    let b1 = &c.topo.backends()[0];
    let b1_addr = b1.ipv4().to_string();

    // b1's service opens outbound connections (to a local dependency) until 95 of its
    // 100 ephemeral ports are taken.
    b1.sysctl("net.ipv4.ip_local_port_range", "40000 40099").unwrap();
    let dependency = b1.in_netns(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 7000)).unwrap());
    let (held, _) = hold_ports(b1, SocketAddr::from((Ipv4Addr::LOCALHOST, 7000)), 95);
    wait_until(Duration::from_secs(8), "b1 at critical port pressure, its weight cut", || {
        let b1 = backend_json(&c, &vip, &b1_addr);
        b1["pressure"] == "critical" && b1["effective_weight"].as_u64() < Some(100)
    });
    let report = c.lbctl_json(&["ports", "--host", &b1_addr]).unwrap();
    let worst = &report["report"]["destinations"][0];
    assert!(worst["utilisation"].as_f64().unwrap() >= 0.9 && worst["remote_port"] == 7000, "{report}");
    assert_eq!(report["report"]["watcher"]["mode"], mode.name(), "{report}");
    let under_pressure = shares(&c);
    let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
    let others: Vec<_> =
        list["backends"].as_array().unwrap()[1..].iter().map(|b| (b["health"].clone(), b["effective_weight"].clone())).collect();
    assert_eq!(others, [("healthy".into(), 100.into()), ("healthy".into(), 100.into())], "no other backend changes: {list}");
    assert_eq!(backend_json(&c, &vip, &b1_addr)["health"], "healthy", "pressure is not a health failure");
    println!("shares under pressure {under_pressure:.2?}");
    // Weight 25 of 225: about 11%, against 33% before.
    assert!(under_pressure[0] < 0.2, "b1 still gets {:.2} of new flows", under_pressure[0]);

    // Closed with a reset, as a fixed service would: a normal close would hold each port in
    // TIME_WAIT for another minute.
    for stream in held {
        set_linger_zero(&stream);
    }
    drop(dependency);
    wait_until(Duration::from_secs(8), "b1's pressure gone", || backend_json(&c, &vip, &b1_addr)["pressure"] == "none");
    assert_eq!(backend_json(&c, &vip, &b1_addr)["effective_weight"], 100);
    let restored = shares(&c);
    println!("shares restored {restored:.2?}");
    assert!(restored[0] > 0.2, "b1 gets its share back: {restored:.2?}");
}

spillway_harness::in_every_watcher_mode!(a_backend_short_of_ports_loses_share_and_gets_it_back);

/// The seed's cascade, replayed: a dependency every backend's application calls goes down
/// for 30 s while clients keep connecting (refused on its closed port, and timed out or
/// abandoned on an address that answers nothing). No backend loses its share of new flows
/// or is ejected, and no port pressure is reported. Then one backend really runs out of
/// ports, and only that one loses share.
fn a_dead_dependency_costs_no_backend_its_share(mode: Mode) {
    let Some((c, vip)) = three_backends_watched_in(mode) else { return };
    let backends = c.topo.backends();
    // The dependency: a closed port on the client host, and an address whose neighbour
    // entry leads nowhere.
    let refused = SocketAddr::from((c.topo.clients()[0].ipv4(), 7100));
    let silent = SocketAddr::from((Ipv4Addr::new(10, 0, 0, 97), 7100));
    for b in backends {
        b.run(&["ip", "neigh", "replace", &silent.ip().to_string(), "lladdr", "02:00:00:00:99:97", "dev", "eth0", "nud", "permanent"])
            .unwrap();
    }
    let steady = || {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        let seen: Vec<_> = list["backends"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (b["health"].clone(), b["effective_weight"].clone(), b["pressure"].clone()))
            .collect();
        assert_eq!(seen, vec![("healthy".into(), 100.into(), "none".into()); 3], "nobody loses weight: {list}");
    };

    const OUTAGE: Duration = Duration::from_secs(30);
    let until = Instant::now() + OUTAGE;
    let calls = std::thread::scope(|s| {
        let callers: Vec<_> =
            backends.iter().map(|b| s.spawn(move || b.in_netns(|| call_dead_dependency(refused, silent, until)))).collect();
        while Instant::now() < until {
            let shares = shares(&c);
            assert!(shares.iter().all(|&share| share > 0.2), "every backend keeps its share: {shares:.2?}");
            steady();
            std::thread::sleep(Duration::from_secs(2));
        }
        callers.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    });
    println!("dependency calls per backend during the outage: {calls:?}");
    assert!(calls.iter().all(|k| k.refused > 500 && k.silent > 500 && k.other == 0), "{calls:?}");
    // Two polls after the last call: still nobody under pressure, no failure reported.
    std::thread::sleep(2 * spillway_daemon::pressure::POLL);
    steady();
    for b in backends {
        let report = c.lbctl_json(&["ports", "--host", &b.ipv4().to_string()]).unwrap();
        assert_eq!(report["report"]["watcher"]["mode"], mode.name(), "{report}");
        let destinations = report["report"]["destinations"].as_array().unwrap();
        assert!(destinations.iter().all(|d| d["failures"] == 0), "no failure for want of a port on {}: {report}", b.name());
        assert_eq!(report["report"]["failures"].as_array().map(Vec::len), Some(0), "{report}");
    }
    assert!(!c.lbd_log().contains("event=port_pressure"), "{}", c.lbd_log());

    // b1's application now really exhausts its ports (to a local dependency) and keeps
    // trying: it alone loses its share.
    let b1 = &backends[0];
    b1.sysctl("net.ipv4.ip_local_port_range", "40000 40099").unwrap();
    let dependency = b1.in_netns(|| TcpListener::bind((Ipv4Addr::LOCALHOST, 7000)).unwrap());
    let local = SocketAddr::from((Ipv4Addr::LOCALHOST, 7000));
    let (held, exhausted) = hold_ports(b1, local, 105);
    assert!(exhausted >= 5, "the 100 ports ran out");
    let failures_watched = mode != Mode::SockDiag;
    let expected = if failures_watched { "exhausted" } else { "critical" };
    let b1_addr = b1.ipv4().to_string();
    let done = std::sync::atomic::AtomicBool::new(false);
    let lost = std::thread::scope(|s| {
        let retries = s.spawn(|| {
            b1.in_netns(|| {
                // Bounded too: a failed assertion below must not leave this loop running.
                let until = Instant::now() + Duration::from_secs(30);
                while !done.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < until {
                    let _ = TcpStream::connect_timeout(&local, Duration::from_millis(100));
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        });
        // The watcher re-reads the port range within 5 s; two polls of 2 s after that.
        let deadline = Instant::now() + Duration::from_secs(12);
        // The pressure, and the weight it costs in the data path, before the share is sampled.
        let pressed = |b: &serde_json::Value| b["pressure"] == expected && b["effective_weight"].as_u64() < Some(100);
        let mut seen = backend_json(&c, &vip, &b1_addr);
        while !pressed(&seen) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            seen = backend_json(&c, &vip, &b1_addr);
        }
        if !pressed(&seen) {
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            panic!("b1 not {expected} within 12 s: {seen}; its report: {}", c.lbctl_json(&["ports", "--host", &b1_addr]).unwrap());
        }
        let lost = shares(&c);
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        retries.join().unwrap();
        let others: Vec<_> =
            list["backends"].as_array().unwrap()[1..].iter().map(|b| (b["effective_weight"].clone(), b["pressure"].clone())).collect();
        assert_eq!(others, [(100.into(), "none".into()), (100.into(), "none".into())], "only b1 changes: {list}");
        lost
    });
    println!("shares with b1 out of ports ({expected}): {lost:.2?}");
    assert!(lost[0] < 0.2 && lost[1] > 0.3 && lost[2] > 0.3, "b1 alone loses share: {lost:.2?}");
    for stream in held {
        set_linger_zero(&stream);
    }
    drop(dependency);
}

spillway_harness::in_every_watcher_mode!(a_dead_dependency_costs_no_backend_its_share);

/// Health probes that fail are no port failures of the balancer: probes refused by a
/// backend whose service died and probes timing out towards one that answers nothing leave
/// `lbctl ports` (the balancer's own watcher) without a failure and without a failing
/// process, while both backends are taken out.
fn failed_probes_are_not_port_failures(mode: Mode) {
    if !kernel_allows(mode) {
        return;
    }
    let c = start_with(XdpMode::Native, 3, 1, &["--watcher-mode", mode.name()]);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    // Direct probes: to the backends' own addresses, which the balancer's neighbour table
    // can send nowhere.
    c.lbctl(&["vips", "health", &vip, "--probe-path", "direct"]).unwrap();
    wait_until(Duration::from_secs(10), "backends healthy", || all_healthy(&c, &vip));
    let (refusing, silent) = (&c.topo.backends()[0], &c.topo.backends()[1]);
    c.stop_echo(0).unwrap();
    c.topo
        .lb()
        .run(&["ip", "neigh", "replace", &silent.ipv4().to_string(), "lladdr", "02:00:00:00:99:96", "dev", "eth0", "nud", "permanent"])
        .unwrap();
    for b in [refusing, silent] {
        let addr = b.ipv4().to_string();
        wait_until(Duration::from_secs(8), "the failing backend out", || backend_json(&c, &vip, &addr)["health"] == "unhealthy");
    }
    // A few more probe rounds, then two reads of the watcher.
    std::thread::sleep(Duration::from_secs(3) + 2 * spillway_daemon::pressure::POLL);
    let report = c.lbctl_json(&["ports"]).unwrap();
    assert_eq!(report["report"]["watcher"]["mode"], mode.name(), "{report}");
    let destinations = report["report"]["destinations"].as_array().unwrap();
    assert!(destinations.iter().all(|d| d["failures"] == 0), "no failure for want of a port: {report}");
    assert_eq!(report["report"]["failures"].as_array().map(Vec::len), Some(0), "no process blamed: {report}");
    let table = c.lbctl(&["ports"]).unwrap();
    assert!(!table.contains("for want of a port:"), "{table}");
    let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
    assert!(list["alerts"].as_array().is_none_or(Vec::is_empty), "no local alert: {list}");
}

spillway_harness::in_every_watcher_mode!(failed_probes_are_not_port_failures);

#[test]
fn a_balancer_short_of_ports_marks_nobody_unhealthy_and_alerts() {
    let c = start(XdpMode::Native, 3);
    let vip = tcp_vip(false);
    vip_with_all_backends(&c, &vip, false);
    // Direct probes: the ports held below are towards the backends' own addresses (a probe
    // through the tunnel goes to the VIP, another destination, and would still pass).
    c.lbctl(&["vips", "health", &vip, "--probe-path", "direct"]).unwrap();
    let healthy = || all_healthy(&c, &vip);
    wait_until(Duration::from_secs(10), "backends healthy", healthy);

    // The balancer's own ports towards every backend's probed port are used up.
    let lb = c.topo.lb();
    lb.sysctl("net.ipv4.ip_local_port_range", "50000 50009").unwrap();
    let mut held = Vec::new();
    for b in c.topo.backends() {
        let (streams, exhausted) = hold_ports(lb, SocketAddr::from((b.ipv4(), TCP_PORT)), 12);
        assert!(exhausted >= 2, "the 10 ports towards {} ran out", b.ipv4());
        held.extend(streams);
    }
    wait_until(Duration::from_secs(6), "the alert", || c.lbctl(&["backends", "list", "--vip", &vip]).unwrap().contains("ALERT"));
    // Every backend's probes then fail here more times than its fall (2), and nobody is
    // marked unhealthy. Waited for rather than slept: a probe may still have found a port
    // while the test was taking the last backend's, so that backend's count starts later.
    let unknown_everywhere = || {
        let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
        list["backends"].as_array().unwrap().iter().all(|b| b["unknown_probes"].as_u64() > Some(2))
    };
    wait_until(Duration::from_secs(10), "three unknown probes of every backend", unknown_everywhere);
    assert!(healthy(), "{}", c.lbctl(&["backends", "list", "--vip", &vip]).unwrap());
    let list = c.lbctl_json(&["backends", "list", "--vip", &vip]).unwrap();
    assert!(list["alerts"][0].as_str().unwrap().contains("cannot open probe sockets"), "{list}");
    assert!(c.lbctl(&["vips", "list"]).unwrap().starts_with("ALERT"));
    assert!(c.lbd_log().contains("event=lb_probe_alert"), "the alert is logged");
    for stream in held {
        set_linger_zero(&stream);
    }
}
