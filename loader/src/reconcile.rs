//! Turns the desired state into map updates.
//!
//! Guarantees: a packet never reads a half-written table (each VIP has two tables; the
//! inactive one is brought up to date, then one `VipMeta` update flips which one packets
//! read); only slots that differ from the inactive table's known contents are written;
//! a backend's map entry exists before any slot names it and is freed only after the flip.
//! `adopt` rebuilds all of this from pinned maps, so a restarted `lbd` writes nothing when
//! the state it restores matches what the kernel already holds.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use spillway_common::{
    addr::{from_words, to_words},
    hash::vip_filter_slot,
    limits::{MAX_BACKENDS, MAX_VIPS, VIP_FILTER_WORDS},
    maglev::{self, MaglevBackend, MaglevError},
    types::{AddrKey, BACKEND_ACTIVE, BACKEND_FREE, BackendInfo, PROTO_TCP, PROTO_UDP, VipKey, VipMeta},
};

use crate::{
    dataplane::DataplaneError,
    model::{DesiredState, Proto, Vip, VipConfig},
};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    #[error("building the Maglev table of VIP {vip}")]
    Maglev {
        vip: Vip,
        #[source]
        source: MaglevError,
    },
    #[error("no free {what} id (limit {limit})")]
    OutOfIds { what: &'static str, limit: u32 },
}

/// The map operations the reconciler needs; implemented by the real maps and, in tests,
/// by an in-memory model.
pub trait Maps {
    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, DataplaneError>;
    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError>;
    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError>;
    fn vip_addrs(&self) -> Result<Vec<AddrKey>, DataplaneError>;
    fn set_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError>;
    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError>;
    fn write_slots(&mut self, vip_id: u32, half: u32, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, DataplaneError>;
    fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError>;
    fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError>;
    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError>;
    /// The VIP address pre-filter's words (`VIP_FILTER_WORDS` of them).
    fn vip_filter(&self) -> Result<Vec<u64>, DataplaneError>;
    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError>;
    /// Zeroes the counters of an id about to be handed out, so it starts from nothing.
    fn reset_vip_stats(&mut self, id: u32) -> Result<(), DataplaneError>;
    fn reset_backend_stats(&mut self, id: u32) -> Result<(), DataplaneError>;
}

/// What one `apply` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub slots_written: usize,
    pub tables_flipped: usize,
}

struct VipRuntime {
    id: u32,
    ring_size: u32,
    active_half: u32,
    /// Contents of each half as far as we know; `None` = unknown (write every slot).
    halves: [Option<Vec<u32>>; 2],
    backends: BTreeMap<IpAddr, u32>,
}

pub struct Reconciler {
    vips: HashMap<Vip, VipRuntime>,
    /// Generation of every backend id, and whether it is in use.
    generations: Vec<u32>,
    in_use: BTreeSet<u32>,
    /// Active backends found in the maps that no VIP owns (freed on the next apply).
    orphans: Vec<u32>,
}

impl Reconciler {
    /// Rebuilds the runtime view from the maps (empty maps give an empty view).
    pub fn adopt(maps: &dyn Maps) -> Result<Self, ReconcileError> {
        let mut generations = vec![0; MAX_BACKENDS as usize];
        let mut by_vip: HashMap<u32, BTreeMap<IpAddr, u32>> = HashMap::new();
        let mut active = Vec::new();
        for id in 1..MAX_BACKENDS {
            let info = maps.backend(id)?;
            generations[id as usize] = info.generation;
            if info.state == BACKEND_ACTIVE
                && let Some(addr) = from_words(info.addr, info.family)
            {
                by_vip.entry(info.vip_id).or_default().insert(addr, id);
                active.push(id);
            }
        }
        let mut vips = HashMap::new();
        for (key, meta) in maps.vips()? {
            let Some(vip) = vip_from_key(&key) else { continue };
            let mut halves = [None, None];
            halves[(meta.active_half & 1) as usize] = Some(maps.read_ring(meta.id, meta.active_half & 1, meta.ring_size)?);
            let backends = by_vip.remove(&meta.id).unwrap_or_default();
            vips.insert(vip, VipRuntime { id: meta.id, ring_size: meta.ring_size, active_half: meta.active_half & 1, halves, backends });
        }
        let orphans: Vec<u32> = by_vip.into_values().flat_map(|b| b.into_values()).collect();
        let in_use = active.into_iter().collect();
        Ok(Self { vips, generations, in_use, orphans })
    }

    /// Makes the maps carry `desired`.
    pub fn apply(&mut self, maps: &mut dyn Maps, desired: &DesiredState) -> Result<ApplyReport, ReconcileError> {
        let mut report = ApplyReport::default();
        let gone: Vec<Vip> = self.vips.keys().filter(|v| !desired.vips.contains_key(v)).copied().collect();
        for vip in gone {
            self.remove_vip(maps, &vip)?;
        }
        for (vip, config) in &desired.vips {
            self.apply_vip(maps, vip, config, &mut report)?;
        }
        for id in std::mem::take(&mut self.orphans) {
            self.free_backend(maps, id)?;
        }
        sync_vip_addrs(maps, desired)?;
        sync_vip_filter(maps, desired)?;
        Ok(report)
    }

    /// Backend id of `backend` in `vip`, if it has one (for stats).
    pub fn backend_id(&self, vip: &Vip, backend: &IpAddr) -> Option<u32> {
        self.vips.get(vip)?.backends.get(backend).copied()
    }

    /// Ring id of `vip` (for stats).
    pub fn vip_id(&self, vip: &Vip) -> Option<u32> {
        self.vips.get(vip).map(|r| r.id)
    }

    fn apply_vip(&mut self, maps: &mut dyn Maps, vip: &Vip, config: &VipConfig, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        let mut runtime = match self.vips.remove(vip) {
            Some(runtime) => runtime,
            None => VipRuntime {
                id: self.free_vip_id(maps)?,
                ring_size: config.ring_size,
                // A new VIP is "flipping" to half 0, whose stale contents are unknown.
                active_half: 1,
                halves: [None, None],
                backends: BTreeMap::new(),
            },
        };
        let is_new = runtime.halves.iter().all(Option::is_none);
        // New backends exist in the map before any slot can name them.
        for addr in config.backends.keys() {
            if !runtime.backends.contains_key(addr) {
                let id = self.allocate_backend(maps, runtime.id, *addr)?;
                runtime.backends.insert(*addr, id);
            }
        }
        let members: Vec<MaglevBackend> = config
            .backends
            .iter()
            .map(|(addr, b)| MaglevBackend { id: runtime.backends[addr], addr: to_words(*addr).0, weight: b.weight })
            .collect();
        let table = maglev::build(&members, config.ring_size).map_err(|source| ReconcileError::Maglev { vip: *vip, source })?;

        let active = runtime.active_half as usize;
        let unchanged = !is_new && runtime.ring_size == config.ring_size && runtime.halves[active].as_deref() == Some(&table[..]);
        if !unchanged {
            let target = 1 - runtime.active_half;
            let mut slots: Box<dyn Iterator<Item = (u32, u32)>> = match &runtime.halves[target as usize] {
                Some(known) => Box::new(maglev::changed_slots(known, &table)),
                None => Box::new(table.iter().enumerate().map(|(i, &id)| (i as u32, id))),
            };
            report.slots_written += maps.write_slots(runtime.id, target, &mut slots)?;
            drop(slots);
            let meta = VipMeta { id: runtime.id, ring_size: config.ring_size, active_half: target };
            maps.set_vip(&vip_key(vip), &meta)?;
            report.tables_flipped += 1;
            runtime.active_half = target;
            runtime.ring_size = config.ring_size;
            runtime.halves[target as usize] = Some(table);
        }
        // Backends leaving the VIP are freed only after packets stopped reading their slots.
        let leaving: Vec<IpAddr> = runtime.backends.keys().filter(|a| !config.backends.contains_key(a)).copied().collect();
        for addr in leaving {
            if let Some(id) = runtime.backends.remove(&addr) {
                self.free_backend(maps, id)?;
            }
        }
        self.vips.insert(*vip, runtime);
        Ok(())
    }

    fn remove_vip(&mut self, maps: &mut dyn Maps, vip: &Vip) -> Result<(), ReconcileError> {
        let Some(runtime) = self.vips.remove(vip) else { return Ok(()) };
        maps.remove_vip(&vip_key(vip))?;
        for id in runtime.backends.into_values() {
            self.free_backend(maps, id)?;
        }
        Ok(())
    }

    fn free_vip_id(&self, maps: &mut dyn Maps) -> Result<u32, ReconcileError> {
        let used: BTreeSet<u32> = self.vips.values().map(|r| r.id).collect();
        let id = (0..MAX_VIPS).find(|id| !used.contains(id)).ok_or(ReconcileError::OutOfIds { what: "VIP", limit: MAX_VIPS })?;
        maps.reset_vip_stats(id)?;
        Ok(id)
    }

    fn allocate_backend(&mut self, maps: &mut dyn Maps, vip_id: u32, addr: IpAddr) -> Result<u32, ReconcileError> {
        let id = (1..MAX_BACKENDS)
            .find(|id| !self.in_use.contains(id))
            .ok_or(ReconcileError::OutOfIds { what: "backend", limit: MAX_BACKENDS - 1 })?;
        maps.reset_backend_stats(id)?;
        let (words, family) = to_words(addr);
        let info =
            BackendInfo { addr: words, family, state: BACKEND_ACTIVE, _pad: [0; 2], generation: self.generations[id as usize], vip_id };
        maps.set_backend(id, &info)?;
        self.in_use.insert(id);
        Ok(id)
    }

    /// Frees a backend id; bumping the generation makes its flows re-hash even if the id is
    /// handed out again.
    fn free_backend(&mut self, maps: &mut dyn Maps, id: u32) -> Result<(), ReconcileError> {
        let generation = self.generations[id as usize].wrapping_add(1);
        let info = BackendInfo { state: BACKEND_FREE, generation, ..BackendInfo::default() };
        maps.set_backend(id, &info)?;
        self.generations[id as usize] = generation;
        self.in_use.remove(&id);
        Ok(())
    }
}

fn sync_vip_addrs(maps: &mut dyn Maps, desired: &DesiredState) -> Result<(), DataplaneError> {
    let want: BTreeSet<([u32; 4], u8)> = desired.vips.keys().map(|v| to_words(v.addr)).collect();
    let have = maps.vip_addrs()?;
    for key in &have {
        if !want.contains(&(key.addr, key.family)) {
            maps.remove_vip_addr(key)?;
        }
    }
    for (addr, family) in want {
        let key = AddrKey { addr, family, _pad: [0; 3] };
        if !have.contains(&key) {
            maps.set_vip_addr(&key)?;
        }
    }
    Ok(())
}

/// Sets exactly the pre-filter bits of the desired VIP addresses, writing changed words only.
/// Bits are set before the VIP entries that need them exist (apply runs this last, but a
/// new VIP's packets pass as non-VIP until then, which is what an absent VIP does anyway).
fn sync_vip_filter(maps: &mut dyn Maps, desired: &DesiredState) -> Result<(), DataplaneError> {
    let mut want = vec![0u64; VIP_FILTER_WORDS as usize];
    for vip in desired.vips.keys() {
        let (word, bit) = vip_filter_slot(&to_words(vip.addr).0);
        want[word as usize] |= bit;
    }
    let have = maps.vip_filter()?;
    for (i, (&w, &h)) in want.iter().zip(&have).enumerate() {
        if w != h {
            maps.set_vip_filter_word(i as u32, w)?;
        }
    }
    Ok(())
}

pub fn vip_key(vip: &Vip) -> VipKey {
    let (addr, family) = to_words(vip.addr);
    VipKey { addr, port: vip.port.to_be(), proto: vip.proto.number(), family }
}

fn vip_from_key(key: &VipKey) -> Option<Vip> {
    let proto = match key.proto {
        PROTO_TCP => Proto::Tcp,
        PROTO_UDP => Proto::Udp,
        _ => return None,
    };
    Some(Vip { addr: from_words(key.addr, key.family)?, port: u16::from_be(key.port), proto })
}

#[cfg(test)]
mod tests;
