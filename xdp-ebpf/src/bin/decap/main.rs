//! Backend side: strip the IPIP/IP6IP6/IPv4-in-IPv6 header addressed to this host and pass
//! the inner packet to the stack. Needed because many kernels (this one included) have no
//! ipip module. A second-chance packet (a tunnel inside the tunnel) is kept when this host
//! has its connection and sent on to the other backend otherwise (`second_chance`).
//! Everything else passes untouched.
#![no_std]
#![no_main]

mod second_chance;

use aya_ebpf::{
    bindings::xdp_action::{XDP_PASS, XDP_TX},
    helpers::bpf_xdp_adjust_head,
    macros::{map, xdp},
    maps::{HashMap, PerCpuArray},
    programs::XdpContext,
};
use spillway_common::{
    limits::DEFAULT_LOCAL_ADDRS,
    types::{AddrKey, DecapReason, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6},
};
use xdp_ebpf::{
    headers::*,
    packet::{at, at_mut, len},
};

/// Addresses this host decapsulates for (filled by `lbd agent`).
#[map(name = "spw_local_addrs")]
/// Sized by the agent at load (`--max-local-addrs`).
static LOCAL_ADDRS: HashMap<AddrKey, u32> = HashMap::with_max_entries(DEFAULT_LOCAL_ADDRS, 0);

#[map(name = "spw_decap_rsn")]
static REASONS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DecapReason::COUNT, 0);

#[xdp]
pub fn spillway_decap(ctx: XdpContext) -> u32 {
    let reason = decap(&ctx);
    if let Some(count) = REASONS.get_ptr_mut(reason as u32) {
        unsafe { *count += 1 };
    }
    if reason == DecapReason::SecondChanceForwarded { XDP_TX } else { XDP_PASS }
}

struct Outer {
    len: usize,
    inner_ether_type: u16,
}

#[inline(always)]
fn decap(ctx: &XdpContext) -> DecapReason {
    let Some(eth) = at::<EthHdr>(ctx, 0) else {
        return DecapReason::PassMalformed;
    };
    let eth = unsafe { *eth };
    let mut ether_type = eth.proto;
    let mut vlan_tci = None;
    let mut l2_len = ETH_LEN;
    if ether_type == ETH_P_8021Q {
        let Some(vlan) = at::<VlanHdr>(ctx, ETH_LEN) else {
            return DecapReason::PassMalformed;
        };
        let vlan = unsafe { *vlan };
        ether_type = vlan.proto;
        vlan_tci = Some(vlan.tci);
        l2_len += VLAN_LEN;
    }
    let outer = if ether_type == ETH_P_IPV4 {
        outer_v4(ctx, l2_len)
    } else if ether_type == ETH_P_IPV6 {
        outer_v6(ctx, l2_len)
    } else {
        Err(DecapReason::PassNotTunnel)
    };
    let outer = match outer {
        Ok(outer) => outer,
        Err(reason) => return reason,
    };
    let (strip, ether_type, eth, reason) = match second_chance::nested(ctx, l2_len + outer.len, outer.inner_ether_type) {
        None => (outer.len, outer.inner_ether_type, eth, DecapReason::Decapsulated),
        Some(n) if n.local => (outer.len + n.middle_len, n.inner_ether_type, eth, DecapReason::SecondChanceLocal),
        // Back to the hop it came from (a router or the balancer), which routes the inner
        // tunnel to the other backend: the backend needs neither forwarding nor a route.
        Some(_) => {
            (outer.len, outer.inner_ether_type, EthHdr { dst: eth.src, src: eth.dst, proto: eth.proto }, DecapReason::SecondChanceForwarded)
        }
    };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, strip as i32) } != 0 {
        // Never expected (the headers were just read from this frame): logged with its size.
        aya_log_ebpf::warn!(ctx, "event=decap_adjust_head_failed strip_bytes={}", strip as u32);
        return DecapReason::PassMalformed;
    }
    // Rewrite the L2 header in front of the inner packet.
    match vlan_tci {
        None => {
            let Some(new_eth) = at_mut::<EthHdr>(ctx, 0) else {
                return DecapReason::PassMalformed;
            };
            unsafe { *new_eth = EthHdr { proto: ether_type, ..eth } };
        }
        Some(tci) => {
            let (Some(new_eth), Some(new_vlan)) = (at_mut::<EthHdr>(ctx, 0), at_mut::<VlanHdr>(ctx, ETH_LEN)) else {
                return DecapReason::PassMalformed;
            };
            unsafe {
                *new_eth = eth;
                *new_vlan = VlanHdr { tci, proto: ether_type };
            }
        }
    }
    reason
}

#[inline(always)]
fn inner_ether_type(proto: u8) -> Option<u16> {
    match proto {
        PROTO_IPIP => Some(ETH_P_IPV4),
        PROTO_IPV6 => Some(ETH_P_IPV6),
        _ => None,
    }
}

#[inline(always)]
fn outer_v4(ctx: &XdpContext, l3: usize) -> Result<Outer, DecapReason> {
    let ip = unsafe { *at::<Ipv4Hdr>(ctx, l3).ok_or(DecapReason::PassMalformed)? };
    let ihl = ((ip.ver_ihl & 0x0f) as usize) * 4;
    let tot_len = u16::from_be(ip.tot_len) as usize;
    if ip.ver_ihl >> 4 != 4 || ihl < IPV4_LEN || tot_len < ihl || l3 + tot_len > len(ctx) {
        return Err(DecapReason::PassMalformed);
    }
    // Fragmented tunnels are left to the kernel, which reassembles nothing here and drops.
    if u16::from_be(ip.frag_off) & IPV4_MF_OFFSET_MASK != 0 {
        return Err(DecapReason::PassNotTunnel);
    }
    let inner_ether_type = inner_ether_type(ip.proto).ok_or(DecapReason::PassNotTunnel)?;
    local(AddrKey { addr: [ip.dst, 0, 0, 0], family: FAMILY_V4, _pad: [0; 3] })?;
    Ok(Outer { len: ihl, inner_ether_type })
}

#[inline(always)]
fn outer_v6(ctx: &XdpContext, l3: usize) -> Result<Outer, DecapReason> {
    let ip = unsafe { *at::<Ipv6Hdr>(ctx, l3).ok_or(DecapReason::PassMalformed)? };
    if u32::from_be(ip.vtc_flow) >> 28 != 6 || l3 + IPV6_LEN + u16::from_be(ip.payload_len) as usize > len(ctx) {
        return Err(DecapReason::PassMalformed);
    }
    let inner_ether_type = inner_ether_type(ip.next_hdr).ok_or(DecapReason::PassNotTunnel)?;
    local(AddrKey { addr: ip.dst, family: FAMILY_V6, _pad: [0; 3] })?;
    Ok(Outer { len: IPV6_LEN, inner_ether_type })
}

#[inline(always)]
fn local(addr: AddrKey) -> Result<(), DecapReason> {
    LOCAL_ADDRS.get_ptr(&addr).map(|_| ()).ok_or(DecapReason::PassNotLocal)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
