//! Turns the desired state into map updates.
//!
//! Guarantees: a packet never reads a half-written table (each VIP has two tables; the
//! inactive one is brought up to date, then one `VipMeta` update flips which one packets
//! read); only slots that differ from the inactive table's known contents are written;
//! a backend's map entry exists before any slot names it and is freed only after the flip.
//! `adopt` rebuilds all of this from pinned maps, so a restarted `lbd` writes nothing when
//! the state it restores matches what the kernel already holds.
//!
//! New-flow limits: every VIP's slot of the limits array holds its effective limits when it
//! has its own (`configured = 0` when it has none, so the data path falls back to the
//! default slot). Rules: one trie entry per rule, keyed by VIP scope, family and CIDR; each
//! rule keeps its id (the index of its counters) for as long as it exists, also across
//! restarts (ids are adopted back from the trie). A new id, like a new VIP id, starts with
//! zeroed kernel state. Slots and entries are written only when they differ.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use spillway_common::{
    addr::{from_words, to_words},
    hash::vip_filter_slot,
    limits::{ANY_VIP, DEFAULT_LIMIT_SLOT, MAX_BACKENDS, MAX_RULES, MAX_VIPS, SECOND_CHANCE_SETTLE_MS, VIP_FILTER_WORDS},
    maglev::{self, MaglevBackend, MaglevError},
    types::{
        AddrKey, BACKEND_ACTIVE, BACKEND_FREE, BackendInfo, FAMILY_V4, FAMILY_V6, LIMIT_F_OBSERVE_SOURCE, Limits, PROTO_TCP, PROTO_UDP,
        RULE_BLOCK, RULE_EXEMPT, RULE_KEY_SCOPE_BITS, RULE_LIMIT, Rate, RuleKey, RuleValue, VipKey, VipMeta,
    },
};

use crate::{
    dataplane::DataplaneError,
    model::{Cidr, DesiredState, LimitConfig, Proto, RuleAction, RuleConfig, RuleMatch, Vip, VipConfig},
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
    /// Writes `(slot, backend id)` pairs into VIP `vip_id`'s second-chance table.
    fn write_prior(&mut self, vip_id: u32, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, DataplaneError>;
    /// How many slots of VIP `vip_id`'s second-chance table packets may read (0: none).
    fn set_prior_size(&mut self, vip_id: u32, size: u32) -> Result<(), DataplaneError>;
    fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError>;
    fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError>;
    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError>;
    /// The VIP address pre-filter's words (`VIP_FILTER_WORDS` of them).
    fn vip_filter(&self) -> Result<Vec<u64>, DataplaneError>;
    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError>;
    /// Zeroes the state of a VIP id about to be handed out, so it starts from nothing: its
    /// counters, its new-flow budget's bucket and the per-source entries of that id.
    fn reset_vip_stats(&mut self, id: u32) -> Result<(), DataplaneError>;
    fn reset_backend_stats(&mut self, id: u32) -> Result<(), DataplaneError>;
    /// Every slot of the limits array (`DEFAULT_LIMIT_SLOT + 1` of them).
    fn limits(&self) -> Result<Vec<Limits>, DataplaneError>;
    fn set_limits(&mut self, slot: u32, limits: &Limits) -> Result<(), DataplaneError>;
    /// Every rule trie entry: (prefix length of the whole key, key, value).
    fn rules(&self) -> Result<Vec<(u32, RuleKey, RuleValue)>, DataplaneError>;
    /// Inserts or replaces one trie entry.
    fn set_rule(&mut self, prefix_len: u32, key: &RuleKey, value: &RuleValue) -> Result<(), DataplaneError>;
    fn remove_rule(&mut self, prefix_len: u32, key: &RuleKey) -> Result<(), DataplaneError>;
    /// Zeroes a rule id's bucket and counters before the id is handed out.
    fn reset_rule_state(&mut self, id: u32) -> Result<(), DataplaneError>;
    /// How many rules exist; the data path skips its trie lookups while it is zero.
    fn set_rule_count(&mut self, count: u32) -> Result<(), DataplaneError>;
}

/// What one `apply` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyReport {
    pub slots_written: usize,
    pub tables_flipped: usize,
    /// Slots of the limits array written.
    pub limits_written: usize,
    /// Rule trie entries inserted, replaced or removed.
    pub rules_written: usize,
    /// Slots of second-chance tables written.
    pub prior_written: usize,
}

/// A rule's trie entry as the reconciler last wrote (or adopted) it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RuleRuntime {
    prefix_len: u32,
    key: RuleKey,
    value: RuleValue,
}

struct VipRuntime {
    id: u32,
    ring_size: u32,
    active_half: u32,
    /// Contents of each half as far as we know; `None` = unknown (write every slot).
    halves: [Option<Vec<u32>>; 2],
    backends: BTreeMap<IpAddr, u32>,
    /// The second-chance table as last written (`None`: unknown, written whole next time).
    prior: Option<Vec<u32>>,
    /// When the table packets read last changed (`None`: not since this reconciler began).
    changed_at: Option<Instant>,
}

pub struct Reconciler {
    vips: HashMap<Vip, VipRuntime>,
    /// Generation of every backend id, and whether it is in use.
    generations: Vec<u32>,
    in_use: BTreeSet<u32>,
    /// Active backends found in the maps that no VIP owns (freed on the next apply).
    orphans: Vec<u32>,
    /// What every slot of the limits array holds.
    limits: Vec<Limits>,
    /// The trie entry of every rule in the maps.
    rules: BTreeMap<RuleMatch, RuleRuntime>,
    /// Trie entries found in the maps that no rule can own (removed on the next apply).
    stale_rules: Vec<(u32, RuleKey)>,
    /// Table changes closer together than this are one change for second chance.
    settle: Duration,
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
            let runtime = VipRuntime {
                id: meta.id,
                ring_size: meta.ring_size,
                active_half: meta.active_half & 1,
                halves,
                backends,
                prior: None,
                changed_at: None,
            };
            vips.insert(vip, runtime);
        }
        let orphans: Vec<u32> = by_vip.into_values().flat_map(|b| b.into_values()).collect();
        let in_use = active.into_iter().collect();
        let mut limits = maps.limits()?;
        limits.resize(DEFAULT_LIMIT_SLOT as usize + 1, Limits::default());
        let vip_by_id: HashMap<u32, Vip> = vips.iter().map(|(vip, r)| (r.id, *vip)).collect();
        let mut rules = BTreeMap::new();
        let mut stale_rules = Vec::new();
        let mut ids = BTreeSet::new();
        for (prefix_len, key, mut value) in maps.rules()? {
            match rule_from_key(prefix_len, &key, &vip_by_id) {
                Some(rule) if !rules.contains_key(&rule) => {
                    // An id out of range or taken twice is replaced on the next apply.
                    if value.id >= MAX_RULES || !ids.insert(value.id) {
                        value.id = u32::MAX;
                    }
                    rules.insert(rule, RuleRuntime { prefix_len, key, value });
                }
                _ => stale_rules.push((prefix_len, key)),
            }
        }
        let settle = Duration::from_millis(SECOND_CHANCE_SETTLE_MS);
        Ok(Self { vips, generations, in_use, orphans, limits, rules, stale_rules, settle })
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
        sync_vip_addrs(maps, desired)?;
        sync_vip_filter(maps, desired)?;
        Ok(report)
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

    /// The table packets of `vip` read, slot by slot as backend addresses: what every
    /// balancer given the same state holds, whatever ids it handed out (`None`: unknown).
    pub fn active_table(&self, vip: &Vip) -> Option<Vec<Option<IpAddr>>> {
        let runtime = self.vips.get(vip)?;
        let table = runtime.halves[runtime.active_half as usize].as_ref()?;
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
                // The VIP's limits are in place before its first packet.
                self.write_limits(maps, id, vip_limits(desired, vip), report)?;
                VipRuntime {
                    id,
                    ring_size: config.ring_size,
                    // A new VIP is "flipping" to half 0, whose stale contents are unknown.
                    active_half: 1,
                    halves: [None, None],
                    backends: BTreeMap::new(),
                    prior: None,
                    changed_at: None,
                }
            }
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
            self.keep_prior(maps, &mut runtime, report)?;
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

    /// Second chance: the first change after the table settled keeps the table in force
    /// until now (one with a backend) as the VIP's second-chance table, which packets read
    /// only once it is whole; later changes of the same episode leave it.
    fn keep_prior(&self, maps: &mut dyn Maps, runtime: &mut VipRuntime, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        let settled = runtime.changed_at.is_none_or(|at| at.elapsed() >= self.settle);
        runtime.changed_at = Some(Instant::now());
        let Some(current) = runtime.halves[runtime.active_half as usize].as_ref() else { return Ok(()) };
        if !settled || current.iter().all(|&id| id == maglev::EMPTY_SLOT) || runtime.prior.as_ref() == Some(current) {
            return Ok(());
        }
        maps.set_prior_size(runtime.id, 0)?;
        let mut slots: Box<dyn Iterator<Item = (u32, u32)>> = match &runtime.prior {
            Some(known) => Box::new(maglev::changed_slots(known, current)),
            None => Box::new(current.iter().enumerate().map(|(i, &id)| (i as u32, id))),
        };
        report.prior_written += maps.write_prior(runtime.id, &mut slots)?;
        drop(slots);
        maps.set_prior_size(runtime.id, current.len() as u32)?;
        runtime.prior = Some(current.clone());
        Ok(())
    }

    fn remove_vip(&mut self, maps: &mut dyn Maps, vip: &Vip) -> Result<(), ReconcileError> {
        let Some(runtime) = self.vips.remove(vip) else { return Ok(()) };
        maps.set_prior_size(runtime.id, 0)?;
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
        // A previous owner's second-chance table is not this VIP's.
        maps.set_prior_size(id, 0)?;
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

    /// Writes every limits slot that differs from what it holds: the default slot, each VIP's
    /// (zero for a VIP without its own limits and for ids no VIP uses).
    fn sync_limits(&mut self, maps: &mut dyn Maps, desired: &DesiredState, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        let mut want = vec![Limits::default(); DEFAULT_LIMIT_SLOT as usize + 1];
        want[DEFAULT_LIMIT_SLOT as usize] = desired.default_limits.map(|l| l.to_limits()).unwrap_or_default();
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

    /// Removes the trie entries of rules that are gone (also those of VIPs that are gone) and
    /// of entries no rule owns.
    fn remove_rules(&mut self, maps: &mut dyn Maps, desired: &DesiredState, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        for (prefix_len, key) in std::mem::take(&mut self.stale_rules) {
            maps.remove_rule(prefix_len, &key)?;
            report.rules_written += 1;
        }
        let gone: Vec<RuleMatch> = self.rules.keys().filter(|r| !desired.rules.contains_key(r)).copied().collect();
        for rule in gone {
            if let Some(runtime) = self.rules.remove(&rule) {
                maps.remove_rule(runtime.prefix_len, &runtime.key)?;
                report.rules_written += 1;
            }
        }
        Ok(())
    }

    /// Inserts or updates the trie entry of every desired rule; a new rule gets the lowest
    /// free id, whose kernel state is zeroed first.
    fn sync_rules(&mut self, maps: &mut dyn Maps, desired: &DesiredState, report: &mut ApplyReport) -> Result<(), ReconcileError> {
        // Runs after stale entries are gone and before new ones go in, so the count is
        // non-zero whenever the trie holds a rule.
        maps.set_rule_count(desired.rules.len() as u32)?;
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
            let (prefix_len, key) = rule_key(&rule.cidr, vip_id);
            let value = rule_value(id, &rule.cidr, config);
            let want = RuleRuntime { prefix_len, key, value };
            if old == Some(want) {
                continue;
            }
            maps.set_rule(prefix_len, &key, &value)?;
            report.rules_written += 1;
            if let Some(old) = old.filter(|o| (o.prefix_len, o.key) != (prefix_len, key)) {
                maps.remove_rule(old.prefix_len, &old.key)?;
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

/// What a VIP's limits slot holds: its effective limits when it has its own, else nothing
/// (the data path then reads the default slot, which holds exactly the default).
fn vip_limits(desired: &DesiredState, vip: &Vip) -> Limits {
    let own = desired.vips.get(vip).and_then(|c| c.limits.as_ref());
    match own.and_then(|own| LimitConfig::merged(Some(own), desired.default_limits.as_ref())) {
        Some(effective) => effective.to_limits(),
        None => Limits::default(),
    }
}

/// The trie key of a rule: its scope (`vip_id`, or `ANY_VIP`), family and CIDR.
pub fn rule_key(cidr: &Cidr, vip_id: u32) -> (u32, RuleKey) {
    let mut addr = [0u8; 16];
    let family = match cidr.addr {
        IpAddr::V4(v4) => {
            addr[..4].copy_from_slice(&v4.octets());
            FAMILY_V4
        }
        IpAddr::V6(v6) => {
            addr.copy_from_slice(&v6.octets());
            FAMILY_V6
        }
    };
    let key = RuleKey { vip_id_be: vip_id.to_be(), family, addr, _pad: [0; 3] };
    (RULE_KEY_SCOPE_BITS + u32::from(cidr.prefix_len), key)
}

fn rule_value(id: u32, cidr: &Cidr, config: &RuleConfig) -> RuleValue {
    let (action, rate) = match config.action {
        RuleAction::Limit(rate) => (RULE_LIMIT, rate.to_rate()),
        RuleAction::Block => (RULE_BLOCK, Rate::default()),
        RuleAction::Exempt => (RULE_EXEMPT, Rate::default()),
    };
    let flags = if config.observe { LIMIT_F_OBSERVE_SOURCE } else { 0 };
    RuleValue { id, rate, flags, action, addr_prefix_len: cidr.prefix_len, _pad: [0; 2] }
}

/// The rule a trie entry carries, if it is one this reconciler could have written.
fn rule_from_key(prefix_len: u32, key: &RuleKey, vip_by_id: &HashMap<u32, Vip>) -> Option<RuleMatch> {
    let vip = match u32::from_be(key.vip_id_be) {
        ANY_VIP => None,
        id => Some(*vip_by_id.get(&id)?),
    };
    let addr = match key.family {
        FAMILY_V4 => IpAddr::V4(Ipv4Addr::new(key.addr[0], key.addr[1], key.addr[2], key.addr[3])),
        FAMILY_V6 => IpAddr::V6(Ipv6Addr::from(key.addr)),
        _ => return None,
    };
    let addr_len = u8::try_from(prefix_len.checked_sub(RULE_KEY_SCOPE_BITS)?).ok()?;
    let cidr = Cidr::new(addr, addr_len).ok()?;
    // Bytes past the family's address must be zero, or the key is not ours.
    if (key.family == FAMILY_V4 && key.addr[4..].iter().any(|&b| b != 0)) || key._pad != [0; 3] {
        return None;
    }
    if vip.is_some_and(|v| v.addr.is_ipv4() != cidr.is_ipv4()) {
        return None;
    }
    Some(RuleMatch { cidr, vip })
}

/// A fingerprint of a Maglev table as backend addresses and of the flow hash seed that
/// indexes it (FNV-1a, 64 bits, hex): balancers of a fleet that would send every new flow of
/// a VIP to the same backend show the same digest.
pub fn table_digest(seed: u32, table: &[Option<IpAddr>]) -> String {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(PRIME);
        }
    };
    eat(&seed.to_le_bytes());
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
