//! Per-CPU counters; userspace sums them.

use spillway_common::types::{Reason, Traffic};

use crate::maps::{BACKEND_STATS, REASONS, VIP_STATS};

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

#[inline(always)]
fn add(t: *mut Traffic, bytes: usize) {
    // SAFETY: per-CPU slot, no other writer on this CPU while we run.
    unsafe {
        (*t).packets += 1;
        (*t).bytes += bytes as u64;
    }
}
