//! Second chance (after GitHub GLB's): a TCP packet of a connection this balancer has no
//! entry for (it began on another balancer, which died or lost it to ECMP), whose slot the
//! VIP's last table change moved, may belong to either backend: the one the table gives it
//! now or the one the table before the change gave it. It goes to the first with a tunnel
//! to the second inside (`path::forward`); the first keeps it if it has the connection and
//! sends it on otherwise (`spillway_decap`). Such packets are never remembered (every one
//! of them needs both candidates) and never limited (they are not new connections).
//!
//! They are sent by a program of their own (`second_chance_program.rs`), tail-called with
//! the two candidates: the verifier checks the balancer's path and this one apart, instead
//! of every path twice.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::RingRef;

use crate::{
    maps::{SECOND_CHANCE_HANDOVER, SECOND_CHANCE_PROGRAM, SecondChanceHandover},
    select::{self, Vip},
};

/// The flow's backend id now and before the VIP's last change, when they differ and both
/// are in use (the second by this VIP: an id freed since may have gone to another).
/// `hash`: the Maglev hash (the configured seed's).
#[inline(always)]
pub fn candidates(vip: &Vip, hash: u32) -> Option<(u32, u32)> {
    if vip.prior.size == 0 {
        return None;
    }
    let both = candidate_ids(vip.ring.to_word(), vip.prior.to_word(), vip.id, hash);
    (both != 0).then_some((both as u32, (both >> 32) as u32))
}

/// `candidates` past the size check, as a function of its own (a BPF subprogram): its many
/// ways out end in one return value, so the verifier walks the rest of the path once for
/// them all instead of once for each. 0: none (backend id 0 is never in use).
#[inline(never)]
fn candidate_ids(ring: u64, prior: u64, vip_id: u32, hash: u32) -> u64 {
    let table = |word: u64| RingRef { base: word as u32, size: (word >> 32) as u32 };
    let (Some(first), Some(second)) = (select::maglev_slot(table(ring), hash), select::maglev_slot(table(prior), hash)) else {
        return 0;
    };
    let in_use = select::active_backend(first).is_some() && select::active_backend(second).is_some_and(|b| b.vip_id == vip_id);
    if first == second || !in_use {
        return 0;
    }
    u64::from(first) | u64::from(second) << 32
}

/// Tail-calls the second-chance program with `handover`. Returns only if it cannot run (not
/// loaded yet): the packet then goes on as a new flow, as it would without second chance.
#[inline(always)]
pub fn hand_over(ctx: &XdpContext, handover: SecondChanceHandover) {
    if let Some(slot) = SECOND_CHANCE_HANDOVER.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; the program it calls runs next, on this CPU.
        unsafe {
            *slot = handover;
            SECOND_CHANCE_PROGRAM.tail_call(ctx, 0);
        }
    }
}
