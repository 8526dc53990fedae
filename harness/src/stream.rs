//! Long-lived TCP connections, to check that established flows survive
//! reconfigurations and daemon restarts.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::traffic::read_line;

/// A [`StreamChecker`] stops by itself after this long, so a test that forgets
/// to stop it cannot generate traffic forever.
const MAX_CHECK_DURATION: Duration = Duration::from_secs(600);
/// How many failure messages a [`CheckReport`] keeps.
const KEPT_ERRORS: usize = 5;

/// An open connection to `spillway-echo`: each [`Stream::ping`] sends a line
/// and expects it echoed back.
///
/// Open it inside a namespace ([`crate::Netns::in_netns`]); afterwards it can
/// be used from any thread.
#[derive(Debug)]
pub struct Stream {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    addr: SocketAddr,
    backend: String,
    timeout: Duration,
    sent: u64,
    broken: bool,
}

impl Stream {
    /// Connects and reads the greeting; `timeout` bounds the connect and
    /// every later ping.
    pub fn open(addr: SocketAddr, timeout: Duration) -> Result<Stream> {
        let writer = TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("TCP connect to {addr}"))?;
        writer.set_read_timeout(Some(timeout))?;
        writer.set_write_timeout(Some(timeout))?;
        writer.set_nodelay(true)?;
        let mut reader = BufReader::new(writer.try_clone()?);
        let backend = read_line(&mut reader).with_context(|| format!("reading backend name from {addr}"))?;
        Ok(Stream { reader, writer, addr, backend, timeout, sent: 0, broken: false })
    }

    /// The client's end of the connection (address and source port).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.writer.local_addr()?)
    }

    /// The name of the backend that accepted the connection.
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// Sends a numbered line and waits for its echo. After one failure the
    /// stream counts as broken and every later ping fails at once: a late
    /// echo must not make a lost connection look healthy.
    pub fn ping(&mut self) -> Result<()> {
        ensure!(!self.broken, "stream to {} broke earlier", self.addr);
        let result = self.exchange();
        self.broken = result.is_err();
        result
            .with_context(|| format!("stream to {} (backend {}), ping {} (timeout {:?})", self.addr, self.backend, self.sent, self.timeout))
    }

    fn exchange(&mut self) -> Result<()> {
        self.sent += 1;
        let line = format!("ping {}", self.sent);
        self.writer.write_all(format!("{line}\n").as_bytes())?;
        let echo = read_line(&mut self.reader)?;
        if echo != line {
            bail!("expected echo {line:?}, got {echo:?}");
        }
        Ok(())
    }
}

/// What a [`StreamChecker`] saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// The backend the stream was connected to.
    pub backend: String,
    /// Pings sent.
    pub pings: u64,
    /// Pings that failed.
    pub failures: u64,
    /// The messages of the first few failures.
    pub errors: Vec<String>,
}

/// Pings a [`Stream`] from a background thread every interval until
/// stopped (or dropped, or after 10 minutes at most).
#[derive(Debug)]
pub struct StreamChecker {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<CheckReport>>,
}

impl StreamChecker {
    /// Starts pinging `stream` every `interval`.
    pub fn start(mut stream: Stream, interval: Duration) -> StreamChecker {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(format!("stream-{}", stream.backend))
            .spawn(move || {
                let mut report = CheckReport { backend: stream.backend.clone(), ..CheckReport::default() };
                let deadline = Instant::now() + MAX_CHECK_DURATION;
                while Instant::now() < deadline && matches!(stopped.recv_timeout(interval), Err(RecvTimeoutError::Timeout)) {
                    report.pings += 1;
                    if let Err(err) = stream.ping() {
                        report.failures += 1;
                        if report.errors.len() < KEPT_ERRORS {
                            report.errors.push(format!("{err:#}"));
                        }
                    }
                }
                report
            })
            .expect("spawning a thread");
        StreamChecker { stop: Some(stop), thread: Some(thread) }
    }

    /// Stops pinging and returns what was seen.
    pub fn stop(mut self) -> CheckReport {
        // Dropping the sender wakes the thread up at once.
        self.stop.take();
        let thread = self.thread.take().expect("joined only here or in drop");
        thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }
}

impl Drop for StreamChecker {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            // The report is unwanted here; a panic in the thread was already printed.
            let _ = thread.join();
        }
    }
}
