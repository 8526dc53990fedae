//! The probe path: health probes that `lbd` addresses to a VIP leave the balancer encapsulated
//! to one backend exactly as the data path sends that VIP's traffic, so a passing probe
//! proves "this backend serves this VIP", not only "this host is up".
//!
//! `lbd` routes its probe sockets (by their mark) to a device of its own whose only exit is
//! this program, on tc egress. The mark names the backend (id and generation); the backend's
//! entry, the outer source, the encapsulation and the FIB lookup are the data path's own
//! (`maps.rs`, `LbConfig::outer_source`, `encap.rs`, `fib.rs`); the FIB is asked as for a
//! packet arriving on the balancer's interface. Anything it does not send is dropped (the
//! device drops it too): an unencapsulated probe never leaves the host.

use aya_ebpf::{
    EbpfContext,
    bindings::{
        __sk_buff, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6, BPF_F_ADJ_ROOM_ENCAP_L4_UDP, TC_ACT_REDIRECT, TC_ACT_SHOT,
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    helpers::{bpf_redirect, bpf_redirect_neigh},
    macros::{classifier, map},
    maps::{Array, PerCpuArray},
    programs::TcContext,
};
use spillway_common::{
    hash::flow_hash,
    limits::Capacity,
    types::{
        BACKEND_ACTIVE, CFG_F_STATIC_NEXTHOP, ENCAP_GUE, FAMILY_V4, FAMILY_V6, FlowKey, PROBE_MARK_TAG_SHIFT, PROTO_TCP, PROTO_UDP,
        ProbeConfig, ProbeReason, probe_generation_matches, probe_mark_backend,
    },
};
use xdp_ebpf::{
    encap::{self, Macs, Tunnel},
    fib::{self, NextHop},
    headers::{ETH_LEN, ETH_P_IPV4, ETH_P_IPV6, EthHdr, IPV4_LEN, IPV4_MF_OFFSET_MASK, IPV6_LEN, Ipv4Hdr, Ipv6Hdr, Ports},
};

use crate::maps::{BACKENDS, CONFIG};

#[map(name = "spw_probe_cfg")]
static PROBE_CONFIG: Array<ProbeConfig> = Array::with_max_entries(1, 0);

#[map(name = "spw_probe_rsn")]
static PROBE_REASONS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ProbeReason::COUNT, 0);

/// The last verdict for each backend id (`ProbeReason` as u32, plus one; 0 = none yet): what
/// `lbd` reads when a probe through the tunnel failed, to tell its own trouble from the
/// backend's.
#[map(name = "spw_probe_last")]
static PROBE_LAST: Array<u32> = Array::with_max_entries(Capacity::DEFAULT.backend_slots(), 0);

#[classifier]
pub fn spillway_probe(ctx: TcContext) -> i32 {
    let (action, reason, id) = encapsulate(&ctx);
    if let Some(count) = PROBE_REASONS.get_ptr_mut(reason as u32) {
        unsafe { *count += 1 };
    }
    if let Some(id) = id
        && let Some(last) = PROBE_LAST.get_ptr_mut(id)
    {
        unsafe { *last = reason as u32 + 1 };
    }
    action
}

/// The inner packet: what the flow hash and the outer header need.
struct Inner {
    key: FlowKey,
    len: usize,
    tos: u8,
}

/// The action, the reason, and the backend id when the mark named one.
#[inline(always)]
fn encapsulate(ctx: &TcContext) -> (i32, ProbeReason, Option<u32>) {
    let drop = |reason, id| (TC_ACT_SHOT, reason, id);
    // Slot 0 of an array always exists; the checks are for the verifier.
    let (Some(cfg), Some(probe_cfg)) = (CONFIG.get(0), PROBE_CONFIG.get(0)) else {
        return drop(ProbeReason::DropNotProbe, None);
    };
    // SAFETY: the context of a classifier is its `__sk_buff`.
    let mark = unsafe { (*(ctx.as_ptr() as *const __sk_buff)).mark };
    if mark >> PROBE_MARK_TAG_SHIFT != probe_cfg.mark_tag || probe_cfg.mark_tag == 0 {
        return drop(ProbeReason::DropNotProbe, None);
    }
    let (id, generation) = probe_mark_backend(mark);
    let Some(be) = BACKENDS.get(id) else {
        return drop(ProbeReason::DropNoBackend, None);
    };
    if be.state != BACKEND_ACTIVE || !probe_generation_matches(be.generation, generation) {
        return drop(ProbeReason::DropNoBackend, Some(id));
    }
    let Some(inner) = inner(ctx) else {
        return drop(ProbeReason::DropMalformed, Some(id));
    };
    if !encap::supported(be.family, inner.key.family) {
        return drop(ProbeReason::DropEncapFailed, Some(id));
    }
    // The data path's outer entropy: the same hash of the same 5-tuple.
    let hash = flow_hash(&inner.key, cfg.table_seed);
    let tunnel = Tunnel {
        family: be.family,
        src: cfg.outer_source(be.family, hash),
        dst: be.addr,
        inner_family: inner.key.family,
        inner_len: inner.len,
        tos: inner.tos,
        flow_hash: hash,
        gue_port: (be.encap == ENCAP_GUE).then_some(cfg.gue_port),
    };
    let outer_len = (tunnel.outer_len() + inner.len) as u16;
    let (hop, egress) = if cfg.flags & CFG_F_STATIC_NEXTHOP != 0 {
        let macs = Macs { src: cfg.static_src_mac, dst: cfg.static_dst_mac };
        (NextHop::Resolved { ifindex: cfg.static_ifindex, macs }, cfg.static_ifindex)
    } else {
        fib::lookup_from(ctx.as_ptr(), probe_cfg.ingress_ifindex, be.family, &tunnel.src, &be.addr, outer_len)
    };
    let macs = match hop {
        NextHop::FragNeeded { .. } => return drop(ProbeReason::DropOversize, Some(id)),
        NextHop::NoRoute => return drop(ProbeReason::DropNoRoute, Some(id)),
        NextHop::ForwardingDisabled => return drop(ProbeReason::DropForwardingDisabled, Some(id)),
        NextHop::NoNeigh => None,
        NextHop::Resolved { macs, .. } => Some(macs),
    };
    let resolved = macs.is_some();
    if push(ctx, &tunnel, macs).is_err() {
        return drop(ProbeReason::DropEncapFailed, Some(id));
    }
    let (ret, reason) = if resolved {
        (unsafe { bpf_redirect(egress, 0) }, ProbeReason::Redirect)
    } else {
        // The kernel resolves the neighbour and writes the MACs (the data path hands such
        // packets to the kernel too, see `pass_no_neigh`).
        (unsafe { bpf_redirect_neigh(egress, core::ptr::null_mut(), 0, 0) }, ProbeReason::RedirectNeigh)
    };
    if ret != i64::from(TC_ACT_REDIRECT) {
        return drop(ProbeReason::DropRedirectFailed, Some(id));
    }
    (TC_ACT_REDIRECT as i32, reason, Some(id))
}

/// The probe's IP and L4 headers. Probes are made by `lbd`'s own sockets: TCP or UDP, IPv4
/// without options or fragments, IPv6 without extension headers; anything else is refused.
#[inline(always)]
fn inner(ctx: &TcContext) -> Option<Inner> {
    let eth: EthHdr = ctx.load(0).ok()?;
    let (key, len, tos, l4) = if eth.proto == ETH_P_IPV4 {
        let ip: Ipv4Hdr = ctx.load(ETH_LEN).ok()?;
        if ip.ver_ihl != 0x45 || u16::from_be(ip.frag_off) & IPV4_MF_OFFSET_MASK != 0 {
            return None;
        }
        let key = FlowKey { src: [ip.src, 0, 0, 0], dst: [ip.dst, 0, 0, 0], proto: ip.proto, family: FAMILY_V4, ..FlowKey::default() };
        (key, u16::from_be(ip.tot_len) as usize, ip.tos, ETH_LEN + IPV4_LEN)
    } else if eth.proto == ETH_P_IPV6 {
        let ip: Ipv6Hdr = ctx.load(ETH_LEN).ok()?;
        let vtc = u32::from_be(ip.vtc_flow);
        let key = FlowKey { src: ip.src, dst: ip.dst, proto: ip.next_hdr, family: FAMILY_V6, ..FlowKey::default() };
        (key, IPV6_LEN + u16::from_be(ip.payload_len) as usize, (vtc >> 20) as u8, ETH_LEN + IPV6_LEN)
    } else {
        return None;
    };
    if (key.proto != PROTO_TCP && key.proto != PROTO_UDP) || ETH_LEN + len > ctx.len() as usize {
        return None;
    }
    let ports: Ports = ctx.load(l4).ok()?;
    Some(Inner { key: FlowKey { sport: ports.src, dport: ports.dst, ..key }, len, tos })
}

/// Makes room after the Ethernet header and writes the outer headers: the data path's,
/// from `encap.rs`. Without `macs` the Ethernet header keeps its addresses (the kernel
/// rewrites them) and only its type changes.
#[inline(always)]
fn push(ctx: &TcContext, t: &Tunnel, macs: Option<Macs>) -> Result<(), ()> {
    let (ip_len, mut flags) =
        if t.family == FAMILY_V4 { (IPV4_LEN, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4) } else { (IPV6_LEN, BPF_F_ADJ_ROOM_ENCAP_L3_IPV6) };
    let udp = encap::udp_header(t);
    if udp.is_some() {
        flags |= BPF_F_ADJ_ROOM_ENCAP_L4_UDP;
    }
    ctx.adjust_room(t.outer_len() as i32, BPF_ADJ_ROOM_MAC, u64::from(flags)).map_err(|_| ())?;
    let macs = match macs {
        Some(macs) => macs,
        None => {
            let arrived: EthHdr = ctx.load(0).map_err(|_| ())?;
            Macs { src: arrived.src, dst: arrived.dst }
        }
    };
    ctx.store(0, &encap::ethernet_header(t, &macs), 0).map_err(|_| ())?;
    if t.family == FAMILY_V4 {
        ctx.store(ETH_LEN, &encap::ipv4_header(t), 0).map_err(|_| ())?;
    } else {
        ctx.store(ETH_LEN, &encap::ipv6_header(t), 0).map_err(|_| ())?;
    }
    match udp {
        Some(udp) => ctx.store(ETH_LEN + ip_len, &udp, 0).map_err(|_| ()),
        None => Ok(()),
    }
}
