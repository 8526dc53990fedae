//! Typed handles on the balancer's maps, and the few operations the rest of the daemon
//! needs. Per-CPU counters are summed here.

use std::ops::ControlFlow;

use ring::rand::{SecureRandom, SystemRandom};

use aya::{
    Ebpf,
    maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray, ProgramArray},
};
use spillway_common::{
    hash::maglev_hash,
    limits::{Capacity, MAX_RULES, QUIC_CONFIG_IDS_PER_VIP, RING_SLOTS_PER_WORD, map_names},
    quic_lb::QuicLbConfig,
    types::{
        AddrKey, BackendInfo, Bucket, DecryptBudget, EchoConfig, FlowInfo, FlowKey, LbConfig, Limits, Observed, QuicHandover, QuicRouting,
        QuicServer, QuicServerKey, Reason, RingRef, RuleCounters, RuleSlotKey, RuleState, RuleValue, SourceKey, SourceState, Traffic,
        VipKey, VipMeta,
    },
};

use super::{
    DataplaneError, MapMemory,
    clock::Calibration,
    mmap::Mapped,
    tables::{FlowTable, Index, QuicServerIndex, RingPool, RuleIndex, VipIndex},
};
use spillway_reconcile::{Maps, MapsError};

/// A map's capacity and, when counted, its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapOccupancy {
    pub name: &'static str,
    pub max_entries: u32,
    pub entries: Option<u64>,
}

pub struct BalancerMaps {
    capacity: Capacity,
    /// Written into every config: the data path's clock.
    clock: Calibration,
    /// Every map of the object (pinned or not) with what it takes, as loaded.
    memory: Vec<MapMemory>,
    pub config: Array<MapData, LbConfig>,
    pub vips: VipIndex,
    pub vip_addrs: HashMap<MapData, AddrKey, u32>,
    pub rings: RingPool,
    pub backends: Array<MapData, BackendInfo>,
    pub flows: FlowTable,
    pub vip_stats: PerCpuArray<MapData, Traffic>,
    pub backend_stats: PerCpuArray<MapData, Traffic>,
    pub reasons: PerCpuArray<MapData, u64>,
    pub vip_filter: Array<MapData, u64>,
    /// New-flow limits per VIP id, and the default at `Capacity::default_limit_slot`.
    pub limits: Array<MapData, Limits>,
    /// Kernel-owned: each VIP's new-flow budget bucket (zeroed when the id is handed out).
    pub budget: Array<MapData, Bucket>,
    /// Kernel-owned (LRU): per-source buckets and counters; read for `lbctl top-sources`.
    pub sources: HashMap<MapData, SourceKey, SourceState>,
    pub rules: RuleIndex,
    /// Kernel-owned: per rule id, the class's bucket, and its counters per CPU.
    pub rule_buckets: Array<MapData, Bucket>,
    pub rule_counters: PerCpuArray<MapData, RuleCounters>,
    /// Kernel-owned: per rule id, what it would have dropped in observe mode, per CPU.
    pub rule_would_drop: PerCpuArray<MapData, u64>,
    /// What limits in observe mode would have dropped, per `Observed`.
    pub observed: PerCpuArray<MapData, u64>,
    /// Packets sent with a second candidate (`second_chance.rs`).
    pub second_chance: PerCpuArray<MapData, u64>,
    /// Slot 0: new flows the full table could not remember, per CPU.
    pub flows_unremembered: PerCpuArray<MapData, u64>,
    /// Slot 0: frames that found the `--pass-to` program missing, per CPU.
    pub pass_to_missing: PerCpuArray<MapData, u64>,
    /// Slot 0: the second-chance program. Held open: the kernel empties a program array
    /// once no file descriptor or pin refers to it.
    pub second_chance_program: ProgramArray<MapData>,
    /// Slot 0: the IPv6 program the balancer tail-calls; held open for the same reason.
    pub v6_program: ProgramArray<MapData>,
    /// Slot 0: the "packet too big" program; held open for the same reason.
    pub ptb_program: ProgramArray<MapData>,
    /// Slots 0 and 1: the QUIC programs (IPv4, IPv6); held open for the same reason.
    pub quic_program: ProgramArray<MapData>,
    /// Slots 0 and 1: the fragment programs (IPv4, IPv6); held open for the same reason.
    pub fragment_program: ProgramArray<MapData>,
    /// Slot 0: the echo program; held open for the same reason.
    pub echo_program: ProgramArray<MapData>,
    /// The echo answers' rate limits (not pinned: each `lbd` writes its own at start).
    pub echo_config: Array<MapData, EchoConfig>,
    /// QUIC VIPs: (VIP id, server id) -> backend id.
    pub quic_servers: QuicServerIndex,
    /// The QUIC hand-over, a slot per CPU, where the QUIC programs count how short headers
    /// were placed (`QuicHandover::placed`).
    pub quic_handover: Array<MapData, QuicHandover>,
    /// Slots 0 and 1: the crypt programs (IPv4, IPv6); held open: not pinned.
    pub quic_crypt_program: ProgramArray<MapData>,
    /// Per (VIP id * 8 + config id): a VIP's config ids other than its slot's.
    pub quic_configs: Array<MapData, u32>,
    /// Each CPU's budget of decryptions of encrypted QUIC-LB ids.
    pub quic_decrypt_budget: PerCpuArray<MapData, DecryptBudget>,
    /// What puts encrypted QUIC-LB config ids' keys into the kernel, or why this kernel
    /// cannot (its crypto kfuncs missing or refused): encrypted config ids are then refused.
    /// None until the balancer's load has tried.
    pub quic_keys: Option<Result<crate::quic_keys::QuicKeys, crate::quic_keys::QuicKeyError>>,
}

pub(super) fn take<T: TryFrom<Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, DataplaneError> {
    let map = ebpf.take_map(name).ok_or(DataplaneError::MissingMap { name })?;
    T::try_from(map).map_err(|source| DataplaneError::Map { name, source })
}

/// Maps an mmapable array (the mapping outlives the descriptor, closed here).
fn take_mapped<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<Mapped<T>, DataplaneError> {
    match ebpf.take_map(name).ok_or(DataplaneError::MissingMap { name })? {
        Map::Array(data) => Mapped::new(&data, name),
        _ => Err(DataplaneError::MissingMap { name }),
    }
}

/// Slot `index` of a per-CPU counter array, summed over CPUs.
fn summed(map: &PerCpuArray<MapData, u64>, name: &'static str, index: u32) -> Result<u64, DataplaneError> {
    Ok(named(name, map.get(&index, 0))?.iter().sum())
}

/// Wraps a map error with the map's name.
pub(crate) fn named<T>(name: &'static str, r: Result<T, MapError>) -> Result<T, DataplaneError> {
    r.map_err(|source| DataplaneError::Map { name, source })
}

impl BalancerMaps {
    pub(super) fn take(ebpf: &mut Ebpf, capacity: Capacity, memory: Vec<MapMemory>, clock: Calibration) -> Result<Self, DataplaneError> {
        Ok(Self {
            capacity,
            memory,
            clock,
            config: take(ebpf, map_names::CONFIG)?,
            vips: Index { slots: take_mapped(ebpf, map_names::VIPS)? },
            vip_addrs: take(ebpf, map_names::VIP_ADDRS)?,
            rings: RingPool { words: take_mapped(ebpf, map_names::RINGS)? },
            backends: take(ebpf, map_names::BACKENDS)?,
            flows: FlowTable { buckets: take_mapped(ebpf, map_names::FLOWS)? },
            vip_stats: take(ebpf, map_names::VIP_STATS)?,
            backend_stats: take(ebpf, map_names::BACKEND_STATS)?,
            reasons: take(ebpf, map_names::REASONS)?,
            vip_filter: take(ebpf, map_names::VIP_FILTER)?,
            limits: take(ebpf, map_names::LIMITS)?,
            budget: take(ebpf, map_names::BUDGET_STATE)?,
            sources: take(ebpf, map_names::SOURCES)?,
            rules: RuleIndex {
                index: Index { slots: take_mapped(ebpf, map_names::RULES)? },
                lens: take(ebpf, map_names::RULE_LENS)?,
                global_lens: capacity.default_limit_slot(),
            },
            rule_buckets: take(ebpf, map_names::RULE_BUCKETS)?,
            rule_counters: take(ebpf, map_names::RULE_COUNTERS)?,
            rule_would_drop: take(ebpf, map_names::RULE_WOULD_DROP)?,
            observed: take(ebpf, map_names::OBSERVED)?,
            second_chance: take(ebpf, map_names::SECOND_CHANCE)?,
            flows_unremembered: take(ebpf, map_names::FLOWS_UNREMEMBERED)?,
            pass_to_missing: take(ebpf, map_names::PASS_TO_MISSING)?,
            second_chance_program: take(ebpf, map_names::SECOND_CHANCE_PROGRAM)?,
            v6_program: take(ebpf, map_names::V6_PROGRAM)?,
            ptb_program: take(ebpf, map_names::PTB_PROGRAM)?,
            quic_program: take(ebpf, map_names::QUIC_PROGRAM)?,
            fragment_program: take(ebpf, map_names::FRAGMENT_PROGRAM)?,
            echo_program: take(ebpf, map_names::ECHO_PROGRAM)?,
            echo_config: take(ebpf, map_names::ECHO_CONFIG)?,
            quic_servers: Index { slots: take_mapped(ebpf, map_names::QUIC_SERVERS)? },
            quic_handover: take(ebpf, map_names::QUIC_HANDOVER)?,
            quic_crypt_program: take(ebpf, map_names::QUIC_CRYPT_PROGRAM)?,
            quic_configs: take(ebpf, map_names::QUIC_CONFIGS)?,
            quic_decrypt_budget: take(ebpf, map_names::QUIC_DECRYPT_BUDGET)?,
            quic_keys: None,
        })
    }

    /// Gives every CPU a budget of `per_s` decryptions of encrypted QUIC-LB ids a second (0:
    /// none at all), after a burst of `burst`, starting full.
    pub fn set_quic_decrypt_budget(&mut self, per_s: u64, burst: u64) -> Result<(), DataplaneError> {
        const NS_PER_S: u64 = 1_000_000_000;
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| DataplaneError::Cpus(source))?.get();
        // ns_per_miss 0 is "no budget written" to the program, which then decrypts nothing.
        let ns_per_miss = NS_PER_S.checked_div(per_s).map_or(0, |ns| ns.max(1));
        let full = ns_per_miss.saturating_mul(burst);
        let budget = DecryptBudget { credit_ns: full, last_ns: 0, ns_per_miss, max_credit_ns: full };
        let values = aya::maps::PerCpuValues::try_from(vec![budget; cpus as usize])
            .map_err(|source| DataplaneError::Read { name: map_names::QUIC_DECRYPT_BUDGET, source })?;
        named(map_names::QUIC_DECRYPT_BUDGET, self.quic_decrypt_budget.set(0, values, 0))
    }

    /// Publishes (or with `None` removes) config id `config_id` of VIP `vip_id` beside the
    /// one of its slot.
    pub fn set_quic_config(&mut self, vip_id: u32, config_id: u8, config: Option<QuicLbConfig>) -> Result<(), DataplaneError> {
        let slot = vip_id * QUIC_CONFIG_IDS_PER_VIP + u32::from(config_id);
        named(map_names::QUIC_CONFIGS, self.quic_configs.set(slot, &config.map_or(0, QuicLbConfig::to_word), 0))
    }

    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// Every map of the balancer and the memory the kernel charges for it, largest first.
    pub fn memory(&self) -> &[MapMemory] {
        &self.memory
    }

    /// Writes `config` with this host's clock calibration (whatever `config` holds there).
    pub fn set_config(&mut self, config: &LbConfig) -> Result<(), DataplaneError> {
        let config = LbConfig { ns_per_jiffy: self.clock.ns_per_jiffy, clock_offset_ns: self.clock.offset_ns, ..*config };
        named(map_names::CONFIG, self.config.set(0, &config, 0))
    }

    /// Sets the echo answers' rate limits (a zero rate answers nothing).
    pub fn set_echo_config(&mut self, config: &EchoConfig) -> Result<(), DataplaneError> {
        named(map_names::ECHO_CONFIG, self.echo_config.set(0, config, 0))
    }

    /// Writes `config` with the connection table's secret seed: the one the pinned table
    /// was created with (its entries are placed by it), else a new random one (never 0,
    /// which means "none yet"). Returns the seed.
    pub fn set_config_keeping_table_seed(&mut self, config: &LbConfig) -> Result<u32, DataplaneError> {
        let mut seed = self.config()?.table_seed;
        while seed == 0 {
            let mut bytes = [0u8; 4];
            SystemRandom::new().fill(&mut bytes).map_err(|_| DataplaneError::NoRandomness)?;
            seed = u32::from_ne_bytes(bytes);
        }
        self.set_config(&LbConfig { table_seed: seed, ..*config })?;
        Ok(seed)
    }

    /// New flows forwarded without an entry because the table was full where they hash,
    /// summed over CPUs.
    pub fn unremembered_flows(&self) -> Result<u64, DataplaneError> {
        summed(&self.flows_unremembered, map_names::FLOWS_UNREMEMBERED, 0)
    }

    /// Frames Spillway does not serve that found no `--pass-to` program and passed, summed
    /// over CPUs.
    pub fn pass_to_missing(&self) -> Result<u64, DataplaneError> {
        summed(&self.pass_to_missing, map_names::PASS_TO_MISSING, 0)
    }

    pub fn config(&self) -> Result<LbConfig, DataplaneError> {
        named(map_names::CONFIG, self.config.get(&0, 0))
    }

    /// Packets sent with a second candidate, summed over CPUs.
    pub fn second_chance_packets(&self) -> Result<u64, DataplaneError> {
        summed(&self.second_chance, map_names::SECOND_CHANCE, 0)
    }

    /// How QUIC VIPs' short headers were placed, summed over CPUs.
    pub fn quic_routing(&self) -> Result<Vec<(QuicRouting, u64)>, DataplaneError> {
        let cpus: Vec<QuicHandover> = named(map_names::QUIC_HANDOVER, self.quic_handover.iter().collect())?;
        Ok(QuicRouting::ALL.iter().map(|&r| (r, cpus.iter().map(|h| h.placed[r as usize]).sum())).collect())
    }

    /// Makes the redirect map hold exactly `ifindexes`, each redirecting to itself.
    pub fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        named(map_names::BACKENDS, self.backends.set(id, info, 0))
    }

    pub fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        named(map_names::BACKENDS, self.backends.get(&id, 0))
    }

    /// The backend id the VIP's active Maglev table gives a new flow `key`, hashed as its VIP
    /// says (`hash::maglev_hash`) with `seed`, if the packet's VIP exists.
    pub fn maglev_choice(&self, key: &FlowKey, seed: u32) -> Option<u32> {
        let meta = self.vips.for_packet(&vip_of(key))?;
        self.rings.choice(meta.active, maglev_hash(key, meta.flags, seed))
    }

    /// The connection table's entry for a client -> VIP 5-tuple.
    pub fn flow(&self, key: &FlowKey) -> Option<FlowInfo> {
        let meta = self.vips.for_packet(&vip_of(key))?;
        self.flows.get(key, meta.id, self.config().ok()?.table_seed)
    }

    /// Removes a flow from the connection table; false if it was not there.
    pub fn remove_flow(&mut self, key: &FlowKey) -> bool {
        let (Some(meta), Ok(config)) = (self.vips.for_packet(&vip_of(key)), self.config()) else {
            return false;
        };
        self.flows.remove(key, meta.id, config.table_seed)
    }

    /// Visits the live connection-table entries with their 5-tuples until `visit` breaks
    /// (entries of VIP ids no VIP has are skipped: they only wait to be reused); returns how
    /// many entries it visited.
    pub fn scan_flows(&self, mut visit: impl FnMut(&FlowKey, &FlowInfo) -> ControlFlow<()>) -> u64 {
        let by_id: std::collections::HashMap<u32, VipKey> = self.vips.all().map(|s| (s.meta.id, s.key)).collect();
        self.flows.each(|flow| match by_id.get(&flow.vip_id) {
            Some(vip) => visit(&flow.key(vip), &flow.info),
            None => ControlFlow::Continue(()),
        })
    }

    /// Entries the connection table holds at most.
    /// The flows the connection table is sized for (`--max-flows`): the operator's number.
    /// Its slots (buckets of ways) are twice as many, the room that keeps a full table's
    /// buckets from overflowing.
    pub fn flow_capacity(&self) -> u64 {
        u64::from(self.capacity.flows)
    }

    pub fn budget_bucket(&self, vip_id: u32) -> Result<Bucket, DataplaneError> {
        named(map_names::BUDGET_STATE, self.budget.get(&vip_id, 0))
    }

    pub fn source_state(&self, key: &SourceKey) -> Option<SourceState> {
        self.sources.get(key, 0).ok()
    }

    /// Every map's name and capacity, and for the VIP and rule indexes and the small hash
    /// maps the entries they hold (the connection table is counted by a walk elsewhere).
    /// Capacities are in the operator's units: VIPs, slots, backends, flows (`--max-flows`,
    /// not the table's slots), rules (the indexes have room to spare, and the rings pack
    /// four slots a word).
    pub fn occupancy(&self) -> Result<Vec<MapOccupancy>, DataplaneError> {
        fn counted<K: aya::Pod, V: aya::Pod>(name: &'static str, map: &HashMap<MapData, K, V>) -> Result<u64, DataplaneError> {
            let mut entries = 0;
            for key in map.keys() {
                named(name, key)?;
                entries += 1;
            }
            Ok(entries)
        }
        let as_loaded = |name: &str| self.memory.iter().find(|m| m.name == name).map_or(0, |m| m.entries);
        let map = |name: &'static str, max_entries: u32, entries: Option<u64>| MapOccupancy { name, max_entries, entries };
        let c = self.capacity;
        Ok(vec![
            map(map_names::VIPS, c.vips, Some(self.vips.all().count() as u64)),
            map(map_names::VIP_ADDRS, c.vips, Some(counted(map_names::VIP_ADDRS, &self.vip_addrs)?)),
            map(map_names::RINGS, c.ring_words() * RING_SLOTS_PER_WORD, None),
            map(map_names::BACKENDS, c.backends, None),
            map(map_names::FLOWS, c.flows, None),
            map(map_names::SOURCES, as_loaded(map_names::SOURCES), Some(counted(map_names::SOURCES, &self.sources)?)),
            map(map_names::LIMITS, as_loaded(map_names::LIMITS), None),
            map(map_names::RULES, MAX_RULES, Some(self.rules.rules().len() as u64)),
            map(map_names::TX_PORTS, as_loaded(map_names::TX_PORTS), None),
            // `--max-fragments`; an LRU the program alone holds, whose use is not counted.
            map(map_names::FRAGMENTS, c.fragments, None),
        ])
    }

    pub fn vip_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        sum_traffic(map_names::VIP_STATS, &self.vip_stats, id)
    }

    pub fn backend_traffic(&self, id: u32) -> Result<Traffic, DataplaneError> {
        sum_traffic(map_names::BACKEND_STATS, &self.backend_stats, id)
    }

    /// New flows admitted to VIP id `id` (summed over CPUs).
    pub fn vip_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        Ok(self.vip_traffic(id)?.new_flows)
    }

    /// New flows placed on backend id `id` (summed over CPUs).
    pub fn backend_new_flows(&self, id: u32) -> Result<u64, DataplaneError> {
        Ok(self.backend_traffic(id)?.new_flows)
    }

    /// Every reason with its count summed over CPUs.
    pub fn reasons(&self) -> Result<Vec<(Reason, u64)>, DataplaneError> {
        Reason::ALL.iter().map(|&r| Ok((r, summed(&self.reasons, map_names::REASONS, r as u32)?))).collect()
    }

    /// Every `Observed` counter summed over CPUs.
    pub fn observed(&self) -> Result<Vec<(Observed, u64)>, DataplaneError> {
        Observed::ALL.iter().map(|&o| Ok((o, summed(&self.observed, map_names::OBSERVED, o as u32)?))).collect()
    }

    /// A rule's bucket and its counters summed over CPUs.
    pub fn rule_state(&self, id: u32) -> Result<RuleState, DataplaneError> {
        let bucket = named(map_names::RULE_BUCKETS, self.rule_buckets.get(&id, 0))?;
        let per_cpu = named(map_names::RULE_COUNTERS, self.rule_counters.get(&id, 0))?;
        let hits = per_cpu.iter().map(|c| c.hits).sum();
        let dropped = per_cpu.iter().map(|c| c.dropped).sum();
        let would_drop = named(map_names::RULE_WOULD_DROP, self.rule_would_drop.get(&id, 0))?.iter().sum();
        Ok(RuleState { bucket, hits, dropped, would_drop })
    }

    /// The per-source entries of VIP `vip_id` (a walk of the whole LRU table; entries the
    /// kernel evicts meanwhile are skipped).
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

/// The VIP key a packet of `key` looks up first.
pub fn vip_of(key: &FlowKey) -> VipKey {
    VipKey { addr: key.dst, port: key.dport, proto: key.proto, family: key.family }
}

fn sum_traffic(name: &'static str, map: &PerCpuArray<MapData, Traffic>, id: u32) -> Result<Traffic, DataplaneError> {
    let per_cpu = named(name, map.get(&id, 0))?;
    Ok(per_cpu.iter().fold(Traffic::default(), |acc, t| Traffic {
        packets: acc.packets + t.packets,
        bytes: acc.bytes + t.bytes,
        new_flows: acc.new_flows + t.new_flows,
    }))
}

impl Maps for BalancerMaps {
    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn vips(&self) -> Result<Vec<(VipKey, VipMeta)>, MapsError> {
        Ok(self.vips.vips())
    }

    fn set_vip(&mut self, key: &VipKey, meta: &VipMeta) -> Result<(), MapsError> {
        self.vips.set(key, meta).map_err(MapsError::from)
    }

    fn remove_vip(&mut self, key: &VipKey) -> Result<(), MapsError> {
        self.vips.remove(key);
        Ok(())
    }

    fn vip_addrs(&self) -> Result<Vec<(AddrKey, u32)>, MapsError> {
        self.vip_addrs.iter().map(|r| named(map_names::VIP_ADDRS, r)).collect::<Result<_, DataplaneError>>().map_err(MapsError::from)
    }

    fn set_vip_addr(&mut self, key: &AddrKey, flags: u32) -> Result<(), MapsError> {
        named(map_names::VIP_ADDRS, self.vip_addrs.insert(key, &flags, 0)).map_err(MapsError::from)
    }

    fn remove_vip_addr(&mut self, key: &AddrKey) -> Result<(), MapsError> {
        named(map_names::VIP_ADDRS, self.vip_addrs.remove(key)).map_err(MapsError::from)
    }

    fn write_slots(&mut self, table: RingRef, slots: &mut dyn Iterator<Item = (u32, u32)>) -> Result<usize, MapsError> {
        Ok(self.rings.write(table, slots))
    }

    fn read_ring(&self, table: RingRef) -> Result<Vec<u32>, MapsError> {
        Ok(self.rings.read(table))
    }

    fn backend(&self, id: u32) -> Result<BackendInfo, MapsError> {
        BalancerMaps::backend(self, id).map_err(MapsError::from)
    }

    fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), MapsError> {
        BalancerMaps::set_backend(self, id, info).map_err(MapsError::from)
    }

    fn vip_filter(&self) -> Result<Vec<u64>, MapsError> {
        self.vip_filter.iter().map(|r| named(map_names::VIP_FILTER, r)).collect::<Result<_, DataplaneError>>().map_err(MapsError::from)
    }

    fn set_vip_filter_word(&mut self, index: u32, word: u64) -> Result<(), MapsError> {
        named(map_names::VIP_FILTER, self.vip_filter.set(index, &word, 0)).map_err(MapsError::from)
    }

    fn reset_vip_stats(&mut self, id: u32) -> Result<(), MapsError> {
        zero_per_cpu(map_names::VIP_STATS, &mut self.vip_stats, id)?;
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
                Err(source) => return Err(DataplaneError::Map { name: map_names::SOURCES, source }.into()),
            }
        }
        Ok(())
    }

    fn reset_backend_stats(&mut self, id: u32) -> Result<(), MapsError> {
        zero_per_cpu(map_names::BACKEND_STATS, &mut self.backend_stats, id).map_err(MapsError::from)
    }

    fn limits(&self) -> Result<Vec<Limits>, MapsError> {
        (0..=self.capacity.default_limit_slot())
            .map(|slot| named(map_names::LIMITS, self.limits.get(&slot, 0)))
            .collect::<Result<_, DataplaneError>>()
            .map_err(MapsError::from)
    }

    fn set_limits(&mut self, slot: u32, limits: &Limits) -> Result<(), MapsError> {
        named(map_names::LIMITS, self.limits.set(slot, limits, 0)).map_err(MapsError::from)
    }

    fn rules(&self) -> Result<Vec<(RuleSlotKey, RuleValue)>, MapsError> {
        Ok(self.rules.rules())
    }

    fn set_rule(&mut self, key: &RuleSlotKey, value: &RuleValue) -> Result<(), MapsError> {
        self.rules.set(key, value).map_err(MapsError::from)
    }

    fn remove_rule(&mut self, key: &RuleSlotKey) -> Result<(), MapsError> {
        self.rules.remove(key).map_err(MapsError::from)
    }

    fn reset_rule_state(&mut self, id: u32) -> Result<(), MapsError> {
        named(map_names::RULE_BUCKETS, self.rule_buckets.set(id, &Bucket::default(), 0))?;
        zero_per_cpu(map_names::RULE_COUNTERS, &mut self.rule_counters, id)?;
        Ok(zero_per_cpu(map_names::RULE_WOULD_DROP, &mut self.rule_would_drop, id)?)
    }

    fn quic_servers(&self) -> Result<Vec<(QuicServerKey, QuicServer)>, MapsError> {
        Ok(self.quic_servers.entries())
    }

    fn set_quic_server(&mut self, key: &QuicServerKey, server: &QuicServer) -> Result<(), MapsError> {
        self.quic_servers.set(key, server).map_err(MapsError::from)
    }

    fn remove_quic_server(&mut self, key: &QuicServerKey) -> Result<(), MapsError> {
        self.quic_servers.remove(key);
        Ok(())
    }
    fn set_quic_key(&mut self, vip_id: u32, config_id: u8, key_file: Option<&std::path::Path>) -> Result<(), MapsError> {
        use crate::quic_keys::{QuicKeyError, read_key_file};
        let keys = match &self.quic_keys {
            Some(Ok(keys)) => keys,
            Some(Err(why)) => return Err(MapsError::new(QuicKeyError::Unavailable(why.to_string()))),
            None => return Err(MapsError::new(QuicKeyError::Unavailable("the balancer was not loaded".into()))),
        };
        let slot = vip_id * QUIC_CONFIG_IDS_PER_VIP + u32::from(config_id);
        match key_file {
            Some(file) => keys.set(slot, &read_key_file(file).map_err(MapsError::new)?),
            None => keys.clear(slot),
        }
        .map_err(MapsError::new)
    }
    fn set_quic_config(&mut self, vip_id: u32, config_id: u8, config: Option<QuicLbConfig>) -> Result<(), MapsError> {
        // The inherent method, which tests call directly.
        BalancerMaps::set_quic_config(self, vip_id, config_id, config).map_err(MapsError::from)
    }
}

fn zero_per_cpu<T: aya::Pod + Default + Clone>(
    name: &'static str,
    map: &mut PerCpuArray<MapData, T>,
    id: u32,
) -> Result<(), DataplaneError> {
    let cpus = aya::util::nr_cpus().map_err(|(_, source)| DataplaneError::Cpus(source))?;
    let zeros = aya::maps::PerCpuValues::try_from(vec![T::default(); cpus.get() as usize]).map_err(DataplaneError::Cpus)?;
    named(name, map.set(id, zeros, 0))
}
