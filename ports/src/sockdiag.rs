//! The kernel's socket tables through `NETLINK_SOCK_DIAG` (`inet_diag`, what `ss` reads):
//! every TCP or UDP socket of one network namespace with its addresses, state, inode,
//! cookie and cgroup. Needs no BPF at all, so it is the watcher's last resort, and it
//! answers what the BPF side cannot: which socket has which inode, which UDP socket holds
//! which port.
//!
//! A netlink socket belongs to the namespace it was created in, so each dump creates its
//! socket in the namespace (`range::in_netns`).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::maps::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP};
use super::range::in_netns;

// include/uapi/linux/{netlink,sock_diag,inet_diag}.h
const NETLINK_SOCK_DIAG: libc::c_int = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const INET_DIAG_CGROUP_ID: u16 = 21;
const NLMSG_HDR_LEN: usize = 16;
const DIAG_MSG_LEN: usize = 72;
/// Room for many messages per read; the kernel fills up to its own page-sized skbs.
const RECV_BUFFER: usize = 64 * 1024;

/// TCP states (include/net/tcp_states.h) as bits of a dump's state filter.
pub(super) mod state {
    #[cfg(test)]
    pub const ESTABLISHED: u8 = 1;
    pub const TIME_WAIT: u8 = 6;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
    pub const LISTEN: u8 = 10;
    /// Every state.
    pub const ALL: u32 = u32::MAX;

    pub const fn bit(state: u8) -> u32 {
        1 << state
    }
}

/// One socket as the kernel's table shows it. Addresses are IPv6 or IPv4-mapped, as in
/// [`super::PortKey`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DiagSocket {
    /// `AF_INET` or `AF_INET6` (a dual-stack socket talking IPv4 is `AF_INET6`).
    pub family: u8,
    /// TCP state (UDP: `ESTABLISHED` when connected, else `CLOSE`).
    pub state: u8,
    pub local: [u8; 16],
    pub lport: u16,
    pub remote: [u8; 16],
    pub rport: u16,
    /// 0 for TIME_WAIT and for sockets still in a listener's accept queue.
    pub inode: u64,
    pub cookie: u64,
    /// cgroup2 id, when the kernel reports it (5.7+).
    pub cgroup: u64,
}

/// Which sockets a dump asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    fn number(self) -> u8 {
        match self {
            Proto::Tcp => IPPROTO_TCP,
            Proto::Udp => IPPROTO_UDP,
        }
    }
}

/// Every `proto` socket in one of `states` (bits, see [`state::bit`]), IPv4 and IPv6, of
/// the network namespace at `netns` (`/proc/<pid>/ns/net`, `/run/netns/<name>`); `None` when
/// that file is no namespace any more (its last process exited, or its name is being deleted:
/// the file then exists a moment longer but cannot be joined).
pub(super) fn dump_netns(netns: &Path, proto: Proto, states: u32) -> io::Result<Option<Vec<DiagSocket>>> {
    let file = match File::open(netns) {
        Ok(file) => file,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let socket = match in_netns(&file, open) {
        Ok(socket) => socket?,
        // The file is not (or no longer) a network namespace.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut sockets = dump(&socket, AF_INET, proto, states)?;
    sockets.extend(dump(&socket, AF_INET6, proto, states)?);
    Ok(Some(sockets))
}

fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, NETLINK_SOCK_DIAG) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just created; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One `SOCK_DIAG_BY_FAMILY` dump request: `nlmsghdr` + `inet_diag_req_v2` (56 bytes).
fn request(family: u8, proto: Proto, states: u32) -> Vec<u8> {
    let mut msg = Vec::with_capacity(NLMSG_HDR_LEN + 56);
    msg.extend_from_slice(&((NLMSG_HDR_LEN + 56) as u32).to_ne_bytes());
    msg.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    msg.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    msg.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    msg.extend_from_slice(&[family, proto.number(), 0, 0]); // family, protocol, ext, pad
    msg.extend_from_slice(&states.to_ne_bytes());
    msg.extend_from_slice(&[0; 48]); // inet_diag_sockid: match any
    msg
}

fn dump(socket: &OwnedFd, family: u8, proto: Proto, states: u32) -> io::Result<Vec<DiagSocket>> {
    let request = request(family, proto, states);
    // SAFETY: sends `request.len()` bytes from a live buffer to the kernel (the default
    // destination of an unconnected netlink socket).
    if unsafe { libc::send(socket.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sockets = Vec::new();
    let mut buffer = vec![0u8; RECV_BUFFER];
    loop {
        // SAFETY: receives into a live buffer of `buffer.len()` bytes.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len(), 0) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if parse_messages(&buffer[..n as usize], &mut sockets)? {
            return Ok(sockets);
        }
    }
}

/// Parses one read's worth of netlink messages into `out`; true once the dump is done.
fn parse_messages(mut bytes: &[u8], out: &mut Vec<DiagSocket>) -> io::Result<bool> {
    while bytes.len() >= NLMSG_HDR_LEN {
        let len = u32_at(bytes, 0) as usize;
        let kind = u16::from_ne_bytes([bytes[4], bytes[5]]);
        if len < NLMSG_HDR_LEN || len > bytes.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("sock_diag: message of {len} bytes in {}", bytes.len())));
        }
        let body = &bytes[NLMSG_HDR_LEN..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = body.get(..4).map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                // A dump of a family the kernel lacks (IPv6 disabled) ends with ENOENT.
                if errno == -libc::ENOENT {
                    return Ok(true);
                }
                return Err(io::Error::from_raw_os_error(-errno));
            }
            SOCK_DIAG_BY_FAMILY => out.extend(parse_socket(body)),
            _ => {}
        }
        // Messages are 4-byte aligned.
        let next = len.next_multiple_of(4).min(bytes.len());
        bytes = &bytes[next..];
    }
    Ok(false)
}

/// `inet_diag_msg` and its attributes.
fn parse_socket(body: &[u8]) -> Option<DiagSocket> {
    if body.len() < DIAG_MSG_LEN {
        return None;
    }
    let family = body[0];
    let addr = |at: usize| -> [u8; 16] {
        let raw: [u8; 16] = body[at..at + 16].try_into().expect("16 bytes");
        if family == AF_INET {
            let mut mapped = [0u8; 16];
            mapped[10] = 0xff;
            mapped[11] = 0xff;
            mapped[12..].copy_from_slice(&raw[..4]);
            mapped
        } else {
            raw
        }
    };
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let mut socket = DiagSocket {
        family,
        state: body[1],
        lport: u16::from_be_bytes([body[4], body[5]]),
        rport: u16::from_be_bytes([body[6], body[7]]),
        local: addr(8),
        remote: addr(24),
        cookie: u64::from(u32_at(body, 44)) | (u64::from(u32_at(body, 48)) << 32),
        inode: u64::from(u32_at(body, 68)),
        cgroup: 0,
    };
    let mut attrs = &body[DIAG_MSG_LEN..];
    while attrs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([attrs[0], attrs[1]]));
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]);
        if len < 4 || len > attrs.len() {
            break;
        }
        if kind == INET_DIAG_CGROUP_ID && len >= 12 {
            socket.cgroup = u64::from_ne_bytes(attrs[4..12].try_into().expect("8 bytes"));
        }
        attrs = &attrs[len.next_multiple_of(4).min(attrs.len())..];
    }
    Some(socket)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket};

    use super::*;

    fn v4_mapped(addr: Ipv4Addr) -> [u8; 16] {
        addr.to_ipv6_mapped().octets()
    }

    /// Against this process's own sockets on loopback: a listener, an established pair
    /// and a connected UDP socket, each found with its ports, state, inode and cookie.
    #[test]
    fn dumps_own_sockets_with_ports_states_and_inodes() {
        let own = Path::new("/proc/self/ns/net");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = listener.local_addr().unwrap();
        let client = TcpStream::connect(server).unwrap();
        let client_port = client.local_addr().unwrap().port();
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        udp.connect(server).unwrap();
        let udp_port = udp.local_addr().unwrap().port();

        let tcp = dump_netns(own, Proto::Tcp, state::ALL).unwrap().unwrap();
        let listening = tcp.iter().find(|s| s.lport == server.port() && s.state == state::LISTEN).expect("the listener");
        assert!(listening.inode > 0 && listening.cookie > 0);
        let ours = tcp.iter().find(|s| s.lport == client_port).expect("the client socket");
        assert_eq!((ours.state, ours.rport, ours.family), (state::ESTABLISHED, server.port(), AF_INET));
        assert_eq!((ours.local, ours.remote), (v4_mapped(Ipv4Addr::LOCALHOST), v4_mapped(Ipv4Addr::LOCALHOST)));
        let only_listening = dump_netns(own, Proto::Tcp, state::bit(state::LISTEN)).unwrap().unwrap();
        assert!(only_listening.iter().all(|s| s.state == state::LISTEN));
        assert!(only_listening.iter().any(|s| s.lport == server.port()));

        let udp_sockets = dump_netns(own, Proto::Udp, state::ALL).unwrap().unwrap();
        let connected = udp_sockets.iter().find(|s| s.lport == udp_port).expect("the UDP socket");
        assert_eq!((connected.state, connected.rport), (state::ESTABLISHED, server.port()));
    }

    #[test]
    fn a_file_that_is_no_namespace_is_gone_not_an_error() {
        assert_eq!(dump_netns(Path::new("/proc/self/status"), Proto::Tcp, state::ALL).unwrap(), None);
        assert_eq!(dump_netns(Path::new("/run/netns/spw-no-such-namespace"), Proto::Tcp, state::ALL).unwrap(), None);
    }

    #[test]
    fn malformed_messages_are_refused_not_misread() {
        let mut out = Vec::new();
        // A header claiming more bytes than there are.
        let mut bytes = 64u32.to_ne_bytes().to_vec();
        bytes.extend_from_slice(&[0; 12]);
        assert!(parse_messages(&bytes, &mut out).is_err());
        // A short socket message is skipped.
        let mut short = (NLMSG_HDR_LEN as u32 + 8).to_ne_bytes().to_vec();
        short.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        short.extend_from_slice(&[0; 10 + 8]);
        assert!(!parse_messages(&short, &mut out).unwrap());
        assert!(out.is_empty());
    }
}
