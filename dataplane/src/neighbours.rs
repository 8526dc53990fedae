//! Keeps the kernel's neighbour entries for backends resolved. The balancer's FIB lookup
//! hands a packet to the kernel when the next hop's MAC is unknown, which is slow; so every
//! few seconds each backend without a valid entry gets one empty UDP datagram to the discard
//! port, which makes the kernel resolve whatever next hop the backend is behind.
//!
//! Backends behind a gateway never have an entry of their own and are nudged every round:
//! one tiny datagram per backend and round, bounded by the backend limit.

use spillway_logging::event;
use std::{
    collections::{BTreeSet, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, UdpSocket},
    os::fd::AsRawFd,
    time::Duration,
};

use nix::{
    errno::Errno,
    sys::{
        socket::{AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, setsockopt, socket, sockopt},
        time::TimeVal,
    },
};

use crate::rtnl::{align4, u16_at, u32_at};

/// How often `lbd` checks.
pub const INTERVAL: Duration = Duration::from_secs(5);

const DISCARD_PORT: u16 = 9;

// linux/netlink.h, linux/rtnetlink.h, linux/neighbour.h
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NDMSG_LEN: usize = 12;
const NDA_DST: u16 = 1;
/// NUD_VALID: the states in which the FIB lookup has a MAC to use.
const NUD_VALID: u16 = 0x80 | 0x40 | 0x02 | 0x10 | 0x04 | 0x08;

#[derive(Debug, thiserror::Error)]
pub enum NeighError {
    #[error("reading the neighbour table over netlink")]
    Netlink(#[source] Errno),
    #[error("the kernel's neighbour dump is malformed")]
    Malformed,
}

/// Nudges every backend in `backends` that lacks a valid neighbour entry; returns how many
/// datagrams went out.
pub fn upkeep(backends: &BTreeSet<IpAddr>) -> Result<usize, NeighError> {
    if backends.is_empty() {
        return Ok(0);
    }
    let resolved = resolved()?;
    Ok(nudge(backends.iter().filter(|addr| !resolved.contains(addr))))
}

/// Addresses that have a valid neighbour entry on any interface.
fn resolved() -> Result<HashSet<IpAddr>, NeighError> {
    let fd =
        socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute).map_err(NeighError::Netlink)?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(2, 0)).map_err(NeighError::Netlink)?;
    sendto(fd.as_raw_fd(), &dump_request(), &NetlinkAddr::new(0, 0), MsgFlags::empty()).map_err(NeighError::Netlink)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut found = HashSet::new();
    loop {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(NeighError::Netlink)?;
        if parse_batch(&buf[..n], &mut found)? {
            return Ok(found);
        }
    }
}

fn dump_request() -> [u8; NLMSG_HDRLEN + NDMSG_LEN] {
    let mut msg = [0u8; NLMSG_HDRLEN + NDMSG_LEN];
    msg[0..4].copy_from_slice(&((NLMSG_HDRLEN + NDMSG_LEN) as u32).to_ne_bytes());
    msg[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
    msg[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    msg[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // The ndmsg stays zero: every family, every interface.
    msg
}

/// Adds the valid entries of one received batch to `found`; true once the dump is complete.
pub(crate) fn parse_batch(mut buf: &[u8], found: &mut HashSet<IpAddr>) -> Result<bool, NeighError> {
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32_at(buf, 0).ok_or(NeighError::Malformed)? as usize;
        let kind = u16_at(buf, 4).ok_or(NeighError::Malformed)?;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(NeighError::Malformed);
        }
        let body = &buf[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                // Minus the errno; i32::MIN has no errno to be minus of.
                let errno = (u32_at(body, 0).ok_or(NeighError::Malformed)? as i32).checked_neg().ok_or(NeighError::Malformed)?;
                return Err(NeighError::Netlink(Errno::from_raw(errno)));
            }
            RTM_NEWNEIGH => found.extend(valid_destination(body)),
            _ => {}
        }
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(false)
}

/// The NDA_DST of an ndmsg whose state is valid.
fn valid_destination(body: &[u8]) -> Option<IpAddr> {
    let state = u16_at(body, 8)?;
    if state & NUD_VALID == 0 {
        return None;
    }
    let mut attrs = body.get(NDMSG_LEN..)?;
    while attrs.len() >= 4 {
        let len = u16_at(attrs, 0)? as usize;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if u16_at(attrs, 2)? == NDA_DST {
            let data = &attrs[4..len];
            return match data.len() {
                4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?))),
                16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(data).ok()?))),
                _ => None,
            };
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    None
}

/// Sends one empty datagram to the discard port of each address; never blocks.
fn nudge<'a>(addrs: impl Iterator<Item = &'a IpAddr>) -> usize {
    let open = |bind: &str| UdpSocket::bind(bind).and_then(|s| s.set_nonblocking(true).map(|()| s)).ok();
    let (v4, v6) = (open("0.0.0.0:0"), open("[::]:0"));
    let mut sent = 0;
    for addr in addrs {
        let socket = if addr.is_ipv4() { &v4 } else { &v6 };
        match socket.as_ref().map(|s| s.send_to(&[], (*addr, DISCARD_PORT))) {
            Some(Ok(_)) => sent += 1,
            Some(Err(e)) => event!(debug, "neighbour_nudge_failed", backend = addr, error = e),
            None => event!(debug, "neighbour_nudge_failed", backend = addr, error = "no socket of its family"),
        }
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    fn neigh(state: u16, dst: &[u8]) -> Vec<u8> {
        let attr_len = 4 + dst.len();
        let len = NLMSG_HDRLEN + NDMSG_LEN + align4(attr_len);
        let mut m = vec![0u8; len];
        m[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&RTM_NEWNEIGH.to_ne_bytes());
        m[NLMSG_HDRLEN] = if dst.len() == 4 { 2 } else { 10 };
        m[NLMSG_HDRLEN + 8..NLMSG_HDRLEN + 10].copy_from_slice(&state.to_ne_bytes());
        let a = NLMSG_HDRLEN + NDMSG_LEN;
        m[a..a + 2].copy_from_slice(&(attr_len as u16).to_ne_bytes());
        m[a + 2..a + 4].copy_from_slice(&NDA_DST.to_ne_bytes());
        m[a + 4..a + 4 + dst.len()].copy_from_slice(dst);
        m
    }

    fn done() -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDRLEN + 4];
        m[0..4].copy_from_slice(&((NLMSG_HDRLEN + 4) as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        m
    }

    #[test]
    fn keeps_only_valid_entries_and_stops_at_done() {
        const REACHABLE: u16 = 0x02;
        const STALE: u16 = 0x04;
        const INCOMPLETE: u16 = 0x01;
        const FAILED: u16 = 0x20;
        let v6: Ipv6Addr = "fd00::2".parse().unwrap();
        let mut first = neigh(REACHABLE, &[10, 0, 0, 1]);
        first.extend(neigh(FAILED, &[10, 0, 0, 2]));
        first.extend(neigh(INCOMPLETE, &[10, 0, 0, 3]));
        let mut found = HashSet::new();
        assert!(!parse_batch(&first, &mut found).unwrap());
        let mut second = neigh(STALE, &v6.octets());
        second.extend(done());
        assert!(parse_batch(&second, &mut found).unwrap());
        let want: HashSet<IpAddr> = [IpAddr::from([10, 0, 0, 1]), IpAddr::V6(v6)].into();
        assert_eq!(found, want);
    }

    #[test]
    fn truncated_dump_is_an_error() {
        let msg = neigh(0x02, &[10, 0, 0, 1]);
        assert!(matches!(parse_batch(&msg[..20], &mut HashSet::new()), Err(NeighError::Malformed)));
    }

    /// Found by the fuzz target `netlink`: negating it overflowed (a panic with overflow checks).
    #[test]
    fn an_error_code_without_an_errno_is_malformed() {
        let mut msg = done();
        msg[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        msg[NLMSG_HDRLEN..].copy_from_slice(&i32::MIN.to_ne_bytes());
        assert!(matches!(parse_batch(&msg, &mut HashSet::new()), Err(NeighError::Malformed)));
        msg[NLMSG_HDRLEN..].copy_from_slice(&(-libc::ENOBUFS).to_ne_bytes());
        assert!(matches!(parse_batch(&msg, &mut HashSet::new()), Err(NeighError::Netlink(Errno::ENOBUFS))));
    }

    #[test]
    fn reads_the_live_table_and_nudges() {
        resolved().unwrap();
        assert_eq!(nudge([IpAddr::from([127, 0, 0, 1])].iter()), 1);
    }
}
