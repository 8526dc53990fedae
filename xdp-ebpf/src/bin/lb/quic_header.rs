//! A QUIC packet's header as the QUIC and crypt programs read it (`quic_program.rs`,
//! `quic_crypto.rs`), and the UDP program both end in for a packet its id does not place.

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use spillway_common::{
    limits::QUIC_CONFIG_IDS_PER_VIP,
    quic_lb::{CONFIG_ID_SHIFT, MAX_CID_LEN, QuicLbConfig},
    types::{FAMILY_V4, Reason},
};
use xdp_ebpf::{headers::UDP_LEN, packet};

use crate::{
    maps::{QUIC_CONFIGS, QUIC_PROGRAM},
    verdict::Verdict,
};

/// The header form bit of a QUIC packet's first byte: set for long headers (RFC 9000 §17).
const LONG_HEADER: u8 = 0x80;
/// Where a UDP header can start, at most: after Ethernet, a VLAN tag, IPv6 and its
/// extension headers (`parse.rs` walks a few).
const MAX_L4: u64 = 1 << 13;
/// Slots of the UDP programs in the QUIC programs' array.
const UDP_V4: u32 = 2;
const UDP_V6: u32 = 3;

/// A packet's QUIC header, as far as the programs read it.
pub enum Header {
    Long,
    /// A short header: its id's first octet, where its id starts (MAX_CID_LEN octets in the
    /// frame), the id's first 16 octets as two words, and the configuration its config id
    /// names (the VIP slot's, or another of the VIP's: a key rotation).
    Short {
        first: u8,
        cid: *const u8,
        low: u64,
        high: u64,
        cfg: QuicLbConfig,
    },
    /// Too short, or a config id the VIP does not have.
    Unreadable,
}

/// The header of a packet to QUIC VIP `vip_id` (configuration `vip_cfg`, the VIP slot's)
/// whose UDP header starts at `l4`.
#[inline(always)]
pub fn header(ctx: &XdpContext, vip_id: u32, vip_cfg: &QuicLbConfig, l4: u64) -> Header {
    // Bounded, so the verifier can check the reads after it (the hand-over's value is any
    // value to it). A full register: a 32-bit one would be widened again after the
    // check, and the verifier would lose the bound.
    if l4 > MAX_L4 {
        return Header::Unreadable;
    }
    let payload = l4 as usize + UDP_LEN;
    // SAFETY: bounds-checked by `at`.
    let Some(first) = packet::at::<u8>(ctx, payload).map(|first| unsafe { *first }) else {
        return Header::Unreadable;
    };
    if first & LONG_HEADER != 0 {
        return Header::Long;
    }
    // A short header does not say how long its id is: the configuration does, and the
    // decoder reads only that much of the octets after the first byte (the packet number
    // and the AEAD tag follow, so a real packet always has MAX_CID_LEN of them).
    let Some(cid) = packet::at::<[u8; MAX_CID_LEN]>(ctx, payload + 1) else {
        return Header::Unreadable;
    };
    let cid = cid.cast::<u8>();
    // SAFETY: `at` checked the MAX_CID_LEN octets from `cid` are in the frame.
    let (low, high) = unsafe { (packet::load_u64_le(cid), packet::load_u64_le(cid.add(8))) };
    // The id's own first octet (the packet's is the header form's) names its config id.
    let first = low as u8;
    let config_id = (first >> CONFIG_ID_SHIFT) as u32;
    let cfg = if config_id == vip_cfg.config_id as u32 {
        *vip_cfg
    } else {
        match QUIC_CONFIGS.get(vip_id * QUIC_CONFIG_IDS_PER_VIP + config_id) {
            Some(word) => QuicLbConfig::from_word(*word),
            None => return Header::Unreadable,
        }
    };
    Header::Short { first, cid, low, high, cfg }
}

/// Tail-calls the UDP program: the balancer's path for a packet its id does not place.
#[inline(always)]
pub fn to_udp_program<const FAMILY: u8>(ctx: &XdpContext) -> Verdict {
    // SAFETY: the slots hold XDP programs of the balancer's object, or nothing.
    let _ = unsafe { QUIC_PROGRAM.tail_call(ctx, if FAMILY == FAMILY_V4 { UDP_V4 } else { UDP_V6 }) };
    // Only if the UDP program is not there (it always is once `lbd` has loaded the
    // balancer, before any VIP is QUIC): the kernel gets the frame.
    Verdict::ended(XDP_PASS, Reason::PassNotVip)
}
