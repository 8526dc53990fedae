//! The metrics listener: `GET /metrics` over HTTP/1.x, one request per connection. It is
//! read-only (nothing a client sends changes anything) and bounded: [`Limits::connections`]
//! at a time (more wait in the listen backlog), a request head of [`Limits::head_bytes`]
//! within [`Limits::head_timeout`], a whole exchange within [`Limits::exchange_timeout`], and
//! the body built at most once per [`Limits::max_age`] however many scrapers ask (they share
//! it), so scraping never loads the maps more than once a second.

use std::{
    convert::Infallible,
    fmt,
    net::SocketAddr,
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{Mutex, Semaphore},
};

use super::{Exposition, OPENMETRICS, PATH, TEXT};

/// Where metrics are served: `ADDR:PORT`, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricsListen {
    Off,
    On(SocketAddr),
}

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(MetricsListen::Off),
            _ => s
                .parse()
                .map(MetricsListen::On)
                .map_err(|_| format!("expected ADDR:PORT (e.g. 127.0.0.1:9476, [::]:9476) or off, got {s:?}")),
        }
    }
}

impl fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsListen::Off => f.write_str("off"),
            MetricsListen::On(addr) => write!(f, "{addr}"),
        }
    }
}

/// The listener's bounds (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub connections: usize,
    pub head_bytes: usize,
    pub head_timeout: Duration,
    pub exchange_timeout: Duration,
    pub max_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections: 8,
            head_bytes: 4096,
            head_timeout: Duration::from_secs(5),
            exchange_timeout: Duration::from_secs(15),
            max_age: Duration::from_secs(1),
        }
    }
}

/// The serving task; dropping it stops serving.
pub struct Serving(tokio::task::JoinHandle<Infallible>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Binds `listen` and serves `source` there (see [`serve`]); `Ok(None)` when it is `off`.
pub async fn spawn<F>(listen: MetricsListen, limits: Limits, source: F) -> std::io::Result<Option<(SocketAddr, Serving)>>
where
    F: FnMut() -> Exposition + Send + 'static,
{
    let MetricsListen::On(addr) = listen else { return Ok(None) };
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok(Some((bound, Serving(tokio::spawn(serve(listener, limits, source))))))
}

/// The last body and when it was built.
type Cached = Mutex<Option<(Instant, Arc<Exposition>)>>;

/// Serves `source`'s text on `listener` until the task is dropped. `source` may block (it
/// reads maps): it runs on a blocking thread, at most once per `limits.max_age`.
pub async fn serve<F>(listener: TcpListener, limits: Limits, source: F) -> Infallible
where
    F: FnMut() -> Exposition + Send + 'static,
{
    let source = Arc::new(std::sync::Mutex::new(source));
    let cached: Arc<Cached> = Arc::new(Mutex::new(None));
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { unreachable!("the semaphore is never closed") };
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors and the like: transient, and no reason to spin.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (source, cached) = (Arc::clone(&source), Arc::clone(&cached));
        tokio::spawn(async move {
            // A slow or silent client is cut off; its errors are its own.
            let _ = tokio::time::timeout(limits.exchange_timeout, exchange(stream, &limits, &cached, source)).await;
            drop(slot);
        });
    }
}

async fn exchange<F>(mut stream: TcpStream, limits: &Limits, cached: &Cached, source: Arc<std::sync::Mutex<F>>) -> std::io::Result<()>
where
    F: FnMut() -> Exposition + Send + 'static,
{
    let (status, content_type, body) = match tokio::time::timeout(limits.head_timeout, read_head(&mut stream, limits.head_bytes)).await {
        Err(_) => (408, PLAIN, "no complete request in time\n".to_owned()),
        Ok(Ok(None)) => (431, PLAIN, format!("request head over {} bytes\n", limits.head_bytes)),
        Ok(Err(e)) => return Err(e),
        Ok(Ok(Some(head))) => match check(&head) {
            Err((status, why)) => (status, PLAIN, why),
            Ok(()) => {
                let exposition = body(cached, limits.max_age, source).await;
                if wants_openmetrics(&head) {
                    (200, OPENMETRICS, exposition.openmetrics.clone())
                } else {
                    (200, TEXT, exposition.text.clone())
                }
            }
        },
    };
    let head = format!(
        "HTTP/1.0 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        reason_phrase(status),
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

const PLAIN: &str = "text/plain; charset=utf-8";

/// Whether the request's `Accept` header names OpenMetrics (Prometheus' does).
fn wants_openmetrics(head: &[u8]) -> bool {
    String::from_utf8_lossy(head).lines().any(|l| {
        l.split_once(':')
            .is_some_and(|(name, value)| name.trim().eq_ignore_ascii_case("accept") && value.contains("application/openmetrics-text"))
    })
}

/// The cached body, or a new one when it is older than `max_age`; scrapes arriving while it
/// is built wait for it (the lock is held across the build).
async fn body<F>(cached: &Cached, max_age: Duration, source: Arc<std::sync::Mutex<F>>) -> Arc<Exposition>
where
    F: FnMut() -> Exposition + Send + 'static,
{
    let mut last = cached.lock().await;
    if let Some((_, body)) = last.as_ref().filter(|(at, _)| at.elapsed() < max_age) {
        return Arc::clone(body);
    }
    let built = tokio::task::spawn_blocking(move || (source.lock().unwrap_or_else(std::sync::PoisonError::into_inner))()).await;
    let body = Arc::new(built.unwrap_or_else(|e| {
        // The source panicked: say so rather than serve nothing forever.
        let note = format!("# building the metrics failed: {e}\n");
        Exposition { openmetrics: format!("{note}# EOF\n"), text: note }
    }));
    *last = Some((Instant::now(), Arc::clone(&body)));
    body
}

/// The request head (up to its blank line); `None` when it outgrows `max` first.
async fn read_head(stream: &mut TcpStream, max: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let complete = |head: &[u8]| head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n");
    while !complete(&head) {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > max {
            return Ok(None);
        }
    }
    Ok(Some(head))
}

/// `GET /metrics HTTP/1.x` (a query string is ignored); anything else is refused.
fn check(head: &[u8]) -> Result<(), (u16, String)> {
    let line = String::from_utf8_lossy(head.split(|b| *b == b'\n').next().unwrap_or_default()).trim_end().to_owned();
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts[..] else {
        return Err((400, format!("expected a request line like: GET {PATH} HTTP/1.1\n")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err((400, format!("expected a request line like: GET {PATH} HTTP/1.1\n")));
    }
    if target.split('?').next() != Some(PATH) {
        return Err((404, format!("only {PATH} is served\n")));
    }
    if method != "GET" {
        return Err((405, format!("{PATH} is read-only: only GET is served\n")));
    }
    Ok(())
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        _ => "Request Header Fields Too Large",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    async fn start(limits: Limits) -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<Infallible>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let builds = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&builds);
        let task = tokio::spawn(serve(listener, limits, move || {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            Exposition { openmetrics: format!("spillway_builds {n}\n# EOF\n"), text: format!("spillway_builds {n}\n") }
        }));
        (addr, builds, task)
    }

    async fn ask(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn serves_metrics_built_at_most_once_per_max_age() {
        let (addr, builds, task) = start(Limits { max_age: Duration::from_millis(300), ..Limits::default() }).await;
        let prometheus = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n";
        let first = ask(addr, prometheus).await;
        assert!(
            first.starts_with("HTTP/1.0 200 OK\r\n") && first.contains(OPENMETRICS) && first.ends_with("spillway_builds 1\n# EOF\n"),
            "{first}"
        );
        for _ in 0..5 {
            let plain = ask(addr, b"GET /metrics?x=1 HTTP/1.0\n\n").await;
            assert!(plain.contains(TEXT) && plain.ends_with("\r\n\r\nspillway_builds 1\n"), "{plain}");
        }
        assert_eq!(builds.load(Ordering::SeqCst), 1, "scrapes within max_age share one build");
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert!(ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await.contains("spillway_builds 2\n"));
        task.abort();
    }

    #[tokio::test]
    async fn refuses_everything_else() {
        let (addr, builds, task) = start(Limits { head_bytes: 256, head_timeout: Duration::from_millis(200), ..Limits::default() }).await;
        for (request, status) in [
            (&b"POST /metrics HTTP/1.1\r\n\r\n"[..], "405"),
            (b"GET /ports HTTP/1.1\r\n\r\n", "404"),
            (b"GET /metrics\r\n\r\n", "400"),
            (b"GET /metrics SPDY/3\r\n\r\n", "400"),
        ] {
            let answer = ask(addr, request).await;
            assert!(answer.starts_with(&format!("HTTP/1.0 {status} ")), "{request:?}: {answer}");
        }
        let long = format!("GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(300));
        assert!(ask(addr, long.as_bytes()).await.starts_with("HTTP/1.0 431 "));
        assert!(ask(addr, b"GET /metrics HTTP/1.1\r\n").await.starts_with("HTTP/1.0 408 "), "an unfinished head times out");
        assert_eq!(builds.load(Ordering::SeqCst), 0, "no refused request builds the body");
        task.abort();
    }

    #[tokio::test]
    async fn connections_beyond_the_limit_wait() {
        let (addr, _, task) = start(Limits { connections: 1, head_timeout: Duration::from_millis(500), ..Limits::default() }).await;
        // A silent client holds the only slot until its head times out.
        let _silent = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        assert!(ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n").await.starts_with("HTTP/1.0 200 "));
        assert!(started.elapsed() >= Duration::from_millis(350), "served only after the slot was freed: {:?}", started.elapsed());
        task.abort();
    }

    #[test]
    fn listen_parses_addresses_and_off() {
        assert_eq!("off".parse::<MetricsListen>(), Ok(MetricsListen::Off));
        assert_eq!("[::1]:9476".parse::<MetricsListen>(), Ok(MetricsListen::On("[::1]:9476".parse().unwrap())));
        assert!("9476".parse::<MetricsListen>().unwrap_err().contains("expected ADDR:PORT"));
        assert_eq!(MetricsListen::On("127.0.0.1:9476".parse().unwrap()).to_string(), "127.0.0.1:9476");
    }
}
