//! Atomic add on shared map values. The BPF target offers no `core::sync::atomic` read-modify-
//! write operations, so this emits the instruction itself (BPF_ATOMIC | BPF_ADD, the classic
//! XADD, supported by every kernel with BPF).

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
