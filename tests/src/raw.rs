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
