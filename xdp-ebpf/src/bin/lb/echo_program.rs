//! The echo program (`echo.rs`): the balancer tail-calls it for a frame of another protocol
//! than TCP or UDP to a VIP address that answers echo requests; it answers a plain echo
//! request within the rates, in place, and drops everything else.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_TX},
    programs::XdpContext,
};
use spillway_common::{
    limits::ECHO_SOURCE_PREFIX_V6,
    types::{EchoConfig, FAMILY_V4, FAMILY_V6, PROTO_ICMP, PROTO_ICMPV6, Reason},
};
use xdp_ebpf::{
    csum,
    headers::{
        ANSWER_TTL, ETH_LEN, ETH_P_8021Q, ETH_P_IPV4, ETH_P_IPV6, EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, ICMP_LEN, ICMPV6_ECHO_REPLY,
        ICMPV6_ECHO_REQUEST, IPV4_LEN, IPV4_MF_OFFSET_MASK, IPV6_LEN, IcmpHdr, Ipv4Hdr, Ipv6Hdr, VLAN_LEN, VlanHdr,
    },
    packet::{at, at_mut, len},
};

use crate::{
    clock,
    maps::{CONFIG, ECHO_CONFIG, ECHO_SOURCES, ECHO_TOTAL},
    source_limit,
    verdict::Verdict,
};

/// Answers the frame or drops it.
#[inline(always)]
pub fn send(ctx: &XdpContext) -> Verdict {
    let bytes = len(ctx) as u32;
    let (action, reason) = answer(ctx);
    // No VIP's traffic: the address may be several VIPs'.
    Verdict { bytes, ..Verdict::ended(action, reason) }
}

#[inline(always)]
fn answer(ctx: &XdpContext) -> (u32, Reason) {
    let unserved = (XDP_DROP, Reason::DropNoService);
    let Some(request) = request(ctx) else {
        return unserved;
    };
    // Slot 0 of an array always exists; the checks are for the verifier.
    let (Some(limits), Some(cfg)) = (ECHO_CONFIG.get(0), CONFIG.get(0)) else {
        return unserved;
    };
    if !answers(limits) || !source_limit::is_host(&request.src, request.family) {
        return unserved;
    }
    let now = clock::now_ns(cfg);
    let source = (&request.src, request.family, ECHO_SOURCE_PREFIX_V6);
    if !source_limit::admit_answer(&ECHO_SOURCES, &ECHO_TOTAL, source, (&limits.per_source, &limits.total), now) {
        return (XDP_DROP, Reason::DropEchoLimited);
    }
    // Checked by `request`; a failure here leaves the frame as it came, to be dropped.
    if turn_around(ctx, &request).is_err() {
        return unserved;
    }
    (XDP_TX, Reason::TxEchoReply)
}

/// A zero rate answers nothing: the operator's choice, or a config `lbd` has not written.
#[inline(always)]
fn answers(limits: &EchoConfig) -> bool {
    limits.per_source.per_s != 0 && limits.total.per_s != 0
}

/// A plain echo request: where its IP header is, its family and source.
struct Request {
    l3: usize,
    family: u8,
    src: [u32; 4],
}

/// The frame as a plain echo request: one optional VLAN tag; IPv4 without options, not a
/// fragment, or IPv6 with ICMPv6 as its first next header; the whole ICMP header inside the
/// IP packet, the IP packet inside the frame; type echo request, code 0.
#[inline(always)]
fn request(ctx: &XdpContext) -> Option<Request> {
    let eth = at::<EthHdr>(ctx, 0)?;
    // SAFETY (all reads): `at` checked each header is inside the frame.
    let mut ether_type = unsafe { (*eth).proto };
    let mut l3 = ETH_LEN;
    if ether_type == ETH_P_8021Q {
        ether_type = unsafe { (*at::<VlanHdr>(ctx, ETH_LEN)?).proto };
        l3 += VLAN_LEN;
    }
    if ether_type == ETH_P_IPV4 {
        let ip = unsafe { &*at::<Ipv4Hdr>(ctx, l3)? };
        let ip_len = u16::from_be(ip.tot_len) as usize;
        let plain = ip.ver_ihl == 0x45 && u16::from_be(ip.frag_off) & IPV4_MF_OFFSET_MASK == 0 && ip.proto == PROTO_ICMP;
        if !plain || ip_len < IPV4_LEN + ICMP_LEN || l3 + ip_len > len(ctx) {
            return None;
        }
        let icmp = unsafe { &*at::<IcmpHdr>(ctx, l3 + IPV4_LEN)? };
        (icmp.kind == ICMP_ECHO_REQUEST && icmp.code == 0).then_some(Request { l3, family: FAMILY_V4, src: [ip.src, 0, 0, 0] })
    } else if ether_type == ETH_P_IPV6 {
        let ip = unsafe { &*at::<Ipv6Hdr>(ctx, l3)? };
        let payload = u16::from_be(ip.payload_len) as usize;
        let plain = u32::from_be(ip.vtc_flow) >> 28 == 6 && ip.next_hdr == PROTO_ICMPV6;
        if !plain || payload < ICMP_LEN || l3 + IPV6_LEN + payload > len(ctx) {
            return None;
        }
        let icmp = unsafe { &*at::<IcmpHdr>(ctx, l3 + IPV6_LEN)? };
        (icmp.kind == ICMPV6_ECHO_REQUEST && icmp.code == 0).then_some(Request { l3, family: FAMILY_V6, src: ip.src })
    } else {
        None
    }
}

/// Turns the request into its reply in place: MACs and addresses swapped, the type a reply,
/// a fresh TTL or hop limit, the checksums updated for the words that changed (swapping
/// addresses changes no sum, ICMPv6's pseudo-header's included). Same length, same payload.
#[inline(always)]
fn turn_around(ctx: &XdpContext, request: &Request) -> Result<(), ()> {
    let eth = at_mut::<EthHdr>(ctx, 0).ok_or(())?;
    // SAFETY (all writes): `at_mut` checked each header is inside the frame.
    unsafe { ((*eth).src, (*eth).dst) = ((*eth).dst, (*eth).src) };
    let (l4, reply) = if request.family == FAMILY_V4 {
        let ip = unsafe { &mut *at_mut::<Ipv4Hdr>(ctx, request.l3).ok_or(())? };
        (ip.src, ip.dst) = (ip.dst, ip.src);
        let old = u16::from_ne_bytes([ip.ttl, ip.proto]);
        ip.ttl = ANSWER_TTL;
        ip.check = csum::after_word_change(ip.check, old, u16::from_ne_bytes([ip.ttl, ip.proto]));
        (request.l3 + IPV4_LEN, ICMP_ECHO_REPLY)
    } else {
        let ip = unsafe { &mut *at_mut::<Ipv6Hdr>(ctx, request.l3).ok_or(())? };
        (ip.src, ip.dst) = (ip.dst, ip.src);
        ip.hop_limit = ANSWER_TTL;
        (request.l3 + IPV6_LEN, ICMPV6_ECHO_REPLY)
    };
    let icmp = unsafe { &mut *at_mut::<IcmpHdr>(ctx, l4).ok_or(())? };
    let old = u16::from_ne_bytes([icmp.kind, icmp.code]);
    icmp.kind = reply;
    icmp.check = csum::after_word_change(icmp.check, old, u16::from_ne_bytes([icmp.kind, icmp.code]));
    Ok(())
}
