//! The three tables packets index with the program's own hashes, as userspace sees them
//! through their memory mappings: the VIP index, the ring pool and the connection table.
//! The writes keep the data path's reading protocols (see `xdp-ebpf/src/bin/lb/path.rs` and
//! `select.rs`): a VIP slot's family is published last and cleared first, a table flip is
//! one atomic 8-byte store, and a flow entry is only changed by compare-and-swap of its tag.

use std::{
    net::SocketAddr,
    ptr::{addr_of, addr_of_mut},
    sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence},
};

use spillway_common::{
    addr::from_words,
    hash::{FLOW_SEED, flow_buckets, flow_hash, vip_addr_hash, vip_home},
    limits::{FLOW_WAYS, RING_SLOTS_PER_WORD, VIP_PROBES},
    types::{
        FLOW_CONFIRMED, FLOW_TAG_LIVE, FLOW_TAG_UDP, FlowBucket, FlowEntry, FlowKey, PROTO_TCP, PROTO_UDP, RingRef, VipKey, VipMeta,
        VipSlot,
    },
};

use super::{DataplaneError, mmap::Mapped};

/// The VIP index (`spw_vips`).
pub struct VipIndex {
    pub(super) slots: Mapped<VipSlot>,
}

impl VipIndex {
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    fn home(&self, key: &VipKey) -> usize {
        vip_home(vip_addr_hash(&key.addr), key.port, key.proto, self.mask() as u32) as usize
    }

    fn window(&self, key: &VipKey) -> impl Iterator<Item = usize> + '_ {
        let home = self.home(key);
        (0..VIP_PROBES as usize).map(move |i| (home + i) & self.mask())
    }

    fn find(&self, key: &VipKey) -> Option<usize> {
        self.window(key).find(|&i| self.slots.read(i).key == *key)
    }

    /// The VIP's meta, if it is in the index.
    pub fn get(&self, key: &VipKey) -> Option<VipMeta> {
        self.find(key).map(|i| self.slots.read(i).meta)
    }

    /// The VIP a packet to `dst` would find: the exact one, else the address's any-port VIP.
    pub fn for_packet(&self, dst: &VipKey) -> Option<VipMeta> {
        self.get(dst).or_else(|| self.get(&VipKey { port: 0, ..*dst }))
    }

    /// Every VIP in the index.
    pub fn all(&self) -> Vec<(VipKey, VipMeta)> {
        (0..self.slots.len()).map(|i| self.slots.read(i)).filter(|s| s.key.family != 0).map(|s| (s.key, s.meta)).collect()
    }

    /// Inserts `key`, or updates its meta in place (flags, standby, then the active table in
    /// one store).
    pub fn set(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        if let Some(i) = self.find(key) {
            let slot = self.slots.at(i);
            // SAFETY: a slot of the live mapping; fields are aligned (see `VipSlot`).
            unsafe {
                AtomicU32::from_ptr(addr_of_mut!((*slot).meta.flags)).store(meta.flags, Ordering::Relaxed);
                AtomicU64::from_ptr(addr_of_mut!((*slot).meta.standby).cast()).store(meta.standby.to_word(), Ordering::Relaxed);
                // Release: the table's slots, written before, are visible once packets read it.
                AtomicU64::from_ptr(addr_of_mut!((*slot).meta.active).cast()).store(meta.active.to_word(), Ordering::Release);
            }
            return Ok(());
        }
        let home = self.home(key);
        let (distance, i) =
            self.window(key).enumerate().find(|&(_, i)| self.slots.read(i).key.family == 0).ok_or(DataplaneError::VipIndexFull)?;
        let slot = self.slots.at(i);
        // SAFETY: as above; the slot is free, so no packet reads it until its family is set.
        unsafe {
            std::ptr::write_volatile(addr_of_mut!((*slot).meta), *meta);
            std::ptr::write_volatile(addr_of_mut!((*slot).key), VipKey { family: 0, ..*key });
            AtomicU8::from_ptr(addr_of_mut!((*slot).key.family)).store(key.family, Ordering::Release);
            let probes = AtomicU32::from_ptr(addr_of_mut!((*self.slots.at(home)).probes));
            probes.fetch_max(distance as u32 + 1, Ordering::Release);
        }
        Ok(())
    }

    /// Removes `key` (packets stop finding it at once) and shortens its home's window.
    pub fn remove(&mut self, key: &VipKey) {
        let Some(i) = self.find(key) else { return };
        // SAFETY: a slot of the live mapping.
        unsafe { AtomicU8::from_ptr(addr_of_mut!((*self.slots.at(i)).key.family)).store(0, Ordering::Release) };
        let home = self.home(key);
        let probes = self
            .window(key)
            .enumerate()
            .filter(|&(_, j)| {
                let other = self.slots.read(j).key;
                other.family != 0 && self.home(&other) == home
            })
            .map(|(distance, _)| distance as u32 + 1)
            .max()
            .unwrap_or(0);
        // SAFETY: as above.
        unsafe { AtomicU32::from_ptr(addr_of_mut!((*self.slots.at(home)).probes)).store(probes, Ordering::Release) };
    }
}

/// The ring pool (`spw_rings`): every VIP's two Maglev tables, four 16-bit ids a word.
pub struct RingPool {
    pub(super) words: Mapped<u64>,
}

impl RingPool {
    pub fn words(&self) -> u32 {
        self.words.len() as u32
    }

    fn lane(&self, table: RingRef, slot: u32) -> *mut u16 {
        assert!(slot < table.size, "slot {slot} of a table of {}", table.size);
        let word = self.words.at((table.base + slot / RING_SLOTS_PER_WORD) as usize);
        // SAFETY: lane < 4 stays inside the 8-byte word.
        unsafe { word.cast::<u16>().add((slot % RING_SLOTS_PER_WORD) as usize) }
    }

    /// Writes `(slot, backend id)` pairs into `table`; returns how many.
    pub fn write(&mut self, table: RingRef, slots: &mut dyn Iterator<Item = (u32, u32)>) -> usize {
        let mut written = 0;
        for (slot, owner) in slots {
            // SAFETY: an aligned lane of the live mapping; ids fit 16 bits (`Capacity::MAX`).
            unsafe { std::sync::atomic::AtomicU16::from_ptr(self.lane(table, slot)).store(owner as u16, Ordering::Relaxed) };
            written += 1;
        }
        fence(Ordering::Release);
        written
    }

    pub fn read(&self, table: RingRef) -> Vec<u32> {
        // SAFETY: as in `write`.
        (0..table.size)
            .map(|slot| unsafe { std::sync::atomic::AtomicU16::from_ptr(self.lane(table, slot)).load(Ordering::Relaxed) } as u32)
            .collect()
    }
}

/// A connection-table entry, read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowInfo {
    pub backend_id: u32,
    /// Low 16 bits of the backend's generation when the flow was placed.
    pub generation: u16,
    /// A packet after the first one was seen (inserts never evict it).
    pub confirmed: bool,
    /// `FLOW_TICK_SHIFT` ticks of the last refresh (31 bits).
    pub touched_tick: u32,
}

/// The connection table (`spw_flows`).
pub struct FlowTable {
    pub(super) buckets: Mapped<FlowBucket>,
}

impl FlowTable {
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The entry holding `key` of VIP `vip_id`, with the tag it held when read.
    fn find(&self, key: &FlowKey, vip_id: u32) -> Option<(*mut FlowEntry, u64, FlowInfo)> {
        let tag = FlowEntry::tag_of(key.sport, key.dport, vip_id, key.proto == PROTO_UDP);
        let (first, second) = flow_buckets(flow_hash(key, FLOW_SEED), self.buckets.len() as u32 - 1);
        for bucket in [first, second] {
            for way in 0..FLOW_WAYS as usize {
                let entry = self.way(bucket, way);
                // SAFETY: an entry of the live mapping, read as the data path reads it.
                let e = unsafe { std::ptr::read_volatile(entry) };
                if e.tag == tag && e.src == key.src && unsafe { std::ptr::read_volatile(addr_of!((*entry).tag)) } == tag {
                    return Some((entry, tag, info(&e)));
                }
            }
        }
        None
    }

    fn way(&self, bucket: u32, way: usize) -> *mut FlowEntry {
        // SAFETY: way < FLOW_WAYS stays inside the bucket.
        unsafe { addr_of_mut!((*self.buckets.at(bucket as usize)).ways[way]) }
    }

    pub fn get(&self, key: &FlowKey, vip_id: u32) -> Option<FlowInfo> {
        self.find(key, vip_id).map(|(_, _, info)| info)
    }

    /// Removes the flow; false if it was not there (or changed meanwhile).
    pub fn remove(&mut self, key: &FlowKey, vip_id: u32) -> bool {
        let Some((entry, tag, _)) = self.find(key, vip_id) else { return false };
        // SAFETY: the entry's tag word, aligned; the same compare-and-swap the data path uses.
        unsafe { AtomicU64::from_ptr(addr_of_mut!((*entry).tag)).compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() }
    }

    /// Every live entry: (source, ports, VIP id, info). `visit` sees them one by one, so a
    /// table of millions needs no copy.
    pub fn each(&self, mut visit: impl FnMut(FlowSummary)) {
        for bucket in 0..self.buckets.len() as u32 {
            for way in 0..FLOW_WAYS as usize {
                // SAFETY: as in `find`.
                let e = unsafe { std::ptr::read_volatile(self.way(bucket, way)) };
                if e.tag & FLOW_TAG_LIVE != 0 {
                    visit(FlowSummary {
                        src: e.src,
                        sport: e.tag as u16,
                        dport: (e.tag >> 16) as u16,
                        vip_id: ((e.tag >> 32) & 0xffff) as u32,
                        udp: e.tag & FLOW_TAG_UDP != 0,
                        info: info(&e),
                    });
                }
            }
        }
    }
}

/// One live entry of the connection table, as stored.
#[derive(Clone, Copy, Debug)]
pub struct FlowSummary {
    pub src: [u32; 4],
    /// Network order, as in the packet.
    pub sport: u16,
    pub dport: u16,
    pub vip_id: u32,
    pub udp: bool,
    pub info: FlowInfo,
}

impl FlowSummary {
    /// The flow's 5-tuple, given its VIP's key (whose address, family and protocol it shares).
    pub fn key(&self, vip: &VipKey) -> FlowKey {
        let proto = if self.udp { PROTO_UDP } else { PROTO_TCP };
        FlowKey { src: self.src, dst: vip.addr, sport: self.sport, dport: self.dport, proto, family: vip.family, _pad: [0; 2] }
    }

    /// The client's address and port.
    pub fn client(&self, vip: &VipKey) -> Option<SocketAddr> {
        Some(SocketAddr::new(from_words(self.src, vip.family)?, u16::from_be(self.sport)))
    }
}

fn info(e: &FlowEntry) -> FlowInfo {
    FlowInfo {
        backend_id: e.backend_id as u32,
        generation: e.generation,
        confirmed: e.touched & FLOW_CONFIRMED != 0,
        touched_tick: e.touched & !FLOW_CONFIRMED,
    }
}
