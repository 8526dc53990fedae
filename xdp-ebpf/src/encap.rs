//! Direct-server-return encapsulation: IPv4-in-IPv4, IPv6-in-IPv6 and IPv4-in-IPv6, each
//! either plain (IPIP) or with a UDP header between the outer and the inner IP header (GUE
//! variant 1). The inner packet is never touched; only a new Ethernet, outer IP (and UDP)
//! header are written in front of it.

use aya_ebpf::{helpers::bpf_xdp_adjust_head, programs::XdpContext};
use spillway_common::{
    hash::gue_source_port,
    types::{FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6, PROTO_UDP},
};

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
    /// Low 20 bits become the IPv6 flow label (more entropy for ECMP on the way); with GUE
    /// the top bits are the UDP source port too.
    pub flow_hash: u32,
    /// GUE: the UDP destination port (network order). `None`: IPIP.
    pub gue_port: Option<u16>,
}

pub struct Macs {
    pub src: [u8; 6],
    pub dst: [u8; 6],
}

const OUTER_TTL: u8 = 64;

/// Bytes the tunnel adds: the outer IP header, and GUE's UDP header.
#[inline(always)]
pub const fn outer_len(family: u8, gue: bool) -> usize {
    (if family == FAMILY_V4 { IPV4_LEN } else { IPV6_LEN }) + if gue { UDP_LEN } else { 0 }
}

impl Tunnel {
    #[inline(always)]
    pub const fn outer_len(&self) -> usize {
        outer_len(self.family, self.gue_port.is_some())
    }

    /// The outer IP header's payload: the UDP header, if any, and the inner packet.
    #[inline(always)]
    const fn ip_payload_len(&self) -> usize {
        self.inner_len + if self.gue_port.is_some() { UDP_LEN } else { 0 }
    }
}

/// Replaces the `l2_len` bytes before the inner IP header with Ethernet + outer IP.
/// A VLAN tag on the way in is not carried over: the FIB chose the egress.
#[inline(always)]
pub fn push(ctx: &XdpContext, l2_len: usize, t: &Tunnel, macs: &Macs) -> Result<(), ()> {
    let outer = t.outer_len();
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
    if let Some(udp) = udp_header(t) {
        let at = ETH_LEN + if t.family == FAMILY_V4 { IPV4_LEN } else { IPV6_LEN };
        let hdr = at_mut::<UdpHdr>(ctx, at).ok_or(())?;
        unsafe { *hdr = udp };
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
        tot_len: ((IPV4_LEN + t.ip_payload_len()) as u16).to_be(),
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
        payload_len: (t.ip_payload_len() as u16).to_be(),
        next_hdr: inner_proto(t),
        hop_limit: OUTER_TTL,
        src: t.src,
        dst: t.dst,
    }
}

/// GUE's UDP header: the source port from the flow hash (RSS on the backend spreads flows
/// by it), checksum 0. Over IPv4 a zero checksum means "none"; over IPv6 RFC 6935 allows
/// it for tunnels whose receiver accepts it on that port (RFC 6936), which `spillway_decap`
/// does: the inner packet keeps its own checksums, and the outer addresses are checked
/// against the allow-list and the local addresses, so a corrupted header is not delivered.
#[inline(always)]
pub fn udp_header(t: &Tunnel) -> Option<UdpHdr> {
    let port = t.gue_port?;
    Some(UdpHdr { src: gue_source_port(t.flow_hash).to_be(), dst: port, len: ((UDP_LEN + t.inner_len) as u16).to_be(), check: 0 })
}

/// The outer header's protocol: UDP for GUE, else the inner family's tunnel protocol.
#[inline(always)]
fn inner_proto(t: &Tunnel) -> u8 {
    if t.gue_port.is_some() {
        PROTO_UDP
    } else if t.inner_family == FAMILY_V4 {
        PROTO_IPIP
    } else {
        PROTO_IPV6
    }
}

/// True when the encapsulation can carry this inner family (no IPv6 inside IPv4).
#[inline(always)]
pub fn supported(outer_family: u8, inner_family: u8) -> bool {
    outer_family == FAMILY_V6 || inner_family == FAMILY_V4
}
