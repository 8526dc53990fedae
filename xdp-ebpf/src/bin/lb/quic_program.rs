//! The QUIC program (`quic.rs`): reads a short header's destination connection id, and
//! sends the packet to the backend it names, or tail-calls the UDP program.

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use core::ptr::{addr_of, read_volatile};
use spillway_common::{
    hash::{connection_id_hash, quic_server_home},
    limits::QUIC_CONFIG_IDS_PER_VIP,
    quic_lb::{CONFIG_ID_SHIFT, MAX_CID_LEN, QuicLbConfig, server_id_words},
    types::{BACKEND_ACTIVE, BackendInfo, FAMILY_V4, QuicCidKey, QuicHandover, QuicRouting, Reason},
};
use xdp_ebpf::{headers::UDP_LEN, packet, parse::Layout};

use crate::{
    clock,
    maps::{self, CONFIG, QUIC_CONFIGS, QUIC_PROGRAM, QUIC_SERVER_SLOT_MASK, QUIC_SERVERS},
    path::{self, stage},
    quic_crypto::{self, count},
    select::Choice,
    verdict::Verdict,
};

/// The header form bit of a QUIC packet's first byte: set for long headers (RFC 9000 §17).
const LONG_HEADER: u8 = 0x80;
/// Where a UDP header can start, at most: after Ethernet, a VLAN tag, IPv6 and its
/// extension headers (`parse.rs` walks a few).
const MAX_L4: u64 = 1 << 13;
/// Slots of the UDP programs in the QUIC programs' array.
const UDP_V4: u32 = 2;
const UDP_V6: u32 = 3;

/// What a QUIC packet's header says of its backend.
enum Named {
    /// A long header: placed by Maglev, not counted.
    LongHeader,
    /// A short header whose connection id names backend `id` in the server-id index, whose
    /// slot holds `backend`, a copy of the backend's entry; the id's first 16 octets as
    /// loaded (their hash is the outer header's entropy); for an encrypted id just
    /// decrypted, the cache key to remember it under.
    Backend { id: u32, backend: &'static BackendInfo, low: u64, high: u64, decrypted: Option<(QuicCidKey, [u32; 4])> },
    /// A short header whose id does not decode or names nothing (or no header at all).
    Nothing,
}

/// For a packet to QUIC VIP `vip_id` (configuration `vip_cfg`, the VIP slot's) whose UDP
/// header starts at `l4`: what its header names.
/// Inline: as a BPF global function (verified
/// once, a frame of its own) its call and return cost the short header 15-20 ns on an AMD
/// EPYC VM whose kernel returns through a thunk (`spec_rstack_overflow`: Safe RET), three
/// runs of `bench --part quic` alternating with it; the QUIC programs' walks stay ~3.0k / 2.4k.
#[inline(always)]
fn connection_id_backend(ctx: &XdpContext, vip_id: u32, vip_cfg: &QuicLbConfig, l4: u64, now_ns: u64, handover: &mut QuicHandover) -> Named {
    // Bounded, so the verifier can check the reads after it (the hand-over's value is any
    // value to it). A full register: a 32-bit one would be widened again after the
    // check, and the verifier would lose the bound.
    if l4 > MAX_L4 {
        return Named::Nothing;
    }
    let payload = l4 as usize + UDP_LEN;
    // SAFETY: bounds-checked by `at`.
    let Some(first) = packet::at::<u8>(ctx, payload).map(|first| unsafe { *first }) else {
        return Named::Nothing;
    };
    if first & LONG_HEADER != 0 {
        return Named::LongHeader;
    }
    // A short header does not say how long its id is: the configuration does, and the
    // decoder reads only that much of the octets after the first byte (the packet number
    // and the AEAD tag follow, so a real packet always has MAX_CID_LEN of them).
    let Some(cid) = packet::at::<[u8; MAX_CID_LEN]>(ctx, payload + 1) else {
        return Named::Nothing;
    };
    let cid = cid.cast::<u8>();
    // SAFETY: `at` checked the MAX_CID_LEN octets from `cid` are in the frame.
    let (low, high) = unsafe { (packet::load_u64_le(cid), packet::load_u64_le(cid.add(8))) };
    // The VIP slot's configuration, or another config id of the VIP's (a key rotation).
    let config_id = (first >> CONFIG_ID_SHIFT) as u32;
    let cfg = if config_id == vip_cfg.config_id as u32 {
        *vip_cfg
    } else {
        match QUIC_CONFIGS.get(vip_id * QUIC_CONFIG_IDS_PER_VIP + config_id) {
            Some(word) => QuicLbConfig::from_word(*word),
            None => return Named::Nothing,
        }
    };
    let (words, decrypted) = if cfg.is_encrypted() {
        match quic_crypto::server_id(vip_id, &cfg, first, cid, now_ns, handover) {
            Some(decoded) => (decoded.words, decoded.insert.map(|key| (key, decoded.words))),
            None => return Named::Nothing,
        }
    } else {
        match server_id_words(low, high, &cfg) {
            Ok(words) => (words, None),
            Err(_) => return Named::Nothing,
        }
    };
    indexed_server(vip_id, &words).map_or(Named::Nothing, |(id, backend)| Named::Backend { id, backend, low, high, decrypted })
}

/// The backend id of (`vip_id`, server id `words`) in the server-id index and the copy of
/// its entry the slot holds: at most its home slot's `probes` slots from there, so an id no
/// backend has costs one slot read, or a few. The loader publishes a slot's server-id length
/// (in its first word) last and clears it first; a key that is to name another backend is
/// removed and inserted again.
#[inline(always)]
fn indexed_server(vip_id: u32, words: &[u32; 4]) -> Option<(u32, &'static BackendInfo)> {
    // SAFETY: a `.rodata` constant the loader patches at load (volatile: not the default).
    let mask = unsafe { read_volatile(&QUIC_SERVER_SLOT_MASK) };
    let home = quic_server_home(vip_id, words, mask);
    // SAFETY (both): live map values; the server id is 4-aligned (`ServerId`).
    let slot = maps::probe(&QUIC_SERVERS, home, mask, |slot| unsafe {
        let have = addr_of!((*slot).key.server_id).cast::<[u32; 4]>();
        read_volatile(have.cast::<u32>()) == words[0]
            && read_volatile(addr_of!((*slot).key.vip_id)) == vip_id
            && read_volatile(have) == *words
    })?;
    unsafe { Some((read_volatile(addr_of!((*slot).server.backend_id)), &*addr_of!((*slot).server.backend))) }
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
    // What the balancer parsed: the frame is the one it handed over, unchanged.
    let handover = maps::quic_handover()?;
    // SAFETY: this CPU's slot, live for the program's run; no other writer while we run.
    let handover = unsafe { &mut *handover };
    if handover.icmp_error != 0 || handover.family != FAMILY {
        return None;
    }
    let vip_id = handover.vip_id;
    let quic = QuicLbConfig::from_word(handover.quic);
    // Slot 0 of an array always exists; the check is for the verifier.
    let cfg = CONFIG.get(0)?;
    let now_ns = clock::now_ns(cfg);
    let (named, low, high, decrypted) = match connection_id_backend(ctx, vip_id, &quic, handover.l4.into(), now_ns, handover) {
        Named::LongHeader => return None,
        Named::Backend { id, backend, low, high, decrypted } => (Some((id, backend)), low, high, decrypted),
        Named::Nothing => (None, 0, 0, None),
    };
    // In use by this VIP, as the slot's copy of its entry says (the loader keeps the copy as
    // the backend array has it, and takes a backend's ids out before freeing it).
    let Some((id, backend)) = named.filter(|(_, b)| b.state == BACKEND_ACTIVE && b.vip_id == vip_id) else {
        count(handover, QuicRouting::Fallback);
        return None;
    };
    count(handover, QuicRouting::ByConnectionId);
    // Only an id that named a backend of the VIP is remembered: random ids take no room.
    if let Some((key, words)) = &decrypted {
        quic_crypto::remember(key, words);
    }
    let layout = Layout { l2_len: handover.l2_len as usize, l3_len: handover.l3_len as usize, tos: handover.tos, l4: handover.l4 };
    let hash = connection_id_hash(low, high, quic.cid_len() as u32, cfg.table_seed);
    let choice = Choice { id, backend: *backend, hash };
    // The family as a constant: the encapsulation's other family folds away.
    let (action, reason) = path::forward::<{ stage::ALL }>(ctx, FAMILY, &layout, &choice, None, cfg, now_ns);
    let backend = path::is_sent(reason).then_some(id);
    Some(Verdict { action, reason, vip: Some(vip_id), backend, bytes: packet::len(ctx) as u32, new_flow: false, second_chance: false })
}
