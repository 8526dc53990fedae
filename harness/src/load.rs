//! Open-loop HTTP load from a client namespace: `GET /work` on new connections at a paced
//! rate, for overload tests against `spillway-capacity` servers.
//!
//! Open loop: every request starts at its scheduled time whether or not earlier ones have
//! answered (no coordinated omission), up to a cap on requests in flight; a request due
//! beyond the cap counts as not sent. Each request runs on its own connection, closed with
//! `SO_LINGER 0` (a reset) once answered: the client keeps no TIME_WAIT, so its ephemeral
//! ports are reused at once and thousands of connections a second do not run out of them.
//!
//! One thread, which joins the client's namespace and runs a single-threaded tokio runtime.

use std::fs::File;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use nix::sched::{CloneFlags, setns};
use nix::sys::socket::{setsockopt, sockopt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::host::Host;

/// Longest run, so a mistaken call still ends by itself.
const MAX_DURATION: Duration = Duration::from_secs(600);
/// Longest response read; the capacity server's are under 200 bytes.
const MAX_RESPONSE: u64 = 4096;
/// How many failure messages a [`LoadReport`] keeps.
const KEPT_ERRORS: usize = 5;
const REQUEST: &[u8] = b"GET /work HTTP/1.1\r\nHost: spillway\r\nConnection: close\r\n\r\n";

/// What to send, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct LoadConfig {
    /// Where `GET /work` goes, e.g. the VIP and the capacity servers' port.
    pub target: SocketAddr,
    /// New requests per second at the start; see [`Load::set_rate`].
    pub rate_per_s: u32,
    /// How long requests are started for.
    pub duration: Duration,
    /// Bound on each request, connect to last byte; one over it fails as timed out.
    pub timeout: Duration,
    /// Most requests in flight at once; a request due beyond it is not sent. Each holds a
    /// file descriptor, so this must stay under `RLIMIT_NOFILE`.
    pub max_in_flight: usize,
}

impl LoadConfig {
    /// `rate_per_s` requests a second to `target` for `duration`, each bounded by 2 s, at
    /// most 4000 in flight (a 2 s timeout at 1000/s needs 2000).
    pub fn new(target: SocketAddr, rate_per_s: u32, duration: Duration) -> LoadConfig {
        LoadConfig { target, rate_per_s, duration, timeout: Duration::from_secs(2), max_in_flight: 4000 }
    }
}

/// The fate of the requests scheduled in one second of a run (counted by the second they
/// were due, whenever they finished): `attempted == ok + rejected + failed + not_sent`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Requests due.
    pub attempted: u64,
    /// Answered `200`.
    pub ok: u64,
    /// Answered `503` (a backend at capacity).
    pub rejected: u64,
    /// No valid answer: refused, reset, timed out, or another status.
    pub failed: u64,
    /// The part of `failed` that ran into [`LoadConfig::timeout`].
    pub timed_out: u64,
    /// Due while [`LoadConfig::max_in_flight`] requests were in flight, so not started.
    pub not_sent: u64,
}

impl Bucket {
    fn add(&mut self, other: &Bucket) {
        self.attempted += other.attempted;
        self.ok += other.ok;
        self.rejected += other.rejected;
        self.failed += other.failed;
        self.timed_out += other.timed_out;
        self.not_sent += other.not_sent;
    }
}

/// What a run saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// One per second from the run's start, up to the last second a request was due in.
    pub buckets: Vec<Bucket>,
    /// The sum of the buckets.
    pub totals: Bucket,
    /// How late the generator started a request at worst: well under a second means it
    /// kept its schedule and was not the bottleneck.
    pub max_start_lag: Duration,
    /// The messages of the first few failures.
    pub errors: Vec<String>,
}

/// A run of load in the background; see the module docs. Dropping it stops the run.
#[derive(Debug)]
pub struct Load {
    start: Instant,
    rate: Option<watch::Sender<u32>>,
    thread: Option<JoinHandle<Result<LoadReport>>>,
}

impl Load {
    /// Starts sending from `host`'s namespace. Returns at once; the run's clock starts now.
    pub fn start(host: &Host, config: LoadConfig) -> Result<Load> {
        ensure!(config.duration <= MAX_DURATION, "load for {:?} is longer than {MAX_DURATION:?}", config.duration);
        let netns = File::open(host.netns().path()).with_context(|| format!("opening the namespace of {}", host.name()))?;
        let (rate, rate_changes) = watch::channel(config.rate_per_s);
        let start = Instant::now();
        let thread = std::thread::Builder::new()
            .name(format!("load-{}", host.name()))
            .spawn(move || {
                setns(&netns, CloneFlags::CLONE_NEWNET).context("entering the client namespace")?;
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
                Ok(runtime.block_on(run(config, start, rate_changes)))
            })
            .context("spawning the load thread")?;
        Ok(Load { start, rate: Some(rate), thread: Some(thread) })
    }

    /// Time since the run started: events of a test (say, backends going down at 5.2 s)
    /// line up with the report's buckets.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Changes the rate from now on; 0 pauses.
    pub fn set_rate(&self, rate_per_s: u32) {
        if let Some(rate) = &self.rate {
            rate.send_replace(rate_per_s);
        }
    }

    /// Waits for the run to end and the last requests to finish.
    pub fn wait(mut self) -> Result<LoadReport> {
        self.join()
    }

    /// Starts no more requests, waits for those in flight (at most the request timeout).
    pub fn stop(mut self) -> Result<LoadReport> {
        self.rate.take();
        self.join()
    }

    fn join(&mut self) -> Result<LoadReport> {
        let thread = self.thread.take().expect("joined only once");
        thread.join().map_err(|_| anyhow!("the load thread panicked"))?
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.rate.take();
        if let Some(thread) = self.thread.take() {
            // The report is unwanted here.
            let _ = thread.join();
        }
    }
}

enum Outcome {
    Ok,
    Rejected,
    Failed(String),
    TimedOut,
}

/// Starts requests on schedule until the duration is over or the sender of `rate` is
/// dropped, then waits for the ones in flight.
async fn run(config: LoadConfig, start: Instant, mut rate: watch::Receiver<u32>) -> LoadReport {
    let end = start + config.duration;
    let mut report = LoadReport::default();
    let mut in_flight: JoinSet<(usize, Outcome)> = JoinSet::new();
    let mut pace = Pace::new(start, *rate.borrow_and_update());
    let mut last_due = start;
    loop {
        let wake = pace.as_ref().map_or(end, |p| p.due().min(end));
        tokio::select! {
            changed = rate.changed() => {
                if changed.is_err() {
                    break;
                }
                let new_rate = *rate.borrow_and_update();
                // One spacing after the last request, but never a burst to catch up.
                let spacing = Duration::from_secs(1) / new_rate.max(1);
                pace = Pace::new((last_due + spacing).max(Instant::now()), new_rate);
            }
            () = tokio::time::sleep_until(wake) => {}
        }
        while let Some(done) = in_flight.try_join_next() {
            record(&mut report, done);
        }
        let now = Instant::now();
        while let Some(p) = pace.as_mut() {
            let due = p.due();
            if due > now || due >= end {
                break;
            }
            let second = (due - start).as_secs() as usize;
            bucket(&mut report, second).attempted += 1;
            if in_flight.len() >= config.max_in_flight {
                bucket(&mut report, second).not_sent += 1;
            } else {
                report.max_start_lag = report.max_start_lag.max(now - due);
                in_flight.spawn(request(config.target, config.timeout, second));
            }
            last_due = due;
            p.count += 1;
        }
        if now >= end {
            break;
        }
    }
    while let Some(done) = in_flight.join_next().await {
        record(&mut report, done);
    }
    for b in &report.buckets {
        report.totals.add(b);
    }
    report
}

/// Due times at a steady rate from an anchor. Computed from the count rather than by adding
/// up a rounded spacing, so every second holds exactly `rate` requests.
struct Pace {
    anchor: Instant,
    rate: u64,
    count: u64,
}

impl Pace {
    /// `None` for rate 0 (paused).
    fn new(anchor: Instant, rate_per_s: u32) -> Option<Pace> {
        (rate_per_s > 0).then_some(Pace { anchor, rate: rate_per_s.into(), count: 0 })
    }

    fn due(&self) -> Instant {
        self.anchor + Duration::from_nanos(self.count * 1_000_000_000 / self.rate)
    }
}

fn bucket(report: &mut LoadReport, second: usize) -> &mut Bucket {
    if report.buckets.len() <= second {
        report.buckets.resize(second + 1, Bucket::default());
    }
    &mut report.buckets[second]
}

fn record(report: &mut LoadReport, done: Result<(usize, Outcome), tokio::task::JoinError>) {
    let (second, outcome) = done.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
    let b = bucket(report, second);
    match outcome {
        Outcome::Ok => b.ok += 1,
        Outcome::Rejected => b.rejected += 1,
        Outcome::TimedOut => {
            b.failed += 1;
            b.timed_out += 1;
        }
        Outcome::Failed(err) => {
            b.failed += 1;
            if report.errors.len() < KEPT_ERRORS {
                report.errors.push(err);
            }
        }
    }
}

async fn request(target: SocketAddr, timeout: Duration, second: usize) -> (usize, Outcome) {
    let outcome = match tokio::time::timeout(timeout, exchange(target)).await {
        Ok(Ok(200)) => Outcome::Ok,
        Ok(Ok(503)) => Outcome::Rejected,
        Ok(Ok(status)) => Outcome::Failed(format!("status {status}")),
        Ok(Err(err)) => Outcome::Failed(format!("{err:#}")),
        Err(_) => Outcome::TimedOut,
    };
    (second, outcome)
}

/// One `GET /work` on a new connection; the response status.
pub(crate) async fn exchange(target: SocketAddr) -> Result<u16> {
    let socket = if target.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    // Reset on close: no TIME_WAIT (see the module docs). A zero linger never blocks.
    setsockopt(&socket, sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 })?;
    let mut conn = socket.connect(target).await.context("connect")?;
    conn.write_all(REQUEST).await.context("sending the request")?;
    let mut response = Vec::with_capacity(256);
    // The server closes after answering.
    (&mut conn).take(MAX_RESPONSE).read_to_end(&mut response).await.context("reading the response")?;
    parse_status(&response).with_context(|| format!("not an HTTP response: {:?}", String::from_utf8_lossy(&response)))
}

/// The status code of a response starting `HTTP/1.x NNN`.
pub(crate) fn parse_status(response: &[u8]) -> Option<u16> {
    let rest = response.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5).filter(|_| rest.get(1) == Some(&b' '))?;
    std::str::from_utf8(code).ok()?.parse().ok()
}

/// Width of the bar of a second in which every attempted request succeeded.
const BAR_WIDTH: u64 = 50;

/// A text goodput curve, one line a second: ok/s with a bar, then what did not succeed.
/// Bars are scaled to the highest attempted rate of the run, so a full bar means every
/// request of the busiest second succeeded, and runs at the same rate compare by eye.
pub fn render_curve(label: &str, buckets: &[Bucket]) -> String {
    let scale = buckets.iter().map(|b| b.attempted).max().unwrap_or(0).max(1);
    let mut out = format!("{label}: goodput per second (bar: ok of {scale} attempted/s at most)\n");
    out.push_str(&format!("{:>4} {:>6} {:w$} {:>6} {:>6} {:>6}\n", "t", "ok/s", "", "rej", "fail", "unsent", w = BAR_WIDTH as usize + 2));
    for (t, b) in buckets.iter().enumerate() {
        let bar = "#".repeat((b.ok * BAR_WIDTH).div_ceil(scale) as usize);
        out.push_str(&format!(
            "{t:>3}s {:>6} |{bar:<w$}| {:>6} {:>6} {:>6}\n",
            b.ok,
            b.rejected,
            b.failed,
            b.not_sent,
            w = BAR_WIDTH as usize
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_lines() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n\r\n"), Some(200));
        assert_eq!(parse_status(b"HTTP/1.0 503 Service Unavailable\r\n"), Some(503));
        assert_eq!(parse_status(b"HTTP/1.1 20"), None);
        assert_eq!(parse_status(b"SSH-2.0-x"), None);
        assert_eq!(parse_status(b""), None);
    }

    #[test]
    fn curve_has_a_line_per_second_scaled_to_the_busiest() {
        let full = Bucket { attempted: 100, ok: 100, ..Bucket::default() };
        let half = Bucket { attempted: 100, ok: 50, rejected: 30, failed: 20, ..Bucket::default() };
        let curve = render_curve("run", &[full, half]);
        let lines: Vec<&str> = curve.lines().collect();
        assert_eq!(lines.len(), 4, "{curve}");
        assert_eq!(lines[2].matches('#').count(), BAR_WIDTH as usize, "{curve}");
        assert_eq!(lines[3].matches('#').count(), BAR_WIDTH as usize / 2, "{curve}");
        assert!(lines[3].ends_with("    30     20      0"), "{curve}");
    }
}
