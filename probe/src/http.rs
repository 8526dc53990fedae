//! HTTP(S) GET probes that read only the status line.

use std::{
    io::{self, ErrorKind},
    net::SocketAddr,
    time::Instant,
};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Answered, Fail, tcp, tls};

/// At most this much of the response is read while looking for the end of the status line.
const MAX_STATUS_LINE: usize = 4096;

/// `GET path` with `Host: host` (the target's address when `None`), over TLS when `tls`;
/// passes when the status is `expect_status`. The connection is reset (see [`tcp::connect`])
/// as soon as the status line is in: the body is never read.
pub(super) async fn probe(
    target: SocketAddr,
    mark: Option<u32>,
    path: &str,
    expect_status: u16,
    host: Option<&str>,
    tls: bool,
) -> Answered {
    let host_header = host.map_or_else(|| address_host(target, tls), str::to_owned);
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: spillway-health\r\nConnection: close\r\n\r\n");
    let stream = tcp::connect(target, mark).await?;
    if tls {
        exchange(tls::connect(stream, host, target.ip()).await?, request.as_bytes(), expect_status).await
    } else {
        exchange(stream, request.as_bytes(), expect_status).await
    }
}

/// `ip`, or `ip:port` when the port is not the scheme's default (IPv6 in brackets).
fn address_host(target: SocketAddr, tls: bool) -> String {
    let ip = match target {
        SocketAddr::V4(v4) => v4.ip().to_string(),
        SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
    };
    if target.port() == if tls { 443 } else { 80 } { ip } else { format!("{ip}:{}", target.port()) }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &[u8], expect_status: u16) -> Answered {
    stream.write_all(request).await.map_err(stream_error)?;
    stream.flush().await.map_err(stream_error)?;
    let mut head = [0u8; MAX_STATUS_LINE];
    let mut len = 0;
    let line_end = loop {
        if let Some(end) = head[..len].iter().position(|&b| b == b'\n') {
            break end;
        }
        // Not HTTP from the first bytes on, or no line end within the bound.
        if !b"HTTP/".starts_with(&head[..len.min(5)]) || len == head.len() {
            return Err(Fail::backend("bad_response"));
        }
        match stream.read(&mut head[len..]).await.map_err(stream_error)? {
            0 => return Err(Fail::backend("closed_early")),
            n => len += n,
        }
    };
    let answered = Instant::now();
    match status(&head[..line_end]) {
        None => Err(Fail::backend("bad_response")),
        Some(status) if status != expect_status => Err(Fail::Backend(format!("status_{status}"))),
        Some(_) => Ok(answered),
    }
}

/// Socket errors are classified as such; the others come from TLS (an alert, a close without
/// `close_notify`), which is the backend's doing.
fn stream_error(e: io::Error) -> Fail {
    match e.kind() {
        _ if e.raw_os_error().is_some() => Fail::Io(e),
        ErrorKind::UnexpectedEof => Fail::backend("closed_early"),
        _ => Fail::backend("tls_error"),
    }
}

/// The code of a status line `HTTP/1.x NNN[ reason]` (without its LF).
fn status(line: &[u8]) -> Option<u16> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"HTTP/1.")?;
    let (minor, rest) = rest.split_first()?;
    let (code, reason) = rest.strip_prefix(b" ")?.split_at_checked(3)?;
    if !minor.is_ascii_digit() || !code.iter().all(u8::is_ascii_digit) || !(reason.is_empty() || reason[0] == b' ') {
        return None;
    }
    let code = code.iter().fold(0, |n, d| n * 10 + u16::from(d - b'0'));
    (100..=599).contains(&code).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status(b"HTTP/1.1 200 OK\r"), Some(200));
        assert_eq!(status(b"HTTP/1.0 503 Service Unavailable"), Some(503));
        assert_eq!(status(b"HTTP/1.1 204"), Some(204));
        for bad in [&b"HTTP/1.1 20 OK"[..], b"HTTP/1.1 2000", b"HTTP/2 200", b"HTTP/1.1  200", b"HTTP/1.1 099 x", b"SSH-2.0-OpenSSH", b""] {
            assert_eq!(status(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn host_header_defaults_to_the_address() {
        assert_eq!(address_host("10.0.0.1:80".parse().unwrap(), false), "10.0.0.1");
        assert_eq!(address_host("10.0.0.1:8080".parse().unwrap(), false), "10.0.0.1:8080");
        assert_eq!(address_host("10.0.0.1:443".parse().unwrap(), true), "10.0.0.1");
        assert_eq!(address_host("10.0.0.1:80".parse().unwrap(), true), "10.0.0.1:80");
        assert_eq!(address_host("[2001:db8::1]:80".parse().unwrap(), false), "[2001:db8::1]");
        assert_eq!(address_host("[2001:db8::1]:8443".parse().unwrap(), true), "[2001:db8::1]:8443");
    }
}
