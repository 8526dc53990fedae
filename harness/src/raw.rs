//! Crafted frames sent straight out of an interface (AF_PACKET), for what no socket sends:
//! SYNs from spoofed sources. Call it inside the sender's namespace.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result, ensure};

/// Most frames one call may send, so a mistaken call still ends by itself.
const MAX_FRAMES: usize = 10_000_000;

/// Sends every frame out of `iface`; returns how many the kernel took (a full queue drops
/// some: callers check what arrived where it matters).
pub fn send_frames(iface: &str, frames: impl Iterator<Item = Vec<u8>>) -> Result<usize> {
    let ifindex = nix::net::if_::if_nametoindex(iface).with_context(|| format!("no interface {iface}"))?;
    // SAFETY: a plain socket(2) call; the descriptor is owned right away.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    ensure!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: a zeroed sockaddr_ll is valid; the fields set are the ones sendto needs.
    let mut to: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    to.sll_family = libc::AF_PACKET as u16;
    to.sll_ifindex = ifindex as i32;
    to.sll_halen = 6;
    let mut sent = 0;
    for frame in frames.take(MAX_FRAMES) {
        // SAFETY: the buffer and address outlive the call.
        let n = unsafe {
            libc::sendto(
                socket.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&raw const to).cast(),
                size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if n == frame.len() as isize {
            sent += 1;
        }
    }
    Ok(sent)
}

/// Sends one IP packet, headers included (`IPPROTO_RAW`: the source is whatever the packet
/// says), routed by the calling namespace towards `dst`.
pub fn send_ip_packet(dst: std::net::IpAddr, packet: &[u8]) -> Result<()> {
    let socket = std::net::SocketAddr::new(dst, 0);
    let (family, addr) = match socket {
        std::net::SocketAddr::V4(a) => (libc::AF_INET, nix::sys::socket::SockaddrStorage::from(a)),
        std::net::SocketAddr::V6(a) => (libc::AF_INET6, nix::sys::socket::SockaddrStorage::from(a)),
    };
    // SAFETY: a plain socket(2) call; the descriptor is owned right away.
    let fd = unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
    ensure!(fd >= 0, "raw IP socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let sent = nix::sys::socket::sendto(socket.as_raw_fd(), packet, &addr, nix::sys::socket::MsgFlags::empty())
        .with_context(|| format!("sending a raw IP packet to {dst}"))?;
    ensure!(sent == packet.len(), "sent {sent} of {} bytes", packet.len());
    Ok(())
}

/// Every IP packet an interface sends or receives, from the moment it is opened (AF_PACKET,
/// cooked: no link-layer header). Open it inside the interface's namespace.
pub struct Capture {
    socket: OwnedFd,
}

impl Capture {
    pub fn open(iface: &str) -> Result<Capture> {
        let ifindex = nix::net::if_::if_nametoindex(iface).with_context(|| format!("no interface {iface}"))?;
        let protocol = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: a plain socket(2) call; the descriptor is owned right away.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, i32::from(protocol)) };
        ensure!(fd >= 0, "AF_PACKET socket: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a zeroed sockaddr_ll is valid; family, protocol and ifindex are what bind needs.
        let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        at.sll_family = libc::AF_PACKET as u16;
        at.sll_protocol = protocol;
        at.sll_ifindex = ifindex as i32;
        // SAFETY: the address outlives the call and its size is passed.
        let bound = unsafe { libc::bind(socket.as_raw_fd(), (&raw const at).cast(), size_of::<libc::sockaddr_ll>() as libc::socklen_t) };
        ensure!(bound == 0, "binding to {iface}: {}", std::io::Error::last_os_error());
        Ok(Capture { socket })
    }

    /// The first packet `wanted` accepts within `timeout`, or `None`.
    pub fn find(&self, timeout: std::time::Duration, mut wanted: impl FnMut(&[u8]) -> bool) -> Result<Option<Vec<u8>>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut poll = libc::pollfd { fd: self.socket.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            let millis = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd for the duration of the call.
            if unsafe { libc::poll(&raw mut poll, 1, millis) } <= 0 {
                continue;
            }
            // SAFETY: the buffer outlives the call and its length is passed.
            let n = unsafe { libc::recv(self.socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n > 0 && wanted(&buf[..n as usize]) {
                return Ok(Some(buf[..n as usize].to_vec()));
            }
        }
    }
}
