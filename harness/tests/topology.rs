//! Smoke tests of the harness itself: no load balancer involved. Need root.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use spillway_harness::{
    Signal, Stream, StreamChecker, Topology, TopologyConfig, VIP4, VIP6, run_connections, start_echo, sweep_stale, tcp_ask, udp_ask,
};

const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 5353;
const TIMEOUT: Duration = Duration::from_secs(2);

/// Namespaces named `<id>-...` that still exist.
fn namespaces_of(id: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| name.starts_with(&format!("{id}-")))
        .map(str::to_owned)
        .collect()
}

fn assert_cleaned_up(id: &str) {
    assert_eq!(namespaces_of(id), Vec::<String>::new(), "namespaces left");
    assert!(!Path::new("/sys/fs/bpf").join(id).exists(), "pin dir left");
    assert!(!std::env::temp_dir().join(id).exists(), "temp dir left");
}

#[test]
fn backends_answer_over_tcp_and_udp_and_everything_is_removed() {
    let mut topo = Topology::build(TopologyConfig { backends: 3, clients: 1 }).unwrap();
    let id = topo.id().to_owned();
    assert_eq!(namespaces_of(&id).len(), 6, "br, lb, c1, b1..b3");
    let pin_dir = topo.pin_dir().unwrap();
    assert!(pin_dir.is_dir());
    let _echo = topo.start_echo_servers(TCP_PORT, UDP_PORT).unwrap();

    let client = &topo.clients()[0];
    for backend in topo.backends() {
        for ip in [IpAddr::from(backend.ipv4()), IpAddr::from(backend.ipv6())] {
            let (tcp, udp) =
                client.in_netns(|| (tcp_ask(SocketAddr::new(ip, TCP_PORT), TIMEOUT), udp_ask(SocketAddr::new(ip, UDP_PORT), TIMEOUT)));
            assert_eq!(tcp.unwrap(), backend.name(), "TCP to {ip}");
            assert_eq!(udp.unwrap(), backend.name(), "UDP to {ip}");
        }
        // The VIPs are local to each backend; the UDP servers bound them.
        for vip in [IpAddr::from(VIP4), IpAddr::from(VIP6)] {
            let udp = backend.in_netns(|| udp_ask(SocketAddr::new(vip, UDP_PORT), TIMEOUT));
            assert_eq!(udp.unwrap(), backend.name(), "UDP to {vip} on itself");
        }
    }

    let b1 = SocketAddr::new(topo.backends()[0].ipv6().into(), TCP_PORT);
    let tally = client.in_netns(|| run_connections(b1, 5, Duration::from_millis(10), TIMEOUT));
    assert_eq!((tally.successes(), tally.failures), (5, 0), "{tally:?}");
    assert_eq!(tally.by_backend["b1"], 5);

    let mut stream = client.in_netns(|| Stream::open(b1, TIMEOUT)).unwrap();
    assert_eq!(stream.backend(), "b1");
    for _ in 0..20 {
        stream.ping().unwrap();
    }
    let checker = StreamChecker::start(stream, Duration::from_millis(10));
    std::thread::sleep(Duration::from_millis(200));
    let report = checker.stop();
    assert!(report.pings > 0 && report.failures == 0, "{report:?}");

    let b4 = topo.add_backend().unwrap();
    assert_eq!(b4.name(), "b4");
    let _echo4 = start_echo(b4, TCP_PORT, UDP_PORT).unwrap();
    let b4_addr = SocketAddr::new(b4.ipv4().into(), TCP_PORT);
    let answer = topo.clients()[0].in_netns(|| tcp_ask(b4_addr, TIMEOUT));
    assert_eq!(answer.unwrap(), "b4");

    drop(topo);
    assert_cleaned_up(&id);
}

#[test]
fn daemons_can_be_signalled_and_are_stopped_with_the_topology() {
    let topo = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
    let echo = topo.start_echo_servers(TCP_PORT, UDP_PORT).unwrap().remove(0);
    let b1 = SocketAddr::new(topo.backends()[0].ipv4().into(), TCP_PORT);
    let client = &topo.clients()[0];

    // A stopped server still accepts (the kernel completes handshakes) but
    // never greets; after SIGCONT it serves again.
    echo.signal(Signal::SIGSTOP).unwrap();
    assert!(echo.is_running());
    let short = Duration::from_millis(300);
    assert!(client.in_netns(|| tcp_ask(b1, short)).is_err());
    echo.signal(Signal::SIGCONT).unwrap();
    assert_eq!(client.in_netns(|| tcp_ask(b1, TIMEOUT)).unwrap(), "b1");

    let sleeper = topo.lb().spawn(&["sleep", "600"]).unwrap();
    assert!(sleeper.wait_with_timeout(Duration::from_millis(50)).unwrap().is_none());
    sleeper.signal(Signal::SIGKILL).unwrap();
    let status = sleeper.wait_with_timeout(TIMEOUT).unwrap().expect("exited");
    assert!(!status.success());
    assert!(!sleeper.is_running());
    assert!(sleeper.signal(Signal::SIGTERM).is_err(), "signalling an exited process");

    // Left running on purpose: the topology must stop it.
    let leaked = topo.lb().spawn(&["sleep", "600"]).unwrap();
    let pid = leaked.pid();
    std::mem::forget(leaked);
    drop(topo);
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} survived");
    drop(echo);
}

#[test]
fn a_panicking_test_still_cleans_up() {
    let id = std::sync::Mutex::new(String::new());
    let result = std::panic::catch_unwind(|| {
        let topo = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
        *id.lock().unwrap() = topo.id().to_owned();
        topo.pin_dir().unwrap();
        let _echo = topo.start_echo_servers(TCP_PORT, UDP_PORT).unwrap();
        panic!("test body failed");
    });
    assert!(result.is_err());
    let id = id.into_inner().unwrap();
    assert!(!id.is_empty());
    assert_cleaned_up(&id);
}

#[test]
fn sweep_removes_leftovers_of_dead_processes_only() {
    // A pid that surely exited: a child we reaped.
    let mut dead = Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    let dead_pid = dead.id();

    let stale = format!("spw-{dead_pid}-1-b1");
    let live = format!("spw-{}-999999-b1", std::process::id());
    for name in [&stale, &live] {
        let ok = Command::new("ip").args(["netns", "add", name]).status().unwrap();
        assert!(ok.success());
    }
    sweep_stale().unwrap();
    let listed = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
    let present = |name: &str| listed.lines().any(|line| line.split_whitespace().next() == Some(name));
    let (stale_present, live_present) = (present(&stale), present(&live));
    Command::new("ip").args(["netns", "del", &live]).status().unwrap();
    assert!(!stale_present, "stale namespace {stale} kept");
    assert!(live_present, "namespace {live} of a live process removed");
}
