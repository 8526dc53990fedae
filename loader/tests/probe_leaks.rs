//! Thousands of probe cycles leave the prober's socket and TIME_WAIT counts flat.
//!
//! In its own test binary, with a single test, so that nothing else opens descriptors in the
//! process while it counts them.

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use rustls::{
    ServerConfig,
    crypto::ring,
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
};
use spillway::{
    health::ProbeOutcome,
    probe::{Hex, ProbeSpec, run},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, UdpSocket},
    task::JoinSet,
};
use tokio_rustls::TlsAcceptor;

/// Probes of each kind, and how many run at once (as many as the daemon allows).
const PROBES: usize = 2000;
const IN_FLIGHT: usize = 64;
const TIMEOUT: Duration = Duration::from_secs(5);
/// The timeout of probes meant to time out.
const SHORT: Duration = Duration::from_millis(50);

/// Whether an outcome is the one a case expects.
type Expected = fn(&ProbeOutcome) -> bool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_probes_leave_sockets_and_time_wait_flat() {
    let servers = Servers::start().await;
    let udp = ProbeSpec::Udp { payload: Hex(b"ping".to_vec()), expect: Some(Hex(b"ping".to_vec())) };
    let passes = |outcome: &ProbeOutcome| matches!(outcome, ProbeOutcome::Success { .. });
    let refused = |outcome: &ProbeOutcome| *outcome == ProbeOutcome::Failure { reason: "refused".to_owned() };
    let times_out = |outcome: &ProbeOutcome| *outcome == ProbeOutcome::Timeout;
    // Kernels may rate-limit the ICMP port unreachable that makes a UDP probe "refused".
    let refused_or_times_out = |outcome: &ProbeOutcome| {
        matches!(outcome, ProbeOutcome::Timeout) || *outcome == ProbeOutcome::Failure { reason: "refused".to_owned() }
    };
    let cases: [(ProbeSpec, SocketAddr, Duration, Expected); 8] = [
        (ProbeSpec::Tcp {}, servers.tcp, TIMEOUT, passes),
        (http(false), servers.http, TIMEOUT, passes),
        (http(true), servers.https, TIMEOUT, passes),
        (udp.clone(), servers.udp, TIMEOUT, passes),
        // The failure paths close their sockets too.
        (ProbeSpec::Tcp {}, servers.closed, TIMEOUT, refused),
        (udp.clone(), servers.closed, SHORT, refused_or_times_out),
        (http(true), servers.silent_tcp, SHORT, times_out),
        (udp, servers.silent_udp.local_addr().unwrap(), SHORT, times_out),
    ];
    let tcp_ports: BTreeSet<u16> =
        [servers.tcp, servers.http, servers.https, servers.closed, servers.silent_tcp].iter().map(SocketAddr::port).collect();
    // One probe of each kind first: what is set up once (TLS configuration, runtime threads)
    // is not a leak.
    for (spec, target, timeout, expected) in &cases {
        assert!(expected(&run(spec, *target, None, *timeout).await), "{spec:?} {target}");
    }
    let fds = settled_fd_count().await;
    let time_wait = time_wait_towards(&tcp_ports);

    let all = tokio::time::timeout(Duration::from_secs(120), async {
        for (spec, target, timeout, expected) in &cases {
            let started = Instant::now();
            let as_expected = probe_many(spec, *target, *timeout, *expected).await;
            assert_eq!(as_expected, PROBES, "{spec:?} {target}: {as_expected} of {PROBES} as expected in {:?}", started.elapsed());
        }
    });
    all.await.expect("the probes took longer than 2 minutes");

    let fds_after = settled_fd_count().await;
    assert!(fds_after <= fds, "open descriptors: {fds} before, {fds_after} after {PROBES} probes of each kind");
    let time_wait_after = time_wait_towards(&tcp_ports);
    assert!(time_wait_after <= time_wait, "TIME_WAIT on the prober's side: {time_wait} before, {time_wait_after} after");
}

fn http(tls: bool) -> ProbeSpec {
    ProbeSpec::Http { path: "/".to_owned(), expect_status: 200, host: None, tls }
}

/// Runs [`PROBES`] probes, at most [`IN_FLIGHT`] at once; returns how many came out as `expected`.
async fn probe_many(spec: &ProbeSpec, target: SocketAddr, timeout: Duration, expected: Expected) -> usize {
    let mut workers = JoinSet::new();
    for worker in 0..IN_FLIGHT {
        let spec = spec.clone();
        let count = PROBES / IN_FLIGHT + usize::from(worker < PROBES % IN_FLIGHT);
        workers.spawn(async move {
            let mut as_expected = 0;
            for _ in 0..count {
                as_expected += usize::from(expected(&run(&spec, target, None, timeout).await));
            }
            as_expected
        });
    }
    workers.join_all().await.into_iter().sum()
}

/// The process's open descriptors, once the servers have closed their side (the count stops
/// falling), within a few seconds.
async fn settled_fd_count() -> usize {
    let count = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let mut last = count();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = count();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// TIME_WAIT sockets (state 06) of this network namespace whose remote port is one of
/// `ports` and whose local port is not: the prober's side of connections to the servers.
fn time_wait_towards(ports: &BTreeSet<u16>) -> usize {
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next().unwrap(), 16).unwrap();
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .map(|text| {
            // sl local_address rem_address st ...
            let fields = text.lines().skip(1).map(|line| line.split_whitespace().collect::<Vec<_>>());
            fields.filter(|f| f[3] == "06" && !ports.contains(&port(f[1])) && ports.contains(&port(f[2]))).count()
        })
        .sum()
}

struct Servers {
    tcp: SocketAddr,
    http: SocketAddr,
    https: SocketAddr,
    udp: SocketAddr,
    /// Nothing listens there, TCP or UDP.
    closed: SocketAddr,
    /// Accepts, never answers, closes when the prober does.
    silent_tcp: SocketAddr,
    /// Never answers (and, open, sends no ICMP port unreachable).
    silent_udp: UdpSocket,
}

impl Servers {
    async fn start() -> Self {
        let (tcp, listener) = listen().await;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                drop(stream);
            }
        });
        let (http, listener) = listen().await;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream));
            }
        });
        let (https, listener) = listen().await;
        let acceptor = tls_acceptor();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        answer(stream).await;
                    }
                });
            }
        });
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let udp = socket.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((len, from)) = socket.recv_from(&mut buf).await {
                let _ = socket.send_to(&buf[..len], from).await;
            }
        });
        let (closed, listener) = listen().await;
        drop(listener);
        let (silent_tcp, listener) = listen().await;
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move { while matches!(stream.read(&mut [0; 1024]).await, Ok(1..)) {} });
            }
        });
        let silent_udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        Servers { tcp, http, https, udp, closed, silent_tcp, silent_udp }
    }
}

async fn listen() -> (SocketAddr, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    (listener.local_addr().unwrap(), listener)
}

/// Reads the request head, answers 200 with a body, closes.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok").await;
    let _ = stream.shutdown().await;
}

fn tls_acceptor() -> TlsAcceptor {
    let certified = rcgen::generate_simple_self_signed(vec!["service.example".to_owned()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    TlsAcceptor::from(Arc::new(config))
}
