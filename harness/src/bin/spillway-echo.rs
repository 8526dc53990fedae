//! Test server for Spillway's integration tests.
//!
//! TCP: greets every connection with `"<name>\n"`, then echoes each line back
//! until the peer closes, so a test can tell which backend it reached and
//! keep a connection streaming to notice when it breaks.
//! UDP: answers every datagram with `"<name>\n"` from the bound address; bind
//! the VIP explicitly so DSR replies carry it as their source.
//!
//! Prints "ready" once every listener is bound. One thread per listener and
//! per TCP connection: simple, and plenty for test loads.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use nix::sys::socket::{AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt, sockopt};

/// Echo/identify server for load-balancer tests.
#[derive(Parser)]
struct Args {
    /// Name sent to every client (usually the backend host's name).
    #[arg(long)]
    name: String,
    /// TCP address to listen on (repeatable), e.g. `0.0.0.0:80` or `[::]:80`.
    #[arg(long)]
    tcp: Vec<SocketAddr>,
    /// UDP address to answer on (repeatable), e.g. 10.100.0.1:5353.
    #[arg(long)]
    udp: Vec<SocketAddr>,
}

/// Longest line echoed; longer input closes the connection.
const MAX_LINE: u64 = 64 * 1024;
/// Pause after a failed accept (e.g. out of file descriptors) before retrying.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

fn main() -> Result<()> {
    let args = Args::parse();
    if args.tcp.is_empty() && args.udp.is_empty() {
        bail!("nothing to serve: give --tcp and/or --udp");
    }
    let greeting: Arc<str> = format!("{}\n", args.name).into();
    // Each serving thread reports here if it ever stops; that ends the process.
    let (failed, failure) = mpsc::channel();
    for addr in args.tcp {
        let listener = tcp_listener(addr).with_context(|| format!("listening on TCP {addr}"))?;
        spawn_server(&failed, addr, serve_tcp(listener, Arc::clone(&greeting)));
    }
    for addr in args.udp {
        let socket = udp_socket(addr).with_context(|| format!("binding UDP {addr}"))?;
        spawn_server(&failed, addr, serve_udp(socket, Arc::clone(&greeting)));
    }
    println!("ready");
    std::io::stdout().flush()?;
    drop(failed);
    match failure.recv() {
        Ok(err) => Err(err),
        Err(_) => bail!("all servers stopped"),
    }
}

fn spawn_server(failed: &Sender<anyhow::Error>, addr: SocketAddr, serve: impl FnOnce() -> Result<()> + Send + 'static) {
    let failed = failed.clone();
    std::thread::spawn(move || {
        let err = serve().err().unwrap_or_else(|| anyhow::anyhow!("stopped"));
        let _ = failed.send(err.context(format!("serving {addr}")));
    });
}

fn serve_tcp(listener: TcpListener, greeting: Arc<str>) -> impl FnOnce() -> Result<()> {
    move || loop {
        match listener.accept() {
            Ok((conn, peer)) => {
                // One line per connection: tests count what reached this backend, per client.
                println!("accepted {}", peer.ip());
                let greeting = Arc::clone(&greeting);
                std::thread::spawn(move || {
                    if let Err(err) = echo_lines(conn, &greeting) {
                        eprintln!("connection from {peer}: {err:#}");
                    }
                });
            }
            Err(err) => {
                eprintln!("accept: {err}");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
}

/// Greets, then echoes lines until the peer closes.
fn echo_lines(mut conn: TcpStream, greeting: &str) -> Result<()> {
    conn.set_nodelay(true)?;
    conn.write_all(greeting.as_bytes())?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = Vec::new();
    loop {
        line.clear();
        let len = (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line)?;
        if len == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            bail!("line longer than {MAX_LINE} bytes or cut short");
        }
        conn.write_all(&line)?;
    }
}

fn serve_udp(socket: UdpSocket, greeting: Arc<str>) -> impl FnOnce() -> Result<()> {
    move || {
        let mut buf = [0; 2048];
        loop {
            let (_, peer) = socket.recv_from(&mut buf).context("receiving")?;
            if let Err(err) = socket.send_to(greeting.as_bytes(), peer) {
                eprintln!("reply to {peer}: {err}");
            }
        }
    }
}

fn tcp_listener(addr: SocketAddr) -> Result<TcpListener> {
    let fd = bound_socket(addr, SockType::Stream)?;
    listen(&fd, Backlog::new(1024)?)?;
    Ok(TcpListener::from(fd))
}

fn udp_socket(addr: SocketAddr) -> Result<UdpSocket> {
    Ok(UdpSocket::from(bound_socket(addr, SockType::Datagram)?))
}

/// A socket bound to `addr` with SO_REUSEADDR (quick restarts) and, for IPv6,
/// `IPV6_V6ONLY`, so `0.0.0.0:P` and `[::]:P` can both be bound.
fn bound_socket(addr: SocketAddr, kind: SockType) -> Result<OwnedFd> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = nix::sys::socket::socket(family, kind, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &true)?;
    }
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(fd)
}
