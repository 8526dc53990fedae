//! Fragments, read as the fragment program needs them (`spillway_lb_frag`): the datagram
//! each belongs to (source, destination, protocol, identification), and the first one's
//! ports. The balancer's parser (`parse`) only says that a frame is a fragment; this reads it
//! again, in the program that handles fragments, so that the common path pays nothing for it.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::{AddrKey, FAMILY_V4, FAMILY_V6, FlowKey, FragmentKey, PROTO_TCP, PROTO_UDP};

use crate::headers::*;
use crate::packet::{at, len};
use crate::parse::{Layout, MAX_IPV6_EXT_HEADERS, flow_key, ipv4_at, l4_ports, v4_addr};

pub enum Fragmented {
    /// Headers the balancer's parser accepted and this one does not (never expected).
    Malformed,
    /// Not a fragment, or one no VIP could take: another protocol than TCP or UDP, a first
    /// fragment too short to hold its ports, extension headers after an IPv6 fragment
    /// header. Only its destination matters.
    Unplaceable(AddrKey),
    /// The first fragment (offset 0): its flow's key, and its datagram.
    First { key: FlowKey, datagram: FragmentKey, layout: Layout },
    /// A later fragment: only the datagram it belongs to.
    Later { datagram: FragmentKey, layout: Layout },
}

/// The fragment in a frame of `FAMILY` (`FAMILY_V4` or `FAMILY_V6`).
#[inline(always)]
pub fn parse_fragment<const FAMILY: u8>(ctx: &XdpContext) -> Fragmented {
    let Some(eth) = at::<EthHdr>(ctx, 0) else {
        return Fragmented::Malformed;
    };
    let mut l2_len = ETH_LEN;
    if unsafe { (*eth).proto } == ETH_P_8021Q {
        l2_len += VLAN_LEN;
    }
    if FAMILY == FAMILY_V4 { fragment_v4(ctx, l2_len) } else { fragment_v6(ctx, l2_len) }
}

#[inline(always)]
fn fragment_v4(ctx: &XdpContext, l3: usize) -> Fragmented {
    let Some((ip, ihl, tot_len)) = ipv4_at(ctx, l3) else {
        return Fragmented::Malformed;
    };
    let (src, dst) = (v4_addr(ip.src), v4_addr(ip.dst));
    let frag_off = u16::from_be(ip.frag_off);
    let datagram = FragmentKey { src, dst, id: u16::from_be(ip.id) as u32, proto: ip.proto, family: FAMILY_V4, _pad: [0; 2] };
    let layout = Layout { l2_len: l3, l3_len: tot_len, tos: ip.tos, l4: (l3 + ihl) as u16 };
    if frag_off & IPV4_MF_OFFSET_MASK == 0 {
        return Fragmented::Unplaceable(AddrKey { addr: dst, family: FAMILY_V4, _pad: [0; 3] });
    }
    classify(ctx, datagram, layout, frag_off & IPV4_OFFSET_MASK == 0, l3 + ihl)
}

#[inline(always)]
fn fragment_v6(ctx: &XdpContext, l3: usize) -> Fragmented {
    let Some(ip) = at::<Ipv6Hdr>(ctx, l3) else {
        return Fragmented::Malformed;
    };
    let ip = unsafe { &*ip };
    let vtc = u32::from_be(ip.vtc_flow);
    let l3_len = IPV6_LEN + u16::from_be(ip.payload_len) as usize;
    if vtc >> 28 != 6 || l3 + l3_len > len(ctx) {
        return Fragmented::Malformed;
    }
    let mut next = ip.next_hdr;
    let mut off = l3 + IPV6_LEN;
    // The headers before the fragment header (the unfragmentable part), as the parser walks them.
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        if next != IPV6_HOP_BY_HOP && next != IPV6_ROUTING && next != IPV6_DEST_OPTS {
            break;
        }
        let Some(ext) = at::<Ipv6ExtHdr>(ctx, off) else {
            return Fragmented::Malformed;
        };
        let ext = unsafe { *ext };
        next = ext.next_hdr;
        off += (ext.len as usize + 1) * 8;
    }
    let unplaceable = Fragmented::Unplaceable(AddrKey { addr: ip.dst, family: FAMILY_V6, _pad: [0; 3] });
    if next != IPV6_FRAGMENT {
        return unplaceable;
    }
    let Some(frag) = at::<Ipv6FragHdr>(ctx, off) else {
        return Fragmented::Malformed;
    };
    let frag = unsafe { *frag };
    let datagram =
        FragmentKey { src: ip.src, dst: ip.dst, id: u32::from_be(frag.id), proto: frag.next_hdr, family: FAMILY_V6, _pad: [0; 2] };
    let l4 = off + IPV6_FRAG_LEN;
    let layout = Layout { l2_len: l3, l3_len, tos: (vtc >> 20) as u8, l4: l4 as u16 };
    classify(ctx, datagram, layout, u16::from_be(frag.offset_flags) & IPV6_FRAG_OFFSET_MASK == 0, l4)
}

/// A fragment of `datagram` whose payload starts at `l4`: the first (with its ports) or a
/// later one. A protocol other than TCP and UDP (an extension header after IPv6's fragment
/// header included) is unplaceable.
#[inline(always)]
fn classify(ctx: &XdpContext, datagram: FragmentKey, layout: Layout, first: bool, l4: usize) -> Fragmented {
    if datagram.proto != PROTO_UDP && datagram.proto != PROTO_TCP {
        return Fragmented::Unplaceable(AddrKey { addr: datagram.dst, family: datagram.family, _pad: [0; 3] });
    }
    if !first {
        return Fragmented::Later { datagram, layout };
    }
    let Some(ports) = l4_ports(ctx, l4, datagram.proto) else {
        return Fragmented::Unplaceable(AddrKey { addr: datagram.dst, family: datagram.family, _pad: [0; 3] });
    };
    let key = flow_key(datagram.src, datagram.dst, ports, datagram.proto, datagram.family);
    Fragmented::First { key, datagram, layout }
}
