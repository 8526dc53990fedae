//! A QUIC echo server that issues QUIC-LB connection ids naming its server id: what the
//! end-to-end tests run on backends behind a QUIC VIP.
//!
//! Each bidirectional stream's request (read to its end, at most 64 KiB) comes back after a
//! line naming the server: `server_id=<hex> name=<name>`. TLS uses a fresh self-signed
//! certificate for `localhost` (ALPN `spillway-quic-echo`); `--cert-out` writes it (DER) for
//! `echo-client --ca`.
//!
//! ```text
//! cargo run -p spillway-quic-lb --example echo-server -- \
//!     --listen 127.0.0.1:4433 --server-id 0a01 --nonce-len 6 --cert-out /tmp/echo.der
//! ```

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use spillway_quic_lb::{QUIC_LB_F_SELF_LEN, QuicLbConfig, QuicLbGenerator, ServerId};

#[allow(dead_code)] // its client half serves echo-client
mod support;

#[derive(Parser)]
struct Args {
    /// UDP address to serve on.
    #[arg(long)]
    listen: SocketAddr,
    /// This server's id, hex (1..=15 octets); its length is the configuration's server id length.
    #[arg(long)]
    server_id: ServerId,
    /// Config rotation codepoint, 0..=6.
    #[arg(long, default_value_t = 0)]
    config_id: u8,
    /// Octets of nonce (at least 4; server id and nonce at most 19).
    #[arg(long, default_value_t = 6)]
    nonce_len: u8,
    /// Write the id's length into its first octet (draft §3.3) instead of random bits.
    #[arg(long)]
    self_len: bool,
    /// Name in the replies (default: the server id).
    #[arg(long)]
    name: Option<String>,
    /// Write the self-signed certificate (DER) here.
    #[arg(long)]
    cert_out: Option<PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    let cfg = QuicLbConfig {
        config_id: args.config_id,
        server_id_len: args.server_id.len,
        nonce_len: args.nonce_len,
        flags: if args.self_len { QUIC_LB_F_SELF_LEN } else { 0 },
    };
    let generator = QuicLbGenerator::new(cfg, args.server_id).context("--server-id/--config-id/--nonce-len")?;
    let socket = UdpSocket::bind(args.listen).with_context(|| format!("--listen {}", args.listen))?;
    let (endpoint, cert) = support::server_endpoint(socket, generator)?;
    if let Some(path) = &args.cert_out {
        std::fs::write(path, &cert).with_context(|| format!("--cert-out {}", path.display()))?;
    }
    log::info!(
        "event=listening addr={} server_id={} config_id={} cid_len={}",
        endpoint.local_addr()?,
        args.server_id,
        cfg.config_id,
        cfg.cid_len()
    );
    let name = args.name.unwrap_or_else(|| args.server_id.to_string());
    support::serve_echo(endpoint, format!("server_id={} name={name}\n", args.server_id)).await;
    Ok(())
}
