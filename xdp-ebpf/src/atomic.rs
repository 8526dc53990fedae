//! Atomics on shared map values. The BPF target offers no `core::sync::atomic` read-modify-
//! write operations, so these emit the instructions themselves (BPF_ATOMIC | BPF_ADD, the classic
//! XADD, supported by every kernel with BPF; and compare-and-swap).

/// `*ptr += value`, atomically with respect to other CPUs.
///
/// # Safety
/// `ptr` must point to a live, 8-byte aligned `u64` (e.g. a field of a map value).
#[inline(always)]
pub unsafe fn add_u64(ptr: *mut u64, value: u64) {
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({ptr} + 0) += {value}",
            ptr = in(reg) ptr,
            value = in(reg) value,
            options(nostack),
        );
    }
}

/// Atomically replaces `*ptr` with `new` if it holds `old`; returns what it held (the swap
/// happened when that equals `old`). BPF_ATOMIC | BPF_CMPXCHG (Linux 5.12+).
///
/// # Safety
/// `ptr` must point to a live, 8-byte aligned `u64` (e.g. a field of a map value).
#[inline(always)]
pub unsafe fn cmpxchg_u64(ptr: *mut u64, old: u64, new: u64) -> u64 {
    let prev: u64;
    unsafe {
        core::arch::asm!(
            "r0 = cmpxchg_64({ptr} + 0, r0, {new})",
            ptr = in(reg) ptr,
            new = in(reg) new,
            inout("r0") old => prev,
            options(nostack),
        );
    }
    prev
}
