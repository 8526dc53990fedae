//! The tables packets index with the program's own hashes, as userspace sees them through
//! their memory mappings: the VIP index, the rule index, the QUIC server-id index, the ring
//! pool and the connection table. The writes keep the data path's reading protocols (see
//! `xdp-ebpf/src/bin/lb/` `path.rs`, `limits.rs` and `select.rs`): an index slot's family is published last and
//! cleared first, a table flip is one atomic 8-byte store, and a flow entry is only changed
//! by compare-and-swap of its tag.

use std::{
    net::SocketAddr,
    ops::ControlFlow,
    ptr::{addr_of, addr_of_mut},
    sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering, fence},
};

use aya::maps::{Array, MapData};
use spillway_common::{
    addr::from_words,
    hash::{RULE_SEED, addr_hash, flow_buckets, flow_hash, quic_server_home, rule_home, vip_addr_hash, vip_home},
    limits::{ANY_VIP, FLOW_WAYS, MAX_RULE_LENGTHS, RING_SLOTS_PER_WORD, VIP_PROBES, map_names},
    types::{
        FLOW_TAG_LIVE, FLOW_TAG_UDP, FlowBucket, FlowEntry, FlowInfo, FlowKey, PROTO_TCP, PROTO_UDP, QuicServer, QuicServerKey,
        QuicServerSlot, RingRef, RuleLens, RuleSlot, RuleSlotKey, RuleValue, VipKey, VipMeta, VipSlot,
    },
};

use super::{DataplaneError, mmap::Mapped};

/// A slot of an array placed by home slot and probe window (the VIP, rule and server-id
/// indexes): a key lives in the first free slot within `VIP_PROBES` of its home, and the home
/// counts how far its keys reach.
pub trait Probed: Copy {
    type Key: Copy + PartialEq;
    fn key(&self) -> Self::Key;
    fn is_free(&self) -> bool;
    fn home(key: &Self::Key, mask: u32) -> usize;
    /// The slot's family byte (published last, cleared first) and its home count.
    ///
    /// # Safety
    /// `slot` must point into a live mapping.
    unsafe fn family(slot: *mut Self) -> *mut u8;
    /// # Safety
    /// As for [`Probed::family`].
    unsafe fn probes(slot: *mut Self) -> *mut u32;
}

/// A mapped, probed index.
pub struct Index<S> {
    pub(super) slots: Mapped<S>,
}

impl<S: Probed> Index<S> {
    fn mask(&self) -> u32 {
        self.slots.len() as u32 - 1
    }

    fn window(&self, key: &S::Key) -> impl Iterator<Item = usize> + use<'_, S> {
        let home = S::home(key, self.mask());
        let mask = self.mask() as usize;
        (0..VIP_PROBES as usize).map(move |i| (home + i) & mask)
    }

    fn find(&self, key: &S::Key) -> Option<usize> {
        self.window(key).find(|&i| {
            let slot = self.slots.read(i);
            !slot.is_free() && slot.key() == *key
        })
    }

    /// Every slot in use.
    pub fn all(&self) -> impl Iterator<Item = S> + '_ {
        (0..self.slots.len()).map(|i| self.slots.read(i)).filter(|s| !s.is_free())
    }

    /// Writes `slot` (with its family cleared) into a free slot of `key`'s window, then
    /// publishes it; returns where.
    fn insert(&mut self, key: &S::Key, slot: S) -> Result<usize, DataplaneError> {
        let home = S::home(key, self.mask());
        let (distance, i) = self.window(key).enumerate().find(|&(_, i)| self.slots.read(i).is_free()).ok_or(DataplaneError::IndexFull)?;
        let at = self.slots.at(i);
        let mut unpublished = slot;
        // SAFETY: `unpublished` is a local; `at` a free slot of the live mapping, which no
        // packet matches until its family is set. The slot keeps its own home count (of
        // other keys).
        unsafe {
            let family = std::mem::replace(&mut *S::family(&mut unpublished), 0);
            *S::probes(&mut unpublished) = std::ptr::read_volatile(S::probes(at));
            std::ptr::write_volatile(at, unpublished);
            AtomicU8::from_ptr(S::family(at)).store(family, Ordering::Release);
            AtomicU32::from_ptr(S::probes(self.slots.at(home))).fetch_max(distance as u32 + 1, Ordering::Release);
        }
        Ok(i)
    }

    /// Frees slot `i` (packets stop finding it at once) and shortens its home's window.
    fn remove_at(&mut self, i: usize) {
        let key = self.slots.read(i).key();
        // SAFETY: a slot of the live mapping.
        unsafe { AtomicU8::from_ptr(S::family(self.slots.at(i))).store(0, Ordering::Release) };
        let home = S::home(&key, self.mask());
        let probes = self
            .window(&key)
            .enumerate()
            .filter(|&(_, j)| {
                let other = self.slots.read(j);
                !other.is_free() && S::home(&other.key(), self.mask()) == home
            })
            .map(|(distance, _)| distance as u32 + 1)
            .max()
            .unwrap_or(0);
        // SAFETY: as above.
        unsafe { AtomicU32::from_ptr(S::probes(self.slots.at(home))).store(probes, Ordering::Release) };
    }
}

impl Probed for VipSlot {
    type Key = VipKey;
    fn key(&self) -> VipKey {
        self.key
    }
    fn is_free(&self) -> bool {
        self.key.family == 0
    }
    fn home(key: &VipKey, mask: u32) -> usize {
        vip_home(vip_addr_hash(&key.addr), key.port, key.proto, mask) as usize
    }
    unsafe fn family(slot: *mut Self) -> *mut u8 {
        unsafe { addr_of_mut!((*slot).key.family) }
    }
    unsafe fn probes(slot: *mut Self) -> *mut u32 {
        unsafe { addr_of_mut!((*slot).probes) }
    }
}

impl Probed for RuleSlot {
    type Key = RuleSlotKey;
    fn key(&self) -> RuleSlotKey {
        self.key
    }
    fn is_free(&self) -> bool {
        self.key.family == 0
    }
    fn home(key: &RuleSlotKey, mask: u32) -> usize {
        rule_home(addr_hash(&key.addr, RULE_SEED), key.scope, key.family, key.prefix_len, mask) as usize
    }
    unsafe fn family(slot: *mut Self) -> *mut u8 {
        unsafe { addr_of_mut!((*slot).key.family) }
    }
    unsafe fn probes(slot: *mut Self) -> *mut u32 {
        unsafe { addr_of_mut!((*slot).probes) }
    }
}

impl Probed for QuicServerSlot {
    type Key = QuicServerKey;
    fn key(&self) -> QuicServerKey {
        self.key
    }
    fn is_free(&self) -> bool {
        self.key.server_id.len == 0
    }
    fn home(key: &QuicServerKey, mask: u32) -> usize {
        quic_server_home(key.vip_id, &key.server_id.words(), mask) as usize
    }
    /// The server id's length, which marks the slot used.
    unsafe fn family(slot: *mut Self) -> *mut u8 {
        unsafe { addr_of_mut!((*slot).key.server_id.len) }
    }
    unsafe fn probes(slot: *mut Self) -> *mut u32 {
        unsafe { addr_of_mut!((*slot).probes) }
    }
}

/// The VIP index (`spw_vips`).
pub type VipIndex = Index<VipSlot>;

/// The QUIC server-id index (`spw_quic_sids`): (VIP id, server id) -> backend id, and a
/// copy of that backend's entry.
pub type QuicServerIndex = Index<QuicServerSlot>;

impl QuicServerIndex {
    pub fn get(&self, key: &QuicServerKey) -> Option<QuicServer> {
        self.find(key).map(|i| self.slots.read(i).server)
    }

    pub fn entries(&self) -> Vec<(QuicServerKey, QuicServer)> {
        self.all().map(|s| (s.key, s.server)).collect()
    }

    /// Inserts `key`, or rewrites the copy of its backend's entry in place, as the backend
    /// array's own entry is written: each field old or new to a packet, never another
    /// backend's. A key that is to name another backend is removed and inserted again (its
    /// packets fall back to the 5-tuple in between), so no packet pairs one backend's id with
    /// another's fields.
    pub fn set(&mut self, key: &QuicServerKey, server: &QuicServer) -> Result<(), DataplaneError> {
        match self.find(key) {
            Some(i) if self.slots.read(i).server.backend_id == server.backend_id => {
                // SAFETY: a slot of the live mapping; the field is aligned.
                unsafe { std::ptr::write_volatile(addr_of_mut!((*self.slots.at(i)).server.backend), server.backend) };
                Ok(())
            }
            found => {
                if let Some(i) = found {
                    self.remove_at(i);
                }
                self.insert(key, QuicServerSlot { key: *key, server: *server, ..QuicServerSlot::default() }).map(drop)
            }
        }
    }

    pub fn remove(&mut self, key: &QuicServerKey) {
        if let Some(i) = self.find(key) {
            self.remove_at(i);
        }
    }
}

impl VipIndex {
    /// The VIP's meta, if it is in the index.
    pub fn get(&self, key: &VipKey) -> Option<VipMeta> {
        self.find(key).map(|i| self.slots.read(i).meta)
    }

    /// The VIP a packet to `dst` would find: the exact one, else the address's any-port VIP.
    pub fn for_packet(&self, dst: &VipKey) -> Option<VipMeta> {
        self.get(dst).or_else(|| self.get(&VipKey { port: 0, ..*dst }))
    }

    /// Every VIP in the index.
    pub fn vips(&self) -> Vec<(VipKey, VipMeta)> {
        self.all().map(|s| (s.key, s.meta)).collect()
    }

    /// Inserts `key`, or updates its meta in place (flags, standby, second chance, then the
    /// active table in one store).
    pub fn set(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        let Some(i) = self.find(key) else {
            return self.insert(key, VipSlot { key: *key, meta: *meta, ..VipSlot::default() }).map(drop);
        };
        let slot = self.slots.at(i);
        // SAFETY: a slot of the live mapping; fields are aligned (see `VipSlot`).
        unsafe {
            AtomicU32::from_ptr(addr_of_mut!((*slot).meta.quic).cast()).store(meta.quic.to_word(), Ordering::Relaxed);
            // Release: a QUIC VIP's configuration is in place once packets see its flag.
            AtomicU32::from_ptr(addr_of_mut!((*slot).meta.flags)).store(meta.flags, Ordering::Release);
            AtomicU64::from_ptr(addr_of_mut!((*slot).meta.standby).cast()).store(meta.standby.to_word(), Ordering::Relaxed);
            // Release: a second-chance table is always a table packets read as active before.
            AtomicU64::from_ptr(addr_of_mut!((*slot).meta.prior).cast()).store(meta.prior.to_word(), Ordering::Release);
            // Release: the table's slots, written before, are visible once packets read it.
            AtomicU64::from_ptr(addr_of_mut!((*slot).meta.active).cast()).store(meta.active.to_word(), Ordering::Release);
        }
        Ok(())
    }

    pub fn remove(&mut self, key: &VipKey) {
        if let Some(i) = self.find(key) {
            self.remove_at(i);
        }
    }
}

/// The rule index (`spw_rules`) and the prefix lengths each scope uses (`spw_rule_lens`).
pub struct RuleIndex {
    pub(super) index: Index<RuleSlot>,
    pub(super) lens: Array<MapData, RuleLens>,
    /// The lens slot of the global rules.
    pub(super) global_lens: u32,
}

impl RuleIndex {
    pub fn rules(&self) -> Vec<(RuleSlotKey, RuleValue)> {
        self.index.all().map(|s| (s.key, s.value)).collect()
    }

    /// Inserts or replaces a rule. A replacement goes into another slot before the old one
    /// is freed, so a packet reads the old value or the new one, never a mix.
    pub fn set(&mut self, key: &RuleSlotKey, value: &RuleValue) -> Result<(), DataplaneError> {
        let old = self.index.find(key);
        self.index.insert(key, RuleSlot { key: *key, value: *value, ..RuleSlot::default() })?;
        match old {
            Some(i) => self.index.remove_at(i),
            None => self.set_len(key, true)?,
        }
        Ok(())
    }

    pub fn remove(&mut self, key: &RuleSlotKey) -> Result<(), DataplaneError> {
        let Some(i) = self.index.find(key) else { return Ok(()) };
        self.index.remove_at(i);
        let shared = self.index.all().any(|s| (s.key.scope, s.key.family, s.key.prefix_len) == (key.scope, key.family, key.prefix_len));
        if !shared {
            self.set_len(key, false)?;
        }
        Ok(())
    }

    /// Marks (or clears) `key`'s prefix length as in use by its scope.
    fn set_len(&mut self, key: &RuleSlotKey, used: bool) -> Result<(), DataplaneError> {
        let slot = if key.scope == ANY_VIP { self.global_lens } else { key.scope };
        let named = |source| DataplaneError::Map { name: map_names::RULE_LENS, source };
        let mut lens = self.lens.get(&slot, 0).map_err(named)?;
        let list = lens.of_mut(key.family);
        let mut in_use: Vec<u8> = list.iter().copied().filter(|&l| l != 0 && l != key.prefix_len + 1).collect();
        if used {
            in_use.push(key.prefix_len + 1);
        }
        in_use.sort_unstable_by(|a, b| b.cmp(a));
        if in_use.len() > list.len() {
            return Err(DataplaneError::RuleLengths { max: list.len() });
        }
        *list = [0; MAX_RULE_LENGTHS];
        list[..in_use.len()].copy_from_slice(&in_use);
        self.lens.set(slot, &lens, 0).map_err(named)
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
        (0..table.size).map(|slot| self.slot(table, slot)).collect()
    }

    /// The backend id `table` gives a flow of Maglev hash `hash` (`None`: an empty table, as
    /// a VIP without a second-chance table has).
    pub fn choice(&self, table: RingRef, hash: u32) -> Option<u32> {
        (table.size != 0).then(|| self.slot(table, hash % table.size))
    }

    /// The backend id in `slot` of `table`.
    pub fn slot(&self, table: RingRef, slot: u32) -> u32 {
        // SAFETY: as in `write`.
        unsafe { std::sync::atomic::AtomicU16::from_ptr(self.lane(table, slot)).load(Ordering::Relaxed) as u32 }
    }
}

/// The connection table (`spw_flows`).
pub struct FlowTable {
    pub(super) buckets: Mapped<FlowBucket>,
}

impl FlowTable {
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The entry holding `key` of VIP `vip_id`, with the tag it held when read; `seed`: the
    /// table's (`LbConfig::table_seed`).
    fn find(&self, key: &FlowKey, vip_id: u32, seed: u32) -> Option<(*mut FlowEntry, u64, FlowInfo)> {
        let tag = FlowEntry::tag_of(key.sport, key.dport, vip_id, key.proto == PROTO_UDP);
        let (first, second) = flow_buckets(flow_hash(key, seed), self.buckets.len() as u32 - 1);
        for bucket in [first, second] {
            for way in 0..FLOW_WAYS as usize {
                let entry = self.way(bucket, way);
                // SAFETY: an entry of the live mapping, read as the data path reads it.
                let e = unsafe { std::ptr::read_volatile(entry) };
                if e.tag == tag && e.src == key.src && unsafe { std::ptr::read_volatile(addr_of!((*entry).tag)) } == tag {
                    return Some((entry, tag, FlowInfo::of(&e)));
                }
            }
        }
        None
    }

    fn way(&self, bucket: u32, way: usize) -> *mut FlowEntry {
        // SAFETY: way < FLOW_WAYS stays inside the bucket.
        unsafe { addr_of_mut!((*self.buckets.at(bucket as usize)).ways[way]) }
    }

    pub fn get(&self, key: &FlowKey, vip_id: u32, seed: u32) -> Option<FlowInfo> {
        self.find(key, vip_id, seed).map(|(_, _, info)| info)
    }

    /// Removes the flow; false if it was not there (or changed meanwhile).
    pub fn remove(&mut self, key: &FlowKey, vip_id: u32, seed: u32) -> bool {
        let Some((entry, tag, _)) = self.find(key, vip_id, seed) else { return false };
        // SAFETY: the entry's tag word, aligned; the same compare-and-swap the data path uses.
        unsafe { AtomicU64::from_ptr(addr_of_mut!((*entry).tag)).compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() }
    }

    /// Frees every entry, each with the data path's compare-and-swap (an insert racing it
    /// wins); returns how many were live. For tests that start each case from an empty table.
    pub fn clear(&mut self) -> u64 {
        let mut freed = 0;
        for bucket in 0..self.buckets.len() as u32 {
            for way in 0..FLOW_WAYS as usize {
                let entry = self.way(bucket, way);
                // SAFETY: as in `find` and `remove`.
                let tag = unsafe { std::ptr::read_volatile(addr_of!((*entry).tag)) };
                let word = unsafe { AtomicU64::from_ptr(addr_of_mut!((*entry).tag)) };
                if tag & FLOW_TAG_LIVE != 0 && word.compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                    freed += 1;
                }
            }
        }
        freed
    }

    /// Visits the live entries until `visit` breaks, one by one (a table of millions needs
    /// no copy); returns how many it visited.
    pub fn each(&self, mut visit: impl FnMut(FlowSummary) -> ControlFlow<()>) -> u64 {
        let mut visited = 0;
        for bucket in 0..self.buckets.len() as u32 {
            for way in 0..FLOW_WAYS as usize {
                // SAFETY: as in `find`.
                let e = unsafe { std::ptr::read_volatile(self.way(bucket, way)) };
                if e.tag & FLOW_TAG_LIVE != 0 {
                    visited += 1;
                    let flow = FlowSummary {
                        src: e.src,
                        sport: e.tag as u16,
                        dport: (e.tag >> 16) as u16,
                        vip_id: ((e.tag >> 32) & 0xffff) as u32,
                        udp: e.tag & FLOW_TAG_UDP != 0,
                        info: FlowInfo::of(&e),
                    };
                    if visit(flow).is_break() {
                        return visited;
                    }
                }
            }
        }
        visited
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

#[cfg(test)]
mod tests {
    use spillway_common::{
        limits::Capacity,
        quic_lb::ServerId,
        types::{BACKEND_ACTIVE, BackendInfo, ENCAP_GUE, FAMILY_V4},
    };

    use super::*;

    const SLOTS: usize = 64;

    fn index() -> QuicServerIndex {
        Index { slots: Mapped::anonymous(SLOTS) }
    }

    fn key(vip_id: u32, n: u16) -> QuicServerKey {
        QuicServerKey { vip_id, server_id: ServerId::new(&n.to_be_bytes()).unwrap() }
    }

    fn home(k: &QuicServerKey) -> usize {
        QuicServerSlot::home(k, SLOTS as u32 - 1)
    }

    /// Keys of VIP 1 whose home is `at`, `count` of them.
    fn homed_at(at: usize, count: usize) -> Vec<QuicServerKey> {
        (0..u16::MAX).map(|n| key(1, n)).filter(|k| home(k) == at).take(count).collect()
    }

    /// Backend `id` of VIP 1, active, at 10.0.0.`id`.
    fn server(id: u32) -> QuicServer {
        let backend = BackendInfo {
            addr: [u32::from_be_bytes([10, 0, 0, id as u8]), 0, 0, 0],
            family: FAMILY_V4,
            state: BACKEND_ACTIVE,
            vip_id: 1,
            ..BackendInfo::default()
        };
        QuicServer { backend_id: id, backend }
    }

    #[test]
    fn a_server_id_lives_at_its_home_and_is_found_by_vip_and_id() {
        let mut index = index();
        let k = key(1, 0x0a01);
        index.set(&k, &server(7)).unwrap();
        let slot = index.slots.read(home(&k));
        assert_eq!((slot.key, slot.server, slot.probes), (k, server(7), 1));
        assert_eq!(index.get(&k), Some(server(7)));
        // The same id of another VIP, and another id of the VIP, are not there.
        assert_eq!(index.get(&key(2, 0x0a01)), None);
        assert_eq!(index.get(&key(1, 0x0a02)), None);
        // Set again: another backend (removed and inserted again), its entry copied whole.
        index.set(&k, &server(9)).unwrap();
        assert_eq!((index.get(&k), index.entries().len()), (Some(server(9)), 1));
        // The same backend with its entry changed (tunnelled in GUE now): the copy follows.
        let gue = QuicServer { backend: BackendInfo { encap: ENCAP_GUE, ..server(9).backend }, ..server(9) };
        index.set(&k, &gue).unwrap();
        assert_eq!(index.get(&k), Some(gue));
    }

    #[test]
    fn ids_sharing_a_home_probe_on_and_the_home_counts_how_far() {
        let mut index = index();
        let keys = homed_at(5, 3);
        for (id, k) in (1..).zip(&keys) {
            index.set(k, &server(id)).unwrap();
        }
        assert_eq!(index.slots.read(5).probes, 3);
        for (id, k) in (1..).zip(&keys) {
            assert_eq!(index.get(k), Some(server(id)));
        }
        assert_eq!((index.slots.read(6).key, index.slots.read(7).key), (keys[1], keys[2]));
        // Removing the farthest shortens the window; the others stay found.
        index.remove(&keys[2]);
        assert_eq!((index.slots.read(5).probes, index.get(&keys[2])), (2, None));
        assert_eq!((index.get(&keys[0]), index.get(&keys[1])), (Some(server(1)), Some(server(2))));
        // A key homed in a slot another home's key took goes on past it.
        let next = homed_at(6, 1)[0];
        index.set(&next, &server(4)).unwrap();
        assert_eq!((index.slots.read(6).probes, index.get(&next)), (2, Some(server(4))));
    }

    /// Every VIP up to the capacity finds a slot: the bench's 1,000 (whose addresses a VIP
    /// index of four slots a VIP refused) and the largest capacity, on consecutive addresses
    /// as operators allocate them.
    #[test]
    fn an_index_takes_every_vip_up_to_its_capacity() {
        for vips in [1000, Capacity::MAX.vips] {
            let capacity = Capacity { vips, ..Capacity::DEFAULT };
            let mut index: VipIndex = Index { slots: Mapped::anonymous(capacity.vip_slots() as usize) };
            let key = |n: u32| VipKey {
                addr: [u32::from_ne_bytes([10, 210, (n >> 8) as u8, n as u8]), 0, 0, 0],
                port: 80u16.to_be(),
                proto: PROTO_TCP,
                family: FAMILY_V4,
            };
            for n in 0..vips {
                let meta = VipMeta { id: n, ..VipMeta::default() };
                index.set(&key(n), &meta).unwrap_or_else(|e| panic!("VIP {n} of {vips}: {e}"));
            }
            assert!((0..vips).all(|n| index.get(&key(n)).is_some_and(|m| m.id == n)), "{vips} VIPs");
        }
    }

    #[test]
    fn a_full_probe_window_refuses_the_next_id() {
        let mut index = index();
        let keys = homed_at(60, VIP_PROBES as usize + 1);
        for (id, k) in (1..).zip(&keys[..VIP_PROBES as usize]) {
            index.set(k, &server(id)).unwrap();
        }
        // The window wraps around the end of the table.
        assert_eq!(index.slots.read(3).key, keys[VIP_PROBES as usize - 1]);
        assert!(matches!(index.set(&keys[VIP_PROBES as usize], &server(99)), Err(DataplaneError::IndexFull)));
        assert_eq!(index.get(&keys[VIP_PROBES as usize]), None);
        assert_eq!(index.entries().len(), VIP_PROBES as usize);
        // A freed slot takes it.
        index.remove(&keys[0]);
        index.set(&keys[VIP_PROBES as usize], &server(99)).unwrap();
        assert_eq!(index.get(&keys[VIP_PROBES as usize]), Some(server(99)));
    }
}
