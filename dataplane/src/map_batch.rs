//! Reading BPF hash maps from userspace with `BPF_MAP_LOOKUP_BATCH` (5.6+): a few syscalls
//! per map instead of two per entry (`get_next_key` + lookup: seconds for a large map), and
//! a consistent view of each bucket. The port watcher's maps are read this way (the
//! connection table is an array mapped into memory, read in place).

use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, AsRawFd};

use aya::{
    Pod,
    maps::{MapData, MapType},
};

// include/uapi/linux/bpf.h: enum bpf_cmd.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// Entries asked for per call. A hash map's batch never splits a bucket, so this must exceed
/// the longest bucket chain (a handful in practice); ENOSPC says it did not.
pub const BATCH: usize = 4096;

/// `bpf_attr.batch`.
#[repr(C)]
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

/// Visits the entries of hash map `map`, `BATCH` per syscall, until `visit` breaks or the
/// map ends; returns how many were visited. Entries the kernel adds or removes meanwhile
/// may be seen or not; none is seen twice. A map that is not a (non-per-CPU) hash map of
/// `K` keys and `V` values is refused (`InvalidInput`) before anything is read: the kernel
/// writes whole entries of the map's own sizes into the buffers.
pub fn for_each<K: Pod, V: Pod>(map: &MapData, visit: &mut dyn FnMut(&K, &V) -> ControlFlow<()>) -> io::Result<u64> {
    check_shape::<K, V>(map)?;
    let map = map.fd().as_fd();
    // SAFETY: `Pod` types are valid for every bit pattern, all zeroes included.
    let (zero_key, zero_value) = unsafe { (std::mem::zeroed::<K>(), std::mem::zeroed::<V>()) };
    let mut keys = vec![zero_key; BATCH];
    let mut values = vec![zero_value; BATCH];
    // A hash map's batch position is a bucket index (u32).
    let mut position = 0u32;
    let mut next = 0u32;
    let mut first = true;
    let mut visited = 0;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { (&raw const position) as u64 },
            out_batch: (&raw mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: BATCH as u32,
            map_fd: map.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is the `batch` member of `union bpf_attr`; the buffers it points to
        // hold `count` keys and values of the map's sizes (the caller's types) and the
        // batch positions, all alive for the call.
        let rc =
            unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, (&raw mut attr).cast::<libc::c_void>(), size_of::<BatchAttr>()) };
        let done = if rc == 0 {
            false
        } else {
            let err = io::Error::last_os_error();
            // ENOENT: the map's end was reached; the entries of this last call are valid.
            if err.raw_os_error() != Some(libc::ENOENT) {
                return Err(err);
            }
            true
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
        position = next;
        first = false;
    }
}

/// That `map` is a hash map whose entries are a `K` and a `V`.
fn check_shape<K, V>(map: &MapData) -> io::Result<()> {
    let info = map.info().map_err(io::Error::other)?;
    let wrong = |what: String| Err(io::Error::new(io::ErrorKind::InvalidInput, what));
    if !matches!(info.map_type(), Ok(MapType::Hash | MapType::LruHash)) {
        return wrong(format!("map type {} is not a hash map of one value per key", info.map_type().map_or(-1, |t| t as i64)));
    }
    let (key, value) = (size_of::<K>(), size_of::<V>());
    if info.key_size() as usize != key || info.value_size() as usize != value {
        return wrong(format!(
            "the map holds {}-byte keys and {}-byte values, the reader {key}-byte keys and {value}-byte values",
            info.key_size(),
            info.value_size()
        ));
    }
    Ok(())
}

/// Every `(key, value)` of hash map `map` (see [`for_each`]).
pub fn lookup_all<K: Pod, V: Pod>(map: &MapData) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    for_each::<K, V>(map, &mut |k, v| {
        out.push((*k, *v));
        ControlFlow::Continue(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use aya::maps::{HashMap, IterableMap, MapData};

    use super::*;

    /// A map of more entries than one batch holds reads back whole, as the entry-by-entry
    /// walk reads it; an empty map reads as empty.
    #[test]
    fn reads_every_entry_across_batches() {
        let mut map = HashMap::<MapData, u64, u32>::create(5000, 0).expect("creating a hash map (needs root)");
        for i in 0..3000u64 {
            map.insert(&(i * 7), &((i as u32) ^ 0xabcd), 0).unwrap();
        }
        let mut got: Vec<(u64, u32)> = lookup_all(map.map()).unwrap();
        got.sort_unstable();
        let mut walked: Vec<(u64, u32)> = map.iter().collect::<Result<_, _>>().unwrap();
        walked.sort_unstable();
        assert_eq!(got.len(), 3000);
        assert_eq!(got, walked);

        let empty = HashMap::<MapData, u64, u32>::create(16, 0).unwrap();
        assert!(lookup_all::<u64, u32>(empty.map()).unwrap().is_empty());
    }

    /// A reader whose types do not fit the map's entries, or a map that is not a plain hash
    /// map, is refused before the kernel writes anything.
    #[test]
    fn a_map_of_other_shapes_is_refused() {
        let mut map = HashMap::<MapData, u64, u32>::create(16, 0).expect("creating a hash map (needs root)");
        map.insert(&1, &2, 0).unwrap();
        for error in [
            lookup_all::<u64, u64>(map.map()).unwrap_err(),
            lookup_all::<u32, u32>(map.map()).unwrap_err(),
            lookup_all::<[u64; 4], [u8; 64]>(map.map()).unwrap_err(),
        ] {
            assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
            assert!(error.to_string().contains("8-byte keys and 4-byte values"), "{error}");
        }
        let array = aya::maps::Array::<MapData, u32>::create(4, 0).unwrap();
        let error = lookup_all::<u32, u32>(array.map()).unwrap_err();
        assert!(error.to_string().contains("not a hash map"), "{error}");
        assert_eq!(lookup_all::<u64, u32>(map.map()).unwrap(), [(1, 2)]);
    }
}
