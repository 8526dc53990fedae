//! In-process ICMP echo, so reachability checks need no `ping` binary.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::socket::{AddressFamily, SockFlag, SockProtocol, SockType, socket};

const PAYLOAD: &[u8] = b"spillway-harness";

/// Sends one ICMP echo request to `addr` and waits up to `timeout` for the
/// reply. Call it inside a namespace ([`crate::Netns::in_netns`]); it uses an
/// ICMP "ping socket", which every topology host allows via
/// `net.ipv4.ping_group_range`.
pub fn ping(addr: IpAddr, timeout: Duration) -> Result<()> {
    let (family, protocol, request, reply) = match addr {
        IpAddr::V4(_) => (AddressFamily::Inet, SockProtocol::Icmp, 8, 0),
        IpAddr::V6(_) => (AddressFamily::Inet6, SockProtocol::IcmpV6, 128, 129),
    };
    let fd = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, protocol).context("opening an ICMP ping socket")?;
    // A ping socket is a datagram socket: UdpSocket's connect/send/recv and
    // timeouts work on it unchanged. The kernel fills in the ICMP identifier
    // and checksum and only delivers replies matching the identifier.
    let socket = UdpSocket::from(fd);
    socket.connect(SocketAddr::new(addr, 0))?;
    let mut packet = vec![request, 0, 0, 0, 0, 0, 0, 1];
    packet.extend_from_slice(PAYLOAD);
    socket.send(&packet).with_context(|| format!("sending ICMP echo to {addr}"))?;

    let deadline = Instant::now() + timeout;
    let mut buf = [0; 128];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no ICMP echo reply from {addr} within {timeout:?}");
        }
        socket.set_read_timeout(Some(left))?;
        match socket.recv(&mut buf) {
            Ok(len) if len >= 8 && buf[0] == reply && &buf[8..len] == PAYLOAD => return Ok(()),
            Ok(_) => continue,
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                continue;
            }
            Err(err) => return Err(err).with_context(|| format!("ICMP echo to {addr}")),
        }
    }
}
