//! The port-exhaustion watcher (`spillway::ports`) against real sockets: a client namespace
//! exhausts a shrunken ephemeral range towards one backend, and 10,000 open/close cycles
//! must leave no drift. Needs root; everything lives in the harness's namespaces, removed
//! on drop (also on panic).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use spillway::ports::{Level, NetnsResolver, PortCounts, PortKey, SockWatch, Thresholds, netns_inode};
use spillway_harness::{Host, Topology, TopologyConfig};

const PORT: u16 = 9300;
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
fn counts(watch: &SockWatch, key: &PortKey) -> (PortCounts, i64) {
    let snapshot = watch.snapshot().expect("snapshot");
    let counts = snapshot.counts(key);
    (counts, counts.time_wait_at(snapshot.now) as i64)
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

fn setup() -> (Topology, SockWatch) {
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).expect("topology");
    let watch = SockWatch::load().expect("loading sockwatch");
    (topology, watch)
}

#[test]
fn exhaustion_is_seen_per_destination_with_failing_process() {
    let (topology, watch) = setup();
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
    assert_eq!(open.len(), 100 - CLOSED, "the closed connections' ports stay in TIME_WAIT");

    let mut resolver = NetnsResolver::new();
    let mut last = None;
    let seen = eventually(Duration::from_secs(2), || {
        let report = watch.report(&mut resolver, Thresholds::default()).expect("report");
        let found = report.destinations.into_iter().find(|d| d.netns == key.netns && d.remote == dst.ip() && d.remote_port == PORT);
        let ok = found.as_ref().is_some_and(|d| d.utilisation.unwrap_or(0.0) >= 0.9 && d.failures >= FAILURES);
        last = found;
        ok
    });
    let usage = last.expect("destination in the report");
    assert!(seen, "within 2 s of the last failure: {usage:#?}");
    eprintln!("seen {:?} after the first connect: {usage:#?}", started.elapsed());
    assert_eq!(usage.level, Level::Critical);
    assert_eq!(usage.local, IpAddr::from(client.ipv4()));
    assert_eq!(usage.usable_ports, Some(100));
    assert_eq!(usage.failures, FAILURES);

    let report = watch.report(&mut resolver, Thresholds::default()).unwrap();
    let ours: Vec<_> = report.failures.iter().filter(|f| f.netns == key.netns).collect();
    assert_eq!(ours.len(), 1, "{ours:#?}");
    assert_eq!(ours[0].pid, std::process::id());
    assert_eq!(ours[0].failures, FAILURES);
    assert_eq!(ours[0].comm, "netns-c1", "the connecting thread's name");
    assert!(ours[0].cgroup_id > 0);
    let json = serde_json::to_value(&report).unwrap();
    assert!(json["destinations"].as_array().is_some_and(|d| !d.is_empty()));

    // The watcher agrees with the kernel's socket table within 2%.
    let agreed = eventually(Duration::from_secs(2), || {
        let (c, time_wait) = counts(&watch, &key);
        let all = ss_count(client, dst.ip(), PORT, "all") as u64;
        let tw = ss_count(client, dst.ip(), PORT, "time-wait") as u64;
        within_2_percent(all, (c.active + time_wait) as u64) && within_2_percent(tw, time_wait as u64)
    });
    let (c, time_wait) = counts(&watch, &key);
    let (all, tw) = (ss_count(client, dst.ip(), PORT, "all"), ss_count(client, dst.ip(), PORT, "time-wait"));
    assert!(agreed, "watcher active {} time_wait {time_wait} vs ss: {all} sockets, {tw} in TIME-WAIT", c.active);
    assert_eq!((c.active, time_wait), (70, 30));
    drop(open);
}

#[test]
fn ten_thousand_cycles_return_to_baseline() {
    let (topology, watch) = setup();
    let (client, backend) = (&topology.clients()[0], &topology.backends()[0]);
    let server = Server::start(backend, PORT);
    let dst = SocketAddr::new(backend.ipv4().into(), PORT);
    let key = PortKey::tcp(netns_inode(client.netns().path()).unwrap(), client.ipv4().into(), dst.ip(), PORT);
    let baseline = counts(&watch, &key);

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
        let (c, tw) = counts(&watch, &key);
        c.active == baseline.0.active && tw == baseline.1 + ss_count(client, dst.ip(), PORT, "time-wait") as i64
    });
    let (c, tw) = counts(&watch, &key);
    let ss_tw = ss_count(client, dst.ip(), PORT, "time-wait");
    assert!(settled, "baseline {:?}, now active {} time_wait {tw}, ss TIME-WAIT {ss_tw}", baseline.0.active, c.active);
    assert_eq!(c.opened - baseline.0.opened, CYCLES);
    assert_eq!(c.time_wait_total - baseline.0.time_wait_total, time_wait, "every client-closed connection went to TIME_WAIT");
    assert_eq!(tw - baseline.1, time_wait as i64);
    let snapshot = watch.snapshot().unwrap();
    assert_eq!(snapshot.stats, [0; 3], "nothing dropped for a full map");

    // TIME_WAIT lasts TCP_TIMEWAIT_LEN (60 s): afterwards the kernel and the watcher both
    // show none.
    let expiry = Duration::from_secs(u64::from(spillway::ports::TIMEWAIT_LEN_SECS) + 2);
    thread::sleep(expiry.saturating_sub(last_close.elapsed()));
    let expired = eventually(Duration::from_secs(3), || counts(&watch, &key).1 == 0 && ss_count(client, dst.ip(), PORT, "time-wait") == 0);
    let (c, tw) = counts(&watch, &key);
    assert!(expired, "active {} time_wait {tw}, ss {}", c.active, ss_count(client, dst.ip(), PORT, "time-wait"));
    assert_eq!(c.active, 0);
    drop(server);
}

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
