//! Direct-server-return encapsulation: IPv4-in-IPv4, IPv6-in-IPv6 and IPv4-in-IPv6.
//! The inner packet is never touched; only a new Ethernet and outer IP header are written
//! in front of it.

use aya_ebpf::{helpers::bpf_xdp_adjust_head, programs::XdpContext};
use spillway_common::types::{FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6};

use crate::csum;
use crate::headers::*;
use crate::packet::at_mut;

/// The outer header to write.
pub struct Tunnel {
    pub family: u8,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Inner packet family (picks the outer protocol number).
    pub inner_family: u8,
    /// Inner packet length in bytes.
    pub inner_len: usize,
    pub tos: u8,
    /// Low 20 bits become the IPv6 flow label (more entropy for ECMP on the way).
    pub flow_hash: u32,
}

pub struct Macs {
    pub src: [u8; 6],
    pub dst: [u8; 6],
}

const OUTER_TTL: u8 = 64;

#[inline(always)]
pub const fn outer_len(family: u8) -> usize {
    if family == FAMILY_V4 { IPV4_LEN } else { IPV6_LEN }
}

/// Replaces the `l2_len` bytes before the inner IP header with Ethernet + outer IP.
/// A VLAN tag on the way in is not carried over: the FIB chose the egress.
#[inline(always)]
pub fn push(ctx: &XdpContext, l2_len: usize, t: &Tunnel, macs: &Macs) -> Result<(), ()> {
    let outer = outer_len(t.family);
    let delta = l2_len as i32 - (ETH_LEN + outer) as i32;
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, delta) } != 0 {
        return Err(());
    }
    let eth = at_mut::<EthHdr>(ctx, 0).ok_or(())?;
    if t.family == FAMILY_V4 {
        let ip = at_mut::<Ipv4Hdr>(ctx, ETH_LEN).ok_or(())?;
        let hdr = ipv4_header(t);
        unsafe {
            *eth = ethernet_header(t, macs);
            *ip = hdr;
        }
    } else {
        let ip = at_mut::<Ipv6Hdr>(ctx, ETH_LEN).ok_or(())?;
        unsafe {
            *eth = ethernet_header(t, macs);
            *ip = ipv6_header(t);
        }
    }
    Ok(())
}

/// Second chance: like [`push`], with `middle` (a tunnel to the second candidate) inside
/// `outer` (whose `inner_family` is the middle's family and whose `inner_len` counts the
/// middle header). The first backend strips the outer header and, when it has no socket
/// for the flow, sends the rest on to the second.
#[inline(always)]
pub fn push_nested(ctx: &XdpContext, l2_len: usize, outer: &Tunnel, middle: &Tunnel, macs: &Macs) -> Result<(), ()> {
    let (o, m) = (outer_len(outer.family), outer_len(middle.family));
    let delta = l2_len as i32 - (ETH_LEN + o + m) as i32;
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, delta) } != 0 {
        return Err(());
    }
    let eth = at_mut::<EthHdr>(ctx, 0).ok_or(())?;
    unsafe { *eth = ethernet_header(outer, macs) };
    write_ip(ctx, ETH_LEN, outer)?;
    write_ip(ctx, ETH_LEN + o, middle)
}

/// Writes `t`'s IP header at `offset`.
#[inline(always)]
fn write_ip(ctx: &XdpContext, offset: usize, t: &Tunnel) -> Result<(), ()> {
    if t.family == FAMILY_V4 {
        let ip = at_mut::<Ipv4Hdr>(ctx, offset).ok_or(())?;
        unsafe { *ip = ipv4_header(t) };
    } else {
        let ip = at_mut::<Ipv6Hdr>(ctx, offset).ok_or(())?;
        unsafe { *ip = ipv6_header(t) };
    }
    Ok(())
}

/// The Ethernet header in front of the outer IP header.
#[inline(always)]
pub fn ethernet_header(t: &Tunnel, macs: &Macs) -> EthHdr {
    EthHdr { dst: macs.dst, src: macs.src, proto: if t.family == FAMILY_V4 { ETH_P_IPV4 } else { ETH_P_IPV6 } }
}

/// The outer IPv4 header (IPIP, DF set, checksum computed).
#[inline(always)]
pub fn ipv4_header(t: &Tunnel) -> Ipv4Hdr {
    let mut hdr = Ipv4Hdr {
        ver_ihl: 0x45,
        tos: t.tos,
        tot_len: ((IPV4_LEN + t.inner_len) as u16).to_be(),
        id: 0,
        frag_off: IPV4_DF.to_be(),
        ttl: OUTER_TTL,
        proto: inner_proto(t),
        check: 0,
        src: t.src[0],
        dst: t.dst[0],
    };
    hdr.check = csum::ipv4_header(&hdr);
    hdr
}

/// The outer IPv6 header (IP6IP6 or IPv4-in-IPv6; the flow hash is the flow label).
#[inline(always)]
pub fn ipv6_header(t: &Tunnel) -> Ipv6Hdr {
    let vtc = (6u32 << 28) | ((t.tos as u32) << 20) | (t.flow_hash & 0x000f_ffff);
    Ipv6Hdr {
        vtc_flow: vtc.to_be(),
        payload_len: (t.inner_len as u16).to_be(),
        next_hdr: inner_proto(t),
        hop_limit: OUTER_TTL,
        src: t.src,
        dst: t.dst,
    }
}

#[inline(always)]
fn inner_proto(t: &Tunnel) -> u8 {
    if t.inner_family == FAMILY_V4 { PROTO_IPIP } else { PROTO_IPV6 }
}

/// True when the encapsulation can carry this inner family (no IPv6 inside IPv4).
#[inline(always)]
pub fn supported(outer_family: u8, inner_family: u8) -> bool {
    outer_family == FAMILY_V6 || inner_family == FAMILY_V4
}
