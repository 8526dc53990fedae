//! The balancer's maps. Names and sizes must match `spillway_common::limits`; the loader
//! checks every pinned map's shape before reusing it.

use aya_ebpf::{
    macros::map,
    maps::{Array, DevMapHash, HashMap, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
};
use spillway_common::{
    limits::{
        FLOW_TABLE_ENTRIES, MAX_BACKENDS, MAX_RULES, MAX_TX_PORTS, MAX_VIPS, PRIOR_RING_ENTRIES, RING_MAP_ENTRIES, SOURCE_TABLE_ENTRIES,
        VIP_FILTER_WORDS,
    },
    types::{
        AddrKey, BackendInfo, Bucket, CachedNextHop, FlowKey, FlowValue, LbConfig, Limits, Observed, Reason, RuleKey, RuleState, RuleValue,
        SourceKey, SourceState, Traffic, VipKey, VipMeta,
    },
};

#[map(name = "spw_cfg")]
pub static CONFIG: Array<LbConfig> = Array::with_max_entries(1, 0);

#[map(name = "spw_vips")]
pub static VIPS: HashMap<VipKey, VipMeta> = HashMap::with_max_entries(MAX_VIPS, 0);

/// Bloom filter over VIP addresses (see `hash::vip_filter_slot`): a clear bit proves a
/// packet is not VIP traffic.
#[map(name = "spw_vip_filter")]
pub static VIP_FILTER: Array<u64> = Array::with_max_entries(VIP_FILTER_WORDS, 0);

#[map(name = "spw_vip_addrs")]
pub static VIP_ADDRS: HashMap<AddrKey, u32> = HashMap::with_max_entries(MAX_VIPS, 0);

#[map(name = "spw_rings")]
pub static RINGS: Array<u32> = Array::with_max_entries(RING_MAP_ENTRIES, 0);

#[map(name = "spw_backends")]
pub static BACKENDS: Array<BackendInfo> = Array::with_max_entries(MAX_BACKENDS, 0);

/// The connection table: one LRU hash shared by all CPUs, with the kernel's common LRU
/// (per-CPU free lists refilled in batches). Measured here, it inserts ~20% faster than
/// per-CPU LRU lists (`BPF_F_NO_COMMON_LRU`, which rotate the list on every insert), and a
/// flow seen on two CPUs still has one entry.
#[map(name = "spw_flows")]
pub static FLOWS: LruHashMap<FlowKey, FlowValue> = LruHashMap::with_max_entries(FLOW_TABLE_ENTRIES, 0);

#[map(name = "spw_vip_stats")]
pub static VIP_STATS: PerCpuArray<Traffic> = PerCpuArray::with_max_entries(MAX_VIPS, 0);

#[map(name = "spw_be_stats")]
pub static BACKEND_STATS: PerCpuArray<Traffic> = PerCpuArray::with_max_entries(MAX_BACKENDS, 0);

/// New flows admitted (connection-table entries created) per VIP id and per backend id.
#[map(name = "spw_vip_nflows")]
pub static VIP_NEW_FLOWS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_VIPS, 0);

#[map(name = "spw_be_nflows")]
pub static BACKEND_NEW_FLOWS: PerCpuArray<u64> = PerCpuArray::with_max_entries(MAX_BACKENDS, 0);

#[map(name = "spw_reasons")]
pub static REASONS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Reason::COUNT, 0);

/// Per-CPU next hop per backend id (see `nexthop.rs`); never pinned, it refills itself.
#[map(name = "spw_nh_cache")]
pub static NEXTHOP_CACHE: PerCpuArray<CachedNextHop> = PerCpuArray::with_max_entries(MAX_BACKENDS, 0);

#[map(name = "spw_tx_ports")]
pub static TX_PORTS: DevMapHash = DevMapHash::with_max_entries(MAX_TX_PORTS, 0);

/// New-flow limits per VIP id, plus the default at `DEFAULT_LIMIT_SLOT`.
#[map(name = "spw_limits")]
pub static LIMITS: Array<Limits> = Array::with_max_entries(MAX_VIPS + 1, 0);

/// Each VIP's budget bucket (shared by all CPUs; atomic adds).
#[map(name = "spw_budget")]
pub static BUDGET: Array<Bucket> = Array::with_max_entries(MAX_VIPS, 0);

/// Per-source buckets and counters; the LRU forgets the quietest sources first. VIPs
/// without a per-source limit only record a sample of their new flows here (`limits.rs`).
#[map(name = "spw_sources")]
pub static SOURCES: LruHashMap<SourceKey, SourceState> = LruHashMap::with_max_entries(SOURCE_TABLE_ENTRIES, 0);

/// Operator rules: longest prefix within a VIP scope (or `ANY_VIP`) and family.
#[map(name = "spw_rules")]
pub static RULES: LpmTrie<RuleKey, RuleValue> = LpmTrie::with_max_entries(MAX_RULES, 0);

/// Slot 0: how many rules exist. Zero lets new flows skip both trie lookups.
#[map(name = "spw_rule_count")]
pub static RULE_COUNT: Array<u32> = Array::with_max_entries(1, 0);

/// Per rule id: the client class's bucket and the rule's counters.
#[map(name = "spw_rule_stats")]
pub static RULE_STATE: Array<RuleState> = Array::with_max_entries(MAX_RULES, 0);

/// What limits in observe mode would have dropped.
#[map(name = "spw_observed")]
pub static OBSERVED: PerCpuArray<u64> = PerCpuArray::with_max_entries(Observed::COUNT, 0);

/// Key type of `RULES`, named for the code that builds lookups.
pub type RuleLookup = Key<RuleKey>;

/// Second chance: each VIP's table as it was before its last change (`VipMeta::prior_base`),
/// `spw_prior_size` slots of it (0: none).
#[map(name = "spw_prior_rings")]
pub static PRIOR_RINGS: Array<u32> = Array::with_max_entries(PRIOR_RING_ENTRIES, 0);

#[map(name = "spw_prior_size")]
pub static PRIOR_SIZE: Array<u32> = Array::with_max_entries(MAX_VIPS, 0);

/// Packets sent with a second candidate.
#[map(name = "spw_second_ch")]
pub static SECOND_CHANCE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
