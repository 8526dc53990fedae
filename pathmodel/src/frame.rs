//! What the balancer's parser reads from a frame: Ethernet with at most one 802.1Q tag, IPv4
//! (any header length) or IPv6 (at most four extension headers walked), then TCP, UDP, or an
//! ICMP error quoting a flow. Written from the frame formats, byte by byte.

use spillway_common::types::{FAMILY_V4, FAMILY_V6, FlowKey, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP};

pub(crate) const ETH_LEN: usize = 14;
const VLAN_LEN: usize = 4;
pub(crate) const IPV4_LEN: usize = 20;
pub(crate) const IPV6_LEN: usize = 40;
const TCP_LEN: usize = 20;
pub(crate) const UDP_LEN: usize = 8;
pub(crate) const ICMP_LEN: usize = 8;
/// The TTL (hop limit) of the answers the program sends itself.
pub(crate) const ANSWER_TTL: u8 = 64;
const PORTS_LEN: usize = 4;
const EXT_HEADERS_WALKED: usize = 4;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DEST_OPTS: u8 = 60;

/// An IP destination: network-order words (IPv4 in word 0) and its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dst {
    pub addr: [u32; 4],
    pub family: u8,
}

/// Where the IP packet sits in the frame.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    pub l2_len: usize,
    /// The IP packet's length as its header states it.
    pub l3_len: usize,
    pub tos: u8,
    /// Where the header after the IP ones starts (a QUIC VIP's UDP header).
    pub l4: usize,
}

#[derive(Clone, Copy, Debug)]
pub enum Parsed {
    NotIp,
    Malformed,
    Fragment(Dst),
    /// IP that no VIP can own: other protocols and other ICMP.
    Other(Dst),
    /// TCP or UDP, or an ICMP error quoting a packet of the flow (`key` client to VIP).
    Flow {
        key: FlowKey,
        layout: Layout,
        icmp_error: bool,
        syn: bool,
    },
}

/// The frame's bytes, read only where present.
pub(crate) struct Bytes<'a>(pub &'a [u8]);

impl Bytes<'_> {
    /// `n` bytes at `at`, if the frame holds them.
    pub(crate) fn get(&self, at: usize, n: usize) -> Option<&[u8]> {
        self.0.get(at..at.checked_add(n)?)
    }
    pub(crate) fn u8(&self, at: usize) -> Option<u8> {
        self.0.get(at).copied()
    }
    /// Big-endian, as headers hold numbers.
    pub(crate) fn be16(&self, at: usize) -> Option<u16> {
        self.get(at, 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    /// As the program loads it: the bytes in memory order.
    pub(crate) fn raw16(&self, at: usize) -> u16 {
        self.get(at, 2).map_or(0, |b| u16::from_ne_bytes([b[0], b[1]]))
    }
    pub(crate) fn words(&self, at: usize, n: usize) -> [u32; 4] {
        let mut out = [0u32; 4];
        for (i, w) in out.iter_mut().enumerate().take(n) {
            if let Some(b) = self.get(at + 4 * i, 4) {
                *w = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        out
    }
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// The link layer: the IP version's ethertype and where the IP header starts.
pub(crate) fn link(b: &Bytes) -> Option<(u16, usize)> {
    let ethertype = b.be16(12)?;
    if ethertype != ETHERTYPE_VLAN {
        return Some((ethertype, ETH_LEN));
    }
    Some((b.be16(ETH_LEN + 2)?, ETH_LEN + VLAN_LEN))
}

pub fn parse(frame: &[u8]) -> Parsed {
    let b = Bytes(frame);
    let Some((ethertype, l3)) = link(&b) else {
        return Parsed::Malformed;
    };
    match ethertype {
        ETHERTYPE_IPV4 => parse_v4(&b, l3),
        ETHERTYPE_IPV6 => parse_v6(&b, l3),
        _ => Parsed::NotIp,
    }
}

/// The IPv4 header at `l3` if whole and consistent: its length and the packet's.
pub(crate) fn ipv4(b: &Bytes, l3: usize) -> Option<(usize, usize)> {
    b.get(l3, IPV4_LEN)?;
    let ver_ihl = b.u8(l3)?;
    let ihl = (ver_ihl & 0x0f) as usize * 4;
    let total = b.be16(l3 + 2)? as usize;
    (ver_ihl >> 4 == 4 && ihl >= IPV4_LEN && total >= ihl && l3 + total <= b.len()).then_some((ihl, total))
}

fn parse_v4(b: &Bytes, l3: usize) -> Parsed {
    let Some((ihl, total)) = ipv4(b, l3) else {
        return Parsed::Malformed;
    };
    let dst = Dst { addr: b.words(l3 + 16, 1), family: FAMILY_V4 };
    if b.be16(l3 + 6).unwrap_or(0) & 0x3fff != 0 {
        return Parsed::Fragment(dst);
    }
    let l4 = l3 + ihl;
    let layout = Layout { l2_len: l3, l3_len: total, tos: b.u8(l3 + 1).unwrap_or(0), l4 };
    let proto = b.u8(l3 + 9).unwrap_or(0);
    let src = b.words(l3 + 12, 1);
    match proto {
        PROTO_TCP | PROTO_UDP => transport(b, l4, proto, src, dst, layout),
        PROTO_ICMP => {
            let Some(icmp) = b.get(l4, ICMP_LEN) else {
                return Parsed::Malformed;
            };
            if (icmp[0], icmp[1]) != (3, 4) {
                return Parsed::Other(dst);
            }
            quoted_v4(b, l4 + ICMP_LEN, dst, layout)
        }
        _ => Parsed::Other(dst),
    }
}

/// "Fragmentation needed" quotes a packet a backend sent VIP -> client: the flow is its reverse.
fn quoted_v4(b: &Bytes, q: usize, dst: Dst, layout: Layout) -> Parsed {
    if b.get(q, IPV4_LEN).is_none() {
        return Parsed::Malformed;
    }
    let ver_ihl = b.u8(q).unwrap_or(0);
    let ihl = (ver_ihl & 0x0f) as usize * 4;
    if ver_ihl >> 4 != 4 || ihl < IPV4_LEN {
        return Parsed::Malformed;
    }
    let proto = b.u8(q + 9).unwrap_or(0);
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Parsed::Other(dst);
    }
    quoted_flow(b, q + ihl, proto, b.words(q + 16, 1), b.words(q + 12, 1), FAMILY_V4, layout)
}

/// The IPv6 header at `l3`, if whole and consistent: its layout.
fn ipv6(b: &Bytes, l3: usize) -> Option<Layout> {
    b.get(l3, IPV6_LEN)?;
    let vtc = u32::from_be_bytes(b.get(l3, 4).map_or([0; 4], |x| [x[0], x[1], x[2], x[3]]));
    let l3_len = IPV6_LEN + b.be16(l3 + 4).unwrap_or(0) as usize;
    (vtc >> 28 == 6 && l3 + l3_len <= b.len()).then_some(Layout { l2_len: l3, l3_len, tos: (vtc >> 20) as u8, l4: l3 + IPV6_LEN })
}

/// Past the extension headers (hop-by-hop, routing, destination options) of the IPv6 packet
/// at `l3`, at most `EXT_HEADERS_WALKED` of them: the next header, where it starts, and
/// whether the walk ended at it (rather than at the bound). `None`: one was cut short.
fn extension_headers(b: &Bytes, l3: usize) -> Option<(u8, usize, bool)> {
    let mut next = b.u8(l3 + 6)?;
    let mut off = l3 + IPV6_LEN;
    for _ in 0..EXT_HEADERS_WALKED {
        if !matches!(next, HOP_BY_HOP | ROUTING | DEST_OPTS) {
            return Some((next, off, true));
        }
        let ext = b.get(off, 2)?;
        next = ext[0];
        off += (ext[1] as usize + 1) * 8;
    }
    Some((next, off, false))
}

fn parse_v6(b: &Bytes, l3: usize) -> Parsed {
    let Some(layout) = ipv6(b, l3) else {
        return Parsed::Malformed;
    };
    let dst = Dst { addr: b.words(l3 + 24, 4), family: FAMILY_V6 };
    let src = b.words(l3 + 8, 4);
    let Some((next, off, ended)) = extension_headers(b, l3) else {
        return Parsed::Malformed;
    };
    let layout = Layout { l4: off, ..layout };
    // A fragment header past the walk's bound is not looked at: other.
    if next == FRAGMENT && ended {
        return Parsed::Fragment(dst);
    }
    match next {
        PROTO_TCP | PROTO_UDP => transport(b, off, next, src, dst, layout),
        PROTO_ICMPV6 => {
            let Some(icmp) = b.get(off, ICMP_LEN) else {
                return Parsed::Malformed;
            };
            // Packet too big, whatever its code.
            if icmp[0] != 2 {
                return Parsed::Other(dst);
            }
            let q = off + ICMP_LEN;
            if b.get(q, IPV6_LEN).is_none() {
                return Parsed::Malformed;
            }
            let proto = b.u8(q + 6).unwrap_or(0);
            if proto != PROTO_TCP && proto != PROTO_UDP {
                return Parsed::Other(dst);
            }
            quoted_flow(b, q + IPV6_LEN, proto, b.words(q + 24, 4), b.words(q + 8, 4), FAMILY_V6, layout)
        }
        _ => Parsed::Other(dst),
    }
}

/// The quoted packet's ports at `at` (only 8 bytes of its L4 are quoted), swapped.
fn quoted_flow(b: &Bytes, at: usize, proto: u8, client: [u32; 4], vip: [u32; 4], family: u8, layout: Layout) -> Parsed {
    if b.get(at, PORTS_LEN).is_none() {
        return Parsed::Malformed;
    }
    let key = FlowKey { src: client, dst: vip, sport: b.raw16(at + 2), dport: b.raw16(at), proto, family, _pad: [0; 2] };
    Parsed::Flow { key, layout, icmp_error: true, syn: false }
}

/// A TCP or UDP packet whose fixed header must be in the frame.
fn transport(b: &Bytes, l4: usize, proto: u8, src: [u32; 4], dst: Dst, layout: Layout) -> Parsed {
    match ports(b, l4, proto) {
        Some((sport, dport)) => {
            let key = FlowKey { src, dst: dst.addr, sport, dport, proto, family: dst.family, _pad: [0; 2] };
            // SYN without ACK: a connection request.
            let syn = proto == PROTO_TCP && b.u8(l4 + 13).is_some_and(|f| f & 0x12 == 0x02);
            Parsed::Flow { key, layout, icmp_error: false, syn }
        }
        None => Parsed::Malformed,
    }
}

/// The ports (memory order) of a TCP or UDP header, if its whole fixed header is present.
pub(crate) fn ports(b: &Bytes, l4: usize, proto: u8) -> Option<(u16, u16)> {
    b.get(l4, if proto == PROTO_TCP { TCP_LEN } else { UDP_LEN })?;
    Some((b.raw16(l4), b.raw16(l4 + 2)))
}

/// A fragment, read again as the fragment program reads it.
#[derive(Clone, Copy, Debug)]
pub enum Fragment {
    Malformed,
    /// A protocol other than TCP or UDP, or a first fragment without its ports.
    Unplaceable(Dst),
    First {
        key: FlowKey,
        datagram: Datagram,
        layout: Layout,
    },
    Later {
        datagram: Datagram,
        layout: Layout,
    },
}

/// The datagram a fragment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Datagram {
    pub src: [u32; 4],
    pub dst: Dst,
    pub id: u32,
    pub proto: u8,
}

pub fn parse_fragment(frame: &[u8]) -> Fragment {
    let b = Bytes(frame);
    let Some((ethertype, l3)) = link(&b) else {
        return Fragment::Malformed;
    };
    if ethertype == ETHERTYPE_IPV4 { fragment_v4(&b, l3) } else { fragment_v6(&b, l3) }
}

fn fragment_v4(b: &Bytes, l3: usize) -> Fragment {
    let Some((ihl, total)) = ipv4(b, l3) else {
        return Fragment::Malformed;
    };
    let dst = Dst { addr: b.words(l3 + 16, 1), family: FAMILY_V4 };
    let frag_off = b.be16(l3 + 6).unwrap_or(0);
    let datagram = Datagram { src: b.words(l3 + 12, 1), dst, id: b.be16(l3 + 4).unwrap_or(0) as u32, proto: b.u8(l3 + 9).unwrap_or(0) };
    if frag_off & 0x3fff == 0 {
        return Fragment::Unplaceable(dst);
    }
    let layout = Layout { l2_len: l3, l3_len: total, tos: b.u8(l3 + 1).unwrap_or(0), l4: l3 + ihl };
    classify(b, datagram, layout, frag_off & 0x1fff == 0, l3 + ihl)
}

fn fragment_v6(b: &Bytes, l3: usize) -> Fragment {
    let (Some(layout), Some((next, off, _))) = (ipv6(b, l3), extension_headers(b, l3)) else {
        return Fragment::Malformed;
    };
    let dst = Dst { addr: b.words(l3 + 24, 4), family: FAMILY_V6 };
    if next != FRAGMENT {
        return Fragment::Unplaceable(dst);
    }
    let Some(frag) = b.get(off, 8) else {
        return Fragment::Malformed;
    };
    let datagram = Datagram { src: b.words(l3 + 8, 4), dst, id: u32::from_be_bytes([frag[4], frag[5], frag[6], frag[7]]), proto: frag[0] };
    classify(b, datagram, layout, u16::from_be_bytes([frag[2], frag[3]]) & 0xfff8 == 0, off + 8)
}

fn classify(b: &Bytes, datagram: Datagram, layout: Layout, first: bool, l4: usize) -> Fragment {
    if datagram.proto != PROTO_TCP && datagram.proto != PROTO_UDP {
        return Fragment::Unplaceable(datagram.dst);
    }
    if !first {
        return Fragment::Later { datagram, layout };
    }
    match ports(b, l4, datagram.proto) {
        Some((sport, dport)) => {
            let key = FlowKey {
                src: datagram.src,
                dst: datagram.dst.addr,
                sport,
                dport,
                proto: datagram.proto,
                family: datagram.dst.family,
                _pad: [0; 2],
            };
            Fragment::First { key, datagram, layout }
        }
        None => Fragment::Unplaceable(datagram.dst),
    }
}

/// An address a host may have, so an answer to it goes to one host: not unspecified,
/// loopback, multicast, or (IPv4) reserved or broadcast.
pub(crate) fn is_host(src: &[u32; 4], family: u8) -> bool {
    let first = src[0].to_ne_bytes()[0];
    if family == FAMILY_V4 {
        first != 0 && first != 127 && first < 224
    } else {
        let unspecified_or_loopback = src[..3] == [0, 0, 0] && u32::from_be(src[3]) <= 1;
        first != 0xff && !unspecified_or_loopback
    }
}
