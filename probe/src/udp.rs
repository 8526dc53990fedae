//! UDP request/response probes.

use std::{
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    os::fd::AsFd,
    time::Instant,
};

use nix::sys::socket::{setsockopt, sockopt};
use tokio::net::UdpSocket;

use super::{Answered, Fail, refuse_self_connection};
use spillway_model::MAX_PAYLOAD;

/// Sends `payload` from a connected socket on an ephemeral port (so only `target` can answer,
/// and an ICMP port unreachable comes back as ECONNREFUSED) and passes on the first reply that
/// starts with `expect` (any reply when `None`). The socket is closed when the probe ends; UDP
/// leaves no TIME_WAIT. With `mark`, the socket is marked before it connects (see
/// [`super::tcp::connect`]).
pub(super) async fn probe(target: SocketAddr, mark: Option<u32>, payload: &[u8], expect: Option<&[u8]>) -> Answered {
    let local: SocketAddr = if target.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { (Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = UdpSocket::bind(local).await?;
    if let Some(mark) = mark {
        setsockopt(&socket.as_fd(), sockopt::Mark, &mark).map_err(std::io::Error::from)?;
    }
    socket.connect(target).await?;
    refuse_self_connection(socket.local_addr()?, target)?;
    socket.send(payload).await?;
    // Longer replies are cut here: only their first `expect.len()` (≤ MAX_PAYLOAD) bytes matter.
    let mut reply = [0u8; MAX_PAYLOAD];
    let len = socket.recv(&mut reply).await?;
    let answered = Instant::now();
    match expect {
        Some(expect) if !reply[..len].starts_with(expect) => Err(Fail::backend("unexpected_reply")),
        _ => Ok(answered),
    }
}
