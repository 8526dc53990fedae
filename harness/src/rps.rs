//! Connection-per-request throughput: the `spillway-http` server (src/bin/spillway-http.rs)
//! on backends, and a closed-loop load that keeps a fixed number of requests in flight from
//! client namespaces, each on a new connection, the next started as soon as one ends. Unlike
//! the paced [`crate::Load`], it finds the most the path under test serves; for benches
//! (report, never assert, its figures).

use std::fs::File;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, ensure};
use nix::sched::{CloneFlags, setns};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::host::Host;
use crate::process::{Daemon, harness_binary};

/// Overrides where the `spillway-http` binary is looked up.
pub const HTTP_BIN_ENV: &str = "SPILLWAY_HTTP_BIN";
const HTTP_BIN: &str = "spillway-http";
/// How long a server may take to bind and print "ready".
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest run, so a mistaken call still ends by itself.
const MAX_DURATION: Duration = Duration::from_secs(120);
/// How many failure messages a [`ClosedLoopReport`] keeps.
const KEPT_ERRORS: usize = 5;

/// Starts `spillway-http` on `host`, listening on `0.0.0.0:port` (the VIPs too, which
/// backends hold) with `threads` threads. Waits until it listens.
pub fn start_http_server(host: &Host, port: u16, threads: u32) -> Result<Daemon> {
    let binary = harness_binary(HTTP_BIN, HTTP_BIN_ENV)?;
    let args = [binary.display().to_string(), "--listen".into(), format!("0.0.0.0:{port}"), "--threads".into(), threads.to_string()];
    let daemon = host.spawn(&args)?;
    daemon.wait_for_output("ready", READY_TIMEOUT).with_context(|| format!("starting spillway-http on {}", host.name()))?;
    Ok(daemon)
}

/// What to send.
#[derive(Clone, Copy, Debug)]
pub struct ClosedLoopConfig {
    /// Where the requests go, e.g. the VIP and the servers' port.
    pub target: SocketAddr,
    /// Requests in flight at once, per client.
    pub concurrency: usize,
    /// How long new requests are started for.
    pub duration: Duration,
    /// Bound on each request, connect to last byte.
    pub timeout: Duration,
}

/// What a run saw, over all clients.
#[derive(Clone, Debug, Default)]
pub struct ClosedLoopReport {
    /// Requests answered `200`.
    pub ok: u64,
    /// Requests that failed or timed out.
    pub failed: u64,
    /// From the start to the last request's end, the longest of the clients'.
    pub elapsed: Duration,
    /// Every answered request's time, connect to close, sorted.
    pub latencies: Vec<Duration>,
    /// The messages of the first few failures.
    pub errors: Vec<String>,
}

impl ClosedLoopReport {
    /// Answered requests per second.
    pub fn per_second(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `p`-th percentile (0..=100) of the answered requests' times.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        let last = self.latencies.len().checked_sub(1)?;
        Some(self.latencies[((last as f64 * p / 100.0).round() as usize).min(last)])
    }

    fn merge(&mut self, other: ClosedLoopReport) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.elapsed = self.elapsed.max(other.elapsed);
        self.latencies.extend(other.latencies);
        for err in other.errors {
            if self.errors.len() < KEPT_ERRORS {
                self.errors.push(err);
            }
        }
    }
}

/// Runs `config` from every one of `clients` at once (one thread each, in its namespace)
/// and returns the merged report.
pub fn closed_loop(clients: &[&Host], config: ClosedLoopConfig) -> Result<ClosedLoopReport> {
    ensure!(config.duration <= MAX_DURATION, "load for {:?} is longer than {MAX_DURATION:?}", config.duration);
    ensure!(config.concurrency > 0, "no requests in flight");
    let threads = clients
        .iter()
        .map(|host| {
            let netns = File::open(host.netns().path()).with_context(|| format!("opening the namespace of {}", host.name()))?;
            std::thread::Builder::new()
                .name(format!("rps-{}", host.name()))
                .spawn(move || -> Result<ClosedLoopReport> {
                    setns(&netns, CloneFlags::CLONE_NEWNET).context("entering the client namespace")?;
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
                    Ok(runtime.block_on(run(config)))
                })
                .context("spawning a load thread")
        })
        .collect::<Result<Vec<_>>>()?;
    let mut report = ClosedLoopReport::default();
    for thread in threads {
        report.merge(thread.join().map_err(|_| anyhow!("a load thread panicked"))??);
    }
    report.latencies.sort_unstable();
    Ok(report)
}

async fn run(config: ClosedLoopConfig) -> ClosedLoopReport {
    let start = Instant::now();
    let end = start + config.duration;
    let mut report = ClosedLoopReport::default();
    let mut in_flight = JoinSet::new();
    let request = move || async move {
        let started = Instant::now();
        let outcome = tokio::time::timeout(config.timeout, crate::load::exchange(config.target)).await;
        (started.elapsed(), outcome)
    };
    for _ in 0..config.concurrency {
        in_flight.spawn(request());
    }
    while let Some(done) = in_flight.join_next().await {
        let (took, outcome) = done.unwrap_or_else(|err| std::panic::resume_unwind(err.into_panic()));
        match outcome {
            Ok(Ok(200)) => {
                report.ok += 1;
                report.latencies.push(took);
            }
            other => {
                report.failed += 1;
                if report.errors.len() < KEPT_ERRORS {
                    report.errors.push(match other {
                        Ok(Ok(status)) => format!("status {status}"),
                        Ok(Err(err)) => format!("{err:#}"),
                        Err(_) => format!("timed out after {:?}", config.timeout),
                    });
                }
            }
        }
        if Instant::now() < end {
            in_flight.spawn(request());
        }
    }
    report.elapsed = start.elapsed();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_the_sorted_times() {
        let report = ClosedLoopReport { latencies: (1..=100).map(Duration::from_millis).collect(), ..ClosedLoopReport::default() };
        assert_eq!(report.percentile(0.0), Some(Duration::from_millis(1)));
        assert_eq!(report.percentile(50.0), Some(Duration::from_millis(51)));
        assert_eq!(report.percentile(99.0), Some(Duration::from_millis(99)));
        assert_eq!(report.percentile(100.0), Some(Duration::from_millis(100)));
        assert_eq!(ClosedLoopReport::default().percentile(50.0), None);
    }

    #[test]
    fn merged_reports_add_up_and_take_the_longest_run() {
        let mut a = ClosedLoopReport { ok: 3, failed: 1, elapsed: Duration::from_secs(2), ..ClosedLoopReport::default() };
        a.merge(ClosedLoopReport { ok: 2, failed: 0, elapsed: Duration::from_secs(3), ..ClosedLoopReport::default() });
        assert_eq!((a.ok, a.failed, a.elapsed), (5, 1, Duration::from_secs(3)));
        assert!((a.per_second() - 5.0 / 3.0).abs() < 1e-9);
    }
}
