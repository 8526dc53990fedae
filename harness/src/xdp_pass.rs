//! An `XDP_PASS` program on the bridge side of each veth pair. A veth only wakes its peer
//! for frames bounced with XDP_TX when the peer runs an XDP program: GRO alone gives the
//! peer NAPI, but the kernel then leaves the frames queued until unrelated traffic flushes
//! them (seconds of delay). Loaded from two raw instructions with bpf(2), so the harness
//! needs no eBPF object of its own.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use anyhow::Result;

use crate::bpf_syscall::bpf;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_PASS: i32 = 2;

/// `r0 = XDP_PASS; exit`.
const PROGRAM: [u64; 2] = [
    // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm XDP_PASS
    0xb7 | ((XDP_PASS as u64) << 32),
    // BPF_JMP | BPF_EXIT
    0x95,
];

/// A bpf call that returns a new file descriptor, now owned.
fn bpf_fd(cmd: libc::c_long, attr: &mut [u8; 128]) -> Result<OwnedFd> {
    let fd = bpf(cmd, attr)?;
    // SAFETY: a successful call returns a new file descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn put(attr: &mut [u8; 128], offset: usize, bytes: &[u8]) {
    attr[offset..offset + bytes.len()].copy_from_slice(bytes);
}

/// Attaches `XDP_PASS` natively to interface `ifindex` of the calling thread's namespace;
/// it stays attached while the returned link lives.
pub(crate) fn attach(ifindex: u32) -> Result<OwnedFd> {
    let license = c"GPL";
    let mut load = [0u8; 128];
    put(&mut load, 0, &BPF_PROG_TYPE_XDP.to_ne_bytes());
    put(&mut load, 4, &(PROGRAM.len() as u32).to_ne_bytes());
    put(&mut load, 8, &(PROGRAM.as_ptr() as u64).to_ne_bytes());
    put(&mut load, 16, &(license.as_ptr() as u64).to_ne_bytes());
    put(&mut load, 48, b"spw_peer_pass");
    let prog = bpf_fd(BPF_PROG_LOAD, &mut load)?;

    let mut link = [0u8; 128];
    put(&mut link, 0, &(std::os::fd::AsRawFd::as_raw_fd(&prog) as u32).to_ne_bytes());
    put(&mut link, 4, &ifindex.to_ne_bytes());
    put(&mut link, 8, &BPF_XDP.to_ne_bytes());
    put(&mut link, 12, &XDP_FLAGS_DRV_MODE.to_ne_bytes());
    bpf_fd(BPF_LINK_CREATE, &mut link)
}
