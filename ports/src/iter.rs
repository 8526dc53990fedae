//! Iterators over a map's elements (`iter/bpf_map_elem`). aya loads the programs, but its
//! `Iter::attach` cannot name the map such an iterator walks, so the link is created here
//! (BPF_LINK_CREATE with `bpf_iter_link_info.map.map_fd`); each run is one BPF_ITER_CREATE
//! and a read to the end.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

// include/uapi/linux/bpf.h: enum bpf_cmd, enum bpf_attach_type.
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;

/// `bpf_attr.link_create` up to `iter_info_len`.
#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    pad: u32,
}

/// `union bpf_iter_link_info` (16 bytes), its `map` member.
#[repr(C)]
struct IterLinkInfo {
    map_fd: u32,
    pad: [u32; 3],
}

/// `bpf_attr.iter_create`.
#[repr(C)]
struct IterCreate {
    link_fd: u32,
    flags: u32,
}

/// An iterator program linked to the map it walks; dropping it closes the link.
#[derive(Debug)]
pub(super) struct MapIterator {
    link: OwnedFd,
}

impl MapIterator {
    /// Links the loaded iterator `program` to `map`.
    pub(super) fn attach(program: BorrowedFd<'_>, map: BorrowedFd<'_>) -> io::Result<MapIterator> {
        let info = IterLinkInfo { map_fd: fd_u32(map.as_raw_fd()), pad: [0; 3] };
        let attr = LinkCreate {
            prog_fd: fd_u32(program.as_raw_fd()),
            target_fd: 0,
            attach_type: BPF_TRACE_ITER,
            flags: 0,
            iter_info: (&raw const info) as u64,
            iter_info_len: size_of::<IterLinkInfo>() as u32,
            pad: 0,
        };
        Ok(MapIterator { link: bpf(BPF_LINK_CREATE, &attr)? })
    }

    /// Runs the program over the map's current entries; returns what it wrote.
    pub(super) fn run(&self) -> io::Result<Vec<u8>> {
        let attr = IterCreate { link_fd: fd_u32(self.link.as_raw_fd()), flags: 0 };
        let mut out = Vec::new();
        File::from(bpf(BPF_ITER_CREATE, &attr)?).read_to_end(&mut out)?;
        Ok(out)
    }
}

fn fd_u32(fd: RawFd) -> u32 {
    // Open descriptors are never negative.
    fd as u32
}

/// `bpf(cmd, attr, sizeof attr)` for a command that returns a new descriptor.
fn bpf<T>(cmd: libc::c_long, attr: &T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a #[repr(C)] prefix of `union bpf_attr` for `cmd`, valid for
    // size_of::<T>() bytes; the kernel treats the rest of the union as zero. Any pointer
    // inside it points to a live value of the caller's.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, (attr as *const T).cast::<libc::c_void>(), size_of::<T>() as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just created for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}
