//! The one hash both sides compute: MurmurHash3's 32-bit block mix over fixed-size inputs.
//!
//! Fixed-size and branch-free so the verifier sees straight-line code, and identical on the
//! host so tests and the loader can predict the kernel's choices.

use crate::types::FlowKey;

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

#[inline(always)]
const fn mix(h: u32, k: u32) -> u32 {
    let k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline(always)]
const fn finish(h: u32, len_words: u32) -> u32 {
    let mut h = h ^ (len_words * 4);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// Hash of a connection's 5-tuple; picks the Maglev slot and the outer source's host bits.
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    let mut h = seed;
    h = mix(h, key.src[0]);
    h = mix(h, key.src[1]);
    h = mix(h, key.src[2]);
    h = mix(h, key.src[3]);
    h = mix(h, key.dst[0]);
    h = mix(h, key.dst[1]);
    h = mix(h, key.dst[2]);
    h = mix(h, key.dst[3]);
    h = mix(h, (key.sport as u32) | ((key.dport as u32) << 16));
    h = mix(h, key.proto as u32);
    finish(h, 10)
}

/// Hash of a backend's address; seeds pick Maglev's offset and skip.
#[inline(always)]
pub const fn addr_hash(addr: &[u32; 4], seed: u32) -> u32 {
    let mut h = seed;
    h = mix(h, addr[0]);
    h = mix(h, addr[1]);
    h = mix(h, addr[2]);
    h = mix(h, addr[3]);
    finish(h, 4)
}

/// Word index and bit of `addr` in the VIP address pre-filter.
#[inline(always)]
pub const fn vip_filter_slot(addr: &[u32; 4]) -> (u32, u64) {
    let h = addr_hash(addr, VIP_FILTER_SEED);
    ((h >> 6) % crate::limits::VIP_FILTER_WORDS, 1u64 << (h & 63))
}

/// Seed of the VIP address pre-filter.
pub const VIP_FILTER_SEED: u32 = 0x5669_7046; // "VipF"
/// Seed of the flow hash used to choose a backend.
pub const FLOW_SEED: u32 = 0x5370_696c; // "Spil"
/// Seeds of Maglev's per-backend offset and skip.
pub const MAGLEV_OFFSET_SEED: u32 = 0x6c77_6179; // "lway"
pub const MAGLEV_SKIP_SEED: u32 = 0x4d61_676c; // "Magl"

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sport: u16) -> FlowKey {
        FlowKey { src: [0x0a00_000a, 0, 0, 0], dst: [0x0a64_0001, 0, 0, 0], sport, dport: 80, proto: 6, family: 4, _pad: [0; 2] }
    }

    #[test]
    fn flow_hash_is_deterministic_and_port_sensitive() {
        assert_eq!(flow_hash(&key(1), FLOW_SEED), flow_hash(&key(1), FLOW_SEED));
        assert_ne!(flow_hash(&key(1), FLOW_SEED), flow_hash(&key(2), FLOW_SEED));
    }

    #[test]
    fn flow_hash_spreads_sequential_ports_evenly() {
        let mut buckets = [0u32; 16];
        for port in 0..16_000u16 {
            buckets[(flow_hash(&key(port), FLOW_SEED) % 16) as usize] += 1;
        }
        for count in buckets {
            assert!((900..1100).contains(&count), "uneven bucket: {count}");
        }
    }

    #[test]
    fn addr_hash_seeds_differ() {
        let a = [1, 2, 3, 4];
        assert_ne!(addr_hash(&a, MAGLEV_OFFSET_SEED), addr_hash(&a, MAGLEV_SKIP_SEED));
    }
}
