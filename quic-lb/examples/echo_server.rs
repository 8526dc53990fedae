//! A QUIC echo server that issues QUIC-LB connection ids naming its server id: what the
//! end-to-end tests run on backends behind a QUIC VIP.
//!
//! Each bidirectional stream's request (read to its end, at most 64 KiB) comes back after a
//! line naming the server: `server_id=<hex> name=<name>`. TLS uses a fresh self-signed
//! certificate for `localhost` (ALPN `spillway-quic-echo`); `--cert-out` writes it (DER) for
//! `echo-client --ca`. With `--key-file` the ids are encrypted with the configuration's
//! QUIC-LB key (the file `lbd` has for this config id), so only the balancer reads them.
//!
//! ```text
//! cargo run -p spillway-quic-lb --example echo-server -- \
//!     --listen 127.0.0.1:4433 --server-id 0a01 --nonce-len 6 --cert-out /tmp/echo.der
//! ```

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use spillway_quic_lb::{Encryption, QUIC_LB_F_SELF_LEN, QuicLbConfig, QuicLbGenerator, QuicLbKey, ServerId};

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
    /// Encrypt the ids with the QUIC-LB key in this file (32 hex digits, the one the
    /// balancer has for this config id); without it the ids are plaintext.
    #[arg(long)]
    key_file: Option<PathBuf>,
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
    let generator = match &args.key_file {
        Some(path) => QuicLbGenerator::encrypted(cfg, args.server_id, &read_key(path)?),
        None => QuicLbGenerator::new(cfg, args.server_id),
    }
    .context("--server-id/--config-id/--nonce-len")?;
    let generator_encryption = generator.encryption();
    let socket = UdpSocket::bind(args.listen).with_context(|| format!("--listen {}", args.listen))?;
    let (endpoint, cert) = support::server_endpoint(socket, generator)?;
    if let Some(path) = &args.cert_out {
        std::fs::write(path, &cert).with_context(|| format!("--cert-out {}", path.display()))?;
    }
    log::info!(
        "event=listening addr={} server_id={} config_id={} cid_len={} encryption={}",
        endpoint.local_addr()?,
        args.server_id,
        cfg.config_id,
        cfg.cid_len(),
        match generator_encryption {
            None => "none",
            Some(Encryption::SinglePass) => "single_pass",
            Some(Encryption::FourPass) => "four_pass",
        }
    );
    let name = args.name.unwrap_or_else(|| args.server_id.to_string());
    support::serve_echo(endpoint, format!("server_id={} name={name}\n", args.server_id)).await;
    Ok(())
}

/// The key in `path`; errors name the flag and the file, never the file's text.
fn read_key(path: &Path) -> Result<QuicLbKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--key-file {}", path.display()))?;
    QuicLbKey::from_file_text(&text).with_context(|| format!("--key-file {}", path.display()))
}
