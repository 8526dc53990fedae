//! `lbd --pass-to`: the frames Spillway does not serve (not IP, to no VIP, malformed: what it
//! would pass to the kernel) go on to the operator's XDP program in `spw_pass_to` instead,
//! so that one interface's hook runs Spillway first and the operator's filter for the rest.
//! Spillway's own passes (an encapsulated packet the kernel forwards) never go there. Called
//! where the path ends such a frame, so a VIP packet pays nothing for it (checked in the
//! entry points after counting, it cost the table hit a tenth).

use aya_ebpf::{bindings::xdp_action::XDP_PASS, programs::XdpContext};
use spillway_common::types::{CFG_F_PASS_TO, Reason};

use crate::{
    maps::{CONFIG, PASS_TO_MISSING, PASS_TO_PROGRAM, REASONS},
    verdict::Verdict,
};

/// A frame Spillway does not serve, ending as `reason` (a pass): with `lbd --pass-to`,
/// counted and handed to the operator's program, which the tail call does not return from;
/// while its slot is empty, passed and counted by the entry point as any verdict is (and as
/// `pass_to_missing`).
#[inline(always)]
pub fn passed(ctx: &XdpContext, reason: Reason) -> Verdict {
    if CONFIG.get(0).is_some_and(|cfg| cfg.flags & CFG_F_PASS_TO != 0) {
        if let Some(count) = REASONS.get_ptr_mut(reason as u32) {
            // SAFETY (all three): per-CPU slots, no other writer on this CPU while we run;
            // slot 0 holds an XDP program `lbd` checked, or nothing.
            unsafe { *count += 1 };
            let _ = unsafe { PASS_TO_PROGRAM.tail_call(ctx, 0) };
            // Still here: nothing took it. The entry point counts it, once.
            unsafe { *count -= 1 };
        }
        if let Some(n) = PASS_TO_MISSING.get_ptr_mut(0) {
            unsafe { *n += 1 };
        }
    }
    Verdict::ended(XDP_PASS, reason)
}
