//! A packet too big for its egress once encapsulated: answered, as a router on the way
//! would, with ICMP "fragmentation needed" (IPv4, if the packet may not be fragmented) or
//! ICMPv6 "packet too big", from the VIP to a client a host may have, telling the MTU that
//! fits the tunnel; rate-limited per source prefix and in all. The answer quotes as much of
//! the packet as the minimum MTU leaves room for, so a packet too short to fill it is not
//! answered; the Ethernet (and VLAN) header is the request's, turned around.

use spillway_common::{
    limits::{PTB_GLOBAL_BURST, PTB_GLOBAL_PER_S, PTB_SOURCE_BURST, PTB_SOURCE_PER_S, PTB_SOURCE_PREFIX_V6},
    types::{FAMILY_V4, FlowKey, PROTO_ICMP, PROTO_ICMPV6, Rate, Reason},
};

use crate::{
    frame::{ANSWER_TTL, ETH_LEN, ICMP_LEN, IPV4_LEN, IPV6_LEN, Layout, is_host},
    limits::AnswerBuckets,
};

const QUOTE_V4: usize = 548;
const QUOTE_V6: usize = 1232;
const MIN_MTU_V4: usize = 68;
const MIN_MTU_V6: usize = 1280;
const TOS_INTERNETWORK_CONTROL: u8 = 0xc0;
const PER_SOURCE: Rate = Rate::new(PTB_SOURCE_PER_S, PTB_SOURCE_BURST);
const GLOBAL: Rate = Rate::new(PTB_GLOBAL_PER_S, PTB_GLOBAL_BURST);

/// The answers' buckets.
#[derive(Default)]
pub(crate) struct Buckets(AnswerBuckets);

impl Buckets {
    /// The answer to the packet `key` of `frame` (laid out as `layout`) whose tunnel leaves
    /// room for `mtu` bytes, or why there is none.
    pub(crate) fn answer(&mut self, frame: &[u8], key: &FlowKey, layout: &Layout, mtu: usize, now: u64) -> Result<Vec<u8>, Reason> {
        let v4 = key.family == FAMILY_V4;
        let (quote, header_len) = if v4 { (QUOTE_V4, IPV4_LEN) } else { (QUOTE_V6, IPV6_LEN) };
        let answerable = if v4 {
            let dont_fragment = frame[layout.l2_len + 6] & 0x40 != 0;
            dont_fragment && mtu >= MIN_MTU_V4 && layout.l3_len >= IPV4_LEN + ICMP_LEN + QUOTE_V4
        } else {
            mtu >= MIN_MTU_V6 && layout.l3_len >= IPV6_LEN + ICMP_LEN + QUOTE_V6
        };
        if !answerable || !is_host(&key.src, key.family) {
            return Err(Reason::DropOversize);
        }
        if !self.0.admit((&key.src, key.family, PTB_SOURCE_PREFIX_V6), (&PER_SOURCE, &GLOBAL), now) {
            return Err(Reason::DropOversizeLimited);
        }
        // The answer's L2 is 14 bytes, or 18 with any other L2 length (one VLAN tag).
        let l2 = if layout.l2_len == ETH_LEN { ETH_LEN } else { ETH_LEN + 4 };
        let quoted = frame.get(l2..l2 + quote).ok_or(Reason::DropOversize)?;
        let mut out = Vec::with_capacity(l2 + header_len + ICMP_LEN + quote);
        out.extend_from_slice(&frame[6..12]);
        out.extend_from_slice(&frame[..6]);
        out.extend_from_slice(&frame[12..l2]);
        let words = |out: &mut Vec<u8>, w: &[u32]| w.iter().for_each(|w| out.extend_from_slice(&w.to_ne_bytes()));
        let message_len = ICMP_LEN + quote;
        let mut message = Vec::with_capacity(message_len);
        let pseudo = if v4 {
            let start = out.len();
            out.extend_from_slice(&[0x45, TOS_INTERNETWORK_CONTROL]);
            out.extend_from_slice(&((IPV4_LEN + message_len) as u16).to_be_bytes());
            out.extend_from_slice(&[0, 0, 0, 0, ANSWER_TTL, PROTO_ICMP, 0, 0]);
            words(&mut out, &key.dst[..1]);
            words(&mut out, &key.src[..1]);
            let check = checksum(&out[start..], 0);
            out[start + 10..start + 12].copy_from_slice(&check.to_be_bytes());
            message.extend_from_slice(&[3, 4, 0, 0]);
            message.extend_from_slice(&(mtu as u32).to_be_bytes());
            0
        } else {
            out.extend_from_slice(&(6u32 << 28).to_be_bytes());
            out.extend_from_slice(&(message_len as u16).to_be_bytes());
            out.extend_from_slice(&[PROTO_ICMPV6, ANSWER_TTL]);
            let start = out.len();
            words(&mut out, &key.dst);
            words(&mut out, &key.src);
            message.extend_from_slice(&[2, 0, 0, 0]);
            message.extend_from_slice(&(mtu as u32).to_be_bytes());
            // The pseudo-header: the addresses, the length and the next header.
            sum(&out[start..]) + message_len as u32 + PROTO_ICMPV6 as u32
        };
        message.extend_from_slice(quoted);
        let check = checksum(&message, pseudo);
        message[2..4].copy_from_slice(&check.to_be_bytes());
        out.extend_from_slice(&message);
        Ok(out)
    }
}

/// The ones' complement sum of big-endian 16-bit words, unfolded.
fn sum(bytes: &[u8]) -> u32 {
    bytes.chunks(2).map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32).sum()
}

/// The Internet checksum of `bytes` (its checksum field zero) with `seed` added.
fn checksum(bytes: &[u8], seed: u32) -> u16 {
    let mut total = sum(bytes) as u64 + seed as u64;
    while total >> 16 != 0 {
        total = (total & 0xffff) + (total >> 16);
    }
    !(total as u16)
}
