//! The balancer: parse, find the VIP, choose a backend, encapsulate, send.
//!
//! Every packet ends in exactly one [`Reason`], counted once in the entry point. Anything
//! that is not VIP traffic is XDP_PASS, so the host stays reachable; XDP_ABORTED is never
//! returned.
#![no_std]
#![no_main]

mod limits;
mod maps;
mod nexthop;
mod probe;
mod second_chance;
mod select;
mod stats;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX},
    helpers::bpf_ktime_get_coarse_ns,
    macros::xdp,
    programs::XdpContext,
};
use spillway_common::{
    hash::{flow_hash, vip_filter_slot},
    types::{BackendInfo, CFG_F_STATIC_NEXTHOP, FlowKey, LbConfig, PROTO_TCP, Reason, VipKey, VipMeta},
};
use xdp_ebpf::{
    encap::{self, Macs, Tunnel},
    fib::NextHop,
    headers::EthHdr,
    packet,
    parse::{Layout, Parsed, parse},
};

use crate::{
    maps::{CONFIG, TX_PORTS, VIP_ADDRS, VIP_FILTER, VIPS},
    select::Choice,
};

#[xdp]
pub fn spillway_lb(ctx: XdpContext) -> u32 {
    let (action, reason) = balance(&ctx);
    stats::reason(reason);
    action
}

#[inline(always)]
fn balance(ctx: &XdpContext) -> (u32, Reason) {
    let (key, layout, icmp_error, syn) = match parse(ctx) {
        Parsed::Flow { key, layout, icmp_error, syn } => (key, layout, icmp_error, syn),
        Parsed::NotIp => return (XDP_PASS, Reason::PassNotIp),
        Parsed::Malformed => return (XDP_PASS, Reason::PassMalformed),
        Parsed::Other => return (XDP_PASS, Reason::PassNotVip),
        Parsed::Fragment(addr) => {
            return if VIP_ADDRS.get_ptr(&addr).is_some() { (XDP_DROP, Reason::DropFragment) } else { (XDP_PASS, Reason::PassNotVip) };
        }
    };
    if !maybe_vip(&key.dst) {
        return (XDP_PASS, Reason::PassNotVip);
    }
    // Slot 0 of an array always exists; the check is for the verifier.
    let Some(cfg) = CONFIG.get(0) else {
        return (XDP_PASS, Reason::PassNotVip);
    };
    let frame_len = packet::len(ctx);
    let hash = flow_hash(&key, cfg.flow_seed);
    // Coarse (tick-resolution) time is enough for second-scale timeouts and costs no
    // clocksource read.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // An established flow skips the VIP lookup: its backend's entry names the VIP, and a
    // removed VIP's backends are freed, which invalidates its flows. A SYN is a new
    // connection even on a known tuple (a client reusing a port after a reset), so it always
    // goes through the limits and is placed afresh: the tuple's old backend may have been
    // ejected or drained since (a retransmitted SYN lands on the same backend as the first
    // while the table is unchanged).
    let known = if syn { None } else { select::established(&key, now, cfg, icmp_error) };
    let mut second = None;
    let choice = match known {
        Some(choice) => choice,
        None => {
            let Some(vip) = find_vip(&key) else {
                return (XDP_PASS, Reason::PassNotVip);
            };
            let moved = !syn && !icmp_error && key.proto == PROTO_TCP;
            if let Some((first, other)) = if moved { second_chance::candidates(&vip, hash) } else { None } {
                second = Some(other.backend);
                first
            } else {
                // ICMP errors belong to an existing flow: they are never limited.
                if !icmp_error && let Err(reason) = limits::admit_new_flow(&key, vip.id, now) {
                    stats::vip(vip.id, frame_len);
                    return (XDP_DROP, reason);
                }
                let Some(choice) = select::new_flow(&key, &vip, hash, now, icmp_error) else {
                    stats::vip(vip.id, frame_len);
                    return (XDP_DROP, Reason::DropNoBackend);
                };
                choice
            }
        }
    };
    stats::vip(choice.backend.vip_id, frame_len);
    let verdict = forward(ctx, &key, &layout, &choice, second.as_ref(), hash, cfg, now);
    if matches!(verdict.1, Reason::Tx | Reason::Redirect | Reason::KernelNoNeigh | Reason::KernelNoTxPort) {
        stats::backend(choice.id, frame_len);
        if second.is_some() {
            second_chance::count();
        }
    }
    verdict
}

/// False only for addresses no VIP uses (one inlined array read).
#[inline(always)]
fn maybe_vip(addr: &[u32; 4]) -> bool {
    let (word, bit) = vip_filter_slot(addr);
    VIP_FILTER.get(word).is_some_and(|w| w & bit != 0)
}

/// Exact (address, port, protocol) first, then the address's "any port" VIP.
#[inline(always)]
fn find_vip(key: &FlowKey) -> Option<VipMeta> {
    let mut vip = VipKey { addr: key.dst, port: key.dport, proto: key.proto, family: key.family };
    if let Some(meta) = VIPS.get_ptr(&vip) {
        return Some(unsafe { *meta });
    }
    vip.port = 0;
    VIPS.get_ptr(&vip).map(|meta| unsafe { *meta })
}

#[inline(always)]
fn forward(
    ctx: &XdpContext,
    key: &FlowKey,
    layout: &Layout,
    choice: &Choice,
    second: Option<&BackendInfo>,
    hash: u32,
    cfg: &LbConfig,
    now: u64,
) -> (u32, Reason) {
    let be = &choice.backend;
    // A second candidate's tunnel rides inside the tunnel to the first (`second_chance`).
    let inner_family = second.map_or(key.family, |s| s.family);
    if !encap::supported(be.family, inner_family) || !encap::supported(inner_family, key.family) {
        return (XDP_DROP, Reason::DropEncapFailed);
    }
    let Some(eth) = packet::at::<EthHdr>(ctx, 0) else {
        return (XDP_PASS, Reason::PassMalformed);
    };
    // The frame arrived addressed to us: these MACs make the kernel accept it if we must
    // hand the encapsulated packet over.
    let arrived = unsafe { Macs { src: (*eth).src, dst: (*eth).dst } };
    let middle = second.map(|s| Tunnel {
        family: s.family,
        src: cfg.outer_source(s.family, hash),
        dst: s.addr,
        inner_family: key.family,
        inner_len: layout.l3_len,
        tos: layout.tos,
        flow_hash: hash,
    });
    let inner_len = layout.l3_len + middle.as_ref().map_or(0, |m| encap::outer_len(m.family));
    let tunnel = Tunnel {
        family: be.family,
        src: cfg.outer_source(be.family, hash),
        dst: be.addr,
        inner_family,
        inner_len,
        tos: layout.tos,
        flow_hash: hash,
    };
    let outer_len = (encap::outer_len(be.family) + inner_len) as u16;
    let hop = if cfg.flags & CFG_F_STATIC_NEXTHOP != 0 {
        NextHop::Resolved { ifindex: cfg.static_ifindex, macs: Macs { src: cfg.static_src_mac, dst: cfg.static_dst_mac } }
    } else {
        nexthop::resolve(ctx, choice.id, be, &tunnel.src, outer_len, now)
    };
    match hop {
        NextHop::FragNeeded => (XDP_DROP, Reason::DropOversize),
        NextHop::NoRoute => (XDP_DROP, Reason::DropNoRoute),
        NextHop::ForwardingDisabled => (XDP_DROP, Reason::DropForwardingDisabled),
        NextHop::NoNeigh => match push(ctx, layout.l2_len, &tunnel, middle.as_ref(), &arrived) {
            Ok(()) => (XDP_PASS, Reason::KernelNoNeigh),
            Err(()) => (XDP_DROP, Reason::DropEncapFailed),
        },
        NextHop::Resolved { ifindex, macs } => {
            if push(ctx, layout.l2_len, &tunnel, middle.as_ref(), &macs).is_err() {
                return (XDP_DROP, Reason::DropEncapFailed);
            }
            if ifindex as usize == ctx.ingress_ifindex() {
                return (XDP_TX, Reason::Tx);
            }
            match TX_PORTS.redirect(ifindex, XDP_PASS as u64) {
                Ok(_) => (XDP_REDIRECT, Reason::Redirect),
                Err(_) => hand_to_kernel(ctx, &arrived),
            }
        }
    }
}

/// The tunnel to the backend, with the one to the second candidate inside if there is one.
#[inline(always)]
fn push(ctx: &XdpContext, l2_len: usize, tunnel: &Tunnel, middle: Option<&Tunnel>, macs: &Macs) -> Result<(), ()> {
    match middle {
        None => encap::push(ctx, l2_len, tunnel, macs),
        Some(middle) => encap::push_nested(ctx, l2_len, tunnel, middle, macs),
    }
}

/// The egress is not in the redirect map: restore the MACs the frame arrived with so the
/// kernel accepts and forwards the encapsulated packet.
#[inline(always)]
fn hand_to_kernel(ctx: &XdpContext, arrived: &Macs) -> (u32, Reason) {
    match packet::at_mut::<EthHdr>(ctx, 0) {
        Some(eth) => {
            unsafe {
                (*eth).src = arrived.src;
                (*eth).dst = arrived.dst;
            }
            (XDP_PASS, Reason::KernelNoTxPort)
        }
        None => (XDP_DROP, Reason::DropEncapFailed),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable: the program has no panicking paths (no indexing, unwrap or division by
    // a possibly-zero value), and the verifier would reject the loop below anyway.
    loop {}
}
