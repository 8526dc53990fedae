//! Encrypted QUIC-LB connection ids (draft §5.4-5.5) in the QUIC program: a short header's id
//! is looked up in the cache of ids already decoded (`spw_quic_cids`); a miss is decrypted
//! (`spillway_common::quic_lb::encrypted`, AES through the kernel's crypto kfuncs, one to
//! four blocks) within this CPU's budget (`spw_quic_budget`), and inserted once it names a
//! backend of the VIP. So a connection's id costs one lookup after its first packet, and a
//! flood of random ids, all misses, costs at most the budget's decryptions: the rest go by
//! their 5-tuple, as an id that names no backend does.

use spillway_common::{
    limits::QUIC_CONFIG_IDS_PER_VIP,
    quic_lb::{
        MAX_CID_LEN, QuicLbConfig,
        encrypted::{Block, BlockCipher, decrypt_server_id},
        tail_mask, words_mask,
    },
    types::{FAMILY_V4, LbConfig, QuicCidKey, QuicHandover, QuicRouting},
};
use xdp_ebpf::packet;

use aya_ebpf::programs::XdpContext;

use crate::{
    clock,
    maps::{self, CONFIG, CryptScratch, QUIC_CID_CACHE, QUIC_CRYPT_SCRATCH, QUIC_DECRYPT_BUDGET, QUIC_PROGRAM},
    quic_header::{self, Header},
    verdict::Verdict,
};

unsafe extern "C" {
    /// `xdp-ebpf/c/quic_aes.bpf.c`: encrypts (`decrypt` 0) or decrypts `block` in place with
    /// the key of `spw_quic_keys` slot `slot`; 0, or a negative error (no key, the kfunc's).
    fn spw_quic_aes(slot: u32, decrypt: u32, block: *mut Block) -> i32;
}

/// The key of one (VIP, config id), in the kernel.
struct KernelAes {
    slot: u32,
}

impl BlockCipher for KernelAes {
    #[inline(always)]
    fn encrypt(&mut self, block: &mut Block) -> bool {
        // SAFETY: the helper reads and writes the 16 octets of `block` only.
        unsafe { spw_quic_aes(self.slot, 0, block) == 0 }
    }

    #[inline(always)]
    fn decrypt(&mut self, block: &mut Block) -> bool {
        // SAFETY: as above.
        unsafe { spw_quic_aes(self.slot, 1, block) == 0 }
    }
}

/// What the crypt program found of a short header's encrypted id, for the QUIC program
/// (`CryptScratch::found`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Found {
    /// Not decoded yet: the QUIC program tail-calls the crypt program.
    Pending = 0,
    /// Over budget, not decrypted, or no key.
    Nothing,
    Decrypted,
}

/// The crypt program (`spillway_lb_quic_crypt`, `_v6`), tail-called by the QUIC program for
/// a short header of an encrypted config id the cache does not have: decodes the id into this CPU's scratch and
/// tail-calls the QUIC program again, which reads it there ([`take`]) and sends the
/// packet. Its own program for a stack of its own: the QUIC program's is the forwarding
/// path's, with no room for the decoder beside it.
#[inline(always)]
pub fn decode<const FAMILY: u8>(ctx: &XdpContext) -> Verdict {
    let found = match (maps::quic_handover(), CONFIG.get(0)) {
        // SAFETY: this CPU's slot, live for the program's run; no other writer meanwhile.
        (Some(handover), Some(lb_cfg)) => unsafe { decoded(ctx, &mut *handover, lb_cfg) },
        _ => Found::Nothing,
    };
    if let Some(scratch) = QUIC_CRYPT_SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        unsafe { (*scratch).found = found as u32 };
    }
    // SAFETY: the slots hold XDP programs of the balancer's object, or nothing.
    let _ = unsafe { QUIC_PROGRAM.tail_call(ctx, if FAMILY == FAMILY_V4 { 0 } else { 1 }) };
    // The QUIC program was not there: nothing may read the result later.
    let _ = take();
    quic_header::to_udp_program::<FAMILY>(ctx)
}

#[inline(always)]
fn decoded(ctx: &XdpContext, handover: &mut QuicHandover, lb_cfg: &LbConfig) -> Found {
    let quic = QuicLbConfig::from_word(handover.quic);
    match quic_header::header(ctx, handover.vip_id, &quic, handover.l4.into()) {
        Header::Short { first, cid, low, high, cfg } if cfg.is_encrypted() => {
            server_id(&cfg, first, Id { at: cid, low, high }, lb_cfg, handover)
        }
        _ => Found::Nothing,
    }
}

/// A short header's connection id: where it is in the frame (MAX_CID_LEN octets the header's
/// reading checked are there), and its first 16 octets as that reading loaded them.
pub struct Id {
    pub at: *const u8,
    pub low: u64,
    pub high: u64,
}

/// Decodes the encrypted `cid`, first octet `first`, under `cfg`, of the VIP handed over,
/// counted in `handover`; the server id's words are left in this CPU's scratch.
#[inline(always)]
fn server_id(cfg: &QuicLbConfig, first: u8, cid: Id, lb_cfg: &LbConfig, handover: &mut QuicHandover) -> Found {
    // The QUIC program looked the id up in the cache (`cached`) and missed.
    let Some(scratch) = cache_key(handover.vip_id, cfg, &cid) else {
        return Found::Nothing;
    };
    let vip_id = handover.vip_id;
    if !spend_budget(clock::now_ns(lb_cfg)) {
        count(handover, QuicRouting::MissOverBudget);
        return Found::Nothing;
    }
    count(handover, QuicRouting::Decrypted);
    let mut i = 0;
    while i < MAX_CID_LEN - 1 {
        // SAFETY: i + 1 < MAX_CID_LEN octets from the id, in the frame. Octets past the id
        // are not read by the decoder.
        scratch.decoder.sealed[i] = unsafe { *cid.at.add(i + 1) };
        i += 1;
    }
    let mut aes = KernelAes { slot: vip_id * QUIC_CONFIG_IDS_PER_VIP + cfg.config_id as u32 };
    match decrypt_server_id(first, &mut scratch.decoder, cfg, &mut aes) {
        Ok(id) => {
            scratch.words = id.words();
            Found::Decrypted
        }
        Err(_) => Found::Nothing,
    }
}

/// This CPU's scratch with the cache key of `cid` of VIP `vip_id` under `cfg`: the key is
/// built in the map value, not on the stack, which the forwarding path fills.
#[inline(always)]
fn cache_key(vip_id: u32, cfg: &QuicLbConfig, cid: &Id) -> Option<&'static mut CryptScratch> {
    // SAFETY: this CPU's slot, for this run only.
    let scratch = unsafe { &mut *QUIC_CRYPT_SCRATCH.get_ptr_mut(0)? };
    let len = cfg.cid_len() as u32;
    let (low_mask, high_mask) = words_mask(len);
    // SAFETY: octets 16..20 of the MAX_CID_LEN the header's reading checked are in the frame.
    let tail = unsafe { packet::load_u32_le(cid.at.add(16)) } & tail_mask(len);
    // Octets past the id (the packet number's) are not part of the key.
    scratch.key = QuicCidKey { vip_id, tail, low: cid.low & low_mask, high: cid.high & high_mask };
    Some(scratch)
}

/// In the QUIC program: the server id's words of the encrypted `cid` if the cache has
/// it (counted), so a known id costs one lookup and no tail call.
#[inline(always)]
pub fn cached(vip_id: u32, cfg: &QuicLbConfig, cid: &Id, handover: &mut QuicHandover) -> Option<[u32; 4]> {
    let scratch = cache_key(vip_id, cfg, cid)?;
    // SAFETY: a live map value, copied out at once.
    let words = unsafe { *QUIC_CID_CACHE.get(&scratch.key)? };
    count(handover, QuicRouting::Cached);
    Some(words)
}

/// What the crypt program found for this packet, and the server id's words; the scratch is
/// left pending for the next packet.
#[inline(always)]
pub fn take() -> (Found, [u32; 4]) {
    let Some(scratch) = QUIC_CRYPT_SCRATCH.get_ptr_mut(0) else {
        return (Found::Nothing, [0; 4]);
    };
    // SAFETY: this CPU's slot, written by the crypt program in this packet's run.
    let scratch = unsafe { &mut *scratch };
    let found = match scratch.found {
        0 => Found::Pending,
        2 => Found::Decrypted,
        _ => Found::Nothing,
    };
    scratch.found = Found::Pending as u32;
    (found, scratch.words)
}

/// Remembers that the id [`server_id`] just decrypted on this CPU named a backend (its
/// server id `words`).
#[inline(always)]
pub fn remember(words: &[u32; 4]) {
    // SAFETY: this CPU's slot, written by `server_id` in this run.
    if let Some(scratch) = QUIC_CRYPT_SCRATCH.get_ptr_mut(0) {
        // Full or not, the LRU makes room; a failed insert only costs a later decryption.
        let _ = QUIC_CID_CACHE.insert(unsafe { &(*scratch).key }, words, 0);
    }
}

/// Spends one decryption of this CPU's budget, if it has one left.
#[inline(always)]
fn spend_budget(now_ns: u64) -> bool {
    let Some(budget) = QUIC_DECRYPT_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot; nothing else runs on this CPU meanwhile.
    let budget = unsafe { &mut *budget };
    // Not written by a loader: no budget at all, rather than an unbounded one.
    if budget.ns_per_miss == 0 {
        return false;
    }
    let credit = budget.credit_ns.saturating_add(now_ns.saturating_sub(budget.last_ns));
    budget.last_ns = now_ns;
    budget.credit_ns = if credit > budget.max_credit_ns { budget.max_credit_ns } else { credit };
    if budget.credit_ns < budget.ns_per_miss {
        return false;
    }
    budget.credit_ns -= budget.ns_per_miss;
    true
}

/// Counts a short header in this CPU's hand-over, which the packet's path has in its cache.
#[inline(always)]
pub fn count(handover: &mut QuicHandover, what: QuicRouting) {
    if let Some(n) = handover.placed.get_mut(what as usize) {
        *n += 1;
    }
}
