//! Address prefixes, as both sides mask them (per-source buckets, operator rules).

/// `addr` (network-order words) with only its first `len` bits kept.
#[inline(always)]
pub const fn masked(addr: &[u32; 4], len: u8) -> [u32; 4] {
    let mut out = [0u32; 4];
    let mut i = 0;
    while i < 4 {
        let start = (i * 32) as u32;
        let keep = (len as u32).saturating_sub(start);
        let keep = if keep > 32 { 32 } else { keep };
        let mask = if keep == 0 { 0 } else { u32::MAX << (32 - keep) };
        out[i] = addr[i] & mask.to_be();
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_prefix_in_network_order() {
        let a = [u32::from_ne_bytes([10, 1, 2, 3]), 0, 0, 0];
        assert_eq!(masked(&a, 24)[0].to_ne_bytes(), [10, 1, 2, 0]);
        assert_eq!(masked(&a, 12)[0].to_ne_bytes(), [10, 0, 0, 0]);
        assert_eq!(masked(&a, 0), [0; 4]);
        let v6 = [u32::MAX; 4];
        assert_eq!(masked(&v6, 72), [u32::MAX, u32::MAX, u32::from_ne_bytes([0xff, 0, 0, 0]), 0]);
        assert_eq!(masked(&v6, 128), v6);
    }

    #[test]
    fn every_length_keeps_exactly_its_leading_bits() {
        for len in 0..=128u8 {
            let all = masked(&[u32::MAX; 4], len).map(u32::from_be);
            let ones = u128::from(all[0]) << 96 | u128::from(all[1]) << 64 | u128::from(all[2]) << 32 | u128::from(all[3]);
            assert_eq!(ones, if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) }, "/{len}");
        }
    }
}
