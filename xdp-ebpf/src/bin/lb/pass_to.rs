//! `lbd --pass-to`: the frames Spillway does not serve (not IP, to no VIP, malformed: what it
//! would pass to the kernel) go on to the operator's XDP program in `spw_pass_to` instead,
//! so that one interface's hook runs Spillway first and the operator's filter for the rest.
//! Spillway's own passes (an encapsulated packet the kernel forwards) never go there. The
//! entry point calls this after counting the verdict: a tail call does not return. A VIP
//! packet pays one compare of the reason it already holds.

use aya_ebpf::programs::XdpContext;
use spillway_common::types::{CFG_F_PASS_TO, Reason};

use crate::{
    maps::{CONFIG, PASS_TO_MISSING, PASS_TO_PROGRAM},
    verdict::Verdict,
};

/// The action of a counted `verdict`, unless the frame is not Spillway's and the operator's
/// program takes it (then this does not return).
#[inline(always)]
pub fn after_counting(ctx: &XdpContext, verdict: &Verdict) -> u32 {
    if matches!(verdict.reason, Reason::PassNotIp | Reason::PassNotVip | Reason::PassMalformed) {
        hand_over(ctx);
    }
    verdict.action
}

/// Tail-calls the operator's program; returns only when the slot is empty, counting the frame
/// when `lbd --pass-to` wanted one there.
#[inline(always)]
fn hand_over(ctx: &XdpContext) {
    // SAFETY: slot 0 holds an XDP program `lbd` checked, or nothing.
    let _ = unsafe { PASS_TO_PROGRAM.tail_call(ctx, 0) };
    let wanted = CONFIG.get(0).is_some_and(|cfg| cfg.flags & CFG_F_PASS_TO != 0);
    if wanted && let Some(n) = PASS_TO_MISSING.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no other writer on this CPU while we run.
        unsafe { *n += 1 };
    }
}
