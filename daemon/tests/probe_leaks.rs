//! Thousands of probe cycles leave the prober's socket and TIME_WAIT counts flat: direct
//! probes of every kind over loopback, and probes through the tunnel (to the VIP, beside a
//! direct one, with the probe path's own checks when only the tunnel fails) from a balancer
//! namespace to a backend namespace, as `lbd` makes them.
//!
//! In its own test binary, with a single test, so that nothing else opens descriptors in the
//! process while it counts them.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use rustls::{
    ServerConfig,
    crypto::ring,
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
};
use spillway_common::{
    addr::to_words,
    limits::{DEFAULT_TCP_IDLE_TIMEOUT_S, DEFAULT_UDP_IDLE_TIMEOUT_S},
    types::LbConfig,
};
use spillway_daemon::probing::{ProbePathState, probe_through_tunnel};
use spillway_dataplane::pins::PinLayout;
use spillway_dataplane::vip_path::{ProbeNames, VipPath};
use spillway_dataplane::{Balancer, LoadOptions};
use spillway_harness::{LB4, LB6, Topology, TopologyConfig, VIP4};
use spillway_model::{DesiredState, Hex, ProbeOutcome, ProbeSpec, Vip};
use spillway_probe::run;
use spillway_reconcile::Reconciler;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, UdpSocket},
    runtime::Runtime,
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

/// Where a case's probes go.
#[derive(Clone, Copy, Debug)]
enum Route {
    Direct(SocketAddr),
    /// To `vip` through the tunnel, with a direct probe of `direct` beside it.
    Tunnel {
        vip: SocketAddr,
        direct: SocketAddr,
    },
}

#[derive(Clone)]
struct Case {
    spec: ProbeSpec,
    route: Route,
    timeout: Duration,
    expected: Expected,
}

/// What a probe through the tunnel needs: the probe path and the backend's slot in the maps.
#[derive(Clone)]
struct Tunnel {
    path: Arc<ProbePathState>,
    slot: (u32, u32),
}

#[test]
fn thousands_of_probes_leave_sockets_and_time_wait_flat() {
    let topology = Topology::build(TopologyConfig { backends: 1, clients: 1 }).unwrap();
    let backend = &topology.backends()[0];
    let pin_dir = topology.pin_dir().unwrap();
    // The backend decapsulates with the real agent, and serves on every address (the VIP
    // included) and, for one port, on its own address only.
    let agent_pins = pin_dir.join("agent");
    let agent = backend
        .spawn(&[
            env!("CARGO_BIN_EXE_lbd"),
            "agent",
            "--iface",
            "eth0",
            "--ports-listen",
            "off",
            "--pin-dir",
            agent_pins.to_str().unwrap(),
            "--allow-from",
            "10.0.0.2/32",
        ])
        .unwrap();
    agent.wait_for_output("ready", Duration::from_secs(20)).unwrap();
    let own = IpAddr::V4(backend.ipv4());
    let (_backend_runtime, remote, own_only) = backend.in_netns(|| {
        let runtime = runtime();
        let (remote, own_only) = runtime
            .block_on(async { (Servers::start(Ipv4Addr::UNSPECIFIED.into(), &[VIP4.into(), own]).await, closing_listener(own).await) });
        (runtime, remote, own_only)
    });
    topology.lb().in_netns(|| runtime().block_on(probe_everything(&pin_dir, own, remote, own_only)));
}

/// On the balancer: the probe path set up as `lbd` sets it up, servers of its own on loopback,
/// then every case.
async fn probe_everything(pin_dir: &std::path::Path, backend: IpAddr, remote: Servers, own_only: SocketAddr) {
    let layout = PinLayout::new(&pin_dir.join("lb"));
    let mut balancer = Balancer::load(&LoadOptions { map_pin_dir: Some(layout.balancer_maps()), ..LoadOptions::default() }).unwrap();
    let config = LbConfig {
        outer_src_v4: to_words(LB4.into()).0[0],
        outer_src_v6: to_words(LB6.into()).0,
        tcp_idle_timeout_s: DEFAULT_TCP_IDLE_TIMEOUT_S,
        udp_idle_timeout_s: DEFAULT_UDP_IDLE_TIMEOUT_S,
        ..LbConfig::default()
    };
    balancer.maps.set_config(&config).unwrap();
    let vip: Vip = format!("{VIP4}:80/tcp").parse().unwrap();
    let mut state = DesiredState::default();
    state.add_vip(vip, 13).unwrap();
    state.add_backend(&vip, backend, 100).unwrap();
    let mut reconciler = Reconciler::adopt(&balancer.maps).unwrap();
    reconciler.apply(&mut balancer.maps, &state).unwrap();
    let names = ProbeNames { device: "spw-probe".into(), table: 5357, mark: 0x53 };
    let path = VipPath::install(&mut balancer, &layout, "eth0", &names, (None, None)).unwrap();
    let tunnel = Tunnel { path: Arc::new(Ok(path)), slot: reconciler.backend_slot(&vip, &backend).unwrap() };

    let local = Servers::start(Ipv4Addr::LOCALHOST.into(), &[Ipv4Addr::LOCALHOST.into()]).await;
    let udp = ProbeSpec::Udp { payload: Hex(b"ping".to_vec()), expect: Some(Hex(b"ping".to_vec())) };
    let passes = |outcome: &ProbeOutcome| matches!(outcome, ProbeOutcome::Success { .. });
    let refused = |outcome: &ProbeOutcome| *outcome == ProbeOutcome::Failure { reason: "refused".to_owned() };
    let times_out = |outcome: &ProbeOutcome| *outcome == ProbeOutcome::Timeout;
    // Kernels may rate-limit the ICMP port unreachable that makes a UDP probe "refused".
    let refused_or_times_out = |outcome: &ProbeOutcome| {
        matches!(outcome, ProbeOutcome::Timeout) || *outcome == ProbeOutcome::Failure { reason: "refused".to_owned() }
    };
    let vip_path_failed = |outcome: &ProbeOutcome| *outcome == ProbeOutcome::VipPathFailed { tunnel: "refused".to_owned() };
    let direct = |target: SocketAddr| Route::Direct(target);
    let tunnelled = |target: SocketAddr| Route::Tunnel {
        vip: SocketAddr::new(VIP4.into(), target.port()),
        direct: SocketAddr::new(backend, target.port()),
    };
    let case = |spec: &ProbeSpec, route, timeout, expected| Case { spec: spec.clone(), route, timeout, expected };
    let cases = [
        case(&ProbeSpec::Tcp {}, direct(local.tcp), TIMEOUT, passes),
        case(&http(false), direct(local.http), TIMEOUT, passes),
        case(&http(true), direct(local.https), TIMEOUT, passes),
        case(&udp, direct(local.udp), TIMEOUT, passes),
        // The failure paths close their sockets too.
        case(&ProbeSpec::Tcp {}, direct(local.closed), TIMEOUT, refused),
        case(&udp, direct(local.closed), SHORT, refused_or_times_out),
        case(&http(true), direct(local.silent_tcp), SHORT, times_out),
        case(&udp, direct(local.silent_udp.local_addr().unwrap()), SHORT, times_out),
        // Through the tunnel: two sockets per probe.
        case(&ProbeSpec::Tcp {}, tunnelled(remote.tcp), TIMEOUT, passes),
        case(&http(false), tunnelled(remote.http), TIMEOUT, passes),
        case(&http(true), tunnelled(remote.https), TIMEOUT, passes),
        case(&udp, tunnelled(remote.udp), TIMEOUT, passes),
        case(&ProbeSpec::Tcp {}, tunnelled(remote.closed), TIMEOUT, refused),
        case(&http(true), tunnelled(remote.silent_tcp), SHORT, times_out),
        case(&udp, tunnelled(remote.silent_udp.local_addr().unwrap()), SHORT, times_out),
        // Only the tunnel fails (a service on the backend's own address only): the probe path
        // is checked each time, over netlink.
        case(&ProbeSpec::Tcp {}, tunnelled(own_only), TIMEOUT, vip_path_failed),
    ];
    let ports: BTreeSet<u16> = [&local, &remote]
        .iter()
        .flat_map(|s| [s.tcp, s.http, s.https, s.closed, s.silent_tcp])
        .chain([own_only])
        .map(|a| a.port())
        .collect();
    // One probe of each kind first: what is set up once (TLS configuration, runtime threads)
    // is not a leak.
    for case in &cases {
        let outcome = probe_once(case, &tunnel).await;
        assert!((case.expected)(&outcome), "{:?} {:?}: {outcome:?}", case.spec, case.route);
    }
    let fds = settled_fd_count().await;
    let time_wait = time_wait_towards(&ports);

    let all = tokio::time::timeout(Duration::from_secs(240), async {
        for case in &cases {
            let started = Instant::now();
            let as_expected = probe_many(case, &tunnel).await;
            assert_eq!(
                as_expected,
                PROBES,
                "{:?} {:?}: {as_expected} of {PROBES} as expected in {:?}",
                case.spec,
                case.route,
                started.elapsed()
            );
        }
    });
    all.await.expect("the probes took longer than 4 minutes");

    let fds_after = settled_fd_count().await;
    assert!(fds_after <= fds, "open descriptors: {fds} before, {fds_after} after {PROBES} probes of each kind");
    let time_wait_after = time_wait_towards(&ports);
    assert!(time_wait_after <= time_wait, "TIME_WAIT on the prober's side: {time_wait} before, {time_wait_after} after");
    drop(balancer);
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn probe_once(case: &Case, tunnel: &Tunnel) -> ProbeOutcome {
    match case.route {
        Route::Direct(target) => run(&case.spec, target, None, case.timeout).await,
        Route::Tunnel { vip, direct } => {
            probe_through_tunnel(tunnel.path.clone(), &case.spec, vip, tunnel.slot, direct, case.timeout).await.0
        }
    }
}

fn http(tls: bool) -> ProbeSpec {
    ProbeSpec::Http { path: "/".to_owned(), expect_status: 200, host: None, tls }
}

/// Runs [`PROBES`] probes, at most [`IN_FLIGHT`] at once; returns how many came out as expected.
async fn probe_many(case: &Case, tunnel: &Tunnel) -> usize {
    let case = Arc::new(case.clone());
    let mut workers = JoinSet::new();
    for worker in 0..IN_FLIGHT {
        let (case, tunnel) = (case.clone(), tunnel.clone());
        let count = PROBES / IN_FLIGHT + usize::from(worker < PROBES % IN_FLIGHT);
        workers.spawn(async move {
            let mut as_expected = 0;
            for _ in 0..count {
                as_expected += usize::from((case.expected)(&probe_once(&case, &tunnel).await));
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

/// TIME_WAIT sockets (state 06) of the calling thread's network namespace whose remote port is one of
/// `ports` and whose local port is not: the prober's side of connections to the servers.
fn time_wait_towards(ports: &BTreeSet<u16>) -> usize {
    let port = |address: &str| u16::from_str_radix(address.rsplit(':').next().unwrap(), 16).unwrap();
    ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"]
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
    /// Every server on `ip` (ephemeral ports); the UDP echo on each of `udp_ips` (one port), so
    /// that it answers from the address it was asked on, as a service behind a VIP must.
    async fn start(ip: IpAddr, udp_ips: &[IpAddr]) -> Self {
        let tcp = closing_listener(ip).await;
        let (http, listener) = listen(ip).await;
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream));
            }
        });
        let (https, listener) = listen(ip).await;
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
        let mut udp = SocketAddr::new(ip, 0);
        for udp_ip in udp_ips {
            let socket = UdpSocket::bind(SocketAddr::new(*udp_ip, udp.port())).await.unwrap();
            udp.set_port(socket.local_addr().unwrap().port());
            tokio::spawn(async move {
                let mut buf = [0u8; 512];
                while let Ok((len, from)) = socket.recv_from(&mut buf).await {
                    let _ = socket.send_to(&buf[..len], from).await;
                }
            });
        }
        let (closed, listener) = listen(ip).await;
        drop(listener);
        let (silent_tcp, listener) = listen(ip).await;
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move { while matches!(stream.read(&mut [0; 1024]).await, Ok(1..)) {} });
            }
        });
        let silent_udp = UdpSocket::bind(SocketAddr::new(ip, 0)).await.unwrap();
        Servers { tcp, http, https, udp, closed, silent_tcp, silent_udp }
    }
}

async fn listen(ip: IpAddr) -> (SocketAddr, TcpListener) {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    (listener.local_addr().unwrap(), listener)
}

/// A server on `ip` that accepts and closes at once.
async fn closing_listener(ip: IpAddr) -> SocketAddr {
    let (addr, listener) = listen(ip).await;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    addr
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
