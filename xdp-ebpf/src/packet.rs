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
