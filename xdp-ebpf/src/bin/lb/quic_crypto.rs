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
        encrypted::{Block, BlockCipher, Sealed, decrypt_server_id},
    },
    types::{QuicCidKey, QuicHandover, QuicRouting},
};

use crate::maps::{QUIC_CID_CACHE, QUIC_DECRYPT_BUDGET};

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

/// A server id read from an encrypted id: its index words, and the cache key to insert it
/// under once it names a backend (none when it came from the cache).
pub struct Decoded {
    pub words: [u32; 4],
    pub insert: Option<QuicCidKey>,
}

/// The server id of the encrypted id at `cid` (MAX_CID_LEN octets the caller checked are in
/// the frame), first octet `first`, of VIP `vip_id` under `cfg`, counted in `handover`.
#[inline(always)]
pub fn server_id(vip_id: u32, cfg: &QuicLbConfig, first: u8, cid: *const u8, now_ns: u64, handover: &mut QuicHandover) -> Option<Decoded> {
    let mut key = QuicCidKey { vip_id, cid: [0; MAX_CID_LEN] };
    let len = cfg.cid_len();
    let mut i = 0;
    while i < MAX_CID_LEN && i < len {
        // SAFETY: i < MAX_CID_LEN octets from `cid`, checked by the caller.
        key.cid[i] = unsafe { *cid.add(i) };
        i += 1;
    }
    // SAFETY: a live map value, copied out at once.
    if let Some(words) = unsafe { QUIC_CID_CACHE.get(&key) } {
        count(handover, QuicRouting::Cached);
        return Some(Decoded { words: *words, insert: None });
    }
    if !spend_budget(now_ns) {
        count(handover, QuicRouting::MissOverBudget);
        return None;
    }
    count(handover, QuicRouting::Decrypted);
    let mut sealed: Sealed = [0; 19];
    let mut i = 0;
    while i < sealed.len() {
        sealed[i] = key.cid[i + 1];
        i += 1;
    }
    let mut aes = KernelAes { slot: vip_id * QUIC_CONFIG_IDS_PER_VIP + cfg.config_id as u32 };
    let id = decrypt_server_id(first, &sealed, cfg, &mut aes).ok()?;
    Some(Decoded { words: id.words(), insert: Some(key) })
}

/// Remembers that `key` named a backend (its server id `words`).
#[inline(always)]
pub fn remember(key: &QuicCidKey, words: &[u32; 4]) {
    // Full or not, the LRU makes room; a failed insert only costs a later decryption.
    let _ = QUIC_CID_CACHE.insert(key, words, 0);
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
