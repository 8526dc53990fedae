//! The backend's half of second chance (see the balancer's `second_chance`): a tunnel to
//! this host carrying a tunnel to another backend holds a TCP packet of a connection that
//! lives on one of the two. This host keeps it if it has a socket for the connection (any
//! but a listener: established, a handshake in progress, TIME_WAIT) and otherwise sends the
//! inner tunnel on to the other backend.

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_NETNS, bpf_sock_tuple},
    helpers::{bpf_sk_release, bpf_skc_lookup_tcp},
    programs::XdpContext,
};
use spillway_common::types::{PROTO_IPIP, PROTO_IPV6, PROTO_TCP};
use xdp_ebpf::{
    headers::*,
    packet::{at, len},
};

/// `sk_state` of a listening socket: a connection it would take is not one this host has.
const TCP_LISTEN: u32 = 10;
/// TCP flags byte (offset 13 of the header): SYN.
const TCP_SYN: u8 = 0x02;

/// A second-chance packet: the tunnel to the second candidate (the middle header).
pub struct Nested {
    pub middle_len: usize,
    /// EtherType of the connection's packet inside the middle header.
    pub inner_ether_type: u16,
    /// This host has the connection (or cannot tell: the packet is then kept, as without
    /// second chance).
    pub local: bool,
}

#[repr(C)]
struct Tuple4 {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
}

#[repr(C)]
struct Tuple6 {
    saddr: [u32; 4],
    daddr: [u32; 4],
    sport: u16,
    dport: u16,
}

/// The middle header at `off` (an `ether_type` packet), if the packet inside the outer
/// tunnel is itself a tunnel.
#[inline(always)]
pub fn nested(ctx: &XdpContext, off: usize, ether_type: u16) -> Option<Nested> {
    let (middle_len, proto) = if ether_type == ETH_P_IPV4 {
        let ip = unsafe { *at::<Ipv4Hdr>(ctx, off)? };
        ((((ip.ver_ihl & 0x0f) as usize) * 4).max(IPV4_LEN), ip.proto)
    } else {
        let ip = unsafe { *at::<Ipv6Hdr>(ctx, off)? };
        (IPV6_LEN, ip.next_hdr)
    };
    let inner_ether_type = match proto {
        PROTO_IPIP => ETH_P_IPV4,
        PROTO_IPV6 => ETH_P_IPV6,
        _ => return None,
    };
    let local = has_connection(ctx, off + middle_len, inner_ether_type);
    Some(Nested { middle_len, inner_ether_type, local })
}

/// Whether this host has a socket for the TCP packet at `off`. Anything it cannot read as
/// a non-SYN TCP packet is kept.
#[inline(always)]
fn has_connection(ctx: &XdpContext, off: usize, ether_type: u16) -> bool {
    if ether_type == ETH_P_IPV4 {
        let Some(ip) = at::<Ipv4Hdr>(ctx, off) else { return true };
        let ip = unsafe { *ip };
        let ihl = ((ip.ver_ihl & 0x0f) as usize) * 4;
        if ip.proto != PROTO_TCP || ihl < IPV4_LEN || off + ihl + 20 > len(ctx) {
            return true;
        }
        let Some((sport, dport, flags)) = tcp(ctx, off + ihl) else { return true };
        let mut tuple = Tuple4 { saddr: ip.src, daddr: ip.dst, sport, dport };
        flags & TCP_SYN != 0 || lookup(ctx, &mut tuple as *mut Tuple4 as *mut bpf_sock_tuple, size_of::<Tuple4>())
    } else {
        let Some(ip) = at::<Ipv6Hdr>(ctx, off) else { return true };
        let ip = unsafe { *ip };
        // Extension headers are not walked here: such packets are kept.
        if ip.next_hdr != PROTO_TCP {
            return true;
        }
        let Some((sport, dport, flags)) = tcp(ctx, off + IPV6_LEN) else { return true };
        let mut tuple = Tuple6 { saddr: ip.src, daddr: ip.dst, sport, dport };
        flags & TCP_SYN != 0 || lookup(ctx, &mut tuple as *mut Tuple6 as *mut bpf_sock_tuple, size_of::<Tuple6>())
    }
}

/// Source port, destination port (network order) and flags of the TCP header at `off`.
#[inline(always)]
fn tcp(ctx: &XdpContext, off: usize) -> Option<(u16, u16, u8)> {
    let ports = unsafe { *at::<[u16; 2]>(ctx, off)? };
    let flags = unsafe { *at::<u8>(ctx, off + 13)? };
    Some((ports[0], ports[1], flags))
}

/// A socket of this host's namespace for the tuple, other than a listener.
#[inline(always)]
fn lookup(ctx: &XdpContext, tuple: *mut bpf_sock_tuple, size: usize) -> bool {
    // SAFETY: `tuple` points to `size` bytes on our stack; the returned socket is released
    // before returning, as the verifier demands.
    unsafe {
        let sk = bpf_skc_lookup_tcp(ctx.ctx as *mut _, tuple, size as u32, BPF_F_CURRENT_NETNS as u64, 0);
        if sk.is_null() {
            return false;
        }
        let state = (*sk).state;
        bpf_sk_release(sk as *mut _);
        state != TCP_LISTEN
    }
}
