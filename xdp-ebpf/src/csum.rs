//! Internet checksum of the outer IPv4 header (RFC 1071), unrolled over its ten words, and
//! incremental updates of a checksum (RFC 1624).

use crate::headers::Ipv4Hdr;

/// Checksum for `hdr`, whose `check` field must be 0; the result is stored as-is.
#[inline(always)]
pub fn ipv4_header(hdr: &Ipv4Hdr) -> u16 {
    // SAFETY: Ipv4Hdr is 20 bytes of plain data, aligned to 4 on the stack.
    let words: &[u16; 10] = unsafe { &*(hdr as *const Ipv4Hdr as *const [u16; 10]) };
    let mut sum: u32 = 0;
    sum += words[0] as u32;
    sum += words[1] as u32;
    sum += words[2] as u32;
    sum += words[3] as u32;
    sum += words[4] as u32;
    sum += words[5] as u32;
    sum += words[6] as u32;
    sum += words[7] as u32;
    sum += words[8] as u32;
    sum += words[9] as u32;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The checksum of an IPv4 header whose TTL was just decremented by one, from its old one
/// (RFC 1624, as the kernel's `ip_decrease_ttl`): the (TTL, protocol) word fell by 0x0100,
/// so its one's complement sum rises by as much. Both are stored as read (network order).
#[inline(always)]
pub fn ipv4_after_ttl_decrement(check: u16) -> u16 {
    let sum = check as u32 + 0x0100u16.to_be() as u32;
    (sum + (sum >= 0xffff) as u32) as u16
}

/// The checksum `check` once a 16-bit word it covers changed from `old` to `new` (RFC 1624,
/// eqn. 3: `~(~HC + ~m + m')`). All three as stored (network order read natively): the
/// one's complement sum is the same in either byte order.
#[inline(always)]
pub fn after_word_change(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = (!check) as u32 + (!old) as u32 + new as u32;
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}
