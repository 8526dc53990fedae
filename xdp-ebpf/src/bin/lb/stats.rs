//! Per-CPU counters; userspace sums them.

use spillway_common::types::{Reason, Traffic};

use crate::maps::{BACKEND_NEW_FLOWS, BACKEND_STATS, REASONS, VIP_NEW_FLOWS, VIP_STATS};

#[inline(always)]
pub fn reason(reason: Reason) {
    if let Some(count) = REASONS.get_ptr_mut(reason as u32) {
        unsafe { *count += 1 };
    }
}

#[inline(always)]
pub fn vip(id: u32, bytes: usize) {
    if let Some(t) = VIP_STATS.get_ptr_mut(id) {
        add(t, bytes);
    }
}

#[inline(always)]
pub fn backend(id: u32, bytes: usize) {
    if let Some(t) = BACKEND_STATS.get_ptr_mut(id) {
        add(t, bytes);
    }
}

/// A new flow admitted to VIP `vip_id` and placed on backend `backend_id`.
#[inline(always)]
pub fn new_flow(vip_id: u32, backend_id: u32) {
    // Two plain lookups: the verifier needs each map pointer to be a constant.
    if let Some(count) = VIP_NEW_FLOWS.get_ptr_mut(vip_id) {
        // SAFETY: per-CPU slot, no other writer on this CPU while we run.
        unsafe { *count += 1 };
    }
    if let Some(count) = BACKEND_NEW_FLOWS.get_ptr_mut(backend_id) {
        unsafe { *count += 1 };
    }
}

#[inline(always)]
fn add(t: *mut Traffic, bytes: usize) {
    // SAFETY: per-CPU slot, no other writer on this CPU while we run.
    unsafe {
        (*t).packets += 1;
        (*t).bytes += bytes as u64;
    }
}
