//! TCP connects that close with an RST.

use std::{io, net::SocketAddr, os::fd::AsFd, time::Instant};

use nix::sys::socket::{setsockopt, sockopt};
use tokio::net::{TcpSocket, TcpStream};

use super::{Answered, refuse_self_connection};

/// A connection to `target` whose close is an RST (`SO_LINGER 0`): closing first would
/// otherwise leave it in TIME_WAIT on the balancer for a minute, and thousands of probes
/// would pile up there and hold ephemeral ports. With `mark`, the socket is marked before it
/// connects, so its route (and every packet) follows the mark.
pub(super) async fn connect(target: SocketAddr, mark: Option<u32>) -> io::Result<TcpStream> {
    let socket = if target.is_ipv4() { TcpSocket::new_v4() } else { TcpSocket::new_v6() }?;
    setsockopt(&socket.as_fd(), sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 })?;
    if let Some(mark) = mark {
        setsockopt(&socket.as_fd(), sockopt::Mark, &mark)?;
    }
    let stream = socket.connect(target).await?;
    refuse_self_connection(stream.local_addr()?, target)?;
    Ok(stream)
}

/// Passes when the backend accepts the connection.
pub(super) async fn probe(target: SocketAddr, mark: Option<u32>) -> Answered {
    let stream = connect(target, mark).await?;
    let answered = Instant::now();
    drop(stream);
    Ok(answered)
}
