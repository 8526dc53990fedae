//! Capacity-limited HTTP/1.1 test server: a backend that, like a real one, can only do so
//! much at once.
//!
//! One request per connection, then the server closes:
//! - `GET /work`: takes one of `--concurrency` slots for `--service-ms`, then `200`; with
//!   every slot taken, `503` at once. So no more than C requests are ever in service.
//!   A slot is busy for exactly the service time, even if the runtime answers a little
//!   late: timer and scheduling jitter (1-5 ms per request on a loaded test machine) would
//!   otherwise cost several percent of the capacity.
//! - `GET /health`: `503` while the server is shedding, i.e. it rejected more than
//!   [`SHEDDING_PERCENT`] of `/work` in the current or the last second: an overloaded
//!   server asking to be taken out of rotation, as the routers of the Gmail outage did.
//!   Else `200`.
//! - SIGUSR1 toggles a [`SLOW_HEALTH`] delay before `/health` answers: a backend that got
//!   slow, for the latency-based health tests.
//! - `GET /stats`: JSON `{served, rejected, health_busy, max_in_service, in_service}`.
//!
//! Prints "ready" once every listener is bound. One thread runs everything (tokio), so
//! thousands of connections cost no threads. SIGTERM ends it at once (default action):
//! there is nothing to flush.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::timeout;

/// Capacity-limited HTTP server for overload tests.
#[derive(Parser)]
struct Args {
    /// Address to listen on (repeatable), e.g. `0.0.0.0:8080` or `[::]:8080`.
    #[arg(long, required = true)]
    listen: Vec<SocketAddr>,
    /// Most `/work` requests in service at once; more are rejected with 503.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// How long a `/work` request is in service, in milliseconds.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    service_ms: u64,
}

/// Share of `/work` rejected (in percent, over a one-second window) above which `/health`
/// fails. A few rejections at a busy instant are no overload; sustained shedding is.
const SHEDDING_PERCENT: u64 = 5;

/// How long `/health` takes while slowed by SIGUSR1.
const SLOW_HEALTH: Duration = Duration::from_millis(200);

/// Longest request head read; a longer one is answered 400.
const MAX_REQUEST: usize = 8 * 1024;
/// How long a client may take to send its request, and to take the response.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Most connections open at once; more are closed unanswered, so a flood of idle
/// connections cannot exhaust file descriptors.
const MAX_OPEN: usize = 8192;
/// Pause after a failed accept (e.g. out of file descriptors) before retrying.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
const BACKLOG: u32 = 4096;

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> Result<()> {
    let server = Arc::new(Server::new(args.concurrency as usize, Duration::from_millis(args.service_ms)));
    let mut usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).context("handling SIGUSR1")?;
    let toggled = Arc::clone(&server);
    tokio::spawn(async move {
        while usr1.recv().await.is_some() {
            toggled.slow_health.fetch_xor(true, Ordering::Relaxed);
        }
    });
    let mut accepting = JoinSet::new();
    for addr in args.listen {
        let listener = listen(addr).with_context(|| format!("listening on {addr}"))?;
        accepting.spawn(accept(listener, Arc::clone(&server)));
    }
    println!("ready");
    // Accept loops never return; only a panic ends one.
    let ended = accepting.join_next().await;
    bail!("an accept loop ended: {ended:?}")
}

async fn accept(listener: TcpListener, server: Arc<Server>) -> Infallible {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let Some(open) = Counted::enter(&server.open, MAX_OPEN) else { continue };
                let server = Arc::clone(&server);
                tokio::spawn(async move {
                    let _open = open;
                    // A client that went away mid-request is its own business: nothing to log.
                    let _ = server.handle(conn).await;
                });
            }
            Err(err) => {
                eprintln!("accept: {err}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

struct Server {
    service: Duration,
    /// Until when each slot is busy.
    slots: Mutex<Vec<Instant>>,
    max_in_service: AtomicUsize,
    served: AtomicU64,
    rejected: AtomicU64,
    health_busy: AtomicU64,
    open: Arc<AtomicUsize>,
    /// `/health` waits [`SLOW_HEALTH`] before answering (toggled by SIGUSR1).
    slow_health: AtomicBool,
    /// `/work` outcomes of the current and the previous second.
    windows: Mutex<Windows>,
}

/// `(requests, rejected)` of the current second (started at `started`) and the one before.
struct Windows {
    started: Instant,
    current: (u64, u64),
    previous: (u64, u64),
}

impl Windows {
    fn roll(&mut self, now: Instant) {
        let elapsed = now.duration_since(self.started);
        if elapsed >= Duration::from_secs(2) {
            self.previous = (0, 0);
            self.current = (0, 0);
            self.started = now;
        } else if elapsed >= Duration::from_secs(1) {
            self.previous = self.current;
            self.current = (0, 0);
            self.started += Duration::from_secs(1);
        }
    }

    fn shedding(&self) -> bool {
        let over = |(requests, rejected): (u64, u64)| requests > 0 && rejected * 100 > requests * SHEDDING_PERCENT;
        over(self.current) || over(self.previous)
    }
}

impl Server {
    fn new(concurrency: usize, service: Duration) -> Server {
        let slots = Mutex::new(vec![Instant::now(); concurrency]);
        Server {
            service,
            slots,
            max_in_service: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            health_busy: AtomicU64::new(0),
            open: Arc::new(AtomicUsize::new(0)),
            slow_health: AtomicBool::new(false),
            windows: Mutex::new(Windows { started: Instant::now(), current: (0, 0), previous: (0, 0) }),
        }
    }

    async fn handle(&self, mut conn: TcpStream) -> Result<()> {
        let head = timeout(IO_TIMEOUT, read_head(&mut conn)).await??;
        let (status, content_type, body) = match parse_request_line(&head) {
            Some(("GET", "/work")) => (self.work().await, "text/plain", String::new()),
            Some(("GET", "/health")) => {
                if self.slow_health.load(Ordering::Relaxed) {
                    tokio::time::sleep(SLOW_HEALTH).await;
                }
                (self.health(), "text/plain", String::new())
            }
            Some(("GET", "/stats")) => (200, "application/json", self.stats()),
            Some(("GET", _)) => (404, "text/plain", String::new()),
            Some(_) => (405, "text/plain", String::new()),
            None => (400, "text/plain", String::new()),
        };
        let body = if body.is_empty() { format!("{}\n", reason(status)) } else { body };
        let response = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            reason(status),
            body.len()
        );
        timeout(IO_TIMEOUT, conn.write_all(response.as_bytes())).await??;
        Ok(())
    }

    /// Serves the request in a free slot, or rejects it at once.
    async fn work(&self) -> u16 {
        let slot = self.take_slot();
        {
            let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            windows.roll(Instant::now());
            windows.current.0 += 1;
            windows.current.1 += u64::from(slot.is_none());
        }
        let Some(done) = slot else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
            return 503;
        };
        tokio::time::sleep_until(done.into()).await;
        self.served.fetch_add(1, Ordering::Relaxed);
        200
    }

    /// Makes a free slot busy for the service time; when it is done.
    fn take_slot(&self) -> Option<Instant> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let free = slots.iter().position(|&until| until <= now)?;
        slots[free] = now + self.service;
        let in_service = slots.iter().filter(|&&until| until > now).count();
        self.max_in_service.fetch_max(in_service, Ordering::Relaxed);
        Some(slots[free])
    }

    fn in_service(&self) -> usize {
        let now = Instant::now();
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|&&until| until > now).count()
    }

    fn health(&self) -> u16 {
        let shedding = {
            let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            windows.roll(Instant::now());
            windows.shedding()
        };
        if shedding {
            self.health_busy.fetch_add(1, Ordering::Relaxed);
            503
        } else {
            200
        }
    }

    fn stats(&self) -> String {
        serde_json::json!({
            "served": self.served.load(Ordering::Relaxed),
            "rejected": self.rejected.load(Ordering::Relaxed),
            "health_busy": self.health_busy.load(Ordering::Relaxed),
            "max_in_service": self.max_in_service.load(Ordering::Relaxed),
            "in_service": self.in_service(),
        })
        .to_string()
    }
}

/// An open connection, counted until dropped (also when its task is cancelled).
struct Counted(Arc<AtomicUsize>);

impl Counted {
    /// Counts one more if fewer than `limit` are counted.
    fn enter(counter: &Arc<AtomicUsize>, limit: usize) -> Option<Counted> {
        counter.try_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < limit).then_some(n + 1)).ok()?;
        Some(Counted(Arc::clone(counter)))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads up to the blank line ending the request head (all of a GET request), so closing
/// afterwards leaves nothing unread and sends a FIN rather than a reset that could destroy
/// the response. A longer head is cut at [`MAX_REQUEST`] (and then fails to parse).
async fn read_head(conn: &mut TcpStream) -> Result<Vec<u8>> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") && head.len() < MAX_REQUEST {
        let len = conn.read(&mut buf).await?;
        if len == 0 {
            bail!("connection closed before the request ended");
        }
        head.extend_from_slice(&buf[..len]);
    }
    Ok(head)
}

/// The method and path (without query) of `METHOD PATH HTTP/x`.
fn parse_request_line(head: &[u8]) -> Option<(&str, &str)> {
    let line = head.split(|&b| b == b'\n').next()?;
    let mut parts = std::str::from_utf8(line).ok()?.split_ascii_whitespace();
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/") || parts.next().is_some() {
        return None;
    }
    Some((method, target.split('?').next()?))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    }
}

/// A listener with SO_REUSEADDR (quick restarts) and, for IPv6, `IPV6_V6ONLY`, so
/// `0.0.0.0:P` and `[::]:P` can both be bound.
fn listen(addr: SocketAddr) -> Result<TcpListener> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    if addr.is_ipv6() {
        setsockopt(&socket, sockopt::Ipv6V6Only, &true)?;
    }
    socket.bind(addr)?;
    Ok(socket.listen(BACKLOG)?)
}
