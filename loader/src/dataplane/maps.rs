//! Typed handles on the balancer's maps, and the few operations the rest of the daemon
//! needs. Per-CPU counters are summed here.

use std::ops::ControlFlow;

use aya::{
    Ebpf,
    maps::{Array, DevMapHash, HashMap, IterableMap, LpmTrie, Map, MapData, MapError, PerCpuArray, lpm_trie::Key},
};
use spillway_common::{
    limits::{DEFAULT_LIMIT_SLOT, map_names},
    types::{
        AddrKey, BackendInfo, Bucket, FlowKey, FlowValue, LbConfig, Limits, Observed, Reason, RuleKey, RuleState, RuleValue, SourceKey,
        SourceState, Traffic, VipKey, VipMeta,
    },
};

use super::{DataplaneError, flows};

/// A map's capacity and, when counted, its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapOccupancy {
    pub name: &'static str,
    pub max_entries: u32,
    pub entries: Option<u64>,
}

pub struct BalancerMaps {
    pub config: Array<MapData, LbConfig>,
    pub vips: HashMap<MapData, VipKey, VipMeta>,
    pub vip_addrs: HashMap<MapData, AddrKey, u32>,
    pub rings: Array<MapData, u32>,
    pub backends: Array<MapData, BackendInfo>,
    pub flows: HashMap<MapData, FlowKey, FlowValue>,
    pub vip_stats: PerCpuArray<MapData, Traffic>,
    pub backend_stats: PerCpuArray<MapData, Traffic>,
    pub reasons: PerCpuArray<MapData, u64>,
    pub tx_ports: DevMapHash<MapData>,
    pub vip_filter: Array<MapData, u64>,
    /// New-flow limits per VIP id, and the default at `DEFAULT_LIMIT_SLOT`.
    pub limits: Array<MapData, Limits>,
    /// Kernel-owned: each VIP's new-flow budget bucket (zeroed when the id is handed out).
    pub budget: Array<MapData, Bucket>,
    /// Kernel-owned (LRU): per-source buckets and counters; read for `lbctl top-sources`.
    pub sources: HashMap<MapData, SourceKey, SourceState>,
    pub rules: LpmTrie<MapData, RuleKey, RuleValue>,
    /// Kernel-owned: per rule id, the class's bucket and counters.
    pub rule_state: Array<MapData, RuleState>,
    pub rule_count: Array<MapData, u32>,
    /// What limits in observe mode would have dropped, per `Observed`.
    pub observed: PerCpuArray<MapData, u64>,
    /// New flows admitted per VIP id and per backend id.
    pub vip_new_flows: PerCpuArray<MapData, u64>,
    pub backend_new_flows: PerCpuArray<MapData, u64>,
    /// Second chance: each VIP's table before its last change, and how many slots of it
    /// are in force (0: none).
    pub prior_rings: Array<MapData, u32>,
    pub prior_size: Array<MapData, u32>,
    /// Packets sent with a second candidate.
    pub second_chance: PerCpuArray<MapData, u64>,
}

pub(super) fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, DataplaneError> {
    let map = ebpf.take_map(name).ok_or(DataplaneError::MissingMap { name })?;
    T::try_from(map).map_err(|source| DataplaneError::Map { name, source })
}

/// Wraps a map error with the map's name.
pub(crate) fn named<T>(name: &'static str, r: Result<T, MapError>) -> Result<T, DataplaneError> {
    r.map_err(|source| DataplaneError::Map { name, source })
}

impl BalancerMaps {
    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        Ok(Self {
            config: take(ebpf, map_names::CONFIG)?,
            vips: take(ebpf, map_names::VIPS)?,
            vip_addrs: take(ebpf, map_names::VIP_ADDRS)?,
            rings: take(ebpf, map_names::RINGS)?,
            backends: take(ebpf, map_names::BACKENDS)?,
            flows: take(ebpf, map_names::FLOWS)?,
            vip_stats: take(ebpf, map_names::VIP_STATS)?,
            backend_stats: take(ebpf, map_names::BACKEND_STATS)?,
            reasons: take(ebpf, map_names::REASONS)?,
            tx_ports: take(ebpf, map_names::TX_PORTS)?,
            vip_filter: take(ebpf, map_names::VIP_FILTER)?,
            limits: take(ebpf, map_names::LIMITS)?,
            budget: take(ebpf, map_names::BUDGET_STATE)?,
            sources: take(ebpf, map_names::SOURCES)?,
            rules: take(ebpf, map_names::RULES)?,
            rule_state: take(ebpf, map_names::RULE_STATS)?,
            rule_count: take(ebpf, map_names::RULE_COUNT)?,
            observed: take(ebpf, map_names::OBSERVED)?,
            vip_new_flows: take(ebpf, map_names::VIP_NEW_FLOWS)?,
            backend_new_flows: take(ebpf, map_names::BACKEND_NEW_FLOWS)?,
            prior_rings: take(ebpf, map_names::PRIOR_RINGS)?,
            prior_size: take(ebpf, map_names::PRIOR_SIZE)?,
            second_chance: take(ebpf, map_names::SECOND_CHANCE)?,
        })
    }

    pub fn set_config(&mut self, config: &LbConfig) -> Result<(), DataplaneError> {
        named(map_names::CONFIG, self.config.set(0, config, 0))
    }

    pub fn config(&self) -> Result<LbConfig, DataplaneError> {
        named(map_names::CONFIG, self.config.get(&0, 0))
    }

    /// Writes `(slot, backend id)` pairs into table `half` of VIP `vip_id`.
    pub fn write_slots(&mut self, vip_id: u32, half: u32, slots: impl IntoIterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        let base = VipMeta::ring_base(vip_id, half);
        let mut written = 0;
        for (slot, owner) in slots {
            named(map_names::RINGS, self.rings.set(base + slot, &owner, 0))?;
            written += 1;
        }
        Ok(written)
    }

    /// Writes `(slot, backend id)` pairs into VIP `vip_id`'s second-chance table.
    pub fn write_prior_slots(&mut self, vip_id: u32, slots: impl IntoIterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        let base = VipMeta::prior_base(vip_id);
        let mut written = 0;
        for (slot, owner) in slots {
            named(map_names::PRIOR_RINGS, self.prior_rings.set(base + slot, &owner, 0))?;
            written += 1;
        }
        Ok(written)
    }

    /// How many slots of VIP `vip_id`'s second-chance table are in force (0: none).
    pub fn set_prior_size(&mut self, vip_id: u32, size: u32) -> Result<(), DataplaneError> {
        named(map_names::PRIOR_SIZE, self.prior_size.set(vip_id, &size, 0))
    }

    /// The backend id VIP `vip_id`'s second-chance table gives `hash` (`None`: it has none).
    pub fn prior_slot(&self, vip_id: u32, hash: u32) -> Result<Option<u32>, DataplaneError> {
        let size = named(map_names::PRIOR_SIZE, self.prior_size.get(&vip_id, 0))?;
        if size == 0 {
            return Ok(None);
        }
        named(map_names::PRIOR_RINGS, self.prior_rings.get(&(VipMeta::prior_base(vip_id) + hash % size), 0)).map(Some)
    }

    /// Packets sent with a second candidate, summed over CPUs.
    pub fn second_chance_packets(&self) -> Result<u64, DataplaneError> {
        sum_count(map_names::SECOND_CHANCE, &self.second_chance, 0)
    }

    /// Reads table `half` of VIP `vip_id` (`size` slots).
    pub fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError> {
        let base = VipMeta::ring_base(vip_id, half);
        (base..base + size).map(|i| named(map_names::RINGS, self.rings.get(&i, 0))).collect()
    }

    /// Makes the redirect map hold exactly `ifindexes`, each redirecting to itself.
    pub fn set_tx_ports(&mut self, ifindexes: &[u32]) -> Result<(), DataplaneError> {
        let have: Vec<u32> = named(map_names::TX_PORTS, self.tx_ports.keys().collect())?;
        for stale in have.iter().filter(|i| !ifindexes.contains(i)) {
            named(map_names::TX_PORTS, self.tx_ports.remove(*stale))?;
        }
        for &ifindex in ifindexes.iter().filter(|i| !have.contains(i)) {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .map_err(|source| DataplaneError::XdpMap { name: map_names::TX_PORTS, source })?;
        }
        Ok(())
    }

    pub fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        named(map_names::BACKENDS, self.backends.set(id, info, 0))
    }

    pub fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        named(map_names::BACKENDS, self.backends.get(&id, 0))
    }

    pub fn flow(&self, key: &FlowKey) -> Option<FlowValue> {
        self.flows.get(key, 0).ok()
    }

    /// Visits connection-table entries, in batches, until `visit` breaks; returns how many
    /// it visited.
    pub fn scan_flows(&self, visit: &mut dyn FnMut(&FlowKey, &FlowValue) -> ControlFlow<()>) -> Result<u64, DataplaneError> {
        flows::scan(self.flows.map(), visit).map_err(|source| DataplaneError::Read { name: map_names::FLOWS, source })
    }

    /// Deletes a connection-table entry; false if it was gone already.
    pub fn remove_flow(&mut self, key: &FlowKey) -> Result<bool, DataplaneError> {
        match self.flows.remove(key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(source) => Err(DataplaneError::Map { name: map_names::FLOWS, source }),
        }
    }

    /// Entries the connection table holds at most.
    pub fn flow_capacity(&self) -> u64 {
        self.flows.map().info().map_or(u64::from(spillway_common::limits::FLOW_TABLE_ENTRIES), |i| u64::from(i.max_entries()))
    }

    /// Slot `slot` of table `half` of VIP `vip_id`: the backend id a hash landing there gets.
    pub fn ring_slot(&self, vip_id: u32, half: u32, slot: u32) -> Result<u32, DataplaneError> {
        named(map_names::RINGS, self.rings.get(&(VipMeta::ring_base(vip_id, half) + slot), 0))
    }

    /// The longest-prefix rule for `key` within its scope, as the data path's lookup finds it.
    pub fn rule_lookup(&self, prefix_len: u32, key: &RuleKey) -> Result<Option<RuleValue>, DataplaneError> {
        match self.rules.get(&Key::new(prefix_len, *key), 0) {
            Ok(value) => Ok(Some(value)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => Err(DataplaneError::Map { name: map_names::RULES, source }),
        }
    }

    pub fn budget_bucket(&self, vip_id: u32) -> Result<Bucket, DataplaneError> {
        named(map_names::BUDGET_STATE, self.budget.get(&vip_id, 0))
    }

    pub fn source_state(&self, key: &SourceKey) -> Option<SourceState> {
        self.sources.get(key, 0).ok()
    }

    /// The kernel's memory accounting of every map this handle holds (`None`: unreadable).
    pub fn memory(&self) -> Vec<(&'static str, Option<u64>)> {
        let maps: [(&'static str, &MapData); 23] = [
            (map_names::CONFIG, self.config.map()),
            (map_names::VIPS, self.vips.map()),
            (map_names::VIP_ADDRS, self.vip_addrs.map()),
            (map_names::RINGS, self.rings.map()),
            (map_names::BACKENDS, self.backends.map()),
            (map_names::FLOWS, self.flows.map()),
            (map_names::VIP_STATS, self.vip_stats.map()),
            (map_names::BACKEND_STATS, self.backend_stats.map()),
            (map_names::REASONS, self.reasons.map()),
            (map_names::VIP_FILTER, self.vip_filter.map()),
            (map_names::LIMITS, self.limits.map()),
            (map_names::BUDGET_STATE, self.budget.map()),
            (map_names::SOURCES, self.sources.map()),
            (map_names::RULES, self.rules.map()),
            (map_names::RULE_STATS, self.rule_state.map()),
            (map_names::RULE_COUNT, self.rule_count.map()),
            (map_names::OBSERVED, self.observed.map()),
            (map_names::VIP_NEW_FLOWS, self.vip_new_flows.map()),
            (map_names::BACKEND_NEW_FLOWS, self.backend_new_flows.map()),
            (map_names::TX_PORTS, self.tx_ports.map()),
            (map_names::PRIOR_RINGS, self.prior_rings.map()),
            (map_names::PRIOR_SIZE, self.prior_size.map()),
            (map_names::SECOND_CHANCE, self.second_chance.map()),
        ];
        maps.into_iter().map(|(name, map)| (name, flows::memlock_bytes(map))).collect()
    }

    pub fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        sum_traffic(map_names::VIP_STATS, &self.vip_stats, id)
    }

    pub fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        sum_traffic(map_names::BACKEND_STATS, &self.backend_stats, id)
    }

    /// New flows admitted to VIP id `id` (summed over CPUs).
    pub fn vip_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        sum_count(map_names::VIP_NEW_FLOWS, &self.vip_new_flows, id)
    }

    /// New flows placed on backend id `id` (summed over CPUs).
    pub fn backend_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        sum_count(map_names::BACKEND_NEW_FLOWS, &self.backend_new_flows, id)
    }

    /// Every reason with its count summed over CPUs.
    pub fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        Reason::ALL
            .iter()
            .map(|&r| {
                let per_cpu = named(map_names::REASONS, self.reasons.get(&(r as u32), 0))?;
                Ok((r, per_cpu.iter().sum()))
            })
            .collect()
    }

    /// Every `Observed` counter summed over CPUs.
    pub fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError> {
        Observed::ALL
            .iter()
            .map(|&o| {
                let per_cpu = named(map_names::OBSERVED, self.observed.get(&(o as u32), 0))?;
                Ok((o, per_cpu.iter().sum()))
            })
            .collect()
    }

    pub fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError> {
        named(map_names::RULE_STATS, self.rule_state.get(&id, 0))
    }

    /// The per-source entries of VIP `vip_id` (a walk of the whole LRU table; entries the
    /// kernel evicts meanwhile are skipped).
    /// Every map's name and capacity, and for the small hash maps the entries they hold (a
    /// walk of their keys; the connection table is counted in batches elsewhere).
    pub fn occupancy(&self) -> Result<Vec<MapOccupancy>, DataplaneError> {
        fn capacity<K: aya::Pod, V>(name: &'static str, map: &dyn IterableMap<K, V>) -> Result<u32, DataplaneError> {
            named(name, map.map().info().map(|info| info.max_entries()))
        }
        fn counted<K: aya::Pod, V: aya::Pod>(name: &'static str, map: &HashMap<MapData, K, V>) -> Result<MapOccupancy, DataplaneError> {
            let mut entries = 0;
            for key in map.keys() {
                named(name, key)?;
                entries += 1;
            }
            Ok(MapOccupancy { name, max_entries: capacity(name, map)?, entries: Some(entries) })
        }
        let sized = |name, max_entries: Result<u32, DataplaneError>| {
            max_entries.map(|max_entries| MapOccupancy { name, max_entries, entries: None })
        };
        Ok(vec![
            counted(map_names::VIPS, &self.vips)?,
            counted(map_names::VIP_ADDRS, &self.vip_addrs)?,
            sized(map_names::RINGS, capacity(map_names::RINGS, &self.rings))?,
            sized(map_names::BACKENDS, capacity(map_names::BACKENDS, &self.backends))?,
            sized(map_names::FLOWS, named(map_names::FLOWS, self.flows.map().info().map(|i| i.max_entries())))?,
            counted(map_names::SOURCES, &self.sources)?,
            sized(map_names::LIMITS, capacity(map_names::LIMITS, &self.limits))?,
            sized(map_names::RULES, named(map_names::RULES, self.rules.map().info().map(|i| i.max_entries())))?,
            sized(map_names::TX_PORTS, named(map_names::TX_PORTS, self.tx_ports.map().info().map(|i| i.max_entries())))?,
        ])
    }

    pub fn sources(&self, vip_id: u32) -> Result<Vec<(SourceKey, SourceState)>, DataplaneError> {
        let mut out = Vec::new();
        for entry in self.sources.iter() {
            let (key, state) = named(map_names::SOURCES, entry)?;
            if key.vip_id == vip_id {
                out.push((key, state));
            }
        }
        Ok(out)
    }
}

fn sum_count(name: &'static str, map: &PerCpuArray<MapData, u64>, id: u32) -> Result<u64, DataplaneError> {
    Ok(named(name, map.get(&id, 0))?.iter().sum())
}

fn sum_traffic(name: &'static str, map: &PerCpuArray<MapData, Traffic>, id: u32) -> Result<Traffic, DataplaneError> {
    let per_cpu = named(name, map.get(&id, 0))?;
    Ok(per_cpu.iter().fold(Traffic::default(), |acc, t| Traffic { packets: acc.packets + t.packets, bytes: acc.bytes + t.bytes }))
}

impl crate::reconcile::Maps for BalancerMaps {
    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, DataplaneError> {
        self.vips.iter().map(|r| named(map_names::VIPS, r)).collect()
    }

    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), DataplaneError> {
        named(map_names::VIPS, self.vips.insert(key, meta, 0))
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<(), DataplaneError> {
        named(map_names::VIPS, self.vips.remove(key))
    }

    fn vip_addrs(&self) -> Result<Vec<AddrKey>, DataplaneError> {
        self.vip_addrs.keys().map(|r| named(map_names::VIP_ADDRS, r)).collect()
    }

    fn set_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        named(map_names::VIP_ADDRS, self.vip_addrs.insert(key, &1, 0))
    }

    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), DataplaneError> {
        named(map_names::VIP_ADDRS, self.vip_addrs.remove(key))
    }

    fn write_slots(&mut self, vip_id: u32, half: u32, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        BalancerMaps::write_slots(self, vip_id, half, slots)
    }

    fn read_ring(&self, vip_id: u32, half: u32, size: u32) -> Result<Vec<u32>, DataplaneError> {
        BalancerMaps::read_ring(self, vip_id, half, size)
    }

    fn write_prior(&mut self, vip_id: u32, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, DataplaneError> {
        BalancerMaps::write_prior_slots(self, vip_id, slots)
    }

    fn set_prior_size(&mut self, vip_id: u32, size: u32) -> Result<(), DataplaneError> {
        BalancerMaps::set_prior_size(self, vip_id, size)
    }

    fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        BalancerMaps::backend(self, id)
    }

    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        BalancerMaps::set_backend(self, id, info)
    }

    fn vip_filter(&self) -> Result<Vec<u64>, DataplaneError> {
        self.vip_filter.iter().map(|r| named(map_names::VIP_FILTER, r)).collect()
    }

    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), DataplaneError> {
        named(map_names::VIP_FILTER, self.vip_filter.set(index, &word, 0))
    }

    fn reset_vip_stats(&mut self, id: u32) -> Result<(), DataplaneError> {
        zero_per_cpu(map_names::VIP_STATS, &mut self.vip_stats, id)?;
        zero_per_cpu(map_names::VIP_NEW_FLOWS, &mut self.vip_new_flows, id)?;
        named(map_names::BUDGET_STATE, self.budget.set(id, &Bucket::default(), 0))?;
        // The previous owner's sources would show up in top-sources and keep its buckets.
        let mut stale = Vec::new();
        for key in self.sources.keys() {
            let key = named(map_names::SOURCES, key)?;
            if key.vip_id == id {
                stale.push(key);
            }
        }
        for key in stale {
            match self.sources.remove(&key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(source) => return Err(DataplaneError::Map { name: map_names::SOURCES, source }),
            }
        }
        Ok(())
    }

    fn reset_backend_stats(&mut self, id: u32) -> Result<(), DataplaneError> {
        zero_per_cpu(map_names::BACKEND_STATS, &mut self.backend_stats, id)?;
        zero_per_cpu(map_names::BACKEND_NEW_FLOWS, &mut self.backend_new_flows, id)
    }

    fn limits(&self) -> Result<Vec<Limits>, DataplaneError> {
        (0..=DEFAULT_LIMIT_SLOT).map(|slot| named(map_names::LIMITS, self.limits.get(&slot, 0))).collect()
    }

    fn set_limits(&mut self, slot: u32, limits: &Limits) -> Result<(), DataplaneError> {
        named(map_names::LIMITS, self.limits.set(slot, limits, 0))
    }

    fn rules(&self) -> Result<Vec<(u32, RuleKey, RuleValue)>, DataplaneError> {
        self.rules
            .iter()
            .map(|entry| {
                let (key, value) = named(map_names::RULES, entry)?;
                Ok((key.prefix_len(), key.data(), value))
            })
            .collect()
    }

    fn set_rule(&mut self, prefix_len: u32, key: &RuleKey, value: &RuleValue) -> Result<(), DataplaneError> {
        named(map_names::RULES, self.rules.insert(&Key::new(prefix_len, *key), value, 0))
    }

    fn remove_rule(&mut self, prefix_len: u32, key: &RuleKey) -> Result<(), DataplaneError> {
        match self.rules.remove(&Key::new(prefix_len, *key)) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(source) => Err(DataplaneError::Map { name: map_names::RULES, source }),
        }
    }

    fn reset_rule_state(&mut self, id: u32) -> Result<(), DataplaneError> {
        named(map_names::RULE_STATS, self.rule_state.set(id, &RuleState::default(), 0))
    }

    fn set_rule_count(&mut self, count: u32) -> Result<(), DataplaneError> {
        named(map_names::RULE_COUNT, self.rule_count.set(0, &count, 0))
    }
}

fn zero_per_cpu<V: aya::Pod + Default>(name: &'static str, map: &mut PerCpuArray<MapData, V>, id: u32) -> Result<(), DataplaneError> {
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| DataplaneError::Cpus(source))?;
    let zeros = aya::maps::PerCpuValues::try_from(vec![V::default(); cpus.get() as usize]).map_err(DataplaneError::Cpus)?;
    named(name, map.set(id, zeros, 0))
}
