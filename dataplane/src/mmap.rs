//! Arrays the kernel lets us map into memory (`BPF_F_MMAPABLE`). The loader writes the VIP
//! index and the Maglev tables, and reads the connection table, through plain memory: a
//! table flip is one atomic 8-byte store, a table of 65,537 slots is written without 65,537
//! syscalls, and millions of flows are read without a syscall each.
//!
//! The memory is shared with the data path, which reads (and, for the connection table,
//! writes) it concurrently: it is only ever accessed through raw pointers with volatile or
//! atomic operations, never through references.

use std::{os::fd::AsFd, ptr::NonNull};

use aya::maps::MapData;
use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use super::DataplaneError;

/// A mapped array of `T` (its size a multiple of 8, as the kernel lays elements out).
pub struct Mapped<T> {
    base: NonNull<T>,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is plain shared memory, accessed only with volatile and atomic
// operations (see the module docs); nothing in it is tied to a thread.
unsafe impl<T> Send for Mapped<T> {}
unsafe impl<T> Sync for Mapped<T> {}

impl<T> Mapped<T> {
    /// Maps all of `map`, whose values must be `T`s.
    pub fn new(map: &MapData, name: &'static str) -> Result<Self, DataplaneError> {
        let info = map.info().map_err(|source| DataplaneError::Map { name, source })?;
        let size = size_of::<T>();
        if info.value_size() as usize != size || !size.is_multiple_of(8) {
            return Err(DataplaneError::Layout { name, value_size: info.value_size(), expected: size });
        }
        let len = info.max_entries() as usize;
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as usize;
        let bytes = (len * size).next_multiple_of(page);
        let length = std::num::NonZeroUsize::new(bytes).ok_or(DataplaneError::Layout { name, value_size: 0, expected: size })?;
        // SAFETY: a fresh shared mapping of the map's whole value area; the kernel checks
        // the size and that the map is mmapable.
        let base = unsafe { mmap(None, length, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, map.fd().as_fd(), 0) }
            .map_err(|errno| DataplaneError::Mmap { name, source: errno.into() })?;
        Ok(Self { base: base.cast(), len, bytes })
    }

    /// `len` zeroed elements of anonymous memory, as a fresh map holds: for unit tests of
    /// the tables' layouts, without a kernel map.
    #[cfg(test)]
    pub fn anonymous(len: usize) -> Self {
        let bytes = (len * size_of::<T>()).next_multiple_of(4096);
        let length = std::num::NonZeroUsize::new(bytes).expect("a non-empty table");
        // SAFETY: a fresh private anonymous mapping, zero-filled by the kernel.
        let base =
            unsafe { nix::sys::mman::mmap_anonymous(None, length, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_PRIVATE) }
                .expect("anonymous mapping");
        Self { base: base.cast(), len, bytes }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Pointer to element `index`.
    ///
    /// # Panics
    /// If `index` is out of range (callers index within `len`).
    pub fn at(&self, index: usize) -> *mut T {
        assert!(index < self.len, "index {index} beyond {} elements", self.len);
        // SAFETY: in bounds of the mapping.
        unsafe { self.base.as_ptr().add(index) }
    }

    /// A copy of element `index`, read with volatile loads (it may change meanwhile).
    pub fn read(&self, index: usize) -> T {
        // SAFETY: in bounds, aligned (the mapping is page-aligned and `T`'s size a multiple
        // of 8), and any bit pattern is a valid `T` for the plain-data types mapped here.
        unsafe { std::ptr::read_volatile(self.at(index)) }
    }
}

impl<T> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; nothing references it after drop.
        if let Err(errno) = unsafe { munmap(self.base.cast(), self.bytes) } {
            log::warn!("event=munmap_failed error={errno}");
        }
    }
}
