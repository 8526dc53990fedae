//! Long-lived connections watched from threads: each pings its stream every
//! [`PING_EVERY`] and keeps the time of the first failed ping, which the runner matches
//! against the steps the stream lived through.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::stream::Stream;

const PING_EVERY: Duration = Duration::from_millis(200);
/// A ping waits this long: TCP retransmits across a routing convergence (well under a
/// second with BFD) before the path is back.
pub const PING_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    pings: AtomicU64,
    /// When the failed ping returned its error (since the soak started), and the error: what
    /// broke the stream happened before then (the ping may have been sent a step earlier).
    failure: Mutex<Option<(Duration, String)>>,
}

pub struct Watched {
    pub backend: String,
    /// The client's end, as the balancers see it.
    pub client: Option<std::net::SocketAddr>,
    /// Since the soak started.
    pub opened: Duration,
    /// Where every balancer sent the flow right after it opened (`lbctl flows get`), for
    /// a failure's diagnostics.
    pub placed: String,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watched {
    pub fn start(stream: Stream, soak_start: Instant) -> Watched {
        let shared = Arc::new(Shared::default());
        let backend = stream.backend().to_owned();
        let client = stream.local_addr().ok();
        let opened = soak_start.elapsed();
        let thread = {
            let shared = Arc::clone(&shared);
            let mut stream = stream;
            std::thread::Builder::new()
                .name(format!("soak-{backend}"))
                .spawn(move || {
                    while !shared.stop.load(Ordering::Relaxed) {
                        std::thread::sleep(PING_EVERY);
                        if let Err(err) = stream.ping() {
                            let at = soak_start.elapsed();
                            *shared.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, format!("{err:#}")));
                            return;
                        }
                        shared.pings.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .expect("spawning a thread")
        };
        Watched { backend, client, opened, placed: String::new(), shared, thread: Some(thread) }
    }

    pub fn failure(&self) -> Option<(Duration, String)> {
        self.shared.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn pings(&self) -> u64 {
        self.shared.pings.load(Ordering::Relaxed)
    }

    /// Stops pinging without waiting (a ping in flight may take [`PING_TIMEOUT`]).
    pub fn retire(mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.thread.take();
    }

    /// Stops pinging, waits for the ping in flight, and returns the failure, if any.
    pub fn finish(mut self) -> Option<(Duration, String)> {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.failure()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}
