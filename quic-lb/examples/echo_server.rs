//! A QUIC echo server that issues QUIC-LB connection ids naming its server id: what the
//! end-to-end tests run on backends behind a QUIC VIP.
//!
//! Each bidirectional stream's request (read to its end, at most 64 KiB) comes back after a
//! line naming the server: `server_id=<hex> name=<name>`. TLS uses a fresh self-signed
//! certificate for `localhost` (ALPN `spillway-quic-echo`); `--cert-out` writes it (DER) for
//! `echo-client --ca`. With `--key-file` the ids are encrypted with the configuration's
//! QUIC-LB key (the file `lbd` has for this config id), so only the balancer reads them. With
//! `--control FILE` (a FIFO) it takes orders from that file, one a line, so a test can rotate
//! the configuration under live connections: `rotate CONFIG_ID [KEY_FILE]` issues new ids
//! under CONFIG_ID (same lengths, same server id), encrypted with the key in KEY_FILE or
//! plaintext without one (logs `event=rotated seq=N config_id=N encryption=...`); ids of the
//! configuration before stay this server's.
//!
//! ```text
//! cargo run -p spillway-quic-lb --example echo-server -- \
//!     --listen 127.0.0.1:4433 --server-id 0a01 --nonce-len 6 --cert-out /tmp/echo.der
//! ```

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Parser;
use spillway_quic_lb::{QUIC_LB_F_SELF_LEN, QuicLbConfig, QuicLbGenerator, QuicLbKey, ServerId};
use tokio::io::AsyncBufReadExt;

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
    /// Take orders from this file (a FIFO), one a line: `rotate CONFIG_ID [KEY_FILE]`.
    #[arg(long)]
    control: Option<PathBuf>,
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
        Some(path) => QuicLbGenerator::encrypted(cfg, args.server_id, &read_key(path, "--key-file")?),
        None => QuicLbGenerator::new(cfg, args.server_id),
    }
    .context("--server-id/--config-id/--nonce-len")?;
    let socket = UdpSocket::bind(args.listen).with_context(|| format!("--listen {}", args.listen))?;
    let (endpoint, cert) = support::server_endpoint(socket, generator.clone())?;
    if let Some(path) = &args.cert_out {
        std::fs::write(path, &cert).with_context(|| format!("--cert-out {}", path.display()))?;
    }
    log::info!(
        "event=listening addr={} server_id={} config_id={} cid_len={} encryption={}",
        endpoint.local_addr()?,
        args.server_id,
        cfg.config_id,
        cfg.cid_len(),
        encryption(&generator)
    );
    if let Some(path) = args.control {
        tokio::spawn(async move {
            if let Err(e) = follow_orders(&path, &generator).await {
                log::warn!("event=control_failed file={} reason={e:#}", path.display());
            }
        });
    }
    let name = args.name.unwrap_or_else(|| args.server_id.to_string());
    support::serve_echo(endpoint, format!("server_id={} name={name}\n", args.server_id)).await;
    Ok(())
}

/// The key in `path`; errors name `source` (where the path came from) and the file, never the
/// file's text.
fn read_key(path: &Path, source: &str) -> Result<QuicLbKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{source} {}", path.display()))?;
    QuicLbKey::from_file_text(&text).with_context(|| format!("{source} {}", path.display()))
}

/// `single_pass`, `four_pass` or `none`: how `generator` encrypts new ids.
fn encryption(generator: &QuicLbGenerator) -> String {
    generator.encryption().map_or_else(|| "none".to_owned(), |mode| mode.to_string())
}

/// Rotates `generator` as the orders in `path` say, until the file ends.
async fn follow_orders(path: &Path, generator: &QuicLbGenerator) -> Result<()> {
    let orders = tokio::fs::File::open(path).await.with_context(|| format!("--control {}", path.display()))?;
    let mut lines = tokio::io::BufReader::new(orders).lines();
    let mut seq = 0;
    while let Some(line) = lines.next_line().await? {
        seq += 1;
        match rotate(&line, generator) {
            Ok(()) => log::info!("event=rotated seq={seq} config_id={} encryption={}", generator.config().config_id, encryption(generator)),
            Err(e) => log::warn!("event=order_refused seq={seq} reason={e:#}"),
        }
    }
    Ok(())
}

/// Carries out one order, `rotate CONFIG_ID [KEY_FILE]`.
fn rotate(order: &str, generator: &QuicLbGenerator) -> Result<()> {
    let (config_id, key) = match order.split_whitespace().collect::<Vec<_>>()[..] {
        ["rotate", config_id] => (config_id, None),
        ["rotate", config_id, key_file] => (config_id, Some(read_key(Path::new(key_file), "key file")?)),
        _ => anyhow::bail!("{order:?} is not `rotate CONFIG_ID [KEY_FILE]`"),
    };
    let config_id = config_id.parse().with_context(|| format!("config id {config_id:?}"))?;
    let cfg = QuicLbConfig { config_id, ..generator.config() };
    Ok(generator.rotate(cfg, generator.server_id(), key.as_ref())?)
}
