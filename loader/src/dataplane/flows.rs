//! Reading the connection table from userspace. It holds up to `FLOW_TABLE_ENTRIES` (2^20)
//! entries: walking it a key at a time costs two syscalls per entry (seconds for a full
//! table), so it is read in batches (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+), and the caller
//! bounds every walk (it may stop after any entry).

use std::{
    ops::ControlFlow,
    os::fd::{AsFd, AsRawFd},
};

use aya::maps::MapData;
use spillway_common::types::{FlowKey, FlowValue};

/// Entries read per syscall: ~224 KiB of buffers, few syscalls for a full table.
pub const SCAN_BATCH: usize = 4096;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `union bpf_attr`'s `batch` member (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Visits the entries of `map` (the connection table) in batches until `visit` breaks or
/// the table ends; returns how many entries were visited. Entries the kernel adds or evicts
/// meanwhile may be seen or not; none is seen twice.
pub fn scan(map: &MapData, visit: &mut dyn FnMut(&FlowKey, &FlowValue) -> ControlFlow<()>) -> std::io::Result<u64> {
    let mut keys = vec![FlowKey::default(); SCAN_BATCH];
    let mut values = vec![FlowValue::default(); SCAN_BATCH];
    // The hash map's batch token is a bucket index.
    let (mut token_in, mut token_out) = (0u32, 0u32);
    let mut first = true;
    let mut visited = 0;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const token_in as u64 },
            out_batch: &raw mut token_out as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: SCAN_BATCH as u32,
            map_fd: map.fd().as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the attribute points at buffers of `count` keys and values of the map's
        // sizes (the map was opened with these types) and at the two tokens, all alive for
        // the call.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &raw mut attr, size_of::<BatchAttr>() as u32) };
        let done = if rc < 0 {
            let error = std::io::Error::last_os_error();
            // ENOENT: the walk reached the end (`count` still holds the last entries).
            if error.raw_os_error() != Some(libc::ENOENT) {
                return Err(error);
            }
            true
        } else {
            false
        };
        for (key, value) in keys.iter().zip(&values).take(attr.count as usize) {
            visited += 1;
            if visit(key, value).is_break() {
                return Ok(visited);
            }
        }
        if done {
            return Ok(visited);
        }
        token_in = token_out;
        first = false;
    }
}

/// What the kernel accounts for a map's memory (`memlock` in its fdinfo).
pub fn memlock_bytes(map: &MapData) -> Option<u64> {
    let fd = map.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
}
