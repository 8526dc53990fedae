//! The client of `echo-server`: sends `--message` on `--requests` streams of one connection
//! and prints each reply. With `--rebind` it moves to a new local UDP port before every
//! request after the first, as a NAT rebinding does, so the later requests reach the server
//! only by their connection id. With `--control FILE` (a FIFO) it takes its orders from
//! that file instead, one a line, so a test can change the world between two requests:
//! `request` (prints `event=reply seq=N local=ADDR server_id=HEX name=NAME`) and
//! `rebind ADDR` (a new local socket at ADDR, port 0 for any; prints `event=rebound seq=N
//! local=ADDR`); it closes the connection at the file's end.
//!
//! ```text
//! cargo run -p spillway-quic-lb --example echo-client -- \
//!     --connect 127.0.0.1:4433 --ca /tmp/echo.der --requests 3 --rebind
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use quinn::rustls::pki_types::CertificateDer;

#[allow(dead_code)] // its server half serves echo-server
mod support;

#[derive(Parser)]
struct Args {
    /// The server (or VIP) address.
    #[arg(long)]
    connect: SocketAddr,
    /// The local address to start from (default: any address, any port).
    #[arg(long)]
    bind: Option<SocketAddr>,
    /// Certificates (DER, as `echo-server --cert-out` writes them) to trust; repeatable.
    #[arg(long, required = true)]
    ca: Vec<PathBuf>,
    #[arg(long, default_value = "hello")]
    message: String,
    /// Requests, each on its own stream of the one connection.
    #[arg(long, default_value_t = 1)]
    requests: u32,
    /// Move to a new local port before each request after the first.
    #[arg(long)]
    rebind: bool,
    /// Give up on the whole exchange after this many seconds (with `--control`: on each
    /// order).
    #[arg(long, default_value_t = 10)]
    timeout_s: u64,
    /// Take orders from this file (a FIFO) instead of `--requests` and `--rebind`.
    #[arg(long, conflicts_with_all = ["requests", "rebind"])]
    control: Option<PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut certs = Vec::new();
    for path in &args.ca {
        certs.push(CertificateDer::from(std::fs::read(path).with_context(|| format!("--ca {}", path.display()))?));
    }
    let socket = match args.bind {
        Some(local) => std::net::UdpSocket::bind(local).with_context(|| format!("--bind {local}"))?,
        None => support::local_socket(args.connect)?,
    };
    let endpoint = support::client_endpoint(socket, certs)?;
    let timeout = Duration::from_secs(args.timeout_s);
    if let Some(path) = &args.control {
        let orders = tokio::fs::File::open(path).await.with_context(|| format!("--control {}", path.display()))?;
        support::controlled(&endpoint, args.connect, args.message.as_bytes(), orders, timeout).await?;
        endpoint.wait_idle().await;
        return Ok(());
    }
    let exchange = support::exchange(&endpoint, args.connect, args.message.as_bytes(), args.requests, args.rebind);
    let Ok(replies) = tokio::time::timeout(timeout, exchange).await else {
        bail!("no reply within {} s (--timeout-s)", args.timeout_s);
    };
    for reply in replies? {
        println!("{}", String::from_utf8_lossy(&reply).trim_end());
    }
    endpoint.wait_idle().await;
    Ok(())
}
