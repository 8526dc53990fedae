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

use crate::map_batch;

/// Visits the entries of `map` (the connection table) in batches until `visit` breaks or
/// the table ends; returns how many entries were visited (see [`map_batch::for_each`]).
pub fn scan(map: &MapData, visit: &mut dyn FnMut(&FlowKey, &FlowValue) -> ControlFlow<()>) -> std::io::Result<u64> {
    map_batch::for_each(map.fd().as_fd(), visit)
}

/// What the kernel accounts for a map's memory (`memlock` in its fdinfo).
pub fn memlock_bytes(map: &MapData) -> Option<u64> {
    let fd = map.fd().as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("memlock:")).and_then(|v| v.trim().parse().ok())
}
