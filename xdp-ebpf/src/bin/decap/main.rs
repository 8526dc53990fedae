//! Backend side: strip the IPIP/IP6IP6/IPv4-in-IPv6 header (or the same with GUE's UDP
//! header, on the configured port) of a balancer's tunnel addressed to this host and pass
//! the inner packet to the stack. Needed because many kernels (this
//! one included) have no ipip module. A second-chance packet (a tunnel inside the tunnel) is
//! kept when this host has its connection and sent on to the other backend otherwise
//! (`second_chance`). Everything else passes untouched.
//!
//! A tunnel is a way into the host past its firewall's view of the source, so it is taken
//! only from the balancers (`spw_allow_from`, the outer source) and only for a packet this
//! host would accept anyway (the inner destination is one of its addresses); a tunnel to a
//! loopback address is never one of ours. What fails is dropped and counted.
#![no_std]
#![no_main]

mod second_chance;

use aya_ebpf::{
    bindings::xdp_action::{XDP_DROP, XDP_PASS, XDP_TX},
    helpers::bpf_xdp_adjust_head,
    macros::{map, xdp},
    maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use spillway_common::{
    limits::{DEFAULT_LOCAL_ADDRS, MAX_ALLOW_FROM},
    types::{ALLOW_KEY_FAMILY_BITS, AddrKey, AllowKey, DecapConfig, DecapReason, FAMILY_V4, FAMILY_V6, PROTO_IPIP, PROTO_IPV6, PROTO_UDP},
};
use xdp_ebpf::{
    headers::*,
    packet::{at, at_mut, len},
};

/// Addresses this host decapsulates for (filled by `lbd agent`).
#[map(name = "spw_local_addrs")]
/// Sized by the agent at load (`--max-local-addrs`).
static LOCAL_ADDRS: HashMap<AddrKey, u32> = HashMap::with_max_entries(DEFAULT_LOCAL_ADDRS, 0);

/// The balancers' outer sources (`lbd agent --allow-from`), by longest prefix.
#[map(name = "spw_allow_from")]
static ALLOW_FROM: LpmTrie<AllowKey, u32> = LpmTrie::with_max_entries(MAX_ALLOW_FROM, 0);

/// The GUE port (`lbd agent --gue-port`).
#[map(name = "spw_decap_cfg")]
static CONFIG: Array<DecapConfig> = Array::with_max_entries(1, 0);

#[map(name = "spw_decap_rsn")]
static REASONS: PerCpuArray<u64> = PerCpuArray::with_max_entries(DecapReason::COUNT, 0);

#[xdp]
pub fn spillway_decap(ctx: XdpContext) -> u32 {
    let reason = decap(&ctx);
    if let Some(count) = REASONS.get_ptr_mut(reason as u32) {
        unsafe { *count += 1 };
    }
    match reason {
        DecapReason::SecondChanceForwarded => XDP_TX,
        DecapReason::DropNotAllowed
        | DecapReason::DropInnerNotLocal
        | DecapReason::DropSecondChanceSource
        | DecapReason::DropSecondChanceTtl => XDP_DROP,
        _ => XDP_PASS,
    }
}

/// The fixed part of an IP header: what the checks read of the outer, middle and inner
/// headers.
pub struct Ip {
    pub family: u8,
    /// Header length (IPv4: with its options; IPv6: the fixed header only).
    pub len: usize,
    /// IPv4 protocol or IPv6 next header.
    pub proto: u8,
    /// TTL or hop limit.
    pub ttl: u8,
    /// An IPv4 fragment (more fragments, or an offset).
    pub fragment: bool,
    pub src: [u32; 4],
    pub dst: [u32; 4],
}

/// The IP header of an `ether_type` packet at `off`, if whole and consistent with the frame.
#[inline(always)]
pub fn ip_at(ctx: &XdpContext, off: usize, ether_type: u16) -> Option<Ip> {
    if ether_type == ETH_P_IPV4 {
        let ip = unsafe { *at::<Ipv4Hdr>(ctx, off)? };
        let ihl = ((ip.ver_ihl & 0x0f) as usize) * 4;
        let tot_len = u16::from_be(ip.tot_len) as usize;
        if ip.ver_ihl >> 4 != 4 || ihl < IPV4_LEN || tot_len < ihl || off + tot_len > len(ctx) {
            return None;
        }
        let fragment = u16::from_be(ip.frag_off) & IPV4_MF_OFFSET_MASK != 0;
        Some(Ip { family: FAMILY_V4, len: ihl, proto: ip.proto, ttl: ip.ttl, fragment, src: [ip.src, 0, 0, 0], dst: [ip.dst, 0, 0, 0] })
    } else if ether_type == ETH_P_IPV6 {
        let ip = unsafe { *at::<Ipv6Hdr>(ctx, off)? };
        if u32::from_be(ip.vtc_flow) >> 28 != 6 || off + IPV6_LEN + u16::from_be(ip.payload_len) as usize > len(ctx) {
            return None;
        }
        Some(Ip { family: FAMILY_V6, len: IPV6_LEN, proto: ip.next_hdr, ttl: ip.hop_limit, fragment: false, src: ip.src, dst: ip.dst })
    } else {
        None
    }
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
    // Slot 0 of an array always exists; the check is for the verifier.
    let gue_port = CONFIG.get(0).map_or(0, |c| c.gue_port);
    let (outer, tunnel) = match outer(ctx, l2_len, ether_type, gue_port) {
        Ok(outer) => outer,
        Err(reason) => return reason,
    };
    // Ours from here on: a tunnel to this host (GUE: any UDP to its port). Only the
    // balancers may send one.
    if !allowed(outer.family, &outer.src) {
        return DecapReason::DropNotAllowed;
    }
    let inner_off = l2_len + tunnel.len;
    let Some(inner_ether_type) = carried(ctx, inner_off, &outer, &tunnel) else {
        return DecapReason::PassMalformed;
    };
    let (strip, ether_type, eth, reason) = match second_chance::classify(ctx, inner_off, inner_ether_type, &outer, gue_port) {
        Err(reason) => return reason,
        Ok(None) => (tunnel.len, inner_ether_type, eth, DecapReason::Decapsulated),
        Ok(Some(n)) if n.local => (tunnel.len + n.middle_len, n.inner_ether_type, eth, DecapReason::SecondChanceLocal),
        // Back to the hop it came from (a router or the balancer), which routes the inner
        // tunnel to the other backend: the backend needs neither forwarding nor a route.
        Ok(Some(_)) => {
            (tunnel.len, inner_ether_type, EthHdr { dst: eth.src, src: eth.dst, proto: eth.proto }, DecapReason::SecondChanceForwarded)
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

/// The EtherType of the packet a tunnel carries (its protocol or next header).
#[inline(always)]
pub fn inner_ether_type(proto: u8) -> Option<u16> {
    match proto {
        PROTO_IPIP => Some(ETH_P_IPV4),
        PROTO_IPV6 => Some(ETH_P_IPV6),
        _ => None,
    }
}

/// A tunnel header: its IP header and, for GUE, the UDP header after it.
pub struct Tunnel {
    /// Bytes to strip: the IP header, and GUE's UDP header.
    pub len: usize,
    pub gue: bool,
}

/// The tunnel whose IP header `ip` is at `off`: IPIP by its protocol, GUE (variant 1) as UDP
/// to `gue_port` (network order; 0: GUE off). `None`: not a tunnel. The UDP checksum is not
/// read (the balancer writes 0, which RFC 6935 lets this receiver accept over IPv6): the
/// inner packet carries its own.
#[inline(always)]
pub fn tunnel_at(ctx: &XdpContext, off: usize, ip: &Ip, gue_port: u16) -> Option<Tunnel> {
    if inner_ether_type(ip.proto).is_some() {
        return Some(Tunnel { len: ip.len, gue: false });
    }
    if ip.proto != PROTO_UDP || gue_port == 0 {
        return None;
    }
    let udp = unsafe { *at::<UdpHdr>(ctx, off + ip.len)? };
    (udp.dst == gue_port).then_some(Tunnel { len: ip.len + UDP_LEN, gue: true })
}

/// The EtherType of the packet a tunnel carries at `off`, right after the tunnel header:
/// IPIP's protocol says it; GUE variant 1 has no header of its own, so the inner IP
/// header's version says it (anything but 4 and 6 is no variant 1 packet).
#[inline(always)]
pub fn carried(ctx: &XdpContext, off: usize, ip: &Ip, tunnel: &Tunnel) -> Option<u16> {
    if !tunnel.gue {
        return inner_ether_type(ip.proto);
    }
    // Bounds-checked as the smallest IP header it can be (a one-byte check at a variable
    // offset proves nothing to the verifier).
    match unsafe { (*at::<Ipv4Hdr>(ctx, off)?).ver_ihl } >> 4 {
        4 => Some(ETH_P_IPV4),
        6 => Some(ETH_P_IPV6),
        _ => None,
    }
}

/// The outer header of a tunnel to one of this host's addresses, or why the packet is not
/// one (it then passes).
#[inline(always)]
fn outer(ctx: &XdpContext, l3: usize, ether_type: u16, gue_port: u16) -> Result<(Ip, Tunnel), DecapReason> {
    if ether_type != ETH_P_IPV4 && ether_type != ETH_P_IPV6 {
        return Err(DecapReason::PassNotTunnel);
    }
    let ip = ip_at(ctx, l3, ether_type).ok_or(DecapReason::PassMalformed)?;
    // Fragmented tunnels are left to the kernel, which reassembles nothing here and drops.
    if ip.fragment {
        return Err(DecapReason::PassNotTunnel);
    }
    let tunnel = tunnel_at(ctx, l3, &ip, gue_port).ok_or(DecapReason::PassNotTunnel)?;
    // No balancer sends to loopback; a frame on the wire that claims to is forged.
    if loopback(ip.family, &ip.dst) || !local(ip.family, &ip.dst) {
        return Err(DecapReason::PassNotLocal);
    }
    Ok((ip, tunnel))
}

/// 127.0.0.0/8 or ::1 (words as read from the packet, network order).
#[inline(always)]
fn loopback(family: u8, addr: &[u32; 4]) -> bool {
    if family == FAMILY_V4 { u32::from_be(addr[0]) >> 24 == 127 } else { *addr == [0, 0, 0, 1u32.to_be()] }
}

/// One of the addresses this host decapsulates for (its own, VIPs on `lo` included).
#[inline(always)]
pub fn local(family: u8, addr: &[u32; 4]) -> bool {
    LOCAL_ADDRS.get_ptr(&AddrKey { addr: *addr, family, _pad: [0; 3] }).is_some()
}

/// Inside a prefix of `--allow-from`.
#[inline(always)]
pub fn allowed(family: u8, addr: &[u32; 4]) -> bool {
    let bits = if family == FAMILY_V4 { 32 } else { 128 };
    let key = Key::new(ALLOW_KEY_FAMILY_BITS + bits, AllowKey { family, _pad: [0; 3], addr: *addr });
    ALLOW_FROM.get(&key).is_some()
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
