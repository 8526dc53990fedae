//! The backend's half of second chance (see the balancer's `second_chance`): a tunnel to
//! this host carrying a tunnel to another backend holds a TCP packet of a connection that
//! lives on one of the two. This host keeps it if it has a socket for the connection (any
//! but a listener: established, a handshake in progress, TIME_WAIT) and otherwise sends the
//! inner tunnel on to the other backend.
//!
//! Sending on makes the backend a reflector, so it sends on only what a balancer built: the
//! outer source was allowed by the caller, the middle header must come from that same
//! balancer (the balancer writes both sources), and its TTL is decremented as a router's
//! would be, so nested tunnels cannot bounce between hosts for ever.

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_NETNS, bpf_sock_tuple},
    helpers::{bpf_sk_release, bpf_skc_lookup_tcp},
    programs::XdpContext,
};
use spillway_common::types::{DecapReason, FAMILY_V4, PROTO_TCP};
use xdp_ebpf::{
    csum,
    headers::*,
    packet::{at, at_mut},
};

use crate::{Ip, allowed, carried, ip_at, local, tunnel_at};

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

/// What the tunnel from `outer` carries at `off` (an `ether_type` packet): a packet for this
/// host (`None`), a second-chance packet (`Some`; one to send on has had its middle TTL
/// decremented), or why it is refused. The middle header is IPIP or GUE (`gue_port`) as
/// the second candidate takes it, whatever the outer one is.
#[inline(always)]
pub fn classify(ctx: &XdpContext, off: usize, ether_type: u16, outer: &Ip, gue_port: u16) -> Result<Option<Nested>, DecapReason> {
    let inner = ip_at(ctx, off, ether_type).ok_or(DecapReason::PassMalformed)?;
    // A middle GUE header goes to the other backend; UDP to this host on the GUE port is a
    // client's packet to a UDP VIP on that port.
    // A fragment is no tunnel: a later one's first bytes are payload, whatever they read as.
    let middle = if inner.fragment { None } else { tunnel_at(ctx, off, &inner, gue_port) };
    let middle = middle.filter(|t| !t.gue || !local(inner.family, &inner.dst));
    let Some(middle) = middle else {
        return if local(inner.family, &inner.dst) { Ok(None) } else { Err(DecapReason::DropInnerNotLocal) };
    };
    // `inner` is the middle header; the connection's packet follows it, and is for a VIP
    // this host serves whichever of the two candidates has the connection.
    let conn_off = off + middle.len;
    let conn_ether_type = carried(ctx, conn_off, &inner, &middle).ok_or(DecapReason::PassMalformed)?;
    let conn = ip_at(ctx, conn_off, conn_ether_type).ok_or(DecapReason::PassMalformed)?;
    if !local(conn.family, &conn.dst) {
        return Err(DecapReason::DropInnerNotLocal);
    }
    if has_connection(ctx, conn_off, &conn) {
        return Ok(Some(Nested { middle_len: middle.len, inner_ether_type: conn_ether_type, local: true }));
    }
    // The balancer writes its own outer source in both headers (of each family).
    let from_balancer = if inner.family == outer.family { inner.src == outer.src } else { allowed(inner.family, &inner.src) };
    if !from_balancer {
        return Err(DecapReason::DropSecondChanceSource);
    }
    if inner.ttl <= 1 {
        return Err(DecapReason::DropSecondChanceTtl);
    }
    decrement_ttl(ctx, off, inner.family).ok_or(DecapReason::PassMalformed)?;
    Ok(Some(Nested { middle_len: middle.len, inner_ether_type: conn_ether_type, local: false }))
}

/// One hop less on the header at `off` (checked above to be above 1), its IPv4 checksum
/// updated.
#[inline(always)]
fn decrement_ttl(ctx: &XdpContext, off: usize, family: u8) -> Option<()> {
    if family == FAMILY_V4 {
        let ip = at_mut::<Ipv4Hdr>(ctx, off)?;
        unsafe {
            (*ip).ttl = (*ip).ttl.wrapping_sub(1);
            (*ip).check = csum::ipv4_after_ttl_decrement((*ip).check);
        }
    } else {
        let ip = at_mut::<Ipv6Hdr>(ctx, off)?;
        unsafe { (*ip).hop_limit = (*ip).hop_limit.wrapping_sub(1) };
    }
    Some(())
}

/// Whether this host has a socket for the packet `ip` at `off`. Anything it cannot read as
/// a non-SYN TCP packet is kept.
#[inline(always)]
fn has_connection(ctx: &XdpContext, off: usize, ip: &Ip) -> bool {
    // IPv6 extension headers are not walked here: such packets are kept.
    if ip.proto != PROTO_TCP {
        return true;
    }
    let Some((sport, dport, flags)) = tcp(ctx, off + ip.len) else { return true };
    if flags & TCP_SYN != 0 {
        return true;
    }
    if ip.family == FAMILY_V4 {
        let mut tuple = Tuple4 { saddr: ip.src[0], daddr: ip.dst[0], sport, dport };
        lookup(ctx, &mut tuple as *mut Tuple4 as *mut bpf_sock_tuple, size_of::<Tuple4>())
    } else {
        let mut tuple = Tuple6 { saddr: ip.src, daddr: ip.dst, sport, dport };
        lookup(ctx, &mut tuple as *mut Tuple6 as *mut bpf_sock_tuple, size_of::<Tuple6>())
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
