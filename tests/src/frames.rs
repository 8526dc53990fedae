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
