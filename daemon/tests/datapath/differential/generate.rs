//! Random cases: a declared state (VIPs of both families on a few addresses, backends,
//! weights, drains, encapsulations, affinity, limits, rules) and frames of every kind the
//! parser knows aimed mostly at it, from a small pool of clients so that flows recur, with
//! fields mutated, lengths broken and frames cut short.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use spillway_common::quic_lb::{MAX_CID_LEN, encode};
use spillway_harness::{frames, packet_lab, rng::Rng};
use spillway_model::{Cidr, DesiredState, Encap, HashMode, QuicConfig, RateSpec, RuleAction, RuleConfig, RuleMatch, Vip, server_id_of};

use super::case::{Case, Egress, Knobs, Step};

const RING_SIZES: [u32; 4] = [13, 31, 257, 4099];
const PORTS: [u16; 4] = [80, 443, 53, 8080];
const SOURCE_PORTS: [u16; 3] = [1000, 1001, 40000];
/// Packets too big from one source at once: past its burst of answers.
const PTB_BURST: usize = spillway_common::limits::PTB_SOURCE_BURST as usize + 4;
/// First fragments from one source at once: past its burst of records, though a quarter of
/// them are mutated.
const FRAGMENT_FLOOD: u32 = spillway_common::limits::FRAGMENT_SOURCE_BURST * 3 / 2;

fn vip_addr(rng: &mut Rng, v6: bool) -> IpAddr {
    let n = rng.range(1, 3) as u8;
    if v6 { Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, n.into()).into() } else { Ipv4Addr::new(10, 200, 1, n).into() }
}

fn client_addr(rng: &mut Rng, v6: bool) -> IpAddr {
    let (net, host) = (rng.below(3) as u8, rng.range(1, 4) as u8);
    if v6 { Ipv6Addr::new(0x2001, 0xdb8, net.into(), 0, 0, 0, 0, host.into()).into() } else { Ipv4Addr::new(192, 168, net, host).into() }
}

/// Mostly one the packet lab resolves on its ingress, else one it has no neighbour for, one
/// behind its other interface, or one it has no route to.
fn backend_addr(rng: &mut Rng, v6: bool) -> IpAddr {
    let n = rng.range(101, 108) as u8;
    match (rng.below(20), v6) {
        (0, false) => packet_lab::UNRESOLVED4.into(),
        (0, true) => packet_lab::UNRESOLVED6.into(),
        (1, false) => packet_lab::BEHIND_EGRESS4.into(),
        (1, true) => packet_lab::BEHIND_EGRESS6.into(),
        (2, false) => Ipv4Addr::new(10, 9, 0, n).into(),
        (2, true) => Ipv6Addr::new(0xfd09, 0, 0, 0, 0, 0, 0, n.into()).into(),
        (_, false) => packet_lab::backend4(n).into(),
        (_, true) => packet_lab::backend6(n).into(),
    }
}

fn rate(rng: &mut Rng) -> RateSpec {
    RateSpec::new(rng.range(1, 4) as u32, Some(rng.below(4) as u32))
}

pub fn case(rng: &mut Rng) -> Case {
    let state = desired(rng);
    let knobs = Knobs {
        hostmask_v4: if rng.chance(30) { u32::from_ne_bytes([0, 0, 0, 0xff]) } else { 0 },
        hostmask_v6: if rng.chance(30) { u32::from_ne_bytes([0, 0, 0xff, 0xff]) } else { 0 },
        gue_port: rng.pick(&[6080, 6635, 1]),
        egress: rng.pick(&[Egress::Ingress, Egress::TxPort, Egress::Kernel, Egress::Routes, Egress::Routes]),
        table_seed: rng.next_u64() as u32 | 1,
        tcp_idle_timeout_s: rng.range(1, 900) as u32,
        udp_idle_timeout_s: rng.range(1, 120) as u32,
        echo_per_source: if rng.chance(10) { 0 } else { rng.range(1, 5) as u32 },
        echo_total: if rng.chance(10) { 0 } else { rng.range(2, 20) as u32 },
    };
    let mut steps = Vec::new();
    let frames = rng.range(20, 200);
    while (steps.len() as u64) < frames {
        let advance_ms = if rng.chance(10) { rng.range(1, 3000) } else { 0 };
        // Now and then the backends change mid-case, the table's entries staying.
        let declare = rng.chance(2).then(|| changed(rng, &state));
        for (i, frame) in frames_of(rng, &state).into_iter().enumerate() {
            let first = i == 0;
            steps.push(Step { advance_ms: if first { advance_ms } else { 0 }, declare: if first { declare.clone() } else { None }, frame });
        }
    }
    let before = rng.chance(30).then(|| changed(rng, &state));
    Case { found: String::new(), before, state, knobs, steps }
}

/// `state` with some VIPs' backends changed: one removed, added, drained or reweighted.
fn changed(rng: &mut Rng, state: &DesiredState) -> DesiredState {
    let mut other = state.clone();
    for (vip, config) in &state.vips {
        if rng.chance(50) {
            continue;
        }
        let backends: Vec<IpAddr> = config.backends.keys().copied().collect();
        let some = (!backends.is_empty()).then(|| backends[rng.index(backends.len())]);
        match (rng.below(4), some) {
            (0, Some(b)) => other.remove_backend(vip, b).unwrap(),
            (1, Some(b)) => other.drain_backend(vip, b, None).unwrap(),
            (2, Some(b)) => other.set_weight(vip, b, rng.range(1, 300) as u32).unwrap(),
            _ => {
                let _ = other.add_backend(vip, backend_addr(rng, vip.addr.is_ipv6()), rng.range(1, 300) as u32);
            }
        }
    }
    other
}

fn desired(rng: &mut Rng) -> DesiredState {
    let mut state = DesiredState::default();
    for _ in 0..rng.range(1, 5) {
        let v6 = rng.chance(50);
        let port = if rng.chance(20) { 0 } else { rng.pick(&PORTS) };
        let proto = if rng.chance(50) { "tcp" } else { "udp" };
        let addr = SocketAddr::new(vip_addr(rng, v6), port);
        let vip: Vip = format!("{addr}/{proto}").parse().unwrap();
        if state.add_vip(vip, rng.pick(&RING_SIZES)).is_err() {
            continue;
        }
        for _ in 0..rng.below(5) {
            let v6_backend = rng.chance(if v6 { 80 } else { 30 });
            let backend = backend_addr(rng, v6_backend);
            if state.add_backend(&vip, backend, rng.range(1, 300) as u32).is_ok() && rng.chance(10) {
                state.drain_backend(&vip, backend, None).unwrap();
            }
        }
        if rng.chance(30) {
            state.set_encap(&vip, Encap::Gue).unwrap();
        }
        if rng.chance(20) {
            let prefix = if v6 { rng.pick(&[48, 64, 128]) } else { rng.pick(&[16, 24, 32]) };
            state.set_hash(&vip, HashMode::Source, Some(prefix)).unwrap();
        }
        if proto == "udp" && rng.chance(40) {
            let quic = QuicConfig {
                config_id: rng.below(7) as u8,
                server_id_len: rng.range(1, 4) as u8,
                nonce_len: rng.range(4, 8) as u8,
                self_len: rng.chance(50),
                // Plaintext: encrypted ids are decoded with the kernel's crypto, not modelled.
                key_file: None,
            };
            // Refused when two backends' addresses end alike: then a plain UDP VIP.
            let _ = state.set_quic(&vip, Some(quic));
        }
        limits(rng, &mut state, Some(&vip));
    }
    if rng.chance(20) {
        limits(rng, &mut state, None);
    }
    let vips: Vec<Vip> = state.vips.keys().copied().collect();
    for _ in 0..rng.below(4) {
        let v6 = rng.chance(50);
        let len = if v6 { rng.pick(&[32, 48, 128]) } else { rng.pick(&[16, 24, 32]) };
        let rule = RuleMatch {
            cidr: Cidr::new(Cidr::mask(client_addr(rng, v6), len), len).unwrap(),
            vip: if rng.chance(50) { Some(vips[rng.index(vips.len())]) } else { None },
        };
        let action = match rng.below(3) {
            0 => RuleAction::Block,
            1 => RuleAction::Exempt,
            _ => RuleAction::Limit(rate(rng)),
        };
        let _ = state.set_rule(rule, RuleConfig { action, observe: rng.chance(20) });
    }
    state
}

fn limits(rng: &mut Rng, state: &mut DesiredState, vip: Option<&Vip>) {
    if rng.chance(30) {
        let (v4, v6) = (rng.pick(&[24, 32]), rng.pick(&[48, 64, 128]));
        state.set_per_source(vip, rate(rng), Some(v4), Some(v6), rng.chance(20)).unwrap();
    }
    if rng.chance(30) {
        state.set_budget(vip, rate(rng), rng.chance(20)).unwrap();
    }
}

/// A destination: mostly a VIP's (its port, or any for an any-port VIP, its protocol most
/// of the time), else an address no VIP has.
fn target(rng: &mut Rng, state: &DesiredState) -> (SocketAddr, bool) {
    let vips: Vec<&Vip> = state.vips.keys().collect();
    if rng.chance(85) && !vips.is_empty() {
        let vip = vips[rng.index(vips.len())];
        let port = if vip.port == 0 || rng.chance(5) { rng.pick(&PORTS) } else { vip.port };
        let tcp = vip.proto == spillway_model::Proto::Tcp;
        return (SocketAddr::new(vip.addr, port), if rng.chance(5) { !tcp } else { tcp });
    }
    let v6 = rng.chance(50);
    let other = if v6 { Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 9).into() } else { Ipv4Addr::new(10, 200, 1, 9).into() };
    (SocketAddr::new(if rng.chance(50) { other } else { vip_addr(rng, v6) }, rng.pick(&PORTS)), rng.chance(50))
}

/// One frame, or a fragmented datagram's frames in order.
fn frames_of(rng: &mut Rng, state: &DesiredState) -> Vec<Vec<u8>> {
    let (dst, tcp) = target(rng, state);
    let client = SocketAddr::new(client_addr(rng, dst.is_ipv6()), rng.pick(&SOURCE_PORTS));
    let router: IpAddr = if dst.is_ipv6() { "2001:db8:ffff::1".parse().unwrap() } else { "192.168.255.1".parse().unwrap() };
    // Now and then a packet too big for the egress once encapsulated, sometimes again and
    // again (past the answers' burst).
    let big = rng.chance(4);
    let payload = vec![0x5a; if big { rng.range(1380, 1440) } else { rng.below(40) } as usize];
    let mut list = match rng.below(100) {
        0..30 if tcp => vec![frames::tcp(client, dst, true, &payload)],
        0..55 if tcp => {
            let mut f = frames::tcp(client, dst, false, &payload);
            if rng.chance(20) {
                // Other flags: SYN+ACK, RST, FIN, none.
                let flags = rng.pick(&[0x12, 0x04, 0x11, 0x00, 0x03]);
                let at = l4(&f) + 13;
                f[at] = flags;
            }
            vec![f]
        }
        0..45 => vec![frames::udp(client, dst, &quic_payload(rng, state, dst).unwrap_or(payload))],
        45..55 => vec![frames::udp(client, dst, &payload)],
        55..67 if dst.is_ipv6() => vec![frames::icmp6_packet_too_big(router, dst, client, 1280)],
        55..67 if tcp => vec![frames::icmp_frag_needed(router, dst, client, 1400)],
        55..67 => vec![frames::icmp_frag_needed_udp(router, dst, client, 1400)],
        67..72 => other_ip(rng, client, dst),
        // A source sending more first fragments than its records' burst (`drop_fragment_limited`).
        72 if rng.chance(10) => (0..FRAGMENT_FLOOD).map(|id| frames::udp_fragments(client, dst, &[0x33; 24], 8, id).remove(0)).collect(),
        72..85 => {
            let big = vec![0x33; rng.range(16, 120) as usize];
            let mut list = frames::udp_fragments(client, dst, &big, 8 * rng.range(1, 6) as usize, rng.below(4) as u32);
            // Lost, repeated or reordered fragments.
            if rng.chance(20) {
                list.reverse();
            }
            if rng.chance(20) && list.len() > 1 {
                list.remove(0);
            }
            list
        }
        85..88 if dst.is_ipv4() => vec![frames::as_ipv4_fragment(&frames::tcp(client, dst, true, &[]), true, 0)],
        85..88 => vec![frames::as_ipv6_fragment(&frames::tcp(client, dst, true, &[]))],
        88..92 => vec![frames::arp_request([192, 168, 0, 1], [10, 200, 1, 1])],
        _ => {
            let inner = frames::tcp(client, dst, true, &[]);
            let outer_dst = dst.ip();
            let outer_src = client.ip();
            vec![frames::tunnel(outer_src, outer_dst, &inner[frames::ETH_LEN..])]
        }
    };
    if big && list.len() == 1 && rng.chance(30) {
        list = vec![list[0].clone(); PTB_BURST];
    }
    for f in &mut list {
        if f[12..14] == [0x08, 0x00] && rng.chance(50) {
            *f = frames::with_dont_fragment(f, rng.chance(50));
        }
        decorate(rng, f);
        if rng.chance(25) {
            mutate(rng, f);
        }
    }
    list
}

/// For a QUIC VIP at `dst`: a QUIC packet, mostly a short header whose connection id names
/// one of its backends (or a server id nobody has), else a long header.
fn quic_payload(rng: &mut Rng, state: &DesiredState, dst: SocketAddr) -> Option<Vec<u8>> {
    let (_, config) = state.vips.iter().find(|(v, c)| v.addr == dst.ip() && (v.port == dst.port() || v.port == 0) && c.quic.is_some())?;
    let quic = config.quic.clone()?;
    let cfg = quic.to_lb();
    let backends: Vec<IpAddr> = config.backends.keys().copied().collect();
    let named = if !backends.is_empty() && rng.chance(80) { backends[rng.index(backends.len())] } else { backend_addr(rng, dst.is_ipv6()) };
    let nonce: Vec<u8> = (0..quic.nonce_len).map(|_| rng.next_u64() as u8).collect();
    let mut cid = [0u8; MAX_CID_LEN];
    encode(&cfg, &server_id_of(named, quic.server_id_len), &nonce, rng.next_u64() as u8, &mut cid).ok()?;
    // A short header (its fixed bit set), or now and then a long one.
    let first = if rng.chance(85) { 0x40 } else { 0xc0 };
    let mut payload = vec![first];
    payload.extend_from_slice(&cid);
    payload.extend((0..rng.below(24)).map(|_| rng.next_u64() as u8));
    Some(payload)
}

/// Echo requests to `dst` (a few from one source at once, now and then from an address no
/// host may have), other ICMP, or another IP protocol (GRE).
fn other_ip(rng: &mut Rng, client: SocketAddr, dst: SocketAddr) -> Vec<Vec<u8>> {
    let from = if rng.chance(10) {
        let odd: &[&str] =
            if dst.is_ipv4() { &["0.0.0.0", "127.0.0.1", "224.0.0.1", "255.255.255.255"] } else { &["::", "::1", "ff02::1"] };
        odd[rng.index(odd.len())].parse().unwrap()
    } else {
        client.ip()
    };
    match rng.below(4) {
        0 | 1 => (0..rng.range(1, 8)).map(|seq| frames::echo_request(from, dst.ip(), 7, seq as u16, &[0xa5; 32])).collect(),
        2 => {
            // Not a request: a reply, or a request with another code.
            let mut f = frames::echo_request(from, dst.ip(), 7, 1, &[0xa5; 8]);
            let at = l4(&f);
            if rng.chance(50) {
                f[at] = if dst.is_ipv4() { 0 } else { 129 };
            } else {
                f[at + 1] = 1;
            }
            vec![f]
        }
        _ => {
            let mut f = frames::udp(client, dst, b"other");
            let proto_at = if dst.is_ipv4() { frames::ETH_LEN + 9 } else { frames::ETH_LEN + 6 };
            f[proto_at] = 47;
            if dst.is_ipv4() {
                refresh_v4(&mut f, frames::ETH_LEN);
            }
            vec![f]
        }
    }
}

/// Where the transport header of an untagged frame without options starts.
fn l4(f: &[u8]) -> usize {
    frames::ETH_LEN + if f[12] == 0x08 { 20 } else { 40 }
}

fn refresh_v4(f: &mut [u8], l3: usize) {
    let ihl = (f[l3] & 0x0f) as usize * 4;
    if f.len() < l3 + ihl {
        return;
    }
    f[l3 + 10..l3 + 12].fill(0);
    let sum = frames::ipv4_checksum(&f[l3..l3 + ihl]);
    f[l3 + 10..l3 + 12].copy_from_slice(&sum.to_be_bytes());
}

/// IPv4 options, IPv6 extension headers, a VLAN tag.
fn decorate(rng: &mut Rng, f: &mut Vec<u8>) {
    let v4 = f[12..14] == [0x08, 0x00];
    let v6 = f[12..14] == [0x86, 0xdd];
    if v4 && rng.chance(10) {
        *f = frames::with_ipv4_options(f, rng.range(1, 10) as u8);
    }
    if v6 && rng.chance(15) {
        let kinds: Vec<u8> = (0..rng.range(1, 5)).map(|_| rng.pick(&[0, 43, 60, 60])).collect();
        *f = frames::with_ipv6_extension_headers(f, &kinds);
    }
    if rng.chance(10) {
        *f = frames::with_vlan(f, rng.below(4096) as u16);
    }
}

/// Changes bytes of the headers, a length field, or the frame's length.
fn mutate(rng: &mut Rng, f: &mut Vec<u8>) {
    match rng.below(4) {
        0 => {
            for _ in 0..rng.range(1, 3) {
                let i = rng.index(f.len().min(90));
                f[i] = rng.next_u64() as u8;
            }
        }
        1 => {
            // An IP length field (IPv4 total length or IPv6 payload length, untagged).
            let at = if f[12..14] == [0x08, 0x00] { frames::ETH_LEN + 2 } else { frames::ETH_LEN + 4 };
            if f.len() >= at + 2 {
                let len = rng.below(f.len() as u64 + 16) as u16;
                f[at..at + 2].copy_from_slice(&len.to_be_bytes());
            }
        }
        2 => f.truncate(frames::ETH_LEN + rng.index(f.len() - frames::ETH_LEN + 1)),
        _ => f.extend((0..rng.range(1, 64)).map(|_| rng.next_u64() as u8)),
    }
}
