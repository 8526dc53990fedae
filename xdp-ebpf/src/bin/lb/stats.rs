//! Per-CPU counters; userspace sums them.

use spillway_common::types::Traffic;

use crate::{
    maps::{BACKEND_STATS, FLOWS_UNREMEMBERED, REASONS, SECOND_CHANCE, VIP_STATS},
    verdict::Verdict,
};

/// Counts a frame under its reason, its VIP's and backend's traffic, and whether it went
/// out with a second candidate.
#[inline(always)]
pub fn count(verdict: &Verdict) {
    if let Some(count) = REASONS.get_ptr_mut(verdict.reason as u32) {
        unsafe { *count += 1 };
    }
    if let Some(id) = verdict.vip
        && let Some(t) = VIP_STATS.get_ptr_mut(id)
    {
        add(t, verdict);
    }
    if let Some(id) = verdict.backend
        && let Some(t) = BACKEND_STATS.get_ptr_mut(id)
    {
        add(t, verdict);
    }
    if verdict.second_chance
        && let Some(n) = SECOND_CHANCE.get_ptr_mut(0)
    {
        // SAFETY: per-CPU slot, no other writer on this CPU while we run.
        unsafe { *n += 1 };
    }
}

/// Counts a new flow the full connection table could not remember.
#[inline(always)]
pub fn unremembered() {
    if let Some(n) = FLOWS_UNREMEMBERED.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no other writer on this CPU while we run.
        unsafe { *n += 1 };
    }
}

#[inline(always)]
fn add(t: *mut Traffic, verdict: &Verdict) {
    // SAFETY: per-CPU slot, no other writer on this CPU while we run.
    unsafe {
        (*t).packets += 1;
        (*t).bytes += verdict.bytes as u64;
        (*t).new_flows += verdict.new_flow as u64;
    }
}
