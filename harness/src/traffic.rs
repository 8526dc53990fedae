//! Short-lived TCP and UDP exchanges with `spillway-echo`, run from inside a
//! host namespace via [`crate::Netns::in_netns`].

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

/// Replies are a backend name and a newline; anything longer is garbage.
const MAX_LINE: u64 = 256;
/// How many failure messages a [`Tally`] keeps.
const KEPT_ERRORS: usize = 5;

/// Connects over TCP, reads the greeting line (the backend's name) and
/// closes. Connecting and reading are each bounded by `timeout`.
pub fn tcp_ask(addr: SocketAddr, timeout: Duration) -> Result<String> {
    let stream = TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("TCP connect to {addr}"))?;
    stream.set_read_timeout(Some(timeout))?;
    let mut reader = BufReader::new(stream);
    read_line(&mut reader).with_context(|| format!("reading backend name from {addr}"))
}

/// Sends one UDP datagram and returns the reply (the backend's name),
/// waiting at most `timeout`. One attempt: a lost datagram is an error.
pub fn udp_ask(addr: SocketAddr, timeout: Duration) -> Result<String> {
    udp_ask_with(addr, b"?\n", timeout)
}

/// [`udp_ask`] with `payload` as the datagram: one larger than the path's MTU leaves the
/// sender in fragments, and is answered only once the backend's kernel has reassembled it.
pub fn udp_ask_with(addr: SocketAddr, payload: &[u8], timeout: Duration) -> Result<String> {
    let any: IpAddr = match addr {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0)).context("binding a UDP socket")?;
    // connect() also makes the kernel drop replies from any other source,
    // e.g. a backend answering from its own address instead of the VIP.
    socket.connect(addr).with_context(|| format!("UDP connect to {addr}"))?;
    socket.set_read_timeout(Some(timeout))?;
    socket.send(payload).with_context(|| format!("UDP send to {addr}"))?;
    let mut buf = [0; MAX_LINE as usize];
    let len = socket.recv(&mut buf).with_context(|| format!("waiting up to {timeout:?} for a UDP reply from {addr}"))?;
    let reply = String::from_utf8_lossy(&buf[..len]).trim().to_owned();
    ensure!(!reply.is_empty(), "empty UDP reply from {addr}");
    Ok(reply)
}

/// Counts of which backend answered, over a run of connections.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Successful connections per backend name.
    pub by_backend: BTreeMap<String, usize>,
    /// Connections that failed (connect, read or timeout).
    pub failures: usize,
    /// The messages of the first few failures.
    pub errors: Vec<String>,
}

impl Tally {
    /// Connections that returned a backend name.
    pub fn successes(&self) -> usize {
        self.by_backend.values().sum()
    }

    /// Counts one exchange: who answered, or why it failed.
    pub fn record(&mut self, outcome: Result<String>) {
        match outcome {
            Ok(name) => *self.by_backend.entry(name).or_default() += 1,
            Err(err) => {
                self.failures += 1;
                if self.errors.len() < KEPT_ERRORS {
                    self.errors.push(format!("{err:#}"));
                }
            }
        }
    }
}

/// Opens `count` sequential TCP connections with [`tcp_ask`], `interval`
/// apart, and tallies who answered. Takes at most about
/// `count * (interval + 2 * timeout)`.
pub fn run_connections(addr: SocketAddr, count: usize, interval: Duration, timeout: Duration) -> Tally {
    let mut tally = Tally::default();
    for i in 0..count {
        if i > 0 {
            std::thread::sleep(interval);
        }
        tally.record(tcp_ask(addr, timeout));
    }
    tally
}

/// Reads one line, at most [`MAX_LINE`] bytes, without the newline.
pub(crate) fn read_line(reader: &mut impl BufRead) -> Result<String> {
    let mut line = String::new();
    let len = reader.take(MAX_LINE).read_line(&mut line)?;
    if len == 0 {
        bail!("connection closed before a line arrived");
    }
    if !line.ends_with('\n') {
        bail!("incomplete line {line:?}");
    }
    Ok(line.trim_end().to_owned())
}
