//! Detaching a pinned BPF link while its owner runs, as `bpftool link detach` does: the
//! fault a balancer must notice when something else removes its program.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use anyhow::{Context, Result};

use crate::bpf_syscall::bpf;

const BPF_OBJ_GET: libc::c_long = 7;
const BPF_LINK_DETACH: libc::c_long = 34;

/// Detaches the link pinned at `pinned` from its hook (the pin stays, now a defunct link).
pub fn detach(pinned: &Path) -> Result<()> {
    let path = CString::new(pinned.as_os_str().as_bytes()).context("pin path with a NUL byte")?;
    let mut attr = [0u8; 128];
    // bpf_attr.pathname (u64) at offset 0.
    attr[..8].copy_from_slice(&(path.as_ptr() as u64).to_ne_bytes());
    let fd = bpf(BPF_OBJ_GET, &mut attr).with_context(|| format!("opening {}", pinned.display()))?;
    let mut attr = [0u8; 128];
    // bpf_attr.link_detach.link_fd (u32) at offset 0.
    attr[..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    let detached = bpf(BPF_LINK_DETACH, &mut attr).with_context(|| format!("detaching {}", pinned.display()));
    // SAFETY: `fd` was returned by BPF_OBJ_GET above and is closed once.
    unsafe { libc::close(fd as i32) };
    detached.map(drop)
}
