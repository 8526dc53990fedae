//! The hashes both sides compute, over fixed-size inputs: the per-packet ones (the flow and
//! the VIP address) by 64-bit multiplies that do not wait for each other, the rest (Maglev's
//! backend permutations, rules, QUIC server ids) by MurmurHash3's 32-bit block mix.
//!
//! Fixed-size and branch-free so the verifier sees straight-line code, and identical on the
//! host so tests and the loader can predict the kernel's choices.

use crate::{
    prefix::masked,
    quic_lb::words_mask,
    types::{FAMILY_V4, FlowKey, VIP_F_SOURCE_HASH, vip_source_prefix},
};

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

/// Hash of a connection's 5-tuple; picks the Maglev slot, the connection table's buckets and
/// the outer source's host bits. The tuple as 64-bit words, each keyed by `seed` and
/// multiplied by an odd constant of its own (a bijection of the word, so no word can stop
/// counting), summed, then a 64-bit finalizer. The products do not wait for each other, so
/// the data path waits for one multiply and the finalizer instead of a chain of one mix per
/// word (the chain was the table hit's longest dependency). Without the seed a sender cannot
/// aim at a bucket: what a changed source word adds depends on the seed's bits.
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    let keyed = (seed as u64).wrapping_mul(SEED_SPREAD);
    let term = |w: u64, m: u64| (w ^ keyed).wrapping_mul(m);
    let (src, dst) = (&key.src, &key.dst);
    let ports = word((key.sport as u32) | ((key.dport as u32) << 16), key.proto as u32);
    let sum = if key.family == FAMILY_V4 {
        term(word(src[0], dst[0]), WORD_MULS[0]).wrapping_add(term(ports, WORD_MULS[1]))
    } else {
        term(word(src[0], src[1]), WORD_MULS[0])
            .wrapping_add(term(word(src[2], src[3]), WORD_MULS[2]))
            .wrapping_add(term(word(dst[0], dst[1]), WORD_MULS[3]))
            .wrapping_add(term(word(dst[2], dst[3]), WORD_MULS[4]))
            .wrapping_add(term(ports, WORD_MULS[1]))
    };
    fmix64(sum) as u32
}

/// Hash of a client's source address alone (`src`, of `family`), its first `prefix_len`
/// bits only, keyed as [`flow_hash`]: every connection of one client (of one prefix) hashes
/// alike whatever its ports, and clients spread as flows do.
#[inline(always)]
pub fn source_hash(src: &[u32; 4], family: u8, prefix_len: u8, seed: u32) -> u32 {
    let keyed = (seed as u64).wrapping_mul(SEED_SPREAD);
    let term = |w: u64, m: u64| (w ^ keyed).wrapping_mul(m);
    let src = masked(src, prefix_len);
    let sum = if family == FAMILY_V4 {
        term(src[0] as u64, WORD_MULS[0])
    } else {
        term(word(src[0], src[1]), WORD_MULS[0]).wrapping_add(term(word(src[2], src[3]), WORD_MULS[2]))
    };
    fmix64(sum) as u32
}

/// The hash Maglev places a new flow of a VIP with flags `vip_flags` by (`seed`: the
/// fleet's, so every balancer agrees): the 5-tuple's ([`flow_hash`]), or for a
/// `VIP_F_SOURCE_HASH` VIP the source address's first `vip_source_prefix` bits' only
/// ([`source_hash`]). Every place that predicts or follows Maglev's choice uses this.
#[inline(always)]
pub fn maglev_hash(key: &FlowKey, vip_flags: u32, seed: u32) -> u32 {
    if vip_flags & VIP_F_SOURCE_HASH == 0 {
        return flow_hash(key, seed);
    }
    source_hash(&key.src, key.family, vip_source_prefix(vip_flags), seed)
}

/// Hash of a QUIC connection id of `len` octets, its first 16 loaded as the little-endian
/// words `low` and `high` (octets past the id, the packet number's, are masked off), keyed
/// as [`flow_hash`]: the outer header's entropy for a packet sent by its connection id.
/// Every packet naming one id takes one outer tuple whatever its 5-tuple, so a client whose
/// address changes stays on the backend's RSS queue (and on one ECMP path to it); ids carry
/// a random nonce, so connections spread. Two multiplies and the finalizer, like an IPv4
/// flow hash.
#[inline(always)]
pub const fn connection_id_hash(low: u64, high: u64, len: u32, seed: u32) -> u32 {
    let keyed = (seed as u64).wrapping_mul(SEED_SPREAD);
    let (low_mask, high_mask) = words_mask(len);
    let sum = ((low & low_mask) ^ keyed).wrapping_mul(WORD_MULS[0]).wrapping_add(((high & high_mask) ^ keyed).wrapping_mul(WORD_MULS[1]));
    fmix64(sum) as u32
}

/// Two 32-bit words as one 64-bit word, `lo` in the low half.
#[inline(always)]
const fn word(lo: u32, hi: u32) -> u64 {
    lo as u64 | (hi as u64) << 32
}

/// Spreads the 32-bit seed over the 64 bits each word is keyed with.
const SEED_SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;
/// One odd multiplier per word of the tuple.
const WORD_MULS: [u64; 5] =
    [0xbf58_476d_1ce4_e5b9, 0x94d0_49bb_1331_11eb, 0xd6e8_feb8_6659_fd93, 0xa076_1d64_78bd_642f, 0xe703_7ed1_a0b4_28db];

/// MurmurHash3's 64-bit finalizer: every input bit reaches every output bit.
#[inline(always)]
const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The two buckets a flow may live in, in a connection table of `mask + 1` buckets: the
/// flow hash's low bits, and the same hash mixed again (two choices keep buckets even).
#[inline(always)]
pub const fn flow_buckets(hash: u32, mask: u32) -> (u32, u32) {
    (hash & mask, finish(hash ^ FLOW_BUCKET_SEED, 1) & mask)
}

/// Hash of an address (an IPv4 address, with only word 0 set, mixes one word); seeds pick
/// Maglev's offset and skip, and place VIP addresses.
#[inline(always)]
pub const fn addr_hash(addr: &[u32; 4], seed: u32) -> u32 {
    let mut h = mix(seed, addr[0]);
    if addr[1] | addr[2] | addr[3] == 0 {
        return finish(h, 1);
    }
    h = mix(h, addr[1]);
    h = mix(h, addr[2]);
    h = mix(h, addr[3]);
    finish(h, 4)
}

/// Hash of a VIP's address, computed once per packet: it places the address in the
/// pre-filter and, with the port and protocol, the VIP in the VIP index. Unkeyed (the loader
/// places operator-chosen addresses; a packet aiming at a slot only reads it) and short: two
/// independent multiplies, a fold and a third multiply, the same for either family.
#[inline(always)]
pub const fn vip_addr_hash(addr: &[u32; 4]) -> u32 {
    let mut h = (word(addr[0], addr[1]) ^ VIP_ADDR_KEY).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ word(addr[2], addr[3]).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 32;
    (h.wrapping_mul(0x94d0_49bb_1331_11eb) >> 32) as u32
}

/// Word index and bit of an address (by [`vip_addr_hash`]) in the VIP address pre-filter.
#[inline(always)]
pub const fn vip_filter_slot(addr_hash: u32) -> (u32, u64) {
    ((addr_hash >> 6) % crate::limits::VIP_FILTER_WORDS, 1u64 << (addr_hash & 63))
}

/// Home slot of a VIP (address by [`vip_addr_hash`], port in network order, protocol) in a
/// VIP index of `mask + 1` slots: one multiply-shift, the address hash above the port and
/// protocol (the product's high half depends on every bit of those, and the address hash's
/// low bits are already well mixed).
#[inline(always)]
pub const fn vip_home(addr_hash: u32, port: u16, proto: u8, mask: u32) -> u32 {
    let x = (addr_hash as u64) << 32 | port as u64 | (proto as u64) << 16;
    (x.wrapping_mul(0xd6e8_feb8_6659_fd93) >> 32) as u32 & mask
}

/// Home slot of a rule (its address by [`addr_hash`] with [`RULE_SEED`]) in a rule index of
/// `mask + 1` slots.
#[inline(always)]
pub const fn rule_home(addr_hash: u32, scope: u32, family: u8, prefix_len: u8, mask: u32) -> u32 {
    finish(mix(mix(addr_hash, scope), family as u32 | (prefix_len as u32) << 8), 3) & mask
}

/// Home slot of a QUIC server id (its [`crate::quic_lb::ServerId::words`]) of VIP `vip_id`
/// in a server-id index of `mask + 1` slots. One finalizer over the folded words, as for
/// VIP addresses: the index holds loader-written ids, and a packet naming an id of its
/// choice reads at most its home's probe window whatever it aims at.
#[inline(always)]
pub const fn quic_server_home(vip_id: u32, words: &[u32; 4], mask: u32) -> u32 {
    let folded = words[0] ^ words[1].rotate_left(8) ^ words[2].rotate_left(16) ^ words[3].rotate_left(24);
    finish(folded ^ vip_id.wrapping_mul(C1) ^ QUIC_SERVER_SEED, 2) & mask
}

/// Key of the VIP address hash (pre-filter and VIP index).
const VIP_ADDR_KEY: u64 = 0x5669_7041_6464_7248; // "VipAddrH"
/// Seed of the flow hash used to choose a backend.
pub const FLOW_SEED: u32 = 0x5370_696c; // "Spil"
/// Seeds of Maglev's per-backend offset and skip.
pub const MAGLEV_OFFSET_SEED: u32 = 0x6c77_6179; // "lway"
pub const MAGLEV_SKIP_SEED: u32 = 0x4d61_676c; // "Magl"
/// Seed of the rule index.
pub const RULE_SEED: u32 = 0x5275_6c65; // "Rule"
/// Seed of the QUIC server-id index.
const QUIC_SERVER_SEED: u32 = 0x5153_6964; // "QSid"
/// First port of the dynamic range (RFC 6335), where GUE's outer source ports lie: never a
/// well-known port a middlebox would treat as that service.
pub const GUE_SOURCE_PORT_BASE: u16 = 49152;

/// The outer UDP source port of a GUE tunnel (host order) for a flow of hash `hash` (the
/// table seed's, as the rest of the outer entropy): every packet of a flow takes one, and
/// flows spread over the 16384 ports of the dynamic range, so a backend's RSS spreads them
/// over its queues. The top 14 bits: the low ones are the outer source's host bits and the
/// IPv6 flow label already.
#[inline(always)]
pub const fn gue_source_port(hash: u32) -> u16 {
    GUE_SOURCE_PORT_BASE | (hash >> 18) as u16
}

/// Seed of a flow's second bucket.
const FLOW_BUCKET_SEED: u32 = 0x466c_6f77; // "Flow"

/// Whether a new flow of hash `flow_hash` (the table seed's: [`flow_hash`]) arriving at
/// `now_ns` (the data path's tick-resolution clock) is in the one-in-`one_in` sample (a power
/// of two) that feeds `top-sources`. The hash and the tick, mixed by one multiply whose top
/// bits depend on every bit of both: flows are drawn independently, a tuple sent again in
/// another tick is drawn again, and without the host's secret seed nobody outside can aim
/// at the sample or dodge it. No helper call: `bpf_get_prandom_u32` cost every new flow and
/// every refusal a call.
#[inline(always)]
pub const fn in_sample(flow_hash: u32, now_ns: u64, one_in: u32) -> bool {
    let mixed = (flow_hash as u64 ^ now_ns).wrapping_mul(SEED_SPREAD);
    // One in one: every flow (a shift by 64 bits would overflow).
    one_in <= 1 || mixed >> (u64::BITS - one_in.trailing_zeros()) == 0
}

/// Bench only: which of `count` backends the cheapest hop (`spillway_hop`) sends a packet to,
/// from its IPv4 source and TCP source port as they lie in the frame (network order read as
/// native words). A multiplicative hash: every packet of a connection to one backend, the
/// connections spread over all, and nothing else; `None` for no backends.
#[inline(always)]
pub fn hop_index(src: u32, src_port: u16, count: u32) -> Option<u32> {
    ((src ^ u32::from(src_port)).wrapping_mul(0x9e37_79b1) >> 16).checked_rem(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::vip_source_hash_flags;

    fn key(sport: u16) -> FlowKey {
        FlowKey { src: [0x0a00_000a, 0, 0, 0], dst: [0x0a64_0001, 0, 0, 0], sport, dport: 80, proto: 6, family: 4, _pad: [0; 2] }
    }

    #[test]
    fn one_flow_in_sixteen_is_sampled_and_the_tick_draws_again() {
        let hashes: std::vec::Vec<u32> = (0..16_000u16).map(|p| flow_hash(&key(p), FLOW_SEED)).collect();
        let tick = 4_000_000u64;
        let drawn = |now: u64| hashes.iter().filter(|h| in_sample(**h, now, 16)).count();
        for now in [0, tick * 1000, tick * 1001, u64::MAX - tick] {
            // 1000 expected, standard deviation ~31.
            assert!((850..=1150).contains(&drawn(now)), "{} of 16000 sampled at {now}", drawn(now));
        }
        // The same flows in the next tick: a fresh draw, not the same sixteenth.
        let both = hashes.iter().filter(|h| in_sample(**h, tick * 1000, 16) && in_sample(**h, tick * 1001, 16)).count();
        assert!(both < 150, "{both} flows sampled in both ticks (about 62 if independent)");
        assert!(hashes.iter().all(|h| in_sample(*h, 0, 1)), "one in one: every flow");
    }

    #[test]
    fn gue_source_ports_stay_in_the_dynamic_range_and_spread() {
        assert_eq!(gue_source_port(0), 49152);
        assert_eq!(gue_source_port(u32::MAX), 65535);
        let ports: std::collections::BTreeSet<u16> = (0..1000u16).map(|p| gue_source_port(flow_hash(&key(p), FLOW_SEED))).collect();
        assert!(ports.len() > 900, "{} distinct ports of 1000 flows", ports.len());
    }

    #[test]
    fn a_connection_ids_hash_is_its_octets_and_the_seeds_only() {
        let (low, high) = (0x8877_6655_4433_2211u64, 0x0000_0000_00cc_bbaau64);
        let h = connection_id_hash(low, high, 11, FLOW_SEED);
        // The octets after the id (packet number, payload) change nothing.
        assert_eq!(connection_id_hash(low, high | 0xffff_ffff_ff00_0000, 11, FLOW_SEED), h);
        // Each octet of the id does, and so does the seed.
        for octet in 0..11 {
            let flip = 1u64 << (8 * (octet % 8));
            let (l, hi) = if octet < 8 { (low ^ flip, high) } else { (low, high ^ flip) };
            assert_ne!(connection_id_hash(l, hi, 11, FLOW_SEED), h, "octet {octet}");
        }
        assert_ne!(connection_id_hash(low, high, 11, FLOW_SEED ^ 1), h);
        // Ids longer than 16 octets hash their first 16.
        assert_ne!(connection_id_hash(low, high, 16, FLOW_SEED), connection_id_hash(low, high ^ 1 << 63, 16, FLOW_SEED));
    }

    #[test]
    fn connection_ids_of_one_server_spread_by_their_nonces() {
        // One server id (octets 1-2), 16,000 random-looking nonces (octets 3-8): 16 buckets.
        let mut buckets = [0u32; 16];
        for n in 0..16_000u64 {
            let nonce = n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 16;
            let low = 0x40 | 0x0a01 << 8 | nonce << 24;
            buckets[(connection_id_hash(low, nonce >> 40, 9, FLOW_SEED) % 16) as usize] += 1;
        }
        for count in buckets {
            assert!((900..1100).contains(&count), "uneven bucket: {count}");
        }
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
    fn flow_hash_spreads_sources_of_either_family_and_follows_the_seed() {
        // 16,000 clients of one /16 (IPv4) or one /64 (IPv6), one port each, over 16 buckets,
        // and how many of 1000 flows keep their low 10 bits under another seed.
        let v4 = |i: u32| FlowKey { src: [u32::from_ne_bytes([10, 1, (i >> 8) as u8, i as u8]), 0, 0, 0], ..key(40000) };
        let v6 = |i: u32| FlowKey {
            src: [0x2001_0db8u32.to_be(), 0, 0, i.to_be()],
            dst: [0x2001_0db8u32.to_be(), 0, 0, 1],
            family: 6,
            ..key(40000)
        };
        for (family, make) in [("v4", &v4 as &dyn Fn(u32) -> FlowKey), ("v6", &v6)] {
            let mut buckets = [0u32; 16];
            for i in 0..16_000 {
                buckets[(flow_hash(&make(i), FLOW_SEED) % 16) as usize] += 1;
            }
            assert!(buckets.iter().all(|n| (900..1100).contains(n)), "{family}: {buckets:?}");
            let kept = (0..1000).filter(|&i| flow_hash(&make(i), 1) & 1023 == flow_hash(&make(i), 2) & 1023).count();
            assert!(kept < 10, "{family}: {kept} of 1000 flows keep their bucket under another seed");
        }
    }

    #[test]
    fn a_source_hash_vip_hashes_the_source_prefix_only() {
        let five_tuple = |k: &FlowKey| maglev_hash(k, 0, FLOW_SEED);
        let source = |k: &FlowKey, len: u8| maglev_hash(k, vip_source_hash_flags(len), FLOW_SEED);
        // Ports, destination and protocol change the 5-tuple's hash, not the source's.
        let other = FlowKey { dst: [0x0a64_0002, 0, 0, 0], dport: 443, proto: 17, ..key(2) };
        assert_ne!(five_tuple(&key(1)), five_tuple(&other));
        assert_eq!(source(&key(1), 32), source(&other, 32));
        assert_eq!(source(&key(1), 32), source_hash(&key(1).src, 4, 32, FLOW_SEED));
        assert_ne!(source(&key(1), 32), maglev_hash(&key(1), vip_source_hash_flags(32), FLOW_SEED ^ 1));
        // The source's bits past the prefix count only under a longer prefix.
        let neighbour = FlowKey { src: [u32::from_ne_bytes([10, 0, 0, 11]), 0, 0, 0], ..key(1) };
        let ten = FlowKey { src: [u32::from_ne_bytes([10, 0, 0, 10]), 0, 0, 0], ..key(1) };
        assert_ne!(source(&ten, 32), source(&neighbour, 32));
        assert_eq!(source(&ten, 24), source(&neighbour, 24));
        // IPv6: a /64 keeps a client's privacy addresses (its interface ids) together.
        let v6 = |iid: u32| FlowKey {
            src: [0x2001_0db8u32.to_be(), 7u32.to_be(), iid.wrapping_mul(0x9e37_79b9), iid],
            family: 6,
            ..key(iid as u16)
        };
        assert!((1..100).all(|i| source(&v6(i), 64) == source(&v6(0), 64)));
        assert!((1..100).all(|i| source(&v6(i), 128) != source(&v6(0), 128)));
    }

    #[test]
    fn source_hashes_spread_clients_of_either_family() {
        let v4 = |i: u32| [u32::from_ne_bytes([10, 1, (i >> 8) as u8, i as u8]), 0, 0, 0];
        let v6 = |i: u32| [0x2001_0db8u32.to_be(), 0, i.to_be(), 0];
        for (family, make, number) in [("v4", &v4 as &dyn Fn(u32) -> [u32; 4], 4), ("v6", &v6, 6)] {
            let mut buckets = [0u32; 16];
            for i in 0..16_000 {
                buckets[(source_hash(&make(i), number, 128, FLOW_SEED) % 16) as usize] += 1;
            }
            assert!(buckets.iter().all(|n| (900..1100).contains(n)), "{family}: {buckets:?}");
        }
    }

    #[test]
    fn addr_hash_seeds_differ() {
        for a in [[1, 2, 3, 4], [1, 0, 0, 0]] {
            assert_ne!(addr_hash(&a, MAGLEV_OFFSET_SEED), addr_hash(&a, MAGLEV_SKIP_SEED));
        }
    }

    #[test]
    fn v6_keys_hash_every_word() {
        let v6 = |word: usize| {
            let mut k = FlowKey { family: 6, ..key(1) };
            k.src[word] = 7;
            flow_hash(&k, FLOW_SEED)
        };
        let hashes: std::collections::BTreeSet<u32> = (0..4).map(v6).collect();
        assert_eq!(hashes.len(), 4);
        assert_ne!(addr_hash(&[1, 0, 0, 0], FLOW_SEED), addr_hash(&[1, 0, 0, 1], FLOW_SEED));
    }

    #[test]
    fn a_flows_two_buckets_spread_independently() {
        // Flows sharing a first bucket spread their second over the table.
        let mask = 1023;
        let seconds: std::collections::BTreeSet<u32> =
            (0..20_000u16).map(|p| flow_hash(&key(p), FLOW_SEED)).filter(|h| h & mask == 5).map(|h| flow_buckets(h, mask).1).collect();
        assert!(seconds.len() >= 10, "{seconds:?}");
    }

    #[test]
    fn vips_of_one_prefix_spread_over_the_filter_and_the_index() {
        // 256 VIPs of a /24 (and of an IPv6 /120) on port 443 in an index of 1024 slots:
        // no home holds more than a few, and nearly every VIP has a filter bit of its own.
        let v4 = (0..256u32).map(|i| [u32::from_ne_bytes([203, 0, 113, i as u8]), 0, 0, 0]);
        let v6 = (0..256u32).map(|i| [0x2001_0db8u32.to_be(), 0, 0, u32::from_ne_bytes([0, 0, 0, i as u8])]);
        for (family, addrs) in [("v4", v4.collect::<std::vec::Vec<_>>()), ("v6", v6.collect())] {
            let mut homes = [0u32; 1024];
            let mut bits = std::collections::BTreeSet::new();
            for a in &addrs {
                let h = vip_addr_hash(a);
                homes[vip_home(h, 443u16.to_be(), 6, 1023) as usize] += 1;
                bits.insert(vip_filter_slot(h));
            }
            assert!(homes.iter().all(|&n| n <= 4), "{family}: a home holds {}", homes.iter().max().unwrap());
            assert!(bits.len() >= 240, "{family}: {} filter bits for 256 addresses", bits.len());
        }
    }

    #[test]
    fn server_ids_of_one_vip_spread_over_the_index() {
        // 1024 consecutive 2-octet ids of one VIP (and the same ids of another VIP) in an
        // index of 2048 slots: no home holds more than a few, and the VIPs' homes differ.
        let id = |n: u16| crate::quic_lb::ServerId::new(&n.to_be_bytes()).unwrap().words();
        let mut homes = [0u32; 2048];
        for n in 0..1024u16 {
            homes[quic_server_home(3, &id(n), 2047) as usize] += 1;
        }
        assert!(homes.iter().all(|&n| n <= 5), "a home holds {}", homes.iter().max().unwrap());
        let moved = (0..1024u16).filter(|&n| quic_server_home(3, &id(n), 2047) != quic_server_home(4, &id(n), 2047)).count();
        assert!(moved > 1000, "{moved} of 1024 ids change home with the VIP");
    }

    #[test]
    fn the_hop_keeps_a_connection_and_spreads_connections() {
        let src = u32::from_ne_bytes([192, 168, 10, 20]);
        let port = 40000u16.to_be();
        assert_eq!(hop_index(src, port, 3), hop_index(src, port, 3));
        assert_eq!(hop_index(src, port, 0), None);
        let mut per_backend = [0u32; 3];
        for p in 0..3000u16 {
            per_backend[hop_index(src, (1024 + p).to_be(), 3).unwrap() as usize] += 1;
        }
        assert!(per_backend.iter().all(|&n| n > 800), "{per_backend:?}");
    }
}
