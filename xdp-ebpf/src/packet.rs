//! Bounds-checked packet access. Each check compares against `data_end` right before use,
//! the shape the verifier can prove.

use aya_ebpf::programs::XdpContext;

/// Pointer to a `T` at `offset` bytes into the frame, if the frame is long enough.
#[inline(always)]
pub fn at<T>(ctx: &XdpContext, offset: usize) -> Option<*const T> {
    let start = ctx.data();
    if start + offset + core::mem::size_of::<T>() > ctx.data_end() {
        return None;
    }
    Some((start + offset) as *const T)
}

/// Mutable variant of [`at`].
#[inline(always)]
pub fn at_mut<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    at::<T>(ctx, offset).map(|p| p as *mut T)
}

/// Frame length in bytes.
#[inline(always)]
pub fn len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}

/// The 4 octets at `ptr` as a little-endian word, in one load (see [`load_u64_le`]).
///
/// # Safety
/// `ptr` must point into the frame with 4 octets after it, as checked by [`at`].
#[inline(always)]
pub unsafe fn load_u32_le(ptr: *const u8) -> u32 {
    let word: u64;
    unsafe {
        core::arch::asm!(
            "{word} = *(u32 *)({ptr} + 0)",
            ptr = in(reg) ptr,
            word = out(reg) word,
            options(nostack, readonly, preserves_flags),
        );
    }
    word as u32
}

/// The 8 octets at `ptr` as a little-endian word, in one load wherever they lie: the BPF
/// target reads a `u64` it cannot prove aligned octet by octet (eight loads, shifts and ors),
/// and the verifier admits unaligned packet loads where the CPU has efficient unaligned
/// access (x86-64, arm64).
///
/// # Safety
/// `ptr` must point into the frame with 8 octets after it, as checked by [`at`].
#[inline(always)]
pub unsafe fn load_u64_le(ptr: *const u8) -> u64 {
    let word: u64;
    unsafe {
        core::arch::asm!(
            "{word} = *(u64 *)({ptr} + 0)",
            ptr = in(reg) ptr,
            word = out(reg) word,
            options(nostack, readonly, preserves_flags),
        );
    }
    word
}
