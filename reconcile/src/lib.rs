//! Turns the desired state into map updates.
//!
//! Guarantees: a packet never reads a half-written table (each VIP has two tables in the
//! ring pool; the standby one is brought up to date, then one 8-byte store in the VIP's
//! index slot swaps which one packets read); only slots that differ from the standby
//! table's known contents are written; a backend's map entry exists before any slot names
//! it and is freed only after the flip. `adopt` rebuilds all of this from pinned maps, so a
//! restarted `lbd` writes nothing when the state it restores matches what the kernel
//! already holds.
//!
//! Second chance: a VIP has a third table once its table changed after having settled; the
//! table packets read until that change becomes its second-chance table in the same store
//! that publishes the new one, and the old second-chance table becomes the standby. No slot
//! is copied, and a table packets may read as second chance is never written.
//!
//! New-flow limits: every VIP's slot of the limits array holds its effective limits when it
//! has its own (`configured = 0` when it has none, so the data path falls back to the
//! default slot). Rules: one entry per rule in the rule index, keyed by VIP scope, family
//! and CIDR; each rule keeps its id (the index of its counters) for as long as it exists,
//! also across restarts (ids are adopted back from the index). A VIP with rules of its own
//! carries a flag, so its new flows look up scoped rules only when there are some. A new id,
//! like a new VIP id, starts with zeroed kernel state. Slots and entries are written only
//! when they differ.

mod pool;
mod quic;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
    time::{Duration, Instant},
};

use spillway_common::{
    addr::{from_words, to_words},
    hash::{vip_addr_hash, vip_filter_slot},
    limits::{ANY_VIP, Capacity, MAX_RULES, SECOND_CHANCE_SETTLE_MS, VIP_FILTER_WORDS},
    maglev::{self, MaglevBackend, MaglevError},
    prefix::masked,
    quic_lb::QuicLbConfig,
    types::{
        ADDR_F_ECHO, ADDR_F_VIP, AddrKey, BACKEND_ACTIVE, BACKEND_F_NEW_FLOWS, BACKEND_FREE, BackendInfo, ENCAP_GUE,
        LIMIT_F_OBSERVE_SOURCE, Limits, PROTO_TCP, PROTO_UDP, QuicServer, QuicServerKey, RULE_BLOCK, RULE_EXEMPT, RULE_LIMIT, Rate,
        RingRef, RuleSlotKey, RuleValue, VIP_F_QUIC, VIP_F_SCOPED_RULES, VIP_SOURCE_HASH_BITS, VipKey, VipMeta, vip_source_hash_flags,
    },
};

use self::pool::RingPool;
use spillway_model::{Cidr, DesiredState, Encap, LimitConfig, Proto, RuleAction, RuleConfig, RuleMatch, Vip, VipConfig};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("building the Maglev table of VIP {vip}")]
    Maglev {
        vip: Vip,
        #[source]
        source: MaglevError,
    },
    #[error("no free {what} id (limit {limit}; lbd --max-{what}s raises it)")]
    OutOfIds { what: &'static str, limit: u32 },
    #[error(
        "no room in the ring pool for VIP {vip}'s table of {size} slots ({free} of {total} slots free; lbd --ring-slots raises it, \
         a smaller --ring-size needs fewer)"
    )]
    RingPoolFull { vip: Vip, size: u32, free: u64, total: u64 },
    #[error("the pinned maps are inconsistent ({what}); run `lbd --cleanup` (this drops the connection table)")]
    Inconsistent { what: String },
}

/// A failed [`Maps`] operation: the implementation's own error (which map, and why), shown
/// as is. The reconciler only passes it on.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct MapsError(Box<dyn std::error::Error + Send + Sync>);

impl MapsError {
    pub fn new(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(Box::new(source))
    }
}

/// The map operations the reconciler needs; implemented by the real maps and, in tests,
/// by an in-memory model.
pub trait Maps {
    /// The sizes the maps were created with.
    fn capacity(&self) -> Capacity;
    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, MapsError>;
    /// Inserts the VIP, or updates it in place: its flags, then its standby table, then (in
    /// one store) its active table.
    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), MapsError>;
    fn remove_vip(&mut self, key: &VipKey) -> Result<(), MapsError>;
    /// The VIP addresses and their `ADDR_F_*` flags.
    fn vip_addrs(&self) -> Result<Vec<(AddrKey, u32)>, MapsError>;
    /// Inserts the address, or replaces its flags (one word: a packet reads the old or the new).
    fn set_vip_addr(&mut self, key: &AddrKey, flags: u32) -> Result<(), MapsError>;
    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), MapsError>;
    /// Writes `(slot, backend id)` pairs into `table`.
    fn write_slots(&mut self, table: RingRef, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, MapsError>;
    fn read_ring(&self, table: RingRef) -> Result<Vec<u32>, MapsError>;
    fn backend(&self, id: u32) -> Result<BackendInfo, MapsError>;
    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), MapsError>;
    /// The VIP address pre-filter's words (`VIP_FILTER_WORDS` of them).
    fn vip_filter(&self) -> Result<Vec<u64>, MapsError>;
    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), MapsError>;
    /// Zeroes the state of a VIP id about to be handed out, so it starts from nothing: its
    /// counters, its new-flow budget's bucket and the per-source entries of that id.
    fn reset_vip_stats(&mut self, id: u32) -> Result<(), MapsError>;
    fn reset_backend_stats(&mut self, id: u32) -> Result<(), MapsError>;
    /// Every slot of the limits array (`Capacity::default_limit_slot() + 1` of them).
    fn limits(&self) -> Result<Vec<Limits>, MapsError>;
    fn set_limits(&mut self, slot: u32, limits: &Limits) -> Result<(), MapsError>;
    /// Every rule in the rule index.
    fn rules(&self) -> Result<Vec<(RuleSlotKey, RuleValue)>, MapsError>;
    /// Inserts or replaces one rule (a replaced value is never seen half-written).
    fn set_rule(&mut self, key: &RuleSlotKey, value: &RuleValue) -> Result<(), MapsError>;
    fn remove_rule(&mut self, key: &RuleSlotKey) -> Result<(), MapsError>;
    /// Zeroes a rule id's bucket and counters before the id is handed out.
    fn reset_rule_state(&mut self, id: u32) -> Result<(), MapsError>;
    /// Every (VIP id, server id) -> backend entry of QUIC VIPs.
    fn quic_servers(&self) -> Result<Vec<(QuicServerKey, QuicServer)>, MapsError>;
    fn set_quic_server(&mut self, key: &QuicServerKey, server: &QuicServer) -> Result<(), MapsError>;
    fn remove_quic_server(&mut self, key: &QuicServerKey) -> Result<(), MapsError>;
    /// Encrypted QUIC-LB config ids: the key in `key_file` for config `config_id` of VIP
    /// `vip_id`, or none. Keys live in the kernel only: nothing reads them back, and a
    /// reconciler that adopted the maps writes them all on its first apply.
    fn set_quic_key(&mut self, vip_id: u32, config_id: u8, key_file: Option<&std::path::Path>) -> Result<(), MapsError>;
    /// A VIP's config id beside the one in its slot (`quic_next`), or none.
    fn set_quic_config(&mut self, vip_id: u32, config_id: u8, config: Option<QuicLbConfig>) -> Result<(), MapsError>;
}

/// What one `apply` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub slots_written: usize,
    pub tables_flipped: usize,
    /// Slots of the limits array written.
    pub limits_written: usize,
    /// Rule index entries inserted, replaced or removed.
    pub rules_written: usize,
    /// VIPs whose change found no room in the ring pool for a second-chance table: their
    /// flows that move between balancers get one candidate only until the next change.
    pub second_chance_lacking: usize,
}

/// A rule's entry as the reconciler last wrote (or adopted) it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RuleRuntime {
    key: RuleSlotKey,
    value: RuleValue,
}

/// A table and its contents as far as we know (`None`: unknown, write every slot).
struct Table {
    at: RingRef,
    slots: Option<Vec<u32>>,
}

struct VipRuntime {
    id: u32,
    /// The ring size and members the active table was built from (`None` after adopting:
    /// built again once to compare).
    built: Option<(u32, Vec<MaglevBackend>)>,
    flags: u32,
    /// Its QUIC-LB configuration (`EMPTY` unless the VIP is QUIC).
    quic: QuicLbConfig,
    /// Not yet in the VIP index: its first table is being written.
    unpublished: bool,
    active: Table,
    standby: Table,
    /// Second chance: the table in force before the VIP's last change episode.
    prior: Option<Table>,
    /// When the table packets read last changed (`None`: not since this reconciler began).
    changed_at: Option<Instant>,
    backends: BTreeMap<IpAddr, u32>,
}

impl VipRuntime {
    /// The table packets read is published and names a backend: a new flow finds one.
    fn places_new_flows(&self) -> bool {
        !self.unpublished && self.active.slots.as_ref().is_some_and(|t| t.iter().any(|&id| id != maglev::EMPTY_SLOT))
    }

    fn meta(&self) -> VipMeta {
        let prior = self.prior.as_ref().map_or(RingRef::default(), |t| t.at);
        VipMeta { id: self.id, flags: self.flags, active: self.active.at, standby: self.standby.at, prior, quic: self.quic }
    }

    fn tables(&self) -> impl Iterator<Item = RingRef> + '_ {
        [Some(&self.active), Some(&self.standby), self.prior.as_ref()].into_iter().flatten().map(|t| t.at)
    }
}

pub struct Reconciler {
    capacity: Capacity,
    vips: HashMap<Vip, VipRuntime>,
    pool: RingPool,
    /// Generation of every backend id, and the ids not in use (lowest handed out first).
    generations: Vec<u32>,
    free_ids: BTreeSet<u32>,
    /// The backend ids whose entry has `BACKEND_F_NEW_FLOWS` set.
    takes_new_flows: BTreeSet<u32>,
    /// The backend ids whose entry says GUE (`ENCAP_GUE`).
    gue: BTreeSet<u32>,
    /// Active backends found in the maps that no VIP owns (freed on the next apply).
    orphans: Vec<u32>,
    /// What every slot of the limits array holds.
    limits: Vec<Limits>,
    /// The entry of every rule in the maps.
    rules: BTreeMap<RuleMatch, RuleRuntime>,
    /// Entries found in the maps that no rule can own (removed on the next apply).
    stale_rules: Vec<RuleSlotKey>,
    /// What the VIP address map (addresses and their `ADDR_F_*` flags) and the pre-filter
    /// hold (read once, then kept).
    vip_addrs: HashMap<AddrKey, u32>,
    vip_filter: Vec<u64>,
    /// Table changes closer together than this are one change for second chance.
    settle: Duration,
    /// What the server-id index holds.
    quic_servers: HashMap<QuicServerKey, QuicServer>,
    /// The key files and second config ids written, by (VIP id, config id): not readable
    /// from the maps, so empty after `adopt`.
    quic_keys: BTreeMap<(u32, u8), std::path::PathBuf>,
    quic_configs: BTreeMap<(u32, u8), QuicLbConfig>,
}

impl Reconciler {
    /// Rebuilds the runtime view from the maps (empty maps give an empty view).
    pub fn adopt(maps: &dyn Maps) -> Result<Self, ReconcileError> {
        let capacity = maps.capacity();
        let mut generations = vec![0; capacity.backend_slots() as usize];
        let mut by_vip: HashMap<u32, BTreeMap<IpAddr, u32>> = HashMap::new();
        let mut active = Vec::new();
        let mut takes_new_flows = BTreeSet::new();
        let mut gue = BTreeSet::new();
        for id in 1..capacity.backend_slots() {
            let info = maps.backend(id)?;
            generations[id as usize] = info.generation;
            if info.state == BACKEND_ACTIVE
                && let Some(addr) = from_words(info.addr, info.family)
            {
                by_vip.entry(info.vip_id).or_default().insert(addr, id);
                active.push(id);
                if info.flags & BACKEND_F_NEW_FLOWS != 0 {
                    takes_new_flows.insert(id);
                }
                if info.encap == ENCAP_GUE {
                    gue.insert(id);
                }
            }
        }
        let mut vips = HashMap::new();
        for (key, meta) in maps.vips()? {
            let Some(vip) = vip_from_key(&key) else { continue };
            let table = |at: RingRef| -> Result<Table, ReconcileError> { Ok(Table { at, slots: Some(maps.read_ring(at)?) }) };
            let backends = by_vip.remove(&meta.id).unwrap_or_default();
            let runtime = VipRuntime {
                id: meta.id,
                built: None,
                flags: meta.flags,
                quic: meta.quic,
                unpublished: false,
                active: table(meta.active)?,
                standby: table(meta.standby)?,
                prior: if meta.prior.size == 0 { None } else { Some(table(meta.prior)?) },
                // Unknown: the next change starts an episode.
                changed_at: None,
                backends,
            };
            vips.insert(vip, runtime);
        }
        let tables = vips.values().flat_map(VipRuntime::tables);
        let pool = RingPool::with_used(capacity.ring_words(), tables)
            .ok_or_else(|| ReconcileError::Inconsistent { what: "two VIPs' Maglev tables overlap, or one lies outside the pool".into() })?;
        let orphans: Vec<u32> = by_vip.into_values().flat_map(|b| b.into_values()).collect();
        let in_use: BTreeSet<u32> = active.into_iter().collect();
        let free_ids = (1..capacity.backend_slots()).filter(|id| !in_use.contains(id)).collect();
        let mut limits = maps.limits()?;
        limits.resize(capacity.default_limit_slot() as usize + 1, Limits::default());
        let vip_by_id: HashMap<u32, Vip> = vips.iter().map(|(vip, r)| (r.id, *vip)).collect();
        let mut rules = BTreeMap::new();
        let mut stale_rules = Vec::new();
        let mut ids = BTreeSet::new();
        for (key, mut value) in maps.rules()? {
            match rule_from_key(&key, &vip_by_id) {
                Some(rule) if !rules.contains_key(&rule) => {
                    // An id out of range or taken twice is replaced on the next apply.
                    if value.id >= MAX_RULES || !ids.insert(value.id) {
                        value.id = u32::MAX;
                    }
                    rules.insert(rule, RuleRuntime { key, value });
                }
                _ => stale_rules.push(key),
            }
        }
        let vip_addrs = maps.vip_addrs()?.into_iter().collect();
        let mut vip_filter = maps.vip_filter()?;
        vip_filter.resize(VIP_FILTER_WORDS as usize, 0);
        let settle = Duration::from_millis(SECOND_CHANCE_SETTLE_MS);
        let quic_servers = maps.quic_servers()?.into_iter().collect();
        Ok(Self {
            capacity,
            vips,
            pool,
            generations,
            free_ids,
            takes_new_flows,
            gue,
            orphans,
            limits,
            rules,
            stale_rules,
            vip_addrs,
            vip_filter,
            settle,
            quic_servers,
            quic_keys: BTreeMap::new(),
            quic_configs: BTreeMap::new(),
        })
    }

    /// How long a VIP's table must stay unchanged before its next change replaces the
    /// second-chance table (the slow-start ramp of an added backend is one change).
    pub fn set_second_chance_settle(&mut self, settle: Duration) {
        self.settle = settle;
    }

    /// Makes the maps carry `desired`.
    pub fn apply(&mut self, maps: &mut dyn Maps, desired: &DesiredState) -> Result<ApplyReport, ReconcileError> {
        let mut report = ApplyReport::default();
        // Rules of VIPs about to go are removed first: a reused VIP id never sees them.
        self.remove_rules(maps, desired, &mut report)?;
        let gone: Vec<Vip> = self.vips.keys().filter(|v| !desired.vips.contains_key(v)).copied().collect();
        for vip in gone {
            self.remove_vip(maps, &vip)?;
        }
        for (vip, config) in &desired.vips {
            self.apply_vip(maps, desired, vip, config, &mut report)?;
        }
        for id in std::mem::take(&mut self.orphans) {
            self.free_backend(maps, id)?;
        }
        self.sync_limits(maps, desired, &mut report)?;
        self.sync_rules(maps, desired, &mut report)?;
        // Before the flag sends a QUIC VIP's packets to the QUIC program; keys before the
        // configurations that name them, and what is no longer wanted only after the slots
        // stopped naming it.
        self.sync_quic_servers(maps, desired)?;
        let wanted = quic::wanted_keys(self, desired);
        self.add_quic_keys(maps, &wanted)?;
        self.sync_vip_flags(maps, desired)?;
        self.remove_quic_keys(maps, &wanted)?;
        // After the tables: an address answers echo requests once a table can place a new flow.
        let echo = self.answering_addrs();
        sync_vip_addrs(maps, &mut self.vip_addrs, desired, &echo)?;
        sync_vip_filter(maps, &mut self.vip_filter, desired)?;
        Ok(report)
    }

    /// The addresses of the VIPs whose table packets read names a backend: those answer echo
    /// requests (`ADDR_F_ECHO`). A backend out (health, drain, weight 0, removed) is in no
    /// slot, so an address whose VIPs have none left stops answering.
    fn answering_addrs(&self) -> HashSet<AddrKey> {
        self.vips.iter().filter(|(_, r)| r.places_new_flows()).map(|(vip, _)| addr_key(vip.addr)).collect()
    }

    /// Id of a rule's counters, if it has one (for `lbctl rules list`).
    pub fn rule_id(&self, rule: &RuleMatch) -> Option<u32> {
        self.rules.get(rule).map(|r| r.value.id).filter(|&id| id < MAX_RULES)
    }

    /// Backend id of `backend` in `vip`, if it has one (for stats).
    pub fn backend_id(&self, vip: &Vip, backend: &IpAddr) -> Option<u32> {
        self.vips.get(vip)?.backends.get(backend).copied()
    }

    /// Id and generation of `backend` in `vip`: what a probe's mark names (see
    /// `types::probe_mark`).
    pub fn backend_slot(&self, vip: &Vip, backend: &IpAddr) -> Option<(u32, u32)> {
        let id = self.backend_id(vip, backend)?;
        Some((id, *self.generations.get(id as usize)?))
    }

    /// Ring id of `vip` (for stats).
    pub fn vip_id(&self, vip: &Vip) -> Option<u32> {
        self.vips.get(vip).map(|r| r.id)
    }

    /// Slots of the ring pool: (free, total).
    pub fn ring_pool(&self) -> (u64, u64) {
        (self.pool.free_slots(), self.pool.slots())
    }

    /// The table packets of `vip` read, slot by slot as backend addresses: what every
    /// balancer given the same state holds, whatever ids it handed out (`None`: unknown).
    pub fn active_table(&self, vip: &Vip) -> Option<Vec<Option<IpAddr>>> {
        let runtime = self.vips.get(vip)?;
        let table = runtime.active.slots.as_ref()?;
        let by_id: HashMap<u32, IpAddr> = runtime.backends.iter().map(|(addr, id)| (*id, *addr)).collect();
        Some(table.iter().map(|id| by_id.get(id).copied()).collect())
    }

    fn apply_vip(
        &mut self,
        maps: &mut dyn Maps,
        desired: &DesiredState,
        vip: &Vip,
        config: &VipConfig,
        report: &mut ApplyReport,
    ) -> Result<(), ReconcileError> {
        let mut runtime = match self.vips.remove(vip) {
            Some(runtime) => runtime,
            None => {
                let id = self.free_vip_id(maps)?;
                let active = self.alloc_table(vip, config.ring_size)?;
                let standby = match self.alloc_table(vip, config.ring_size) {
                    Ok(table) => table,
                    Err(e) => {
                        self.pool.free(active.at);
                        return Err(e);
                    }
                };
                // The VIP's limits are in place before its first packet.
                self.write_limits(maps, id, vip_limits(desired, vip), report)?;
                VipRuntime {
                    id,
                    built: None,
                    // Hashed as declared from its first packet.
                    flags: hash_flags(vip, config),
                    quic: QuicLbConfig::EMPTY,
                    unpublished: true,
                    active,
                    standby,
                    prior: None,
                    changed_at: None,
                    backends: BTreeMap::new(),
                }
            }
        };
        let result = self.update_vip(maps, vip, config, &mut runtime, report);
        if result.is_err() && runtime.unpublished {
            // Never in the index: nothing refers to its tables or backends.
            for table in runtime.tables() {
                self.pool.free(table);
            }
            for id in runtime.backends.into_values() {
                self.free_backend(maps, id)?;
            }
            return result;
        }
        self.vips.insert(*vip, runtime);
        result
    }

    fn update_vip(
        &mut self,
        maps: &mut dyn Maps,
        vip: &Vip,
        config: &VipConfig,
        runtime: &mut VipRuntime,
        report: &mut ApplyReport,
    ) -> Result<(), ReconcileError> {
        // New backends exist in the map before any slot can name them. An id the VIP's
        // second-chance table still names would make the new backend the second candidate of
        // flows that belonged to the id's last owner: such ids are handed out last.
        let named_by_prior: BTreeSet<u32> =
            runtime.prior.as_ref().and_then(|t| t.slots.as_ref()).map(|slots| slots.iter().copied().collect()).unwrap_or_default();
        for (addr, backend) in &config.backends {
            if !runtime.backends.contains_key(addr) {
                let id = self.allocate_backend(maps, runtime.id, *addr, config.encap_of(backend), &named_by_prior)?;
                runtime.backends.insert(*addr, id);
            }
        }
        let members: Vec<MaglevBackend> = config
            .backends
            .iter()
            .map(|(addr, b)| MaglevBackend { id: runtime.backends[addr], addr: to_words(*addr).0, weight: b.weight })
            .collect();
        let inputs = Some((config.ring_size, members));
        // Most VIPs are untouched by a change: no table to build for them.
        let same_inputs = !runtime.unpublished && runtime.built == inputs;
        let table = match &inputs {
            Some((size, members)) if !same_inputs => {
                maglev::build(members, *size).map_err(|source| ReconcileError::Maglev { vip: *vip, source })?
            }
            _ => Vec::new(),
        };
        let unchanged = same_inputs
            || (!runtime.unpublished && runtime.active.at.size == config.ring_size && runtime.active.slots.as_deref() == Some(&table[..]));
        if !unchanged {
            let keep_prior = self.starts_episode(runtime);
            if runtime.standby.at.size != config.ring_size {
                let resized = self.alloc_table(vip, config.ring_size)?;
                self.pool.free(std::mem::replace(&mut runtime.standby, resized).at);
            }
            // Unknown while being written, in case the writes fail half way.
            let known = runtime.standby.slots.take();
            let mut slots: Box<dyn Iterator<Item = (u32, u32)>> = match &known {
                Some(known) => Box::new(maglev::changed_slots(known, &table)),
                None => Box::new(table.iter().enumerate().map(|(i, &id)| (i as u32, id))),
            };
            report.slots_written += maps.write_slots(runtime.standby.at, &mut slots)?;
            drop(slots);
            runtime.standby.slots = Some(table);
            std::mem::swap(&mut runtime.active, &mut runtime.standby);
            if keep_prior {
                self.keep_prior(vip, runtime, report);
            }
            maps.set_vip(&vip_key(vip), &runtime.meta())?;
            runtime.unpublished = false;
            report.tables_flipped += 1;
        }
        // Only once packets read the table built from them.
        runtime.built = inputs;
        for (addr, backend) in &config.backends {
            self.sync_entry(maps, runtime.backends[addr], backend.weight > 0, config.encap_of(backend))?;
        }
        // Backends leaving the VIP are freed only after packets stopped reading their slots.
        let leaving: Vec<IpAddr> = runtime.backends.keys().filter(|a| !config.backends.contains_key(a)).copied().collect();
        for addr in leaving {
            if let Some(id) = runtime.backends.remove(&addr) {
                self.free_backend(maps, id)?;
            }
        }
        Ok(())
    }

    /// Second chance: whether this change of the VIP's table starts an episode (its table
    /// stayed unchanged for the settle time: a slow start's ramp is one episode) and the
    /// table in force until now is worth keeping (it has a backend).
    fn starts_episode(&self, runtime: &mut VipRuntime) -> bool {
        let settled = runtime.changed_at.is_none_or(|at| at.elapsed() >= self.settle);
        runtime.changed_at = Some(Instant::now());
        settled && runtime.places_new_flows()
    }

    /// Called between the flip and its publication, when `runtime.standby` is the table
    /// packets read until now: it becomes the second-chance table as it is (no slot is
    /// copied), and the previous second-chance table (or a new one) becomes the standby,
    /// which only the next change writes into.
    fn keep_prior(&mut self, vip: &Vip, runtime: &mut VipRuntime, report: &mut ApplyReport) {
        let spare = match runtime.prior.take() {
            Some(prior) => prior,
            None => match self.alloc_table(vip, runtime.active.at.size) {
                Ok(table) => table,
                Err(_) => {
                    report.second_chance_lacking += 1;
                    return;
                }
            },
        };
        runtime.prior = Some(std::mem::replace(&mut runtime.standby, spare));
    }

    fn alloc_table(&mut self, vip: &Vip, size: u32) -> Result<Table, ReconcileError> {
        let at = self.pool.alloc(size).ok_or(ReconcileError::RingPoolFull {
            vip: *vip,
            size,
            free: self.pool.free_slots(),
            total: self.pool.slots(),
        })?;
        Ok(Table { at, slots: None })
    }

    fn remove_vip(&mut self, maps: &mut dyn Maps, vip: &Vip) -> Result<(), ReconcileError> {
        let Some(runtime) = self.vips.remove(vip) else { return Ok(()) };
        maps.remove_vip(&vip_key(vip))?;
        for table in runtime.tables() {
            self.pool.free(table);
        }
        for id in runtime.backends.into_values() {
            self.free_backend(maps, id)?;
        }
        Ok(())
    }

    /// Sets the scoped-rules flag on exactly the VIPs that have rules of their own, the
    /// QUIC flag and configuration on the QUIC VIPs (the configuration lands first: one
    /// slot, `Maps::set_vip`), and each VIP's hash mode.
    fn sync_vip_flags(&mut self, maps: &mut dyn Maps, desired: &DesiredState) -> Result<(), ReconcileError> {
        let scoped: BTreeSet<Vip> = desired.rules.keys().filter_map(|r| r.vip).collect();
        for (vip, runtime) in self.vips.iter_mut() {
            let flag = |on: bool, bit: u32| if on { bit } else { 0 };
            let config = desired.vips.get(vip);
            let quic = config.and_then(|c| c.quic.as_ref());
            let flags = runtime.flags & !(VIP_F_SCOPED_RULES | VIP_F_QUIC | VIP_SOURCE_HASH_BITS)
                | flag(scoped.contains(vip), VIP_F_SCOPED_RULES)
                | flag(quic.is_some(), VIP_F_QUIC)
                | config.map_or(0, |c| hash_flags(vip, c));
            let quic = quic.map_or(QuicLbConfig::EMPTY, |q| q.to_lb());
            if (flags, quic) != (runtime.flags, runtime.quic) {
                (runtime.flags, runtime.quic) = (flags, quic);
                maps.set_vip(&vip_key(vip), &runtime.meta())?;
            }
        }
        Ok(())
    }

    fn free_vip_id(&self, maps: &mut dyn Maps) -> Result<u32, ReconcileError> {
        let used: BTreeSet<u32> = self.vips.values().map(|r| r.id).collect();
        let limit = self.capacity.vips;
        let id = (0..limit).find(|id| !used.contains(id)).ok_or(ReconcileError::OutOfIds { what: "VIP", limit })?;
        maps.reset_vip_stats(id)?;
        Ok(id)
    }

    /// The lowest free id not in `avoid`, else the lowest free id. Its encapsulation is
    /// right from its first packet.
    fn allocate_backend(
        &mut self,
        maps: &mut dyn Maps,
        vip_id: u32,
        addr: IpAddr,
        encap: Encap,
        avoid: &BTreeSet<u32>,
    ) -> Result<u32, ReconcileError> {
        let limit = self.capacity.backends;
        let id = self
            .free_ids
            .iter()
            .find(|id| !avoid.contains(id))
            .or(self.free_ids.first())
            .copied()
            .ok_or(ReconcileError::OutOfIds { what: "backend", limit })?;
        maps.reset_backend_stats(id)?;
        // A free id takes no new flows yet (`sync_entry` sets that) and has no tunnel of its own.
        let info = BackendInfo { encap: encap.data_path(), ..self.backend_entry(id, addr, vip_id) };
        maps.set_backend(id, &info)?;
        self.free_ids.remove(&id);
        if encap == Encap::Gue {
            self.gue.insert(id);
        }
        Ok(id)
    }

    /// Active backend `id`'s entry (`addr`, of VIP `vip_id`) as this reconciler writes it:
    /// its generation, whether it takes new flows, its tunnel. The server-id slots' copies are
    /// written from it, without reading the backend array back.
    fn backend_entry(&self, id: u32, addr: IpAddr, vip_id: u32) -> BackendInfo {
        let (words, family) = to_words(addr);
        let encap = if self.gue.contains(&id) { Encap::Gue } else { Encap::Ipip };
        BackendInfo {
            addr: words,
            family,
            state: BACKEND_ACTIVE,
            flags: if self.takes_new_flows.contains(&id) { BACKEND_F_NEW_FLOWS } else { 0 },
            encap: encap.data_path(),
            generation: self.generations[id as usize],
            vip_id,
        }
    }

    /// Writes every limits slot that differs from what it holds: the default slot, each VIP's
    /// (zero for a VIP without its own limits and for ids no VIP uses).
    fn sync_limits(&mut self, maps: &mut dyn Maps, desired: &DesiredState, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        let default_slot = self.capacity.default_limit_slot() as usize;
        let mut want = vec![Limits::default(); default_slot + 1];
        want[default_slot] = desired.default_limits.map(|l| l.to_limits()).unwrap_or_default();
        for vip in desired.vips.keys() {
            if let Some(runtime) = self.vips.get(vip) {
                want[runtime.id as usize] = vip_limits(desired, vip);
            }
        }
        for (slot, limits) in want.into_iter().enumerate() {
            self.write_limits(maps, slot as u32, limits, report)?;
        }
        Ok(())
    }

    fn write_limits(&mut self, maps: &mut dyn Maps, slot: u32, limits: Limits, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        if self.limits[slot as usize] != limits {
            maps.set_limits(slot, &limits)?;
            self.limits[slot as usize] = limits;
            report.limits_written += 1;
        }
        Ok(())
    }

    /// Removes the entries of rules that are gone (also those of VIPs that are gone) and of
    /// entries no rule owns.
    fn remove_rules(&mut self, maps: &mut dyn Maps, desired: &DesiredState, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        for key in std::mem::take(&mut self.stale_rules) {
            maps.remove_rule(&key)?;
            report.rules_written += 1;
        }
        let gone: Vec<RuleMatch> = self.rules.keys().filter(|r| !desired.rules.contains_key(r)).copied().collect();
        for rule in gone {
            if let Some(runtime) = self.rules.remove(&rule) {
                maps.remove_rule(&runtime.key)?;
                report.rules_written += 1;
            }
        }
        Ok(())
    }

    /// Inserts or updates the entry of every desired rule; a new rule gets the lowest
    /// free id, whose kernel state is zeroed first.
    fn sync_rules(&mut self, maps: &mut dyn Maps, desired: &DesiredState, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        for (rule, config) in &desired.rules {
            let vip_id = match &rule.vip {
                None => ANY_VIP,
                // A rule's VIP always exists in a valid state; skip rather than mis-scope.
                Some(vip) => match self.vips.get(vip) {
                    Some(runtime) => runtime.id,
                    None => continue,
                },
            };
            let old = self.rules.get(rule).copied();
            let id = match old.map(|r| r.value.id).filter(|&id| id < MAX_RULES) {
                Some(id) => id,
                None => {
                    let id = self.free_rule_id()?;
                    maps.reset_rule_state(id)?;
                    id
                }
            };
            let key = rule_key(&rule.cidr, vip_id);
            let value = rule_value(id, &rule.cidr, config);
            let want = RuleRuntime { key, value };
            if old == Some(want) {
                continue;
            }
            maps.set_rule(&key, &value)?;
            report.rules_written += 1;
            if let Some(old) = old.filter(|o| o.key != key) {
                maps.remove_rule(&old.key)?;
                report.rules_written += 1;
            }
            self.rules.insert(*rule, want);
        }
        Ok(())
    }

    fn free_rule_id(&self) -> Result<u32, ReconcileError> {
        let used: BTreeSet<u32> = self.rules.values().map(|r| r.value.id).collect();
        (0..MAX_RULES).find(|id| !used.contains(id)).ok_or(ReconcileError::OutOfIds { what: "rule", limit: MAX_RULES })
    }

    /// Frees a backend id; bumping the generation makes its flows re-hash even if the id is
    /// handed out again.
    /// Sets backend `id`'s `BACKEND_F_NEW_FLOWS` (to `new_flows`) and its encapsulation if
    /// either is not as wanted already. A packet reads the entry before or after the write:
    /// a changed encapsulation applies from one packet to the next, and the agent takes both.
    fn sync_entry(&mut self, maps: &mut dyn Maps, id: u32, new_flows: bool, encap: Encap) -> Result<(), ReconcileError> {
        let gue = encap == Encap::Gue;
        if self.takes_new_flows.contains(&id) == new_flows && self.gue.contains(&id) == gue {
            return Ok(());
        }
        let mut info = maps.backend(id)?;
        info.flags = if new_flows { info.flags | BACKEND_F_NEW_FLOWS } else { info.flags & !BACKEND_F_NEW_FLOWS };
        info.encap = encap.data_path();
        maps.set_backend(id, &info)?;
        for (set, on) in [(&mut self.takes_new_flows, new_flows), (&mut self.gue, gue)] {
            if on {
                set.insert(id);
            } else {
                set.remove(&id);
            }
        }
        Ok(())
    }

    fn free_backend(&mut self, maps: &mut dyn Maps, id: u32) -> Result<(), ReconcileError> {
        self.retire_quic_servers(maps, id)?;
        let generation = self.generations[id as usize].wrapping_add(1);
        let info = BackendInfo { state: BACKEND_FREE, generation, ..BackendInfo::default() };
        maps.set_backend(id, &info)?;
        self.generations[id as usize] = generation;
        self.free_ids.insert(id);
        self.takes_new_flows.remove(&id);
        self.gue.remove(&id);
        Ok(())
    }
}

fn addr_key(addr: IpAddr) -> AddrKey {
    let (addr, family) = to_words(addr);
    AddrKey { addr, family, _pad: [0; 3] }
}

/// Makes the VIP address map hold exactly the desired VIPs' addresses, those in `echo` with
/// `ADDR_F_ECHO`, writing only what differs.
fn sync_vip_addrs(
    maps: &mut dyn Maps,
    have: &mut HashMap<AddrKey, u32>,
    desired: &DesiredState,
    echo: &HashSet<AddrKey>,
) -> Result<(), MapsError> {
    let flags = |key: &AddrKey| ADDR_F_VIP | if echo.contains(key) { ADDR_F_ECHO } else { 0 };
    let want: HashMap<AddrKey, u32> = desired.vips.keys().map(|v| addr_key(v.addr)).map(|key| (key, flags(&key))).collect();
    for key in have.keys().filter(|k| !want.contains_key(k)) {
        maps.remove_vip_addr(key)?;
    }
    for (key, flags) in &want {
        if have.get(key) != Some(flags) {
            maps.set_vip_addr(key, *flags)?;
        }
    }
    *have = want;
    Ok(())
}

/// Sets exactly the pre-filter bits of the desired VIP addresses, writing changed words only.
/// Bits are set before the VIP entries that need them exist (apply runs this last, but a
/// new VIP's packets pass as non-VIP until then, which is what an absent VIP does anyway).
fn sync_vip_filter(maps: &mut dyn Maps, have: &mut [u64], desired: &DesiredState) -> Result<(), MapsError> {
    let mut want = vec![0u64; VIP_FILTER_WORDS as usize];
    for vip in desired.vips.keys() {
        let (word, bit) = vip_filter_slot(vip_addr_hash(&to_words(vip.addr).0));
        want[word as usize] |= bit;
    }
    for (i, (&w, h)) in want.iter().zip(have.iter_mut()).enumerate() {
        if w != *h {
            maps.set_vip_filter_word(i as u32, w)?;
            *h = w;
        }
    }
    Ok(())
}

/// What a VIP's limits slot holds: its effective limits when it has its own, else nothing
/// (the data path then reads the default slot, which holds exactly the default).
fn vip_limits(desired: &DesiredState, vip: &Vip) -> Limits {
    let own = desired.vips.get(vip).and_then(|c| c.limits.as_ref());
    match own.and_then(|own| LimitConfig::merged(Some(own), desired.default_limits.as_ref())) {
        Some(effective) => effective.to_limits(),
        None => Limits::default(),
    }
}

/// The index key of a rule: its scope (`vip_id`, or `ANY_VIP`), family and CIDR.
pub fn rule_key(cidr: &Cidr, vip_id: u32) -> RuleSlotKey {
    let (addr, family) = to_words(cidr.addr);
    RuleSlotKey { scope: vip_id, family, prefix_len: cidr.prefix_len, _pad: [0; 2], addr: masked(&addr, cidr.prefix_len) }
}

fn rule_value(id: u32, cidr: &Cidr, config: &RuleConfig) -> RuleValue {
    let (action, rate) = match config.action {
        RuleAction::Limit(rate) => (RULE_LIMIT, rate.to_rate()),
        RuleAction::Block => (RULE_BLOCK, Rate::default()),
        RuleAction::Exempt => (RULE_EXEMPT, Rate::default()),
    };
    let flags = if config.observe { LIMIT_F_OBSERVE_SOURCE } else { 0 };
    RuleValue { rate, id, flags, action, addr_prefix_len: cidr.prefix_len, _pad: [0; 6] }
}

/// The rule an index entry carries, if it is one this reconciler could have written.
fn rule_from_key(key: &RuleSlotKey, vip_by_id: &HashMap<u32, Vip>) -> Option<RuleMatch> {
    let vip = match key.scope {
        ANY_VIP => None,
        id => Some(*vip_by_id.get(&id)?),
    };
    let cidr = Cidr::new(from_words(key.addr, key.family)?, key.prefix_len).ok()?;
    // Host bits and padding must be zero, or the key is not ours.
    if *key != rule_key(&cidr, key.scope) || vip.is_some_and(|v| v.addr.is_ipv4() != cidr.is_ipv4()) {
        return None;
    }
    Some(RuleMatch { cidr, vip })
}

/// A fingerprint of a Maglev table as backend addresses, of the flow hash seed that indexes
/// it and of what the seed hashes (`source_prefix`: the VIP's source bits for client
/// affinity, `None` for the 5-tuple; FNV-1a, 64 bits, hex): balancers of a fleet that would
/// send every new flow of a VIP to the same backend show the same digest.
pub fn table_digest(seed: u32, source_prefix: Option<u8>, table: &[Option<IpAddr>]) -> String {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(PRIME);
        }
    };
    eat(&seed.to_le_bytes());
    // Nothing for the 5-tuple: its digests are those of balancers without client affinity.
    if let Some(len) = source_prefix {
        eat(b"source");
        eat(&[len]);
    }
    eat(&(table.len() as u32).to_le_bytes());
    for slot in table {
        match slot {
            None => eat(&[0]),
            Some(IpAddr::V4(a)) => {
                eat(&[4]);
                eat(&a.octets());
            }
            Some(IpAddr::V6(a)) => {
                eat(&[6]);
                eat(&a.octets());
            }
        }
    }
    format!("{h:016x}")
}

/// The flags bits of `vip`'s hash mode (`VIP_F_SOURCE_HASH` with its prefix, or none).
fn hash_flags(vip: &Vip, config: &VipConfig) -> u32 {
    config.source_prefix_len(vip).map_or(0, vip_source_hash_flags)
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
