//! Per-source rate limits of what a source may make the balancer do beside opening new
//! flows: "packet too big" answers (`ptb_program.rs`), echo answers (`echo_program.rs`) and
//! fragment records (`fragment_program.rs`). One GCRA bucket (`limits::gcra_admit`) per
//! source prefix, in an LRU of the program's own; the answers also share one bucket for all.

use aya_ebpf::maps::{Array, LruHashMap};
use spillway_common::{
    prefix::masked,
    types::{AddrKey, Bucket, FAMILY_V4, Rate},
};

use crate::limits::gcra_admit;

/// Takes one from the bucket of `src`'s prefix (`family`; IPv6 masked to `prefix_v6`,
/// an IPv4 address is one source) in `buckets`, an LRU shared by CPUs: the rate limits of
/// what a source may make the balancer do beside new flows ("packet too big" answers,
/// fragment records). A source the LRU forgot starts with a full bucket.
#[inline(always)]
pub fn admit(buckets: &LruHashMap<AddrKey, Bucket>, src: &[u32; 4], family: u8, prefix_v6: u8, rate: &Rate, now: u64) -> bool {
    let prefix = if family == FAMILY_V4 { 32 } else { prefix_v6 };
    let source = AddrKey { addr: masked(src, prefix), family, _pad: [0; 3] };
    if buckets.get_ptr_mut(&source).is_none() {
        // BPF_NOEXIST: of two CPUs adding the source at once, the second keeps the first's.
        let _ = buckets.insert(&source, &Bucket::default(), 1);
    }
    let Some(bucket) = buckets.get_ptr_mut(&source) else {
        return false;
    };
    // SAFETY: a live map value, shared by CPUs (the bucket's adds are atomic).
    gcra_admit(unsafe { &mut *bucket }, rate, now)
}

/// An answer to `src` (`family`) is due by the rates: one is taken from the bucket of its
/// prefix in `sources` (as [`admit`] does), then from `total`'s one bucket (slot 0).
#[inline(always)]
pub fn admit_answer(
    sources: &LruHashMap<AddrKey, Bucket>,
    total: &Array<Bucket>,
    (src, family, prefix_v6): (&[u32; 4], u8, u8),
    (per_source, all): (&Rate, &Rate),
    now: u64,
) -> bool {
    // SAFETY: a live map value, shared by CPUs (the bucket's adds are atomic).
    admit(sources, src, family, prefix_v6, per_source, now)
        && total.get_ptr_mut(0).is_some_and(|b| gcra_admit(unsafe { &mut *b }, all, now))
}

/// `src` (`family`) is an address a host may have: not unspecified, loopback, multicast or
/// (IPv4) reserved or broadcast. An answer to any other would go to a group, to this host,
/// or nowhere.
#[inline(always)]
pub fn is_host(src: &[u32; 4], family: u8) -> bool {
    let first = src[0].to_ne_bytes()[0];
    if family == FAMILY_V4 {
        // 0/8, 127/8, and multicast and reserved (224/4, 240/4, broadcast).
        first != 0 && first != 127 && first < 224
    } else {
        let unspecified_or_loopback = src[0] == 0 && src[1] == 0 && src[2] == 0 && u32::from_be(src[3]) <= 1;
        first != 0xff && !unspecified_or_loopback
    }
}
