//! Ping a VIP: a plain echo request (IPv4 without options and not a fragment, or IPv6 with
//! ICMPv6 as its first next header; type echo request, code 0) to an address where a VIP has
//! a backend taking new flows is answered, from a source a host may have, within the rates
//! (per source prefix, then in all): the request turned around in place (MACs and addresses
//! swapped, a fresh TTL or hop limit, the type a reply, checksums updated for the words that
//! changed, RFC 1624). Anything else of another protocol to a VIP address is dropped.

use spillway_common::{
    limits::ECHO_SOURCE_PREFIX_V6,
    types::{EchoConfig, FAMILY_V4, FAMILY_V6, PROTO_ICMP, PROTO_ICMPV6, Reason},
};

use crate::{
    frame::{self, ANSWER_TTL, Bytes, ICMP_LEN, IPV4_LEN, IPV6_LEN, is_host},
    limits::AnswerBuckets,
};

/// The echo answers' buckets.
#[derive(Default)]
pub(crate) struct Buckets(AnswerBuckets);

/// A plain echo request: where its IP header starts, its family and source.
struct Request {
    l3: usize,
    family: u8,
    src: [u32; 4],
}

fn request(b: &Bytes) -> Option<Request> {
    let (ethertype, l3) = frame::link(b)?;
    let (family, icmp, echo_request) = match ethertype {
        0x0800 => {
            b.get(l3, IPV4_LEN)?;
            let ip_len = b.be16(l3 + 2)? as usize;
            let plain = b.u8(l3)? == 0x45 && b.be16(l3 + 6)? & 0x3fff == 0 && b.u8(l3 + 9)? == PROTO_ICMP;
            if !plain || ip_len < IPV4_LEN + ICMP_LEN || l3 + ip_len > b.len() {
                return None;
            }
            (FAMILY_V4, l3 + IPV4_LEN, 8)
        }
        0x86dd => {
            b.get(l3, IPV6_LEN)?;
            let payload = b.be16(l3 + 4)? as usize;
            let plain = b.u8(l3)? >> 4 == 6 && b.u8(l3 + 6)? == PROTO_ICMPV6;
            if !plain || payload < ICMP_LEN || l3 + IPV6_LEN + payload > b.len() {
                return None;
            }
            (FAMILY_V6, l3 + IPV6_LEN, 128)
        }
        _ => return None,
    };
    let header = b.get(icmp, ICMP_LEN)?;
    let src = if family == FAMILY_V4 { b.words(l3 + 12, 1) } else { b.words(l3 + 8, 4) };
    (header[0] == echo_request && header[1] == 0).then_some(Request { l3, family, src })
}

impl Buckets {
    /// The answer to `frame`, or why there is none.
    pub(crate) fn answer(&mut self, frame: &[u8], rates: &EchoConfig, now: u64) -> Result<Vec<u8>, Reason> {
        let request = request(&Bytes(frame)).ok_or(Reason::DropNoService)?;
        if rates.per_source.per_s == 0 || rates.total.per_s == 0 || !is_host(&request.src, request.family) {
            return Err(Reason::DropNoService);
        }
        if !self.0.admit((&request.src, request.family, ECHO_SOURCE_PREFIX_V6), (&rates.per_source, &rates.total), now) {
            return Err(Reason::DropEchoLimited);
        }
        Ok(turned_around(frame, &request))
    }
}

fn turned_around(frame: &[u8], request: &Request) -> Vec<u8> {
    let mut out = frame.to_vec();
    out[..6].copy_from_slice(&frame[6..12]);
    out[6..12].copy_from_slice(&frame[..6]);
    let l3 = request.l3;
    let (addr_len, src_at, icmp, reply) =
        if request.family == FAMILY_V4 { (4, l3 + 12, l3 + IPV4_LEN, 0) } else { (16, l3 + 8, l3 + IPV6_LEN, 129) };
    let dst_at = src_at + addr_len;
    out[src_at..dst_at].copy_from_slice(&frame[dst_at..dst_at + addr_len]);
    out[dst_at..dst_at + addr_len].copy_from_slice(&frame[src_at..dst_at]);
    if request.family == FAMILY_V4 {
        // The TTL and the protocol share the word the header checksum covers.
        let old = [out[l3 + 8], out[l3 + 9]];
        out[l3 + 8] = ANSWER_TTL;
        rewrite(&mut out, l3 + 10, old, [ANSWER_TTL, old[1]]);
    } else {
        out[l3 + 7] = ANSWER_TTL;
    }
    let old = [out[icmp], out[icmp + 1]];
    out[icmp] = reply;
    rewrite(&mut out, icmp + 2, old, [reply, old[1]]);
    out
}

/// Updates the checksum at `at` for a covered word changed from `old` to `new` (RFC 1624,
/// eqn. 3: `~(~HC + ~m + m')`).
fn rewrite(out: &mut [u8], at: usize, old: [u8; 2], new: [u8; 2]) {
    let check = u16::from_be_bytes([out[at], out[at + 1]]);
    let mut sum = (!check) as u32 + (!u16::from_be_bytes(old)) as u32 + u16::from_be_bytes(new) as u32;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    out[at..at + 2].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}
