//! Frame parsing: Ethernet (+ one 802.1Q tag), IPv4 (any IHL), IPv6 (bounded extension
//! header walk), TCP, UDP, and the ICMP/ICMPv6 errors whose quoted packet names a flow.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::{AddrKey, FAMILY_V4, FAMILY_V6, FlowKey, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP};

use crate::headers::*;
use crate::packet::{at, len};

/// Extension headers walked before giving up and treating the packet as not ours.
pub(crate) const MAX_IPV6_EXT_HEADERS: usize = 4;

/// Where the IP packet sits in the frame.
#[derive(Clone, Copy)]
pub struct Layout {
    /// Bytes before the IP header (14, or 18 with a VLAN tag).
    pub l2_len: usize,
    /// Bytes of the IP packet as its header states (trailing frame padding excluded).
    pub l3_len: usize,
    /// IPv4 TOS or IPv6 traffic class, copied to the outer header.
    pub tos: u8,
    /// Offset of the header after the IP ones (TCP, UDP; an ICMP error's ICMP header): where
    /// the QUIC program finds a QUIC header.
    pub l4: u16,
}

pub enum Parsed {
    /// Not IPv4/IPv6: ARP, LLDP, ...
    NotIp,
    /// Truncated or inconsistent headers.
    Malformed,
    /// A fragment; only its destination matters (no ports to hash on).
    Fragment(AddrKey),
    /// IP to this address, but nothing a VIP could own (other protocols, other ICMP).
    Other(AddrKey),
    /// IP of the family [`parse_family`] was told to leave to another program.
    OtherFamily,
    /// A TCP/UDP packet, or an ICMP error quoting one (`icmp_error`); `key` is always the
    /// client-to-VIP direction. `syn`: a TCP connection request (SYN without ACK).
    Flow { key: FlowKey, layout: Layout, icmp_error: bool, syn: bool },
}

#[inline(always)]
pub fn parse(ctx: &XdpContext) -> Parsed {
    parse_family::<0>(ctx)
}

/// [`parse`] of one family's frames only (`FAMILY_V4`, `FAMILY_V6`; 0: both): the other's
/// are [`Parsed::OtherFamily`], and their branches are not built in.
#[inline(always)]
pub fn parse_family<const FAMILY: u8>(ctx: &XdpContext) -> Parsed {
    let Some(eth) = at::<EthHdr>(ctx, 0) else {
        return Parsed::Malformed;
    };
    let mut ether_type = unsafe { (*eth).proto };
    let mut l2_len = ETH_LEN;
    if ether_type == ETH_P_8021Q {
        let Some(vlan) = at::<VlanHdr>(ctx, ETH_LEN) else {
            return Parsed::Malformed;
        };
        ether_type = unsafe { (*vlan).proto };
        l2_len += VLAN_LEN;
    }
    if ether_type == ETH_P_IPV4 {
        if FAMILY == FAMILY_V6 { Parsed::OtherFamily } else { parse_v4(ctx, l2_len) }
    } else if ether_type == ETH_P_IPV6 {
        if FAMILY == FAMILY_V4 { Parsed::OtherFamily } else { parse_v6(ctx, l2_len) }
    } else {
        Parsed::NotIp
    }
}

#[inline(always)]
pub(crate) fn v4_addr(addr: u32) -> [u32; 4] {
    [addr, 0, 0, 0]
}

/// The IPv4 header at `l3`, its length and the packet's (its total length), if whole and
/// consistent with the frame.
#[inline(always)]
pub(crate) fn ipv4_at(ctx: &XdpContext, l3: usize) -> Option<(&Ipv4Hdr, usize, usize)> {
    let ip = at::<Ipv4Hdr>(ctx, l3)?;
    // SAFETY: `at` checked the header is inside the frame.
    let ip = unsafe { &*ip };
    let ihl = ((ip.ver_ihl & 0x0f) as usize) * 4;
    let tot_len = u16::from_be(ip.tot_len) as usize;
    if ip.ver_ihl >> 4 != 4 || ihl < IPV4_LEN || tot_len < ihl || l3 + tot_len > len(ctx) {
        return None;
    }
    Some((ip, ihl, tot_len))
}

#[inline(always)]
fn parse_v4(ctx: &XdpContext, l3: usize) -> Parsed {
    let Some((ip, ihl, tot_len)) = ipv4_at(ctx, l3) else {
        return Parsed::Malformed;
    };
    if u16::from_be(ip.frag_off) & IPV4_MF_OFFSET_MASK != 0 {
        return Parsed::Fragment(AddrKey { addr: v4_addr(ip.dst), family: FAMILY_V4, _pad: [0; 3] });
    }
    let l4 = l3 + ihl;
    let layout = Layout { l2_len: l3, l3_len: tot_len, tos: ip.tos, l4: l4 as u16 };
    let dst = AddrKey { addr: v4_addr(ip.dst), family: FAMILY_V4, _pad: [0; 3] };
    match ip.proto {
        PROTO_TCP | PROTO_UDP => {
            let Some(ports) = l4_ports(ctx, l4, ip.proto) else {
                return Parsed::Malformed;
            };
            let key = flow_key(v4_addr(ip.src), v4_addr(ip.dst), ports, ip.proto, FAMILY_V4);
            Parsed::Flow { key, layout, icmp_error: false, syn: is_syn(ctx, l4, ip.proto) }
        }
        PROTO_ICMP => {
            let Some(icmp) = at::<IcmpHdr>(ctx, l4) else {
                return Parsed::Malformed;
            };
            let (kind, code) = unsafe { ((*icmp).kind, (*icmp).code) };
            if kind != ICMP_DEST_UNREACH || code != ICMP_FRAG_NEEDED {
                return Parsed::Other(dst);
            }
            quoted_v4(ctx, l4 + ICMP_LEN, layout, dst)
        }
        _ => Parsed::Other(dst),
    }
}

/// The packet an ICMP "fragmentation needed" quotes was sent VIP -> client by a backend;
/// the flow is its reverse.
#[inline(always)]
fn quoted_v4(ctx: &XdpContext, q: usize, layout: Layout, dst: AddrKey) -> Parsed {
    let Some(ip) = at::<Ipv4Hdr>(ctx, q) else {
        return Parsed::Malformed;
    };
    let ip = unsafe { &*ip };
    let ihl = ((ip.ver_ihl & 0x0f) as usize) * 4;
    if ip.ver_ihl >> 4 != 4 || ihl < IPV4_LEN {
        return Parsed::Malformed;
    }
    if ip.proto != PROTO_TCP && ip.proto != PROTO_UDP {
        return Parsed::Other(dst);
    }
    // An ICMP error quotes only 8 bytes of L4: the ports are all we may read.
    let Some(ports) = at::<Ports>(ctx, q + ihl) else {
        return Parsed::Malformed;
    };
    let ports = unsafe { *ports };
    let swapped = Ports { src: ports.dst, dst: ports.src };
    let key = flow_key(v4_addr(ip.dst), v4_addr(ip.src), swapped, ip.proto, FAMILY_V4);
    Parsed::Flow { key, layout, icmp_error: true, syn: false }
}

#[inline(always)]
fn parse_v6(ctx: &XdpContext, l3: usize) -> Parsed {
    let Some(ip) = at::<Ipv6Hdr>(ctx, l3) else {
        return Parsed::Malformed;
    };
    let ip = unsafe { &*ip };
    let vtc = u32::from_be(ip.vtc_flow);
    let l3_len = IPV6_LEN + u16::from_be(ip.payload_len) as usize;
    if vtc >> 28 != 6 || l3 + l3_len > len(ctx) {
        return Parsed::Malformed;
    }
    let mut layout = Layout { l2_len: l3, l3_len, tos: (vtc >> 20) as u8, l4: 0 };
    let dst = AddrKey { addr: ip.dst, family: FAMILY_V6, _pad: [0; 3] };
    let mut next = ip.next_hdr;
    let mut off = l3 + IPV6_LEN;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        match next {
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS => {
                let Some(ext) = at::<Ipv6ExtHdr>(ctx, off) else {
                    return Parsed::Malformed;
                };
                let ext = unsafe { *ext };
                next = ext.next_hdr;
                off += (ext.len as usize + 1) * 8;
            }
            IPV6_FRAGMENT => {
                return Parsed::Fragment(dst);
            }
            _ => break,
        }
    }
    layout.l4 = off as u16;
    match next {
        PROTO_TCP | PROTO_UDP => {
            let Some(ports) = l4_ports(ctx, off, next) else {
                return Parsed::Malformed;
            };
            let key = flow_key(ip.src, ip.dst, ports, next, FAMILY_V6);
            Parsed::Flow { key, layout, icmp_error: false, syn: is_syn(ctx, off, next) }
        }
        PROTO_ICMPV6 => {
            let Some(icmp) = at::<IcmpHdr>(ctx, off) else {
                return Parsed::Malformed;
            };
            if unsafe { (*icmp).kind } != ICMPV6_PKT_TOO_BIG {
                return Parsed::Other(dst);
            }
            quoted_v6(ctx, off + ICMP_LEN, layout, dst)
        }
        _ => Parsed::Other(dst),
    }
}

#[inline(always)]
fn quoted_v6(ctx: &XdpContext, q: usize, layout: Layout, dst: AddrKey) -> Parsed {
    let Some(ip) = at::<Ipv6Hdr>(ctx, q) else {
        return Parsed::Malformed;
    };
    let ip = unsafe { &*ip };
    if ip.next_hdr != PROTO_TCP && ip.next_hdr != PROTO_UDP {
        return Parsed::Other(dst);
    }
    let Some(ports) = at::<Ports>(ctx, q + IPV6_LEN) else {
        return Parsed::Malformed;
    };
    let ports = unsafe { *ports };
    let swapped = Ports { src: ports.dst, dst: ports.src };
    let key = flow_key(ip.dst, ip.src, swapped, ip.next_hdr, FAMILY_V6);
    Parsed::Flow { key, layout, icmp_error: true, syn: false }
}

/// True for a TCP SYN without ACK (the header's presence was checked by `l4_ports`).
#[inline(always)]
fn is_syn(ctx: &XdpContext, l4: usize, proto: u8) -> bool {
    proto == PROTO_TCP && at::<u8>(ctx, l4 + TCP_FLAGS_OFFSET).is_some_and(|f| unsafe { *f } & (TCP_SYN | TCP_ACK) == TCP_SYN)
}

/// Ports of a TCP or UDP header, if the whole fixed header is present.
#[inline(always)]
pub(crate) fn l4_ports(ctx: &XdpContext, l4: usize, proto: u8) -> Option<Ports> {
    let header_len = if proto == PROTO_TCP { TCP_LEN } else { UDP_LEN };
    if l4 + header_len > len(ctx) {
        return None;
    }
    at::<Ports>(ctx, l4).map(|p| unsafe { *p })
}

#[inline(always)]
pub(crate) fn flow_key(src: [u32; 4], dst: [u32; 4], ports: Ports, proto: u8, family: u8) -> FlowKey {
    FlowKey { src, dst, sport: ports.src, dport: ports.dst, proto, family, _pad: [0; 2] }
}
