//! A balancer with two uplinks (`spillway_harness::uplinks`): one `lbd` on both
//! interfaces, one connection table, each packet out by the route lookup's interface.
//! Connections whose packets alternate between the uplinks keep their backend; an uplink
//! going down or away is an ALERT and breaks no connection; a reloaded interface list
//! attaches and detaches while running.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use spillway_harness::cluster::{Binaries, TCP_PORT};
use spillway_harness::uplinks::TwoUplinks;
use spillway_harness::{Signal, Stream, StreamChecker, VIP4};

const BACKENDS: usize = 3;
const CLIENTS: usize = 3;
const STREAMS_PER_CLIENT: usize = 4;
/// Long enough for TCP to retransmit what an uplink going down lost.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(20);

fn vip() -> SocketAddr {
    SocketAddr::new(VIP4.into(), TCP_PORT)
}

fn network() -> TwoUplinks {
    TwoUplinks::build(Binaries::beside(env!("CARGO_BIN_EXE_lbd")), CLIENTS, BACKENDS).unwrap_or_else(|e| panic!("{e:#}"))
}

fn serve_vip(net: &TwoUplinks) {
    let ctl = net.ctl();
    let vip = format!("{}/tcp", vip());
    ctl.run(&["vips", "add", &vip]).unwrap();
    for b in net.backends() {
        ctl.run(&["backends", "add", "--vip", &vip, &b.ipv4().to_string()]).unwrap();
    }
}

/// Waits until `lbctl status` shows `wanted` as (interface, state) pairs, in order.
fn wait_for_interfaces(net: &TwoUplinks, wanted: &[(&str, &str)]) -> serde_json::Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = net.ctl().json(&["status"]).unwrap();
        let seen: Vec<(String, String)> = status["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| (i["name"].as_str().unwrap().to_owned(), i["state"].as_str().unwrap().to_owned()))
            .collect();
        let want: Vec<(String, String)> = wanted.iter().map(|(n, s)| ((*n).to_owned(), (*s).to_owned())).collect();
        if seen == want {
            return status;
        }
        assert!(Instant::now() < deadline, "interfaces {seen:?}, not {want:?}:\n{}", net.lbd_log());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `STREAMS_PER_CLIENT` connections from every client, by whichever uplink each routes.
fn open_streams(net: &TwoUplinks) -> Vec<Stream> {
    let mut streams = Vec::new();
    for client in net.clients() {
        for _ in 0..STREAMS_PER_CLIENT {
            streams.push(client.in_netns(|| Stream::open(vip(), PING_TIMEOUT)).unwrap_or_else(|e| panic!("{e:#}")));
        }
    }
    let backends: BTreeSet<&str> = streams.iter().map(Stream::backend).collect();
    assert!(backends.len() > 1, "every stream on {backends:?}");
    streams
}

fn route_all_by(net: &TwoUplinks, uplink: usize) {
    for client in net.clients() {
        net.route_by(client, uplink).unwrap();
    }
}

/// Whether `iface` in the balancer's namespace has an XDP program.
fn has_xdp(net: &TwoUplinks, iface: &str) -> bool {
    net.lb().run(&["ip", "-d", "link", "show", "dev", iface]).unwrap().contains("prog/xdp")
}

#[test]
fn connections_keep_their_backend_whichever_uplink_their_packets_arrive_on() {
    let net = network();
    net.start_lbd(&["eth0", "eth1"], &[]).unwrap();
    serve_vip(&net);
    wait_for_interfaces(&net, &[("eth0", "up"), ("eth1", "up")]);
    let mut streams = open_streams(&net);
    let before = [net.frames_to_balancer(0).unwrap(), net.frames_to_balancer(1).unwrap()];
    // Every connection's packets alternate between the uplinks: each arrives where the
    // other left off, and finds its connection in the one table.
    for round in 0..6 {
        route_all_by(&net, round % 2);
        for s in &mut streams {
            s.ping().unwrap_or_else(|e| panic!("round {round}: {e:#}\n{}", net.lbd_log()));
        }
    }
    let pings = (3 * streams.len()) as u64;
    for (n, before) in before.iter().enumerate() {
        let arrived = net.frames_to_balancer(n).unwrap() - before;
        assert!(arrived >= pings, "uplink {n} carried {arrived} frames, fewer than the {pings} pings routed by it");
    }
    // A restart takes both links over: the connections go on.
    net.stop_lbd(Signal::SIGTERM).unwrap();
    net.start_lbd(&["eth0", "eth1"], &[]).unwrap();
    let log = net.lbd_log();
    assert_eq!(log.matches("event=took_over ").count(), 2, "{log}");
    for s in &mut streams {
        s.ping().unwrap_or_else(|e| panic!("after the restart: {e:#}"));
    }
}

#[test]
fn an_uplink_down_or_gone_is_an_alert_and_breaks_no_connection() {
    let net = network();
    net.start_lbd(&["eth0", "eth1"], &[]).unwrap();
    serve_vip(&net);
    wait_for_interfaces(&net, &[("eth0", "up"), ("eth1", "up")]);
    let checkers: Vec<StreamChecker> =
        open_streams(&net).into_iter().map(|s| StreamChecker::start(s, Duration::from_millis(100))).collect();
    // eth0 goes down under load; the routers move the clients to the other uplink, and the
    // balancer sends everything out by it.
    net.lb().run(&["ip", "link", "set", "eth0", "down"]).unwrap();
    route_all_by(&net, 1);
    let status = wait_for_interfaces(&net, &[("eth0", "down"), ("eth1", "up")]);
    let alerts = status["alerts"].to_string();
    assert!(alerts.contains("ALERT: interface eth0 is down") && alerts.contains("VIP traffic goes on through eth1"), "{alerts}");
    std::thread::sleep(Duration::from_secs(2));
    // Probes left by eth1 too: the balancer's own fault failed no backend.
    let log = net.lbd_log();
    assert!(log.contains("event=probe_path_ingress iface=eth1 was=eth0"), "{log}");
    assert!(!log.contains("to=unhealthy"), "{log}");
    // Back: no alert.
    net.lb().run(&["ip", "link", "set", "eth0", "up"]).unwrap();
    let status = wait_for_interfaces(&net, &[("eth0", "up"), ("eth1", "up")]);
    assert!(status.get("alerts").is_none(), "{status}");
    // eth1 disappears: traffic goes back by eth0.
    route_all_by(&net, 0);
    net.lb().run(&["ip", "link", "del", "dev", "eth1"]).unwrap();
    net.route_balancer_by(0).unwrap();
    let status = wait_for_interfaces(&net, &[("eth0", "up"), ("eth1", "gone")]);
    assert!(status["alerts"].to_string().contains("ALERT: interface eth1 is gone"), "{status}");
    std::thread::sleep(Duration::from_secs(2));
    for checker in checkers {
        let report = checker.stop();
        assert!(report.pings > 20 && report.failures == 0, "a connection broke: {report:?}\n{}", net.lbd_log());
    }
    // New connections too.
    open_streams(&net);
}

#[test]
fn a_reloaded_interface_list_attaches_and_detaches_while_running() {
    let net = network();
    let file = net.file("spillway.toml");
    let write = |ifaces: &str| {
        let text = format!(
            "[lbd]\niface = {ifaces}\n\n[[vips]]\nvip = \"{}/tcp\"\n{}",
            vip(),
            net.backends().iter().map(|b| format!("[[vips.backends]]\naddress = \"{}\"\n", b.ipv4())).collect::<String>()
        );
        std::fs::write(&file, text).unwrap();
    };
    write(r#"["eth0"]"#);
    net.start_lbd(&[], &["--config", &file.display().to_string()]).unwrap();
    wait_for_interfaces(&net, &[("eth0", "up")]);
    assert!(has_xdp(&net, "eth0") && !has_xdp(&net, "eth1"));
    let mut streams = open_streams(&net);
    let prog_of = |iface: &str| {
        let text = net.lb().run(&["ip", "-d", "link", "show", "dev", iface]).unwrap();
        text.split_whitespace().skip_while(|w| *w != "prog/xdp").nth(2).map(str::to_owned)
    };
    let eth0_program = prog_of("eth0");
    // SIGHUP with eth1 added: attached, eth0 untouched, traffic by eth1 served.
    write(r#"["eth0", "eth1"]"#);
    net.signal_lbd(Signal::SIGHUP).unwrap();
    wait_for_interfaces(&net, &[("eth0", "up"), ("eth1", "up")]);
    assert!(has_xdp(&net, "eth1"));
    assert_eq!(prog_of("eth0"), eth0_program, "eth0's program changed");
    route_all_by(&net, 1);
    for s in &mut streams {
        s.ping().unwrap_or_else(|e| panic!("by eth1: {e:#}\n{}", net.lbd_log()));
    }
    // `lbctl apply -f` with eth0 removed: detached, the others go on.
    write(r#"["eth1"]"#);
    let applied = net.ctl().run(&["apply", "-f", &file.display().to_string()]).unwrap();
    assert!(applied.contains("lbd.iface: the balancer moves from eth0,eth1 to eth1"), "{applied}");
    wait_for_interfaces(&net, &[("eth1", "up")]);
    let deadline = Instant::now() + WAIT;
    while has_xdp(&net, "eth0") {
        assert!(Instant::now() < deadline, "eth0 still runs the balancer:\n{}", net.lbd_log());
        std::thread::sleep(Duration::from_millis(200));
    }
    for s in &mut streams {
        s.ping().unwrap_or_else(|e| panic!("after eth0 left: {e:#}"));
    }
    let exported = net.ctl().run(&["export"]).unwrap();
    assert!(exported.contains(r#"iface = "eth1""#), "{exported}");
}
