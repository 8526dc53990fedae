//! What the echo examples and the wire test share: TLS, the endpoints, the echo itself.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;

use anyhow::Result;
use quinn::rustls::RootCertStore;
use quinn::rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer};
use spillway_quic_lb::QuicLbGenerator;

/// The ALPN both examples speak.
pub const ALPN: &[u8] = b"spillway-quic-echo";
/// The name the self-signed certificate is for.
pub const SERVER_NAME: &str = "localhost";
const MAX_REQUEST: usize = 64 * 1024;
const MAX_REPLY: usize = 128 * 1024;

/// ring, named rather than left to rustls's process default, which is ambiguous when another
/// crate of the build enables a second provider.
fn provider() -> Arc<quinn::rustls::crypto::CryptoProvider> {
    Arc::new(quinn::rustls::crypto::ring::default_provider())
}

/// A server endpoint on `socket` that issues `generator`'s connection ids, with a fresh
/// self-signed certificate (returned, DER, for clients to trust).
pub fn server_endpoint(socket: UdpSocket, generator: QuicLbGenerator) -> Result<(quinn::Endpoint, CertificateDer<'static>)> {
    let certified = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_owned()])?;
    let cert = CertificateDer::from(certified.cert);
    let key = PrivatePkcs8KeyDer::from(certified.signing_key.serialize_der());
    let mut tls = quinn::rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(vec![cert.clone()], key.into())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let server = quinn::ServerConfig::with_crypto(Arc::new(quinn::crypto::rustls::QuicServerConfig::try_from(tls)?));
    let mut endpoint_cfg = quinn::EndpointConfig::default();
    endpoint_cfg.cid_generator(move || Box::new(generator.clone()));
    let endpoint = quinn::Endpoint::new(endpoint_cfg, Some(server), socket, Arc::new(quinn::TokioRuntime))?;
    Ok((endpoint, cert))
}

/// Answers every bidirectional stream of every connection with `banner` and the request.
pub async fn serve_echo(endpoint: quinn::Endpoint, banner: String) {
    let banner = Arc::new(banner);
    while let Some(incoming) = endpoint.accept().await {
        let banner = banner.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            if let Err(e) = serve_connection(incoming, banner).await {
                log::info!("event=connection_closed remote={remote} reason={e}");
            }
        });
    }
}

async fn serve_connection(incoming: quinn::Incoming, banner: Arc<String>) -> Result<(), quinn::ConnectionError> {
    let conn = incoming.await?;
    log::info!("event=connection remote={}", conn.remote_address());
    loop {
        let (mut send, mut recv) = conn.accept_bi().await?;
        let banner = banner.clone();
        tokio::spawn(async move {
            let reply = async {
                let request = recv.read_to_end(MAX_REQUEST).await?;
                send.write_all(banner.as_bytes()).await?;
                send.write_all(&request).await?;
                send.finish()?;
                anyhow::Ok(())
            };
            if let Err(e) = reply.await {
                log::info!("event=stream_failed reason={e:#}");
            }
        });
    }
}

/// A local socket of `remote`'s family on any port.
pub fn local_socket(remote: SocketAddr) -> Result<UdpSocket> {
    let any: SocketAddr = if remote.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse()?;
    Ok(UdpSocket::bind(any)?)
}

/// A client endpoint on `socket` trusting `certs`.
pub fn client_endpoint(socket: UdpSocket, certs: Vec<CertificateDer<'static>>) -> Result<quinn::Endpoint> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert)?;
    }
    let mut tls = quinn::rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let client = quinn::ClientConfig::new(Arc::new(quinn::crypto::rustls::QuicClientConfig::try_from(tls)?));
    let mut endpoint = quinn::Endpoint::new(quinn::EndpointConfig::default(), None, socket, Arc::new(quinn::TokioRuntime))?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Sends `message` on `requests` streams of one connection to `remote` and returns the
/// replies; with `rebind`, moves to a new local port before each request after the first.
pub async fn exchange(endpoint: &quinn::Endpoint, remote: SocketAddr, message: &[u8], requests: u32, rebind: bool) -> Result<Vec<Vec<u8>>> {
    let conn = endpoint.connect(remote, SERVER_NAME)?.await?;
    let mut replies = Vec::new();
    for i in 0..requests {
        if rebind && i > 0 {
            endpoint.rebind(local_socket(remote)?)?;
        }
        replies.push(request(&conn, message).await?);
    }
    conn.close(0u32.into(), b"done");
    Ok(replies)
}

/// One request on its own stream of `conn`: the reply.
pub async fn request(conn: &quinn::Connection, message: &[u8]) -> Result<Vec<u8>> {
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(message).await?;
    send.finish()?;
    Ok(recv.read_to_end(MAX_REPLY).await?)
}

/// Connects to `remote`, then follows the orders read from `orders`, one a line, each
/// within `timeout`: `request` sends `message` and prints the reply's first line (the
/// server's banner) with the local address it left from; `rebind ADDR` moves the endpoint
/// to a new socket bound to ADDR (port 0: any). Closes the connection at the orders' end.
pub async fn controlled(
    endpoint: &quinn::Endpoint,
    remote: SocketAddr,
    message: &[u8],
    orders: impl tokio::io::AsyncRead + Unpin,
    timeout: std::time::Duration,
) -> Result<()> {
    use anyhow::{Context, bail};
    use tokio::io::AsyncBufReadExt;
    let conn = tokio::time::timeout(timeout, async { anyhow::Ok(endpoint.connect(remote, SERVER_NAME)?.await?) })
        .await
        .context("no handshake within the timeout")??;
    println!("event=connected local={}", endpoint.local_addr()?);
    let mut lines = tokio::io::BufReader::new(orders).lines();
    let mut seq = 0;
    while let Some(line) = lines.next_line().await? {
        seq += 1;
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            ["request"] => {
                let reply = tokio::time::timeout(timeout, request(&conn, message))
                    .await
                    .with_context(|| format!("order {seq} ({line}): no reply within the timeout"))??;
                let banner = String::from_utf8_lossy(&reply).lines().next().unwrap_or_default().to_owned();
                println!("event=reply seq={seq} local={} {banner}", endpoint.local_addr()?);
            }
            ["rebind", addr] => {
                let addr: SocketAddr = addr.parse().with_context(|| format!("order {seq}: {addr:?} is no socket address"))?;
                endpoint.rebind(UdpSocket::bind(addr).with_context(|| format!("order {seq}: binding {addr}"))?)?;
                println!("event=rebound seq={seq} local={}", endpoint.local_addr()?);
            }
            _ => bail!("order {seq}: {line:?} is neither `request` nor `rebind ADDR`"),
        }
    }
    conn.close(0u32.into(), b"done");
    Ok(())
}
