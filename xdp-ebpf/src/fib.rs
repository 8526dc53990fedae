//! Next hop for the outer packet from the kernel's routes and neighbours (`bpf_fib_lookup`).

use aya_ebpf::{
    bindings::bpf_fib_lookup as FibParams,
    cty::c_void,
    helpers::{bpf_check_mtu, bpf_fib_lookup},
    programs::XdpContext,
};
use spillway_common::types::{FAMILY_V4, PROTO_IPIP, PROTO_IPV6};

use crate::encap::Macs;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
// enum bpf_fib_lookup_ret (include/uapi/linux/bpf.h).
const RET_SUCCESS: i64 = 0;
const RET_FWD_DISABLED: i64 = 5;
const RET_NO_NEIGH: i64 = 7;
const RET_FRAG_NEEDED: i64 = 8;

pub enum NextHop {
    /// Resolved: send out of `ifindex` with these MACs.
    Resolved { ifindex: u32, macs: Macs },
    /// Routed, but the neighbour is not resolved yet: the kernel must send it.
    NoNeigh,
    /// The outer packet exceeds the egress MTU, which is `mtu`.
    FragNeeded { mtu: u32 },
    /// The ingress interface does not forward (its `forwarding` sysctl is 0): a host
    /// setting, not a route, so it is told apart.
    ForwardingDisabled,
    /// No usable route (unreachable, blackhole, prohibited, ...).
    NoRoute,
}

/// Looks up the route for an outer packet of `tot_len` bytes (the kernel also checks the
/// egress MTU against it) for any program context (`ctx`: its `xdp_md` or `__sk_buff`), as
/// for a packet arriving on `ingress_ifindex`. Also returns the egress interface the FIB
/// chose, which is known when the neighbour is not.
#[inline(always)]
pub fn lookup_from(ctx: *mut c_void, ingress_ifindex: u32, family: u8, src: &[u32; 4], dst: &[u32; 4], tot_len: u16) -> (NextHop, u32) {
    // SAFETY: the struct is plain integers and unions of integers; all-zero is valid.
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.ifindex = ingress_ifindex;
    lookup_in(ctx, &mut p, family, src, dst, tot_len)
}

/// [`lookup_from`] with the helper's 64-byte parameters in `p` (a map value, to keep them off
/// a small stack), its `ifindex` set to the ingress interface and every other field zero.
#[inline(always)]
pub fn lookup_in(ctx: *mut c_void, p: &mut FibParams, family: u8, src: &[u32; 4], dst: &[u32; 4], tot_len: u16) -> (NextHop, u32) {
    p.__bindgen_anon_1.tot_len = tot_len;
    if family == FAMILY_V4 {
        p.family = AF_INET;
        p.l4_protocol = PROTO_IPIP;
        p.__bindgen_anon_3.ipv4_src = src[0];
        p.__bindgen_anon_4.ipv4_dst = dst[0];
    } else {
        p.family = AF_INET6;
        p.l4_protocol = PROTO_IPV6;
        p.__bindgen_anon_3.ipv6_src = *src;
        p.__bindgen_anon_4.ipv6_dst = *dst;
    }
    let ret = unsafe { bpf_fib_lookup(ctx, p, core::mem::size_of::<FibParams>() as i32, 0) };
    let hop = match ret {
        RET_SUCCESS => {
            let m = unsafe { p.__bindgen_anon_6.__bindgen_anon_2 };
            NextHop::Resolved { ifindex: p.ifindex, macs: Macs { src: m.smac, dst: m.dmac } }
        }
        RET_NO_NEIGH => NextHop::NoNeigh,
        // The kernel writes the route's MTU over `tot_len` (`mtu_result`, a union).
        RET_FRAG_NEEDED => NextHop::FragNeeded { mtu: unsafe { p.__bindgen_anon_1.mtu_result } as u32 },
        RET_FWD_DISABLED => NextHop::ForwardingDisabled,
        _ => NextHop::NoRoute,
    };
    (hop, p.ifindex)
}

/// The MTU of interface `ifindex`, or `None` if it is gone.
#[inline(always)]
pub fn device_mtu(ctx: &XdpContext, ifindex: u32) -> Option<u32> {
    // A 1-byte length always fits; the helper reports the device's MTU either way.
    let mut mtu: u32 = 1;
    let ret = unsafe { bpf_check_mtu(ctx.ctx.cast(), ifindex, &mut mtu, 0, 0) };
    if ret < 0 { None } else { Some(mtu) }
}
