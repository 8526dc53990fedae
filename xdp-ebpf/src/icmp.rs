//! ICMP "fragmentation needed" (RFC 792, 1191) and ICMPv6 "packet too big" (RFC 4443)
//! answers, built in place of the packet that was too big: its tail is cut, its front grows
//! by the new IP and ICMP headers, and the MACs swap, so the answer leaves with XDP_TX the
//! way the packet came (VLAN tag included).
//!
//! The answer quotes a fixed length of the packet: 548 bytes for IPv4 (the answer is then
//! 576 bytes, RFC 1812's most) and 1232 for IPv6 (1280, the IPv6 minimum MTU RFC 4443 fills
//! up to). Fixed lengths keep every packet access and checksum a constant the verifier can
//! prove; the caller answers only packets at least as long as the answer, so an answer is
//! never bigger than what triggered it.

use aya_ebpf::{
    helpers::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use spillway_common::types::{PROTO_ICMP, PROTO_ICMPV6};

use crate::csum;
use crate::headers::*;
use crate::packet::{at, at_mut, len};

/// Bytes of the packet an answer quotes, and the answer's IP length.
pub const QUOTE_V4: usize = 548;
pub const ANSWER_V4: usize = IPV4_LEN + ICMP_LEN + QUOTE_V4;
pub const QUOTE_V6: usize = 1232;
pub const ANSWER_V6: usize = IPV6_LEN + ICMP_LEN + QUOTE_V6;
/// The smallest MTU each family may be told to use (RFC 791, RFC 8200).
pub const MIN_MTU_V4: u32 = 68;
pub const MIN_MTU_V6: u32 = 1280;

/// IPv4 TOS of ICMP errors: precedence "internetwork control", as the kernel's.
const TOS_INTERNETWORK_CONTROL: u8 = 0xc0;
/// `bpf_csum_diff` sums at most this many bytes per call.
const CSUM_CHUNK: usize = 512;

/// Turns the IPv4 packet at `L2` (14, or 18 with a VLAN tag) bytes into the frame into a
/// "fragmentation needed" answer advising `mtu`. The frame must hold `L2 + QUOTE_V4` bytes.
#[inline(always)]
pub fn frag_needed_v4<const L2: usize>(ctx: &XdpContext, mtu: u16) -> Result<(), ()> {
    let l2 = read_l2::<L2>(ctx)?;
    let ip = at::<Ipv4Hdr>(ctx, L2).ok_or(())?;
    let (client, vip) = unsafe { ((*ip).src, (*ip).dst) };
    resize::<L2>(ctx, QUOTE_V4, IPV4_LEN + ICMP_LEN)?;
    write_l2::<L2>(ctx, &l2)?;
    let ip = at_mut::<Ipv4Hdr>(ctx, L2).ok_or(())?;
    let mut hdr = Ipv4Hdr {
        ver_ihl: 0x45,
        tos: TOS_INTERNETWORK_CONTROL,
        tot_len: (ANSWER_V4 as u16).to_be(),
        id: 0,
        frag_off: 0,
        ttl: ANSWER_TTL,
        proto: PROTO_ICMP,
        check: 0,
        src: vip,
        dst: client,
    };
    hdr.check = csum::ipv4_header(&hdr);
    unsafe { *ip = hdr };
    // RFC 1191: the next-hop MTU in the low 16 bits of the second word.
    let icmp = write_icmp::<L2, IPV4_LEN>(ctx, ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, (mtu as u32).to_be())?;
    let sum = sum_icmp::<L2, IPV4_LEN, { ICMP_LEN + QUOTE_V4 }>(ctx, 0)?;
    unsafe { (*icmp).check = fold(sum) };
    Ok(())
}

/// Turns the IPv6 packet at `L2` bytes into the frame into a "packet too big" answer
/// advising `mtu`. The frame must hold `L2 + QUOTE_V6` bytes.
#[inline(always)]
pub fn packet_too_big_v6<const L2: usize>(ctx: &XdpContext, mtu: u32) -> Result<(), ()> {
    let l2 = read_l2::<L2>(ctx)?;
    let ip = at::<Ipv6Hdr>(ctx, L2).ok_or(())?;
    let (client, vip) = unsafe { ((*ip).src, (*ip).dst) };
    resize::<L2>(ctx, QUOTE_V6, IPV6_LEN + ICMP_LEN)?;
    write_l2::<L2>(ctx, &l2)?;
    let ip = at_mut::<Ipv6Hdr>(ctx, L2).ok_or(())?;
    unsafe {
        *ip = Ipv6Hdr {
            vtc_flow: (6u32 << 28).to_be(),
            payload_len: ((ICMP_LEN + QUOTE_V6) as u16).to_be(),
            next_hdr: PROTO_ICMPV6,
            hop_limit: ANSWER_TTL,
            src: vip,
            dst: client,
        }
    };
    let icmp = write_icmp::<L2, IPV6_LEN>(ctx, ICMPV6_PKT_TOO_BIG, 0, mtu.to_be())?;
    // The pseudo-header (RFC 8200, 8.1): both addresses, read where they now are, then the
    // upper-layer length and next header as the 16-bit words they make in network order.
    let addrs = at::<[u32; 8]>(ctx, L2 + 8).ok_or(())?;
    let sum = csum_diff(addrs as *mut u32, 32, 0)?;
    let sum = sum + ((ICMP_LEN + QUOTE_V6) as u16).to_be() as u64 + (PROTO_ICMPV6 as u16).to_be() as u64;
    let sum = sum_icmp::<L2, IPV6_LEN, { ICMP_LEN + QUOTE_V6 }>(ctx, fold_partial(sum))?;
    unsafe { (*icmp).check = fold(sum) };
    Ok(())
}

/// The Ethernet header (and VLAN tag) of the frame as it arrived.
struct L2Header {
    eth: EthHdr,
    vlan: VlanHdr,
}

#[inline(always)]
fn read_l2<const L2: usize>(ctx: &XdpContext) -> Result<L2Header, ()> {
    let eth = unsafe { *at::<EthHdr>(ctx, 0).ok_or(())? };
    let vlan = if L2 > ETH_LEN { unsafe { *at::<VlanHdr>(ctx, ETH_LEN).ok_or(())? } } else { VlanHdr { tci: 0, proto: 0 } };
    Ok(L2Header { eth, vlan })
}

/// Writes the arrived L2 header back at the new front, addressed back to the sender.
#[inline(always)]
fn write_l2<const L2: usize>(ctx: &XdpContext, l2: &L2Header) -> Result<(), ()> {
    let eth = at_mut::<EthHdr>(ctx, 0).ok_or(())?;
    unsafe { *eth = EthHdr { dst: l2.eth.src, src: l2.eth.dst, proto: l2.eth.proto } };
    if L2 > ETH_LEN {
        let vlan = at_mut::<VlanHdr>(ctx, ETH_LEN).ok_or(())?;
        unsafe { *vlan = l2.vlan };
    }
    Ok(())
}

/// Keeps `L2 + quote` bytes of the frame and makes room for `headers` bytes between its
/// L2 header and the quoted packet (whose old L2 bytes become junk the caller overwrites).
#[inline(always)]
fn resize<const L2: usize>(ctx: &XdpContext, quote: usize, headers: usize) -> Result<(), ()> {
    let excess = len(ctx).checked_sub(L2 + quote).ok_or(())?;
    if excess > 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, -(excess as i32)) } != 0 {
        return Err(());
    }
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(headers as i32)) } != 0 {
        return Err(());
    }
    Ok(())
}

/// Writes the ICMP header after the `IP`-byte IP header, checksum zero for now.
#[inline(always)]
fn write_icmp<const L2: usize, const IP: usize>(ctx: &XdpContext, kind: u8, code: u8, rest: u32) -> Result<*mut IcmpHdr, ()> {
    let icmp = at_mut::<IcmpHdr>(ctx, L2 + IP).ok_or(())?;
    unsafe { *icmp = IcmpHdr { kind, code, check: 0, rest } };
    Ok(icmp)
}

/// The one's complement sum of the `N` bytes of ICMP message after the `IP`-byte IP
/// header, added to `seed`, in `CSUM_CHUNK` pieces (one bounds check covers them all).
#[inline(always)]
fn sum_icmp<const L2: usize, const IP: usize, const N: usize>(ctx: &XdpContext, seed: u32) -> Result<u64, ()> {
    const { assert!(N % 4 == 0 && N <= 3 * CSUM_CHUNK) };
    let message = at::<[u8; N]>(ctx, L2 + IP).ok_or(())? as usize;
    let mut sum = seed;
    for chunk in 0..N.div_ceil(CSUM_CHUNK) {
        let done = chunk * CSUM_CHUNK;
        let n = if N - done > CSUM_CHUNK { CSUM_CHUNK } else { N - done };
        sum = fold_partial(csum_diff((message + done) as *mut u32, n as u32, sum)?);
    }
    Ok(sum as u64)
}

/// `bpf_csum_diff` adding `n` bytes at `words` to `seed`: a 32-bit partial sum.
#[inline(always)]
fn csum_diff(words: *mut u32, n: u32, seed: u32) -> Result<u64, ()> {
    let sum = unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, words, n, seed) };
    if sum < 0 { Err(()) } else { Ok(sum as u64) }
}

/// A sum folded into 32 bits, still a valid partial sum.
#[inline(always)]
fn fold_partial(sum: u64) -> u32 {
    let sum = (sum & 0xffff_ffff) + (sum >> 32);
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

/// The checksum to store (as is) from a partial sum.
#[inline(always)]
fn fold(sum: u64) -> u16 {
    let mut s = fold_partial(sum);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u16)
}
