//! Next hop per backend: `bpf_fib_lookup`, cached per CPU for `NEXTHOP_CACHE_TTL_NS`.
//! The lookup is the single most expensive step of the path; routes and neighbours change
//! rarely, and the TTL bounds how long a change goes unseen.
//!
//! A cache miss is a BPF global function ([`spillway_next_hop`]): verified once on its own
//! rather than once per state the path brings to it (the lookup's five outcomes, each walked
//! through the encapsulation after it). Its lookup's 64-byte parameters are in a per-CPU map:
//! the frames of a call chain share 512 bytes of stack, and the balancer's takes most. Its
//! ~20 ns call (ARCHITECTURE.md, "verifier budget") is paid once per backend per CPU per TTL.

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use spillway_common::{
    limits::NEXTHOP_CACHE_TTL_NS,
    types::{BackendInfo, CachedNextHop},
};
use xdp_ebpf::{
    encap::Macs,
    fib::{self, NextHop},
};

use crate::maps::{FIB_PARAMS, NEXTHOP_CACHE};

/// [`spillway_next_hop`]'s results (the low byte; `FRAG_NEEDED` carries the route's MTU
/// above it); `RESOLVED`: the hop is in the backend's cache slot.
const RESOLVED: u32 = 0;
const NO_NEIGH: u32 = 1;
const FRAG_NEEDED: u32 = 2;
const FORWARDING_DISABLED: u32 = 3;
const NO_ROUTE: u32 = 4;

#[inline(always)]
pub fn resolve(ctx: &XdpContext, id: u32, be: &BackendInfo, src: &[u32; 4], outer_len: u16, now: u64) -> NextHop {
    // Backend ids index the cache's slots (both are sized by the capacity): always there.
    let Some(slot) = NEXTHOP_CACHE.get_ptr_mut(id) else {
        return NextHop::NoRoute;
    };
    // SAFETY: a per-CPU slot; nothing else writes it while we run.
    let cached = unsafe { &*slot };
    if !(cached.ifindex != 0 && cached.generation == be.generation && now < cached.expires_ns) {
        let looked_up = spillway_next_hop(ctx.ctx, id as u64 | (outer_len as u64) << 32, be, src, now);
        match looked_up & 0xff {
            RESOLVED => {}
            NO_NEIGH => return NextHop::NoNeigh,
            FRAG_NEEDED => return NextHop::FragNeeded { mtu: looked_up >> 8 },
            FORWARDING_DISABLED => return NextHop::ForwardingDisabled,
            _ => return NextHop::NoRoute,
        }
        // The kernel checked the MTU itself.
        let cached = unsafe { &*slot };
        return NextHop::Resolved { ifindex: cached.ifindex, macs: Macs { src: cached.src_mac, dst: cached.dst_mac } };
    }
    if outer_len as u32 > cached.mtu {
        return NextHop::FragNeeded { mtu: cached.mtu };
    }
    NextHop::Resolved { ifindex: cached.ifindex, macs: Macs { src: cached.src_mac, dst: cached.dst_mac } }
}

/// The FIB's next hop for backend `be` (id in the low 32 bits of `id_len`, the outer
/// packet's length above them) from `src`, into its cache slot when resolved. A resolved hop
/// whose device's MTU is unknown is stored already expired, so the caller can read it but
/// the next packet looks it up again. The pointers are the caller's own values; the verifier
/// assumes a global function's pointer may be NULL, so that is checked.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn spillway_next_hop(ctx: *mut xdp_md, id_len: u64, be: *const BackendInfo, src: *const [u32; 4], now: u64) -> u32 {
    let (id, outer_len) = (id_len as u32, (id_len >> 32) as u16);
    // SAFETY: see above.
    let (Some(be), Some(src), Some(slot)) = (unsafe { be.as_ref() }, unsafe { src.as_ref() }, NEXTHOP_CACHE.get_ptr_mut(id)) else {
        return NO_ROUTE;
    };
    let Some(params) = FIB_PARAMS.get_ptr_mut(0) else {
        return NO_ROUTE;
    };
    // SAFETY: a per-CPU slot, used by nothing else; all-zero is a valid value.
    let params = unsafe {
        *params = core::mem::zeroed();
        &mut *params
    };
    let ctx = XdpContext::new(ctx);
    params.ifindex = ctx.ingress_ifindex() as u32;
    let (ifindex, macs) = match fib::lookup_in(ctx.ctx.cast(), params, be.family, src, &be.addr, outer_len).0 {
        NextHop::Resolved { ifindex, macs } => (ifindex, macs),
        NextHop::NoNeigh => return NO_NEIGH,
        NextHop::FragNeeded { mtu } => return FRAG_NEEDED | (mtu & 0xffff) << 8,
        NextHop::ForwardingDisabled => return FORWARDING_DISABLED,
        NextHop::NoRoute => return NO_ROUTE,
    };
    let mtu = fib::device_mtu(&ctx, ifindex);
    // SAFETY: a per-CPU slot; nothing else writes it while we run. Field by field: a whole
    // value would be built on this frame first, and the chain's stack has no room for it.
    let slot: &mut CachedNextHop = unsafe { &mut *slot };
    slot.expires_ns = mtu.map_or(0, |_| now + NEXTHOP_CACHE_TTL_NS);
    slot.ifindex = ifindex;
    slot.generation = be.generation;
    slot.mtu = mtu.unwrap_or(0);
    slot.src_mac = macs.src;
    slot.dst_mac = macs.dst;
    RESOLVED
}
