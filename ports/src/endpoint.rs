//! `lbd agent`'s port-pressure endpoint, and the client `lbd` polls it with.
//!
//! `GET /ports` answers the host's [`PortsReport`] as JSON over plain HTTP/1.0 (one request
//! per connection). It is read-only: no request changes anything, whatever it contains. It
//! is bounded so that it cannot be used to load the host: at most [`Limits::max_connections`]
//! connections at a time (more wait in the listen backlog), a request head of at most
//! [`Limits::max_request_bytes`] read within [`Limits::request_timeout`], a whole exchange
//! within [`Limits::connection_timeout`], and the report built at most once per
//! [`Limits::report_max_age`] however many clients ask (they share the cached answer).
//!
//! It answers only the balancers ([`Access::allow`], the agent's `--allow-from`): a report
//! names every destination and the processes holding ports, which is nobody else's business;
//! other peers are closed without a byte and counted. With a key, an answer to a poll that
//! carries a nonce is signed (see [`auth`]), and [`fetch_report`] says whether it was.

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use log::debug;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::auth::{self, NONCE_HEADER, ReportKey, SIGNATURE_HEADER};
use spillway_model::Cidr;
use spillway_model::ports_report::PortsReport;

/// The endpoint's path.
pub const PATH: &str = "/ports";
/// The port agents serve on and `lbd` polls (`lbd --agent-port`) by default.
pub const DEFAULT_PORT: u16 = 9477;
/// `lbd agent --ports-listen`'s default (on [`DEFAULT_PORT`], checked by a test).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9477";
/// The largest response [`fetch_report`] accepts (a report with every TCP and UDP
/// destination slot used is about 12 MiB).
pub const MAX_RESPONSE_BYTES: u64 = 32 << 20;

/// Where the endpoint listens: `ADDR:PORT`, or `off` for nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listen {
    Off,
    On(SocketAddr),
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            return Ok(Listen::Off);
        }
        s.parse().map(Listen::On).map_err(|_| format!("expected ADDR:PORT (e.g. {DEFAULT_LISTEN}, [::]:9477) or off, got {s:?}"))
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Off => f.write_str("off"),
            Listen::On(addr) => addr.fmt(f),
        }
    }
}

/// The server's bounds (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_request_bytes: usize,
    pub request_timeout: Duration,
    pub connection_timeout: Duration,
    pub report_max_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 16,
            max_request_bytes: 4096,
            request_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(15),
            report_max_age: Duration::from_secs(1),
        }
    }
}

/// Who may read the reports, and how they are signed.
#[derive(Clone, Default)]
pub struct Access {
    /// Peers answered (`lbd agent --allow-from`); everyone else is closed on unanswered.
    pub allow: Vec<Cidr>,
    /// Signs answers to polls that carry a nonce (`--report-key`).
    pub key: Option<Arc<ReportKey>>,
    /// Connections closed because their peer is not allowed (the agent's metrics).
    pub refused: Arc<AtomicU64>,
}

impl Access {
    fn allows(&self, peer: std::net::IpAddr) -> bool {
        self.allow.iter().any(|cidr| cidr.contains(peer))
    }
}

/// One answer, shared by every request within `report_max_age`.
#[derive(Clone, Debug)]
struct Response {
    status: u16,
    body: Arc<[u8]>,
}

impl Response {
    fn error(status: u16, message: &str) -> Response {
        Response { status, body: serde_json::json!({ "error": message }).to_string().into_bytes().into() }
    }
}

/// The report source and the last answer built from it.
struct Cache<F> {
    source: Arc<Mutex<F>>,
    last: tokio::sync::Mutex<Option<(Instant, Response)>>,
    max_age: Duration,
}

impl<F> Cache<F>
where
    F: FnMut() -> Result<PortsReport, String> + Send + 'static,
{
    /// The cached answer, or a new one if it is older than `max_age`. Requests arriving
    /// while one is built wait for it (the lock is held across the build).
    async fn get(&self) -> Response {
        let mut last = self.last.lock().await;
        if let Some((at, response)) = last.as_ref()
            && at.elapsed() < self.max_age
        {
            return response.clone();
        }
        let source = Arc::clone(&self.source);
        // Reading maps and /proc blocks: off the async workers.
        let built = tokio::task::spawn_blocking(move || (source.lock().unwrap_or_else(PoisonError::into_inner))()).await;
        let response = match built {
            Ok(Ok(report)) => match serde_json::to_vec(&report) {
                Ok(body) => Response { status: 200, body: body.into() },
                Err(e) => Response::error(500, &format!("serialising the report: {e}")),
            },
            Ok(Err(message)) => Response::error(503, &message),
            Err(e) => Response::error(500, &format!("building the report failed: {e}")),
        };
        *last = Some((Instant::now(), response.clone()));
        response
    }
}

/// Serves `GET /ports` on `listener` to the peers `access` allows, with reports from
/// `source` (its error is the 503 message), until the task is dropped.
pub async fn serve<F>(listener: TcpListener, limits: Limits, access: Access, source: F) -> Infallible
where
    F: FnMut() -> Result<PortsReport, String> + Send + 'static,
{
    let cache =
        Arc::new(Cache { source: Arc::new(Mutex::new(source)), last: tokio::sync::Mutex::new(None), max_age: limits.report_max_age });
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // A slot first: past the limit, connections wait in the kernel's backlog.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { unreachable!("the semaphore is never closed") };
        let stream = match listener.accept().await {
            // Closed at once, before reading a byte: nothing of the host leaves to strangers.
            Ok((_, peer)) if !access.allows(peer.ip()) => {
                access.refused.fetch_add(1, Ordering::Relaxed);
                debug!("ports endpoint: refused {peer}: not in --allow-from");
                continue;
            }
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE, ECONNABORTED and the like: transient; do not spin.
                debug!("ports endpoint: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (cache, key) = (Arc::clone(&cache), access.key.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(limits.connection_timeout, handle(stream, &limits, key.as_deref(), &cache)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!("ports endpoint: {e}"),
                Err(_) => debug!("ports endpoint: connection cut after {:?}", limits.connection_timeout),
            }
            drop(slot);
        });
    }
}

async fn handle<F>(mut stream: TcpStream, limits: &Limits, key: Option<&ReportKey>, cache: &Cache<F>) -> std::io::Result<()>
where
    F: FnMut() -> Result<PortsReport, String> + Send + 'static,
{
    let mut nonce = None;
    let response = match tokio::time::timeout(limits.request_timeout, read_head(&mut stream, limits.max_request_bytes)).await {
        Err(_) => Response::error(408, "no complete request in time"),
        Ok(Err(HeadError::TooLarge)) => Response::error(431, &format!("request head longer than {} bytes", limits.max_request_bytes)),
        Ok(Err(HeadError::Closed)) => return Ok(()),
        Ok(Err(HeadError::Io(e))) => return Err(e),
        Ok(Ok(head)) => match route(&head) {
            Ok(poll_nonce) => {
                nonce = poll_nonce;
                cache.get().await
            }
            Err(refused) => refused,
        },
    };
    // Signed for the address the poller dialled, so it holds for this host's polls only.
    let signature = match (key, nonce) {
        (Some(key), Some(nonce)) => format!("{SIGNATURE_HEADER}: {}\r\n", key.sign(&nonce, stream.local_addr()?.ip(), &response.body)),
        _ => String::new(),
    };
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let head = format!(
        "HTTP/1.0 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{signature}Connection: close\r\n\r\n",
        response.status,
        response.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&response.body).await?;
    stream.shutdown().await
}

enum HeadError {
    TooLarge,
    Closed,
    Io(std::io::Error),
}

/// Reads up to the blank line ending the request head (the request has no body).
async fn read_head(stream: &mut TcpStream, max: usize) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    loop {
        let n = stream.read(&mut chunk).await.map_err(HeadError::Io)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        head.extend_from_slice(&chunk[..n]);
        if head_end(&head).is_some() {
            return Ok(head);
        }
        if head.len() > max {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Where the head ends (after its blank line), for CRLF or bare LF line ends.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    crlf.into_iter().chain(lf).min()
}

/// Accepts `GET /ports HTTP/1.x` (with the poll's nonce, if it sends one); anything else
/// gets its error answer.
fn route(head: &[u8]) -> Result<Option<String>, Response> {
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (method, target, version) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if !version.starts_with("HTTP/1.") || parts.next().is_some() {
        return Err(Response::error(400, "expected a request line like: GET /ports HTTP/1.0"));
    }
    if target != PATH {
        return Err(Response::error(404, &format!("only {PATH} is served")));
    }
    if method != "GET" {
        return Err(Response::error(405, &format!("{PATH} is read-only: only GET is served")));
    }
    let head = String::from_utf8_lossy(head);
    match header(&head, NONCE_HEADER) {
        None => Ok(None),
        Some(nonce) if auth::is_nonce(nonce) => Ok(Some(nonce.to_owned())),
        Some(_) => Err(Response::error(400, &format!("{NONCE_HEADER} must be 32 hex digits"))),
    }
}

/// The value of the header `name` in an HTTP head (the first line skipped), if present.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (n, value) = line.split_once(':')?;
        n.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("connecting to the ports endpoint {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the ports endpoint {addr}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the ports endpoint {addr} did not answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("the ports endpoint {addr} sent more than {limit} bytes")]
    TooLarge { addr: SocketAddr, limit: u64 },
    #[error("the ports endpoint {addr} sent a malformed response: {reason}")]
    Malformed { addr: SocketAddr, reason: &'static str },
    #[error("the ports endpoint {addr} answered {status}: {message}")]
    Status { addr: SocketAddr, status: u16, message: String },
    #[error("no random nonce for polling {addr} (the system's random source failed)")]
    Nonce { addr: SocketAddr },
    #[error("the ports endpoint {addr} sent a report that does not parse")]
    Json {
        addr: SocketAddr,
        #[source]
        source: serde_json::Error,
    },
}

/// What a fetched report's signature proved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signed {
    /// Signed with the key for this poll and this address.
    Verified,
    /// No key to check it with (none was given).
    Unchecked,
    /// The answer carries no signature (the agent has no key, or is no agent).
    Missing,
    /// The signature does not hold: another key, another poll, another host, or altered.
    Invalid,
}

impl Signed {
    /// Why a report that is not [`Signed::Verified`] cannot be trusted.
    pub const fn problem(self) -> Option<&'static str> {
        match self {
            Signed::Verified => None,
            Signed::Unchecked => Some("lbd has no --report-key to check it with"),
            Signed::Missing => Some("it is not signed (is the agent's --report-key set?)"),
            Signed::Invalid => Some("its signature does not hold (another key, a replay, or not the agent)"),
        }
    }
}

/// Fetches the report of the agent at `addr`, and with `key` checks its signature; the
/// whole exchange must end within `timeout` and the response stay within
/// [`MAX_RESPONSE_BYTES`].
pub async fn fetch_report(addr: SocketAddr, timeout: Duration, key: Option<&ReportKey>) -> Result<(PortsReport, Signed), EndpointError> {
    tokio::time::timeout(timeout, fetch(addr, key)).await.map_err(|_| EndpointError::Timeout { addr, timeout })?
}

async fn fetch(addr: SocketAddr, key: Option<&ReportKey>) -> Result<(PortsReport, Signed), EndpointError> {
    let io = |source| EndpointError::Io { addr, source };
    let nonce = key.map(|_| auth::nonce().ok_or(EndpointError::Nonce { addr })).transpose()?;
    let nonce_line = nonce.as_ref().map(|n| format!("{NONCE_HEADER}: {n}\r\n")).unwrap_or_default();
    let mut stream = TcpStream::connect(addr).await.map_err(|source| EndpointError::Connect { addr, source })?;
    stream.write_all(format!("GET {PATH} HTTP/1.0\r\nHost: {addr}\r\n{nonce_line}\r\n").as_bytes()).await.map_err(io)?;
    let mut response = Vec::new();
    (&mut stream).take(MAX_RESPONSE_BYTES + 1).read_to_end(&mut response).await.map_err(io)?;
    let poll = key.zip(nonce.as_deref());
    decode_answer(addr, &response, poll)
}

/// The report in the whole `response` the agent at `addr` sent, and whether it is signed
/// with the key for `poll` (the key and the nonce the poll carried; `None`: no key).
pub fn decode_answer(addr: SocketAddr, response: &[u8], poll: Option<(&ReportKey, &str)>) -> Result<(PortsReport, Signed), EndpointError> {
    if response.len() as u64 > MAX_RESPONSE_BYTES {
        return Err(EndpointError::TooLarge { addr, limit: MAX_RESPONSE_BYTES });
    }
    let (status, signature, body) = parse_response(response).map_err(|reason| EndpointError::Malformed { addr, reason })?;
    if status != 200 {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
        return Err(EndpointError::Status { addr, status, message });
    }
    let signed = match (poll, signature) {
        (Some((key, nonce)), Some(signature)) if key.verify(nonce, addr.ip(), body, signature) => Signed::Verified,
        (Some(_), Some(_)) => Signed::Invalid,
        (Some(_), None) => Signed::Missing,
        (None, _) => Signed::Unchecked,
    };
    let report = serde_json::from_slice(body).map_err(|source| EndpointError::Json { addr, source })?;
    Ok((report, signed))
}

/// The status, the signature header and the body of a whole HTTP/1.x response; a
/// `Content-Length` must match.
fn parse_response(response: &[u8]) -> Result<(u16, Option<&str>, &[u8]), &'static str> {
    let end = head_end(response).ok_or("no end of headers")?;
    let head = std::str::from_utf8(&response[..end]).map_err(|_| "headers are not UTF-8")?;
    let body = &response[end..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split(' ');
    if !parts.next().unwrap_or_default().starts_with("HTTP/1.") {
        return Err("not an HTTP/1 status line");
    }
    let status = parts.next().and_then(|s| s.parse().ok()).ok_or("no status code")?;
    let signature = header(head, SIGNATURE_HEADER);
    for line in lines {
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            let length: usize = value.trim().parse().map_err(|_| "bad Content-Length")?;
            if length != body.len() {
                return Err("body length differs from Content-Length (truncated?)");
            }
        }
    }
    Ok((status, signature, body))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use spillway_model::ports_report::{Dropped, Thresholds};

    const TIMEOUT: Duration = Duration::from_secs(2);

    /// The loopback peers the tests connect from, and no key.
    fn local_access() -> Access {
        Access { allow: vec!["127.0.0.0/8".parse().unwrap()], ..Access::default() }
    }

    /// A report fetched without a key.
    async fn fetch_unsigned(addr: SocketAddr, timeout: Duration) -> Result<PortsReport, EndpointError> {
        fetch_report(addr, timeout, None).await.map(|(report, signed)| {
            assert_eq!(signed, Signed::Unchecked);
            report
        })
    }

    #[test]
    fn the_default_listen_address_is_on_the_default_port() {
        assert_eq!(DEFAULT_LISTEN.parse::<Listen>(), Ok(Listen::On(SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))));
    }

    fn report(marker: u64) -> PortsReport {
        let dropped = Dropped { sock_table_full: marker, ..Dropped::default() };
        PortsReport {
            thresholds: Thresholds::default(),
            destinations: vec![],
            failures: vec![],
            dropped,
            leak_suspects: vec![],
            watcher: None,
        }
    }

    /// Starts a server whose reports carry the number of times the source was called.
    async fn start(limits: Limits) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&calls);
        tokio::spawn(serve(listener, limits, local_access(), move || Ok(report(counter.fetch_add(1, Ordering::SeqCst) as u64 + 1))));
        (addr, calls)
    }

    async fn raw(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(TIMEOUT, stream.read_to_string(&mut out)).await.unwrap().unwrap();
        out
    }

    #[tokio::test]
    async fn serves_the_report_built_at_most_once_per_interval() {
        let limits = Limits { report_max_age: Duration::from_millis(300), ..Limits::default() };
        let (addr, calls) = start(limits).await;
        let fetches = (0..8).map(|_| fetch_unsigned(addr, TIMEOUT));
        for fetched in futures_join(fetches).await {
            assert_eq!(fetched.unwrap(), report(1));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "eight requests, one build");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(fetch_unsigned(addr, TIMEOUT).await.unwrap(), report(2));
    }

    /// Awaits all of `futures` concurrently.
    async fn futures_join<T: Send + 'static>(futures: impl Iterator<Item = impl Future<Output = T> + Send + 'static>) -> Vec<T> {
        let handles: Vec<_> = futures.map(tokio::spawn).collect();
        let mut out = Vec::new();
        for handle in handles {
            out.push(handle.await.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn an_unavailable_source_answers_503_with_its_message() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Limits::default(), local_access(), || Err("the socket watcher is not loaded: no BTF".to_owned())));
        match fetch_unsigned(addr, TIMEOUT).await {
            Err(EndpointError::Status { status: 503, message, .. }) => assert_eq!(message, "the socket watcher is not loaded: no BTF"),
            other => panic!("expected a 503, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn anything_but_get_ports_is_refused_and_changes_nothing() {
        let limits = Limits { max_request_bytes: 256, request_timeout: Duration::from_millis(200), ..Limits::default() };
        let (addr, calls) = start(limits).await;
        let cases: [(&[u8], &str); 5] = [
            (b"POST /ports HTTP/1.0\r\n\r\n", "HTTP/1.0 405 "),
            (b"GET /ports/../x HTTP/1.1\r\nHost: a\r\n\r\n", "HTTP/1.0 404 "),
            (b"GET /ports\r\n\r\n", "HTTP/1.0 400 "),
            // Read in one go, so the server closes with nothing unread (no RST).
            (&[b'x'; 300], "HTTP/1.0 431 "),
            (b"GET /ports HTTP/1.0\r\n", "HTTP/1.0 408 "),
        ];
        for (request, expected) in cases {
            let answer = raw(addr, request).await;
            assert!(answer.starts_with(expected), "{:?} -> {answer:?}", String::from_utf8_lossy(&request[..request.len().min(40)]));
            assert!(answer.contains("\"error\""), "{answer}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0, "no report built for a refused request");
        assert!(raw(addr, b"GET /ports HTTP/1.0\n\n").await.starts_with("HTTP/1.0 200 OK\r\n"));
    }

    #[tokio::test]
    async fn connections_past_the_limit_wait_for_a_slot() {
        let limits = Limits { max_connections: 2, request_timeout: Duration::from_millis(500), ..Limits::default() };
        let (addr, _) = start(limits).await;
        let idle = [TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
        let err = fetch_unsigned(addr, Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, EndpointError::Timeout { .. }), "{err:?}");
        // The idle connections time out (408) and free their slots.
        assert_eq!(fetch_unsigned(addr, TIMEOUT).await.unwrap(), report(1));
        drop(idle);
    }

    #[tokio::test]
    async fn the_client_bounds_time_and_size_and_checks_the_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for answer in
                [Vec::new(), vec![b'a'; MAX_RESPONSE_BYTES as usize + 10], b"HTTP/1.0 200 OK\r\nContent-Length: 99\r\n\r\n{}".to_vec()]
            {
                let (mut stream, _) = listener.accept().await.unwrap();
                if answer.is_empty() {
                    // Never answers.
                    tokio::spawn(async move {
                        tokio::time::sleep(TIMEOUT).await;
                        drop(stream)
                    });
                    continue;
                }
                // Read the request first: closing with unread data would send a reset.
                let _ = read_head(&mut stream, 4096).await;
                let _ = stream.write_all(&answer).await;
            }
        });
        let timeout = Duration::from_millis(200);
        assert!(matches!(fetch_unsigned(addr, timeout).await, Err(EndpointError::Timeout { .. })));
        let too_large = fetch_unsigned(addr, TIMEOUT).await;
        assert!(matches!(too_large, Err(EndpointError::TooLarge { .. })), "{too_large:?}");
        let truncated = fetch_unsigned(addr, TIMEOUT).await;
        assert!(matches!(truncated, Err(EndpointError::Malformed { .. })), "{truncated:?}");
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        assert!(matches!(fetch_unsigned(closed, TIMEOUT).await, Err(EndpointError::Connect { .. })));
    }

    #[tokio::test]
    async fn peers_outside_the_allow_list_are_closed_unanswered_and_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let access = Access { allow: vec!["10.0.0.2/32".parse().unwrap(), "::1/128".parse().unwrap()], ..Access::default() };
        let refused = Arc::clone(&access.refused);
        let built = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&built);
        tokio::spawn(serve(listener, Limits::default(), access, move || Ok(report(counter.fetch_add(1, Ordering::SeqCst) as u64))));
        // The attacker on the host or the network: not one of the balancers.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(b"GET /ports HTTP/1.0\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        // Closed with the request unread: an end of file or a reset, never a byte.
        let _ = tokio::time::timeout(TIMEOUT, stream.read_to_end(&mut answer)).await.unwrap();
        assert!(answer.is_empty(), "not a byte of the report");
        assert!(fetch_unsigned(addr, TIMEOUT).await.is_err());
        assert_eq!(refused.load(Ordering::Relaxed), 2);
        assert_eq!(built.load(Ordering::SeqCst), 0, "no report built for a stranger");
    }

    #[tokio::test]
    async fn a_report_is_trusted_only_when_signed_for_this_poll() {
        let key = Arc::new(ReportKey::from_secret(&[7; 32]));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let access = Access { key: Some(Arc::clone(&key)), ..local_access() };
        tokio::spawn(serve(listener, Limits::default(), access, || Ok(report(1))));
        assert_eq!(fetch_report(addr, TIMEOUT, Some(&key)).await.unwrap(), (report(1), Signed::Verified));
        let other = ReportKey::from_secret(&[8; 32]);
        assert_eq!(fetch_report(addr, TIMEOUT, Some(&other)).await.unwrap().1, Signed::Invalid);
        // An agent without a key signs nothing.
        let unsigned = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let unsigned_addr = unsigned.local_addr().unwrap();
        tokio::spawn(serve(unsigned, Limits::default(), local_access(), || Ok(report(1))));
        assert_eq!(fetch_report(unsigned_addr, TIMEOUT, Some(&key)).await.unwrap().1, Signed::Missing);

        // An impostor (an unprivileged user who bound the port first, say) replays a signed
        // answer it recorded: its nonce is not the new poll's.
        let mut recorded = TcpStream::connect(addr).await.unwrap();
        let old_nonce = auth::nonce().unwrap();
        recorded.write_all(format!("GET /ports HTTP/1.0\r\n{NONCE_HEADER}: {old_nonce}\r\n\r\n").as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        recorded.read_to_end(&mut answer).await.unwrap();
        assert!(String::from_utf8_lossy(&answer).contains(SIGNATURE_HEADER));
        let impostor = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let impostor_addr = impostor.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = impostor.accept().await.unwrap();
            let _ = read_head(&mut stream, 4096).await;
            let _ = stream.write_all(&answer).await;
        });
        assert_eq!(fetch_report(impostor_addr, TIMEOUT, Some(&key)).await.unwrap().1, Signed::Invalid);
        // One that relays the poll to another host's agent gets that host's signature.
        let relay = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let relay_addr = relay.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = relay.accept().await.unwrap();
            let head = read_head(&mut stream, 4096).await.ok().unwrap();
            let mut agent = TcpStream::connect(addr).await.unwrap();
            agent.write_all(&head).await.unwrap();
            let mut answer = Vec::new();
            agent.read_to_end(&mut answer).await.unwrap();
            let _ = stream.write_all(&answer).await;
        });
        assert_eq!(fetch_report(relay_addr, TIMEOUT, Some(&key)).await.unwrap().1, Signed::Invalid);
        // A nonce that is not one is refused rather than signed.
        assert!(raw(addr, format!("GET /ports HTTP/1.0\r\n{NONCE_HEADER}: x\r\n\r\n").as_bytes()).await.starts_with("HTTP/1.0 400 "));
    }

    #[test]
    fn listen_parses_addresses_and_off() {
        assert_eq!(DEFAULT_LISTEN.parse(), Ok(Listen::On("0.0.0.0:9477".parse().unwrap())));
        assert_eq!("[::1]:80".parse::<Listen>().unwrap().to_string(), "[::1]:80");
        assert_eq!("off".parse(), Ok(Listen::Off));
        assert!("9477".parse::<Listen>().unwrap_err().contains("expected ADDR:PORT"));
    }
}
