//! The port-exhaustion watcher (`spillway_daemon::ports`) against real sockets, in every watcher
//! mode (btf, tracepoint, sock_diag), each forced: a client namespace exhausts a shrunken
//! ephemeral range towards one backend, 10,000 open/close cycles must leave no drift, UDP
//! sockets on ephemeral ports are counted like `ss` counts them, a server process that
//! never closes its accepted sockets is named as a leak suspect, `bind()` to port 0 and UDP
//! autobind failing on an exhausted range are counted per process (an explicit port that
//! is taken is not), and `lbd agent` serves the report read-only, also with only the
//! capabilities and system calls its systemd unit grants (and its --all-netns drop-in's).
//! What a mode cannot watch
//! (sock_diag: failures, event counts) must be reported as not watched. A mode the kernel
//! refuses is reported by the test and skipped; `auto_picks_the_best_mode_this_kernel_allows`
//! checks the choice. Needs root; everything lives in the harness's namespaces, removed on
//! drop (also on panic).

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, SockaddrIn, bind, connect, sendto, socket};
use spillway_harness::cluster::{XdpMode, agent_command};
use spillway_harness::connects::{outcomes, start_connect};
use spillway_harness::frames::tcp_reset_packet;
use spillway_harness::unit;
use spillway_harness::{Capture, Daemon, Host, Topology, TopologyConfig, send_ip_packet};
use spillway_model::ports_report::{Level, Mode, PortsReport, Thresholds, parts};
use spillway_ports::{Counts, PortKey, STAT_NAMES, Scope, SockWatch, WatchOptions, WatcherMode, netns_inode};

const PORT: u16 = 9300;
const LBD: &str = env!("CARGO_BIN_EXE_lbd");
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const EADDRNOTAVAIL: i32 = 99;

/// A TCP server in a backend namespace. Each connection: if the first byte is `S` the
/// server closes at once (the client then closes passively, no TIME_WAIT on its side);
/// otherwise it waits for the client's close (the client ends in TIME_WAIT).
/// Dropping it stops accepting; handler threads end when their client closes.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    fn start(host: &Host, port: u16) -> Server {
        let listener = host.in_netns(|| TcpListener::bind(("0.0.0.0", port))).expect("listening");
        listener.set_nonblocking(true).expect("nonblocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).expect("blocking stream");
                        thread::spawn(move || serve(stream));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(1)),
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        Server { stop, thread: Some(thread) }
    }
}

fn serve(mut stream: TcpStream) {
    let mut byte = [0u8; 1];
    if matches!(stream.read(&mut byte), Ok(1)) && byte[0] == b'S' {
        return;
    }
    let _ = std::io::copy(&mut stream, &mut std::io::sink());
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Sockets in `ss` inside `host` towards `dst:port`, in all states, or only in TIME-WAIT.
fn ss_count(host: &Host, dst: IpAddr, port: u16, state: &str) -> usize {
    let port = format!(":{port}");
    let out = host.run(&["ss", "-Htan", "state", state, "dst", &dst.to_string(), "dport", "=", &port]).expect("ss");
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

/// The destination's counts and its TIME_WAIT sockets now.
fn counts(watch: &mut SockWatch, key: &PortKey) -> (Counts, i64) {
    let counts = watch.snapshot().expect("snapshot").counts(key);
    (counts, counts.time_wait as i64)
}

/// Polls `check` every 20 ms until it returns true or `timeout` passes; returns the last result.
fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn within_2_percent(a: u64, b: u64) -> bool {
    a.abs_diff(b) as f64 <= 0.02 * a.max(b) as f64
}

/// The watcher forced into `mode`, watching every namespace (the harness's hosts are
/// namespaces of this one kernel). `None`, said on stderr, when the kernel refuses the mode;
/// any other failure is one.
fn load(mode: Mode) -> Option<SockWatch> {
    match SockWatch::load(WatchOptions { mode: mode.into(), scope: Scope::All }) {
        Ok(watch) => {
            assert_eq!(watch.status().mode, mode);
            Some(watch)
        }
        Err(e) if e.is_kernel_refusal() => {
            eprintln!("watcher mode {mode} is refused by this kernel, not tested here: {}", spillway_logging::error_chain(&e));
            None
        }
        Err(e) => panic!("loading the watcher in mode {mode}: {}", spillway_logging::error_chain(&e)),
    }
}

fn setup(mode: Mode) -> Option<(Topology, SockWatch)> {
    let watch = load(mode)?;
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).expect("topology");
    Some((topology, watch))
}

/// That `report` says `part` is not watched.
fn assert_not_watched(report: &PortsReport, part: &str) {
    let watcher = report.watcher.as_ref().expect("every report says how it was watched");
    assert!(watcher.not_watched.iter().any(|p| p.what == part), "{part} should be listed as not watched: {watcher:#?}");
}

/// How long these tests wait for an `--all-netns` agent's report: in sock_diag mode it walks
/// every network namespace of the host, and under `./x test` that includes the many of the
/// test binaries running beside this one. What the report says is checked, not how fast.
const ALL_NETNS_FETCH: Duration = Duration::from_secs(20);
#[test]
fn auto_picks_the_best_mode_this_kernel_allows() {
    let auto = SockWatch::load(WatchOptions { mode: WatcherMode::Auto, scope: Scope::All }).expect("auto always finds a mode");
    let status = auto.status().clone();
    drop(auto);
    let allowed: Vec<Mode> = Mode::ALL.into_iter().filter(|&mode| load(mode).is_some()).collect();
    eprintln!("modes this kernel allows: {allowed:?}; auto chose {}", status.summary());
    assert_eq!(Some(&status.mode), allowed.first(), "auto takes the best mode that loads");
    let refused: Vec<Mode> = status.refused.iter().map(|r| r.mode).collect();
    let better: Vec<Mode> = Mode::ALL.into_iter().filter(|&m| m < status.mode).collect();
    assert_eq!(refused, better, "every better mode was tried and its refusal kept");
    assert!(status.refused.iter().all(|r| !r.reason.is_empty()));
    assert!(status.watches(parts::TCP_PORTS) && status.watches(parts::UDP_PORTS) && status.watches(parts::CLOSE_WAIT));
}

fn exhaustion_is_seen_per_destination_with_failing_process(mode: Mode) {
    let Some((topology, mut watch)) = setup(mode) else { return };
    let failures_watched = watch.status().watches(parts::CONNECT_FAILURES);
    let expected_failures = if failures_watched { FAILURES } else { 0 };
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let _server = Server::start(backend, PORT);
    client.sysctl("net.ipv4.ip_local_port_range", "40000 40099").expect("shrinking the port range");
    let dst = SocketAddr::new(backend.ipv4().into(), PORT);
    let key = PortKey::tcp(netns_inode(client.netns().path()).unwrap(), client.ipv4().into(), dst.ip(), PORT);

    const CLOSED: usize = 30;
    const FAILURES: u64 = 5;
    let started = Instant::now();
    let (open, failed) = client.in_netns(|| {
        for _ in 0..CLOSED {
            drop(TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT).expect("connect"));
        }
        // Every port must be taken before connect fails.
        thread::sleep(Duration::from_millis(100));
        let mut open = Vec::new();
        let mut failed = 0;
        while failed < FAILURES {
            match TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT) {
                Ok(stream) => open.push(stream),
                Err(e) if e.raw_os_error() == Some(EADDRNOTAVAIL) => failed += 1,
                Err(e) => panic!("connect #{}: {e}", open.len()),
            }
            assert!(open.len() <= 100, "more connections than ports");
        }
        (open, failed)
    });
    assert_eq!(failed, FAILURES);
    // Every port is taken, by an open connection or a closed one's TIME_WAIT. (Now and then
    // the kernel ends a TIME_WAIT early on this kernel and hands its port to a new connect,
    // or after the last failed one: 2% slack, the watcher's own tolerance.)
    let in_time_wait = ss_count(client, dst.ip(), PORT, "time-wait");
    let taken = open.len() + in_time_wait;
    assert!((98..=100).contains(&taken), "{} open, {in_time_wait} in TIME-WAIT", open.len());

    let mut last = None;
    let seen = eventually(Duration::from_secs(2), || {
        let report = watch.report(Thresholds::default()).expect("report");
        let found = report.destinations.into_iter().find(|d| d.netns == key.netns && d.remote == dst.ip() && d.remote_port == PORT);
        let ok = found.as_ref().is_some_and(|d| d.utilisation.unwrap_or(0.0) >= 0.9 && d.failures >= expected_failures);
        last = found;
        ok
    });
    let usage = last.expect("destination in the report");
    assert!(seen, "within 2 s of the last failure: {usage:#?}");
    eprintln!("seen {:?} after the first connect: {usage:#?}", started.elapsed());
    assert_eq!(usage.level, Level::Critical);
    assert_eq!(usage.local, IpAddr::from(client.ipv4()));
    assert_eq!(usage.usable_ports, Some(100));
    assert_eq!(usage.failures, expected_failures);

    let report = watch.report(Thresholds::default()).unwrap();
    assert_eq!(report.watcher.as_ref().map(|w| w.mode), Some(mode));
    let ours: Vec<_> = report.failures.iter().filter(|f| f.netns == key.netns).collect();
    if failures_watched {
        assert_eq!(ours.len(), 1, "{ours:#?}");
        assert_eq!(ours[0].pid, std::process::id());
        assert_eq!(ours[0].failures, FAILURES);
        assert_eq!(ours[0].comm, "netns-c1", "the connecting thread's name");
        assert!(ours[0].cgroup_id > 0);
    } else {
        assert!(ours.is_empty(), "{ours:#?}");
        assert_not_watched(&report, parts::CONNECT_FAILURES);
    }
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["destinations"].as_array().is_some_and(|d| !d.is_empty()));
    assert_eq!(json["watcher"]["mode"], mode.name());

    // The watcher agrees with the kernel's socket table: the open sockets exactly; the
    // TIME_WAIT ones as an upper bound where they are counted from events (none tells
    // when one ends early), at most the closed connections; exactly where read from the
    // table (sock_diag).
    let exact_time_wait = mode == Mode::SockDiag;
    let agreed = eventually(Duration::from_secs(2), || {
        let (c, time_wait) = counts(&mut watch, &key);
        let all = ss_count(client, dst.ip(), PORT, "all") as i64;
        let tw = ss_count(client, dst.ip(), PORT, "time-wait") as i64;
        let time_wait_agrees = if exact_time_wait { time_wait == tw } else { (tw..=CLOSED as i64).contains(&time_wait) };
        c.active == all - tw && time_wait_agrees
    });
    let (c, time_wait) = counts(&mut watch, &key);
    let (all, tw) = (ss_count(client, dst.ip(), PORT, "all"), ss_count(client, dst.ip(), PORT, "time-wait"));
    assert!(agreed, "watcher active {} time_wait {time_wait} vs ss: {all} sockets, {tw} in TIME-WAIT", c.active);
    assert_eq!(c.active, open.len() as i64);
    drop(open);
}
spillway_harness::in_every_watcher_mode!(exhaustion_is_seen_per_destination_with_failing_process);

/// A connect to `dst` (which never answers) ended by a reset from the path: the SYN is
/// caught on the client's interface and a RST acknowledging it is sent to the client, from
/// `dst`, by `router` (any host on the way).
fn reset_by_path(client: &Host, router: &Host, dst: SocketAddrV4) -> Errno {
    let client_ip = client.ipv4();
    let (socket, syn) = client.in_netns(|| {
        let capture = Capture::open("eth0").expect("capturing on eth0");
        let socket = start_connect(dst.into(), 1).expect("connect");
        let syn = capture
            .find(Duration::from_secs(2), |p| p.len() >= 40 && p[9] == 6 && p[16..20] == dst.ip().octets() && p[33] & 0x02 != 0)
            .expect("capture")
            .expect("the SYN leaves the client");
        (socket, syn)
    });
    let header = usize::from(syn[0] & 0x0f) * 4;
    let sport = u16::from_be_bytes([syn[header], syn[header + 1]]);
    let seq = u32::from_be_bytes(syn[header + 4..header + 8].try_into().unwrap());
    let reset = tcp_reset_packet(dst, SocketAddrV4::new(client_ip, sport), seq.wrapping_add(1));
    router.in_netns(|| send_ip_packet(client_ip.into(), &reset)).expect("sending the reset");
    outcomes(std::slice::from_ref(&socket), Duration::from_secs(2))[0]
}

/// Connects that fail after a port was found, or that are abandoned, are not exhaustion:
/// refused (the port is closed), reset from the path, timed out (nobody answers the SYNs),
/// refused by an ICMP host unreachable, and non-blocking connects closed before they
/// complete. Each leaves a socket in SYN_SENT going to CLOSE with its port already released,
/// which is how exhaustion looked to the watcher before (a dependency that is down must not
/// make a backend look short of ports).
fn failed_connects_that_had_a_port_are_not_exhaustion(mode: Mode) {
    let Some((topology, mut watch)) = setup(mode) else { return };
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let client_ns = netns_inode(client.netns().path()).unwrap();
    let refused = SocketAddrV4::new(backend.ipv4(), 9341);
    // A neighbour that swallows every frame: SYNs to it go unanswered.
    let silent_ip = Ipv4Addr::new(10, 0, 0, 98);
    client
        .run(&["ip", "neigh", "replace", &silent_ip.to_string(), "lladdr", "02:00:00:00:99:98", "dev", "eth0", "nud", "permanent"])
        .unwrap();
    let (timed_out, abandoned, reset) =
        (SocketAddrV4::new(silent_ip, 9342), SocketAddrV4::new(silent_ip, 9343), SocketAddrV4::new(silent_ip, 9344));
    // A network the backend routes nowhere: it answers ICMP host unreachable.
    let unreachable = SocketAddrV4::new(Ipv4Addr::new(198, 18, 77, 1), 9345);
    backend.sysctl("net.ipv4.ip_forward", "1").unwrap();
    backend.sysctl("net.ipv4.icmp_ratelimit", "0").unwrap();
    backend.run(&["ip", "route", "add", "unreachable", "198.18.77.0/24"]).unwrap();
    client.run(&["ip", "route", "add", "198.18.77.0/24", "via", &backend.ipv4().to_string()]).unwrap();

    const EACH: usize = 10;
    // The backend sends at most 5 host unreachables at once to one peer (the kernel's
    // route.error_burst, a global sysctl this test leaves alone).
    const UNREACHABLE: usize = 4;
    let (refusals, timeouts, unreachables, abandons) = client.in_netns(|| {
        let refusals: Vec<_> = (0..EACH).map(|_| TcpStream::connect_timeout(&refused.into(), CONNECT_TIMEOUT).map(drop)).collect();
        let timeouts: Vec<OwnedFd> = (0..EACH).map(|_| start_connect(timed_out.into(), 1).unwrap()).collect();
        let unreachables: Vec<OwnedFd> = (0..UNREACHABLE).map(|_| start_connect(unreachable.into(), 1).unwrap()).collect();
        let abandons = (0..EACH).map(|_| drop(start_connect(abandoned.into(), 1).unwrap())).count();
        // One SYN and one retransmission: ETIMEDOUT after about 3 s.
        let unreachables = outcomes(&unreachables, Duration::from_secs(6));
        (refusals, outcomes(&timeouts, Duration::from_secs(6)), unreachables, abandons)
    });
    assert!(refusals.iter().all(|r| r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)), "{refusals:?}");
    assert!(timeouts.iter().all(|&e| e == Errno::ETIMEDOUT), "{timeouts:?}");
    assert!(unreachables.iter().all(|&e| e == Errno::EHOSTUNREACH), "{unreachables:?}");
    assert_eq!(abandons, EACH);
    let resets: Vec<Errno> = (0..3).map(|_| reset_by_path(client, backend, reset)).collect();
    assert!(resets.iter().all(|&e| e == Errno::ECONNREFUSED), "a reset in SYN_SENT refuses: {resets:?}");

    let report = watch.report(Thresholds::default()).expect("report");
    let ours: Vec<_> = report.destinations.iter().filter(|d| d.netns == client_ns).collect();
    assert!(ours.iter().all(|d| d.failures == 0), "no destination counts a failure: {ours:#?}");
    let failing: Vec<_> = report.failures.iter().filter(|f| f.netns == client_ns).collect();
    assert!(failing.is_empty(), "no process is blamed for a want of ports: {failing:#?}");
    // The watcher did see every one of those connects (so the silence above means something).
    if watch.status().watches(parts::OPENS) {
        let snapshot = watch.snapshot().expect("snapshot");
        let dsts = [(refused, EACH), (timed_out, EACH), (unreachable, UNREACHABLE), (abandoned, EACH), (reset, resets.len())];
        for (dst, n) in dsts {
            let key = PortKey::tcp(client_ns, client.ipv4().into(), (*dst.ip()).into(), dst.port());
            let c = snapshot.counts(&key);
            assert_eq!((c.opened, c.active, c.failures), (n as u64, 0, 0), "{dst}: opened, still open, failures");
        }
    }
}
spillway_harness::in_every_watcher_mode!(failed_connects_that_had_a_port_are_not_exhaustion);

fn ten_thousand_cycles_return_to_baseline(mode: Mode) {
    let Some((topology, mut watch)) = setup(mode) else { return };
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let server = Server::start(backend, PORT);
    let dst = SocketAddr::new(backend.ipv4().into(), PORT);
    let key = PortKey::tcp(netns_inode(client.netns().path()).unwrap(), client.ipv4().into(), dst.ip(), PORT);
    let baseline = counts(&mut watch, &key);

    const CYCLES: u64 = 10_000;
    let started = Instant::now();
    let time_wait = client.in_netns(|| {
        let mut time_wait = 0;
        for i in 0..CYCLES {
            let mut stream = TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT).unwrap_or_else(|e| panic!("connect #{i}: {e}"));
            match i % 3 {
                // Client closes first: TIME_WAIT on the client.
                0 => {
                    stream.write_all(b"C").unwrap();
                    time_wait += 1;
                }
                // Abortive close (RST): straight to CLOSE.
                1 => set_linger_zero(&stream),
                // Server closes first: CLOSE_WAIT, LAST_ACK, CLOSE.
                _ => {
                    stream.write_all(b"S").unwrap();
                    let _ = std::io::copy(&mut stream, &mut std::io::sink());
                }
            }
        }
        time_wait
    });
    eprintln!("{CYCLES} cycles in {:?}", started.elapsed());

    let last_close = Instant::now();
    let settled = eventually(Duration::from_secs(5), || {
        let (c, tw) = counts(&mut watch, &key);
        c.active == baseline.0.active && tw == baseline.1 + ss_count(client, dst.ip(), PORT, "time-wait") as i64
    });
    let (c, tw) = counts(&mut watch, &key);
    let ss_tw = ss_count(client, dst.ip(), PORT, "time-wait");
    assert!(settled, "baseline {:?}, now active {} time_wait {tw}, ss TIME-WAIT {ss_tw}", baseline.0.active, c.active);
    if watch.status().watches(parts::OPENS) {
        assert_eq!(c.opened - baseline.0.opened, CYCLES);
        assert_eq!(c.time_wait_total - baseline.0.time_wait_total, time_wait, "every client-closed connection went to TIME_WAIT");
    } else {
        assert_eq!((c.opened, c.time_wait_total), (0, 0), "no event counts without events");
        assert_not_watched(&watch.report(Thresholds::default()).unwrap(), parts::OPENS);
    }
    assert_eq!(tw - baseline.1, time_wait as i64);
    let snapshot = watch.snapshot().unwrap();
    assert_eq!(snapshot.stats, [0; STAT_NAMES.len()], "nothing dropped for a full map");

    if mode == Mode::SockDiag {
        // TIME_WAIT was read from the kernel's table, not estimated from events: there is
        // no estimate to see expire.
        drop(server);
        return;
    }
    // TIME_WAIT lasts TCP_TIMEWAIT_LEN (60 s): afterwards the kernel and the watcher both
    // show none.
    let expiry = Duration::from_secs(u64::from(spillway_ports::TIMEWAIT_LEN_SECS) + 2);
    thread::sleep(expiry.saturating_sub(last_close.elapsed()));
    let expired =
        eventually(Duration::from_secs(3), || counts(&mut watch, &key).1 == 0 && ss_count(client, dst.ip(), PORT, "time-wait") == 0);
    let (c, tw) = counts(&mut watch, &key);
    assert!(expired, "active {} time_wait {tw}, ss {}", c.active, ss_count(client, dst.ip(), PORT, "time-wait"));
    assert_eq!(c.active, 0);
    drop(server);
}
spillway_harness::in_every_watcher_mode!(ten_thousand_cycles_return_to_baseline);

fn set_linger_zero(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid socket and a correctly sized option value.
    let rc = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
}

/// Set in the environment of this test binary re-executed as a server process (see
/// [`server_process`]): `leak:PORT` or `tidy:PORT`.
const SERVER_ENV: &str = "SPILLWAY_PORTS_TEST_SERVER";
const LEAK_PORT: u16 = 9310;
const TIDY_PORT: u16 = 9311;

/// Not a test: the body of the server processes [`leaking_process_is_named_as_a_leak_suspect`]
/// starts by re-executing this binary with [`SERVER_ENV`] set (a leak belongs to a process,
/// so the server cannot be a thread of the test). `leak` accepts and holds every connection
/// without reading or closing it; `tidy` reads each to its end and closes it.
#[test]
#[ignore = "a server process started by leaking_process_is_named_as_a_leak_suspect"]
fn server_process() {
    let Ok(spec) = std::env::var(SERVER_ENV) else { return };
    let (mode, port) = spec.split_once(':').expect("MODE:PORT");
    // Names the process (its main thread), which is what the report shows.
    std::fs::write("/proc/self/comm", format!("{mode}-server")).expect("naming the process");
    let listener = TcpListener::bind(("0.0.0.0", port.parse::<u16>().expect("port"))).expect("listening");
    println!("ready");
    let mut held = Vec::new();
    for stream in listener.incoming() {
        let mut stream = stream.expect("accept");
        match mode {
            "leak" => held.push(stream),
            _ => drop(thread::spawn(move || std::io::copy(&mut stream, &mut std::io::sink()))),
        }
    }
}

/// A server process in `host`, run by the `wrapper` command when there is one (e.g.
/// `setpriv --reuid ...`).
fn start_server_process(host: &Host, mode: &str, port: u16, wrapper: &[&str]) -> Daemon {
    let exe = std::env::current_exe().expect("this test binary");
    let mut cmd: Command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut cmd = host.cmd(program);
            cmd.args(rest).arg(exe);
            cmd
        }
        None => host.cmd(exe),
    };
    cmd.args(["--exact", "server_process", "--ignored", "--nocapture", "--test-threads=1"]).env(SERVER_ENV, format!("{mode}:{port}"));
    let daemon = host.spawn_command(&format!("{mode}-server"), cmd).expect("spawning a server process");
    daemon.wait_for_output("ready", Duration::from_secs(10)).expect("server process ready");
    daemon
}

/// Sockets in `ss` inside `host` with local port `port` in `state`.
fn ss_local(host: &Host, port: u16, state: &str) -> usize {
    let port = format!(":{port}");
    let out = host.run(&["ss", "-Htan", "state", state, "sport", "=", &port]).expect("ss");
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

fn leaking_process_is_named_as_a_leak_suspect(mode: Mode) {
    let Some((topology, mut watch)) = setup(mode) else { return };
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let leaky = start_server_process(backend, "leak", LEAK_PORT, &[]);
    let tidy = start_server_process(backend, "tidy", TIDY_PORT, &[]);
    let netns = netns_inode(backend.netns().path()).unwrap();
    const CONNECTIONS: usize = 20;
    const THRESHOLD_S: u64 = 3;
    let thresholds = Thresholds { close_wait_secs: THRESHOLD_S, ..Thresholds::default() };

    // Connect and close at once: some FINs reach the leaky server before it has accepted
    // (no socket file yet when CLOSE_WAIT begins), the others after.
    client.in_netns(|| {
        for port in [LEAK_PORT, TIDY_PORT] {
            let dst = SocketAddr::new(backend.ipv4().into(), port);
            for _ in 0..CONNECTIONS {
                drop(TcpStream::connect_timeout(&dst, CONNECT_TIMEOUT).expect("connect"));
            }
        }
    });
    let closed = Instant::now();
    let settled = eventually(Duration::from_secs(2), || {
        ss_local(backend, LEAK_PORT, "close-wait") == CONNECTIONS && ss_local(backend, TIDY_PORT, "connected") == 0
    });
    let (leaking, tidy_left) = (ss_local(backend, LEAK_PORT, "close-wait"), ss_local(backend, TIDY_PORT, "connected"));
    assert!(settled, "ss: {leaking} CLOSE-WAIT sockets of the leaky server, {tidy_left} of the tidy one");

    let mut report = || watch.report(thresholds).expect("report");
    let ours = |report: &PortsReport| report.leak_suspects.iter().filter(|s| s.netns == netns).cloned().collect::<Vec<_>>();
    let young = ours(&report());
    if closed.elapsed() < Duration::from_secs(THRESHOLD_S - 1) {
        assert!(young.is_empty(), "sockets younger than the threshold are no suspects: {young:#?}");
    }

    let mut last = Vec::new();
    let named = eventually(Duration::from_secs(THRESHOLD_S + 3), || {
        last = ours(&report());
        last.iter().any(|s| s.pid == Some(leaky.pid()))
    });
    assert!(named, "no suspect named {}s after the closes: {last:#?}", closed.elapsed().as_secs());
    eprintln!("named {:?} after the closes: {last:#?}", closed.elapsed());
    assert_eq!(last.len(), 1, "only the leaky server (the tidy one closed its sockets): {last:#?}");
    let suspect = &last[0];
    assert_eq!(suspect.pid, Some(leaky.pid()));
    assert_eq!(suspect.comm.as_deref(), Some("leak-server"));
    assert_eq!(suspect.count, CONNECTIONS as u64, "every socket, accepted before or after the FIN");
    assert_eq!(suspect.local_ports, [LEAK_PORT]);
    assert!(suspect.oldest_age_secs >= THRESHOLD_S, "{suspect:#?}");
    assert!(suspect.cgroup_id > 0);
    assert!(tidy.is_running(), "the tidy server is alive and not named");
    assert_eq!(watch.snapshot().unwrap().stats, [0; STAT_NAMES.len()], "nothing dropped");

    // The leak ends with the process: its sockets close (CLOSE_WAIT -> LAST_ACK).
    drop(leaky);
    let gone = eventually(Duration::from_secs(3), || ours(&watch.report(thresholds).expect("report")).is_empty());
    assert!(gone, "suspects left after the leaky server exited");
}
spillway_harness::in_every_watcher_mode!(leaking_process_is_named_as_a_leak_suspect);

/// A UDP socket of the calling thread's namespace, not bound. Close-on-exec, or processes
/// other tests spawn meanwhile would hold it open.
fn udp_socket() -> OwnedFd {
    socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None).expect("socket")
}

fn v4(addr: SocketAddr) -> SockaddrIn {
    let SocketAddr::V4(addr) = addr else { panic!("IPv4 only") };
    SockaddrIn::from(addr)
}

/// UDP sockets in `ss` inside `host` towards `dst`, apart from those on local port `except`.
fn ss_udp(host: &Host, dst: SocketAddr, except: u16) -> usize {
    let port = format!(":{}", dst.port());
    let out = host.run(&["ss", "-Hun", "state", "all", "dst", &dst.ip().to_string(), "dport", "=", &port]).expect("ss");
    out.lines().filter(|l| !l.trim().is_empty() && !l.contains(&format!(":{except} "))).count()
}

fn udp_sockets_on_ephemeral_ports_are_counted_per_destination(mode: Mode) {
    let Some((topology, mut watch)) = setup(mode) else { return };
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    client.sysctl("net.ipv4.ip_local_port_range", "40000 40999").expect("setting the port range");
    let (client_ns, backend_ns) = (netns_inode(client.netns().path()).unwrap(), netns_inode(backend.netns().path()).unwrap());
    const PORT: u16 = 9320;
    const EXPLICIT_PORT: u16 = 5353;
    let dst = SocketAddr::new(backend.ipv4().into(), PORT);
    let any = IpAddr::from(Ipv4Addr::UNSPECIFIED);
    let connected = PortKey::udp(client_ns, client.ipv4().into(), dst.ip(), PORT);
    let unconnected = PortKey::udp(client_ns, any, any, 0);
    let from_backend = PortKey::udp(backend_ns, backend.ipv4().into(), client.ipv4().into(), PORT);

    const CONNECTED: usize = 400;
    const SENDERS: usize = 5;
    let sockets = client.in_netns(|| {
        let mut sockets = Vec::new();
        // connect() autobinds before it sets the addresses; the last one binds port 0 first.
        for i in 0..CONNECTED {
            let socket = udp_socket();
            if i == CONNECTED - 1 {
                bind(socket.as_raw_fd(), &v4(SocketAddr::new(any, 0))).expect("bind port 0");
            }
            connect(socket.as_raw_fd(), &v4(dst)).expect("connect");
            sockets.push(socket);
        }
        // sendto() autobinds too, leaving the socket unconnected.
        for _ in 0..SENDERS {
            let socket = udp_socket();
            sendto(socket.as_raw_fd(), b"x", &v4(dst), MsgFlags::empty()).expect("sendto");
            sockets.push(socket);
        }
        // A port bind() named is not ephemeral.
        let explicit = udp_socket();
        bind(explicit.as_raw_fd(), &v4(SocketAddr::V4(SocketAddrV4::new(client.ipv4(), EXPLICIT_PORT)))).expect("bind");
        connect(explicit.as_raw_fd(), &v4(dst)).expect("connect");
        sockets.push(explicit);
        sockets
    });
    let replies = backend.in_netns(|| {
        (0..3)
            .map(|_| {
                let socket = udp_socket();
                connect(socket.as_raw_fd(), &v4(SocketAddr::new(client.ipv4().into(), PORT))).expect("connect");
                socket
            })
            .collect::<Vec<_>>()
    });

    let snapshot = watch.snapshot().expect("snapshot");
    let ss = ss_udp(client, dst, EXPLICIT_PORT);
    assert_eq!(ss_udp(client, dst, 0), CONNECTED + 1, "ss sees every connected socket");
    let counted = snapshot.udp_count(&connected);
    assert!(within_2_percent(ss as u64, counted), "watcher {counted} vs ss {ss} sockets on ephemeral ports");
    assert_eq!(counted, CONNECTED as u64);
    assert_eq!(snapshot.udp_count(&unconnected), SENDERS as u64);
    assert_eq!(snapshot.udp_count(&from_backend), 3, "the other namespace is counted apart");
    assert_eq!(snapshot.stats, [0; STAT_NAMES.len()], "nothing dropped");

    let report = watch.report(Thresholds::default()).expect("report");
    let usage = report
        .destinations
        .iter()
        .find(|d| d.netns == client_ns && d.protocol == "udp" && d.remote == dst.ip())
        .expect("the UDP destination in the report");
    assert_eq!((usage.in_use, usage.usable_ports), (CONNECTED as u64, Some(1000)));
    // Every UDP socket of the namespace on an ephemeral port competes for the range.
    assert_eq!(usage.utilisation, Some((CONNECTED + SENDERS) as f64 / 1000.0));

    drop(sockets);
    drop(replies);
    let mut last = (0, 0, 0);
    let back = eventually(Duration::from_secs(2), || {
        let snapshot = watch.snapshot().expect("snapshot");
        last = (snapshot.udp_count(&connected), snapshot.udp_count(&unconnected), snapshot.udp_count(&from_backend));
        last == (0, 0, 0)
    });
    assert!(back, "after closing: (connected, unconnected, other namespace) = {last:?}");
    assert_eq!(ss_udp(client, dst, 0), 0);
}
spillway_harness::in_every_watcher_mode!(udp_sockets_on_ephemeral_ports_are_counted_per_destination);

fn bind_and_udp_autobind_failures_are_counted_per_process(mode: Mode) {
    let Some((topology, mut watch)) = setup(mode) else { return };
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    // Four ports, shared by UDP bind(0) and autobind (TCP has its own table of them).
    client.sysctl("net.ipv4.ip_local_port_range", "40000 40003").expect("shrinking the port range");
    let client_ns = netns_inode(client.netns().path()).unwrap();
    const PORT: u16 = 9330;
    const BIND_FAILURES: u64 = 3;
    let dst = SocketAddr::new(backend.ipv4().into(), PORT);
    let any = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0);
    let (held, errnos) = client.in_netns(|| {
        let mut held = Vec::new();
        let mut failed = 0;
        // bind(port 0) until the range is exhausted, then a few more.
        while failed < BIND_FAILURES {
            let socket = udp_socket();
            match bind(socket.as_raw_fd(), &v4(any)) {
                Ok(()) => held.push(socket),
                Err(Errno::EADDRINUSE) => failed += 1,
                Err(e) => panic!("bind #{}: {e}", held.len()),
            }
            assert!(held.len() <= 4, "more sockets than ports");
        }
        // A port that is taken, asked for by number: EADDRINUSE, but not exhaustion.
        let explicit = bind(udp_socket().as_raw_fd(), &v4(SocketAddr::new(any.ip(), 40000)));
        // Autobind with the range exhausted.
        let connected = connect(udp_socket().as_raw_fd(), &v4(dst));
        // TCP bind(port 0) exhausts its own four ports.
        let mut tcp_bind = Ok(());
        for _ in 0..5 {
            let socket = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
            tcp_bind = bind(socket.as_raw_fd(), &v4(any));
            if tcp_bind.is_err() {
                break;
            }
            held.push(socket);
        }
        (held, [explicit.err(), connected.err(), tcp_bind.err()])
    });
    // What this kernel returns (inet_autobind's EAGAIN reaches userspace for UDP).
    let expected = [Some(Errno::EADDRINUSE), Some(Errno::EAGAIN), Some(Errno::EADDRINUSE)];
    assert_eq!(errnos, expected, "explicit bind, UDP connect, TCP bind(0)");
    assert_eq!(held.len(), 8, "four UDP and four TCP ports");

    let report = watch.report(Thresholds::default()).expect("report");
    if !watch.status().watches(parts::BIND_FAILURES) {
        assert!(report.failures.iter().all(|f| f.netns != client_ns), "{:#?}", report.failures);
        assert_not_watched(&report, parts::BIND_FAILURES);
        return;
    }
    let mut ours: Vec<_> = report
        .failures
        .iter()
        .filter(|f| f.netns == client_ns)
        .map(|f| {
            (f.protocol.as_str(), f.call.as_str(), f.errno.as_str(), f.local.to_string(), f.remote.to_string(), f.remote_port, f.failures)
        })
        .collect();
    ours.sort();
    let unspecified = any.ip().to_string();
    let backend_ip = dst.ip().to_string();
    let row = |proto, call, errno, local: &String, remote: &String, port, n| (proto, call, errno, local.clone(), remote.clone(), port, n);
    assert_eq!(
        ours,
        [
            row("tcp", "bind", "EADDRINUSE", &unspecified, &unspecified, 0, 1),
            row("udp", "bind", "EADDRINUSE", &unspecified, &unspecified, 0, BIND_FAILURES),
            row("udp", "connect", "EAGAIN", &unspecified, &backend_ip, PORT, 1),
        ],
        "the explicit port that was taken is not counted"
    );
    for failure in report.failures.iter().filter(|f| f.netns == client_ns) {
        assert_eq!((failure.pid, failure.comm.as_str()), (std::process::id(), "netns-c1"), "{failure:#?}");
        assert!(failure.cgroup_id > 0);
    }
    // Per destination: the port-0 binds share the row of the unconnected UDP sockets.
    let row = |remote: IpAddr, protocol: &str| {
        report.destinations.iter().find(|d| d.netns == client_ns && d.protocol == protocol && d.remote == remote && d.local == any.ip())
    };
    let unconnected = row(any.ip(), "udp").expect("the unconnected UDP row");
    assert_eq!((unconnected.in_use, unconnected.failures, unconnected.level), (4, BIND_FAILURES, Level::Critical));
    assert_eq!(row(dst.ip(), "udp").map(|d| d.failures), Some(1), "the UDP connect");
    assert_eq!(row(any.ip(), "tcp").map(|d| d.failures), Some(1));
    assert_eq!(report.dropped.pending_table_full, 0);
    drop(held);
}
spillway_harness::in_every_watcher_mode!(bind_and_udp_autobind_failures_are_counted_per_process);

fn the_agent_serves_its_hosts_port_report_read_only(mode: Mode) {
    // The agents load the watcher themselves; this says whether the kernel allows the mode.
    let Some(watch) = load(mode) else { return };
    drop(watch);
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).expect("topology");
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let pin_dir = topology.pin_dir().expect("pin dir").join("agent");
    let endpoint: SocketAddr = "127.0.0.1:9477".parse().unwrap();
    let listen = endpoint.to_string();
    let extra = ["--watcher-mode", mode.name(), "--allow-from", "127.0.0.1/32", "--ports-listen", &listen];
    let agent = backend.spawn(&agent_command(LBD.as_ref(), XdpMode::Generic, &pin_dir, &extra)).expect("lbd agent");
    // Not just "ready": an exiting agent's "Address already in use" would match.
    agent.wait_for_output("event=ready", Duration::from_secs(10)).expect("agent ready");
    assert!(agent.log().contains(&format!("event=ports_endpoint_listening url=http://{endpoint}/ports")), "{}", agent.log());

    // An agent with --all-netns (on the client host) reports the other namespaces too.
    let everywhere: SocketAddr = "127.0.0.1:9478".parse().unwrap();
    let all_pin_dir = topology.pin_dir().expect("pin dir").join("agent-all");
    let listen = everywhere.to_string();
    // Its ports endpoint takes the metrics' default port, and a listener it cannot bind
    // would stop it: no metrics.
    let extra = [
        "--all-netns",
        "--watcher-mode",
        mode.name(),
        "--allow-from",
        "127.0.0.1/32",
        "--metrics-listen",
        "off",
        "--ports-listen",
        &listen,
    ];
    let all_agent = client.spawn(&agent_command(LBD.as_ref(), XdpMode::Generic, &all_pin_dir, &extra)).expect("lbd agent --all-netns");
    all_agent.wait_for_output("event=ready", Duration::from_secs(10)).expect("agent ready");

    const SOCKETS: usize = 10;
    let connected_to = |host: &spillway_harness::Host, to: IpAddr| {
        host.in_netns(|| {
            (0..SOCKETS)
                .map(|_| {
                    let socket = udp_socket();
                    connect(socket.as_raw_fd(), &v4(SocketAddr::new(to, PORT))).expect("connect");
                    socket
                })
                .collect::<Vec<OwnedFd>>()
        })
    };
    // Created after the agent's watcher loaded: in the agent's namespace, and in another.
    let ours = connected_to(backend, client.ipv4().into());
    let theirs = connected_to(client, backend.ipv4().into());
    let fetch = |host: &spillway_harness::Host, at: SocketAddr| {
        host.in_netns(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(spillway_ports::endpoint::fetch_report(at, ALL_NETNS_FETCH, None)).map(|(report, _)| report)
        })
    };
    let report = fetch(backend, endpoint).expect("the agent's report");
    let refused = backend.in_netns(|| {
        let mut stream = TcpStream::connect(endpoint).expect("connect to the endpoint");
        stream.write_all(b"POST /ports HTTP/1.0\r\n\r\n").unwrap();
        let mut refused = String::new();
        stream.read_to_string(&mut refused).unwrap();
        refused
    });
    let all = fetch(client, everywhere).expect("the --all-netns agent's report");
    drop((ours, theirs));

    let (netns, client_netns) = (netns_inode(backend.netns().path()).unwrap(), netns_inode(client.netns().path()).unwrap());
    let udp = |report: &spillway_model::ports_report::PortsReport, netns: u32, to: IpAddr| {
        report.destinations.iter().find(|d| d.netns == netns && d.protocol == "udp" && d.remote == to).map(|d| d.in_use)
    };
    assert_eq!(udp(&report, netns, client.ipv4().into()), Some(SOCKETS as u64), "{report:#?}");
    assert!(report.destinations.iter().all(|d| d.netns == netns), "a host reports its own namespace only: {report:#?}");
    assert_eq!(udp(&all, netns, client.ipv4().into()), Some(SOCKETS as u64), "--all-netns sees the backend's sockets");
    assert_eq!(udp(&all, client_netns, backend.ipv4().into()), Some(SOCKETS as u64), "and its own");
    assert!(refused.starts_with("HTTP/1.0 405 "), "{refused}");
    assert_eq!(report.watcher.as_ref().map(|w| w.mode), Some(mode), "the report says how it was watched");
    assert!(agent.log().contains(&format!("event=sockwatch_mode mode={mode}")), "the mode is logged: {}", agent.log());
}
spillway_harness::in_every_watcher_mode!(the_agent_serves_its_hosts_port_report_read_only);

/// `lbd agent` with only what its unit grants (the capabilities, NoNewPrivileges=, system
/// call filter and RestrictNamespaces= of deploy/systemd/spillway-agent.service, read from
/// the file), its watcher forced into
/// `mode`: it loads, reports its namespace's sockets with their port range, and names a
/// leaking process of another user. An agent with --all-netns and the unit's drop-in for it
/// reports the backend's sockets, with their range, from another namespace.
fn the_agent_works_with_only_what_its_unit_grants(mode: Mode) {
    // The agents load the watcher themselves; this says whether the kernel allows the mode,
    // and what it watches for full root.
    let Some(watch) = load(mode) else { return };
    let unwatched =
        |status: &spillway_model::ports_report::WatcherStatus| status.not_watched.iter().map(|p| p.what.clone()).collect::<Vec<_>>();
    let as_root = unwatched(watch.status());
    drop(watch);
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).expect("topology");
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let leaky = start_server_process(backend, "leak", LEAK_PORT, &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]);
    let pin_dir = topology.pin_dir().expect("pin dir");
    let endpoint: SocketAddr = "127.0.0.1:9477".parse().unwrap();
    let spawn = |host: &Host, files: &[std::path::PathBuf], pins: &str, extra: &[&str]| {
        let listen = endpoint.to_string();
        let flags = [
            ["--watcher-mode", mode.name()],
            ["--allow-from", "127.0.0.1/32"],
            ["--ports-listen", &listen],
            ["--metrics-listen", "off"],
            ["--leak-after-s", "1"],
        ];
        let flags: Vec<&str> = flags.iter().flatten().chain(extra).copied().collect();
        let wrapper = unit::setpriv_wrapper(files).expect("the unit's capabilities");
        let mut cmd = Command::new(&wrapper[0]);
        cmd.args(&wrapper[1..]).args(agent_command(LBD.as_ref(), XdpMode::Generic, &pin_dir.join(pins), &flags));
        let netns = std::fs::File::open(host.netns().path()).expect("the host's namespace");
        unit::SyscallFilter::read(files).expect("the unit's system call filter").apply(&mut cmd, netns);
        let agent = host.spawn_command("lbd-agent", cmd).expect("lbd agent");
        agent.wait_for_output("event=ready", Duration::from_secs(20)).unwrap_or_else(|e| panic!("{e:#}: {}", agent.log()));
        agent
    };
    let agent_unit = unit::deploy_file("spillway-agent.service");
    let agent = spawn(backend, std::slice::from_ref(&agent_unit), "agent", &[]);
    let all = spawn(client, &[agent_unit, unit::deploy_file("spillway-agent-all-netns.conf")], "agent-all", &["--all-netns"]);

    const SOCKETS: usize = 10;
    const LEAKS: usize = 3;
    let to_client = SocketAddr::new(client.ipv4().into(), PORT);
    let held = backend.in_netns(|| {
        (0..SOCKETS)
            .map(|_| {
                let socket = udp_socket();
                connect(socket.as_raw_fd(), &v4(to_client)).expect("connect");
                socket
            })
            .collect::<Vec<OwnedFd>>()
    });
    // Closed by the client, never by the server: CLOSE_WAIT sockets of a process of nobody's.
    client.in_netns(|| {
        for _ in 0..LEAKS {
            drop(TcpStream::connect_timeout(&SocketAddr::new(backend.ipv4().into(), LEAK_PORT), CONNECT_TIMEOUT).expect("connect"));
        }
    });
    let fetch = |host: &Host| {
        host.in_netns(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(spillway_ports::endpoint::fetch_report(endpoint, ALL_NETNS_FETCH, None)).map(|(report, _)| report)
        })
    };
    let netns = netns_inode(backend.netns().path()).unwrap();
    let seen = |report: &PortsReport| {
        report.destinations.iter().any(|d| {
            d.netns == netns && d.protocol == "udp" && d.remote == to_client.ip() && d.in_use == SOCKETS as u64 && d.port_range.is_some()
        })
    };
    let named = |report: &PortsReport| {
        report.leak_suspects.iter().any(|s| s.netns == netns && s.pid == Some(leaky.pid()) && s.comm.as_deref() == Some("leak-server"))
    };
    let (mut own, mut everywhere) = (None, None);
    let done = eventually(Duration::from_secs(10), || {
        own = fetch(backend).ok();
        everywhere = fetch(client).ok();
        own.as_ref().is_some_and(|r| seen(r) && named(r)) && everywhere.as_ref().is_some_and(seen)
    });
    drop(held);
    assert!(
        done,
        "the agent's report (its UDP sockets with their port range, the leak named):\n{own:#?}\n--all-netns's (the backend's \
         sockets with their range):\n{everywhere:#?}\n{}\n{}",
        agent.log(),
        all.log()
    );
    let watcher = own.and_then(|r| r.watcher).expect("every report says how it was watched");
    assert_eq!(unwatched(&watcher), as_root, "the unit's agent watches less than root's: {watcher:#?}");
    for agent in [&agent, &all] {
        assert!(agent.log().contains(&format!("event=sockwatch_mode mode={mode}")), "{}", agent.log());
        assert!(agent.is_running(), "{}", agent.log());
    }
}
spillway_harness::in_every_watcher_mode!(the_agent_works_with_only_what_its_unit_grants);
