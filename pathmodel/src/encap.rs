//! The frame the balancer sends: a new Ethernet header and outer IP header (and GUE's UDP
//! header) in front of the inner IP packet, which is carried unchanged with any bytes after it.

use spillway_common::{
    hash::gue_source_port,
    types::{BackendInfo, ENCAP_GUE, FAMILY_V4, PROTO_IPIP, PROTO_IPV6, PROTO_UDP},
};

use crate::frame::{ETH_LEN, IPV4_LEN, IPV6_LEN, UDP_LEN};

const TTL: u8 = 64;

/// A tunnel to `backend` from `src` for an inner packet of `inner_family` and `inner_len`.
pub(crate) struct Tunnel {
    pub backend: BackendInfo,
    pub src: [u32; 4],
    pub inner_family: u8,
    pub inner_len: usize,
    pub tos: u8,
    pub flow_hash: u32,
    /// Network order.
    pub gue_port: u16,
}

/// No IPv6 inside IPv4.
pub(crate) fn supported(outer_family: u8, inner_family: u8) -> bool {
    outer_family != FAMILY_V4 || inner_family == FAMILY_V4
}

/// The headers of `t`, Ethernet first.
pub(crate) fn headers(t: &Tunnel, src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
    let gue = t.backend.encap == ENCAP_GUE;
    let udp_len = if gue { UDP_LEN } else { 0 };
    let proto = if gue {
        PROTO_UDP
    } else if t.inner_family == FAMILY_V4 {
        PROTO_IPIP
    } else {
        PROTO_IPV6
    };
    let mut out = Vec::with_capacity(ETH_LEN + IPV6_LEN + UDP_LEN);
    out.extend_from_slice(&dst_mac);
    out.extend_from_slice(&src_mac);
    let words = |out: &mut Vec<u8>, w: &[u32]| w.iter().for_each(|w| out.extend_from_slice(&w.to_ne_bytes()));
    if t.backend.family == FAMILY_V4 {
        out.extend_from_slice(&0x0800u16.to_be_bytes());
        let start = out.len();
        out.extend_from_slice(&[0x45, t.tos]);
        out.extend_from_slice(&((IPV4_LEN + udp_len + t.inner_len) as u16).to_be_bytes());
        // Identification 0, don't fragment.
        out.extend_from_slice(&[0, 0, 0x40, 0, TTL, proto, 0, 0]);
        words(&mut out, &t.src[..1]);
        words(&mut out, &t.backend.addr[..1]);
        let check = checksum(&out[start..]);
        out[start + 10..start + 12].copy_from_slice(&check.to_be_bytes());
    } else {
        out.extend_from_slice(&0x86ddu16.to_be_bytes());
        let vtc = (6u32 << 28) | (t.tos as u32) << 20 | (t.flow_hash & 0x000f_ffff);
        out.extend_from_slice(&vtc.to_be_bytes());
        out.extend_from_slice(&((udp_len + t.inner_len) as u16).to_be_bytes());
        out.extend_from_slice(&[proto, TTL]);
        words(&mut out, &t.src);
        words(&mut out, &t.backend.addr);
    }
    if gue {
        out.extend_from_slice(&gue_source_port(t.flow_hash).to_be_bytes());
        out.extend_from_slice(&t.gue_port.to_ne_bytes());
        out.extend_from_slice(&((UDP_LEN + t.inner_len) as u16).to_be_bytes());
        // No checksum: the inner packet keeps its own.
        out.extend_from_slice(&[0, 0]);
    }
    out
}

/// The Internet checksum of a header whose checksum field is zero.
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}
