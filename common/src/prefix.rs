//! Address prefixes, as both sides mask them (per-source buckets, operator rules).

/// `addr` (network-order words) with only its first `len` bits kept.
#[inline(always)]
pub const fn masked(addr: &[u32; 4], len: u8) -> [u32; 4] {
    [addr[0] & word_mask(len, 0), addr[1] & word_mask(len, 1), addr[2] & word_mask(len, 2), addr[3] & word_mask(len, 3)]
}

/// The mask (network order) of address word `index` (0..4) under a prefix of `len` bits.
/// Branch-free, with the clamps done on the sign bit: BPF has no conditional move, and a
/// branch per word would multiply the paths the verifier walks.
#[inline(always)]
pub const fn word_mask(len: u8, index: u32) -> u32 {
    // The word's own prefix bits, clamped to 0..=32.
    let bits = len as i64 - 32 * index as i64;
    let bits = bits & !(bits >> 63);
    let over = bits - 32;
    let bits = 32 + (over & (over >> 63));
    ((u64::MAX << (32 - bits)) as u32).to_be()
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
            let kept: u32 = (0..4).map(|i| u32::from_be(word_mask(len, i)).count_ones()).sum();
            assert_eq!(kept, u32::from(len), "/{len}");
            let all = masked(&[u32::MAX; 4], len).map(u32::from_be);
            let ones = u128::from(all[0]) << 96 | u128::from(all[1]) << 64 | u128::from(all[2]) << 32 | u128::from(all[3]);
            assert_eq!(ones, if len == 0 { 0 } else { u128::MAX << (128 - u32::from(len)) }, "/{len}");
        }
        // Lengths past an address keep it whole.
        assert_eq!(masked(&[u32::MAX; 4], 200), [u32::MAX; 4]);
    }
}
