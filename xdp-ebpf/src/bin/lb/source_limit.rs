//! Per-source rate limits of what a source may make the balancer do beside opening new
//! flows: "packet too big" answers (`ptb_program.rs`) and fragment records
//! (`fragment_program.rs`). One GCRA bucket (`limits::gcra_admit`) per source prefix, in an
//! LRU of the program's own.

use aya_ebpf::maps::LruHashMap;
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
