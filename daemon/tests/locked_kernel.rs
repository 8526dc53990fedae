//! On a kernel that refuses tracing programs (played for one process tree by
//! `spillway_harness::locked_kernel`: every `BPF_PROG_TYPE_TRACING` load gets EPERM before
//! verification, as some machines of Spillway's kind answer everyone), the watcher takes the
//! tracepoint mode by itself, says why, and still counts: in this test binary re-executed
//! as such a process, and in the real `lbd agent` serving its reports. Needs root.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;
use std::time::Duration;

use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, connect, socket};
use spillway_harness::locked_kernel::refuse_tracing_programs;
use spillway_harness::{Host, Topology, TopologyConfig};
use spillway_logging::error_chain;
use spillway_model::ports_report::{Mode, parts};
use spillway_ports::{Scope, SockWatch, WatchOptions, WatcherMode, netns_inode};

/// Set when this binary runs as the locked-down process of
/// [`the_watcher_falls_back_to_tracepoints_and_says_why`].
const CHILD_ENV: &str = "SPILLWAY_LOCKED_KERNEL_CHILD";

fn udp_connected(host: &Host, to: SocketAddr, count: usize) -> Vec<OwnedFd> {
    host.in_netns(|| {
        (0..count)
            .map(|_| {
                let socket = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).expect("socket");
                let SocketAddr::V4(to) = to else { panic!("IPv4 only") };
                connect(socket.as_raw_fd(), &SockaddrIn::from(to)).expect("connect");
                socket
            })
            .collect()
    })
}

/// Not a test: what the locked-down child checks (see [`CHILD_ENV`]).
#[test]
#[ignore = "run by the_watcher_falls_back_to_tracepoints_and_says_why in a locked-down process"]
fn locked_down_child() {
    if std::env::var(CHILD_ENV).is_err() {
        return;
    }
    let forced = SockWatch::load(WatchOptions { mode: WatcherMode::Btf, scope: Scope::Own }).err().expect("btf is refused");
    assert!(forced.is_kernel_refusal(), "a refusal, not our error: {}", error_chain(&forced));
    let mut auto = SockWatch::load(WatchOptions::default()).expect("auto finds a mode");
    let status = auto.status().clone();
    assert_eq!(status.mode, Mode::Tracepoint, "{}", status.summary());
    assert_eq!(status.refused.iter().map(|r| r.mode).collect::<Vec<_>>(), [Mode::Btf]);
    assert!(status.refused[0].reason.contains("Operation not permitted"), "{:?}", status.refused);
    // It counts: a connected UDP socket of this namespace, on an ephemeral port.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.connect("127.0.0.1:9").unwrap();
    let report = auto.report(Default::default()).expect("a report");
    let ours = report.destinations.iter().find(|d| d.protocol == "udp" && d.remote_port == 9).map(|d| d.in_use);
    assert_eq!(ours, Some(1), "{report:#?}");
    // Refused connects found a port: no failure for want of one (the tracepoint mode's test
    // of the source port, on the kernel it exists for).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for _ in 0..5 {
        let refused = std::net::TcpStream::connect_timeout(&closed, Duration::from_secs(1)).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }
    let report = auto.report(Default::default()).expect("a report");
    assert!(report.destinations.iter().all(|d| d.failures == 0), "{report:#?}");
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    println!("child checks passed");
}

#[test]
fn the_watcher_falls_back_to_tracepoints_and_says_why() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe);
    child.args(["--exact", "locked_down_child", "--ignored", "--nocapture", "--test-threads=1"]).env(CHILD_ENV, "1");
    let armed = refuse_tracing_programs(&mut child).expect("arming the child");
    let child = child.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawning");
    let refused = armed.supervise().expect("supervising");
    let out = child.wait_with_output().expect("the child's output");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("child checks passed"), "child: {}\n{stdout}\n{stderr}", out.status);
    assert!(refused.refused() >= 2, "the child's tracing programs were refused ({}), not merely absent", refused.refused());
}

#[test]
fn the_agent_on_such_a_kernel_serves_tracepoint_reports() {
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).expect("topology");
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let pin_dir = topology.pin_dir().expect("pin dir").join("agent");
    let endpoint: SocketAddr = "127.0.0.1:9477".parse().unwrap();
    let mut cmd = backend.cmd(env!("CARGO_BIN_EXE_lbd"));
    cmd.args(["agent", "--iface", "eth0", "--xdp-mode", "generic", "--pin-dir", pin_dir.to_str().unwrap(), "--allow-from", "127.0.0.1/32"]);
    cmd.args(["--ports-listen", &endpoint.to_string()]);
    let armed = refuse_tracing_programs(&mut cmd).expect("arming the agent");
    let agent = backend.spawn_command("agent", cmd).expect("spawning the agent");
    let refused = armed.supervise().expect("supervising");
    agent.wait_for_output("ready", Duration::from_secs(20)).expect("agent ready");
    let log = agent.log();
    assert!(
        log.contains("event=sockwatch_mode_refused mode=btf") && log.contains("Operation not permitted"),
        "the refusal is logged: {log}"
    );
    assert!(log.contains("event=sockwatch_mode mode=tracepoint"), "the mode it fell back to is logged: {log}");
    assert!(refused.refused() >= 1);

    const SOCKETS: usize = 10;
    let held = udp_connected(backend, SocketAddr::new(client.ipv4().into(), 9400), SOCKETS);
    let report = backend
        .in_netns(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(spillway_ports::endpoint::fetch_report(endpoint, Duration::from_secs(5), None)).map(|(report, _)| report)
        })
        .expect("the agent's report");
    drop(held);
    let netns = netns_inode(backend.netns().path()).unwrap();
    let udp = report.destinations.iter().find(|d| d.netns == netns && d.protocol == "udp" && d.remote == IpAddr::from(client.ipv4()));
    assert_eq!(udp.map(|d| d.in_use), Some(SOCKETS as u64), "{report:#?}");
    let watcher = report.watcher.expect("the report says how it was watched");
    assert_eq!(watcher.mode, Mode::Tracepoint);
    assert_eq!(watcher.refused.iter().map(|r| r.mode).collect::<Vec<_>>(), [Mode::Btf]);
    assert!(watcher.watches(parts::CONNECT_FAILURES) && watcher.watches(parts::CLOSE_WAIT), "{watcher:#?}");
}
