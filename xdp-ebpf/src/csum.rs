//! Internet checksum of the outer IPv4 header (RFC 1071), unrolled over its ten words.

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
