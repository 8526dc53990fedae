//! Ethernet frames for packet-level tests and benchmarks, built with `etherparse` (an
//! implementation independent of the code under test), plus byte-level edits for the
//! shapes a builder refuses to make (IPv4 options, fragments, truncation).

use std::net::{IpAddr, SocketAddr};

use anyhow::{Result, ensure};
use etherparse::{IpHeaders, PacketBuilder, PacketBuilderStep};

/// MAC of the client (or upstream router) that sends frames to the balancer.
pub const CLIENT_MAC: [u8; 6] = [0x02, 0xcc, 0, 0, 0, 1];
/// MAC the frames are addressed to (the balancer's NIC).
pub const LB_MAC: [u8; 6] = [0x02, 0x1b, 0, 0, 0, 1];

pub const ETH_LEN: usize = 14;
const TTL: u8 = 64;

fn ip_step(src: IpAddr, dst: IpAddr) -> PacketBuilderStep<IpHeaders> {
    let eth = PacketBuilder::ethernet2(CLIENT_MAC, LB_MAC);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), TTL),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), TTL),
        _ => panic!("mixed families: {src} -> {dst}"),
    }
}

/// A TCP segment; `syn` selects SYN, otherwise ACK with `payload`.
pub fn tcp(src: SocketAddr, dst: SocketAddr, syn: bool, payload: &[u8]) -> Vec<u8> {
    let step = ip_step(src.ip(), dst.ip()).tcp(src.port(), dst.port(), 1000, 64240);
    let step = if syn { step.syn() } else { step.ack(1) };
    let mut out = Vec::with_capacity(step.size(payload.len()));
    step.write(&mut out, payload).expect("writing a TCP frame");
    out
}

pub fn udp(src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Vec<u8> {
    let step = ip_step(src.ip(), dst.ip()).udp(src.port(), dst.port());
    let mut out = Vec::with_capacity(step.size(payload.len()));
    step.write(&mut out, payload).expect("writing a UDP frame");
    out
}

/// ICMP "fragmentation needed" from `router` to `vip`, quoting the first bytes of a packet
/// the backend sent from `vip` to `client` (IPv4 only).
pub fn icmp_frag_needed(router: IpAddr, vip: SocketAddr, client: SocketAddr, mtu: u16) -> Vec<u8> {
    icmp_error(router, vip, client, 3, 4, [0, 0, (mtu >> 8) as u8, mtu as u8])
}

/// ICMPv6 "packet too big" from `router` to `vip`, quoting a `vip` -> `client` packet.
pub fn icmp6_packet_too_big(router: IpAddr, vip: SocketAddr, client: SocketAddr, mtu: u32) -> Vec<u8> {
    icmp_error(router, vip, client, 2, 0, mtu.to_be_bytes())
}

/// ICMP "fragmentation needed" from `router` to `vip`, quoting a UDP packet from `vip` to
/// `client` (IPv4 only).
pub fn icmp_frag_needed_udp(router: IpAddr, vip: SocketAddr, client: SocketAddr, mtu: u16) -> Vec<u8> {
    icmp_error_quoting(router, &udp(vip, client, &[0; 32]), vip, 3, 4, [0, 0, (mtu >> 8) as u8, mtu as u8])
}

fn icmp_error(router: IpAddr, vip: SocketAddr, client: SocketAddr, kind: u8, code: u8, rest: [u8; 4]) -> Vec<u8> {
    icmp_error_quoting(router, &tcp(vip, client, false, &[]), vip, kind, code, rest)
}

fn icmp_error_quoting(router: IpAddr, quoted_frame: &[u8], vip: SocketAddr, kind: u8, code: u8, rest: [u8; 4]) -> Vec<u8> {
    // The quoted packet: IP header + the first 8 bytes of TCP or UDP, as routers send.
    let ip_len = if vip.is_ipv4() { 20 } else { 40 };
    let quoted = &quoted_frame[ETH_LEN..ETH_LEN + ip_len + 8];
    let step = ip_step(router, vip.ip());
    let mut out = Vec::new();
    let written = if router.is_ipv4() {
        step.icmpv4_raw(kind, code, rest).write(&mut out, quoted)
    } else {
        step.icmpv6_raw(kind, code, rest).write(&mut out, quoted)
    };
    written.expect("writing an ICMP frame");
    out
}

/// An ARP request (who-has `target`).
pub fn arp_request(sender: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f.extend_from_slice(&CLIENT_MAC);
    f.extend_from_slice(&sender);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target);
    f
}

/// An ICMPv6 neighbour solicitation for `target`, as ND sends it.
pub fn neighbour_solicitation(src: IpAddr, target: std::net::Ipv6Addr) -> Vec<u8> {
    let t = target.octets();
    let solicited: std::net::Ipv6Addr = [0xff02, 0, 0, 0, 0, 1, 0xff00 | t[13] as u16, u16::from_be_bytes([t[14], t[15]])].into();
    let step = ip_step(src, IpAddr::V6(solicited)).icmpv6_raw(135, 0, [0; 4]);
    let mut body = t.to_vec();
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&CLIENT_MAC);
    let mut out = Vec::new();
    step.write(&mut out, &body).expect("writing an NS frame");
    out
}

/// Wraps an IP packet in an outer IPv4 or IPv6 header (IPIP, IP6IP6 or 4in6) in a frame.
pub fn tunnel(outer_src: IpAddr, outer_dst: IpAddr, inner: &[u8]) -> Vec<u8> {
    let inner_proto = if inner[0] >> 4 == 4 { 4 } else { 41 };
    let mut f = Vec::new();
    f.extend_from_slice(&LB_MAC);
    f.extend_from_slice(&CLIENT_MAC);
    match (outer_src, outer_dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&[0x08, 0x00]);
            let total = (20 + inner.len()) as u16;
            let mut h = vec![0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, TTL, inner_proto, 0, 0];
            h.extend_from_slice(&s.octets());
            h.extend_from_slice(&d.octets());
            let sum = ipv4_checksum(&h);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
            f.extend_from_slice(&h);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&(inner.len() as u16).to_be_bytes());
            f.extend_from_slice(&[inner_proto, TTL]);
            f.extend_from_slice(&s.octets());
            f.extend_from_slice(&d.octets());
        }
        _ => panic!("mixed outer families"),
    }
    f.extend_from_slice(inner);
    f
}

/// Wraps an IP packet in a GUE variant 1 tunnel in a frame, as the balancer writes one: the
/// outer header of [`tunnel`] with protocol UDP (IPv6: `flow_label` as its flow label), a
/// UDP header from `sport` to `dport` with checksum 0, then the packet.
pub fn gue_tunnel(outer_src: IpAddr, outer_dst: IpAddr, (sport, dport): (u16, u16), flow_label: u32, inner: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(8 + inner.len());
    payload.extend_from_slice(&sport.to_be_bytes());
    payload.extend_from_slice(&dport.to_be_bytes());
    payload.extend_from_slice(&((8 + inner.len()) as u16).to_be_bytes());
    payload.extend_from_slice(&[0, 0]);
    payload.extend_from_slice(inner);
    let mut f = tunnel(outer_src, outer_dst, &payload);
    if outer_src.is_ipv4() {
        f[ETH_LEN + 9] = 17;
        f[ETH_LEN + 10..ETH_LEN + 12].fill(0);
        let sum = ipv4_checksum(&f[ETH_LEN..ETH_LEN + 20]);
        f[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&sum.to_be_bytes());
    } else {
        f[ETH_LEN + 6] = 17;
        let vtc = (6u32 << 28) | (flow_label & 0x000f_ffff);
        f[ETH_LEN..ETH_LEN + 4].copy_from_slice(&vtc.to_be_bytes());
    }
    f
}

/// Inserts one 802.1Q tag (VLAN `id`) after the MAC addresses.
pub fn with_vlan(frame: &[u8], id: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&[0x81, 0x00]);
    f.extend_from_slice(&(id & 0x0fff).to_be_bytes());
    f.extend_from_slice(&frame[12..]);
    f
}

/// Adds `words` 32-bit words of NOP options to an untagged IPv4 frame's header.
pub fn with_ipv4_options(frame: &[u8], words: u8) -> Vec<u8> {
    assert!(words <= 10, "IHL is at most 15");
    let mut f = frame[..ETH_LEN + 20].to_vec();
    f.extend(std::iter::repeat_n(1u8, words as usize * 4));
    f.extend_from_slice(&frame[ETH_LEN + 20..]);
    f[ETH_LEN] = 0x40 | (5 + words);
    let total = u16::from_be_bytes([f[ETH_LEN + 2], f[ETH_LEN + 3]]) + words as u16 * 4;
    f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
    refresh_ipv4_checksum(&mut f);
    f
}

/// Marks an untagged IPv4 frame as a fragment (more-fragments flag and an offset in
/// 8-byte units).
pub fn as_ipv4_fragment(frame: &[u8], more: bool, offset_units: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    let bits = (if more { 0x2000 } else { 0 }) | (offset_units & 0x1fff);
    f[ETH_LEN + 6..ETH_LEN + 8].copy_from_slice(&bits.to_be_bytes());
    refresh_ipv4_checksum(&mut f);
    f
}

/// Inserts an IPv6 fragment header in front of an untagged IPv6 frame's payload.
pub fn as_ipv6_fragment(frame: &[u8]) -> Vec<u8> {
    let ip = ETH_LEN;
    let mut f = frame[..ip + 40].to_vec();
    let next = f[ip + 6];
    f[ip + 6] = 44;
    f.extend_from_slice(&[next, 0, 0, 1, 0, 0, 0, 42]);
    f.extend_from_slice(&frame[ip + 40..]);
    let payload = u16::from_be_bytes([f[ip + 4], f[ip + 5]]) + 8;
    f[ip + 4..ip + 6].copy_from_slice(&payload.to_be_bytes());
    f
}

/// Inserts 8-byte IPv6 extension headers of the `kinds` given (hop-by-hop 0, routing 43,
/// destination options 60, ...), in that order, in front of an untagged IPv6 frame's payload.
pub fn with_ipv6_extension_headers(frame: &[u8], kinds: &[u8]) -> Vec<u8> {
    let ip = ETH_LEN;
    let mut f = frame[..ip + 40].to_vec();
    let mut next = f[ip + 6];
    let mut headers = Vec::with_capacity(8 * kinds.len());
    // Built from the last header back, each naming the one after it; PadN fills the rest.
    for kind in kinds.iter().rev() {
        let mut header = vec![next, 0, 1, 4, 0, 0, 0, 0];
        header.extend_from_slice(&headers);
        headers = header;
        next = *kind;
    }
    f[ip + 6] = next;
    f.extend_from_slice(&headers);
    f.extend_from_slice(&frame[ip + 40..]);
    let payload = u16::from_be_bytes([f[ip + 4], f[ip + 5]]) + headers.len() as u16;
    f[ip + 4..ip + 6].copy_from_slice(&payload.to_be_bytes());
    f
}

/// A UDP datagram from `src` to `dst` carrying `payload`, fragmented as its sender's kernel
/// would: IPv4 fragments (no DF) or IPv6 fragment headers with identification `id` (IPv4:
/// its low 16 bits), each carrying at most `chunk` bytes of the UDP datagram (a multiple of
/// 8). The first fragment holds the UDP header; the frames are in order.
pub fn udp_fragments(src: SocketAddr, dst: SocketAddr, payload: &[u8], chunk: usize, id: u32) -> Vec<Vec<u8>> {
    assert!(chunk >= 8 && chunk.is_multiple_of(8), "fragments carry multiples of 8 bytes");
    let whole = udp(src, dst, payload);
    let header = if src.is_ipv4() { 20 } else { 40 };
    let (head, datagram) = whole.split_at(ETH_LEN + header);
    let count = datagram.len().div_ceil(chunk);
    datagram
        .chunks(chunk)
        .enumerate()
        .map(|(i, part)| {
            let (offset_units, more) = ((i * chunk / 8) as u16, i + 1 < count);
            let mut f = head.to_vec();
            if src.is_ipv4() {
                let ip = ETH_LEN;
                f[ip + 2..ip + 4].copy_from_slice(&((20 + part.len()) as u16).to_be_bytes());
                f[ip + 4..ip + 6].copy_from_slice(&(id as u16).to_be_bytes());
                f[ip + 6..ip + 8].copy_from_slice(&((if more { 0x2000 } else { 0 }) | offset_units).to_be_bytes());
                f.extend_from_slice(part);
                refresh_ipv4_checksum(&mut f);
            } else {
                let ip = ETH_LEN;
                f[ip + 4..ip + 6].copy_from_slice(&((8 + part.len()) as u16).to_be_bytes());
                f[ip + 6] = 44;
                f.extend_from_slice(&[17, 0]);
                f.extend_from_slice(&((offset_units << 3) | u16::from(more)).to_be_bytes());
                f.extend_from_slice(&id.to_be_bytes());
                f.extend_from_slice(part);
            }
            f
        })
        .collect()
}

/// Sets an untagged IPv4 frame's total length to the frame's length (after truncation).
pub fn fit_ipv4_length(frame: &mut [u8]) {
    let total = (frame.len() - ETH_LEN) as u16;
    frame[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
    refresh_ipv4_checksum(frame);
}

/// Sets an untagged IPv6 frame's payload length to what the frame holds.
pub fn fit_ipv6_length(frame: &mut [u8]) {
    let payload = (frame.len() - ETH_LEN - 40) as u16;
    frame[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&payload.to_be_bytes());
}

fn refresh_ipv4_checksum(frame: &mut [u8]) {
    let ihl = (frame[ETH_LEN] & 0x0f) as usize * 4;
    frame[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&[0, 0]);
    let sum = ipv4_checksum(&frame[ETH_LEN..ETH_LEN + ihl]);
    frame[ETH_LEN + 10..ETH_LEN + 12].copy_from_slice(&sum.to_be_bytes());
}

/// RFC 1071 checksum over a header with its checksum field zeroed (or, over a complete
/// header, 0 when it is valid).
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Checks a frame the balancer encapsulated: Ethernet to `dst_mac` (when given), a
/// well-formed outer IPv4 (IPIP, DF, TTL 64, valid checksum) or IPv6 header to `backend`,
/// and the inner packet byte-identical to the IP packet of `input` (after `l2_len` bytes).
/// Returns the outer source.
pub fn check_encap(out: &[u8], input: &[u8], l2_len: usize, backend: IpAddr, dst_mac: Option<[u8; 6]>) -> Result<IpAddr> {
    let inner = &input[l2_len..];
    let inner_len = inner_ip_len(inner);
    let inner_proto = if inner[0] >> 4 == 4 { 4 } else { 41 };
    if let Some(mac) = dst_mac {
        ensure!(out[0..6] == mac, "destination MAC {:02x?}, expected {mac:02x?}", &out[0..6]);
    }
    let outer_len = if backend.is_ipv4() { 20 } else { 40 };
    ensure!(out.len() >= ETH_LEN + outer_len + inner_len, "output of {} bytes is too short", out.len());
    let h = &out[ETH_LEN..ETH_LEN + outer_len];
    let src = match backend {
        IpAddr::V4(b) => {
            ensure!(out[12..14] == [0x08, 0x00], "ethertype {:02x?}", &out[12..14]);
            ensure!(h[0] == 0x45, "version/IHL {:#x}", h[0]);
            ensure!(u16::from_be_bytes([h[2], h[3]]) as usize == 20 + inner_len, "outer total length");
            ensure!(h[6] & 0x40 == 0x40, "DF not set");
            ensure!(h[8] == 64, "TTL {}", h[8]);
            ensure!(h[9] == inner_proto, "outer protocol {}", h[9]);
            ensure!(ipv4_checksum(h) == 0, "outer IPv4 checksum");
            ensure!(h[16..20] == b.octets(), "outer destination {:?}, expected {b}", &h[16..20]);
            IpAddr::from([h[12], h[13], h[14], h[15]])
        }
        IpAddr::V6(b) => {
            ensure!(out[12..14] == [0x86, 0xdd], "ethertype {:02x?}", &out[12..14]);
            ensure!(h[0] >> 4 == 6, "version {}", h[0] >> 4);
            ensure!(u16::from_be_bytes([h[4], h[5]]) as usize == inner_len, "payload length");
            ensure!(h[6] == inner_proto, "next header {}", h[6]);
            ensure!(h[7] == 64, "hop limit {}", h[7]);
            ensure!(h[24..40] == b.octets(), "outer destination {:?}, expected {b}", &h[24..40]);
            let mut a = [0u8; 16];
            a.copy_from_slice(&h[8..24]);
            IpAddr::from(a)
        }
    };
    ensure!(out[ETH_LEN + outer_len..ETH_LEN + outer_len + inner_len] == inner[..inner_len], "inner packet changed");
    Ok(src)
}

fn inner_ip_len(packet: &[u8]) -> usize {
    if packet[0] >> 4 == 4 {
        u16::from_be_bytes([packet[2], packet[3]]) as usize
    } else {
        40 + u16::from_be_bytes([packet[4], packet[5]]) as usize
    }
}

/// An IPv4 TCP reset from `src` to `dst` acknowledging `ack` (no link-layer header): what
/// a middlebox or a spoofer sends to end a connection attempt.
pub fn tcp_reset_packet(src: std::net::SocketAddrV4, dst: std::net::SocketAddrV4, ack: u32) -> Vec<u8> {
    let step = PacketBuilder::ipv4(src.ip().octets(), dst.ip().octets(), TTL).tcp(src.port(), dst.port(), 0, 0).rst().ack(ack);
    let mut out = Vec::with_capacity(step.size(0));
    step.write(&mut out, &[]).expect("writing a TCP reset");
    out
}

/// Sets or clears the DF bit of an untagged IPv4 frame (its checksum refreshed).
pub fn with_dont_fragment(frame: &[u8], df: bool) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[ETH_LEN + 6] = (f[ETH_LEN + 6] & !0x40) | if df { 0x40 } else { 0 };
    refresh_ipv4_checksum(&mut f);
    f
}

/// Checks the balancer's answer to `input`, a packet too big for its egress: the frame back
/// to its sender (MACs swapped, the L2 header's other `l2_len` bytes kept), an ICMP
/// "fragmentation needed" (IPv4) or ICMPv6 "packet too big" advising `mtu`, from the VIP
/// the packet was sent to, quoting the packet's first 548 (IPv4: a 576-byte answer) or
/// 1232 bytes (IPv6: 1280), checksums valid (computed by etherparse), and no longer than
/// `input`.
pub fn check_packet_too_big(out: &[u8], input: &[u8], l2_len: usize, mtu: u32) -> Result<()> {
    use etherparse::{Icmpv4Header, Icmpv4Type, Icmpv6Header, Icmpv6Type, icmpv4::DestUnreachableHeader};
    ensure!(out.len() <= input.len(), "answer of {} bytes to a frame of {}", out.len(), input.len());
    ensure!(out[0..6] == input[6..12] && out[6..12] == input[0..6], "MACs not swapped: {:02x?}", &out[0..12]);
    ensure!(out[12..l2_len] == input[12..l2_len], "L2 header changed: {:02x?}", &out[12..l2_len]);
    let (ip, sent) = (&out[l2_len..], &input[l2_len..]);
    if sent[0] >> 4 == 4 {
        ensure!(ip.len() == 576, "IPv4 answer of {} bytes, expected 576", ip.len());
        ensure!(ip[0] == 0x45, "version/IHL {:#x}", ip[0]);
        ensure!(u16::from_be_bytes([ip[2], ip[3]]) == 576, "total length");
        ensure!(ip[6] & 0x3f == 0 && ip[7] == 0, "answer is a fragment");
        ensure!(ip[8] == 64 && ip[9] == 1, "TTL {} / protocol {}", ip[8], ip[9]);
        ensure!(ipv4_checksum(&ip[..20]) == 0, "IPv4 checksum");
        ensure!(ip[12..16] == sent[16..20], "source {:?} is not the VIP {:?}", &ip[12..16], &sent[16..20]);
        ensure!(ip[16..20] == sent[12..16], "destination {:?} is not the client {:?}", &ip[16..20], &sent[12..16]);
        let icmp = &ip[20..];
        ensure!(icmp[0] == 3 && icmp[1] == 4, "ICMP type {} code {}", icmp[0], icmp[1]);
        ensure!(icmp[4..6] == [0, 0], "unused bytes {:02x?}", &icmp[4..6]);
        ensure!(u16::from_be_bytes([icmp[6], icmp[7]]) as u32 == mtu, "next-hop MTU {}", u16::from_be_bytes([icmp[6], icmp[7]]));
        ensure!(icmp[8..] == sent[..548], "quoted packet differs");
        let kind = Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: mtu as u16 });
        let want = Icmpv4Header::with_checksum(kind, &icmp[8..]).checksum;
        ensure!(
            u16::from_be_bytes([icmp[2], icmp[3]]) == want,
            "ICMP checksum {:#x}, expected {want:#x}",
            u16::from_be_bytes([icmp[2], icmp[3]])
        );
    } else {
        ensure!(ip.len() == 1280, "IPv6 answer of {} bytes, expected 1280", ip.len());
        ensure!(ip[0] >> 4 == 6, "version {}", ip[0] >> 4);
        ensure!(u16::from_be_bytes([ip[4], ip[5]]) == 1240, "payload length");
        ensure!(ip[6] == 58 && ip[7] == 64, "next header {} / hop limit {}", ip[6], ip[7]);
        ensure!(ip[8..24] == sent[24..40], "source is not the VIP");
        ensure!(ip[24..40] == sent[8..24], "destination is not the client");
        let icmp = &ip[40..];
        ensure!(icmp[0] == 2 && icmp[1] == 0, "ICMPv6 type {} code {}", icmp[0], icmp[1]);
        ensure!(
            u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]) == mtu,
            "MTU {}",
            u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]])
        );
        ensure!(icmp[8..] == sent[..1232], "quoted packet differs");
        let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
        src.copy_from_slice(&ip[8..24]);
        dst.copy_from_slice(&ip[24..40]);
        let want = Icmpv6Header::with_checksum(Icmpv6Type::PacketTooBig { mtu }, src, dst, &icmp[8..])?.checksum;
        ensure!(
            u16::from_be_bytes([icmp[2], icmp[3]]) == want,
            "ICMPv6 checksum {:#x}, expected {want:#x}",
            u16::from_be_bytes([icmp[2], icmp[3]])
        );
    }
    Ok(())
}

/// An ICMP (IPv4) or ICMPv6 (IPv6) echo request from `src` to `dst` with `payload`, as
/// `ping` sends it.
pub fn echo_request(src: IpAddr, dst: IpAddr, id: u16, seq: u16, payload: &[u8]) -> Vec<u8> {
    let step = ip_step(src, dst);
    let mut out = Vec::new();
    let written = if src.is_ipv4() {
        step.icmpv4_echo_request(id, seq).write(&mut out, payload)
    } else {
        step.icmpv6_echo_request(id, seq).write(&mut out, payload)
    };
    written.expect("writing an echo request");
    out
}

/// Checks the balancer's answer to `input`, an echo request: the same frame turned around
/// (MACs swapped, the L2 header's other `l2_len` bytes kept, the same length), addresses
/// swapped, TTL or hop limit 64, the IPv4 header's checksum valid, an echo reply of the same
/// identifier, sequence and payload whose checksum is the one etherparse computes, and
/// nothing else of the IP header changed.
pub fn check_echo_reply(out: &[u8], input: &[u8], l2_len: usize) -> Result<()> {
    use etherparse::{IcmpEchoHeader, Icmpv4Header, Icmpv4Type, Icmpv6Header, Icmpv6Type};
    ensure!(out.len() == input.len(), "answer of {} bytes to a frame of {}", out.len(), input.len());
    ensure!(out[0..6] == input[6..12] && out[6..12] == input[0..6], "MACs not swapped: {:02x?}", &out[0..12]);
    ensure!(out[12..l2_len] == input[12..l2_len], "L2 header changed: {:02x?}", &out[12..l2_len]);
    let (ip, sent) = (&out[l2_len..], &input[l2_len..]);
    let echo = |icmp: &[u8]| IcmpEchoHeader { id: u16::from_be_bytes([icmp[4], icmp[5]]), seq: u16::from_be_bytes([icmp[6], icmp[7]]) };
    let l4 = if sent[0] >> 4 == 4 {
        ensure!(ip[..8] == sent[..8], "IPv4 header's first words changed");
        ensure!(ip[8] == 64 && ip[9] == 1, "TTL {} / protocol {}", ip[8], ip[9]);
        ensure!(ipv4_checksum(&ip[..20]) == 0, "IPv4 checksum");
        ensure!(ip[12..16] == sent[16..20] && ip[16..20] == sent[12..16], "addresses not swapped");
        let icmp = &ip[20..u16::from_be_bytes([ip[2], ip[3]]) as usize];
        ensure!(icmp[0] == 0 && icmp[1] == 0, "ICMP type {} code {}", icmp[0], icmp[1]);
        let want = Icmpv4Header::with_checksum(Icmpv4Type::EchoReply(echo(icmp)), &icmp[8..]).checksum;
        ensure!(
            u16::from_be_bytes([icmp[2], icmp[3]]) == want,
            "ICMP checksum {:#x}, expected {want:#x}",
            u16::from_be_bytes([icmp[2], icmp[3]])
        );
        20
    } else {
        ensure!(ip[..7] == sent[..7], "IPv6 header's first words changed");
        ensure!(ip[7] == 64, "hop limit {}", ip[7]);
        ensure!(ip[8..24] == sent[24..40] && ip[24..40] == sent[8..24], "addresses not swapped");
        let icmp = &ip[40..40 + u16::from_be_bytes([ip[4], ip[5]]) as usize];
        ensure!(icmp[0] == 129 && icmp[1] == 0, "ICMPv6 type {} code {}", icmp[0], icmp[1]);
        let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
        src.copy_from_slice(&ip[8..24]);
        dst.copy_from_slice(&ip[24..40]);
        let want = Icmpv6Header::with_checksum(Icmpv6Type::EchoReply(echo(icmp)), src, dst, &icmp[8..])?.checksum;
        ensure!(
            u16::from_be_bytes([icmp[2], icmp[3]]) == want,
            "ICMPv6 checksum {:#x}, expected {want:#x}",
            u16::from_be_bytes([icmp[2], icmp[3]])
        );
        40
    };
    ensure!(ip[l4 + 4..] == sent[l4 + 4..], "identifier, sequence or payload changed");
    Ok(())
}
