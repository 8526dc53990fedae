//! Per-CPU counters; userspace sums them.

use spillway_common::types::Traffic;

use crate::{
    maps::{BACKEND_STATS, REASONS, VIP_STATS},
    path::Verdict,
};

/// Counts a frame under its reason, and its VIP's and backend's traffic.
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
