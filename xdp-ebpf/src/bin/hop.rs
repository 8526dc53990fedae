//! Bench only: the cheapest XDP hop that still delivers a VIP's packets the way the balancer
//! does, to compare it with end to end (`cargo xtask bench --part e2e`): the same IPIP tunnel
//! to the same backends (whose `lbd agent` decapsulates it), but the backend is a stateless
//! hash of the source onto a fixed list and the MACs are fixed. No connection table, no
//! Maglev, no FIB lookup, no counters, IPv4 only; everything else passes. Never loaded by `lbd`.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action::{XDP_PASS, XDP_TX},
    macros::{map, xdp},
    maps::Array,
    programs::XdpContext,
};
use spillway_common::{
    hash::hop_index,
    types::{FAMILY_V4, HOP_BACKENDS, HopConfig, PROTO_TCP},
};
use xdp_ebpf::{
    encap::{self, Macs, Tunnel},
    headers::*,
    packet::at,
};

#[map(name = "spw_hop_cfg")]
static CONFIG: Array<HopConfig> = Array::with_max_entries(1, 0);

#[xdp]
pub fn spillway_hop(ctx: XdpContext) -> u32 {
    hop(&ctx).unwrap_or(XDP_PASS)
}

#[inline(always)]
fn hop(ctx: &XdpContext) -> Option<u32> {
    let cfg = CONFIG.get(0)?;
    let eth = unsafe { *at::<EthHdr>(ctx, 0)? };
    let ip = unsafe { *at::<Ipv4Hdr>(ctx, ETH_LEN)? };
    // Options or another protocol: not the load's packets.
    if eth.proto != ETH_P_IPV4 || ip.ver_ihl != 0x45 || ip.proto != PROTO_TCP || ip.dst != cfg.vip {
        return None;
    }
    let ports = unsafe { *at::<Ports>(ctx, ETH_LEN + IPV4_LEN)? };
    if ports.dst != cfg.port {
        return None;
    }
    let backend = cfg.backends.get(hop_index(ip.src, ports.src, cfg.count)? as usize % HOP_BACKENDS)?;
    let tunnel = Tunnel {
        family: FAMILY_V4,
        src: [cfg.src, 0, 0, 0],
        dst: [backend.addr, 0, 0, 0],
        inner_family: FAMILY_V4,
        inner_len: usize::from(u16::from_be(ip.tot_len)),
        tos: ip.tos,
        flow_hash: 0,
        gue_port: None,
    };
    encap::push(ctx, ETH_LEN, &tunnel, &Macs { src: cfg.src_mac, dst: backend.mac }).ok()?;
    Some(XDP_TX)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
