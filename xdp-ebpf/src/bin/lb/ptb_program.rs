//! The "packet too big" program (`ptb.rs`): the balancer tail-calls it with the MTU to
//! advise; it decides whether the packet is answered, and answers it.

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_TX},
    programs::XdpContext,
};
use spillway_common::{
    limits::{PTB_GLOBAL_BURST, PTB_GLOBAL_PER_S, PTB_SOURCE_BURST, PTB_SOURCE_PER_S, PTB_SOURCE_PREFIX_V6},
    types::{FAMILY_V4, FlowKey, LbConfig, Rate, Reason},
};
use xdp_ebpf::{
    headers::{ETH_LEN, IPV4_DF, Ipv4Hdr, VLAN_LEN},
    icmp, packet,
    parse::{Layout, Parsed, parse},
};

use crate::{
    clock,
    maps::{CONFIG, PTB_GLOBAL, PTB_HANDOVER, PTB_SOURCES},
    source_limit,
    verdict::Verdict,
};

const PER_SOURCE: Rate = Rate::new(PTB_SOURCE_PER_S, PTB_SOURCE_BURST);
const GLOBAL: Rate = Rate::new(PTB_GLOBAL_PER_S, PTB_GLOBAL_BURST);

/// Re-parses the packet (the balancer has) and answers it, or drops it unanswered.
#[inline(always)]
pub fn send(ctx: &XdpContext) -> Verdict {
    let bytes = packet::len(ctx) as u32;
    // Slot 0 of an array always exists; the checks are for the verifier.
    let (Some(cfg), Some(handover)) = (CONFIG.get(0), PTB_HANDOVER.get(0)) else {
        return Verdict::ended(XDP_DROP, Reason::DropOversize);
    };
    let handover = *handover;
    let (action, reason) = answer(ctx, cfg, handover.mtu);
    Verdict { vip: Some(handover.vip_id), bytes, ..Verdict::ended(action, reason) }
}

#[inline(always)]
fn answer(ctx: &XdpContext, cfg: &LbConfig, mtu: u32) -> (u32, Reason) {
    let unanswered = (XDP_DROP, Reason::DropOversize);
    let Parsed::Flow { key, layout, icmp_error: false, .. } = parse(ctx) else {
        return unanswered;
    };
    if !answerable(ctx, &key, &layout, mtu) {
        return unanswered;
    }
    if !admitted(&key, clock::now_ns(cfg)) {
        return (XDP_DROP, Reason::DropOversizeLimited);
    }
    let built = match (key.family == FAMILY_V4, layout.l2_len == ETH_LEN) {
        (true, true) => icmp::frag_needed_v4::<ETH_LEN>(ctx, mtu as u16),
        (true, false) => icmp::frag_needed_v4::<{ ETH_LEN + VLAN_LEN }>(ctx, mtu as u16),
        (false, true) => icmp::packet_too_big_v6::<ETH_LEN>(ctx, mtu),
        (false, false) => icmp::packet_too_big_v6::<{ ETH_LEN + VLAN_LEN }>(ctx, mtu),
    };
    // A failed resize leaves the frame unusable; it was to be dropped anyway.
    if built.is_err() {
        return unanswered;
    }
    (XDP_TX, Reason::TxPacketTooBig)
}

/// Whether an answer is due: the sender asked for path MTU discovery, the advice is one the
/// family allows, the answer is no longer than the packet, and the source could be a host.
#[inline(always)]
fn answerable(ctx: &XdpContext, key: &FlowKey, layout: &Layout, mtu: u32) -> bool {
    if key.family == FAMILY_V4 {
        let Some(ip) = packet::at::<Ipv4Hdr>(ctx, layout.l2_len) else {
            return false;
        };
        let df = u16::from_be(unsafe { (*ip).frag_off }) & IPV4_DF != 0;
        df && source_limit::is_host(&key.src, key.family) && mtu >= icmp::MIN_MTU_V4 && layout.l3_len >= icmp::ANSWER_V4
    } else {
        source_limit::is_host(&key.src, key.family) && mtu >= icmp::MIN_MTU_V6 && layout.l3_len >= icmp::ANSWER_V6
    }
}

/// Takes an answer from the source's bucket, then from the global one.
#[inline(always)]
fn admitted(key: &FlowKey, now: u64) -> bool {
    source_limit::admit_answer(&PTB_SOURCES, &PTB_GLOBAL, (&key.src, key.family, PTB_SOURCE_PREFIX_V6), (&PER_SOURCE, &GLOBAL), now)
}
