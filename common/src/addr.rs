//! Conversions between `IpAddr` and the map's network-order address words.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::types::{FAMILY_V4, FAMILY_V6};

/// Address words as they sit in a packet, and the family.
pub fn to_words(addr: IpAddr) -> ([u32; 4], u8) {
    match addr {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], FAMILY_V4),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([word(0), word(4), word(8), word(12)], FAMILY_V6)
        }
    }
}

/// The inverse of [`to_words`]; `None` for an unknown family.
pub fn from_words(words: [u32; 4], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_V4 => Some(IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))),
        FAMILY_V6 => {
            let mut o = [0u8; 16];
            for (chunk, word) in o.as_chunks_mut::<4>().0.iter_mut().zip(words) {
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for a in ["10.1.2.3", "fd00::1:2", "::ffff:1.2.3.4"] {
            let ip: IpAddr = a.parse().unwrap();
            let (w, f) = to_words(ip);
            assert_eq!(from_words(w, f), Some(ip));
        }
    }

    #[test]
    fn v4_word_is_packet_order() {
        let (w, _) = to_words("10.0.0.1".parse().unwrap());
        assert_eq!(w[0].to_ne_bytes(), [10, 0, 0, 1]);
    }
}
