//! Every probe kind against real servers on loopback.

use std::{sync::Arc, time::Duration};

use rustls::{
    ServerConfig,
    crypto::ring,
    pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream, UdpSocket},
    sync::mpsc,
};
use tokio_rustls::TlsAcceptor;

use super::*;
use spillway_model::Hex;

const TIMEOUT: Duration = Duration::from_millis(300);
/// How late a timed-out probe may return.
const SLACK: Duration = Duration::from_millis(700);

fn failure(reason: &str) -> ProbeOutcome {
    ProbeOutcome::Failure { reason: reason.to_owned() }
}

fn http(path: &str, expect_status: u16, host: Option<&str>, tls: bool) -> ProbeSpec {
    ProbeSpec::Http { path: path.to_owned(), expect_status, host: host.map(str::to_owned), tls }
}

fn udp(payload: &[u8], expect: Option<&[u8]>) -> ProbeSpec {
    ProbeSpec::Udp { payload: Hex(payload.to_vec()), expect: expect.map(|e| Hex(e.to_vec())) }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (listener, addr)
}

/// A port nothing listens on (TCP and UDP alike, on loopback).
async fn closed_port() -> SocketAddr {
    let (_listener, addr) = listener().await;
    addr
}

/// Runs `spec` with [`TIMEOUT`] and checks that a timeout comes in time.
async fn probe(spec: &ProbeSpec, target: SocketAddr) -> ProbeOutcome {
    let started = Instant::now();
    let outcome = run(spec, target, None, TIMEOUT).await;
    assert!(started.elapsed() < TIMEOUT + SLACK, "{spec:?} took {:?}", started.elapsed());
    outcome
}

/// Reads a request head (up to the blank line, or EOF).
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") && matches!(stream.read(&mut byte).await, Ok(1)) {
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Answers a request with `response` (after `delay`), then closes; returns the request.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, response: &[u8], delay: Duration) -> String {
    let request = read_head(&mut stream).await;
    tokio::time::sleep(delay).await;
    let _ = stream.write_all(response).await;
    let _ = stream.shutdown().await;
    request
}

/// An HTTP server answering every request with `response`; hands over the requests.
async fn http_server(response: &'static [u8], delay: Duration) -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let (listener, addr) = listener().await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move { tx.send(answer(stream, response, delay).await) });
        }
    });
    (addr, rx)
}

/// An HTTPS server with a self-signed certificate for another name than its address; hands
/// over the SNI and the request of each connection.
async fn https_server(response: &'static [u8]) -> (SocketAddr, mpsc::UnboundedReceiver<(Option<String>, String)>) {
    let certified = rcgen::generate_simple_self_signed(vec!["service.example".to_owned()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der()));
    let config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (listener, addr) = listener().await;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else { return };
                let sni = stream.get_ref().1.server_name().map(str::to_owned);
                let _ = tx.send((sni, answer(stream, response, Duration::ZERO).await));
            });
        }
    });
    (addr, rx)
}

/// A server that accepts connections and never says anything.
async fn silent_server() -> SocketAddr {
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    addr
}

/// A UDP server answering each datagram with `reply(request)` after `delay`.
async fn udp_server(reply: fn(&[u8]) -> Vec<u8>, delay: Duration) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        while let Ok((len, from)) = socket.recv_from(&mut buf).await {
            tokio::time::sleep(delay).await;
            let _ = socket.send_to(&reply(&buf[..len]), from).await;
        }
    });
    addr
}

#[test]
fn a_socket_connected_to_itself_is_refused() {
    let target: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    let error = refuse_self_connection(target, target).unwrap_err();
    assert_eq!(classify::classify(&error), failure("refused"));
    assert!(refuse_self_connection("127.0.0.1:40001".parse().unwrap(), target).is_ok());
}

#[tokio::test]
async fn tcp_passes_on_accept_fails_on_refusal_and_times_out_on_silence() {
    let (listener, addr) = listener().await;
    assert!(matches!(probe(&ProbeSpec::Tcp {}, addr).await, ProbeOutcome::Success { .. }));
    drop(listener);
    assert_eq!(probe(&ProbeSpec::Tcp {}, addr).await, failure("refused"));

    // A full accept queue (backlog 0, one connection waiting) drops further SYNs.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    let _full = socket.listen(0).unwrap();
    let _waiting = TcpStream::connect(addr).await.unwrap();
    assert_eq!(probe(&ProbeSpec::Tcp {}, addr).await, ProbeOutcome::Timeout);
}

#[tokio::test]
async fn http_sends_a_minimal_get_and_passes_on_the_expected_status() {
    let (addr, mut requests) = http_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", Duration::ZERO).await;
    assert!(matches!(probe(&http("/healthz?x=1", 200, None, false), addr).await, ProbeOutcome::Success { .. }));
    let expected = format!("GET /healthz?x=1 HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: spillway-health\r\nConnection: close\r\n\r\n");
    assert_eq!(requests.recv().await.unwrap(), expected);

    assert!(matches!(probe(&http("/", 200, Some("svc.example"), false), addr).await, ProbeOutcome::Success { .. }));
    assert!(requests.recv().await.unwrap().contains("\r\nHost: svc.example\r\n"));

    assert_eq!(probe(&http("/", 204, None, false), addr).await, failure("status_200"));
}

#[tokio::test]
async fn http_fails_on_a_wrong_status_garbage_an_early_close_and_refusal() {
    let (addr, _) = http_server(b"HTTP/1.0 503 Service Unavailable\r\n\r\n", Duration::ZERO).await;
    assert_eq!(probe(&http("/", 200, None, false), addr).await, failure("status_503"));
    assert!(matches!(probe(&http("/", 503, None, false), addr).await, ProbeOutcome::Success { .. }));

    let (addr, _) = http_server(b"SSH-2.0-OpenSSH_9.6\r\n", Duration::ZERO).await;
    assert_eq!(probe(&http("/", 200, None, false), addr).await, failure("bad_response"));
    let (addr, _) = http_server(b"HTTP/1.1 200", Duration::ZERO).await;
    assert_eq!(probe(&http("/", 200, None, false), addr).await, failure("closed_early"));
    let (addr, _) = http_server(&[b'H'; 5000], Duration::ZERO).await;
    assert_eq!(probe(&http("/", 200, None, false), addr).await, failure("bad_response"));
    let (addr, _) = http_server(b"HTTP/1.1 200 OK but no line end, much too long ", Duration::ZERO).await;
    assert_eq!(probe(&http("/", 200, None, false), addr).await, failure("closed_early"));

    assert_eq!(probe(&http("/", 200, None, false), closed_port().await).await, failure("refused"));
}

#[tokio::test]
async fn http_times_out_as_a_whole() {
    assert_eq!(probe(&http("/", 200, None, false), silent_server().await).await, ProbeOutcome::Timeout);
    // Accepted and answered, but later than the timeout.
    let (addr, _) = http_server(b"HTTP/1.1 200 OK\r\n\r\n", TIMEOUT * 2).await;
    assert_eq!(probe(&http("/", 200, None, false), addr).await, ProbeOutcome::Timeout);
}

#[tokio::test]
async fn latency_is_the_time_to_the_answer() {
    let delay = Duration::from_millis(150);
    let (addr, _) = http_server(b"HTTP/1.1 200 OK\r\n\r\n", delay).await;
    let ProbeOutcome::Success { latency_us } = run(&http("/", 200, None, false), addr, None, Duration::from_secs(2)).await else {
        panic!()
    };
    assert!((150_000..1_000_000).contains(&latency_us), "{latency_us} us");
    let addr = udp_server(|request| request.to_vec(), delay).await;
    let ProbeOutcome::Success { latency_us } = run(&udp(b"x", None), addr, None, Duration::from_secs(2)).await else { panic!() };
    assert!((150_000..1_000_000).contains(&latency_us), "{latency_us} us");
}

#[tokio::test]
async fn https_ignores_the_certificate_and_sends_the_host_as_sni() {
    let (addr, mut seen) = https_server(b"HTTP/1.1 200 OK\r\n\r\n").await;
    assert!(matches!(probe(&http("/tls", 200, Some("backend.example:8443"), true), addr).await, ProbeOutcome::Success { .. }));
    let (sni, request) = seen.recv().await.unwrap();
    assert_eq!(sni.as_deref(), Some("backend.example"));
    assert!(request.starts_with("GET /tls HTTP/1.1\r\nHost: backend.example:8443\r\n"), "{request}");

    // No host: the address, which is no SNI.
    assert!(matches!(probe(&http("/", 200, None, true), addr).await, ProbeOutcome::Success { .. }));
    let (sni, request) = seen.recv().await.unwrap();
    assert_eq!(sni, None);
    assert!(request.contains(&format!("\r\nHost: {addr}\r\n")), "{request}");

    assert_eq!(probe(&http("/", 204, None, true), addr).await, failure("status_200"));
}

#[tokio::test]
async fn https_fails_without_tls_and_times_out_without_a_handshake() {
    // A plain HTTP server that answers the ClientHello as a bad request.
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let _ = stream.read(&mut [0; 1024]).await;
        let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
    });
    assert_eq!(probe(&http("/", 200, None, true), addr).await, failure("tls_handshake"));
    assert_eq!(probe(&http("/", 200, None, true), silent_server().await).await, ProbeOutcome::Timeout);
    assert_eq!(probe(&http("/", 200, None, true), closed_port().await).await, failure("refused"));
}

#[tokio::test]
async fn udp_passes_on_the_expected_reply() {
    let addr = udp_server(|request| [b"pong:", request].concat(), Duration::ZERO).await;
    assert!(matches!(probe(&udp(b"ping", Some(b"pong:ping")), addr).await, ProbeOutcome::Success { .. }));
    assert!(matches!(probe(&udp(b"ping", Some(b"pong")), addr).await, ProbeOutcome::Success { .. }));
    assert!(matches!(probe(&udp(b"", None), addr).await, ProbeOutcome::Success { .. }));
    assert_eq!(probe(&udp(b"ping", Some(b"PONG")), addr).await, failure("unexpected_reply"));
    assert_eq!(probe(&udp(b"ping", Some(b"pong:ping and more")), addr).await, failure("unexpected_reply"));
}

#[tokio::test]
async fn udp_fails_on_port_unreachable_and_times_out_on_silence() {
    assert_eq!(probe(&udp(b"ping", None), closed_port().await).await, failure("refused"));
    let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    assert_eq!(probe(&udp(b"ping", None), silent.local_addr().unwrap()).await, ProbeOutcome::Timeout);
}

#[tokio::test]
async fn ipv6_targets() {
    let listener = TcpListener::bind("[::1]:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, mut requests) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = tx.send(answer(stream, b"HTTP/1.1 200 OK\r\n\r\n", Duration::ZERO).await);
        }
    });
    assert!(matches!(probe(&http("/", 200, None, false), addr).await, ProbeOutcome::Success { .. }));
    assert!(requests.recv().await.unwrap().contains(&format!("\r\nHost: [::1]:{}\r\n", addr.port())));
    assert!(matches!(probe(&ProbeSpec::Tcp {}, addr).await, ProbeOutcome::Success { .. }));

    let socket = UdpSocket::bind("[::1]:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 64];
        while let Ok((len, from)) = socket.recv_from(&mut buf).await {
            let _ = socket.send_to(&buf[..len], from).await;
        }
    });
    assert!(matches!(probe(&udp(b"v6", Some(b"v6")), addr).await, ProbeOutcome::Success { .. }));
}

#[test]
fn only_a_failure_through_the_tunnel_alone_is_a_broken_vip_path() {
    let passed = ProbeOutcome::Success { latency_us: 3000 };
    let vip_path = |tunnel: &str| ProbeOutcome::VipPathFailed { tunnel: tunnel.to_owned() };
    for (tunnel, direct, diagnosis) in [
        (ProbeOutcome::Timeout, passed.clone(), vip_path("timeout")),
        (failure("refused"), passed.clone(), vip_path("refused")),
        (failure("status_503"), passed.clone(), vip_path("status_503")),
        // Down both ways: the backend is down, and says how through the real path.
        (failure("refused"), failure("refused"), failure("refused")),
        (ProbeOutcome::Timeout, failure("refused"), ProbeOutcome::Timeout),
        (failure("reset"), ProbeOutcome::Timeout, failure("reset")),
        // Nothing to tell apart without the direct probe's answer.
        (failure("refused"), ProbeOutcome::Unknown, failure("refused")),
        // Passing through the tunnel is all that matters; the balancer's own trouble stays its own.
        (passed.clone(), failure("refused"), passed.clone()),
        (ProbeOutcome::Unknown, passed.clone(), ProbeOutcome::Unknown),
    ] {
        assert_eq!(diagnose(tunnel.clone(), &direct), diagnosis, "tunnel {tunnel:?}, direct {direct:?}");
    }
}
