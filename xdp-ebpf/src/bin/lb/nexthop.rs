//! Next hop per backend: `bpf_fib_lookup`, cached per CPU for `NEXTHOP_CACHE_TTL_NS`.
//! The lookup is the single most expensive step of the path; routes and neighbours change
//! rarely, and the TTL bounds how long a change goes unseen.

use aya_ebpf::programs::XdpContext;
use spillway_common::{
    limits::NEXTHOP_CACHE_TTL_NS,
    types::{BackendInfo, CachedNextHop},
};
use xdp_ebpf::{
    encap::Macs,
    fib::{self, NextHop},
};

use crate::maps::NEXTHOP_CACHE;

#[inline(always)]
pub fn resolve(ctx: &XdpContext, id: u32, be: &BackendInfo, src: &[u32; 4], outer_len: u16, now: u64) -> NextHop {
    let Some(slot) = NEXTHOP_CACHE.get_ptr_mut(id) else {
        return fib::lookup(ctx, be.family, src, &be.addr, outer_len);
    };
    // SAFETY: a per-CPU slot; nothing else writes it while we run.
    let cached = unsafe { &mut *slot };
    if cached.ifindex != 0 && cached.generation == be.generation && now < cached.expires_ns {
        if outer_len as u32 > cached.mtu {
            return NextHop::FragNeeded;
        }
        return NextHop::Resolved { ifindex: cached.ifindex, macs: Macs { src: cached.src_mac, dst: cached.dst_mac } };
    }
    let hop = fib::lookup(ctx, be.family, src, &be.addr, outer_len);
    if let NextHop::Resolved { ifindex, macs } = &hop
        && let Some(mtu) = fib::device_mtu(ctx, *ifindex)
    {
        *cached = CachedNextHop {
            expires_ns: now + NEXTHOP_CACHE_TTL_NS,
            ifindex: *ifindex,
            generation: be.generation,
            mtu,
            src_mac: macs.src,
            dst_mac: macs.dst,
        };
    }
    hop
}
