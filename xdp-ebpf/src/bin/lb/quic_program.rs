//! The QUIC program (`quic.rs`): reads a short header's destination connection id, and
//! sends the packet to the backend it names, or tail-calls the UDP program.

use aya_ebpf::{
    bindings::{xdp_action::XDP_PASS, xdp_md},
    programs::XdpContext,
};
use spillway_common::{
    hash::flow_hash,
    quic_lb::{MAX_CID_LEN, ServerId, decode_server_id_into},
    types::{BACKEND_ACTIVE, FAMILY_V4, QuicRouting, QuicServerKey, Reason},
};
use xdp_ebpf::{
    headers::UDP_LEN,
    packet,
    parse::{Parsed, parse_family},
};

use crate::{
    clock,
    maps::{BACKENDS, CONFIG, QUIC_CONFIG, QUIC_HANDOVER, QUIC_PROGRAM, QUIC_ROUTING, QUIC_SERVERS},
    path::{self, Verdict, stage},
    quic::Handover,
    select::Choice,
};

/// The header form bit of a QUIC packet's first byte: set for long headers (RFC 9000 §17).
const LONG_HEADER: u8 = 0x80;
/// [`connection_id_backend`]: a connection id naming no backend (no backend has id
/// `u32::MAX`).
const UNROUTABLE: u32 = u32::MAX;
/// Where a UDP header can start, at most: after Ethernet, a VLAN tag, IPv6 and its
/// extension headers (`parse.rs` walks a few).
const MAX_L4: u32 = 1 << 13;
/// Slots of the UDP programs in the QUIC programs' array.
const UDP_V4: u32 = 2;
const UDP_V6: u32 = 3;

/// For the packet the balancer handed over: the backend id its connection id names if it
/// is a short header ([`UNROUTABLE`] if it names none), 0 for a long header (placed by
/// Maglev, not counted).
#[inline(always)]
fn connection_id_backend(ctx: &XdpContext) -> u32 {
    spillway_quic_backend(ctx.ctx)
}

/// [`connection_id_backend`] as a BPF global function: verified once on its own, and its
/// frame (the map key) is not the balancer's, whose own frame leaves a callee ~64 bytes.
#[unsafe(no_mangle)]
#[inline(never)]
extern "C" fn spillway_quic_backend(ctx: *mut xdp_md) -> u32 {
    let ctx = XdpContext::new(ctx);
    let Some(&Handover { vip_id, l4 }) = QUIC_HANDOVER.get(0) else {
        return UNROUTABLE;
    };
    // Bounded, so the verifier can check the reads after it (a header walk ends far sooner).
    if l4 > MAX_L4 {
        return UNROUTABLE;
    }
    let payload = l4 as usize + UDP_LEN;
    // SAFETY: bounds-checked by `at`.
    let Some(first) = packet::at::<u8>(&ctx, payload).map(|first| unsafe { *first }) else {
        return UNROUTABLE;
    };
    if first & LONG_HEADER != 0 {
        return 0;
    }
    // A short header does not say how long its id is: the configuration does, and the
    // decoder reads only that much of the octets after the first byte (the packet number
    // and the AEAD tag follow, so a real packet always has MAX_CID_LEN of them).
    let (Some(cid), Some(cfg)) = (packet::at::<[u8; MAX_CID_LEN]>(&ctx, payload + 1), QUIC_CONFIG.get(vip_id)) else {
        return UNROUTABLE;
    };
    let mut key = QuicServerKey { vip_id, server_id: ServerId::default() };
    // SAFETY: bounds-checked by `at`; packet memory, read only.
    if decode_server_id_into(unsafe { &*cid }, cfg, &mut key.server_id).is_err() {
        return UNROUTABLE;
    }
    // SAFETY: a map value, read once.
    QUIC_SERVERS.get_ptr(&key).map_or(UNROUTABLE, |id| unsafe { *id })
}

/// The QUIC program: sends a short-header packet the balancer handed over to the backend
/// its connection id names. A long header, an ICMP error, or an id that names no backend of
/// the VIP (counted) goes to the UDP program, the balancer's path.
#[inline(always)]
pub fn send<const FAMILY: u8>(ctx: &XdpContext) -> Verdict {
    if let Some(verdict) = by_connection_id::<FAMILY>(ctx) {
        return verdict;
    }
    // SAFETY: the slots hold XDP programs of the balancer's object, or nothing.
    let _ = unsafe { QUIC_PROGRAM.tail_call(ctx, if FAMILY == FAMILY_V4 { UDP_V4 } else { UDP_V6 }) };
    // Only if the UDP program is not there (it always is once `lbd` has loaded the
    // balancer, before any VIP is QUIC): the kernel gets the frame.
    Verdict::ended(XDP_PASS, Reason::PassNotVip)
}

#[inline(always)]
fn by_connection_id<const FAMILY: u8>(ctx: &XdpContext) -> Option<Verdict> {
    let Parsed::Flow { key, layout, icmp_error: false, .. } = parse_family::<FAMILY>(ctx) else {
        return None;
    };
    let id = connection_id_backend(ctx);
    if id == 0 {
        return None;
    }
    let vip_id = QUIC_HANDOVER.get(0)?.vip_id;
    // In use by this VIP: the map is written after the ids it names, and an id freed since
    // may serve another VIP now.
    let Some(backend) = BACKENDS.get(id).filter(|b| b.state == BACKEND_ACTIVE && b.vip_id == vip_id) else {
        count(QuicRouting::Fallback);
        return None;
    };
    count(QuicRouting::ByConnectionId);
    // Slot 0 of an array always exists; the check is for the verifier.
    let cfg = CONFIG.get(0)?;
    let now_ns = clock::now_ns(cfg);
    let choice = Choice { id, backend: *backend, hash: flow_hash(&key, cfg.table_seed) };
    let (action, reason) = path::forward::<{ stage::ALL }>(ctx, &key, &layout, &choice, None, cfg, now_ns);
    let backend = path::is_sent(reason).then_some(id);
    Some(Verdict { action, reason, vip: Some(vip_id), backend, bytes: packet::len(ctx) as u32, new_flow: false, second_chance: false })
}

#[inline(always)]
fn count(what: QuicRouting) {
    if let Some(n) = QUIC_ROUTING.get_ptr_mut(what as u32) {
        // SAFETY: per-CPU slot, no other writer on this CPU while we run.
        unsafe { *n += 1 };
    }
}
