//! The QUIC program (`quic.rs`): reads a short header's destination connection id, and
//! sends the packet to the backend it names, or tail-calls the UDP program.

use aya_ebpf::programs::XdpContext;
use core::ptr::{addr_of, read_volatile};
use spillway_common::{
    hash::{connection_id_hash, quic_server_home},
    quic_lb::{QuicLbConfig, server_id_words},
    types::{BACKEND_ACTIVE, BackendInfo, FAMILY_V4, QuicHandover, QuicRouting},
};
use xdp_ebpf::{packet, parse::Layout};

use crate::{
    clock,
    maps::{self, CONFIG, QUIC_CRYPT_PROGRAM, QUIC_SERVER_SLOT_MASK, QUIC_SERVERS},
    path::{self, stage},
    quic_crypto::{self, Found, Id, count},
    quic_header::{Header, header, to_udp_program},
    select::Choice,
    verdict::Verdict,
};

/// What a QUIC packet's header says of its backend.
enum Named {
    /// A long header: placed by Maglev, not counted.
    LongHeader,
    /// A short header whose connection id names backend `id` of the VIP in the server-id
    /// index, whose slot holds `backend`, a copy of the backend's entry; the id's first 16
    /// octets as loaded (their hash is the outer header's entropy).
    Backend { id: u32, backend: &'static BackendInfo, low: u64, high: u64 },
    /// A short header of an encrypted config id not decoded yet: for the crypt program.
    Encrypted,
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
fn connection_id_backend(ctx: &XdpContext, vip_id: u32, vip_cfg: &QuicLbConfig, l4: u64, handover: &mut QuicHandover) -> Named {
    let (low, high, cfg, cid) = match header(ctx, vip_id, vip_cfg, l4) {
        Header::Long => return Named::LongHeader,
        Header::Unreadable => return Named::Nothing,
        Header::Short { low, high, cfg, cid, .. } => (low, high, cfg, cid),
    };
    // An encrypted id is looked up in the cache of decoded ids here; a miss is decoded by
    // the crypt program, which hands the server id back (`quic_crypto.rs`): the AES has no
    // room on this program's stack.
    let (words, decrypted) = if cfg.is_encrypted() {
        match quic_crypto::take() {
            (Found::Pending, _) => match quic_crypto::cached(vip_id, &cfg, &Id { at: cid, low, high }, handover) {
                Some(words) => (words, false),
                None => return Named::Encrypted,
            },
            (Found::Nothing, _) => return Named::Nothing,
            (found, words) => (words, found == Found::Decrypted),
        }
    } else {
        match server_id_words(low, high, &cfg) {
            Ok(words) => (words, false),
            Err(_) => return Named::Nothing,
        }
    };
    // In use by this VIP, as the slot's copy of its entry says (the loader keeps the copy as
    // the backend array has it, and takes a backend's ids out before freeing it).
    let Some((id, backend)) = indexed_server(vip_id, &words).filter(|(_, b)| b.state == BACKEND_ACTIVE && b.vip_id == vip_id) else {
        return Named::Nothing;
    };
    // Only an id that named a backend of the VIP is remembered: random ids take no room.
    if decrypted {
        quic_crypto::remember(&words);
    }
    Named::Backend { id, backend, low, high }
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
/// its connection id names (an encrypted one once the crypt program has decoded it). A long
/// header, an ICMP error, or an id that names no backend of the VIP (counted) goes to the
/// UDP program, the balancer's path.
#[inline(always)]
pub fn send<const FAMILY: u8>(ctx: &XdpContext) -> Verdict {
    if let Some(verdict) = by_connection_id::<FAMILY>(ctx) {
        return verdict;
    }
    to_udp_program::<FAMILY>(ctx)
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
    let (id, backend, low, high) = match connection_id_backend(ctx, vip_id, &quic, handover.l4.into(), handover) {
        Named::LongHeader => return None,
        Named::Backend { id, backend, low, high } => (id, backend, low, high),
        Named::Encrypted => {
            // SAFETY: the slots hold XDP programs of the balancer's object, or nothing.
            let _ = unsafe { QUIC_CRYPT_PROGRAM.tail_call(ctx, if FAMILY == FAMILY_V4 { 0 } else { 1 }) };
            // Not loaded: the id cannot be read.
            count(handover, QuicRouting::Fallback);
            return None;
        }
        Named::Nothing => {
            count(handover, QuicRouting::Fallback);
            return None;
        }
    };
    count(handover, QuicRouting::ByConnectionId);
    // Slot 0 of an array always exists; the check is for the verifier.
    let cfg = CONFIG.get(0)?;
    let now_ns = clock::now_ns(cfg);
    let layout = Layout { l2_len: handover.l2_len as usize, l3_len: handover.l3_len as usize, tos: handover.tos, l4: handover.l4 };
    let hash = connection_id_hash(low, high, quic.cid_len() as u32, cfg.table_seed);
    let choice = Choice { id, backend: *backend, hash };
    // The family as a constant: the encapsulation's other family folds away.
    let (action, reason) = path::forward::<{ stage::ALL }>(ctx, FAMILY, &layout, &choice, None, cfg, now_ns);
    let backend = path::is_sent(reason).then_some(id);
    Some(Verdict { action, reason, vip: Some(vip_id), backend, bytes: packet::len(ctx) as u32, new_flow: false, second_chance: false })
}
